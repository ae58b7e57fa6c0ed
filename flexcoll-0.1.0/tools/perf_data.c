/* perf_data.c — flexcoll-perf's inputs and the expected results.
 * Input of rank r at index i: 1 + (3r + 7i) % 5.  Values in 1..5 keep sums, maxima and products
 * exact in every type (products wrap in integers the same way on both sides, and overflow to inf
 * in float16 only when the exact product does: inputs >= 1 make partial products monotonic). */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "perf.h"

static double input(int rank, size_t i) { return 1.0 + (double)((3 * (size_t)rank + 7 * i) % 5); }

static void store(void *buf, size_t i, flexcoll_datatype_t dt, double v, int64_t iv) {
  switch (dt) {
    case FLEXCOLL_INT8: ((int8_t *)buf)[i] = (int8_t)iv; break;
    case FLEXCOLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)iv; break;
    case FLEXCOLL_INT32: ((int32_t *)buf)[i] = (int32_t)iv; break;
    case FLEXCOLL_UINT32: ((uint32_t *)buf)[i] = (uint32_t)iv; break;
    case FLEXCOLL_INT64: ((int64_t *)buf)[i] = iv; break;
    case FLEXCOLL_UINT64: ((uint64_t *)buf)[i] = (uint64_t)iv; break;
    case FLEXCOLL_FLOAT16: ((uint16_t *)buf)[i] = fc_float_to_half((float)v); break;
    case FLEXCOLL_BFLOAT16: ((uint16_t *)buf)[i] = fc_float_to_bf16((float)v); break;
    case FLEXCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
  }
}

/* Integers come back as their value in the type, widened; floats as double. */
static double load(const void *buf, size_t i, flexcoll_datatype_t dt) {
  switch (dt) {
    case FLEXCOLL_INT8: return ((const int8_t *)buf)[i];
    case FLEXCOLL_UINT8: return ((const uint8_t *)buf)[i];
    case FLEXCOLL_INT32: return ((const int32_t *)buf)[i];
    case FLEXCOLL_UINT32: return ((const uint32_t *)buf)[i];
    case FLEXCOLL_INT64: return (double)((const int64_t *)buf)[i];
    case FLEXCOLL_UINT64: return (double)((const uint64_t *)buf)[i];
    case FLEXCOLL_FLOAT16: return fc_half_to_float(((const uint16_t *)buf)[i]);
    case FLEXCOLL_BFLOAT16: return fc_bf16_to_float(((const uint16_t *)buf)[i]);
    case FLEXCOLL_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
  }
}

void perf_fill_input(void *host, size_t count, flexcoll_datatype_t dt, int rank, size_t offset) {
  for (size_t i = 0; i < count; i++) {
    double v = input(rank, offset + i);
    store(host, i, dt, v, (int64_t)v);
  }
}

/* The reduction of index i over n ranks, as the type holds it. */
static double expected_reduced(size_t i, flexcoll_datatype_t dt, flexcoll_op_t op, int n) {
  int64_t acc = (int64_t)input(0, i);
  double facc = input(0, i);
  for (int r = 1; r < n; r++) {
    double v = input(r, i);
    switch (op) {
      case FLEXCOLL_PROD: acc = (int64_t)((uint64_t)acc * (uint64_t)(int64_t)v); facc *= v; break;
      case FLEXCOLL_MAX: acc = acc > (int64_t)v ? acc : (int64_t)v; facc = fmax(facc, v); break;
      case FLEXCOLL_MIN: acc = acc < (int64_t)v ? acc : (int64_t)v; facc = fmin(facc, v); break;
      default: acc += (int64_t)v; facc += v; break;
    }
  }
  unsigned char tmp[8];
  if (op == FLEXCOLL_AVG) {
    facc /= n;
    acc /= n;
  }
  store(tmp, 0, dt, facc, acc);
  return load(tmp, 0, dt);
}

static int differs(double got, double want, flexcoll_datatype_t dt) {
  if (!fc_dtype_is_float(dt)) return got != want;
  if (isinf(want)) return got != want;
  double tol = dt == FLEXCOLL_FLOAT16 ? 1e-2 : dt == FLEXCOLL_BFLOAT16 ? 2e-2 : dt == FLEXCOLL_FLOAT32 ? 1e-5 : 1e-12;
  return !(fabs(got - want) <= tol * fmax(1.0, fabs(want)));
}

size_t perf_count_wrong(int coll, const void *host, size_t count, flexcoll_datatype_t dt, flexcoll_op_t op, int rank,
                        int nranks, int root) {
  size_t wrong = 0;
  switch (coll) {
    case PERF_ALLGATHER:
      for (int r = 0; r < nranks; r++)
        for (size_t i = 0; i < count; i++) {
          unsigned char tmp[8];
          double v = input(r, i);
          store(tmp, 0, dt, v, (int64_t)v);
          wrong += differs(load(host, (size_t)r * count + i, dt), load(tmp, 0, dt), dt);
        }
      return wrong;
    case PERF_BROADCAST:
      for (size_t i = 0; i < count; i++) {
        unsigned char tmp[8];
        double v = input(root, i);
        store(tmp, 0, dt, v, (int64_t)v);
        wrong += differs(load(host, i, dt), load(tmp, 0, dt), dt);
      }
      return wrong;
    case PERF_REDUCE:
      if (rank != root) return 0;
      /* fall through */
    case PERF_ALLREDUCE:
      for (size_t i = 0; i < count; i++) wrong += differs(load(host, i, dt), expected_reduced(i, dt, op, nranks), dt);
      return wrong;
    case PERF_ALLTOALL: /* block r came from rank r's block for this rank */
      for (int r = 0; r < nranks; r++)
        for (size_t i = 0; i < count; i++) {
          unsigned char tmp[8];
          double v = input(r, (size_t)rank * count + i);
          store(tmp, 0, dt, v, (int64_t)v);
          wrong += differs(load(host, (size_t)r * count + i, dt), load(tmp, 0, dt), dt);
        }
      return wrong;
    default: /* reduce_scatter: this rank's block of the reduction */
      for (size_t i = 0; i < count; i++)
        wrong += differs(load(host, i, dt), expected_reduced((size_t)rank * count + i, dt, op, nranks), dt);
      return wrong;
  }
}
