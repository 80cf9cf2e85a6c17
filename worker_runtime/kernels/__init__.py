"""Hand-written CPU kernels for what torch has no fast kernel for, compiled with gcc on first use.

``build`` compiles and caches a C source as a shared library linked against torch's OpenMP runtime;
``loader`` gets a kernel's function from it (or warns once why not) and reads the switches back to
torch's kernels. The matmuls of fp32 activations share the tiling of ``tiled_matmul.h``: ``int8_matmul``
is the int8-weight one the int8 layers use on CPU, ``dense_matmul`` the fp32, fp16 and bf16-weight ones
(``float_matmul.h``) ``dense.dense_linear`` uses for decode-sized batches, the 16-bit ones for a CPU
stage that keeps a 16-bit checkpoint's weights. ``int4_matmul``, the int4 layers' on CPU, has tiles of
its own (one output channel per vector lane), which make widening 4-bit weights cheap.
"""
