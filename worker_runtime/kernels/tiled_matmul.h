/* The tiled y = x @ w.T that both matmul kernels are built on (int8_matmul.c, dense_matmul.c), written
 * once for any weight format a kernel can widen to fp32 eight weights at a time.
 *
 * Decode reads every weight once per step for a handful of activation rows, so the job is to stream the
 * weight rows at memory bandwidth: each 8 weights are loaded (and widened) to fp32 in registers and
 * multiplied into fp32 accumulators with FMA. A tile of mr activation rows x nr weight rows shares each
 * weight vector mr times; the weight rows of a block stay in L1/L2 while the activation tiles of a 64-row
 * panel pass over them, so memory sees each weight byte once per 64 activation rows (once per decode
 * step). Accumulation is fp32 along k; the kernel's epilogue then makes each output (scale, bias).
 *
 * Threads: output channels are split into one contiguous share per thread of an OpenMP team of the size the
 * caller passes (torch.get_num_threads()); the libraries are linked against the libgomp torch itself
 * loads, so the team comes from torch's own OpenMP runtime.
 *
 * A kernel file defines, before including this:
 *   weight_t             the weight element type;
 *   epilogue_t           what its epilogue reads (per-channel scales, bias);
 *   LOAD8(p, e)          the 8 weights at p (a const weight_t *) as an __m256 of fp32, given the
 *                        const epilogue_t *e (a group-scaled format scales them there);
 *   LOAD1(p, e)          one weight at p as a float (for a row's last k % 8 weights);
 *   FINISH(dot, j, e)    output channel j from its dot product and e;
 * and, for a format with a scale per GROUP weights of a row (k a multiple of GROUP, of 8):
 *   GROUP_SCALE(p, e)    the scale of the group that starts at p, LOAD8 then leaving the weights unscaled.
 * A kernel of fp16 weights defines NEEDS_F16C (for vcvtph2ps: the code below is built for it, and
 * motley_cpu_supported() asks for it).
 * It gets motley_cpu_supported() (cpu_support.h), bf16_to_float() for its macros, and tiled_matmul(); its
 * own exported function calls the latter.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "cpu_support.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#ifdef NEEDS_F16C
#pragma GCC target("f16c")
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define MAX_NR 8

/* bf16 bits widened to the fp32 they stand for (exact: a bf16 is an fp32's upper half). */
ALWAYS_INLINE float bf16_to_float(uint16_t bits) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)bits << 16};
    return v.f;
}

ALWAYS_INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The products of the 8 weights at p of weight rows w[0..NR) with activation rows x[0..MR), added into acc,
 * while the next tile's rows are prefetched at the rate this one is consumed (see tile()). */
ALWAYS_INLINE void step8(const float *x, const weight_t *const *w, const weight_t *next, const epilogue_t *e,
                         int64_t k, int64_t p, int MR, int NR, __m256 acc[4][MAX_NR]) {
#pragma GCC unroll 8
    for (int c = 0; c < NR * 8 * (int)sizeof(weight_t); c += 64)
        _mm_prefetch((const char *)(next + p * NR) + c, _MM_HINT_T0);
#pragma GCC unroll 8
    for (int j = 0; j < NR; j++) {
        __m256 wv = LOAD8(w[j] + p, e);
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * k + p), wv, acc[i][j]);
    }
}

/* One tile: activation rows x[0..MR) against weight rows w[0..NR) (both with row stride k), dot products
 * into out[i * NR + j]. MR and NR are compile-time constants at every call, so the accumulators live in
 * registers (MR * NR of the 16 ymm registers, the rest for the operands).
 * The hardware prefetcher loses track of nr interleaved rows of a few cache lines each, so the loop
 * prefetches the next tile's rows (the contiguous nr * k weights from `next`) at the rate it consumes
 * this one's: nr * 8 weights a step. */
ALWAYS_INLINE void tile(const float *x, const weight_t *const *w, const weight_t *next, const epilogue_t *e,
                        int64_t k, int MR, int NR, float *out) {
    __m256 acc[4][MAX_NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t p = 0;
#ifdef GROUP_SCALE
    /* Each group's products are summed apart and join the row's sum times the group's scale: one broadcast
     * and FMA per GROUP weights of a row, where scaling each 8 weights as they are loaded took a scale's
     * address, load, widening and broadcast per 8 (2.6x the time of a per-row scale at batch 1). */
    for (; p + GROUP <= k; p += GROUP) {
        __m256 part[4][MAX_NR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) part[i][j] = _mm256_setzero_ps();
        for (int64_t q = p; q < p + GROUP; q += 8) step8(x, w, next, e, k, q, MR, NR, part);
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            __m256 scale = _mm256_set1_ps(GROUP_SCALE(w[j] + p, e));
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) acc[i][j] = _mm256_fmadd_ps(part[i][j], scale, acc[i][j]);
        }
    }
