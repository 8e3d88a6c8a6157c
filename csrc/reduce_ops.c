/* SPDX-License-Identifier: BSD-3-Clause */
/* reduce_ops.c: element-wise reduction kernels, dtype x op.
 *
 * 1. Each kernel computes dst[i] = a[i] op b[i] in one pass; dst may be a
 *    or b (the same index only), so the loops stay simple enough for the
 *    compiler to vectorise.
 * 2. Floating point takes SUM, PROD, MIN, MAX; integers take all ten ops,
 *    as MPI defines them.  Floating MIN and MAX are IEEE 754-2019's
 *    minimum and maximum: a NaN in either operand gives a NaN, and -0 is
 *    below +0, so the result's value is the same whichever rank holds
 *    which (of several NaNs, the first in fold order gives its bits).
 *    (`x < y ? x : y` keeps a NaN only when it comes second, and of two
 *    zeros keeps the second.)  Half precision works in float and
 *    rounds each result once (see its kernels).
 * 3. xhc_fold reduces a list of buffers in list order, so every element's
 *    result depends only on the order of the list, never on timing.
 * 4. On x86-64 with GCC 12+ and glibc each kernel is built three times, for
 *    AVX-512, AVX2 and the SSE2 baseline, and the loader picks the widest
 *    the CPU runs (an ifunc): the core is built without -march, so that it
 *    runs wherever it is installed, yet folds at the CPU's full width.
 */
#include "xhc_internal.h"

/* A fold of cache-resident data (up to a few hundred KiB) ran 1.3-4x
 * faster with AVX2 or AVX-512 than with SSE2; from memory, the same.
 * GCC 12 is the first to take "arch=" in target_clones; compilers that
 * only pose as GCC (clang, icc, nvc) are left out. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) &&    \
    __GNUC__ >= 12 && !defined(__clang__) && !defined(__INTEL_COMPILER) && \
    !defined(__NVCOMPILER) && !defined(XHC_NO_CLONES)
#define XHC_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", \
                                 "default")))
#define XHC_DISPATCHED 1
#else
#define XHC_CLONES
#define XHC_DISPATCHED 0
#endif

/* The level whose kernels the loader picked, by the clones' own order of
 * preference; NULL if the kernels were built once, for the compiler's
 * target. */
const char *xhc_kernel_isa(void)
{
#if XHC_DISPATCHED
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
        return "x86-64-v4";
    if (__builtin_cpu_supports("x86-64-v3"))
        return "x86-64-v3";
    return "x86-64";
#else
    return NULL;
#endif
}

/* Buffers may be misaligned for their type (a numpy array at an odd
 * offset into a byte buffer): the kernels access elements through a
 * type of alignment 1, which x86-64 loads and stores as fast. */
#define XHC_KERNEL(name, type, expr)                                      \
    XHC_CLONES                                                            \
    static void name(void *dst_, const void *a_, const void *b_, size_t n) \
    {                                                                     \
        typedef type __attribute__((aligned(1))) elem;                    \
        elem *dst = dst_;                                                 \
        const elem *a = a_, *b = b_;                                      \
        for (size_t i = 0; i < n; i++) {                                  \
            type x = a[i], y = b[i];                                      \
            dst[i] = (type)(expr);                                        \
        }                                                                 \
    }

/* MIN and MAX of floats, as item 2 says.  Of equal operands only zeros
 * of both signs differ: ORing their bits keeps the sign (MIN), ANDing
 * drops it (MAX).  `x < y ? x : y` already gives a NaN in y; a NaN in x
 * is put back. */
/* XHC_PORTABLE_PICK builds the #else branch on x86-64 too (a test). */
#if defined(__SSE2__) && !defined(XHC_PORTABLE_PICK)
#include <emmintrin.h>

/* GCC 12 leaves selects like those of the #else branch scalar for SSE2,
 * at 4 to 20 times the time of a bare `x < y ? x : y`; so on x86-64 they
 * run on SSE2 vectors, in every clone, minpd/maxpd first.  The last
 * partial vector is padded rather than left to scalar code, so that
 * every element goes the same way even where subnormals read as zero
 * (DAZ, which a -ffast-math library may set). */
#define XHC_EQ_OR(sfx, o, x, y) \
    _mm_or_##sfx(o, _mm_and_##sfx(x, _mm_cmpeq_##sfx(x, y)))
#define XHC_EQ_AND(sfx, o, x, y) \
    _mm_and_##sfx(o, _mm_or_##sfx(x, _mm_cmpneq_##sfx(x, y)))
