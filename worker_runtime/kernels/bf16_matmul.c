/* y = x @ w.T + bias for bf16 weights [n, k] and fp32 activations [m, k] (float_matmul.h): the kernel of a
 * CPU stage that computes in fp32 but keeps a bf16 checkpoint's weights as they are.
 *
 * Decode streams every weight once a step, so half the bytes of fp32 is nearly half the step. Each 8 weights
 * are widened to fp32 in registers (a bf16 is an fp32's upper 16 bits: zero-extend, shift left 16), exactly,
 * and then go through the same FMAs in the same order as dense_matmul.c's: the result is bit for bit that of
 * the fp32 kernel on the widened weights.
 */
#include <stdint.h>

typedef uint16_t weight_t;

#define LOAD8(p, e) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define LOAD1(p, e) bf16_to_float(*(p))
#define MATMUL motley_bf16_matmul

#include "float_matmul.h"
