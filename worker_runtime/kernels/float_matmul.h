/* y = x @ w.T + bias for weights of a float format (fp32, fp16, bf16) and fp32 activations [m, k], on the
 * tiling of tiled_matmul.h: what dense_matmul.c, f16_matmul.c and bf16_matmul.c share, so that each of
 * them says only how its weights widen to fp32.
 *
 * A kernel file defines weight_t, LOAD8 and LOAD1 (as tiled_matmul.h asks) and MATMUL, the name of the
 * function it exports, before including this.
 */
#include <stdint.h>

typedef struct {
    const float *bias; /* or NULL */
} epilogue_t;

#define FINISH(dot, j, e) ((dot) + ((e)->bias ? (e)->bias[j] : 0.0f))

#include "tiled_matmul.h"

/* x [m, k] fp32, w [n, k], bias [n] fp32 or NULL, y [m, n] fp32, all contiguous. threads <= 1 runs on the
 * calling thread alone. */
void MATMUL(const float *x, const weight_t *w, const float *bias, float *y, int64_t m, int64_t k, int64_t n,
            int threads) {
    epilogue_t e = {bias};
    tiled_matmul(x, w, &e, y, m, k, n, threads);
}