#define XHC_PICK_STEP(name, vec, sfx, op, eqjoin)                         \
    static inline vec name(vec x, vec y)                                  \
    {                                                                     \
        vec o = eqjoin(sfx, _mm_##op##_##sfx(x, y), x, y);                \
        vec xnan = _mm_cmpunord_##sfx(x, x);                              \
        return _mm_or_##sfx(_mm_and_##sfx(xnan, x),                       \
                            _mm_andnot_##sfx(xnan, o));                   \
    }
#define XHC_PICK_KERNEL(name, step, type, vec, sfx)                        \
    XHC_CLONES                                                            \
    static void name(void *dst_, const void *a_, const void *b_, size_t n) \
    {                                                                     \
        enum { W = sizeof(vec) / sizeof(type) };                          \
        type *dst = dst_;                                                 \
        const type *a = a_, *b = b_;                                      \
        size_t i = 0;                                                     \
        for (; i + W <= n; i += W)                                        \
            _mm_storeu_##sfx(dst + i, step(_mm_loadu_##sfx(a + i),        \
                                           _mm_loadu_##sfx(b + i)));      \
        if (i < n) {                                                      \
            type x[W] = {0}, y[W] = {0};                                  \
            memcpy(x, a + i, (n - i) * sizeof(type));                     \
            memcpy(y, b + i, (n - i) * sizeof(type));                     \
            _mm_storeu_##sfx(x, step(_mm_loadu_##sfx(x),                  \
                                     _mm_loadu_##sfx(y)));                \
            memcpy(dst + i, x, (n - i) * sizeof(type));                   \
        }                                                                 \
    }
#define XHC_MINMAX(t, type, bits, sfx, vec)                          \
    XHC_PICK_STEP(xhc_vmin_##t, vec, sfx, min, XHC_EQ_OR)            \
    XHC_PICK_STEP(xhc_vmax_##t, vec, sfx, max, XHC_EQ_AND)           \
    XHC_PICK_KERNEL(xhc_min_##t, xhc_vmin_##t, type, vec, sfx)       \
    XHC_PICK_KERNEL(xhc_max_##t, xhc_vmax_##t, type, vec, sfx)
#else
#define XHC_FLOAT_PICK(name, type, bits, less, join)                     \
    static inline type name(type x, type y)                              \
    {                                                                    \
        bits xb, yb, ob;                                                 \
        memcpy(&xb, &x, sizeof x);                                       \
        memcpy(&yb, &y, sizeof y);                                       \
        type m = x less y ? x : y;                                       \
        memcpy(&ob, &m, sizeof m);                                       \
        ob = x == y ? (xb join yb) : ob;                                 \
        ob = x != x ? xb : ob;                                           \
        memcpy(&m, &ob, sizeof m);                                       \
        return m;                                                        \
    }
#define XHC_MINMAX(t, type, bits, sfx, vec)                  \
    XHC_FLOAT_PICK(xhc_fmin_##t, type, bits, <, |)           \
    XHC_FLOAT_PICK(xhc_fmax_##t, type, bits, >, &)           \
    XHC_KERNEL(xhc_min_##t, type, xhc_fmin_##t(x, y))        \
    XHC_KERNEL(xhc_max_##t, type, xhc_fmax_##t(x, y))
#endif

#define XHC_ARITH(t, type, bits, sfx, vec)                  \
    XHC_KERNEL(xhc_sum_##t, type, x + y)                    \
    XHC_KERNEL(xhc_prod_##t, type, x * y)                   \
    XHC_MINMAX(t, type, bits, sfx, vec)

#define XHC_LOGIC(t, type)                                  \
    XHC_KERNEL(xhc_land_##t, type, (x != 0) && (y != 0))    \
    XHC_KERNEL(xhc_lor_##t, type, (x != 0) || (y != 0))     \
    XHC_KERNEL(xhc_lxor_##t, type, (x != 0) != (y != 0))    \
    XHC_KERNEL(xhc_band_##t, type, x & y)                   \
    XHC_KERNEL(xhc_bor_##t, type, x | y)                    \
    XHC_KERNEL(xhc_bxor_##t, type, x ^ y)

/* Unsigned sums wrap by definition; signed ones do too in MPI practice,
 * so fold in an unsigned type to stay defined C: one whose products
 * cannot overflow the signed int that types under 32 bits promote to. */
#define XHC_INT(t, type, utype)                                            \
    XHC_KERNEL(xhc_sum_##t, type, (utype)x + (utype)y)                     \
    XHC_KERNEL(xhc_prod_##t, type, (utype)x * (utype)y)                    \
    XHC_KERNEL(xhc_min_##t, type, x < y ? x : y)                           \
    XHC_KERNEL(xhc_max_##t, type, x > y ? x : y)                           \
    XHC_LOGIC(t, type)

XHC_INT(i8, int8_t, uint8_t)
XHC_INT(i16, int16_t, uint32_t)
XHC_INT(i32, int32_t, uint32_t)
XHC_INT(i64, int64_t, uint64_t)
XHC_INT(u8, uint8_t, uint32_t)
XHC_INT(u16, uint16_t, uint32_t)
XHC_INT(u32, uint32_t, uint32_t)
XHC_INT(u64, uint64_t, uint64_t)
XHC_ARITH(f32, float, uint32_t, ps, __m128)
XHC_ARITH(f64, double, uint64_t, pd, __m128d)

/* Half precision (float16), in integer and float operations any C11
 * compiler vectorises (GCC 12 converts each _Float16 element in a
 * library call: 100 times slower here).  An operation
 * widens both operands to float, where a sum or product of two halves,
 * rounded once to half, is the correctly rounded result (float's 24
 * bits are at least 2 * 11 + 2): numpy's bits, MPI's values.  Of two NaN
 * operands a NaN result takes the first's bits, quieted, as MIN and MAX
 * keep the first: hardware keeps whichever the compiler put first. */
#define XHC_HALF_QUIET 0x200u

static inline uint32_t xhc_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float xhc_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* C ? A : B without a branch, so that the compiler, which may not move
 * a float operation under a condition (it could trap), still vectorises
 * the loops that use it. */
static inline uint32_t xhc_select(int c, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - (uint32_t)c;
    return (a & m) | (b & ~m);
}

static inline int xhc_half_nan(uint16_t h)
{
    return (h & 0x7fffu) > 0x7c00u;
}

/* Exact: normals rebase their exponent; subnormals come from their count
 * of 2^-24, never through a float subnormal (which DAZ reads as zero);
 * infinities and NaNs keep their payload. */
static inline float xhc_half_to_float(uint16_t h)
{
    uint32_t mag = h & 0x7fffu, sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t normal = (mag << 13) + ((uint32_t)(127 - 15) << 23);
    uint32_t special = (mag << 13) | 0x7f800000u;
    uint32_t sub = xhc_float_bits((float)(int32_t)mag * 0x1p-24f);
    uint32_t u = xhc_select(mag >= 0x7c00u, special,
                            xhc_select(mag >= 0x400u, normal, sub));
    return xhc_bits_float(u | sign);
}

/* Rounded to nearest, ties to even, in every rounding mode (as F16C's
 * conversion below): each step is exact.  Normals drop 13 bits in the
 * integer (a carry moves to the next binade, or to infinity).  Below
 * 2^-14 the value in units of 2^-24 (the half subnormal step) is below
 * 1024: its integer part, then the remainder against one half. */
static inline uint16_t xhc_float_to_half(float f)
{
    uint32_t u = xhc_float_bits(f), a = u & 0x7fffffffu;
    uint32_t nan = 0x7c00u | XHC_HALF_QUIET | ((a >> 13) & 0x3ffu);
    uint32_t normal = (a - ((uint32_t)(127 - 15) << 23) + 0xfffu +
                       ((a >> 13) & 1u)) >> 13;
    float steps = xhc_bits_float(xhc_select(a < 0x38800000u, a, 0)) *
                  0x1p24f;
    int32_t whole = (int32_t)steps;
    float rest = steps - (float)whole;
    uint32_t sub = (uint32_t)whole +
                   (uint32_t)((rest > 0.5f) | ((rest == 0.5f) & whole));
    uint32_t h = xhc_select(a >= 0x38800000u, normal, sub);
    h = xhc_select(a >= 0x477ff000u, 0x7c00u, h); /* 65520 and up */
    h = xhc_select(a > 0x7f800000u, nan, h);
    return (uint16_t)(h | ((u >> 16) & 0x8000u));
}

static inline uint16_t xhc_half_result(uint16_t x, uint16_t y, float r)
{
    uint32_t h = xhc_select(xhc_half_nan(y), y | XHC_HALF_QUIET,
                            xhc_float_to_half(r));
    return (uint16_t)xhc_select(xhc_half_nan(x), x | XHC_HALF_QUIET, h);
}

/* As the float picks: JOIN of equal operands' bits, X if it is NaN. */
#define XHC_HALF_PICK(name, less, join)                                  \
    static inline uint16_t name(uint16_t x, uint16_t y)                  \
    {                                                                    \
        float fx = xhc_half_to_float(x), fy = xhc_half_to_float(y);      \
        uint16_t o = fx less fy ? x : y;                                 \
        o = fx == fy ? (uint16_t)(x join y) : o;                         \
        return xhc_half_nan(x) ? x : o;                                  \
    }
XHC_HALF_PICK(xhc_hmin, <, |)
XHC_HALF_PICK(xhc_hmax, >, &)

XHC_KERNEL(xhc_sum_f16_any, uint16_t, xhc_half_result(
    x, y, xhc_half_to_float(x) + xhc_half_to_float(y)))
XHC_KERNEL(xhc_prod_f16_any, uint16_t, xhc_half_result(
    x, y, xhc_half_to_float(x) * xhc_half_to_float(y)))
XHC_KERNEL(xhc_min_f16_any, uint16_t, xhc_hmin(x, y))
XHC_KERNEL(xhc_max_f16_any, uint16_t, xhc_hmax(x, y))

/* With F16C (x86-64-v3 and up), eight halves convert each way in one
 * instruction: float16 then folds 2 to 5 times faster than through the
 * integer conversions above, to the same bits (the conversions are
 * exact, and correctly rounded, whatever DAZ, FTZ and the rounding mode
 * say), NaNs and picks as above.  The last partial vector takes the loop
 * above. */
#if defined(__x86_64__) && (XHC_DISPATCHED || defined(__F16C__))
#include <immintrin.h>
#if defined(__F16C__) /* built for it, and so for AVX, which it implies */
#define XHC_F16C_TARGET
#else
#define XHC_F16C_TARGET __attribute__((target("arch=x86-64-v3")))
#endif

/* The lanes of H that hold a NaN. */
XHC_F16C_TARGET static inline __m128i xhc_f16c_nan(__m128i h)
{
    return _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)),
                           _mm_set1_epi16(0x7c00));
}

/* A comparison's 32-bit lanes as 16-bit ones. */
XHC_F16C_TARGET static inline __m128i xhc_f16c_mask(__m256 m)
{
    __m256i w = _mm256_castps_si256(m);
    return _mm_packs_epi32(_mm256_castsi256_si128(w),
                           _mm256_extractf128_si256(w, 1));
}

/* As xhc_half_result. */
XHC_F16C_TARGET static inline __m128i xhc_f16c_result(__m128i x, __m128i y,
                                                      __m256 r)
{
    const __m128i quiet = _mm_set1_epi16(XHC_HALF_QUIET);
    __m128i h = _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT);
    h = _mm_blendv_epi8(h, _mm_or_si128(y, quiet), xhc_f16c_nan(y));
    return _mm_blendv_epi8(h, _mm_or_si128(x, quiet), xhc_f16c_nan(x));
}

#define XHC_F16C_ARITH(name, vop)                                         \
    XHC_F16C_TARGET static inline __m128i name(__m128i x, __m128i y)      \
    {                                                                     \
        return xhc_f16c_result(                                           \
            x, y, vop(_mm256_cvtph_ps(x), _mm256_cvtph_ps(y)));           \
    }
/* As XHC_HALF_PICK. */
#define XHC_F16C_PICK(name, cmp, join)                                    \
    XHC_F16C_TARGET static inline __m128i name(__m128i x, __m128i y)      \
    {                                                                     \
        __m256 fx = _mm256_cvtph_ps(x), fy = _mm256_cvtph_ps(y);          \
        __m128i o = _mm_blendv_epi8(                                      \
            y, x, xhc_f16c_mask(_mm256_cmp_ps(fx, fy, cmp)));             \
        o = _mm_blendv_epi8(                                              \
            o, join(x, y), xhc_f16c_mask(_mm256_cmp_ps(fx, fy, _CMP_EQ_OQ))); \
        return _mm_blendv_epi8(o, x, xhc_f16c_nan(x));                    \
    }
XHC_F16C_ARITH(xhc_f16c_sum, _mm256_add_ps)
XHC_F16C_ARITH(xhc_f16c_prod, _mm256_mul_ps)
XHC_F16C_PICK(xhc_f16c_min, _CMP_LT_OQ, _mm_or_si128)
XHC_F16C_PICK(xhc_f16c_max, _CMP_GT_OQ, _mm_and_si128)

#define XHC_F16C_KERNEL(name)                                              \
    XHC_F16C_TARGET                                                       \
    static void xhc_##name##_f16_f16c(void *dst_, const void *a_,         \
                                      const void *b_, size_t n)           \
    {                                                                     \
        unsigned char *dst = dst_;                                        \
        const unsigned char *a = a_, *b = b_;                             \
        size_t i = 0;                                                     \
        for (; i + 8 <= n; i += 8) {                                      \
            __m128i x = _mm_loadu_si128((const void *)(a + 2 * i));      \
            __m128i y = _mm_loadu_si128((const void *)(b + 2 * i));      \
            _mm_storeu_si128((void *)(dst + 2 * i), xhc_f16c_##name(x, y)); \
        }                                                                 \
        xhc_##name##_f16_any(dst + 2 * i, a + 2 * i, b + 2 * i, n - i);   \
    }
XHC_F16C_KERNEL(sum)
XHC_F16C_KERNEL(prod)
XHC_F16C_KERNEL(min)
XHC_F16C_KERNEL(max)

/* Built for F16C, or does the CPU run x86-64-v3?  (A few loads of what
 * libgcc found at load time.) */
static int xhc_has_f16c(void)
{
#if defined(__F16C__)
    return 1;
#else
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v3");
#endif
}
#define XHC_HALF_DISPATCH(name)                                           \
    static void xhc_##name##_f16(void *dst, const void *a, const void *b, \
                                 size_t n)                                \
    {                                                                     \
        if (xhc_has_f16c())                                               \
            xhc_##name##_f16_f16c(dst, a, b, n);                          \
        else                                                              \
            xhc_##name##_f16_any(dst, a, b, n);                           \
    }
XHC_HALF_DISPATCH(sum)
XHC_HALF_DISPATCH(prod)
XHC_HALF_DISPATCH(min)
XHC_HALF_DISPATCH(max)
#define XHC_HALF(name) xhc_##name##_f16
#else
#define XHC_HALF(name) xhc_##name##_f16_any
#endif

#define XHC_INT_ROW(t)                                                   \
    { xhc_sum_##t, xhc_prod_##t, xhc_min_##t, xhc_max_##t, xhc_land_##t, \
      xhc_lor_##t, xhc_lxor_##t, xhc_band_##t, xhc_bor_##t, xhc_bxor_##t }
#define XHC_FLOAT_ROW(t) \
    { xhc_sum_##t, xhc_prod_##t, xhc_min_##t, xhc_max_##t }

static const xhc_reduce_fn xhc_kernels[XHC_NDTYPES][XHC_NOPS] = {
    XHC_INT_ROW(i8), XHC_INT_ROW(i16), XHC_INT_ROW(i32), XHC_INT_ROW(i64),
    XHC_INT_ROW(u8), XHC_INT_ROW(u16), XHC_INT_ROW(u32), XHC_INT_ROW(u64),
    XHC_FLOAT_ROW(f32), XHC_FLOAT_ROW(f64),
    { XHC_HALF(sum), XHC_HALF(prod), XHC_HALF(min), XHC_HALF(max) },
};

static const size_t xhc_sizes[XHC_NDTYPES] = { 1, 2, 4, 8, 1, 2, 4, 8,
                                               4, 8, 2 };

xhc_reduce_fn xhc_reduce_fn_get(int dtype, int op)
{
    if (dtype < 0 || dtype >= XHC_NDTYPES || op < 0 || op >= XHC_NOPS)
        return NULL;
    return xhc_kernels[dtype][op];
}

size_t xhc_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < XHC_NDTYPES ? xhc_sizes[dtype] : 0;
}

int xhc_op_valid(int dtype, int op)
{
    return xhc_reduce_fn_get(dtype, op) != NULL;
}

int xhc_fold_into(void *inout, const void *in, size_t count, int dtype,
                  int op)
{
    xhc_reduce_fn fn = xhc_reduce_fn_get(dtype, op);
    if (!fn)
        return XHC_ERR_ARG;
    fn(inout, in, inout, count); /* dst may be b (see 1.) */
    return 0;
}

/* dst = srcs[0] op srcs[1] op ... in list order.  ACC (COUNT elements,
 * private) holds partial results, so dst may alias any source: it is
 * written only by the last step, which reads ACC and the last source. */
void xhc_fold(void *dst, const void *const *srcs, int nsrc, void *acc,
              size_t count, size_t esize, xhc_reduce_fn fn)
{
    if (nsrc == 1) {
        if (dst != srcs[0])
            memmove(dst, srcs[0], count * esize);
        return;
    }
    const void *left = srcs[0];
    for (int i = 1; i < nsrc - 1; i++) {
        fn(acc, left, srcs[i], count);
        left = acc;
    }
    fn(dst, left, srcs[nsrc - 1], count);
}
