/* The tile loops of int4_matmul.c, written once for any vector width: int4_matmul.c includes this once per
 * ISA, having defined
 *   WIDTH        fp32 lanes of the ISA's vector (8: AVX2, 16: AVX-512);
 *   MAX_ROWS     activation rows a tile takes at once (as many as leave registers for the accumulators);
 *   PARTS(rows)  accumulators each row's dot product is split into, for enough independent FMA chains;
 *   TILES        the name of the function to define,
 * inside a `#pragma GCC target` region for that ISA. The layout and the arithmetic are int4_matmul.c's.
 */
#define VPT (LANES / WIDTH) /* vectors per tile of 16 output channels */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define vf CAT(vf, WIDTH) /* names of this inclusion's own */
#define vu CAT(vu, WIDTH)
#define vi CAT(vi, WIDTH)
#define tile CAT(tile, WIDTH)

typedef float vf __attribute__((vector_size(WIDTH * 4)));
typedef uint32_t vu __attribute__((vector_size(WIDTH * 4)));
typedef int32_t vi __attribute__((vector_size(WIDTH * 4)));

/* Rows [0, ROWS) of xs (pre-scaled activations, row stride k) and sums (their group sums) against one tile
 * (w, sz); adds each output to y (row stride n), which holds the bias or zero. */
ALWAYS_INLINE void tile(const float *xs, const float *sums, const uint32_t *w, const uint32_t *sz, float *y,
                        int64_t k, int64_t n, int64_t group, int ROWS, int P) {
    int64_t groups = k / group, span = group < SPAN ? group : SPAN;
    for (int64_t g = 0; g < groups; g++) {
        vf dots[MAX_ROWS][VPT];
#pragma GCC unroll 8
        for (int i = 0; i < ROWS; i++)
#pragma GCC unroll 2
            for (int v = 0; v < VPT; v++) dots[i][v] = (vf){0};
        for (int64_t p0 = g * group; p0 < (g + 1) * group; p0 += span) {
            vf acc[MAX_ROWS][VPT][8];
#pragma GCC unroll 8
            for (int i = 0; i < ROWS; i++)
#pragma GCC unroll 2
                for (int v = 0; v < VPT; v++)
#pragma GCC unroll 8
                    for (int a = 0; a < P; a++) acc[i][v][a] = (vf){0};
            for (int64_t p = p0; p < p0 + span; p += 8) {
                vu q[VPT];
                __builtin_prefetch((const char *)(w + p / 8 * LANES) + PREFETCH, 0, 2); /* into L2 */
                /* the scales, a quarter of the weights' bytes at groups of 32: about as far ahead in time */
                if (p == g * group) __builtin_prefetch((const char *)(sz + g * LANES) + PREFETCH / 4, 0, 2);
#pragma GCC unroll 2
                for (int v = 0; v < VPT; v++) memcpy(&q[v], w + p / 8 * LANES + v * WIDTH, sizeof q[v]);
#pragma GCC unroll 8
                for (int t = 0; t < 8; t++)
#pragma GCC unroll 2
                    for (int v = 0; v < VPT; v++) {
                        /* weight t times 2^4t (t = 7: times 1), against x times 2^-4t */
                        vu bits = t == 7 ? q[v] >> 28 : q[v] & (15u << (4 * t));
                        vf qf = __builtin_convertvector((vi)bits, vf);
#pragma GCC unroll 8
                        for (int i = 0; i < ROWS; i++) acc[i][v][t % P] += qf * xs[i * k + p + t];
                    }
            }
#pragma GCC unroll 8
            for (int i = 0; i < ROWS; i++)
#pragma GCC unroll 2
                for (int v = 0; v < VPT; v++) {
                    vf dot = acc[i][v][0];
#pragma GCC unroll 8
                    for (int a = 1; a < P; a++) dot += acc[i][v][a];
                    dots[i][v] += dot;
                }
        }
#pragma GCC unroll 2
        for (int v = 0; v < VPT; v++) {
            vu pair;
            memcpy(&pair, sz + g * LANES + v * WIDTH, sizeof pair);
            vf scale = (vf)(pair << 16), zero = (vf)(pair & 0xffff0000u);
            vf offset = zero - 8 * scale;
#pragma GCC unroll 8
            for (int i = 0; i < ROWS; i++) {
                vf out;
                memcpy(&out, y + i * n + v * WIDTH, sizeof out);
                out += scale * dots[i][v];
                out += offset * sums[i * groups + g];
                memcpy(y + i * n + v * WIDTH, &out, sizeof out);
            }
        }
    }
}

/* Tiles [c0, c1) of the output for all m rows. */
static void TILES(TILES_ARGS) {
    int64_t groups = k / group;
    for (int64_t r0 = 0; r0 < m; r0 += PANEL_ROWS) {
        int64_t r1 = r0 + PANEL_ROWS < m ? r0 + PANEL_ROWS : m;
        for (int64_t c = c0; c < c1; c++) {
            const uint32_t *wc = w + c * (k / 8) * LANES, *szc = sz + c * groups * LANES;
            for (int64_t i = r0; i < r1; i++)
                for (int l = 0; l < LANES; l++) y[i * n + c * LANES + l] = bias ? bias[c * LANES + l] : 0;
            for (int64_t i0 = r0; i0 < r1; i0 += MAX_ROWS) {
                const float *xi = xs + i0 * k, *si = sums + i0 * groups;
                float *yi = y + i0 * n + c * LANES;
                switch (r1 - i0 < MAX_ROWS ? r1 - i0 : MAX_ROWS) {
#define ROWS(r) tile(xi, si, wc, szc, yi, k, n, group, r < MAX_ROWS ? r : MAX_ROWS, PARTS(r)); break
                    case 1: ROWS(1);
                    case 2: ROWS(2);
                    case 3: ROWS(3);
                    case 4: ROWS(4);
                    case 5: ROWS(5);
                    case 6: ROWS(6);
                    case 7: ROWS(7);
                    default: ROWS(8);
#undef ROWS
                }
            }
        }
    }
}

#undef VPT
#undef CAT_
#undef CAT
#undef vf
#undef vu
#undef vi
#undef tile
