/*
 * Addresses of our exported wrappers, by hook id. The library is linked with
 * -Bsymbolic-functions, so these are our own definitions even if another
 * object in the process defines the same names.
 */
#include "glibc_compat.h"

#include "real.h"

void *const vgpu_wrappers[HOOK_COUNT] = {
#define HOOK(lib, name, base, ver, ptsz) [HOOK_##name] = (void *)&name,
#include "hooks.def"
#undef HOOK
};
