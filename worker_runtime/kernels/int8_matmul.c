/* y = (x @ w.T) * scales + bias for int8 weights [n, k] and fp32 activations [m, k], built for the few rows
 * of a decode step, on the tiling of tiled_matmul.h.
 *
 * Each 8 int8 weights are widened to fp32 in registers (vpmovsxbd + vcvtdq2ps), never written back as fp32,
 * so memory sees a quarter of the fp32 bytes. Accumulation is fp32 along k, then one per-channel scale
 * (bf16 bits, widened exactly) and the bias.
 */
#include <stdint.h>

typedef int8_t weight_t;
typedef struct {
    const uint16_t *scales; /* bf16 bits, one per output channel */
    const float *bias;      /* or NULL */
} epilogue_t;

#define LOAD8(p, e) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define LOAD1(p, e) ((float)*(p))
#define FINISH(dot, j, e) ((dot) * bf16_to_float((e)->scales[j]) + ((e)->bias ? (e)->bias[j] : 0.0f))

#include "tiled_matmul.h"

/* x [m, k] fp32, w [n, k] int8, scales [n] bf16 bits, bias [n] fp32 or NULL, y [m, n] fp32; all contiguous.
 * threads <= 1 runs on the calling thread alone. */
void motley_int8_matmul(const float *x, const int8_t *w, const uint16_t *scales, const float *bias, float *y,
                        int64_t m, int64_t k, int64_t n, int threads) {
    epilogue_t e = {scales, bias};
    tiled_matmul(x, w, &e, y, m, k, n, threads);
}
