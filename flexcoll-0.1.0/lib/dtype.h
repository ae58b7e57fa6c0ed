/* dtype.h — datatype and reduction-operator helpers shared by the host executor (C11) and the
 * CUDA kernels (CUDA C++): element sizes, names, and IEEE float16/bfloat16 conversions.
 *
 * Header-only (static inline) so that both compilers inline the conversions into their
 * reduction loops.  Functions marked FC_HOST_DEVICE are usable in device code; the name
 * parsers are host-only.
 *
 * The conversions are bit-exact with CUDA's __half2float / __float2half_rn /
 * __bfloat162float / __float2bfloat16_rn, NaN included: every NaN becomes the canonical
 * NaN that CUDA produces (float16/bfloat16 0x7fff; float16 -> float 0x7fffffff), so that a
 * host-reduced and a device-reduced buffer agree bit for bit.  bfloat16 -> float keeps the
 * NaN payload, as CUDA's does (it is a plain shift).  Checked for all 2^32 floats and all
 * 65536 patterns against the CUDA intrinsics on an H200 (device code, with and without
 * -ftz=true) and against x86 F16C on the host.
 *
 * The float16 conversions are branch-free so that GCC vectorises the float16 reduction loops.
 * They use one float addition for subnormal results ("magic number" alignment), which is exact
 * under the default round-to-nearest mode whatever FTZ/DAZ say (its operands and results are
 * normal floats, or a float subnormal input that rounds to float16 zero either way); they
 * assume the rounding mode has not been changed with fesetround and SSE (not x87) arithmetic.
 */
#ifndef FC_DTYPE_H
#define FC_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#ifndef __CUDA_ARCH__
#include <string.h> /* memcpy for the host's float <-> bits casts */
#endif

#include "flexcoll.h"

#ifdef __CUDACC__
#define FC_HOST_DEVICE __host__ __device__
#else
#define FC_HOST_DEVICE
#endif

/* Bytes per element; 0 for an invalid datatype. */
static inline FC_HOST_DEVICE size_t fc_dtype_size(flexcoll_datatype_t dtype) {
  switch (dtype) {
    case FLEXCOLL_INT8:
    case FLEXCOLL_UINT8: return 1;
    case FLEXCOLL_FLOAT16:
    case FLEXCOLL_BFLOAT16: return 2;
    case FLEXCOLL_INT32:
    case FLEXCOLL_UINT32:
    case FLEXCOLL_FLOAT32: return 4;
    case FLEXCOLL_INT64:
    case FLEXCOLL_UINT64:
    case FLEXCOLL_FLOAT64: return 8;
    default: return 0;
  }
}

/* 1 for the floating-point datatypes (float16, bfloat16, float32, float64), else 0. */
static inline FC_HOST_DEVICE int fc_dtype_is_float(flexcoll_datatype_t dtype) {
  return dtype == FLEXCOLL_FLOAT16 || dtype == FLEXCOLL_BFLOAT16 || dtype == FLEXCOLL_FLOAT32 ||
         dtype == FLEXCOLL_FLOAT64;
}

/* A constant name ("int8" ... "float64"); "invalid" for anything else. */
static inline const char *fc_dtype_name(flexcoll_datatype_t dtype) {
  switch (dtype) {
    case FLEXCOLL_INT8: return "int8";
    case FLEXCOLL_UINT8: return "uint8";
    case FLEXCOLL_INT32: return "int32";
    case FLEXCOLL_UINT32: return "uint32";
    case FLEXCOLL_INT64: return "int64";
    case FLEXCOLL_UINT64: return "uint64";
    case FLEXCOLL_FLOAT16: return "float16";
    case FLEXCOLL_BFLOAT16: return "bfloat16";
    case FLEXCOLL_FLOAT32: return "float32";
    case FLEXCOLL_FLOAT64: return "float64";
    default: return "invalid";
  }
}

/* A constant name ("sum", "prod", "max", "min", "avg"); "invalid" for anything else. */
static inline const char *fc_op_name(flexcoll_op_t op) {
  switch (op) {
    case FLEXCOLL_SUM: return "sum";
    case FLEXCOLL_PROD: return "prod";
    case FLEXCOLL_MAX: return "max";
    case FLEXCOLL_MIN: return "min";
    case FLEXCOLL_AVG: return "avg";
    default: return "invalid";
  }
}

/* ASCII case-insensitive equality; our own so that no locale or POSIX header is needed. */
static inline int fc_name_eq_(const char *s, const char *lower) {
  for (; *s && *lower; s++, lower++) {
    char c = (*s >= 'A' && *s <= 'Z') ? (char)(*s - 'A' + 'a') : *s;
    if (c != *lower) return 0;
  }
  return *s == *lower;
}

/* Parse a datatype name (case-insensitive; the canonical names and the usual aliases:
 * char, half, fp16, f16, bf16, float, fp32, double, int, uint, i32, u64, ...); -1 unknown. */
