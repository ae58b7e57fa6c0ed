/* test_kernels.cu — standalone GPU test of lib/kernels (not part of the library).
 *
 *   gcc -c -O2 -std=gnu11 -Iinclude -Ilib lib/host/reduce.c -o /tmp/hreduce.o
 *   nvcc -O2 -arch=sm_90 -Iinclude -Ilib lib/kernels/test_kernels.cu lib/kernels/reduce.cu \
 *        lib/kernels/oneshot.cu lib/kernels/oneshot_rs.cu /tmp/hreduce.o -o /tmp/test_kernels
 *
 * Checks fc_kernel_reduce/divide bit for bit against the host executor (lib/host/reduce.c) for
 * every datatype and op, fc_kernel_copy, the one-shot allreduce/allgather/reduce_scatter/broadcast (ranks spread over
 * the GPUs present, several ranks per GPU where needed) and the one-shot timeout.  Exit 0: all
 * passed; 1: a failure; 77: no GPU (skipped).
 *
 * The one expected difference from the host: the payload of a NaN that float32/float64
 * SUM/PROD/division produce (see ops.cuh), so there any NaN matches any NaN.  One-shot results
 * must in addition be bitwise equal on all ranks, NaNs included.
 */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "host/host.h"
}
#include "dtype.h"
#include "kernels/kernels.h"
#include "../../tests/gpu_serial.h"

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (cudaError_t)(call);                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));       \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static int g_failures, g_checks;

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  if (++g_failures > 50) {
    fprintf(stderr, "too many failures\n");
    exit(1);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- random data */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64* */
  g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
  return g_rng * 0x2545f4914f6cdd1dull;
}

/* float32/float64: 1/2 random bit patterns (every exponent, NaNs with payloads), 3/8 small
 * "nice" numbers (sums that cancel, exact products), 1/8 special values. */
static float rnd_f32(void) {
  static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                     0x7f800001u, 0xffc12345u, 0x00000001u, 0x807fffffu, 0x7f7fffffu};
  const uint64_t r = rnd();
  uint32_t u;
  float f;
  switch (r & 7) {
    case 0: case 1: case 2: case 3: u = (uint32_t)(r >> 32); break;
    case 7: u = special[(r >> 8) % (sizeof special / sizeof special[0])]; break;
    default: f = (float)((int64_t)((r >> 8) % 2001) - 1000) * 0.125f; memcpy(&u, &f, 4); break;
  }
  memcpy(&f, &u, 4);
  return f;
}
static double rnd_f64(void) {
  static const uint64_t special[] = {0x0ull, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
                                     0x7ff8000000000000ull, 0x7ff0000000000001ull, 0x0000000000000001ull,
                                     0x7fefffffffffffffull};
  const uint64_t r = rnd();
  double d;
  switch (r & 7) {
    case 0: case 1: case 2: case 3: { uint64_t u = rnd(); memcpy(&d, &u, 8); break; }
    case 7: memcpy(&d, &special[(r >> 8) % (sizeof special / sizeof special[0])], 8); break;
    default: d = (double)((int64_t)((r >> 8) % 2001) - 1000) * 0.125; break;
  }
  return d;
}

/* Integers, float16 and bfloat16: uniform random bits (every NaN, subnormal and infinity). */
static void fill_random(void *buf, size_t count, flexcoll_datatype_t dt) {
  const size_t es = fc_dtype_size(dt);
  char *p = (char *)buf;
  for (size_t i = 0; i < count; i++) {
    if (dt == FLEXCOLL_FLOAT32) { float f = rnd_f32(); memcpy(p + i * 4, &f, 4); }
    else if (dt == FLEXCOLL_FLOAT64) { double d = rnd_f64(); memcpy(p + i * 8, &d, 8); }
    else { uint64_t r = rnd(); memcpy(p + i * es, &r, es); }
  }
}

/* ---------------------------------------------------------------- comparison */

static int is_nan_at(const char *p, size_t i, flexcoll_datatype_t dt) {
  if (dt == FLEXCOLL_FLOAT32) { float f; memcpy(&f, p + i * 4, 4); return f != f; }
  double d;
  memcpy(&d, p + i * 8, 8);
  return d != d;
}

/* Whether float32/float64 results of this op may differ from the host in NaN payloads. */
static int nan_loose(flexcoll_datatype_t dt, int arith) {
  return arith && (dt == FLEXCOLL_FLOAT32 || dt == FLEXCOLL_FLOAT64);
}

/* Index of the first element where got differs from want, or -1. */
static long first_diff(const void *want, const void *got, size_t count, flexcoll_datatype_t dt, int loose) {
  const size_t es = fc_dtype_size(dt);
  const char *w = (const char *)want, *g = (const char *)got;
  if (memcmp(w, g, count * es) == 0) return -1;
  for (size_t i = 0; i < count; i++) {
    if (memcmp(w + i * es, g + i * es, es) == 0) continue;
    if (loose && is_nan_at(w, i, dt) && is_nan_at(g, i, dt)) continue;
    return (long)i;
  }
  return -1;
}

static void report_diff(const char *what, const void *want, const void *got, long i, flexcoll_datatype_t dt) {
  const size_t es = fc_dtype_size(dt);
  uint64_t w = 0, g = 0;
  memcpy(&w, (const char *)want + i * es, es);
  memcpy(&g, (const char *)got + i * es, es);
  fail("%s: element %ld: want 0x%llx got 0x%llx", what, i, (unsigned long long)w, (unsigned long long)g);
}

static int check_same(const char *what, const void *want, const void *got, size_t count, flexcoll_datatype_t dt,
                      int loose) {
  g_checks++;
  const long i = first_diff(want, got, count, dt, loose);
  if (i < 0) return 1;
  report_diff(what, want, got, i, dt);
  return 0;
}

