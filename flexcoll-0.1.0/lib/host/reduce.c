/* reduce.c — elementwise reductions and AVG's final division on host buffers.
 *
 * One loop per (datatype, operator), stamped out by macros, written so that GCC vectorises it
 * at -O2 as well as -O3 (check with -fopt-info-vec):
 *  - Each loop runs in blocks of FC_BLOCK elements with a constant-count inner loop plus a
 *    scalar tail.  GCC's -O2 cost model ("very cheap") vectorises only loops that need no
 *    scalar epilogue and no runtime alias checks; a constant count that the vector width
 *    divides satisfies the first.
 *  - dst may be exactly a or b, so no restrict.  Exact aliasing is no loop-carried dependency
 *    (element i is read before it is written, and no other element touches it), which is what
 *    `#pragma GCC ivdep` promises; that satisfies the second.  Partially overlapping buffers
 *    (dst == a + 1) are not supported.
 *  - Buffers must be aligned to their element size (as any C typed access requires).
 *  Measured with GCC 12 x86-64 baseline (SSE2): every loop vectorises except int64 PROD/MAX/MIN
 *  (no SSE2 instructions; they do with -mavx2) and the integer divisions (no SIMD divide).
 *
 * Semantics, identical to the CUDA kernels so that host and device results agree:
 *  - Integer SUM/PROD wrap modulo 2^bits; signed types are computed in their unsigned
 *    counterpart (same bits, no signed-overflow UB).
 *  - Floating-point MAX/MIN follow IEEE 754 / C fmax/fmin (as CUDA's fmaxf/fminf do): a NaN
 *    operand is ignored when the other is a number, the result is NaN only when both are.
 *    Operands that compare equal give b's (max(+0, -0) = -0), as lib/kernels/ops.cuh does.
 *    (Under -ffinite-math-only the NaN test folds away.)
 *  - float16/bfloat16 convert both operands to float, operate in float and round back to
 *    nearest even, per element and per operation (fc_float_to_half / fc_float_to_bf16); MAX/MIN
 *    get the same bits without the float detour.  NaN results are CUDA's canonical 0x7fff.
 *  - AVG reduces as SUM; fc_host_divide divides once at the end.
 */
#include <math.h>
#include <stdint.h>

#include "dtype.h"
#include "host/host.h"

/* Elements per inner loop: a multiple of every vector width up to 64-byte int8 vectors. */
#define FC_BLOCK 64

#if defined(__clang__)
#define FC_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define FC_IVDEP _Pragma("GCC ivdep")
#else
#define FC_IVDEP
#endif

typedef void (*fc_reduce_fn)(void *dst, const void *a, const void *b, size_t count);
typedef void (*fc_divide_fn)(void *buf, size_t count, int n);

/* dst[i] = EXPR with x = a[i], y = b[i], for element type T. */
#define FC_DEFINE_REDUCE(NAME, T, EXPR)                                                  \
  static void NAME(void *dstv, const void *av, const void *bv, size_t count) {          \
    T *d = (T *)dstv;                                                                    \
    const T *a = (const T *)av, *b = (const T *)bv;                                      \
    size_t i = 0;                                                                        \
    for (; i + FC_BLOCK <= count; i += FC_BLOCK) {                                       \
      T *bd = d + i;                                                                     \
      const T *ba = a + i, *bb = b + i;                                                  \
      FC_IVDEP                                                                           \
      for (size_t j = 0; j < FC_BLOCK; j++) {                                            \
        const T x = ba[j], y = bb[j];                                                    \
        bd[j] = (EXPR);                                                                  \
      }                                                                                  \
    }                                                                                    \
    for (; i < count; i++) {                                                             \
      const T x = a[i], y = b[i];                                                        \
      d[i] = (EXPR);                                                                     \
    }                                                                                    \
  }

/* buf[i] = EXPR with x = buf[i] (and the caller's n in scope), for element type T. */
#define FC_DEFINE_DIVIDE(NAME, T, SETUP, EXPR)                                           \
  static void NAME(void *bufv, size_t count, int n) {                                    \
    T *p = (T *)bufv;                                                                    \
    SETUP;                                                                               \
    size_t i = 0;                                                                        \
    for (; i + FC_BLOCK <= count; i += FC_BLOCK) {                                       \
      T *bp = p + i;                                                                     \
      for (size_t j = 0; j < FC_BLOCK; j++) {                                            \
        const T x = bp[j];                                                               \
        bp[j] = (EXPR);                                                                  \
      }                                                                                  \
    }                                                                                    \
    for (; i < count; i++) {                                                             \
      const T x = p[i];                                                                  \
      p[i] = (EXPR);                                                                     \
    }                                                                                    \
  }

