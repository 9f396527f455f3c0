/* Test helper: parses a limits file with the shim's parser and prints the result or the error. */
#include <stdio.h>

#include "../src/limits.h"

int main(int argc, char **argv)
{
	static char buf[8192];
	FILE *f = argc == 2 ? fopen(argv[1], "rb") : NULL;
	if (!f) {
		fprintf(stderr, "usage: limits_check FILE\n");
		return 2;
	}
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	struct vgpu_limits l;
	char err[256];
	if (vgpu_limits_parse(buf, n, &l, err, sizeof(err)) != 0) {
		printf("error: %s\n", err);
		return 1;
	}
	printf("ok gpus=%d policy=%d level=%d shards=%d\n", l.ngpu, l.policy, l.log_level, l.shards);
	for (int i = 0; i < l.ngpu; i++)
		printf("gpu %d %s %llu %d\n", i, l.gpu[i].uuid, (unsigned long long)l.gpu[i].memory, l.gpu[i].cores);
	return 0;
}
