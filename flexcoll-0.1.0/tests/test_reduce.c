/* test_reduce.c — host reductions (lib/host/reduce.c) and datatype helpers (lib/dtype.h).
 *
 * Every datatype x operator on fresh random data against a reference computed independently
 * here: integers exactly in 64-bit arithmetic; floating point in long double with a relative
 * tolerance, plus exactly against the specified rounding (float16/bfloat16: operate in float,
 * round to nearest even).  float16/bfloat16 values are decoded and rounded by this file's own
 * table-based code, never by the conversions under test.
 *
 * The seed comes from the clock (or FC_TEST_SEED) and is printed with every failure. */
#define _POSIX_C_SOURCE 200809L /* getpid under -std=c11 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "host/host.h"

static unsigned long long g_seed;

/* ck_assert records a checkpoint (a write to the runner) even when it passes: too slow for
 * per-element checks, so those assert only on failure. */
#define EXPECT(cond, ...)                    \
  do {                                       \
    if (!(cond)) ck_abort_msg(__VA_ARGS__);  \
  } while (0)

/* ---- random numbers: splitmix64, one stream per test so a seed replays every test ---- */

typedef struct {
  uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static rng_t rng_for(int test, int iter) {
  rng_t r = {g_seed * 1000003ull + (uint64_t)test * 977ull + (uint64_t)iter};
  rng_next(&r);
  return r;
}

/* ---- independent float16/bfloat16 reference: decode by fields, round by table search ---- */

typedef struct {
  int mbits;        /* mantissa bits */
  unsigned maxfin;  /* largest finite positive pattern; maxfin + 1 is +inf */
} fmt16_t;

static const fmt16_t FMT_HALF = {10, 0x7bffu}, FMT_BF16 = {7, 0x7f7fu};

static double ref_decode16(unsigned h, fmt16_t f) {
  const int ebits = 15 - f.mbits, bias = (1 << (ebits - 1)) - 1;
  const unsigned e = (h >> f.mbits) & ((1u << ebits) - 1), m = h & ((1u << f.mbits) - 1);
  double v;
  if (e == 0) v = ldexp((double)m, 1 - bias - f.mbits);
  else if (e == (1u << ebits) - 1) v = m ? NAN : INFINITY;
  else v = ldexp((double)(m + (1u << f.mbits)), (int)e - bias - f.mbits);
  return (h & 0x8000u) ? -v : v;
}

/* Values of the positive finite patterns, ascending with the pattern. */
static const double *table16(fmt16_t f) {
  static double tab[2][0x8000];
  static int built[2];
  const int k = f.mbits == 10 ? 0 : 1;
  if (!built[k]) {
    for (unsigned h = 0; h <= f.maxfin; h++) tab[k][h] = ref_decode16(h, f);
    built[k] = 1;
  }
  return tab[k];
}

/* x rounded to nearest even; beyond the largest finite value rounds to inf; NaN -> 0x7fff. */
static unsigned ref_round16(double x, fmt16_t f) {
  if (isnan(x)) return 0x7fffu;
  const unsigned sign = signbit(x) ? 0x8000u : 0u;
  const double *t = table16(f);
  const double vmax = t[f.maxfin], next = 2 * vmax - t[f.maxfin - 1]; /* virtual next value */
  x = fabs(x);
  if (x >= next) return sign | (f.maxfin + 1);
  unsigned lo = f.maxfin;
  if (x < vmax) { /* largest lo with t[lo] <= x */
    unsigned l = 0, h = f.maxfin;
    while (h - l > 1) {
      const unsigned mid = (l + h) / 2;
      if (t[mid] <= x) l = mid;
      else h = mid;
    }
    lo = l;
  }
  if (x == t[lo]) return sign | lo;
  const double mid = (t[lo] + (lo == f.maxfin ? next : t[lo + 1])) / 2; /* exact in double */
  const unsigned r = x < mid ? lo : x > mid ? lo + 1 : (lo & 1u) ? lo + 1 : lo;
  return sign | r;
}

/* ---- element access: raw bits (zero-extended) and values ---- */

static int is16(flexcoll_datatype_t dt) { return dt == FLEXCOLL_FLOAT16 || dt == FLEXCOLL_BFLOAT16; }
static fmt16_t fmt_of(flexcoll_datatype_t dt) { return dt == FLEXCOLL_FLOAT16 ? FMT_HALF : FMT_BF16; }
static int is_signed_int(flexcoll_datatype_t dt) {
  return dt == FLEXCOLL_INT8 || dt == FLEXCOLL_INT32 || dt == FLEXCOLL_INT64;
}

static uint64_t get_raw(const void *buf, size_t i, size_t size) {
  uint64_t v = 0; /* little-endian: the low bytes */
  memcpy(&v, (const char *)buf + i * size, size);
  return v;
}

static void set_raw(void *buf, size_t i, size_t size, uint64_t v) {
  memcpy((char *)buf + i * size, &v, size);
}

static uint64_t width_mask(size_t size) { return size == 8 ? ~0ull : (1ull << (8 * size)) - 1; }

static int64_t as_signed(uint64_t raw, size_t size) {
  const unsigned shift = 64u - 8u * (unsigned)size;
  return (int64_t)(raw << shift) >> shift; /* arithmetic shift: GCC's documented behaviour */
}

static double as_double(uint64_t raw, flexcoll_datatype_t dt) {
  if (is16(dt)) { /* the table is ref_decode16, faster */
    const fmt16_t f = fmt_of(dt);
    const unsigned mag = (unsigned)raw & 0x7fffu;
    if (mag > f.maxfin) return ref_decode16((unsigned)raw, f);
    return (raw & 0x8000u) ? -table16(f)[mag] : table16(f)[mag];
  }
  if (dt == FLEXCOLL_FLOAT32) {
    float f;
    uint32_t u = (uint32_t)raw;
    memcpy(&f, &u, 4);
    return f;
  }
  double d;
  memcpy(&d, &raw, 8);
  return d;
}

static uint64_t f32_raw(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static uint64_t f64_raw(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}

/* Encode v (exactly representable, or rounded to nearest even) as dt. */
static uint64_t encode(double v, flexcoll_datatype_t dt) {
  if (is16(dt)) return ref_round16(v, fmt_of(dt));
  if (dt == FLEXCOLL_FLOAT32) return f32_raw((float)v);
  if (dt == FLEXCOLL_FLOAT64) return f64_raw(v);
  return (uint64_t)(int64_t)v & width_mask(fc_dtype_size(dt));
}

/* Random element: integers any bits; floats alternate any finite pattern (all exponents,
 * subnormals, zeros) and moderate values in (-16, 16). */
static uint64_t random_elem(rng_t *r, flexcoll_datatype_t dt, size_t i) {
  const size_t size = fc_dtype_size(dt);
  if (!fc_dtype_is_float(dt)) return rng_next(r) & width_mask(size);
  if (i & 1) {
    const double v = ldexp((double)(rng_next(r) >> 11), -53) * 32.0 - 16.0;
    return encode(v, dt);
  }
  for (;;) {
    const uint64_t raw = rng_next(r) & width_mask(size);
    if (isfinite(as_double(raw, dt))) return raw;
  }
}

/* ---- reduction reference ---- */

static uint64_t expect_int(uint64_t a, uint64_t b, flexcoll_datatype_t dt, flexcoll_op_t op) {
  const size_t size = fc_dtype_size(dt);
  const int a_wins = is_signed_int(dt) ? as_signed(a, size) > as_signed(b, size) : a > b;
  switch (op) {
    case FLEXCOLL_PROD: return (a * b) & width_mask(size);
    case FLEXCOLL_MAX: return a_wins ? a : b;
    case FLEXCOLL_MIN: return a_wins ? b : a;
    default: return (a + b) & width_mask(size); /* SUM, AVG */
  }
}

/* Expected bits of a op b, as specified (float16/bfloat16: in float, then rounded); *ref gets
 * the long double value to check the tolerance against. */
static uint64_t expect_float(uint64_t a, uint64_t b, flexcoll_datatype_t dt, flexcoll_op_t op,
                             long double *ref) {
  const double fa = as_double(a, dt), fb = as_double(b, dt);
  double v; /* the result in dt's working precision (float for 16-bit types and float32) */
  switch (op) {
    case FLEXCOLL_PROD:
      *ref = (long double)fa * fb;
      v = dt == FLEXCOLL_FLOAT64 ? fa * fb : (double)((float)fa * (float)fb);
      break;
    case FLEXCOLL_MAX: *ref = v = fmax(fa, fb); break;
    case FLEXCOLL_MIN: *ref = v = fmin(fa, fb); break;
    default:
      *ref = (long double)fa + fb;
      v = dt == FLEXCOLL_FLOAT64 ? fa + fb : (double)((float)fa + (float)fb);
      break;
  }
  return encode(v, dt);
}

/* Tolerance check against the long double reference, where the result is a normal number. */
static int within_tolerance(double got, long double ref, flexcoll_datatype_t dt) {
  static const double tol[] = {[FLEXCOLL_FLOAT16] = 1e-3, [FLEXCOLL_BFLOAT16] = 1e-2,
                               [FLEXCOLL_FLOAT32] = 1e-6, [FLEXCOLL_FLOAT64] = 1e-15};
  double lo, hi; /* normal range of dt */
  if (is16(dt)) {
    lo = ref_decode16(1u << fmt_of(dt).mbits, fmt_of(dt));
    hi = ref_decode16(fmt_of(dt).maxfin, fmt_of(dt));
  } else if (dt == FLEXCOLL_FLOAT32) {
    lo = FLT_MIN, hi = FLT_MAX;
  } else {
    lo = DBL_MIN, hi = DBL_MAX;
  }
  const long double mag = fabsl(ref);
  if (mag < lo || mag > hi) return 1;
  return fabsl((long double)got - ref) <= tol[dt] * mag;
}

/* Check d[i] == a[i] op b[i] for i < count; on failure describe the first bad element. */
static int check_reduce(const void *a, const void *b, const void *d, size_t count, flexcoll_datatype_t dt,
                        flexcoll_op_t op, char *msg, size_t msglen) {
  const size_t size = fc_dtype_size(dt);
  for (size_t i = 0; i < count; i++) {
    const uint64_t ra = get_raw(a, i, size), rb = get_raw(b, i, size), got = get_raw(d, i, size);
    uint64_t want;
    int ok;
    if (!fc_dtype_is_float(dt)) {
      want = expect_int(ra, rb, dt, op);
      ok = got == want;
    } else {
      long double ref;
      want = expect_float(ra, rb, dt, op, &ref);
      const double g = as_double(got, dt);
      /* max/min: exact value (either zero for max(+0, -0)); others: exact bits */
      ok = (op == FLEXCOLL_MAX || op == FLEXCOLL_MIN) ? g == as_double(want, dt) : got == want;
      ok = ok && within_tolerance(g, ref, dt);
    }
    if (!ok) {
      snprintf(msg, msglen, "%s %s count %zu: [%zu] a=0x%llx b=0x%llx got 0x%llx want 0x%llx (seed %llu)",
               fc_dtype_name(dt), fc_op_name(op), count, i, (unsigned long long)ra, (unsigned long long)rb,
               (unsigned long long)got, (unsigned long long)want, g_seed);
      return 0;
    }
  }
  return 1;
}

/* ---- fc_host_reduce ---- */

enum { MODE_SEPARATE, MODE_DST_A, MODE_DST_B, MODE_DST_A_B, NUM_MODES };
static const char *const mode_names[] = {"dst separate", "dst == a", "dst == b", "dst == a == b"};
static const size_t counts[] = {0, 1, 7, 64, 65, 1000003};

/* Run one (op, mode) on a and b (count elements each) through d, which has count + 1 elements:
 * the last one is a guard that must stay untouched. */
static void run_reduce_case(const void *a, const void *b, void *d, size_t count, flexcoll_datatype_t dt,
                            flexcoll_op_t op, int mode) {
  const size_t size = fc_dtype_size(dt);
  const void *x = a, *y = b;
  memset(d, 0xa5, (count + 1) * size);
  switch (mode) {
    case MODE_DST_A: memcpy(d, a, count * size); x = d; break;
    case MODE_DST_B: memcpy(d, b, count * size); y = d; break;
    case MODE_DST_A_B: memcpy(d, a, count * size); x = y = d; break;
    default: break;
  }
  fc_host_reduce(d, x, y, count, dt, op);
  char msg[512];
  const int ok = check_reduce(a, mode == MODE_DST_A_B ? a : b, d, count, dt, op, msg, sizeof msg);
  ck_assert_msg(ok, "%s: %s", mode_names[mode], msg);
  unsigned char guard[8];
  memset(guard, 0xa5, sizeof guard);
  ck_assert_msg(memcmp((char *)d + count * size, guard, size) == 0, "%s %s %s count %zu: wrote past the end (seed %llu)",
                fc_dtype_name(dt), fc_op_name(op), mode_names[mode], count, g_seed);
}

START_TEST(test_reduce_all_ops) {
  const flexcoll_datatype_t dt = (flexcoll_datatype_t)_i;
  const size_t size = fc_dtype_size(dt);
  rng_t r = rng_for(1, _i);
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    const size_t count = counts[c];
    /* One element of offset on a and d so that the three pointers differ in alignment. */
    char *abuf = malloc((count + 2) * size), *bbuf = malloc((count + 2) * size), *dbuf = malloc((count + 2) * size);
    ck_assert(abuf && bbuf && dbuf);
    void *a = abuf + size, *b = bbuf, *d = dbuf + size;
    for (size_t i = 0; i < count; i++) {
      set_raw(a, i, size, random_elem(&r, dt, i));
      set_raw(b, i, size, random_elem(&r, dt, i));
    }
    for (int op = 0; op < FLEXCOLL_NUM_OPS; op++)
      for (int mode = 0; mode < NUM_MODES; mode++) run_reduce_case(a, b, d, count, dt, (flexcoll_op_t)op, mode);
    free(abuf);
    free(bbuf);
    free(dbuf);
  }
  fc_host_reduce(NULL, NULL, NULL, 0, dt, FLEXCOLL_SUM); /* count 0 touches nothing */
}
END_TEST

/* NaN and infinity: MAX/MIN ignore a NaN against a number (IEEE fmax/fmin); NaN results of
 * float16/bfloat16 are 0x7fff. */
START_TEST(test_reduce_nan_inf) {
  static const flexcoll_datatype_t fdt[] = {FLEXCOLL_FLOAT16, FLEXCOLL_BFLOAT16, FLEXCOLL_FLOAT32, FLEXCOLL_FLOAT64};
  const flexcoll_datatype_t dt = fdt[_i];
  const size_t size = fc_dtype_size(dt);
  static const double av[] = {NAN, 1, NAN, -INFINITY, INFINITY, 3, -NAN};
  static const double bv[] = {2, NAN, NAN, 2, -INFINITY, 2, 5};
  static const double want_max[] = {2, 1, NAN, 2, INFINITY, 3, 5};
  static const double want_min[] = {2, 1, NAN, -INFINITY, -INFINITY, 2, 5};
  static const double want_sum[] = {NAN, NAN, NAN, -INFINITY, NAN, 5, NAN};
  enum { N = 7 };
  uint64_t a[N], b[N], d[N];
  for (int i = 0; i < N; i++) {
    set_raw(a, i, size, encode(av[i], dt));
    set_raw(b, i, size, encode(bv[i], dt));
  }
  const struct {
    flexcoll_op_t op;
    const double *want;
  } cases[] = {{FLEXCOLL_MAX, want_max}, {FLEXCOLL_MIN, want_min}, {FLEXCOLL_SUM, want_sum}};
  for (size_t c = 0; c < 3; c++) {
    fc_host_reduce(d, a, b, N, dt, cases[c].op);
    for (int i = 0; i < N; i++) {
      const uint64_t got = get_raw(d, i, size);
      const double g = as_double(got, dt), w = cases[c].want[i];
      const int ok = isnan(w) ? isnan(g) && (!is16(dt) || got == 0x7fff) : g == w;
      ck_assert_msg(ok, "%s %s [%d]: got %g (0x%llx), want %g", fc_dtype_name(dt), fc_op_name(cases[c].op), i, g,
                    (unsigned long long)got, w);
    }
  }
}
END_TEST

/* float16/bfloat16 MAX/MIN against every y pattern (NaNs, zeros, infinities included) for a
 * spread of x: bit for bit what the CUDA kernels do, which is fmaxf/fminf's selection in
 * float (x if it wins or y is NaN, else y), the winner rounded back (NaN -> 0x7fff). */
START_TEST(test_reduce_16bit_maxmin) {
  const flexcoll_datatype_t dt = _i / 2 ? FLEXCOLL_BFLOAT16 : FLEXCOLL_FLOAT16;
  const flexcoll_op_t op = _i % 2 ? FLEXCOLL_MIN : FLEXCOLL_MAX;
  static const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x7c00, 0xfc00, 0x7f80, 0xff80,
                                      0x7c01, 0x7e00, 0xfe00, 0x7fff, 0xffff, 0x7bff, 0xfbff, 0x3c00};
  static uint16_t a[0x10000], b[0x10000], d[0x10000];
  for (uint32_t y = 0; y < 0x10000u; y++) b[y] = (uint16_t)y;
  const size_t nspecial = sizeof specials / sizeof specials[0];
  for (uint32_t k = 0; k < nspecial + 0x10000u / 251; k++) {
    const uint16_t x = k < nspecial ? specials[k] : (uint16_t)((k - nspecial) * 251);
    for (uint32_t y = 0; y < 0x10000u; y++) a[y] = x;
    fc_host_reduce(d, a, b, 0x10000u, dt, op);
    const double xv = as_double(x, dt);
    for (uint32_t y = 0; y < 0x10000u; y++) {
      const double yv = as_double(y, dt);
      const int x_wins = (op == FLEXCOLL_MAX ? isgreater(xv, yv) : isless(xv, yv)) || isnan(yv);
      const unsigned pick = x_wins ? x : y, want = isnan(as_double(pick, dt)) ? 0x7fffu : pick;
      EXPECT(d[y] == want, "%s %s(0x%04x, 0x%04x) = 0x%04x, want 0x%04x", fc_dtype_name(dt), fc_op_name(op), x, y,
             d[y], want);
    }
  }
}
END_TEST

