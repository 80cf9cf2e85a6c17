/* All decoder layers of a stage for one decode step (every sequence adds one token), in one call: RMSNorm,
 * the q/k/v matmul, RoPE, the KV cache write, attention, o_proj and its residual, RMSNorm, the gate/up
 * matmul, SwiGLU, down_proj and its residual, layer after layer.
 *
 * Why: at batch 1 a small model's step is mostly not its matmuls. On torch ops SmolLM2 (30 layers, hidden
 * 576) spends about half of a 10 ms int4 step on 35 dispatched ops a layer around the four matmuls, each
 * 1-3 us of dispatch for a few hundred floats of work (docs/benchmarks.md, "Where a batch-1 decode step
 * goes").
 * Here those ops are plain loops over the row, and the step costs one ctypes call for the whole stage.
 *
 * The matmuls stay the kernels this package already has (int8_matmul.c, int4_matmul.c, dense_matmul.c,
 * and f16_matmul.c / bf16_matmul.c for 16-bit weights, as DENSE: the same arguments): each layer's linear
 * arrives as a linear_t naming its kernel function (the address of the loaded library's symbol) and its
 * tensors, so their code is written once. Every activation is fp32, as in those kernels and in the fp32
 * stages this serves; the arithmetic is transformers': RMSNorm
 * as x * rsqrt(mean(x^2) + eps) * weight, RoPE in the rotate-half layout from the caller's cos and signed
 * sin (rope.py: every scaling variant is in those tables), softmax(q k / sqrt(head_dim)) v with each query
 * head reading its kv head (GQA), silu(gate) * up.
 *
 * Layouts (kernels/decode_layers.py builds the descriptors): x [m, hidden]; a layer's k and v caches
 * [slots, kv_heads, head_dim]; cos and sin [m, head_dim]; write_slots [m]; gather_slots [m, width], the
 * cache slots of each sequence's keys in order, the new token's at lengths[i] - 1 (the rest of a row is
 * padding); with a sliding window a sequence attends to its last `window` positions only (Mistral).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_support.h"

enum { DENSE = 0, INT8 = 1, INT4 = 2 };

typedef void (*dense_fn)(const float *, const void *, const float *, float *, int64_t, int64_t, int64_t, int);
typedef void (*int8_fn)(const float *, const void *, const void *, const float *, float *, int64_t, int64_t,
                        int64_t, int);
typedef int (*int4_fn)(const float *, const void *, const void *, const float *, float *, int64_t, int64_t,
                       int64_t, int64_t, int, int);

typedef struct {
    int32_t kind;      /* DENSE, INT8 (a scale per row) or INT4 */
    int32_t wide;      /* INT4: run its AVX-512 code */
    const void *fn;    /* the kernel: motley_dense_matmul, motley_bf16_matmul, motley_int8_matmul, ... */
    const void *weight;
    const void *scales; /* NULL for DENSE */
    const float *bias;  /* or NULL */
    int64_t k, n, group;
    int64_t shared;     /* 1: the matmul runs on the caller's thread team; 0: a weight too small to share */
} linear_t;

typedef struct {
    const float *attention_norm, *ffn_norm;
    linear_t qkv, o, gate_up, down;
    float *k_cache, *v_cache;
} layer_t;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    float eps;
    int32_t threads; /* the thread team's size (torch.get_num_threads()) */
    int64_t window;  /* the sliding window in positions, 0 for none */
} shape_t;

/* The longest head the rotation buffer holds (kernels/decode_layers.py says the same to its callers). */
#define MAX_HEAD_DIM 512
/* Multiply-adds of attention below which a second thread costs more than it saves. */
#define PARALLEL_ATTENTION_WORK (1 << 18)

