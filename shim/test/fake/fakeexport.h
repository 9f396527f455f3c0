/*
 * What the fake driver serves to NVIDIA's own cudart (fakeexport.c): the
 * private tables of cuGetExportTable, entry points the rest of the fake
 * lacks, and a trace of every lookup.
 */
#ifndef FAKEEXPORT_H
#define FAKEEXPORT_H

#include "cuda_abi.h"

/* Shared between the fake's own files only: not part of its exported ABI. */
#pragma GCC visibility push(hidden)

/* cuGetProcAddress's fallback for a name fakecuda.c's table has no ABI of
 * for ver: 0 found, 1 unknown name, 2 only in a newer version (known: 1
 * when fakecuda.c's table knows the name). */
int fkx_lookup(const char *sym, int ver, void **pfn, int known);
/* With $FAKECUDA_TRACE=FILE, appends "proc<NARGS> SYM VER FLAGS RESULT" to
 * FILE (NARGS 4: cuGetProcAddress, 5: cuGetProcAddress_v2; RESULT as
 * fkx_lookup's). */
void fkx_trace_proc(int nargs, const char *sym, int ver, cuuint64_t flags, int result);
/* fakecuda.c: device d's primary context, not retained; NULL for no such device. */
void *fk_primary_ctx(int d);

#pragma GCC visibility pop

#endif
