/*
 * Logging: one line per event on stderr, prefixed so a user can tell the
 * shim's lines from the application's. The level comes from the limits file.
 */
#include "glibc_compat.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "limits.h"
#include "log.h"

int vgpu_log_level = VGPU_LOG_WARN;

void vgpu_log(int level, const char *fmt, ...)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};
	if (level > vgpu_log_level)
		return;
	char buf[512];
	int n = snprintf(buf, sizeof(buf), "nri-vgpu-shim[%d]: %s: ", (int)getpid(), names[level]);
	if (n < 0 || (size_t)n >= sizeof(buf))
		return;
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(buf) - 2)
		len = sizeof(buf) - 2;
	buf[len++] = '\n';
	/* One write(2) so lines from concurrent processes do not interleave. */
	ssize_t w = write(2, buf, len);
	(void)w;
}
