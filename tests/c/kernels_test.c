/* SPDX-License-Identifier: BSD-3-Clause */
/* kernels_test.c: print a hash of every reduction kernel's output.
 *
 * Built several ways (baseline, with the CPU-dispatched clones, at each
 * -march level the CPU runs), every build must print the same lines: a
 * wider build may fold faster, never differently.  Inputs mix random bits
 * with the floating-point values where vector and scalar code could part
 * ways (NaN, infinities, signed zeros, subnormals); lengths and offsets are
 * odd so that every vector loop runs its scalar tail and unaligned loads.
 * The float kernels run again in the upward rounding mode.
 */
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xhc_internal.h"

#define COUNT 1031
#define WORDS (COUNT + 8)
/* Bytes every operand is moved by: 1 in the build that checks that the
 * kernels take buffers misaligned for their type. */
#ifndef XHC_TEST_SHIFT
#define XHC_TEST_SHIFT 0
#endif

/* Kernels read these as every dtype: allocated storage has no declared
 * type, and malloc aligns it for any of them. */
static unsigned char *a, *b, *dst;

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_bits(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static double special64(uint64_t k)
{
    const double v[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0,
                        5e-324, -2.2e-308, DBL_MAX, -1.0, 3.5};
    return v[k % (sizeof v / sizeof v[0])];
}

static float special32(uint64_t k)
{
    const float v[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f,
                       1e-45f, -1.1e-38f, FLT_MAX, -1.0f, 3.5f};
    return v[k % (sizeof v / sizeof v[0])];
}

/* Half precision as bits: quiet and signalling NaNs of either sign,
 * infinities, zeros, the least and the greatest subnormal, the greatest
 * finite, -1, 3.5. */
static uint16_t special16(uint64_t k)
{
    const uint16_t v[] = {0x7e00, 0xfe00, 0x7d01, 0x7c00, 0xfc00, 0x0000,
                          0x8000, 0x0001, 0x83ff, 0x7bff, 0xbc00, 0x4300};
    return v[k % (sizeof v / sizeof v[0])];
}

/* Random bits, and for floating types every seventh element special. */
static void fill(unsigned char *buf, int dtype, size_t esize)
{
    for (size_t i = 0; i < COUNT; i++) {
        uint64_t bits = next_bits();
        memcpy(buf + i * esize, &bits, esize);
        if (dtype == XHC_FLOAT64 && bits % 7 == 0) {
            double d = special64(bits >> 8);
            memcpy(buf + i * esize, &d, esize);
        } else if (dtype == XHC_FLOAT32 && bits % 7 == 0) {
            float f = special32(bits >> 8);
            memcpy(buf + i * esize, &f, esize);
        } else if (dtype == XHC_FLOAT16 && bits % 7 == 0) {
            uint16_t h = special16(bits >> 8);
            memcpy(buf + i * esize, &h, esize);
        }
    }
}

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* One line per kernel of float dtypes only if FLOATS_ONLY. */
static void hash_kernels(int floats_only)
{
    for (int dtype = 0; dtype < XHC_NDTYPES; dtype++) {
        size_t esize = xhc_dtype_size(dtype);
        int is_float = dtype == XHC_FLOAT16 || dtype == XHC_FLOAT32 ||
                       dtype == XHC_FLOAT64;
        if (floats_only && !is_float)
            continue;
        for (int op = 0; op < XHC_NOPS; op++) {
            xhc_reduce_fn fn = xhc_reduce_fn_get(dtype, op);
            if (!fn)
                continue;
            /* Odd offsets: no operand starts on a vector boundary. */
            unsigned char *pa = a + 3 * esize + XHC_TEST_SHIFT;
            unsigned char *pb = b + 5 * esize + XHC_TEST_SHIFT;
            unsigned char *pd = dst + esize + XHC_TEST_SHIFT;
            fill(pa, dtype, esize);
            fill(pb, dtype, esize);
            /* A kernel that skips an element leaves this, not the last
             * kernel's answer there, which another build would match. */
            memset(dst, 0xA5, WORDS * 8);
            fn(pd, pa, pb, COUNT);
            uint64_t apart = fnv1a(pd, COUNT * esize);
            fn(pb, pa, pb, COUNT); /* in place, as folds into a source */
            printf("%d %d %016llx %016llx\n", dtype, op,
                   (unsigned long long)apart,
                   (unsigned long long)fnv1a(pb, COUNT * esize));
        }
    }
}

int main(void)
{
    a = malloc(WORDS * 8), b = malloc(WORDS * 8), dst = malloc(WORDS * 8);
    if (!a || !b || !dst)
        return 1;
    hash_kernels(0);
    /* Rounding upwards, the float operations round alike in every build,
     * and float16's conversions back round to nearest even in each. */
    if (fesetround(FE_UPWARD) != 0)
        return 1;
    hash_kernels(1);
    free(a), free(b), free(dst);
    return 0;
}
