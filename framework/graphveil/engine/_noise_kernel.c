/* The CPU noise transform of graphveil.engine.noise in one pass.
 *
 * gv_chain_add_f32 / gv_chain_add_f64 compute, for the k coordinates of one chunk,
 *
 *     out[j] = round(out[j] + scale * (r_j sin phi_j + r_{j+1} cos phi_{j+1}))      j = 0 .. k-1
 *     r = sqrt(-2 ln u),  u = 1 - w_u 2^-53,  phi = 2 pi w_v 2^-53,
 *
 * from the chunk's k + 1 pairs of 64-bit keystream words (w_u, w_v: their low 53 bits): the chain
 * of Box-Muller pairs of the module note of noise.py, the same float64 quantities as its torch
 * transform (box_muller_chain), summed and scaled in float64 and rounded once to the output's
 * type. The elementary functions are computed here, from the integer words, each to within one
 * float64 ulp (tests/engine/test_noise_kernel.py measures them against long-double references):
 *
 * - the radius: u = 2^e f with e and f read from the bits of u (exact), ln f by the atanh series
 *   (RADIUS_TILE below), e ln 2 in two parts; a u near 1 keeps its small logarithm, as with the
 *   exact u of the torch transform;
 * - sin phi and cos phi together, by an EXACT reduction on the integer w_v: its top 3 bits are
 *   the octant o of phi, its low 50 bits r the angle within the octant, theta = r (2 pi 2^-53)
 *   from the octant's start (even o) or (2^50 - r)(2 pi 2^-53) back from its end (odd o), so
 *   theta in [0, pi/4] carries one rounding, as phi does in the torch transform; then Taylor
 *   polynomials of sin and cos on [0, pi/4] (truncation below 7e-17) and the octant's swap and
 *   signs.
 *
 * Why own functions: no floating-point range reduction is needed (the angle's octant is in the
 * word's bits), sin and cos share the reduction, and plain loops vectorise for both instruction
 * sets with no library: 2.4 ns per coordinate here, against 3.5 ns with glibc's SIMD log, sin and
 * cos (libmvec, the previous version) and ~14 ns for the torch transform. A tile of TILE
 * coordinates stays in L1 and the loops run 8 (AVX-512) or 4 (AVX2) lanes at a time.
 * gv_noise_simd() says which one this CPU runs (0: neither; the caller then keeps the torch
 * transform). No Python headers: the module is loaded with ctypes.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MASK53 ((UINT64_C(1) << 53) - 1)
#define TWO_PI_2M53 (6.283185307179586 * 0x1p-53) /* the same double as 2.0 * math.pi * 2.0**-53 */
#define TILE 512                               /* coordinates per tile: five arrays of TILE + 8, 20 KiB */
#define PAIRS (TILE + 8)                       /* a tile's TILE + 1 pairs, rounded up to 8 lanes */
#define LOW50 ((UINT64_C(1) << 50) - 1)

/* Polynomial coefficients, highest power first, in the variable x^2 (s^2 for the logarithm):
 * Taylor terms +-1/n! of sin (x^3 .. x^15, times x^3, plus x) and of cos (x^2 .. x^16, times x^2,
 * plus 1), and 1/(2k + 1) of atanh (s^3 .. s^21, times 2 s^3, plus 2 s). */
static const double SIN_C[7] = {-1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0,
                                -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0};
static const double COS_C[8] = {1.0 / 20922789888000.0, -1.0 / 87178291200.0, 1.0 / 479001600.0,
                                -1.0 / 3628800.0, 1.0 / 40320.0, -1.0 / 720.0, 1.0 / 24.0, -1.0 / 2.0};
static const double ATANH_C[10] = {1.0 / 21.0, 1.0 / 19.0, 1.0 / 17.0, 1.0 / 15.0, 1.0 / 13.0,
                                   1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0};

/* Horner's rule with fused multiply-adds (inlined into each target's loops, which it unrolls). */
static inline __attribute__((always_inline)) double horner(const double *c, int n, double y) {
    double acc = c[0];
    for (int i = 1; i < n; i++) acc = fma(acc, y, c[i]);
    return acc;
}