/* Invalid datatype or operator: nothing happens. */
START_TEST(test_reduce_invalid) {
  int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, d[4] = {9, 9, 9, 9};
  fc_host_reduce(d, a, b, 4, FLEXCOLL_NUM_DATATYPES, FLEXCOLL_SUM);
  fc_host_reduce(d, a, b, 4, (flexcoll_datatype_t)-1, FLEXCOLL_SUM);
  fc_host_reduce(d, a, b, 4, FLEXCOLL_INT32, FLEXCOLL_NUM_OPS);
  fc_host_reduce(d, a, b, 4, FLEXCOLL_INT32, (flexcoll_op_t)-1);
  fc_host_divide(d, 4, FLEXCOLL_NUM_DATATYPES, 2);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(d[i], 9);
  /* wrap-around of signed types is modular, not UB */
  int32_t x[2] = {INT32_MAX, INT32_MIN}, y[2] = {1, -1}, z[2];
  fc_host_reduce(z, x, y, 2, FLEXCOLL_INT32, FLEXCOLL_SUM);
  ck_assert(z[0] == INT32_MIN && z[1] == INT32_MAX);
  fc_host_reduce(z, x, y, 2, FLEXCOLL_INT32, FLEXCOLL_PROD);
  ck_assert(z[0] == INT32_MAX && z[1] == INT32_MIN);
}
END_TEST

