/* y = x @ (w * scales).T + bias for int8 weights [n, k] with one scale per group of 32 weights of a row
 * (scales [n, k / 32]) and fp32 activations [m, k], on the tiling of tiled_matmul.h.
 *
 * The output head's int8 format: with per-row scales (int8_matmul.c) SmolLM2's tied head alone took
 * whole-model int8 past 1 % of fp32 perplexity; groups of 32 (as llama.cpp's Q8_0) lose almost nothing
 * there, for 1/16 more bytes (docs/benchmarks.md, "Quantization quality"). Each 8 weights are widened to fp32
 * in registers; a group's products are summed apart and then multiplied by its scale (bf16 bits, widened
 * exactly: tiled_matmul.h's GROUP_SCALE), found from the weight's offset in the matrix, since rows are
 * contiguous and k is a multiple of the group.
 */
#include <stdint.h>

#define GROUP 32

typedef int8_t weight_t;
typedef struct {
    const int8_t *w;         /* the weights' start, to find a weight's group */
    const uint16_t *scales;  /* bf16 bits, [n, k / GROUP] */
    const float *bias;       /* or NULL */
} epilogue_t;

#define GROUP_SCALE(p, e) bf16_to_float((e)->scales[(size_t)((p) - (e)->w) / GROUP])
#define LOAD8(p, e) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define LOAD1(p, e) ((float)*(p) * GROUP_SCALE(p, e))
#define FINISH(dot, j, e) ((dot) + ((e)->bias ? (e)->bias[j] : 0.0f))

#include "tiled_matmul.h"

/* x [m, k] fp32, w [n, k] int8, scales [n, k / 32] bf16 bits, bias [n] fp32 or NULL, y [m, n] fp32; all
 * contiguous, k a multiple of 32. threads <= 1 runs on the calling thread alone. */
void motley_int8_grouped_matmul(const float *x, const int8_t *w, const uint16_t *scales, const float *bias,
                                float *y, int64_t m, int64_t k, int64_t n, int threads) {
    epilogue_t e = {w, scales, bias};
    tiled_matmul(x, w, &e, y, m, k, n, threads);
}
