/*
 * Replays a runtime's cuGetProcAddress requests (shim/test/cudart/) and says
 * where each one lands:
 *
 *   procreplay < REQUESTS
 *
 * REQUESTS: lines "NARGS SYMBOL VERSION FLAGS" ('#' starts a comment; the
 * empty symbol is written ""). NARGS 4 asks through cuGetProcAddress (4
 * arguments, CUDA 11.3-11.8), 5 through cuGetProcAddress_v2, each found the
 * way the runtime finds it: dlopen("libcuda.so.1") + dlsym. Prints one line
 * per request, "NARGS SYMBOL VERSION FLAGS -> OBJECT EXPORT", where OBJECT is
 * the file name of the library the returned pointer lies in and EXPORT the
 * exported symbol at exactly that address ("- -" for no pointer, "OBJECT ?"
 * for an address that is no export's).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda_abi.h"

int main(void)
{
	void *cu = dlopen("libcuda.so.1", RTLD_NOW);
	if (!cu) {
		printf("FAIL: dlopen libcuda.so.1: %s\n", dlerror());
		return 1;
	}
	CUresult (*gpa4)(const char *, void **, int, cuuint64_t) =
		(CUresult(*)(const char *, void **, int, cuuint64_t))dlsym(cu, "cuGetProcAddress");
	CUresult (*gpa5)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
		(CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))dlsym(
			cu, "cuGetProcAddress_v2");
	if (!gpa4 || !gpa5) {
		printf("FAIL: libcuda.so.1 lacks cuGetProcAddress or cuGetProcAddress_v2\n");
		return 1;
	}
	char line[512];
	while (fgets(line, sizeof(line), stdin)) {
		char sym[256];
		int nargs, ver;
		unsigned long long flags;
		if (line[0] == '#' || line[0] == '\n')
			continue;
		if (sscanf(line, "%d %255s %d %llu", &nargs, sym, &ver, &flags) != 4 || (nargs != 4 && nargs != 5)) {
			printf("FAIL: bad request line: %s", line);
			return 1;
		}
		const char *name = strcmp(sym, "\"\"") ? sym : "";
		void *p = NULL;
		CUresult rc;
		if (nargs == 4) {
			rc = gpa4(name, &p, ver, flags);
		} else {
			CUdriverProcAddressQueryResult st;
			rc = gpa5(name, &p, ver, flags, &st);
		}
		Dl_info di;
		const char *obj = "-", *exp = "-";
		if (rc == CUDA_SUCCESS && p) {
			if (dladdr(p, &di) && di.dli_fname) {
				obj = strrchr(di.dli_fname, '/') ? strrchr(di.dli_fname, '/') + 1 : di.dli_fname;
				exp = di.dli_sname && di.dli_saddr == p ? di.dli_sname : "?";
			} else {
				obj = exp = "?";
			}
		}
		printf("%d %s %d %llu -> %s %s\n", nargs, sym, ver, flags, obj, exp);
	}
	return 0;
}