/* ---- fc_host_divide ---- */

static uint64_t expect_div(uint64_t x, int n, flexcoll_datatype_t dt) {
  const size_t size = fc_dtype_size(dt);
  if (!fc_dtype_is_float(dt)) {
    if (is_signed_int(dt)) return (uint64_t)(as_signed(x, size) / n) & width_mask(size);
    return x / (uint64_t)n;
  }
  const double v = as_double(x, dt);
  if (dt == FLEXCOLL_FLOAT64) return f64_raw(v / n);
  return encode((double)((float)v / (float)n), dt); /* float division, then rounded to dt */
}

START_TEST(test_divide) {
  const flexcoll_datatype_t dt = (flexcoll_datatype_t)_i;
  const size_t size = fc_dtype_size(dt);
  static const int ns[] = {1, 2, 3, 7, 8, 64, 1000};
  rng_t r = rng_for(2, _i);
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    const size_t count = counts[c];
    char *orig = malloc((count + 1) * size), *buf = malloc((count + 1) * size);
    ck_assert(orig && buf);
    for (size_t i = 0; i < count; i++) set_raw(orig, i, size, random_elem(&r, dt, i));
    set_raw(orig, count, size, 0x5a5a5a5a5a5a5a5aull); /* guard */
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
      memcpy(buf, orig, (count + 1) * size);
      fc_host_divide(buf, count, dt, ns[k]);
      for (size_t i = 0; i <= count; i++) {
        const uint64_t x = get_raw(orig, i, size), got = get_raw(buf, i, size);
        const uint64_t want = i == count ? x : expect_div(x, ns[k], dt);
        EXPECT(got == want, "%s / %d count %zu: [%zu] 0x%llx -> 0x%llx, want 0x%llx (seed %llu)",
                      fc_dtype_name(dt), ns[k], count, i, (unsigned long long)x, (unsigned long long)got,
                      (unsigned long long)want, g_seed);
      }
    }
    free(orig);
    free(buf);
  }
  /* n < 1 is ignored rather than trapping */
  int64_t v[2] = {10, -10};
  fc_host_divide(v, 2, FLEXCOLL_INT64, 0);
  fc_host_divide(v, 2, FLEXCOLL_INT64, -3);
  ck_assert(v[0] == 10 && v[1] == -10);
}
END_TEST

