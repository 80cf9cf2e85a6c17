/* y = x @ dequant(w).T + bias for group-wise asymmetric int4 weights and fp32 activations [m, k], fp32
 * accumulation and output; built for the few rows of a decode step.
 *
 * Why not the int8 kernels' tiling (tiled_matmul.h: 8 weights of one row per vector, reduced across the
 * vector at the end): unpacking nibbles into the lanes in order costs shuffles, and at 4 bits a decode
 * step waits on those vector operations, not on memory. Here each lane is one output channel (a tile is
 * 16 channels), so:
 *   - one 32-bit lane holds 8 consecutive weights of its channel, weight t in bits 4t..4t+3. Weight t is
 *     `lane & 15 << 4t` (t = 7: `lane >> 28`) converted to fp32, i.e. q * 2^4t, and it multiplies
 *     x * 2^-4t, computed once per call (a power of two, so the product is q * x exactly; only
 *     activations below ~1e-31, which add nothing measurable, lose bits). One AND, one convert and one
 *     FMA per 8 weights (per 16 on AVX-512), plus the FMAs of each further activation row; no shuffle;
 *   - a group's affine part leaves the inner loop: w = (q - 8) * scale + zero, so a group adds
 *     scale * sum(q x) + (zero - 8 scale) * sum(x) to each output, sum(x) computed once per call. Scale
 *     and zero are the lane's own: loaded as vectors, still the bf16 values quantize_int4_rows made, so
 *     the weights are exactly that quantizer's;
 *   - a tile's weights, and its scales, are each one contiguous stream (layout below), which the loop
 *     also prefetches PREFETCH bytes ahead into L2 (+10-25 % at 1-16 rows over the hardware prefetcher
 *     alone), and the sums need no reduction across lanes at the end.
 * Each row's products are summed in SPAN-weight runs, split over PARTS accumulators where there are too
 * few activation rows to hide the FMA latency otherwise, and the runs' sums then added: shorter fp32 sums
 * round less (worst error on tests/worker_runtime/test_int4_kernel.py's shapes 8.7e-7 -> 4e-7 of the sum
 * of magnitudes, against 1e-6 allowed).
 *
 * Layout (kernels/int4_matmul.py, tile_layout): weights uint32 [n / 16, k / 8, 16], lane l of [c, p] the
 * weights 8p..8p+7 of channel 16c + l; scales uint32 [n / 16, k / group, 16], lane l of [c, g] channel
 * 16c + l's bf16 scale (low half) and bf16 zero (high half) of group g.
 *
 * The tile loops (int4_tiles.h) are compiled twice: for AVX2 + FMA (a tile is two ymm vectors) and for
 * AVX-512 (one zmm), which runs wherever the CPU has it: on the Zen 5 build machine 1.25x the AVX2
 * code's speed at batch 1 and 1.5-2x from 4 rows (docs/benchmarks.md, "Kernels").
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_support.h"

#define LANES 16
#define SPAN 64       /* weights of a row summed in one accumulator before they join the group's sum */
#define PREFETCH 4096 /* bytes ahead in a tile's weights that are prefetched into L2 */
#define PANEL_ROWS 64 /* activation rows whose pre-scaled copy stays in L2 while every tile passes over it */

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TILES_ARGS                                                                                           \
    const float *xs, const float *sums, const uint32_t *w, const uint32_t *sz, const float *bias, float *y, \
        int64_t m, int64_t k, int64_t n, int64_t group, int64_t c0, int64_t c1

/* xs = x with weight position t of each 8 scaled by 2^-4t (t = 7: by 1), sums = its group sums: summed
 * in double, since the offset they meet is up to ~8 scales and an fp32 sum's rounding would count several
 * times (worst error on tests/worker_runtime/test_int4_kernel.py's shapes 7e-7 -> 4e-7); in 8 independent
 * lanes, so that the adds of a decode step's one row do not wait on each other. */
__attribute__((target("avx2"))) static void prescale(const float *x, float *xs, float *sums, int64_t m,
                                                     int64_t k, int64_t group) {
    static const float scale[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
    for (int64_t i = 0; i < m * k; i += 8)
        for (int t = 0; t < 8; t++) xs[i + t] = x[i + t] * scale[t];
    for (int64_t g = 0; g < m * (k / group); g++) {
        double lanes[8] = {0}, s = 0;
        for (int64_t p = g * group; p < (g + 1) * group; p += 8)
            for (int t = 0; t < 8; t++) lanes[t] += x[p + t];
        for (int t = 0; t < 8; t++) s += lanes[t];
        sums[g] = (float)s;
    }
}

/* Each ISA's tile loops (int4_tiles.h); the accumulators: AVX2's 16 registers hold 8 of them and the
 * operands, AVX-512's 32 hold 8 and the operands with room to spare. */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define WIDTH 8
#define MAX_ROWS 4
#define PARTS(rows) ((rows) == 1 ? 4 : (rows) == 2 ? 2 : 1)
#define TILES tiles_avx2
#include "int4_tiles.h"
#pragma GCC pop_options
#undef WIDTH
#undef MAX_ROWS
#undef PARTS
#undef TILES

#pragma GCC push_options
#pragma GCC target("avx512f")
#define WIDTH 16
#define MAX_ROWS 8
#define PARTS(rows) ((rows) == 1 ? 8 : (rows) <= 2 ? 4 : (rows) <= 4 ? 2 : 1)
#define TILES tiles_avx512
#include "int4_tiles.h"
#pragma GCC pop_options

/* 1 where the AVX-512 code can run here. */
int motley_int4_wide_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* x [m, k] fp32, w and sz as above, bias [n] fp32 or NULL, y [m, n] fp32; all contiguous, n a multiple of
 * 16, k of group, group of 8. wide: use AVX-512 (only where motley_int4_wide_supported()). threads <= 1
 * runs on the calling thread alone. Returns 0, or -1 where scratch memory could not be had. */
int motley_int4_matmul(const float *x, const uint32_t *w, const uint32_t *sz, const float *bias, float *y,
                       int64_t m, int64_t k, int64_t n, int64_t group, int wide, int threads) {
    if (m == 0) return 0;
    float *xs = malloc(sizeof(float) * (m * k + m * (k / group)));
    if (!xs) return -1;
    float *sums = xs + m * k;
    prescale(x, xs, sums, m, k, group);
    void (*tiles)(TILES_ARGS) = wide ? tiles_avx512 : tiles_avx2;
    int64_t count = n / LANES;
    if (threads <= 1) {
        tiles(xs, sums, w, sz, bias, y, m, k, n, group, 0, count);
    } else {
#pragma omp parallel num_threads(threads)
        {
            int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
            tiles(xs, sums, w, sz, bias, y, m, k, n, group, count * t / team, count * (t + 1) / team);
        }
    }
    free(xs);
    return 0;
}
