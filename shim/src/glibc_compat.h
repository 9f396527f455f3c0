/*
 * Pins glibc symbol versions to ones that exist since GLIBC_2.2.5 (x86_64),
 * so the shim loads in images with glibc as old as 2.17 (CentOS 7). Built
 * against glibc >= 2.34 the linker would otherwise pick e.g.
 * pthread_create@GLIBC_2.34, and a preload that fails to load is silent:
 * the program would run without limits. Included first by every source file
 * of the library; `make test` checks the result with objdump -T.
 *
 * On glibc < 2.34 these symbols live in libpthread.so.0 and libdl.so.2,
 * which the library therefore lists as DT_NEEDED (see the Makefile).
 */
#ifndef VGPU_GLIBC_COMPAT_H
#define VGPU_GLIBC_COMPAT_H

#if defined(__x86_64__)
__asm__(".symver pthread_create,pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_once,pthread_once@GLIBC_2.2.5");
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@GLIBC_2.2.5");
__asm__(".symver pthread_detach,pthread_detach@GLIBC_2.2.5");
__asm__(".symver pthread_join,pthread_join@GLIBC_2.2.5");
__asm__(".symver pthread_sigmask,pthread_sigmask@GLIBC_2.2.5");
__asm__(".symver pthread_key_create,pthread_key_create@GLIBC_2.2.5");
__asm__(".symver pthread_getspecific,pthread_getspecific@GLIBC_2.2.5");
__asm__(".symver pthread_setspecific,pthread_setspecific@GLIBC_2.2.5");
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlclose,dlclose@GLIBC_2.2.5");
__asm__(".symver dlvsym,dlvsym@GLIBC_2.2.5");
__asm__(".symver dlerror,dlerror@GLIBC_2.2.5");
__asm__(".symver dladdr,dladdr@GLIBC_2.2.5");
#endif

#endif