START_TEST(test_divide_known) {
  int8_t i8[3] = {-7, 7, -128};
  fc_host_divide(i8, 3, FLEXCOLL_INT8, 2);
  ck_assert(i8[0] == -3 && i8[1] == 3 && i8[2] == -64); /* truncation toward zero */
  uint8_t u8[1] = {255};
  fc_host_divide(u8, 1, FLEXCOLL_UINT8, 2);
  ck_assert_int_eq(u8[0], 127);
  uint64_t u64[1] = {UINT64_MAX};
  fc_host_divide(u64, 1, FLEXCOLL_UINT64, 3);
  ck_assert(u64[0] == UINT64_MAX / 3);
  uint16_t h[2] = {0x3c00, 0xbc00}, bf[1] = {0x3f80}; /* 1.0, -1.0 */
  fc_host_divide(h, 2, FLEXCOLL_FLOAT16, 3);
  ck_assert(h[0] == 0x3555 && h[1] == 0xb555);
  fc_host_divide(bf, 1, FLEXCOLL_BFLOAT16, 3);
  ck_assert_uint_eq(bf[0], 0x3eab);
  float f[1] = {1.0f};
  fc_host_divide(f, 1, FLEXCOLL_FLOAT32, 3);
  ck_assert(f[0] == 1.0f / 3.0f);
}
END_TEST

