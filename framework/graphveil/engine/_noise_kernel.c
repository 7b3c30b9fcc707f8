/* The CPU noise transform of graphveil.engine.noise in one pass, on glibc's SIMD math (libmvec).
 *
 * gv_chain_add_f32 / gv_chain_add_f64 compute, for the k coordinates of one chunk,
 *
 *     out[j] = round(out[j] + scale * (r_j sin phi_j + r_{j+1} cos phi_{j+1}))      j = 0 .. k-1
 *     r = sqrt(-2 ln u),  u = 1 - w_u 2^-53,  phi = 2 pi w_v 2^-53,
 *
 * from the chunk's k + 1 pairs of 64-bit keystream words (w_u, w_v: their low 53 bits): the chain
 * of Box-Muller pairs of the module note of noise.py, the same float64 operations in the same
 * order as its torch transform (box_muller_chain), summed and scaled in float64 and rounded once
 * to the output's type. Only the elementary functions differ: libmvec's vector log, sin and cos
 * (tested by glibc to a 4-ulp maximum relative error) instead of numpy's log and torch's sin and cos.
 *
 * Why C: in torch every stage is a pass over memory and sin and cos cost ~3 ns per element each;
 * here a tile of TILE coordinates stays in L1 and the vector functions run 8 (AVX-512) or 4
 * (AVX2) lanes at a time. gv_noise_simd() says which one this CPU runs (0: neither; the caller
 * then keeps the torch transform). No Python headers: the module is loaded with ctypes.
 */
#include <math.h>
#include <stdint.h>
#include <immintrin.h>

#define MASK53 ((UINT64_C(1) << 53) - 1)
#define TWO_PI_2M53 (6.283185307179586 * 0x1p-53) /* the same double as 2.0 * math.pi * 2.0**-53 */
#define TILE 512                               /* coordinates per tile: four arrays of TILE + 8 doubles, 16 KiB */
#define PAIRS (TILE + 8)                       /* a tile's TILE + 1 pairs, rounded up to 8 lanes */

__m512d _ZGVeN8v_log(__m512d);
__m512d _ZGVeN8v_sin(__m512d);
__m512d _ZGVeN8v_cos(__m512d);
__m256d _ZGVdN4v_log(__m256d);
__m256d _ZGVdN4v_sin(__m256d);
__m256d _ZGVdN4v_cos(__m256d);

/* One kernel per (instruction set, output type). The tile's pairs t .. t + n: U holds u, then
 * ln u, then the radius; P the angle; S and C its sine and cosine. Padding lanes compute ln 1
 * and sin 0 and are never read. */
#define CHAIN_KERNEL(NAME, TARGET, VEC, LANES, LOAD, STORE, VLOG, VSIN, VCOS, OUT)                   \
    __attribute__((target(TARGET))) static void NAME(const uint64_t *u, const uint64_t *v, int64_t k, \
                                                      OUT *out, double scale) {                        \
        double U[PAIRS] __attribute__((aligned(64))), P[PAIRS] __attribute__((aligned(64)));          \
        double S[PAIRS] __attribute__((aligned(64))), C[PAIRS] __attribute__((aligned(64)));          \
        for (int64_t t = 0; t < k; t += TILE) {                                                       \
            const int64_t n = k - t < TILE ? k - t : TILE, p = n + 1;                                 \
            const int64_t padded = (p + LANES - 1) / LANES * LANES;                                   \
            int64_t j = 0;                                                                            \
            for (; j < p; j++) {                                                                      \
                U[j] = (double)(u[t + j] & MASK53) * -0x1p-53 + 1.0; /* exact: (2^53 - w) 2^-53 */  \
                P[j] = (double)(v[t + j] & MASK53) * TWO_PI_2M53;                                     \
            }                                                                                         \
            for (; j < padded; j++) {                                                                 \
                U[j] = 1.0;                                                                           \
                P[j] = 0.0;                                                                           \
            }                                                                                         \
            for (j = 0; j < padded; j += LANES) {                                                     \
                VEC phi = LOAD(P + j);                                                                \
                STORE(U + j, VLOG(LOAD(U + j)));                                                      \
                STORE(S + j, VSIN(phi));                                                              \
                STORE(C + j, VCOS(phi));                                                              \
            }                                                                                         \
            for (j = 0; j < p; j++) U[j] = sqrt(U[j] * -2.0);                                         \
            for (j = 0; j < n; j++) /* this pair's sine, the next pair's cosine */                   \
                out[t + j] = (OUT)((double)out[t + j] + scale * (S[j] * U[j] + U[j + 1] * C[j + 1])); \
        }                                                                                             \
    }

CHAIN_KERNEL(chain_f32_avx512, "avx512f,avx512dq", __m512d, 8, _mm512_load_pd, _mm512_store_pd,
             _ZGVeN8v_log, _ZGVeN8v_sin, _ZGVeN8v_cos, float)
CHAIN_KERNEL(chain_f64_avx512, "avx512f,avx512dq", __m512d, 8, _mm512_load_pd, _mm512_store_pd,
             _ZGVeN8v_log, _ZGVeN8v_sin, _ZGVeN8v_cos, double)
CHAIN_KERNEL(chain_f32_avx2, "avx2,fma", __m256d, 4, _mm256_load_pd, _mm256_store_pd,
             _ZGVdN4v_log, _ZGVdN4v_sin, _ZGVdN4v_cos, float)
CHAIN_KERNEL(chain_f64_avx2, "avx2,fma", __m256d, 4, _mm256_load_pd, _mm256_store_pd,
             _ZGVdN4v_log, _ZGVdN4v_sin, _ZGVdN4v_cos, double)

static int simd_cap = 2;

/* Use at most `cap` (2, 1 or 0) below: how the tests run the AVX2 kernel on an AVX-512 CPU. */
void gv_noise_cap_simd(int cap) { simd_cap = cap; }

/* 2: AVX-512 (F and DQ), 1: AVX2 with FMA, 0: neither (no kernel runs). */
int gv_noise_simd(void) {
    __builtin_cpu_init();
    int level = 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) level = 2;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = 1;
    return level < simd_cap ? level : simd_cap;
}

/* words: the chunk's 2(k + 1) words, u_0 .. u_k then v_0 .. v_k. Returns 0, or -1 if this CPU
 * has no kernel (out untouched). */
int gv_chain_add_f32(const uint64_t *words, int64_t k, float *out, double scale) {
    switch (gv_noise_simd()) {
    case 2: chain_f32_avx512(words, words + k + 1, k, out, scale); return 0;
    case 1: chain_f32_avx2(words, words + k + 1, k, out, scale); return 0;
    default: return -1;
    }
}

int gv_chain_add_f64(const uint64_t *words, int64_t k, double *out, double scale) {
    switch (gv_noise_simd()) {
    case 2: chain_f64_avx512(words, words + k + 1, k, out, scale); return 0;
    case 1: chain_f64_avx2(words, words + k + 1, k, out, scale); return 0;
    default: return -1;
    }
}