/* The 16 bytes before and after [p, p+n) of a device buffer filled with 0xa5 are untouched. */
static void check_guard(const char *what, const char *base, const char *p, size_t n, size_t total) {
  unsigned char g[16];
  const char *lo = p - 16 >= base ? p - 16 : base, *hi = p + n;
  size_t after = (size_t)(base + total - hi) < 16 ? (size_t)(base + total - hi) : 16;
  CK(cudaMemcpy(g, lo, (size_t)(p - lo), cudaMemcpyDeviceToHost));
  for (long i = 0; i < p - lo; i++)
    if (g[i] != 0xa5) { fail("%s: wrote before the buffer", what); return; }
  CK(cudaMemcpy(g, hi, after, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < after; i++)
    if (g[i] != 0xa5) { fail("%s: wrote after the buffer", what); return; }
}

/* ---------------------------------------------------------------- reduce, divide, copy */

static const size_t kBig = 1000003;
#define NDT FLEXCOLL_NUM_DATATYPES
#define NOP FLEXCOLL_NUM_OPS

struct DevBufs {
  char *a, *b, *d;
  size_t bytes;
};

/* One fc_kernel_reduce call: element offsets off[] of a, b, dst; alias 1: dst = a, 2: dst = b. */
static void reduce_case(const DevBufs &db, flexcoll_datatype_t dt, flexcoll_op_t op, size_t count,
                        const size_t off[3], int alias, const char *A, const char *B, char *E, char *G) {
  const size_t es = fc_dtype_size(dt), n = count * es;
  char *da = db.a + off[0] * es, *dbb = db.b + off[1] * es, *dd = db.d + off[2] * es;
  CK(cudaMemcpy(da, A, n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dbb, B, n, cudaMemcpyHostToDevice));
  CK(cudaMemset(db.d, 0xa5, db.bytes));
  char *dst = alias == 1 ? da : alias == 2 ? dbb : dd;
  CK(fc_kernel_reduce(dst, da, dbb, count, dt, op, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(G, dst, n, cudaMemcpyDeviceToHost));
  memcpy(E, A, n);
  fc_host_reduce(E, E, B, count, dt, op);
  char what[160];
  snprintf(what, sizeof what, "reduce %s %s count %zu off %zu,%zu,%zu alias %d", fc_dtype_name(dt), fc_op_name(op),
           count, off[0], off[1], off[2], alias);
  check_same(what, E, G, count, dt, nan_loose(dt, op != FLEXCOLL_MAX && op != FLEXCOLL_MIN));
  if (alias == 0) check_guard(what, db.d, dd, n, db.bytes);
}

static void test_reduce(const DevBufs &db, char *A, char *B, char *E, char *G) {
  /* Offsets in elements: all aligned (vectors); equally misaligned (scalar head, then
   * vectors); unequally misaligned (all scalar). */
  static const size_t offs[3][3] = {{0, 0, 0}, {1, 1, 1}, {1, 0, 3}};
  static const size_t counts[] = {1, 7, 33, 4099, kBig};
  const int before = g_failures;
  for (int dt = 0; dt < NDT; dt++) {
    fill_random(A, kBig, (flexcoll_datatype_t)dt);
    fill_random(B, kBig, (flexcoll_datatype_t)dt);
    for (int op = 0; op < NOP; op++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (int o = 0; o < 3; o++)
          for (int alias = 0; alias < 3; alias++) {
            if (counts[c] == kBig && alias && o != 1) continue; /* keep the big cases few */
            reduce_case(db, (flexcoll_datatype_t)dt, (flexcoll_op_t)op, counts[c], offs[o], alias, A, B, E, G);
          }
  }
  printf("%s fc_kernel_reduce: %d datatypes x %d ops, counts 1..%zu, aligned/misaligned/aliased\n",
         g_failures == before ? "PASS" : "FAIL", NDT, NOP, kBig);
}

static void test_divide(const DevBufs &db, char *A, char *E, char *G) {
  static const size_t counts[] = {1, 7, 4099, kBig};
  static const int ns[] = {2, 3, 7, 8};
  const int before = g_failures;
  for (int dt = 0; dt < NDT; dt++) {
    fill_random(A, kBig, (flexcoll_datatype_t)dt);
    const size_t es = fc_dtype_size((flexcoll_datatype_t)dt);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
      for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (size_t off = 0; off < 2; off++) {
          const size_t n = counts[c] * es;
          CK(cudaMemcpy(db.a + off * es, A, n, cudaMemcpyHostToDevice));
          CK(fc_kernel_divide(db.a + off * es, counts[c], (flexcoll_datatype_t)dt, ns[k], 0));
          CK(cudaMemcpy(G, db.a + off * es, n, cudaMemcpyDeviceToHost));
          memcpy(E, A, n);
          fc_host_divide(E, counts[c], (flexcoll_datatype_t)dt, ns[k]);
          char what[128];
          snprintf(what, sizeof what, "divide %s count %zu by %d off %zu", fc_dtype_name((flexcoll_datatype_t)dt),
                   counts[c], ns[k], off);
          check_same(what, E, G, counts[c], (flexcoll_datatype_t)dt, nan_loose((flexcoll_datatype_t)dt, 1));
        }
  }
  printf("%s fc_kernel_divide: %d datatypes, n = 2, 3, 7, 8\n", g_failures == before ? "PASS" : "FAIL", NDT);
}

static void test_copy(const DevBufs &db, char *A, char *G) {
  static const size_t sizes[] = {1, 15, 16, 17, 100, 4099, 3 * kBig + 5};
  static const size_t offs[][2] = {{0, 0}, {1, 1}, {3, 7}, {8, 0}, {4, 12}, {2, 6}, {5, 0}};
  const int before = g_failures;
  fill_random(A, 3 * kBig + 64, FLEXCOLL_UINT8);
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++) {
      const size_t n = sizes[s];
      CK(cudaMemcpy(db.a + offs[o][0], A, n, cudaMemcpyHostToDevice));
      CK(cudaMemset(db.d, 0xa5, db.bytes));
      CK(fc_kernel_copy(db.d + offs[o][1], db.a + offs[o][0], n, 0));
      CK(cudaMemcpy(G, db.d + offs[o][1], n, cudaMemcpyDeviceToHost));
      char what[96];
      snprintf(what, sizeof what, "copy %zu bytes src+%zu dst+%zu", n, offs[o][0], offs[o][1]);
      check_same(what, A, G, n, FLEXCOLL_UINT8, 0);
      check_guard(what, db.d, db.d + offs[o][1], n, db.bytes);
    }
  printf("%s fc_kernel_copy: sizes 1..%zu, 7 alignment pairs\n", g_failures == before ? "PASS" : "FAIL", 3 * kBig + 5);
}

/* Count 0 launches nothing; invalid arguments are refused before any launch. */
static void test_args(const DevBufs &db) {
  const int before = g_failures;
  CK(cudaMemset(db.d, 0xa5, 64));
  if (fc_kernel_reduce(db.d, db.a, db.b, 0, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0) != 0) fail("reduce count 0");
  if (fc_kernel_divide(db.d, 0, FLEXCOLL_FLOAT32, 4, 0) != 0) fail("divide count 0");
  if (fc_kernel_copy(db.d, db.a, 0, 0) != 0) fail("copy 0 bytes");
  if (fc_kernel_reduce(db.d, db.a, db.b, 4, FLEXCOLL_NUM_DATATYPES, FLEXCOLL_SUM, 0) != cudaErrorInvalidValue)
    fail("reduce: invalid datatype accepted");
  if (fc_kernel_reduce(db.d, db.a, db.b, 4, FLEXCOLL_INT32, FLEXCOLL_NUM_OPS, 0) != cudaErrorInvalidValue)
    fail("reduce: invalid op accepted");
  if (fc_kernel_reduce(db.d + 2, db.a, db.b, 4, FLEXCOLL_INT32, FLEXCOLL_SUM, 0) != cudaErrorInvalidValue)
    fail("reduce: a pointer not aligned to its element accepted");
  CK(cudaDeviceSynchronize());
  check_guard("count 0", db.d, db.d + 16, 0, 64);
  if (fc_kernel_timeout_ns(1000) != 1000000000ull) fail("fc_kernel_timeout_ns(1000 ms) != 1e9 ns");
  if (fc_kernel_timeout_ns(0) != UINT64_MAX) fail("fc_kernel_timeout_ns(0) is not 'never'");
  printf("%s argument checks (count 0, invalid datatype/op/alignment, timeout conversion)\n",
         g_failures == before ? "PASS" : "FAIL");
}

/* ---------------------------------------------------------------- one-shot */

struct Rank {
  int dev;
  cudaStream_t stream;
  char *stage, *send, *recv, *ll;
  uint64_t *flags;
  int *error; /* host-mapped */
  fc_dev_epoch_t *epoch;
};

/* LL areas are allocated for this limit; World.ll_max (0: the plain kernels only) picks the
 * limit of the calls. */
static const size_t kLLCap = 64 << 10;
static size_t ll_bytes(int nranks) { return 2 * (size_t)nranks * 2 * kLLCap; }

struct World {
  int nranks;
  size_t slot, ll_max;
  uint64_t seq; /* the seq of the last call: each rank's epoch->seq once it has run */
  uint64_t timeout_ns;
  Rank r[FC_ONESHOT_MAX_RANKS];
};

/* The one-shot flags and the pipelined kernels' counters after them (kernels.h). */
static size_t flags_bytes(int nranks) { return 4 * (size_t)nranks * FC_MAX_BLOCKS * sizeof(uint64_t); }

/* nranks ranks, rank i on device devs[i]; send/recv with 64 bytes of slack for offsets. */
static void world_init(World *w, int nranks, const int *devs, size_t slot) {
  memset(w, 0, sizeof *w);
  w->nranks = nranks, w->slot = slot;
  for (int i = 0; i < nranks; i++) {
    Rank *r = &w->r[i];
    r->dev = devs[i];
    CK(cudaSetDevice(r->dev));
    CK(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
    CK(cudaMalloc(&r->stage, 2 * (size_t)nranks * slot));
    CK(cudaMalloc(&r->flags, flags_bytes(nranks)));
    CK(cudaMemset(r->flags, 0, flags_bytes(nranks)));
    CK(cudaMalloc(&r->ll, ll_bytes(nranks)));
    CK(cudaMemset(r->ll, 0, ll_bytes(nranks)));
    CK(cudaMalloc(&r->send, slot + 64));
    CK(cudaMalloc(&r->recv, (size_t)nranks * slot + 64));
    CK(cudaHostAlloc(&r->error, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
    *r->error = 0;
    CK(cudaMalloc(&r->epoch, sizeof *r->epoch));
    CK(cudaMemset(r->epoch, 0, sizeof *r->epoch));
  }
  /* Long enough never to fire in a correct run, short enough that a bug fails, not hangs. */
  w->timeout_ns = fc_kernel_timeout_ns(10000);
  CK(cudaDeviceSynchronize());
}

static void world_free(World *w) {
  for (int i = 0; i < w->nranks; i++) {
    Rank *r = &w->r[i];
    CK(cudaSetDevice(r->dev));
    CK(cudaStreamDestroy(r->stream));
    CK(cudaFree(r->stage));
    CK(cudaFree(r->flags));
    CK(cudaFree(r->ll));
    CK(cudaFree(r->send));
    CK(cudaFree(r->recv));
    CK(cudaFreeHost(r->error));
    CK(cudaFree(r->epoch));
  }
}

/* Set a rank's epoch so that its next call takes seq (its stream idle). */
static void world_set_epoch(World *w, int rank, uint64_t seq, uint64_t pipe_base) {
  const fc_dev_epoch_t e = {seq - 1, pipe_base, 0};
  CK(cudaSetDevice(w->r[rank].dev));
  CK(cudaMemcpy(w->r[rank].epoch, &e, sizeof e, cudaMemcpyHostToDevice));
}

/* A rank's epoch (its stream idle). */
static fc_dev_epoch_t world_epoch(World *w, int rank) {
  fc_dev_epoch_t e;
  CK(cudaSetDevice(w->r[rank].dev));
  CK(cudaMemcpy(&e, w->r[rank].epoch, sizeof e, cudaMemcpyDeviceToHost));
  return e;
}

static fc_oneshot_args_t world_args(const World *w, int rank) {
  fc_oneshot_args_t a;
  memset(&a, 0, sizeof a);
  a.rank = rank, a.nranks = w->nranks, a.epoch = w->r[rank].epoch, a.slot_bytes = w->slot;
  for (int p = 0; p < w->nranks; p++) a.stage[p] = w->r[p].stage, a.flags[p] = w->r[p].flags, a.ll[p] = w->r[p].ll;
  a.ll_max = w->ll_max;
  a.timeout_ns = w->timeout_ns;
  a.error = w->r[rank].error;
  return a;
}

/* Holds a stream for ns nanoseconds, so that one rank arrives late. */
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < ns);
}

/* Launch one collective on every rank: reversed order and a late rank now and then. */
enum { K_ALLREDUCE, K_ALLGATHER, K_REDUCE_SCATTER, K_BROADCAST };
struct Launch {
  int kind; /* K_* */
  const char *send[FC_ONESHOT_MAX_RANKS];
  char *recv[FC_ONESHOT_MAX_RANKS];
  size_t count; /* elements (allreduce; reduce_scatter: of one chunk) or bytes (allgather, broadcast) */
  flexcoll_datatype_t dt;
  flexcoll_op_t op;
  int root; /* broadcast */
};

static void launch_rank(const fc_oneshot_args_t *a, const Launch *l, int i, cudaStream_t s) {
  switch (l->kind) {
    case K_ALLGATHER: CK(fc_kernel_oneshot_allgather(a, l->send[i], l->recv[i], l->count, s)); break;
    case K_REDUCE_SCATTER: CK(fc_kernel_oneshot_reduce_scatter(a, l->send[i], l->recv[i], l->count, l->dt, l->op, s)); break;
    case K_BROADCAST: CK(fc_kernel_oneshot_broadcast(a, l->send[i], l->recv[i], l->count, l->root, s)); break;
    default: CK(fc_kernel_oneshot_allreduce(a, l->send[i], l->recv[i], l->count, l->dt, l->op, s)); break;
  }
}

static void world_launch(World *w, const Launch *l) {
  /* The uploads and memsets went through the legacy default stream, which the ranks'
   * non-blocking streams do not wait for (and pageable copies may return early). */
  for (int i = 0; i < w->nranks; i++) {
    CK(cudaSetDevice(w->r[i].dev));
    CK(cudaDeviceSynchronize());
  }
  w->seq++;
  const int reverse = (int)(rnd() & 1), late = (rnd() & 3) == 0 ? (int)(rnd() % (uint64_t)w->nranks) : -1;
  for (int k = 0; k < w->nranks; k++) {
    const int i = reverse ? w->nranks - 1 - k : k;
    const fc_oneshot_args_t a = world_args(w, i);
    CK(cudaSetDevice(w->r[i].dev));
    if (i == late) spin_kernel<<<1, 1, 0, w->r[i].stream>>>(200000);
    launch_rank(&a, l, i, w->r[i].stream);
  }
}

static int world_sync(World *w, const char *what) {
  int ok = 1;
  for (int i = 0; i < w->nranks; i++) {
    CK(cudaSetDevice(w->r[i].dev));
    CK(cudaStreamSynchronize(w->r[i].stream));
    if (*(volatile int *)w->r[i].error) fail("%s: rank %d timed out", what, i), ok = 0;
    /* The kernels number their calls on the device: one per call, all blocks counted. */
    const fc_dev_epoch_t e = world_epoch(w, i);
    if (e.seq != w->seq || e.done != 0)
      fail("%s: rank %d epoch seq %llu done %u after call %llu", what, i, e.seq, e.done, (unsigned long long)w->seq), ok = 0;
  }
  return ok;
}

/* Allreduce of count elements at byte offset off of send/recv (inplace: recv = send). */
static void oneshot_allreduce_case(World *w, flexcoll_datatype_t dt, flexcoll_op_t op, size_t count, size_t off,
                                   int inplace, char *S, char *E, char *G) {
  const size_t es = fc_dtype_size(dt), n = count * es;
  Launch l = {K_ALLREDUCE, {0}, {0}, count, dt, op, 0};
  for (int i = 0; i < w->nranks; i++) {
    fill_random(S + i * w->slot, count, dt);
    CK(cudaSetDevice(w->r[i].dev));
    l.send[i] = w->r[i].send + off;
    l.recv[i] = inplace ? w->r[i].send + off : w->r[i].recv + off;
    CK(cudaMemcpy(w->r[i].send + off, S + i * w->slot, n, cudaMemcpyHostToDevice));
    if (!inplace) CK(cudaMemset(w->r[i].recv, 0xa5, n + 64));
  }
  world_launch(w, &l);
  char what[160];
  snprintf(what, sizeof what, "oneshot allreduce %d ranks %s %s count %zu off %zu%s seq %llu", w->nranks,
           fc_dtype_name(dt), fc_op_name(op), count, off, inplace ? " in place" : "", (unsigned long long)w->seq);
  if (!world_sync(w, what)) return;
  memcpy(E, S, n); /* rank order, as the kernel */
  for (int i = 1; i < w->nranks; i++) fc_host_reduce(E, E, S + i * w->slot, count, dt, op);
  if (op == FLEXCOLL_AVG) fc_host_divide(E, count, dt, w->nranks);
  for (int i = 0; i < w->nranks; i++) {
    char *got = G + i * w->slot;
    CK(cudaSetDevice(w->r[i].dev));
    CK(cudaMemcpy(got, l.recv[i], n, cudaMemcpyDeviceToHost));
    if (!check_same(what, E, got, count, dt, nan_loose(dt, op != FLEXCOLL_MAX && op != FLEXCOLL_MIN))) return;
    if (i > 0 && !check_same(what, G, got, count, dt, 0)) return; /* every rank bitwise the same */
    if (!inplace) check_guard(what, w->r[i].recv, l.recv[i], n, (size_t)w->nranks * w->slot + 64);
  }
}

/* Allgather of bytes at byte offset off (inplace: send = recv + rank * bytes). */
static void oneshot_allgather_case(World *w, size_t bytes, size_t off, int inplace, char *S, char *G) {
  Launch l = {K_ALLGATHER, {0}, {0}, bytes, FLEXCOLL_UINT8, FLEXCOLL_SUM, 0};
  fill_random(S, (size_t)w->nranks * bytes, FLEXCOLL_UINT8);
  for (int i = 0; i < w->nranks; i++) {
    CK(cudaSetDevice(w->r[i].dev));
    l.recv[i] = w->r[i].recv + off;
    l.send[i] = inplace ? l.recv[i] + (size_t)i * bytes : w->r[i].send + off;
    CK(cudaMemset(w->r[i].recv, 0xa5, (size_t)w->nranks * bytes + 64));
    CK(cudaMemcpy((char *)l.send[i], S + (size_t)i * bytes, bytes, cudaMemcpyHostToDevice));
  }
  world_launch(w, &l);
  char what[128];
  snprintf(what, sizeof what, "oneshot allgather %d ranks %zu bytes off %zu%s seq %llu", w->nranks, bytes, off,
           inplace ? " in place" : "", (unsigned long long)w->seq);
  if (!world_sync(w, what)) return;
  for (int i = 0; i < w->nranks; i++) {
    CK(cudaSetDevice(w->r[i].dev));
    CK(cudaMemcpy(G, l.recv[i], (size_t)w->nranks * bytes, cudaMemcpyDeviceToHost));
    if (!check_same(what, S, G, (size_t)w->nranks * bytes, FLEXCOLL_UINT8, 0)) return;
    check_guard(what, w->r[i].recv, l.recv[i], (size_t)w->nranks * bytes, (size_t)w->nranks * w->slot + 64);
  }
}

/* Reduce_scatter of count elements per chunk at byte offset off (inplace: recv = send + rank's chunk). */
static void oneshot_rs_case(World *w, flexcoll_datatype_t dt, flexcoll_op_t op, size_t count, size_t off, int inplace,
                            char *S, char *E, char *G) {
  const size_t es = fc_dtype_size(dt), n = count * es, total = (size_t)w->nranks * n;
  Launch l = {K_REDUCE_SCATTER, {0}, {0}, count, dt, op, 0};
  for (int i = 0; i < w->nranks; i++) {
    fill_random(S + (size_t)i * total, (size_t)w->nranks * count, dt);
    CK(cudaSetDevice(w->r[i].dev));
    l.send[i] = w->r[i].recv + off; /* the larger buffer holds all chunks */
    l.recv[i] = inplace ? w->r[i].recv + off + (size_t)i * n : w->r[i].send + off;
    CK(cudaMemcpy(w->r[i].recv + off, S + (size_t)i * total, total, cudaMemcpyHostToDevice));
    if (!inplace) CK(cudaMemset(w->r[i].send, 0xa5, n + 64));
  }
  world_launch(w, &l);
  char what[160];
  snprintf(what, sizeof what, "oneshot reduce_scatter %d ranks %s %s count %zu off %zu%s seq %llu", w->nranks,
           fc_dtype_name(dt), fc_op_name(op), count, off, inplace ? " in place" : "", (unsigned long long)w->seq);
  if (!world_sync(w, what)) return;
  for (int i = 0; i < w->nranks; i++) {
    memcpy(E, S + (size_t)i * n, n); /* chunk i of every rank, in rank order as the kernel */
    for (int q = 1; q < w->nranks; q++) fc_host_reduce(E, E, S + (size_t)q * total + (size_t)i * n, count, dt, op);
    if (op == FLEXCOLL_AVG) fc_host_divide(E, count, dt, w->nranks);
    CK(cudaSetDevice(w->r[i].dev));
    CK(cudaMemcpy(G, l.recv[i], n, cudaMemcpyDeviceToHost));
    if (!check_same(what, E, G, count, dt, nan_loose(dt, op != FLEXCOLL_MAX && op != FLEXCOLL_MIN))) return;
    if (!inplace) check_guard(what, w->r[i].send, l.recv[i], n, n + 64);
  }
}

/* Broadcast of bytes from root at byte offset off (inplace: send = recv; non-roots pass NULL
 * as sendbuf when out of place). */
static void oneshot_bcast_case(World *w, size_t bytes, size_t off, int inplace, int root, char *S, char *G) {
  Launch l = {K_BROADCAST, {0}, {0}, bytes, FLEXCOLL_UINT8, FLEXCOLL_SUM, root};
  fill_random(S, bytes, FLEXCOLL_UINT8);
  for (int i = 0; i < w->nranks; i++) {
    CK(cudaSetDevice(w->r[i].dev));
    l.recv[i] = w->r[i].recv + off;
    l.send[i] = inplace ? l.recv[i] : i == root ? w->r[i].send + off : nullptr;
    CK(cudaMemset(w->r[i].recv, 0xa5, bytes + 64));
    if (i == root) CK(cudaMemcpy((char *)l.send[i], S, bytes, cudaMemcpyHostToDevice));
  }
  world_launch(w, &l);
  char what[128];
  snprintf(what, sizeof what, "oneshot broadcast %d ranks %zu bytes root %d off %zu%s seq %llu", w->nranks, bytes, root,
           off, inplace ? " in place" : "", (unsigned long long)w->seq);
  if (!world_sync(w, what)) return;
  for (int i = 0; i < w->nranks; i++) {
    CK(cudaSetDevice(w->r[i].dev));
    CK(cudaMemcpy(G, l.recv[i], bytes, cudaMemcpyDeviceToHost));
    if (!check_same(what, S, G, bytes, FLEXCOLL_UINT8, 0)) return;
    check_guard(what, w->r[i].recv, l.recv[i], bytes, bytes + 64);
  }
}

/* Every datatype and op at several sizes up to a full slot, interleaved with allgathers,
 * reduce_scatters and broadcasts on the same staging area and seq counter. */
static void test_oneshot(int nranks, const int *devs, const char *where, size_t ll_max) {
  const size_t slot = 256 << 10;
  World w;
  world_init(&w, nranks, devs, slot);
  w.ll_max = ll_max; /* LL for the sizes up to it, plain kernels above: both on one seq counter */
  char *S = (char *)malloc((size_t)nranks * nranks * slot), *E = (char *)malloc(slot), *G = (char *)malloc((size_t)nranks * slot);
  const int before = g_failures;
  for (int dt = 0; dt < NDT; dt++) {
    const size_t es = fc_dtype_size((flexcoll_datatype_t)dt);
    const size_t counts[] = {1, 7, 33, 1000, 4097, slot / es - 3, slot / es};
    for (int op = 0; op < NOP; op++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        const size_t off = (c & 1) ? es : 0, inplace = c == 3 || c == 6;
        oneshot_allreduce_case(&w, (flexcoll_datatype_t)dt, (flexcoll_op_t)op, counts[c], off, (int)inplace, S, E, G);
      }
    const size_t bytes[] = {1, 3, 16, 100, 1000 + (size_t)dt, 65536 + 7, slot};
    for (size_t k = 0; k < sizeof bytes / sizeof bytes[0]; k++)
      oneshot_allgather_case(&w, bytes[k], (size_t)(k * 3 % 17), (int)(k == 4 || k == 6), S, G);
    /* reduce_scatter chunks: all n chunks must fit the recv buffer (n slots) */
    const size_t chunks[] = {1, 7, 1000, 4097, slot / es};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++)
      oneshot_rs_case(&w, (flexcoll_datatype_t)dt, (flexcoll_op_t)(k % NOP), chunks[k], (k & 1) ? es : 0, (int)(k == 2 || k == 4),
                      S, E, G);
    for (size_t k = 0; k < sizeof bytes / sizeof bytes[0]; k++)
      oneshot_bcast_case(&w, bytes[k], (size_t)(k * 5 % 17), (int)(k == 1 || k == 5), (int)((k + (size_t)dt) % (size_t)nranks),
                         S, G);
  }
  printf("%s one-shot allreduce/allgather/reduce_scatter/broadcast, %d ranks on %s, LL up to %zu bytes (%llu calls)\n",
         g_failures == before ? "PASS" : "FAIL", nranks, where, ll_max, (unsigned long long)w.seq);
  free(S), free(E), free(G);
  world_free(&w);
}

/* Many calls queued back to back without host synchronisation, ranks skewed by random
 * delays, each call on its own buffers: checks the two-parity reuse of the staging area. */
struct Pipe {
  int nranks, ncalls;
  size_t slot;
  char *send[FC_ONESHOT_MAX_RANKS], *recv[FC_ONESHOT_MAX_RANKS]; /* device: ncalls slots / ncalls x nranks slots */
  char *hsend;                                                    /* host: [call][rank] slots */
  Launch plan[64];
};

static void pipe_plan(Pipe *p, World *w) {
  for (int k = 0; k < p->ncalls; k++) {
    Launch *l = &p->plan[k];
    l->kind = k % 3 == 2 ? K_ALLGATHER : K_ALLREDUCE;
    l->dt = l->kind == K_ALLGATHER ? FLEXCOLL_UINT8 : (flexcoll_datatype_t)(k % NDT);
    l->op = (flexcoll_op_t)((k / 3) % NOP);
    const size_t es = fc_dtype_size(l->dt);
    l->count = 1 + (size_t)(rnd() % (p->slot / es));
    for (int i = 0; i < p->nranks; i++) {
      char *h = p->hsend + ((size_t)k * p->nranks + i) * p->slot;
      fill_random(h, l->count, l->dt);
      l->send[i] = p->send[i] + (size_t)k * p->slot;
      l->recv[i] = p->recv[i] + (size_t)k * p->nranks * p->slot;
      CK(cudaSetDevice(w->r[i].dev));
      CK(cudaMemcpy((char *)l->send[i], h, l->count * es, cudaMemcpyHostToDevice));
    }
  }
}

static void pipe_verify(Pipe *p, World *w, char *E, char *G) {
  for (int k = 0; k < p->ncalls; k++) {
    const Launch *l = &p->plan[k];
    const size_t es = fc_dtype_size(l->dt), n = l->count * es;
    const char *h = p->hsend + (size_t)k * p->nranks * p->slot;
    if (l->kind == K_ALLGATHER)
      for (int i = 0; i < p->nranks; i++) memcpy(E + i * n, h + i * p->slot, n);
    else {
      memcpy(E, h, n);
      for (int i = 1; i < p->nranks; i++) fc_host_reduce(E, E, h + i * p->slot, l->count, l->dt, l->op);
      if (l->op == FLEXCOLL_AVG) fc_host_divide(E, l->count, l->dt, p->nranks);
    }
    const size_t total = l->kind == K_ALLGATHER ? n * p->nranks : n;
    char what[128];
    snprintf(what, sizeof what, "pipelined call %d (%s %s %s count %zu)", k, l->kind == K_ALLGATHER ? "allgather" : "allreduce",
             fc_dtype_name(l->dt), fc_op_name(l->op), l->count);
    for (int i = 0; i < p->nranks; i++) {
      CK(cudaSetDevice(w->r[i].dev));
      CK(cudaMemcpy(G, l->recv[i], total, cudaMemcpyDeviceToHost));
      const int loose = l->kind != K_ALLGATHER && nan_loose(l->dt, l->op != FLEXCOLL_MAX && l->op != FLEXCOLL_MIN);
      if (!check_same(what, E, G, total / es, l->dt, loose)) return;
    }
  }
}

static void test_oneshot_pipelined(int nranks, const int *devs, const char *where) {
  Pipe p;
  World w;
  memset(&p, 0, sizeof p);
  p.nranks = nranks, p.ncalls = 48, p.slot = 64 << 10;
  world_init(&w, nranks, devs, p.slot);
  w.ll_max = 16 << 10; /* LL and plain calls interleaved */
  p.hsend = (char *)malloc((size_t)p.ncalls * nranks * p.slot);
  char *E = (char *)malloc((size_t)nranks * p.slot), *G = (char *)malloc((size_t)nranks * p.slot);
  for (int i = 0; i < nranks; i++) {
    CK(cudaSetDevice(devs[i]));
    CK(cudaMalloc(&p.send[i], (size_t)p.ncalls * p.slot));
    CK(cudaMalloc(&p.recv[i], (size_t)p.ncalls * nranks * p.slot));
  }
  const int before = g_failures;
  for (int round = 0; round < 4; round++) {
    pipe_plan(&p, &w);
    for (int i = 0; i < nranks; i++) {
      CK(cudaSetDevice(devs[i]));
      CK(cudaDeviceSynchronize());
    }
    for (int k = 0; k < p.ncalls; k++) {
      w.seq++;
      for (int i = 0; i < nranks; i++) {
        const fc_oneshot_args_t a = world_args(&w, i);
        const Launch *l = &p.plan[k];
        CK(cudaSetDevice(devs[i]));
        if ((rnd() & 3) == 0) spin_kernel<<<1, 1, 0, w.r[i].stream>>>(rnd() % 50000);
        launch_rank(&a, l, i, w.r[i].stream);
      }
    }
    if (world_sync(&w, "pipelined")) pipe_verify(&p, &w, E, G);
  }
  printf("%s one-shot pipelined (%d calls queued, skewed ranks), %d ranks on %s\n",
         g_failures == before ? "PASS" : "FAIL", 4 * p.ncalls, nranks, where);
  for (int i = 0; i < nranks; i++) {
    CK(cudaSetDevice(devs[i]));
    CK(cudaFree(p.send[i]));
    CK(cudaFree(p.recv[i]));
  }
  free(p.hsend), free(E), free(G);
  world_free(&w);
}

/* One rank of two whose peer never arrives: *error becomes 1 and the kernel returns; its own
 * data and flags did reach the (silent) peer's staging area. */
static void test_timeout(void) {
  const int before = g_failures, devs[2] = {0, 0};
  World w;
  world_init(&w, 2, devs, 4096);
  for (int coll = 0; coll < 4; coll++) {
    w.seq++;
    w.ll_max = coll >= 2 ? kLLCap : 0; /* plain kernels, then LL */
    fc_oneshot_args_t a = world_args(&w, 0);
    a.timeout_ns = 1000000; /* 1 ms */
    *w.r[0].error = 0;
    CK(cudaMemset(w.r[0].send, 0x5a, 4096));
    CK(cudaDeviceSynchronize()); /* the memset ran on the legacy stream */
    const double t0 = now_s();
    if (coll & 1) CK(fc_kernel_oneshot_allgather(&a, w.r[0].send, w.r[0].recv, 4000, w.r[0].stream));
    else CK(fc_kernel_oneshot_allreduce(&a, w.r[0].send, w.r[0].recv, 1000, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, w.r[0].stream));
    CK(cudaStreamSynchronize(w.r[0].stream));
    const double dt = now_s() - t0;
    if (*(volatile int *)w.r[0].error != 1) fail("timeout: error not set");
    if (dt > 2.0) fail("timeout: took %.3f s", dt);
    /* A timed-out call still advances the epoch: every block reaches its end. */
    const fc_dev_epoch_t e = world_epoch(&w, 0);
    if (e.seq != w.seq || e.done != 0) fail("timeout: epoch seq %llu done %u after call %llu", e.seq, e.done,
                                            (unsigned long long)w.seq);
    const char *name = (coll & 1) ? "allgather" : "allreduce";
    if (coll >= 2) {
      /* LL: the lines of 8 data bytes and two flags reached the peer's LL area, slot 0. */
      uint32_t lines[4000 / 8 * 4];
      const int par = (int)(w.seq & 1);
      CK(cudaMemcpy(lines, w.r[1].ll + (size_t)(par * 2 + 0) * 2 * kLLCap, sizeof lines, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i += 2)
        if (lines[i + 1] != (uint32_t)w.seq || lines[i] != 0x5a5a5a5au) {
          fail("timeout: LL line %zu not posted to the peer", i / 4);
          break;
        }
      printf("  timeout LL %s returned after %.2f ms\n", name, dt * 1e3);
      continue;
    }
    uint64_t flags[2 * 2 * FC_MAX_BLOCKS];
    char data[4000];
    CK(cudaMemcpy(flags, w.r[1].flags, sizeof flags, cudaMemcpyDeviceToHost));
    const int par = (int)(w.seq & 1);
    /* Both calls move at most 4000 bytes: a grid of one block (kernels.h), so one flag. */
    const int nblocks = (int)((4000 + FC_ONESHOT_BLOCK_BYTES - 1) / FC_ONESHOT_BLOCK_BYTES);
    for (int b = 0; b < nblocks; b++)
      if (flags[(par * 2 + 0) * FC_MAX_BLOCKS + b] != w.seq) { fail("timeout: flag %d not posted to the peer", b); break; }
    CK(cudaMemcpy(data, w.r[1].stage + (size_t)(par * 2 + 0) * w.slot, sizeof data, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sizeof data; i++)
      if ((unsigned char)data[i] != 0x5a) { fail("timeout: data not posted to the peer"); break; }
    printf("  timeout %s returned after %.2f ms\n", name, dt * 1e3);
  }
  if (fc_kernel_oneshot_allreduce(NULL, w.r[0].send, w.r[0].recv, 0, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0) != 0)
    fail("oneshot count 0 must launch nothing and succeed");
  fc_oneshot_args_t a = world_args(&w, 0);
  if (fc_kernel_oneshot_allgather(&a, w.r[0].send, w.r[0].recv, 4097, 0) != cudaErrorInvalidValue)
    fail("oneshot: bytes > slot_bytes accepted");
  printf("%s one-shot timeout (error set, kernel returns) and argument checks\n",
         g_failures == before ? "PASS" : "FAIL");
  world_free(&w);
}

/* The pipelined kernels: a rank whose peer never arrives times out in its first wait, one
 * whose peer stops sending in a later one (error set, the kernel returns); calls they cannot
 * take are refused. */
static void test_pipe_timeout(void) {
  const int before = g_failures, devs[2] = {0, 0};
  const size_t slot = (size_t)FC_MAX_BLOCKS * (4 / 2) * FC_PIPE_MIN_STEP_BYTES;
  World w;
  world_init(&w, 2, devs, slot);
  /* Every collective, both block sizes, both sub-slot counts, teams of halves and uneven. */
  const unsigned threads[4] = {1024, 512, 512, 1024}, subslots[4] = {4, 2, 4, 2}, push[4] = {512, 192, 256, 384};
  uint64_t base = 0; /* rank 0's counter base: the steps of its calls so far */
  for (int coll = 0; coll < 4; coll++) {
    w.seq++;
    fc_oneshot_args_t a = world_args(&w, 0);
    a.pipe_blocks = FC_MAX_BLOCKS, a.pipe_threads = threads[coll], a.pipe_subslots = subslots[coll];
    a.pipe_push_threads = push[coll];
    a.timeout_ns = 1000000; /* 1 ms */
    *w.r[0].error = 0;
    const double t0 = now_s();
    CK(fc_kernel_pipe_collective(&a, (fc_pipe_coll_t)coll, w.r[0].send, w.r[0].recv, slot / 2, FLEXCOLL_FLOAT32,
                                 FLEXCOLL_SUM, 0, w.r[0].stream));
    CK(cudaStreamSynchronize(w.r[0].stream));
    const double dt = now_s() - t0;
    if (*(volatile int *)w.r[0].error != 1) fail("pipelined %d: error not set", coll);
    if (dt > 2.0) fail("pipelined %d: took %.3f s", coll, dt);
    /* Timed out in its first wait, it still advances the epoch by its steps. */
    base += fc_pipe_steps(slot / 2, slot, FC_MAX_BLOCKS, subslots[coll]);
    const fc_dev_epoch_t e = world_epoch(&w, 0);
    if (e.seq != w.seq || e.pipe_base != base || e.done != 0)
      fail("pipelined %d: epoch seq %llu pipe_base %llu done %u, not %llu and %llu", coll, e.seq, e.pipe_base, e.done,
           (unsigned long long)w.seq, (unsigned long long)base);
  }
  /* The peer arrives but moves a smaller message (2 blocks: 8 KiB is one step per block,
   * against our FC_PIPE_MIN_STEPS of 128 KiB): we time out waiting for its step 1 (a ready
   * counter, past the opening handshake); it finishes, since we drain its one step. */
  {
    w.seq++;
    /* Rank 1 has not run the calls above: both ranks take this seq, from counter base 0. */
    world_set_epoch(&w, 0, w.seq, 0);
    world_set_epoch(&w, 1, w.seq, 0);
    fc_oneshot_args_t a0 = world_args(&w, 0), a1 = world_args(&w, 1);
    a0.pipe_blocks = a1.pipe_blocks = 2, a0.pipe_threads = a1.pipe_threads = 512;
    a0.pipe_subslots = a1.pipe_subslots = 4;
    a0.pipe_push_threads = 256, a1.pipe_push_threads = 128;
    a0.timeout_ns = 100000000; /* 0.1 s: rank 1 surely starts within it */
    *w.r[0].error = 0, *w.r[1].error = 0;
    const double t0 = now_s();
    CK(fc_kernel_pipe_collective(&a0, FC_PIPE_ALLREDUCE, w.r[0].send, w.r[0].recv, slot, FLEXCOLL_FLOAT32, FLEXCOLL_SUM,
                                 0, w.r[0].stream));
    CK(fc_kernel_pipe_collective(&a1, FC_PIPE_ALLREDUCE, w.r[1].send, w.r[1].recv, 2 * FC_PIPE_MIN_STEP_BYTES,
                                 FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0, w.r[1].stream));
    CK(cudaStreamSynchronize(w.r[0].stream));
    CK(cudaStreamSynchronize(w.r[1].stream));
    const double dt = now_s() - t0;
    if (*(volatile int *)w.r[0].error != 1) fail("pipelined, peer short of steps: error not set");
    if (*(volatile int *)w.r[1].error != 0) fail("pipelined, the shorter peer: error set");
    if (dt > 2.0) fail("pipelined, peer short of steps: took %.3f s", dt);
  }
  fc_oneshot_args_t a = world_args(&w, 0);
  a.pipe_blocks = FC_MAX_BLOCKS, a.pipe_threads = 1024, a.pipe_subslots = 4, a.pipe_push_threads = 512;
  a.slot_bytes = (size_t)FC_MAX_BLOCKS * FC_PIPE_MIN_STEP_BYTES - 16; /* room below FC_PIPE_MIN_STEP_BYTES */
  if (fc_kernel_pipe_collective(&a, FC_PIPE_ALLREDUCE, w.r[0].send, w.r[0].recv, 4096, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0,
                                w.r[0].stream) != cudaErrorInvalidValue)
    fail("pipelined: a slot too small for its steps accepted");
  a.slot_bytes = slot;
  const unsigned bad_push[3] = {0, 1000, 1024};
  for (int i = 0; i < 3; i++) {
    a.pipe_push_threads = bad_push[i];
    if (fc_kernel_pipe_collective(&a, FC_PIPE_ALLREDUCE, w.r[0].send, w.r[0].recv, 4096, FLEXCOLL_FLOAT32, FLEXCOLL_SUM,
                                  0, w.r[0].stream) != cudaErrorInvalidValue)
      fail("pipelined: %u pushing threads of 1024 accepted", bad_push[i]);
  }
  a.pipe_push_threads = 512;
  a.nranks = 1;
  if (fc_kernel_pipe_collective(&a, FC_PIPE_ALLGATHER, w.r[0].send, w.r[0].recv, 4096, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0,
                                w.r[0].stream) != cudaErrorInvalidValue)
    fail("pipelined: 1 rank accepted");
  a.nranks = 2;
  if (fc_kernel_pipe_collective(&a, FC_PIPE_ALLREDUCE, w.r[0].send, w.r[0].recv, 4098, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0,
                                w.r[0].stream) != cudaErrorInvalidValue)
    fail("pipelined: bytes not a multiple of the element accepted");
  printf("%s pipelined timeout (error set, kernel returns) and argument checks\n", g_failures == before ? "PASS" : "FAIL");
  world_free(&w);
}

/* ---------------------------------------------------------------- timings (information only) */

static double time_events(cudaEvent_t e0, cudaEvent_t e1) {
  float ms = 0;
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return ms * 1e-3;
}

static void bench_reduce(void) {
  const size_t bytes = 256 << 20, count = bytes / 4;
  const int iters = 20;
  char *a, *b, *d;
  cudaEvent_t e0, e1;
  CK(cudaSetDevice(0));
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMalloc(&d, bytes));
  CK(cudaMemset(a, 0, bytes));
  CK(cudaMemset(b, 0, bytes));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(fc_kernel_reduce(d, a, b, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0)); /* warm-up */
  CK(cudaEventRecord(e0, 0));
  for (int i = 0; i < iters; i++) CK(fc_kernel_reduce(d, a, b, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0));
  CK(cudaEventRecord(e1, 0));
  const double tr = time_events(e0, e1) / iters;
  CK(cudaEventRecord(e0, 0));
  for (int i = 0; i < iters; i++) CK(fc_kernel_copy(d, a, bytes, 0));
  CK(cudaEventRecord(e1, 0));
  const double tc = time_events(e0, e1) / iters;
  printf("  time: reduce float32 sum 256 MiB: %.3f ms, %.0f GB/s moved; copy 256 MiB: %.3f ms, %.0f GB/s moved\n",
         tr * 1e3, 3 * bytes / tr * 1e-9, tc * 1e3, 2 * bytes / tc * 1e-9);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(d));
}

/* Back-to-back one-shot allreduces (float32 sum), queued without host synchronisation. */
static void bench_oneshot(int nranks, const int *devs, const char *where) {
  World w;
  world_init(&w, nranks, devs, 256 << 10);
  const size_t sizes[] = {8, 8 << 10, 64 << 10, 8, 8 << 10, 64 << 10, 256 << 10};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    w.ll_max = s < 3 ? 0 : kLLCap; /* plain kernels, then LL */
    const int iters = 1000;
    double t0 = 0;
    for (int it = -10; it < iters; it++) {
      if (it == 0) world_sync(&w, "bench"), t0 = now_s();
      w.seq++;
      for (int i = 0; i < nranks; i++) {
        const fc_oneshot_args_t a = world_args(&w, i);
        CK(cudaSetDevice(w.r[i].dev));
        CK(fc_kernel_oneshot_allreduce(&a, w.r[i].send, w.r[i].recv, (sizes[s] + 3) / 4, FLEXCOLL_FLOAT32, FLEXCOLL_SUM,
                                       w.r[i].stream));
      }
    }
    world_sync(&w, "bench");
    printf("  time: one-shot allreduce %zu B (%s), %d ranks on %s: %.2f us per call\n", sizes[s],
           sizes[s] <= w.ll_max ? "LL" : "plain", nranks, where, (now_s() - t0) / iters * 1e6);
  }
  world_free(&w);
}

/* ---------------------------------------------------------------- main */

/* Peer access among the first n GPUs; the number usable for one-shot (1 if some pair cannot). */
static int enable_peers(int n) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      int can = 0;
      if (i == j) continue;
      CK(cudaDeviceCanAccessPeer(&can, i, j));
      if (!can) {
        printf("  GPU %d cannot access GPU %d: multi-GPU one-shot tests skipped\n", i, j);
        return 1;
      }
      CK(cudaSetDevice(i));
      const cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else CK(e);
    }
  return n;
}