/* ---- float16/bfloat16 conversions ---- */

/* All 65536 patterns: decoding matches the field-by-field reference; non-NaN patterns round
 * trip exactly; NaNs decode to NaN (float16: CUDA's 0x7fffffff; bfloat16: payload kept) and
 * encode to 0x7fff. */
START_TEST(test_conv_exhaustive) {
  const int half = _i == 0;
  const fmt16_t f = half ? FMT_HALF : FMT_BF16;
  for (uint32_t h = 0; h < 0x10000u; h++) {
    const float v = half ? fc_half_to_float((uint16_t)h) : fc_bf16_to_float((uint16_t)h);
    const uint16_t back = half ? fc_float_to_half(v) : fc_float_to_bf16(v);
    const double want = ref_decode16(h, f);
    const uint32_t vbits = (uint32_t)f32_raw(v);
    if (isnan(want)) {
      EXPECT(vbits == (half ? 0x7fffffffu : h << 16), "NaN 0x%04x decodes to 0x%08x", h, vbits);
      EXPECT(back == 0x7fff, "NaN 0x%04x re-encodes to 0x%04x", h, back);
    } else {
      EXPECT((double)v == want && !signbit(v) == !signbit(want), "0x%04x decodes to %a, want %a", h, v, want);
      EXPECT(back == h, "0x%04x round-trips to 0x%04x", h, back);
    }
  }
}
END_TEST