/* The radii sqrt(-2 ln u) of the p words w (low 53 bits) of u, into R (p rounded up to whole
 * vectors by the caller, padding u = 1): u = 1 - w 2^-53 in [2^-53, 1] is exact, u = 2^e f with
 * f in [sqrt(1/2), sqrt(2)) read from its bits (exact), then
 * ln f = 2 atanh(s) = 2 (s + s^3/3 + ... + s^21/21), s = (f - 1)/(f + 1), |s| <= 0.1716 (the terms
 * from s^23 on are below 2e-17 of ln f; f - 1 is exact, so a u near 1 keeps its small log), and
 * e ln 2 with ln 2 split in two (e * LN2_HI is exact). */
#define LN2_HI 0x1.62e42fee00000p-1
#define LN2_LO 0x1.a39ef35793c76p-33
#define FRAC52 ((UINT64_C(1) << 52) - 1)
#define SQRT2_FRAC UINT64_C(0x6a09e667f3bcd) /* the 52 fraction bits of sqrt(2) */
#define RADIUS_TILE(NAME, TARGET)                                                                    \
    __attribute__((target(TARGET))) static void NAME(const uint64_t *u, int64_t p, int64_t padded,   \
                                                     double *R) {                                    \
        int64_t j = 0;                                                                               \
        for (; j < p; j++) R[j] = (double)(u[j] & MASK53) * -0x1p-53 + 1.0; /* exact */              \
        for (; j < padded; j++) R[j] = 1.0;                                                          \
        for (j = 0; j < padded; j++) {                                                               \
            uint64_t bits;                                                                           \
            memcpy(&bits, R + j, 8);                                                                 \
            const uint64_t big = -(uint64_t)((bits & FRAC52) > SQRT2_FRAC); /* all ones: f / 2 */    \
            const uint64_t fbits = (bits & FRAC52) | ((UINT64_C(0x3ff) << 52) ^ (big & (UINT64_C(1) << 52))); \
            const double e = (double)((int64_t)(bits >> 52) - 1023 - (int64_t)big);                  \
            double f;                                                                                \
            memcpy(&f, &fbits, 8);                                                                   \
            const double s = (f - 1.0) / (f + 1.0), s2 = s * s;                                      \
            const double q = horner(ATANH_C, 10, s2);                                                \
            const double ln_f = fma(2.0 * s * s2, q, 2.0 * s);                                       \
            R[j] = sqrt(-2.0 * fma(e, LN2_HI, fma(e, LN2_LO, ln_f)));                                \
        }                                                                                            \
    }

RADIUS_TILE(radius_avx512, "avx512f,avx512dq")
RADIUS_TILE(radius_avx2, "avx2,fma")

/* sin and cos of phi = 2 pi w 2^-53 for the p words w (low 53 bits) of v, into S and C (p rounded
 * up to whole vectors by the caller: the arrays have PAIRS entries). Plain loops: the compiler
 * vectorises them for the function's target. Octant o = w >> 50:
 *   theta = (o odd ? 2^50 - r : r) (2 pi 2^-53),  r = w & (2^50 - 1),  theta in [0, pi/4];
 *   octants 1, 2, 5, 6 swap sin and cos ((o + 1) & 2); sin < 0 for o >= 4 (o & 4); cos < 0 for
 *   o in 2..5 ((o + 2) & 4). The Taylor terms from x^17 / x^18 on are below 7e-17 on [0, pi/4]. */
#define SINCOS_TILE(NAME, TARGET)                                                                    \
    __attribute__((target(TARGET))) static void NAME(const uint64_t *v, int64_t p, int64_t padded,   \
                                                     double *S, double *C) {                         \
        double X[PAIRS] __attribute__((aligned(64)));                                                \
        int64_t O[PAIRS] __attribute__((aligned(64)));                                               \
        int64_t j = 0;                                                                               \
        for (; j < p; j++) {                                                                         \
            const uint64_t w = v[j] & MASK53, o = w >> 50, odd = -(o & 1); /* all ones if o odd */   \
            X[j] = (double)(int64_t)(((w & LOW50) ^ odd) + (odd & (LOW50 + 2))) * TWO_PI_2M53;       \
            O[j] = (int64_t)o;                                                                       \
        }                                                                                            \
        for (; j < padded; j++) {                                                                    \
            X[j] = 0.0;                                                                              \
            O[j] = 0;                                                                                \
        }                                                                                            \
        for (j = 0; j < padded; j++) {                                                               \
            const double x = X[j], x2 = x * x;                                                       \
            const double ps = horner(SIN_C, 7, x2), pc = horner(COS_C, 8, x2);                       \
            const double sn = fma(x * x2, ps, x);                                                    \
            const double cs = fma(x2, pc, 1.0);                                                      \
            /* branch-free (so the loop vectorises): swap mask, then sign bits */                    \
            const uint64_t o = (uint64_t)O[j], swap = -(((o + 1) >> 1) & 1);                         \
            uint64_t bs, bc;                                                                         \
            memcpy(&bs, &sn, 8);                                                                     \
            memcpy(&bc, &cs, 8);                                                                     \
            const uint64_t ts = ((bc & swap) | (bs & ~swap)) ^ ((o & 4) << 61);                      \
            const uint64_t tc = ((bs & swap) | (bc & ~swap)) ^ (((o + 2) & 4) << 61);                \
            memcpy(S + j, &ts, 8);                                                                   \
            memcpy(C + j, &tc, 8);                                                                   \
        }                                                                                            \
    }