/* IEEE fmax/fmin (libm's are calls): x when it wins or when y is NaN, else y (which covers x
 * NaN).  Quiet comparisons (isgreater, !=) and | rather than ||: GCC will not move an
 * FE_INVALID-raising x > y out of a branch, and a branch in the loop stops vectorisation. */
static inline float fc_fmaxf_(float x, float y) { return (isgreater(x, y) | (y != y)) ? x : y; }
static inline float fc_fminf_(float x, float y) { return (isless(x, y) | (y != y)) ? x : y; }
static inline double fc_fmax_(double x, double y) { return (isgreater(x, y) | (y != y)) ? x : y; }
static inline double fc_fmin_(double x, double y) { return (isless(x, y) | (y != y)) ? x : y; }

/* float16/bfloat16 MAX/MIN on the 16-bit patterns, bit for bit what converting to float,
 * fmaxf/fminf and rounding back give (the winner rounds back to itself, a NaN result becomes
 * CUDA's 0x7fff), because GCC does not vectorise the float version (it mixes float and
 * integer masks).  key() orders patterns as their values, -0 equal to +0 as in a float
 * comparison; INF is the infinity pattern (0x7c00, 0x7f80): larger magnitudes are NaNs. */
static inline int32_t fc_key16_(uint32_t h) {
  const int32_t mag = (int32_t)(h & 0x7fffu);
  return (h & 0x8000u) ? -mag : mag;
}

static inline uint16_t fc_max16_(uint32_t x, uint32_t y, uint32_t inf) {
  const int xnan = (x & 0x7fffu) > inf, ynan = (y & 0x7fffu) > inf;
  const uint32_t r = (((fc_key16_(x) > fc_key16_(y)) & !xnan) | ynan) ? x : y;
  return (uint16_t)((r & 0x7fffu) > inf ? 0x7fffu : r);
}

static inline uint16_t fc_min16_(uint32_t x, uint32_t y, uint32_t inf) {
  const int xnan = (x & 0x7fffu) > inf, ynan = (y & 0x7fffu) > inf;
  const uint32_t r = (((fc_key16_(x) < fc_key16_(y)) & !xnan) | ynan) ? x : y;
  return (uint16_t)((r & 0x7fffu) > inf ? 0x7fffu : r);
}

#define FC_IMAX(x, y) ((x) > (y) ? (x) : (y))
#define FC_IMIN(x, y) ((x) < (y) ? (x) : (y))

/* Integers: SUM/PROD on the unsigned type serve both signednesses; the casts truncate the
 * int-promoted results of the 8-bit types.  The divisor stays an int (unsigned) so that n
 * above 127 is not truncated for the 8-bit types; n >= 2 here, so x / n cannot overflow. */