static unsigned conv16(float x, int half) { return half ? fc_float_to_half(x) : fc_float_to_bf16(x); }

/* Every rounding boundary: each midpoint between consecutive finite values (including the one
 * above the largest, which overflows), one float ulp either side, both signs; then a strided
 * sweep over all float patterns.  Against the table-based reference rounding. */
START_TEST(test_conv_rounding_sweep) {
  const int half = _i == 0;
  const fmt16_t f = half ? FMT_HALF : FMT_BF16;
  const double *t = table16(f);
  for (unsigned h = 0; h <= f.maxfin; h++) {
    const double hi = h == f.maxfin ? 2 * t[h] - t[h - 1] : t[h + 1];
    const float mid = (float)((t[h] + hi) / 2); /* exact: midpoints have few significant bits */
    const float probes[3] = {nextafterf(mid, 0.0f), mid, nextafterf(mid, INFINITY)};
    for (int p = 0; p < 6; p++) {
      const float x = p < 3 ? probes[p] : -probes[p - 3];
      const unsigned got = conv16(x, half), want = ref_round16(x, f);
      EXPECT(got == want, "%s(%a) = 0x%04x, want 0x%04x", half ? "half" : "bf16", x, got, want);
    }
  }
  for (uint64_t u = 0; u < 0x100000000ull; u += 4093) {
    const uint32_t bits = (uint32_t)u;
    float x;
    memcpy(&x, &bits, 4);
    const unsigned got = conv16(x, half), want = ref_round16(x, f);
    EXPECT(got == want, "%s(0x%08x) = 0x%04x, want 0x%04x", half ? "half" : "bf16", bits, got, want);
  }
}
END_TEST

