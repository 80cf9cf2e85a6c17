/* What the loader asks every kernel library (loader.Kernel): whether this CPU can run its AVX2/FMA code. */
#ifndef MOTLEY_CPU_SUPPORT_H
#define MOTLEY_CPU_SUPPORT_H

/* 1 if this CPU (and the OS) can run AVX2/FMA code (and F16C, for a kernel that defines NEEDS_F16C).
 * Compiled without AVX so any CPU may call it. */
int motley_cpu_supported(void) {
    __builtin_cpu_init();
#ifdef NEEDS_F16C
    if (!__builtin_cpu_supports("f16c")) return 0;
#endif
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

#endif
