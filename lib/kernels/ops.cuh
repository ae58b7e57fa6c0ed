/* ops.cuh — element types, reduction operators and (datatype, op) dispatch shared by the CUDA
 * kernels (reduce.cu, oneshot.cu).  Private to lib/kernels; CUDA C++ only.
 *
 * The arithmetic must equal lib/host/reduce.c bit for bit:
 *  - integer SUM/PROD run on the unsigned type of the same width (wrap-around, no signed UB);
 *  - float16/bfloat16 widen to float, operate once in float, round to nearest even;
 *  - MAX/MIN pick an operand the way reduce.c's fc_fmaxf_ does (x when it wins or y is NaN),
 *    so NaN payloads and the sign of zero come out as on the host;
 *  - float32 arithmetic and comparisons are inline PTX without .ftz, so a build with
 *    -ftz=true or --use_fast_math cannot flush subnormals or approximate the division
 *    (the intrinsics __fadd_rn etc. do get .ftz under -ftz=true).
 * The one difference left is the payload of a NaN *produced* by float32/float64 SUM/PROD/
 * division: the GPU gives the canonical 0x7fffffff (x86 quiets an input NaN or gives
 * 0xffc00000, and which input depends on GCC's operand order).  All GPUs agree with each other.
 */
#ifndef FC_KERNELS_OPS_CUH
#define FC_KERNELS_OPS_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

#include "dtype.h"
#include "kernels/kernels.h"

/* float16 / bfloat16 elements, kept as their bit patterns: a trivially copyable 2-byte struct
 * that can live in a 16-byte vector union, distinct types so overloads pick the conversion. */
struct fc_f16 { uint16_t u; };
struct fc_bf16 { uint16_t u; };

/* ---- float32 arithmetic without .ftz (see the header comment) ---- */
static __device__ __forceinline__ float fc_fadd(float x, float y) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
}
static __device__ __forceinline__ float fc_fmul(float x, float y) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
}
static __device__ __forceinline__ float fc_fdiv(float x, float y) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
}
/* x > y and x < y, false when either is NaN (setp without .ftz: subnormals compare as such). */
static __device__ __forceinline__ bool fc_fgt(float x, float y) {
  unsigned r;
  asm("{ .reg .pred p; setp.gt.f32 p, %1, %2; selp.u32 %0, 1, 0, p; }" : "=r"(r) : "f"(x), "f"(y));
  return r != 0;
}
static __device__ __forceinline__ bool fc_flt(float x, float y) { return fc_fgt(y, x); }
static __device__ __forceinline__ bool fc_fnan(float x) { return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }

/* ---- float16 / bfloat16 conversions: CUDA's, which lib/dtype.h reproduces on the host ---- */
static __device__ __forceinline__ float fc_widen(fc_f16 x) { return __half2float(__ushort_as_half(x.u)); }
static __device__ __forceinline__ float fc_widen(fc_bf16 x) { return __bfloat162float(__ushort_as_bfloat16(x.u)); }
template <typename H> static __device__ __forceinline__ H fc_narrow(float f);
template <> __device__ __forceinline__ fc_f16 fc_narrow<fc_f16>(float f) { return {__half_as_ushort(__float2half_rn(f))}; }
template <> __device__ __forceinline__ fc_bf16 fc_narrow<fc_bf16>(float f) {
  return {__bfloat16_as_ushort(__float2bfloat16_rn(f))};
}

/* ---- elementwise operations: generic (integers, double), then float, then 16-bit floats ---- */
template <typename T> static __device__ __forceinline__ T fc_add(T x, T y) { return (T)(x + y); }
template <typename T> static __device__ __forceinline__ T fc_mul(T x, T y) { return (T)(x * y); }
/* Integers: plain comparisons.  double: the same selection as reduce.c's fc_fmax_. */
template <typename T> static __device__ __forceinline__ T fc_max(T x, T y) { return x > y ? x : y; }
template <typename T> static __device__ __forceinline__ T fc_min(T x, T y) { return x < y ? x : y; }
template <> __device__ __forceinline__ double fc_max<double>(double x, double y) { return (x > y) | (y != y) ? x : y; }
template <> __device__ __forceinline__ double fc_min<double>(double x, double y) { return (x < y) | (y != y) ? x : y; }

