/* y = x @ w.T + bias for fp16 weights [n, k] and fp32 activations [m, k] (float_matmul.h): the kernel of a
 * CPU stage that computes in fp32 but keeps an fp16 checkpoint's weights as they are.
 *
 * Decode streams every weight once a step, so half the bytes of fp32 is nearly half the step. Each 8 weights
 * are widened to fp32 in registers (vcvtph2ps, F16C), exactly, and then go through the same FMAs in the same
 * order as dense_matmul.c's: the result is bit for bit that of the fp32 kernel on the widened weights.
 */
#include <stdint.h>

#define NEEDS_F16C

typedef uint16_t weight_t;

#define LOAD8(p, e) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LOAD1(p, e) _cvtsh_ss(*(p))
#define MATMUL motley_f16_matmul

#include "float_matmul.h"
