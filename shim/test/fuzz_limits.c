/*
 * libFuzzer target for the limits-file parser (make fuzz). Beyond "no crash,
 * no out-of-bounds access" (ASan/UBSan), it checks what a caller relies on:
 * an accepted file has 0..16 contiguous GPUs with NUL-terminated, unique
 * UUIDs and cores in 1..100, and a rejected one comes with a reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct vgpu_limits l;
	char err[256];
	if (vgpu_limits_parse((const char *)data, size, &l, err, sizeof(err)) != 0) {
		if (!err[0] || !memchr(err, '\0', sizeof(err)))
			abort();
		return 0;
	}
	if (size > VGPU_LIMITS_MAX_SIZE || l.ngpu < 0 || l.ngpu > VGPU_MAX_DEVICES)
		abort();
	if (l.policy != VGPU_POLICY_HARD && l.policy != VGPU_POLICY_BURST)
		abort();
	if (l.log_level < VGPU_LOG_ERROR || l.log_level > VGPU_LOG_DEBUG)
		abort();
	for (int i = 0; i < l.ngpu; i++) {
		size_t n = strnlen(l.gpu[i].uuid, VGPU_UUID_LEN);
		if (n == 0 || n == VGPU_UUID_LEN || l.gpu[i].cores < 1 || l.gpu[i].cores > 100)
			abort();
		for (int j = 0; j < i; j++)
			if (!strcmp(l.gpu[i].uuid, l.gpu[j].uuid))
				abort();
	}
	return 0;
}