static void run_oneshot_tests(int ngpu) {
  int devs[FC_ONESHOT_MAX_RANKS];
  const int ng = enable_peers(ngpu < FC_ONESHOT_MAX_RANKS ? ngpu : FC_ONESHOT_MAX_RANKS);
  char where[64];
  if (ng >= 2) {
    for (int i = 0; i < 2; i++) devs[i] = i;
    test_oneshot(2, devs, "2 GPUs", 0);
    test_oneshot(2, devs, "2 GPUs", kLLCap);
    test_oneshot_pipelined(2, devs, "2 GPUs");
  } else {
    printf("  fewer than 2 GPUs with peer access: 2-GPU one-shot test skipped\n");
  }
  /* More ranks than GPUs share GPUs (their kernels run concurrently on separate streams). */
  static const int rank_counts[] = {1, 3, 4, 8};
  for (size_t k = 0; k < sizeof rank_counts / sizeof rank_counts[0]; k++) {
    const int n = rank_counts[k];
    for (int i = 0; i < n; i++) devs[i] = i % ng;
    snprintf(where, sizeof where, "%d GPU%s", ng < n ? ng : n, (ng < n ? ng : n) > 1 ? "s" : "");
    test_oneshot(n, devs, where, 0);
    test_oneshot(n, devs, where, kLLCap);
    if (n > 2) test_oneshot_pipelined(n, devs, where);
  }
  for (int i = 0; i < 2; i++) devs[i] = i % ng;
  bench_oneshot(2, devs, ng >= 2 ? "2 GPUs" : "1 GPU");
}

