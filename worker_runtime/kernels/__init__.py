"""Hand-written CPU kernels for what torch has no fast kernel for, compiled with gcc on first use.

``build`` compiles and caches a C source as a shared library linked against torch's OpenMP runtime;
``int8_matmul`` is the int8-weight x fp32-activation matmul the int8 layers use for decode on CPU.
"""