#define FC_DEFINE_INT(BITS)                                                                  \
  FC_DEFINE_REDUCE(sum_u##BITS, uint##BITS##_t, (uint##BITS##_t)(x + y))                     \
  FC_DEFINE_REDUCE(prod_u##BITS, uint##BITS##_t, (uint##BITS##_t)(x * y))                    \
  FC_DEFINE_REDUCE(max_u##BITS, uint##BITS##_t, FC_IMAX(x, y))                               \
  FC_DEFINE_REDUCE(min_u##BITS, uint##BITS##_t, FC_IMIN(x, y))                               \
  FC_DEFINE_REDUCE(max_i##BITS, int##BITS##_t, FC_IMAX(x, y))                                \
  FC_DEFINE_REDUCE(min_i##BITS, int##BITS##_t, FC_IMIN(x, y))                                \
  FC_DEFINE_DIVIDE(div_u##BITS, uint##BITS##_t, const unsigned dn = (unsigned)n,            \
                   (uint##BITS##_t)(x / dn))                                                 \
  FC_DEFINE_DIVIDE(div_i##BITS, int##BITS##_t, const int dn = n, (int##BITS##_t)(x / dn))

/* float32/float64: the operation in the type itself. */
#define FC_DEFINE_FLOAT(NAME, T, FMAX, FMIN)                      \
  FC_DEFINE_REDUCE(sum_##NAME, T, x + y)                          \
  FC_DEFINE_REDUCE(prod_##NAME, T, x * y)                         \
  FC_DEFINE_REDUCE(max_##NAME, T, FMAX(x, y))                     \
  FC_DEFINE_REDUCE(min_##NAME, T, FMIN(x, y))                     \
  FC_DEFINE_DIVIDE(div_##NAME, T, const T dn = (T)n, x / dn)

/* float16/bfloat16 stored as uint16_t: widen to float, operate, round back to nearest even. */
#define FC_W(NAME, v) fc_##NAME##_to_float(v)
#define FC_N(NAME, v) fc_float_to_##NAME(v)
#define FC_DEFINE_HALF(NAME, INF)                                                       \
  FC_DEFINE_REDUCE(sum_##NAME, uint16_t, FC_N(NAME, FC_W(NAME, x) + FC_W(NAME, y)))     \
  FC_DEFINE_REDUCE(prod_##NAME, uint16_t, FC_N(NAME, FC_W(NAME, x) * FC_W(NAME, y)))    \
  FC_DEFINE_REDUCE(max_##NAME, uint16_t, fc_max16_(x, y, INF))                          \
  FC_DEFINE_REDUCE(min_##NAME, uint16_t, fc_min16_(x, y, INF))                          \
  FC_DEFINE_DIVIDE(div_##NAME, uint16_t, const float dn = (float)n, FC_N(NAME, FC_W(NAME, x) / dn))

FC_DEFINE_INT(8)
FC_DEFINE_INT(32)
FC_DEFINE_INT(64)
FC_DEFINE_FLOAT(f32, float, fc_fmaxf_, fc_fminf_)
FC_DEFINE_FLOAT(f64, double, fc_fmax_, fc_fmin_)
FC_DEFINE_HALF(half, 0x7c00u)
FC_DEFINE_HALF(bf16, 0x7f80u)

/* Indexed by datatype, then by SUM, PROD, MAX, MIN (AVG uses SUM). */
static const fc_reduce_fn reduce_fns[FLEXCOLL_NUM_DATATYPES][4] = {
  [FLEXCOLL_INT8] = {sum_u8, prod_u8, max_i8, min_i8},
  [FLEXCOLL_UINT8] = {sum_u8, prod_u8, max_u8, min_u8},
  [FLEXCOLL_INT32] = {sum_u32, prod_u32, max_i32, min_i32},
  [FLEXCOLL_UINT32] = {sum_u32, prod_u32, max_u32, min_u32},
  [FLEXCOLL_INT64] = {sum_u64, prod_u64, max_i64, min_i64},
  [FLEXCOLL_UINT64] = {sum_u64, prod_u64, max_u64, min_u64},
  [FLEXCOLL_FLOAT16] = {sum_half, prod_half, max_half, min_half},
  [FLEXCOLL_BFLOAT16] = {sum_bf16, prod_bf16, max_bf16, min_bf16},
  [FLEXCOLL_FLOAT32] = {sum_f32, prod_f32, max_f32, min_f32},
  [FLEXCOLL_FLOAT64] = {sum_f64, prod_f64, max_f64, min_f64},
};

static const fc_divide_fn divide_fns[FLEXCOLL_NUM_DATATYPES] = {
  [FLEXCOLL_INT8] = div_i8,     [FLEXCOLL_UINT8] = div_u8,      [FLEXCOLL_INT32] = div_i32,
  [FLEXCOLL_UINT32] = div_u32,  [FLEXCOLL_INT64] = div_i64,     [FLEXCOLL_UINT64] = div_u64,
  [FLEXCOLL_FLOAT16] = div_half, [FLEXCOLL_BFLOAT16] = div_bf16, [FLEXCOLL_FLOAT32] = div_f32,
  [FLEXCOLL_FLOAT64] = div_f64,
};

void fc_host_reduce(void *dst, const void *a, const void *b, size_t count, flexcoll_datatype_t dtype,
                    flexcoll_op_t op) {
  /* Invalid arguments are the caller's bug (the API validates them); do nothing rather than
   * index out of the tables.  The casts make negative enum values fail the test too. */
  if ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES || (unsigned)op >= FLEXCOLL_NUM_OPS || count == 0) return;
  reduce_fns[dtype][op == FLEXCOLL_AVG ? FLEXCOLL_SUM : op](dst, a, b, count);
}

void fc_host_divide(void *buf, size_t count, flexcoll_datatype_t dtype, int n) {
  /* n is a rank count, >= 1; dividing by 1 changes nothing, and n < 1 is a caller bug that
   * would otherwise trap (0) or mean nothing for the unsigned types (negative). */
  if ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES || n <= 1 || count == 0) return;
  divide_fns[dtype](buf, count, n);
}