static int linear(const linear_t *l, const shape_t *s, const float *x, float *y, int64_t m) {
    int team = l->shared ? s->threads : 1;
    switch (l->kind) {
        case DENSE:
            ((dense_fn)l->fn)(x, l->weight, l->bias, y, m, l->k, l->n, team);
            return 0;
        case INT8:
            ((int8_fn)l->fn)(x, l->weight, l->scales, l->bias, y, m, l->k, l->n, team);
            return 0;
        default:
            return ((int4_fn)l->fn)(x, l->weight, l->scales, l->bias, y, m, l->k, l->n, l->group, l->wide,
                                    team);
    }
}

#pragma GCC push_options
#pragma GCC target("avx2,fma")

typedef float v8 __attribute__((vector_size(32)));

static inline float sum8(v8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* Sum of a[i] * b[i] in 8 lanes (then the tail): the lanes make the adds independent of each other. */
static inline float dot(const float *a, const float *b, int64_t n) {
    v8 acc = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8 va, vb;
        memcpy(&va, a + i, sizeof va);
        memcpy(&vb, b + i, sizeof vb);
        acc += va * vb;
    }
    float s = sum8(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out = x * rsqrt(mean(x^2) + eps) * weight, one row of n. */
static void rms_norm(const float *x, const float *weight, float *out, int64_t n, float eps) {
    float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * weight[i];
}

/* Rotate each of `heads` vectors of d in place: x * cos + [x2, x1] * signed_sin (rope.py, apply_rotary). */
static void rotate(float *x, int64_t heads, int64_t d, const float *cos, const float *sin) {
    float rolled[MAX_HEAD_DIM];
    int64_t half = d / 2;
    for (int64_t h = 0; h < heads; h++, x += d) {
        memcpy(rolled, x + half, sizeof(float) * half);
        memcpy(rolled + half, x, sizeof(float) * half);
        for (int64_t i = 0; i < d; i++) x[i] = x[i] * cos[i] + rolled[i] * sin[i];
    }
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* The `group` query heads (q: group x d) that read one kv head, for one sequence: out = softmax(q . keys /
 * sqrt(d)) . values over its `length` cached slots. Each key and value row is read once for all of them
 * (GQA), which at long contexts is most of a step's attention time. scores: room for group x length. */
static void attend(const float *q, int64_t group, const float *k_cache, const float *v_cache,
                   const int64_t *slots, int64_t length, int64_t stride, int64_t d, float *scores,
                   float *out) {
    float scale = 1.0f / sqrtf((float)d);
    for (int64_t j = 0; j < length; j++) {
        const float *k = k_cache + slots[j] * stride;
        for (int64_t h = 0; h < group; h++) scores[h * length + j] = dot(q + h * d, k, d) * scale;
    }
    for (int64_t h = 0; h < group; h++) {
        float *s = scores + h * length, top = -INFINITY, total = 0.0f;
        for (int64_t j = 0; j < length; j++) top = s[j] > top ? s[j] : top;
        for (int64_t j = 0; j < length; j++) total += s[j] = expf(s[j] - top);
        for (int64_t j = 0; j < length; j++) s[j] /= total;
    }
    memset(out, 0, sizeof(float) * group * d);
    for (int64_t j = 0; j < length; j++) {
        const float *v = v_cache + slots[j] * stride;
        for (int64_t h = 0; h < group; h++) axpy(out + h * d, scores[h * length + j], v, d);
    }
}

/* Every query head of every row: `qkv` rows hold q (heads x d) then k and v; `out` rows heads x d. One job
 * per row and kv head. */
static int attention(const layer_t *l, const shape_t *s, const float *qkv, float *out, int64_t m,
                     const int64_t *gather_slots, const int64_t *lengths, int64_t width) {
    int64_t d = s->head_dim, qkv_n = l->qkv.n, stride = s->kv_heads * d, group = s->heads / s->kv_heads;
    int64_t jobs = m * s->kv_heads, longest = 0, work = 0;
    for (int64_t i = 0; i < m; i++) {
        longest = lengths[i] > longest ? lengths[i] : longest;
        work += lengths[i] * s->heads * d * 2;
    }
    int team = s->threads > 1 && work >= PARALLEL_ATTENTION_WORK ? s->threads : 1;
    int failed = 0;
#pragma omp parallel num_threads(team) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * group * longest);
        if (!scores) {
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t job = 0; job < jobs; job++) {
                int64_t i = job / s->kv_heads, g = job % s->kv_heads;
                int64_t first = s->window && lengths[i] > s->window ? lengths[i] - s->window : 0;
                float *heads_out = out + (i * s->heads + g * group) * d;
                attend(qkv + i * qkv_n + g * group * d, group, l->k_cache + g * d, l->v_cache + g * d,
                       gather_slots + i * width + first, lengths[i] - first, stride, d, scores, heads_out);
            }
        }
        free(scores);
    }
    return failed ? -1 : 0;
}

/* act = silu(gate) * up for gate_up rows [gate (n), up (n)]. */
static void swiglu(const float *gate_up, float *act, int64_t m, int64_t n) {
    for (int64_t r = 0; r < m; r++, gate_up += 2 * n, act += n)
        for (int64_t i = 0; i < n; i++) act[i] = gate_up[i] / (1.0f + expf(-gate_up[i])) * gate_up[n + i];
}

static void add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

#pragma GCC pop_options

/* Runs layers[0..n_layers) over x [m, hidden] in place (see the top for the other arguments). Returns 0, or
 * -1 where scratch memory could not be had or a kernel failed (x is then partly computed). */
int motley_decode_layers(const layer_t *layers, int64_t n_layers, const shape_t *s, float *x, int64_t m,
                         const float *cos, const float *sin, const int64_t *write_slots,
                         const int64_t *gather_slots, const int64_t *lengths, int64_t width) {
    int64_t hidden = s->hidden, d = s->head_dim, q_size = s->heads * d, kv_size = s->kv_heads * d;
    if (n_layers == 0 || m == 0) return 0;
    if (d > MAX_HEAD_DIM) return -1;
    int64_t qkv_n = layers[0].qkv.n, inter = s->intermediate;
    float eps = s->eps;
    float *scratch = malloc(sizeof(float) * m * (hidden + qkv_n + q_size + hidden + 3 * inter));
    if (!scratch) return -1;
    float *normed = scratch, *qkv = normed + m * hidden, *attn = qkv + m * qkv_n, *proj = attn + m * q_size;
    float *gate_up = proj + m * hidden, *act = gate_up + m * 2 * inter;
    int status = 0;
    for (int64_t li = 0; li < n_layers && !status; li++) {
        const layer_t *l = layers + li;
        for (int64_t i = 0; i < m; i++)
            rms_norm(x + i * hidden, l->attention_norm, normed + i * hidden, hidden, eps);
        if ((status = linear(&l->qkv, s, normed, qkv, m))) break;
        for (int64_t i = 0; i < m; i++) {
            float *row = qkv + i * qkv_n;
            rotate(row, s->heads + s->kv_heads, d, cos + i * d, sin + i * d);  /* q and k lie side by side */
            memcpy(l->k_cache + write_slots[i] * kv_size, row + q_size, sizeof(float) * kv_size);
            memcpy(l->v_cache + write_slots[i] * kv_size, row + q_size + kv_size, sizeof(float) * kv_size);
        }
        if ((status = attention(l, s, qkv, attn, m, gather_slots, lengths, width))) break;
        if ((status = linear(&l->o, s, attn, proj, m))) break;
        add(x, proj, m * hidden);
        for (int64_t i = 0; i < m; i++)
            rms_norm(x + i * hidden, l->ffn_norm, normed + i * hidden, hidden, eps);
        if ((status = linear(&l->gate_up, s, normed, gate_up, m))) break;
        swiglu(gate_up, act, m, inter);
        if ((status = linear(&l->down, s, act, proj, m))) break;
        add(x, proj, m * hidden);
    }
    free(scratch);
    return status ? -1 : 0;
}