/* Hand-checked cases: ties to even, overflow, subnormals, signed zero, NaN. */
START_TEST(test_conv_cases) {
  static const struct {
    float x;
    uint16_t half, bf16;
  } cases[] = {
    {1.0f, 0x3c00, 0x3f80},
    {0x1.002p0f, 0x3c00, 0x3f80},         /* half tie -> even (down) */
    {0x1.006p0f, 0x3c02, 0x3f80},         /* half tie -> even (up) */
    {0x1.002002p0f, 0x3c01, 0x3f80},      /* just above a half tie */
    {0x1.01p0f, 0x3c04, 0x3f80},          /* bf16 tie -> even (down) */
    {0x1.03p0f, 0x3c0c, 0x3f82},          /* bf16 tie -> even (up) */
    {0x1.010002p0f, 0x3c04, 0x3f81},      /* just above a bf16 tie */
    {2049.0f, 0x6800, 0x4500},            /* half spacing 2 at 2048: tie -> 2048 */
    {2051.0f, 0x6802, 0x4500},            /* tie -> 2052 */
    {0.1f, 0x2e66, 0x3dcd},
    {65504.0f, 0x7bff, 0x4780},
    {65519.0f, 0x7bff, 0x4780},
    {65520.0f, 0x7c00, 0x4780},           /* half: tie between max and 2^16 -> inf */
    {-65520.0f, 0xfc00, 0xc780},
    {1e10f, 0x7c00, 0x5015},
    {FLT_MAX, 0x7c00, 0x7f80},            /* bf16 rounds up past its max */
    {INFINITY, 0x7c00, 0x7f80},
    {-INFINITY, 0xfc00, 0xff80},
    {0x1p-14f, 0x0400, 0x3880},           /* smallest normal half */
    {0x1p-24f, 0x0001, 0x3380},           /* smallest subnormal half */
    {0x1p-25f, 0x0000, 0x3300},           /* tie with zero -> 0 */
    {0x1.000002p-25f, 0x0001, 0x3300},
    {0x1.8p-24f, 0x0002, 0x33c0},         /* tie between 1 and 2 units -> 2 */
    {0x1.4p-22f, 0x0005, 0x34a0},
    {0x1.ffcp-15f, 0x0400, 0x3880},       /* tie between 0x3ff and 0x400 -> 0x400 */
    {0x1.ff8p-15f, 0x03ff, 0x3880},
    {-0x1p-24f, 0x8001, 0xb380},
    {0.0f, 0x0000, 0x0000},
    {-0.0f, 0x8000, 0x8000},
    {FLT_TRUE_MIN, 0x0000, 0x0000},
    {-FLT_TRUE_MIN, 0x8000, 0x8000},
    {0x1p-133f, 0x0000, 0x0001},          /* smallest subnormal bf16 */
    {0x1.8p-133f, 0x0000, 0x0002},        /* bf16 subnormal tie -> even */
    {NAN, 0x7fff, 0x7fff},
    {-NAN, 0x7fff, 0x7fff},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const float x = cases[i].x;
    ck_assert_msg(fc_float_to_half(x) == cases[i].half, "half(%a) = 0x%04x, want 0x%04x", x, fc_float_to_half(x),
                  cases[i].half);
    ck_assert_msg(fc_float_to_bf16(x) == cases[i].bf16, "bf16(%a) = 0x%04x, want 0x%04x", x, fc_float_to_bf16(x),
                  cases[i].bf16);
  }
  ck_assert(fc_half_to_float(0x7bff) == 65504.0f && fc_half_to_float(0x0001) == 0x1p-24f);
  ck_assert(fc_bf16_to_float(0x3f80) == 1.0f && fc_bf16_to_float(0x0001) == 0x1p-133f);
}
END_TEST

