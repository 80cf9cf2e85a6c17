/* What the loader asks every kernel library (loader.Kernel): whether this CPU can run its AVX2/FMA code. */
#ifndef MOTLEY_CPU_SUPPORT_H
#define MOTLEY_CPU_SUPPORT_H

/* 1 if this CPU (and the OS) can run AVX2/FMA code. Compiled without AVX so any CPU may call it. */
int motley_cpu_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

#endif