template <> __device__ __forceinline__ float fc_add<float>(float x, float y) { return fc_fadd(x, y); }
template <> __device__ __forceinline__ float fc_mul<float>(float x, float y) { return fc_fmul(x, y); }
template <> __device__ __forceinline__ float fc_max<float>(float x, float y) { return fc_fgt(x, y) | fc_fnan(y) ? x : y; }
template <> __device__ __forceinline__ float fc_min<float>(float x, float y) { return fc_flt(x, y) | fc_fnan(y) ? x : y; }

/* 16-bit floats: one float operation, rounded once.  MAX/MIN round the winner back, which
 * reproduces it exactly unless it is a NaN, which becomes 0x7fff like on the host. */
#define FC_DEFINE_H16_OPS(H)                                                                         \
  template <> __device__ __forceinline__ H fc_add<H>(H x, H y) { return fc_narrow<H>(fc_fadd(fc_widen(x), fc_widen(y))); } \
  template <> __device__ __forceinline__ H fc_mul<H>(H x, H y) { return fc_narrow<H>(fc_fmul(fc_widen(x), fc_widen(y))); } \
  template <> __device__ __forceinline__ H fc_max<H>(H x, H y) { return fc_narrow<H>(fc_max(fc_widen(x), fc_widen(y))); } \
  template <> __device__ __forceinline__ H fc_min<H>(H x, H y) { return fc_narrow<H>(fc_min(fc_widen(x), fc_widen(y))); }
FC_DEFINE_H16_OPS(fc_f16)
FC_DEFINE_H16_OPS(fc_bf16)
#undef FC_DEFINE_H16_OPS

/* Operator functors: the kernels are templates over one of these. */
struct fc_op_sum { template <typename T> static __device__ __forceinline__ T apply(T x, T y) { return fc_add(x, y); } };
struct fc_op_prod { template <typename T> static __device__ __forceinline__ T apply(T x, T y) { return fc_mul(x, y); } };
struct fc_op_max { template <typename T> static __device__ __forceinline__ T apply(T x, T y) { return fc_max(x, y); } };
struct fc_op_min { template <typename T> static __device__ __forceinline__ T apply(T x, T y) { return fc_min(x, y); } };

/* ---- AVG's division, as reduce.c's FC_DEFINE_DIVIDE: in the type itself (integers truncate
 * toward zero), 16-bit floats through float.  The divisor is converted once per thread. ---- */
template <typename T> struct fc_divisor { typedef T type; };
template <> struct fc_divisor<fc_f16> { typedef float type; };
template <> struct fc_divisor<fc_bf16> { typedef float type; };
template <typename T> static __device__ __forceinline__ T fc_div(T x, T dn) { return (T)(x / dn); }
template <> __device__ __forceinline__ float fc_div<float>(float x, float dn) { return fc_fdiv(x, dn); }
static __device__ __forceinline__ fc_f16 fc_div(fc_f16 x, float dn) { return fc_narrow<fc_f16>(fc_fdiv(fc_widen(x), dn)); }
static __device__ __forceinline__ fc_bf16 fc_div(fc_bf16 x, float dn) { return fc_narrow<fc_bf16>(fc_fdiv(fc_widen(x), dn)); }

/* ---- 16-byte vectors of elements ---- */
template <typename T> union fc_vec {
  enum { N = 16 / sizeof(T) };
  uint4 raw;
  T e[N];
};

template <typename T, class Op>
static __device__ __forceinline__ fc_vec<T> fc_vec_apply(const fc_vec<T> &x, const fc_vec<T> &y) {
  fc_vec<T> r;
#pragma unroll
  for (int k = 0; k < fc_vec<T>::N; k++) r.e[k] = Op::apply(x.e[k], y.e[k]);
  return r;
}

/* Loads that go to L2 (ld.global.cg): for data a peer wrote over NVLink, so that no line an
 * earlier kernel left in this SM's L1 can be read.  Element loads use the same-size unsigned. */