/* ---- names, sizes ---- */

START_TEST(test_names) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt++) {
    ck_assert_int_eq(fc_dtype_from_name(fc_dtype_name((flexcoll_datatype_t)dt)), dt);
    ck_assert_uint_eq(fc_dtype_size((flexcoll_datatype_t)dt), sizes[dt]);
    ck_assert_int_eq(fc_dtype_is_float((flexcoll_datatype_t)dt), dt >= FLEXCOLL_FLOAT16);
  }
  for (int op = 0; op < FLEXCOLL_NUM_OPS; op++)
    ck_assert_int_eq(fc_op_from_name(fc_op_name((flexcoll_op_t)op)), op);
  ck_assert_str_eq(fc_dtype_name(FLEXCOLL_BFLOAT16), "bfloat16");
  ck_assert_str_eq(fc_op_name(FLEXCOLL_AVG), "avg");
  ck_assert_str_eq(fc_dtype_name(FLEXCOLL_NUM_DATATYPES), "invalid");
  ck_assert_str_eq(fc_op_name(FLEXCOLL_NUM_OPS), "invalid");
  ck_assert_uint_eq(fc_dtype_size(FLEXCOLL_NUM_DATATYPES), 0);
  ck_assert_int_eq(fc_dtype_from_name("half"), FLEXCOLL_FLOAT16);
  ck_assert_int_eq(fc_dtype_from_name("BF16"), FLEXCOLL_BFLOAT16);
  ck_assert_int_eq(fc_dtype_from_name("float"), FLEXCOLL_FLOAT32);
  ck_assert_int_eq(fc_dtype_from_name("Double"), FLEXCOLL_FLOAT64);
  ck_assert_int_eq(fc_dtype_from_name("int"), FLEXCOLL_INT32);
  ck_assert_int_eq(fc_dtype_from_name("uint"), FLEXCOLL_UINT32);
  ck_assert_int_eq(fc_dtype_from_name("char"), FLEXCOLL_INT8);
  ck_assert_int_eq(fc_dtype_from_name("float1"), -1);
  ck_assert_int_eq(fc_dtype_from_name("floa"), -1);
  ck_assert_int_eq(fc_dtype_from_name(""), -1);
  ck_assert_int_eq(fc_dtype_from_name(NULL), -1);
  ck_assert_int_eq(fc_op_from_name("MAX"), FLEXCOLL_MAX);
  ck_assert_int_eq(fc_op_from_name("mean"), FLEXCOLL_AVG);
  ck_assert_int_eq(fc_op_from_name("sums"), -1);
  ck_assert_int_eq(fc_op_from_name(NULL), -1);
}
END_TEST

static Suite *reduce_suite(void) {
  Suite *s = suite_create("reduce");
  TCase *tc = tcase_create("reduce");
  tcase_set_timeout(tc, 120); /* a million elements x every op and aliasing, per datatype */
  tcase_add_loop_test(tc, test_reduce_all_ops, 0, FLEXCOLL_NUM_DATATYPES);
  tcase_add_loop_test(tc, test_reduce_nan_inf, 0, 4);
  tcase_add_loop_test(tc, test_reduce_16bit_maxmin, 0, 4); /* {float16, bfloat16} x {max, min} */
  tcase_add_test(tc, test_reduce_invalid);
  tcase_add_loop_test(tc, test_divide, 0, FLEXCOLL_NUM_DATATYPES);
  tcase_add_test(tc, test_divide_known);
  suite_add_tcase(s, tc);
  TCase *conv = tcase_create("conversions");
  tcase_set_timeout(conv, 120);
  tcase_add_loop_test(conv, test_conv_exhaustive, 0, 2); /* 0: float16, 1: bfloat16 */
  tcase_add_loop_test(conv, test_conv_rounding_sweep, 0, 2);
  tcase_add_test(conv, test_conv_cases);
  tcase_add_test(conv, test_names);
  suite_add_tcase(s, conv);
  return s;
}

int main(void) {
  const char *env = getenv("FC_TEST_SEED");
  g_seed = env && *env ? strtoull(env, NULL, 0) : (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 16);
  SRunner *sr = srunner_create(reduce_suite());
  srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose lists every test */
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (failed) fprintf(stderr, "test_reduce: %d failed; rerun with FC_TEST_SEED=%llu\n", failed, g_seed);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
