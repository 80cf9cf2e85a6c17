/* y = x @ w.T + bias for fp32 weights [n, k] and fp32 activations [m, k], built for the few rows of a
 * decode step, on the tiling of tiled_matmul.h.
 *
 * oneDNN's inner product reads the unpacked fp32 weights of a decode step at about 80 % of the machine's
 * read bandwidth; this reads them at the bandwidth, because it prefetches each next tile of weight rows
 * as it consumes the current one (docs/worker_runtime.md, "Dense kernels").
 */
#include <stdint.h>

typedef float weight_t;
typedef struct {
    const float *bias; /* or NULL */
} epilogue_t;

#define LOAD8(p, e) _mm256_loadu_ps(p)
#define LOAD1(p, e) (*(p))
#define FINISH(dot, j, e) ((dot) + ((e)->bias ? (e)->bias[j] : 0.0f))

#include "tiled_matmul.h"

/* x [m, k], w [n, k], bias [n] or NULL, y [m, n], all fp32 and contiguous. threads <= 1 runs on the calling
 * thread alone. */
void motley_dense_matmul(const float *x, const float *w, const float *bias, float *y, int64_t m, int64_t k,
                         int64_t n, int threads) {
    epilogue_t e = {bias};
    tiled_matmul(x, w, &e, y, m, k, n, threads);
}