static inline int fc_dtype_from_name(const char *name) {
  static const struct {
    const char *name;
    int dtype;
  } names[] = {
    {"int8", FLEXCOLL_INT8},         {"i8", FLEXCOLL_INT8},           {"char", FLEXCOLL_INT8},
    {"uint8", FLEXCOLL_UINT8},       {"u8", FLEXCOLL_UINT8},          {"byte", FLEXCOLL_UINT8},
    {"int32", FLEXCOLL_INT32},       {"i32", FLEXCOLL_INT32},         {"int", FLEXCOLL_INT32},
    {"uint32", FLEXCOLL_UINT32},     {"u32", FLEXCOLL_UINT32},        {"uint", FLEXCOLL_UINT32},
    {"int64", FLEXCOLL_INT64},       {"i64", FLEXCOLL_INT64},         {"long", FLEXCOLL_INT64},
    {"uint64", FLEXCOLL_UINT64},     {"u64", FLEXCOLL_UINT64},        {"ulong", FLEXCOLL_UINT64},
    {"float16", FLEXCOLL_FLOAT16},   {"f16", FLEXCOLL_FLOAT16},       {"fp16", FLEXCOLL_FLOAT16},
    {"half", FLEXCOLL_FLOAT16},      {"bfloat16", FLEXCOLL_BFLOAT16}, {"bf16", FLEXCOLL_BFLOAT16},
    {"float32", FLEXCOLL_FLOAT32},   {"f32", FLEXCOLL_FLOAT32},       {"fp32", FLEXCOLL_FLOAT32},
    {"float", FLEXCOLL_FLOAT32},     {"float64", FLEXCOLL_FLOAT64},   {"f64", FLEXCOLL_FLOAT64},
    {"fp64", FLEXCOLL_FLOAT64},      {"double", FLEXCOLL_FLOAT64},
  };
  if (!name) return -1;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (fc_name_eq_(name, names[i].name)) return names[i].dtype;
  return -1;
}

/* Parse an operator name (case-insensitive: sum, prod, max, min, avg and the aliases product,
 * average, mean); -1 unknown. */
static inline int fc_op_from_name(const char *name) {
  static const struct {
    const char *name;
    int op;
  } names[] = {
    {"sum", FLEXCOLL_SUM}, {"prod", FLEXCOLL_PROD},    {"product", FLEXCOLL_PROD},
    {"max", FLEXCOLL_MAX}, {"min", FLEXCOLL_MIN},      {"avg", FLEXCOLL_AVG},
    {"mean", FLEXCOLL_AVG}, {"average", FLEXCOLL_AVG},
  };
  if (!name) return -1;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (fc_name_eq_(name, names[i].name)) return names[i].op;
  return -1;
}

/* float <-> bits without aliasing violations (memcpy folds to a register move). */
static inline FC_HOST_DEVICE uint32_t fc_float_bits_(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

static inline FC_HOST_DEVICE float fc_bits_float_(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/* float16 -> float, exact.  Branch-free: every case is computed and the right one selected. */
static inline FC_HOST_DEVICE float fc_half_to_float(uint16_t h) {
  const uint32_t em = ((uint32_t)h & 0x7fffu) << 13; /* exponent and mantissa, float-aligned */
  const uint32_t exp = em & 0x0f800000u;
  const uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  /* Normal: rebias the exponent from 15 to 127. */
  const uint32_t normal = em + ((127u - 15u) << 23);
  /* Subnormal and zero: read the mantissa as 1.m * 2^-14 and subtract 2^-14, leaving
   * m * 2^-24 exactly (both operands and the result are normal floats). */
  const uint32_t sub = fc_float_bits_(fc_bits_float_(em + (113u << 23)) - fc_bits_float_(113u << 23));
  /* Select sub with a mask, not ?:, so the float subtraction stays unconditional: GCC will
   * not if-convert a branch holding an FP operation (it may trap), which stops vectorising. */
  const uint32_t is_sub = 0u - (uint32_t)(exp == 0);
  const uint32_t r = (sub & is_sub) | ((exp == 0x0f800000u ? 0x7f800000u : normal) & ~is_sub);
  /* Inf keeps its sign; NaN becomes CUDA's canonical 0x7fffffff. */
  return fc_bits_float_(exp == 0x0f800000u && em != 0x0f800000u ? 0x7fffffffu : (r | sign));
}

/* float -> float16, rounding to nearest even; overflow goes to inf, NaN to 0x7fff. */
static inline FC_HOST_DEVICE uint16_t fc_float_to_half(float f) {
  const uint32_t u = fc_float_bits_(f);
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t sign = (u >> 16) & 0x8000u;
  /* Normal result (a >= 2^-14): rebias, then add 0xfff plus the kept mantissa's lowest bit so
   * the truncating shift rounds to nearest even; a carry out of the mantissa correctly bumps
   * the exponent (up to inf for values >= 65520). */
  const uint32_t normal = (a - ((127u - 15u) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  /* Subnormal result (a < 2^-14): adding 0.5 puts the float16 subnormal grid (2^-24) at the
   * float's last mantissa bit, so the FPU's round-to-nearest-even does the rounding. */
  const uint32_t sub = fc_float_bits_(fc_bits_float_(a) + 0.5f) - (126u << 23);
  /* Mask select for sub: see fc_half_to_float.  a >= 65536 (or inf) overflows to inf. */
  const uint32_t is_sub = 0u - (uint32_t)(a < (113u << 23));
  const uint32_t r = (sub & is_sub) | ((a >= (143u << 23) ? 0x7c00u : normal) & ~is_sub);
  return (uint16_t)(a > 0x7f800000u ? 0x7fffu : (r | sign));
}

/* bfloat16 -> float, exact (bfloat16 is the top half of a float). */
static inline FC_HOST_DEVICE float fc_bf16_to_float(uint16_t h) {
  return fc_bits_float_((uint32_t)h << 16);
}

/* float -> bfloat16, rounding to nearest even; overflow goes to inf, NaN to 0x7fff. */
static inline FC_HOST_DEVICE uint16_t fc_float_to_bf16(float f) {
  const uint32_t u = fc_float_bits_(f);
  /* 0x7fff plus the kept lowest bit: the truncating shift then rounds to nearest even.  No
   * wrap-around: only NaNs are above 0xff800000 and they are replaced. */
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : r);
}

#endif /* FC_DTYPE_H */