int main(void) {
  int ngpu = 0;
  cudaError_t probe = cudaGetDeviceCount(&ngpu);
  if (probe != cudaSuccess || ngpu == 0) {
    /* No driver reads as cudaErrorInsufficientDriver: name the error, but say what it means here. */
    printf("SKIP: no GPU (%s)\n", probe != cudaSuccess ? cudaGetErrorName(probe) : "0 devices");
    return 77;
  }
  fc_test_gpu_serialize("[test_kernels]");
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%d GPU(s); GPU 0: %s, %d SMs, sm_%d%d\n", ngpu, prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  CK(cudaSetDevice(0));
  DevBufs db;
  db.bytes = kBig * 8 + 64;
  CK(cudaMalloc(&db.a, db.bytes));
  CK(cudaMalloc(&db.b, db.bytes));
  CK(cudaMalloc(&db.d, db.bytes));
  char *A = (char *)malloc(db.bytes), *B = (char *)malloc(db.bytes), *E = (char *)malloc(db.bytes),
       *G = (char *)malloc(db.bytes);
  test_args(db);
  test_reduce(db, A, B, E, G);
  test_divide(db, A, E, G);
  test_copy(db, A, G);
  CK(cudaFree(db.a));
  CK(cudaFree(db.b));
  CK(cudaFree(db.d));
  free(A), free(B), free(E), free(G);
  test_timeout();
  test_pipe_timeout();
  run_oneshot_tests(ngpu);
  bench_reduce();
  if (g_failures) {
    printf("FAILED: %d failure(s) in %d checks\n", g_failures, g_checks);
    return 1;
  }
  printf("ALL PASSED (%d checks)\n", g_checks);
  return 0;
}