template <int BYTES> struct fc_bits;
template <> struct fc_bits<1> { typedef unsigned char type; };
template <> struct fc_bits<2> { typedef unsigned short type; };
template <> struct fc_bits<4> { typedef unsigned int type; };
template <> struct fc_bits<8> { typedef unsigned long long type; };
template <> struct fc_bits<16> { typedef uint4 type; };

/* CV: loads of host memory that another GPU (or this one's other kernel) writes: .cv fetches
 * again at every load, so no line of an earlier message kept in a cache is read back. */
template <typename B, bool CV> static __device__ __forceinline__ B fc_ld_bits(const B *p) {
  return CV ? __ldcv(p) : __ldcg(p);
}
template <typename T, bool CV = false> static __device__ __forceinline__ T fc_ld(const void *p) {
  typedef typename fc_bits<sizeof(T)>::type B;
  const B b = fc_ld_bits<B, CV>((const B *)p);
  T t;
  memcpy(&t, &b, sizeof t);
  return t;
}
template <typename T, bool CV = false> static __device__ __forceinline__ fc_vec<T> fc_vec_ld(const void *p) {
  fc_vec<T> v;
  v.raw = fc_ld_bits<uint4, CV>((const uint4 *)p);
  return v;
}
template <typename T> static __device__ __forceinline__ T fc_ld_cg(const void *p) { return fc_ld<T, false>(p); }
template <typename T> static __device__ __forceinline__ fc_vec<T> fc_vec_ld_cg(const void *p) { return fc_vec_ld<T, false>(p); }

/* ---- (datatype, op) dispatch ----
 * Calls f.template run<V, D, Op>() where V is the type the operator runs on (the unsigned type
 * for integer SUM/PROD/AVG, which wrap) and D the datatype's own type (for AVG's division and
 * fc_kernel_divide).  AVG dispatches as SUM; the caller adds the division.  Returns
 * cudaErrorInvalidValue for an invalid datatype or op. */
template <typename D, class F> static int fc_dispatch_op(flexcoll_op_t op, F &f) {
  typedef typename fc_bits<sizeof(D)>::type U; /* integers: the unsigned type of D's width */
  typedef typename std::conditional<std::is_integral<D>::value, U, D>::type W;
  switch (op) {
    case FLEXCOLL_SUM:
    case FLEXCOLL_AVG: return f.template run<W, D, fc_op_sum>();
    case FLEXCOLL_PROD: return f.template run<W, D, fc_op_prod>();
    case FLEXCOLL_MAX: return f.template run<D, D, fc_op_max>();
    case FLEXCOLL_MIN: return f.template run<D, D, fc_op_min>();
    default: return (int)cudaErrorInvalidValue;
  }
}

template <class F> static int fc_dispatch(flexcoll_datatype_t dtype, flexcoll_op_t op, F &f) {
  switch (dtype) {
    case FLEXCOLL_INT8: return fc_dispatch_op<int8_t>(op, f);
    case FLEXCOLL_UINT8: return fc_dispatch_op<uint8_t>(op, f);
    case FLEXCOLL_INT32: return fc_dispatch_op<int32_t>(op, f);
    case FLEXCOLL_UINT32: return fc_dispatch_op<uint32_t>(op, f);
    case FLEXCOLL_INT64: return fc_dispatch_op<int64_t>(op, f);
    case FLEXCOLL_UINT64: return fc_dispatch_op<uint64_t>(op, f);
    case FLEXCOLL_FLOAT16: return fc_dispatch_op<fc_f16>(op, f);
    case FLEXCOLL_BFLOAT16: return fc_dispatch_op<fc_bf16>(op, f);
    case FLEXCOLL_FLOAT32: return fc_dispatch_op<float>(op, f);
    case FLEXCOLL_FLOAT64: return fc_dispatch_op<double>(op, f);
    default: return (int)cudaErrorInvalidValue;
  }
}

/* f.run for every (datatype, op) pair; the first error, or 0 (the kernels' preloading). */
template <class F> static int fc_dispatch_all(F &f) {
  for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt++)
    for (int op = 0; op < FLEXCOLL_NUM_OPS; op++) {
      const int e = fc_dispatch((flexcoll_datatype_t)dt, (flexcoll_op_t)op, f);
      if (e) return e;
    }
  return 0;
}

#endif /* FC_KERNELS_OPS_CUH */