#endif
    for (; p + 8 <= k; p += 8) step8(x, w, next, e, k, p, MR, NR, acc);
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            float s = hsum(acc[i][j]);
            /* fmaf, not s += x * w: gcc contracts that into an FMA or not depending on the weight format
             * (a 4-7 long tail of fp32 weights is multiplied as a vector, then added), and every format
             * must sum as the fp32 kernel does (f16_matmul.c, bf16_matmul.c are bit-exact to it). */
            for (int64_t q = p; q < k; q++) s = __builtin_fmaf(x[i * k + q], LOAD1(w[j] + q, e), s);
            out[i * NR + j] = s;
        }
}

/* Tile shapes by activation rows: 1 x 8, 2 x 4, 3 x 4, 4 x 3 (8-12 accumulators, enough independent FMA
 * chains to hide their latency without spilling). */
static const int NR_FOR_MR[5] = {0, 8, 4, 4, 3};

/* Columns [n0, n1) of the output for activation rows [r0, r1). Weight rows are taken in blocks of about
 * 16 KiB (at least 24 rows, a multiple of every tile's nr) so that each activation tile after the first
 * reads them from cache. A tile's weight rows past n1 repeat row n1 - 1 and their results are dropped. */
static void panel(const float *x, const weight_t *w, const epilogue_t *e, float *y, int64_t r0, int64_t r1,
                  int64_t k, int64_t n, int64_t n0, int64_t n1) {
    int64_t block = (16384 / (k * (int64_t)sizeof(weight_t))) / 24 * 24;
    if (block < 24) block = 24;
    for (int64_t b0 = n0; b0 < n1; b0 += block) {
        int64_t b1 = b0 + block < n1 ? b0 + block : n1;
        for (int64_t i0 = r0; i0 < r1; i0 += 4) {
            int mr = r1 - i0 < 4 ? (int)(r1 - i0) : 4;
            int nr = NR_FOR_MR[mr];
            for (int64_t j0 = b0; j0 < b1; j0 += nr) {
                const weight_t *wr[MAX_NR];
                for (int j = 0; j < nr; j++) wr[j] = w + (j0 + j < b1 ? j0 + j : b1 - 1) * k;
                float out[4 * MAX_NR];
                const float *xt = x + i0 * k;
                const weight_t *next = w + (j0 + nr) * k;
                switch (mr) {
                    case 1: tile(xt, wr, next, e, k, 1, 8, out); break;
                    case 2: tile(xt, wr, next, e, k, 2, 4, out); break;
                    case 3: tile(xt, wr, next, e, k, 3, 4, out); break;
                    default: tile(xt, wr, next, e, k, 4, 3, out); break;
                }
                for (int j = 0; j < nr && j0 + j < b1; j++)
                    for (int i = 0; i < mr; i++)
                        y[(i0 + i) * n + j0 + j] = FINISH(out[i * nr + j], j0 + j, e);
            }
        }
    }
}

/* Columns [n0, n1) of the output for all m activation rows, 64 rows at a time: a prefill-sized batch's
 * fp32 rows would not stay in L2 while every weight block passes over them; 64 of them do (192 KiB at
 * k = 768), and the weights read once per 64 rows come from L3 or memory at a small fraction of the
 * arithmetic's time. */
static void rows(const float *x, const weight_t *w, const epilogue_t *e, float *y, int64_t m, int64_t k,
                 int64_t n, int64_t n0, int64_t n1) {
    for (int64_t r0 = 0; r0 < m; r0 += 64) panel(x, w, e, y, r0, r0 + 64 < m ? r0 + 64 : m, k, n, n0, n1);
}

/* x [m, k] fp32, w [n, k], y [m, n] fp32; all contiguous. threads <= 1 runs on the calling thread alone. */
static void tiled_matmul(const float *x, const weight_t *w, const epilogue_t *e, float *y, int64_t m,
                         int64_t k, int64_t n, int threads) {
    if (threads <= 1) {
        rows(x, w, e, y, m, k, n, 0, n);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
        int64_t share = (n + team - 1) / team;
        share = (share + 23) / 24 * 24;  /* whole blocks of 24 rows: every tile's nr divides it */
        int64_t n0 = t * share, n1 = n0 + share < n ? n0 + share : n;
        if (n0 < n1) rows(x, w, e, y, m, k, n, n0, n1);
    }
}

#pragma GCC pop_options