SINCOS_TILE(sincos_avx512, "avx512f,avx512dq")
SINCOS_TILE(sincos_avx2, "avx2,fma")

/* One kernel per (instruction set, output type). The tile's pairs t .. t + n: U holds their
 * radii, S and C the sine and cosine of their angles. Padding lanes compute the radius of u = 1
 * and sin 0 and are never read. */
#define CHAIN_KERNEL(NAME, TARGET, LANES, RADIUS, SINCOS, OUT)                                       \
    __attribute__((target(TARGET))) static void NAME(const uint64_t *u, const uint64_t *v, int64_t k, \
                                                      OUT *out, double scale) {                      \
        double U[PAIRS] __attribute__((aligned(64)));                                                \
        double S[PAIRS] __attribute__((aligned(64))), C[PAIRS] __attribute__((aligned(64)));         \
        for (int64_t t = 0; t < k; t += TILE) {                                                      \
            const int64_t n = k - t < TILE ? k - t : TILE, p = n + 1;                                \
            const int64_t padded = (p + LANES - 1) / LANES * LANES;                                  \
            RADIUS(u + t, p, padded, U);                                                             \
            SINCOS(v + t, p, padded, S, C);                                                          \
            for (int64_t j = 0; j < n; j++) /* this pair's sine, the next pair's cosine */           \
                out[t + j] = (OUT)((double)out[t + j] + scale * (S[j] * U[j] + U[j + 1] * C[j + 1])); \
        }                                                                                            \
    }

CHAIN_KERNEL(chain_f32_avx512, "avx512f,avx512dq", 8, radius_avx512, sincos_avx512, float)
CHAIN_KERNEL(chain_f64_avx512, "avx512f,avx512dq", 8, radius_avx512, sincos_avx512, double)
CHAIN_KERNEL(chain_f32_avx2, "avx2,fma", 4, radius_avx2, sincos_avx2, float)
CHAIN_KERNEL(chain_f64_avx2, "avx2,fma", 4, radius_avx2, sincos_avx2, double)

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

/* For the tests of the elementary functions against a high-precision reference: the radius
 * sqrt(-2 ln u) of n words u and the sine and cosine of the angle of n words v, each computed as
 * the kernel computes it. Returns 0, or -1 if this CPU has no kernel. */
int gv_pair_parts(const uint64_t *u, const uint64_t *v, int64_t n, double *radius, double *sin_out,
                  double *cos_out) {
    double U[PAIRS] __attribute__((aligned(64)));
    double S[PAIRS] __attribute__((aligned(64))), C[PAIRS] __attribute__((aligned(64)));
    const int level = gv_noise_simd();
    if (level == 0) return -1;
    const int64_t lanes = level == 2 ? 8 : 4;
    for (int64_t t = 0; t < n; t += TILE) {
        const int64_t p = n - t < TILE ? n - t : TILE, padded = (p + lanes - 1) / lanes * lanes;
        if (level == 2) {
            radius_avx512(u + t, p, padded, U);
            sincos_avx512(v + t, p, padded, S, C);
        } else {
            radius_avx2(u + t, p, padded, U);
            sincos_avx2(v + t, p, padded, S, C);
        }
        for (int64_t j = 0; j < p; j++) {
            radius[t + j] = U[j];
            sin_out[t + j] = S[j];
            cos_out[t + j] = C[j];
        }
    }
    return 0;
}
