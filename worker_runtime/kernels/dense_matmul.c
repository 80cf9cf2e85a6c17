/* y = x @ w.T + bias for fp32 weights [n, k] and fp32 activations [m, k], built for the few rows of a
 * decode step, on the tiling of tiled_matmul.h (float_matmul.h).
 *
 * oneDNN's inner product reads the unpacked fp32 weights of a decode step at about 80 % of the machine's
 * read bandwidth; this reads them at the bandwidth, because it prefetches each next tile of weight rows
 * as it consumes the current one (docs/worker_runtime.md, "Dense kernels").
 */
typedef float weight_t;

#define LOAD8(p, e) _mm256_loadu_ps(p)
#define LOAD1(p, e) (*(p))
#define MATMUL motley_dense_matmul

#include "float_matmul.h"
