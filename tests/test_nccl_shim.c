/*
 * test_nccl_shim.c — flexcoll's NCCL shim (libnccl.so.2) through NCCL's own API, as a program
 * written for NCCL uses it: compiled against shim/nccl.h, linked with -lnccl.
 *
 * Host part (every machine; a child process that hides the GPUs, so its ranks are host ranks):
 *   - 2 and 3 ranks from ncclGetUniqueId + ncclCommInitRank, one thread per rank; every
 *     collective (AllReduce in all 10 datatypes x 5 operators, in place too, Reduce,
 *     ReduceScatter, AllGather, Broadcast, Bcast, AlltoAll, in place too, Send/Recv between all
 *     pairs inside a group) on fresh random data against a reference, first driven one thread
 *     per rank outside groups, then all ranks from one thread inside ncclGroupStart/End;
 *   - communicators initialised inside a group from one thread (non-blocking config), with a
 *     collective queued on them in the same group; ncclCommInitAll(comms, 2, NULL);
 *     ncclCommInitRankScalable; ncclCommAbort;
 *   - ncclCommSplit of 2 and 3 ranks (one thread per rank): by parity with reversed keys, and with
 *     NCCL_SPLIT_NOCOLOR for rank 0 and a config; ranks, counts and an AllReduce on each new
 *     communicator checked; refused inside a group;
 *   - the calls flexcoll cannot do return ncclInvalidUsage with a message in ncclGetLastError,
 *     bad arguments return ncclInvalidArgument, the no-op calls succeed (a default window is a
 *     hint; a symmetric one on host memory is refused).
 * GPU part (a child process, only with 2 GPUs or more; printed as skipped otherwise): the same
 * collectives on device memory over ncclCommInitAll(comms, 2, NULL), from one thread in a group
 * and from one thread per GPU; ncclMemAlloc / ncclMemFree; symmetric windows
 * (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC, in a group) holding a 16 MB AllReduce.
 * The parent never initialises CUDA: it counts the GPUs in a forked child.
 *
 * Exit status 0: pass, 1: fail.  FC_TEST_SEED=0x... reproduces a run (the seed is printed).
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "nccl.h"
#include "gpu_serial.h"

#define MAXR 3
#define CHILD_TIMEOUT_S 600

static int failures;
static uint64_t seed;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      failures++;                                                              \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, " (seed 0x%llx)\n", (unsigned long long)seed);         \
    }                                                                          \
  } while (0)

/* An NCCL call that must succeed. */
#define NCCL_OK(call)                                                                            \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    CHECK(r_ == ncclSuccess, "%s returned %d (%s): %s", #call, (int)r_, ncclGetErrorString(r_), \
          ncclGetLastError(NULL));                                                               \
  } while (0)

/* An NCCL call that must fail with `want` and leave a message. */
#define NCCL_FAILS(want, call)                                                                      \
  do {                                                                                              \
    ncclResult_t r_ = (call);                                                                       \
    const char *m_ = ncclGetLastError(NULL);                                                        \
    CHECK(r_ == (want), "%s returned %d, expected %d (%s)", #call, (int)r_, (int)(want), m_);       \
    CHECK(m_ && *m_, "%s: ncclGetLastError is empty", #call);                                      \
  } while (0)

/* ---- random data, datatypes ------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ULL;
}

static size_t dt_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static int dt_unsigned(ncclDataType_t t) { return t == ncclUint8 || t == ncclUint32 || t == ncclUint64; }
static int dt_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

static const char *dt_name(ncclDataType_t t) {
  static const char *names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                                "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
  return (unsigned)t < ncclNumTypes ? names[t] : "?";
}

static const char *op_name(ncclRedOp_t op) {
  static const char *names[] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < ncclNumOps ? names[op] : "?";
}

static float bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

/* v must be exactly representable (the inputs are small integers). */
static uint16_t double_to_half(double v) {
  if (v == 0) return 0;
  int ex;
  double m = frexp(fabs(v), &ex); /* |v| = m * 2^ex, m in [0.5, 1) */
  uint16_t bits = (uint16_t)(((ex - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024));
  return v < 0 ? (uint16_t)(bits | 0x8000) : bits;
}

static double dt_load(ncclDataType_t t, const void *buf, size_t i) {
  switch (t) {
    case ncclInt8: return ((const int8_t *)buf)[i];
    case ncclUint8: return ((const uint8_t *)buf)[i];
    case ncclInt32: return ((const int32_t *)buf)[i];
    case ncclUint32: return ((const uint32_t *)buf)[i];
    case ncclInt64: return (double)((const int64_t *)buf)[i];
    case ncclUint64: return (double)((const uint64_t *)buf)[i];
    case ncclFloat16: return half_to_double(((const uint16_t *)buf)[i]);
    case ncclBfloat16: return bits_to_float((uint32_t)((const uint16_t *)buf)[i] << 16);
    case ncclFloat32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
  }
}

static void dt_store(ncclDataType_t t, void *buf, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)buf)[i] = double_to_half(v); break;
    case ncclBfloat16: ((uint16_t *)buf)[i] = (uint16_t)(float_to_bits((float)v) >> 16); break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
  }
}

/* A value whose reduction over up to MAXR ranks is exact in every datatype (AVG aside). */
static double gen_value(ncclDataType_t t, ncclRedOp_t op, uint64_t *rng) {
  uint64_t x = rng_next(rng);
  int uns = dt_unsigned(t);
  switch (op) {
    case ncclProd: return uns ? (double)(1 + x % 3) : (double)((int)(x % 3) + 1) * ((x >> 8) & 1 ? -1 : 1);
    case ncclMax:
    case ncclMin: return uns ? (double)(x % 201) : (double)((int)(x % 201) - 100);
    default: return uns ? (double)(x % 41) : (double)((int)(x % 41) - 20);
  }
}

static double reduce_ref(ncclRedOp_t op, const double *v, int n, ncclDataType_t t) {
  double acc = v[0];
  for (int r = 1; r < n; r++) {
    if (op == ncclSum || op == ncclAvg) acc += v[r];
    else if (op == ncclProd) acc *= v[r];
    else if (op == ncclMax) acc = v[r] > acc ? v[r] : acc;
    else acc = v[r] < acc ? v[r] : acc;
  }
  if (op == ncclAvg) acc = dt_float(t) ? acc / n : trunc(acc / n); /* integers: C division */
  return acc;
}

static double tolerance(ncclDataType_t t, ncclRedOp_t op) {
  if (op != ncclAvg || !dt_float(t)) return 0;
  return t == ncclFloat64 ? 1e-12 : t == ncclFloat32 ? 1e-6 : 1e-2;
}

/* ---- the world: communicators and how their calls are driven ----------------------------------- */

typedef struct {
  int nranks;
  int gpu;     /* buffers in device memory of device r, one stream per rank */
  int threads; /* 1: one thread per rank, outside groups; 0: all ranks from one thread in a group */
  ncclComm_t comms[MAXR];
  cudaStream_t streams[MAXR];
  const char *label;
} world_t;

typedef enum { C_ALLREDUCE, C_ALLREDUCE_INPLACE, C_REDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_BCAST,
               C_ALLTOALL, C_ALLTOALL_INPLACE, C_SENDRECV, C_GATHER, C_SCATTER } coll_t;
static const char *coll_names[] = {"AllReduce", "AllReduce(in place)", "Reduce", "ReduceScatter", "AllGather",
                                   "Broadcast", "Bcast", "AlltoAll", "AlltoAll(in place)", "Send/Recv", "Gather",
                                   "Scatter"};

typedef struct {
  coll_t coll;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;
  size_t count;
} case_t;

typedef struct {
  const world_t *w;
  case_t c;
  size_t send_n[MAXR], recv_n[MAXR]; /* elements */
  void *in[MAXR];                     /* host copy of each rank's input */
  void *expect[MAXR];                 /* data movement: the expected bytes */
  double *ref[MAXR];                  /* reductions: the expected values */
  void *sbuf[MAXR], *rbuf[MAXR];      /* the buffers the calls get (host or device) */
  void *out[MAXR];                    /* host copy of each rank's result */
  ncclResult_t res[MAXR];
} job_t;

static int is_reduction(coll_t c) {
  return c == C_ALLREDUCE || c == C_ALLREDUCE_INPLACE || c == C_REDUCE || c == C_REDUCE_SCATTER;
}

/* Send/Recv between all pairs (self included): count of the message from s to d; one is empty. */
static size_t p2p_count(const case_t *c, int n, int s, int d) {
  if (s == 0 && d == n - 1 && n > 1) return 0;
  return c->count + 5 * (size_t)s + 3 * (size_t)d;
}

static size_t p2p_offset(const case_t *c, int n, int me, int other, int sending) {
  size_t off = 0;
  for (int k = 0; k < other; k++) off += sending ? p2p_count(c, n, me, k) : p2p_count(c, n, k, me);
  return off;
}

static void sizes(job_t *j) {
  int n = j->w->nranks;
  for (int r = 0; r < n; r++) {
    size_t cnt = j->c.count, s = cnt, v = cnt;
    if (j->c.coll == C_REDUCE_SCATTER) s = cnt * n;
    if (j->c.coll == C_ALLGATHER) v = cnt * n;
    if (j->c.coll == C_ALLTOALL || j->c.coll == C_ALLTOALL_INPLACE) s = v = cnt * n;
    if (j->c.coll == C_GATHER) v = r == j->c.root ? cnt * n : 0; /* recvbuff: the root's only */
    if (j->c.coll == C_SCATTER) s = cnt * n;
    if (j->c.coll == C_SENDRECV) s = p2p_offset(&j->c, n, r, n, 1), v = p2p_offset(&j->c, n, r, n, 0);
    j->send_n[r] = s;
    j->recv_n[r] = v;
  }
}

/* Random inputs: small exact values for reductions, random bytes for data movement. */
static void make_inputs(job_t *j, uint64_t *rng) {
  size_t es = dt_size(j->c.dt);
  for (int r = 0; r < j->w->nranks; r++) {
    j->in[r] = malloc(j->send_n[r] * es + 1);
    for (size_t i = 0; i < j->send_n[r]; i++) {
      if (is_reduction(j->c.coll)) dt_store(j->c.dt, j->in[r], i, gen_value(j->c.dt, j->c.op, rng));
      else for (size_t b = 0; b < es; b++) ((uint8_t *)j->in[r])[i * es + b] = (uint8_t)rng_next(rng);
    }
  }
}

static void reference_reduction(job_t *j) {
  int n = j->w->nranks;
  double v[MAXR];
  for (int r = 0; r < n; r++) {
    j->ref[r] = calloc(j->recv_n[r] + 1, sizeof(double));
    size_t base = j->c.coll == C_REDUCE_SCATTER ? (size_t)r * j->c.count : 0;
    for (size_t i = 0; i < j->recv_n[r]; i++) {
      for (int q = 0; q < n; q++) v[q] = dt_load(j->c.dt, j->in[q], base + i);
      j->ref[r][i] = reduce_ref(j->c.op, v, n, j->c.dt);
    }
  }
}

static void reference_movement(job_t *j) {
  int n = j->w->nranks;
  size_t es = dt_size(j->c.dt), cnt = j->c.count;
  for (int r = 0; r < n; r++) {
    uint8_t *e = j->expect[r] = malloc(j->recv_n[r] * es + 1);
    for (int q = 0; q < n; q++) {
      const uint8_t *src = j->in[q];
      switch (j->c.coll) {
        case C_ALLGATHER: memcpy(e + q * cnt * es, src, cnt * es); break;
        case C_ALLTOALL:
        case C_ALLTOALL_INPLACE: memcpy(e + q * cnt * es, src + r * cnt * es, cnt * es); break;
        case C_GATHER: if (r == j->c.root) memcpy(e + q * cnt * es, src, cnt * es); break;
        case C_SCATTER: if (q == j->c.root) memcpy(e, src + r * cnt * es, cnt * es); break;
        case C_SENDRECV:
          memcpy(e + p2p_offset(&j->c, n, r, q, 0) * es, src + p2p_offset(&j->c, n, q, r, 1) * es,
                 p2p_count(&j->c, n, q, r) * es);
          break;
        default: if (q == j->c.root) memcpy(e, src, cnt * es); break; /* Broadcast, Bcast */
      }
    }
  }
}

/* ---- buffers ----------------------------------------------------------------------------------- */

static void *buf_alloc(const world_t *w, int r, size_t bytes) {
  void *p = NULL;
  if (!w->gpu) return malloc(bytes + 1);
  cudaSetDevice(r);
  CHECK(cudaMalloc(&p, bytes + 1) == cudaSuccess, "cudaMalloc(%zu) on device %d", bytes, r);
  return p;
}

static void buf_free(const world_t *w, void *p) {
  if (w->gpu) cudaFree(p);
  else free(p);
}

static void buf_put(const world_t *w, int r, void *dst, const void *src, size_t bytes) {
  if (!w->gpu) { memcpy(dst, src, bytes); return; }
  cudaSetDevice(r);
  CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy to device %d", r);
}

static void buf_poison(const world_t *w, int r, void *dst, size_t bytes) {
  if (!w->gpu) { memset(dst, 0xA5, bytes); return; }
  cudaSetDevice(r);
  cudaMemset(dst, 0xA5, bytes);
}

static void buf_get(const world_t *w, int r, void *dst, const void *src, size_t bytes) {
  if (!w->gpu) { memcpy(dst, src, bytes); return; }
  cudaSetDevice(r);
  CHECK(cudaStreamSynchronize(w->streams[r]) == cudaSuccess, "stream of rank %d: %s", r,
        cudaGetErrorString(cudaGetLastError()));
  CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy from device %d", r);
}

static void job_prepare(job_t *j, const world_t *w, const case_t *c, uint64_t *rng) {
  memset(j, 0, sizeof *j);
  j->w = w;
  j->c = *c;
  sizes(j);
  make_inputs(j, rng);
  if (is_reduction(c->coll)) reference_reduction(j);
  else reference_movement(j);
  size_t es = dt_size(c->dt);
  for (int r = 0; r < w->nranks; r++) {
    int in_place = c->coll == C_ALLREDUCE_INPLACE || c->coll == C_BCAST || c->coll == C_ALLTOALL_INPLACE;
    j->sbuf[r] = in_place ? NULL : buf_alloc(w, r, j->send_n[r] * es);
    j->rbuf[r] = buf_alloc(w, r, j->recv_n[r] * es);
    buf_poison(w, r, j->rbuf[r], j->recv_n[r] * es);
    buf_put(w, r, in_place ? j->rbuf[r] : j->sbuf[r], j->in[r], j->send_n[r] * es);
    j->out[r] = malloc(j->recv_n[r] * es + 1);
  }
}

static void job_free(job_t *j) {
  for (int r = 0; r < j->w->nranks; r++) {
    if (j->sbuf[r]) buf_free(j->w, j->sbuf[r]);
    buf_free(j->w, j->rbuf[r]);
    free(j->in[r]), free(j->expect[r]), free(j->ref[r]), free(j->out[r]);
  }
}

/* ---- issuing and checking ---------------------------------------------------------------------- */

static ncclResult_t issue_p2p(job_t *j, int r) {
  const case_t *c = &j->c;
  int n = j->w->nranks;
  size_t es = dt_size(c->dt);
  ncclComm_t comm = j->w->comms[r];
  cudaStream_t st = j->w->streams[r];
  /* A group of its own (nested inside the caller's when all ranks run from one thread). */
  ncclResult_t res = ncclGroupStart();
  for (int k = 0; k < n && res == ncclSuccess; k++) {
    int to = (r + k) % n, from = (r - k + n) % n;
    res = ncclSend((const char *)j->sbuf[r] + p2p_offset(c, n, r, to, 1) * es, p2p_count(c, n, r, to), c->dt, to, comm, st);
    if (res == ncclSuccess)
      res = ncclRecv((char *)j->rbuf[r] + p2p_offset(c, n, r, from, 0) * es, p2p_count(c, n, from, r), c->dt, from,
                     comm, st);
  }
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

static ncclResult_t issue(job_t *j, int r) {
  const case_t *c = &j->c;
  ncclComm_t comm = j->w->comms[r];
  cudaStream_t st = j->w->streams[r];
  void *s = j->sbuf[r], *v = j->rbuf[r];
  switch (c->coll) {
    case C_ALLREDUCE: return ncclAllReduce(s, v, c->count, c->dt, c->op, comm, st);
    case C_ALLREDUCE_INPLACE: return ncclAllReduce(v, v, c->count, c->dt, c->op, comm, st);
    case C_REDUCE: return ncclReduce(s, r == c->root ? v : NULL, c->count, c->dt, c->op, c->root, comm, st);
    case C_REDUCE_SCATTER: return ncclReduceScatter(s, v, c->count, c->dt, c->op, comm, st);
    case C_ALLGATHER: return ncclAllGather(s, v, c->count, c->dt, comm, st);
    case C_BROADCAST: return ncclBroadcast(s, v, c->count, c->dt, c->root, comm, st);
    case C_BCAST: return ncclBcast(v, c->count, c->dt, c->root, comm, st);
    case C_ALLTOALL: return ncclAlltoAll(s, v, c->count, c->dt, comm, st);
    /* As nccl-tests' in-place pass runs it. */
    case C_ALLTOALL_INPLACE: return ncclAlltoAll(v, v, c->count, c->dt, comm, st);
    case C_GATHER: return ncclGather(s, r == c->root ? v : NULL, c->count, c->dt, c->root, comm, st);
    case C_SCATTER: return ncclScatter(r == c->root ? s : NULL, v, c->count, c->dt, c->root, comm, st);
    default: return issue_p2p(j, r);
  }
}

typedef struct {
  job_t *j;
  int r;
  pthread_t t;
} rank_thread_t;

static void *rank_main(void *arg) {
  rank_thread_t *t = arg;
  if (t->j->w->gpu) cudaSetDevice(t->r); /* as an NCCL program would */
  t->j->res[t->r] = issue(t->j, t->r);
  return NULL;
}

static void run_job(job_t *j) {
  const world_t *w = j->w;
  if (w->threads) {
    rank_thread_t t[MAXR];
    for (int r = 0; r < w->nranks; r++) {
      t[r] = (rank_thread_t){j, r, 0};
      if (pthread_create(&t[r].t, NULL, rank_main, &t[r])) rank_main(&t[r]), t[r].t = 0;
    }
    for (int r = 0; r < w->nranks; r++)
      if (t[r].t) pthread_join(t[r].t, NULL);
    return;
  }
  ncclResult_t res = ncclGroupStart();
  for (int r = 0; r < w->nranks; r++) j->res[r] = res == ncclSuccess ? issue(j, r) : res;
  ncclResult_t end = ncclGroupEnd();
  CHECK(end == ncclSuccess, "%s: ncclGroupEnd returned %d: %s", w->label, (int)end, ncclGetLastError(NULL));
}

/* Compares rank r's result; returns the number of bad elements (the first few are printed). */
static size_t check_rank(job_t *j, int r) {
  const case_t *c = &j->c;
  size_t es = dt_size(c->dt), bad = 0;
  if (c->coll == C_REDUCE && r != c->root) return 0;
  buf_get(j->w, r, j->out[r], j->rbuf[r], j->recv_n[r] * es);
  double tol = tolerance(c->dt, c->op);
  for (size_t i = 0; i < j->recv_n[r]; i++) {
    int ok;
    double got = 0, want = 0;
    if (is_reduction(c->coll)) {
      got = dt_load(c->dt, j->out[r], i), want = j->ref[r][i];
      ok = fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
    } else {
      ok = memcmp((char *)j->out[r] + i * es, (char *)j->expect[r] + i * es, es) == 0;
    }
    if (!ok && bad++ < 3)
      fprintf(stderr, "  %s %s %s %s root %d count %zu, %d ranks: rank %d element %zu is %g, expected %g\n", j->w->label,
              coll_names[c->coll], dt_name(c->dt), is_reduction(c->coll) ? op_name(c->op) : "", c->root, c->count,
              j->w->nranks, r, i, got, want);
  }
  return bad;
}

static void run_case(const world_t *w, const case_t *c, uint64_t *rng) {
  job_t j;
  job_prepare(&j, w, c, rng);
  run_job(&j);
  for (int r = 0; r < w->nranks; r++) {
    CHECK(j.res[r] == ncclSuccess, "%s: %s %s rank %d returned %d: %s", w->label, coll_names[c->coll], dt_name(c->dt), r,
          (int)j.res[r], ncclGetLastError(w->comms[r]));
    if (j.res[r] != ncclSuccess) continue;
    size_t bad = check_rank(&j, r);
    CHECK(bad == 0, "%s: %s %s %s, %d ranks: rank %d has %zu wrong elements", w->label, coll_names[c->coll],
          dt_name(c->dt), is_reduction(c->coll) ? op_name(c->op) : "", w->nranks, r, bad);
  }
  job_free(&j);
}

/* Every collective, on fresh random data. */
static void run_suite(const world_t *w) {
  int n = w->nranks, before = failures;
  uint64_t rng = seed ^ ((uint64_t)n << 40) ^ ((uint64_t)w->threads << 44) ^ ((uint64_t)w->gpu << 48) ^ 0x9e3779b97f4a7c15ULL;
  static const ncclDataType_t all[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64,
                                       ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
  for (size_t t = 0; t < sizeof all / sizeof all[0]; t++)
    for (int op = ncclSum; op < ncclNumOps; op++) run_case(w, &(case_t){C_ALLREDUCE, all[t], (ncclRedOp_t)op, 0, 1031}, &rng);
  const case_t cases[] = {
      {C_ALLREDUCE, ncclFloat32, ncclSum, 0, 1 << 20},     {C_ALLREDUCE_INPLACE, ncclFloat32, ncclSum, 0, 4099},
      {C_ALLREDUCE_INPLACE, ncclInt64, ncclMax, 0, 77},    {C_REDUCE, ncclFloat32, ncclSum, n - 1, 1000},
      {C_REDUCE, ncclInt64, ncclMin, 0, 513},              {C_REDUCE, ncclBfloat16, ncclMax, 1 % n, 300},
      {C_REDUCE_SCATTER, ncclFloat32, ncclSum, 0, 515},    {C_REDUCE_SCATTER, ncclInt32, ncclMax, 0, 64},
      {C_REDUCE_SCATTER, ncclFloat16, ncclSum, 0, 200},    {C_REDUCE_SCATTER, ncclBfloat16, ncclAvg, 0, 129},
      {C_REDUCE_SCATTER, ncclUint8, ncclProd, 0, 33},      {C_ALLGATHER, ncclFloat32, 0, 0, 777},
      {C_ALLGATHER, ncclInt8, 0, 0, 3},                    {C_ALLGATHER, ncclBfloat16, 0, 0, 1000},
      {C_ALLGATHER, ncclFloat8e4m3, 0, 0, 100},            {C_BROADCAST, ncclFloat64, 0, 0, 333},
      {C_BROADCAST, ncclFloat64, 0, n - 1, 333},           {C_BROADCAST, ncclInt32, 0, 1 % n, 70000},
      {C_BCAST, ncclUint8, 0, n - 1, 1000},                {C_BCAST, ncclFloat16, 0, 0, 12},
      {C_ALLTOALL, ncclFloat32, 0, 0, 301},                {C_ALLTOALL, ncclInt64, 0, 0, 17},
      {C_ALLTOALL, ncclFloat8e5m2, 0, 0, 64},              {C_ALLTOALL_INPLACE, ncclFloat32, 0, 0, 301},
      {C_ALLTOALL_INPLACE, ncclUint8, 0, 0, 70001},        {C_SENDRECV, ncclFloat32, 0, 0, 100},
      {C_SENDRECV, ncclInt8, 0, 0, 1},                     {C_SENDRECV, ncclFloat64, 0, 0, 50000},
      {C_GATHER, ncclFloat32, 0, n - 1, 1001},             {C_GATHER, ncclUint8, 0, 0, 7},
      {C_SCATTER, ncclInt64, 0, 0, 333},                   {C_SCATTER, ncclBfloat16, 0, 1 % n, 4099},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(w, &cases[i], &rng);
  printf("%s %s, %d ranks, %s: every collective checked%s\n", failures == before ? "ok  " : "FAIL", w->label, n,
         w->threads ? "one thread per rank" : "one thread, groups", failures == before ? "" : " (see above)");
}

/* ---- communicators ----------------------------------------------------------------------------- */

typedef struct {
  ncclComm_t *comm;
  int nranks, rank, scalable;
  ncclUniqueId id;
  ncclResult_t res;
  pthread_t t;
} init_thread_t;

static void *init_main(void *arg) {
  init_thread_t *t = arg;
  if (t->scalable) t->res = ncclCommInitRankScalable(t->comm, t->nranks, t->rank, 1, &t->id, NULL);
  else t->res = ncclCommInitRank(t->comm, t->nranks, t->id, t->rank);
  return NULL;
}

/* ncclGetUniqueId + ncclCommInitRank (or ...Scalable), one thread per rank. */
static int init_threads(world_t *w, int scalable) {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  init_thread_t t[MAXR];
  for (int r = 0; r < w->nranks; r++) {
    t[r] = (init_thread_t){&w->comms[r], w->nranks, r, scalable, id, ncclSuccess, 0};
    if (pthread_create(&t[r].t, NULL, init_main, &t[r])) init_main(&t[r]), t[r].t = 0;
  }
  int ok = 1;
  for (int r = 0; r < w->nranks; r++) {
    if (t[r].t) pthread_join(t[r].t, NULL);
    CHECK(t[r].res == ncclSuccess, "init of rank %d of %d returned %d: %s", r, w->nranks, (int)t[r].res,
          ncclGetLastError(NULL));
    ok &= t[r].res == ncclSuccess;
  }
  return ok;
}

typedef struct {
  ncclComm_t comm;
  ncclResult_t res;
  pthread_t t;
} destroy_thread_t;

static void *destroy_main(void *arg) {
  destroy_thread_t *t = arg;
  t->res = ncclCommDestroy(t->comm);
  return NULL;
}

/* A communicator's destroy may wait for its peers: ranks of one process go down together. */
static void destroy_all(world_t *w) {
  destroy_thread_t t[MAXR];
  for (int r = 0; r < w->nranks; r++) {
    t[r] = (destroy_thread_t){w->comms[r], ncclSuccess, 0};
    if (pthread_create(&t[r].t, NULL, destroy_main, &t[r])) destroy_main(&t[r]), t[r].t = 0;
  }
  for (int r = 0; r < w->nranks; r++) {
    if (t[r].t) pthread_join(t[r].t, NULL);
    CHECK(t[r].res == ncclSuccess, "ncclCommDestroy of rank %d returned %d", r, (int)t[r].res);
    w->comms[r] = NULL;
  }
}

/* As NCCL programs that drive every rank from one thread do: one destroy after the other. */
static void destroy_in_turn(world_t *w) {
  for (int r = 0; r < w->nranks; r++) {
    NCCL_OK(ncclCommDestroy(w->comms[r]));
    w->comms[r] = NULL;
  }
}

/* The query calls and the accepted no-ops. */
static void check_queries(world_t *w) {
  for (int r = 0; r < w->nranks; r++) {
    int count = -1, rank = -1, dev = -2;
    ncclResult_t async = ncclInternalError;
    void *handle = NULL;
    NCCL_OK(ncclCommCount(w->comms[r], &count));
    NCCL_OK(ncclCommUserRank(w->comms[r], &rank));
    NCCL_OK(ncclCommCuDevice(w->comms[r], &dev));
    NCCL_OK(ncclCommGetAsyncError(w->comms[r], &async));
    CHECK(count == w->nranks && rank == r && dev == (w->gpu ? r : -1) && async == ncclSuccess,
          "rank %d: count %d rank %d device %d async %d", r, count, rank, dev, (int)async);
    NCCL_OK(ncclCommRegister(w->comms[r], &count, sizeof count, &handle));
    CHECK(handle != NULL, "ncclCommRegister gave a NULL handle");
    NCCL_OK(ncclCommDeregister(w->comms[r], handle));
    NCCL_OK(ncclCommFinalize(w->comms[r]));
  }
}

/* ---- argument errors and what flexcoll cannot do --------------------------------------------- */

static void check_bad_arguments(ncclComm_t comm, int nranks) {
  float s[8] = {0}, v[8];
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  ncclComm_t c = (ncclComm_t)&zero;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  NCCL_FAILS(ncclInvalidArgument, ncclAllReduce(s, v, 8, (ncclDataType_t)ncclNumTypes, ncclSum, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclAllReduce(s, v, 8, (ncclDataType_t)-1, ncclSum, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclAllReduce(s, v, 8, ncclFloat8e4m3, ncclSum, comm, 0));
  CHECK(strstr(ncclGetLastError(comm), "Float8") != NULL, "fp8 message: %s", ncclGetLastError(comm));
  NCCL_FAILS(ncclInvalidArgument, ncclReduceScatter(s, v, 1, ncclFloat8e5m2, ncclMax, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclAllReduce(s, v, 8, ncclFloat, (ncclRedOp_t)ncclNumOps, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclAllReduce(s, v, 8, ncclFloat, (ncclRedOp_t)-1, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclAllReduce(s, v, 8, ncclFloat, ncclSum, NULL, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclAllReduce(NULL, v, 8, ncclFloat, ncclSum, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclBroadcast(s, v, 8, ncclFloat, nranks, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclReduce(s, v, 8, ncclFloat, ncclSum, -1, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclSend(s, 8, ncclFloat, nranks, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclRecv(v, 8, ncclFloat, -1, comm, 0));
  NCCL_FAILS(ncclInvalidArgument, ncclGetUniqueId(NULL));
  NCCL_FAILS(ncclInvalidArgument, ncclGetVersion(NULL));
  NCCL_FAILS(ncclInvalidArgument, ncclCommInitRank(&c, 0, zero, 0));
  CHECK(c == NULL, "a failed init left a handle");
  NCCL_FAILS(ncclInvalidArgument, ncclCommInitRank(&c, 2, zero, 2));
  NCCL_FAILS(ncclInvalidArgument, ncclCommInitRank(NULL, 2, zero, 0));
  config.magic = 0;
  NCCL_FAILS(ncclInvalidArgument, ncclCommInitRankConfig(&c, 2, zero, 0, &config));
  config.magic = NCCL_API_MAGIC, config.blocking = 7;
  NCCL_FAILS(ncclInvalidArgument, ncclCommInitRankConfig(&c, 2, zero, 0, &config));
  NCCL_FAILS(ncclInvalidArgument, ncclCommInitRankScalable(&c, 2, 0, 0, NULL, NULL));
  NCCL_FAILS(ncclInvalidArgument, ncclCommInitAll(NULL, 2, NULL));
  NCCL_FAILS(ncclInvalidArgument, ncclCommInitAll(&c, 0, NULL));
  NCCL_FAILS(ncclInvalidArgument, ncclCommCount(comm, NULL));
  NCCL_FAILS(ncclInvalidArgument, ncclCommGetAsyncError(comm, NULL));
  NCCL_FAILS(ncclInvalidArgument, ncclCommRegister(comm, s, sizeof s, NULL));
  NCCL_FAILS(ncclInvalidArgument, ncclMemAlloc(NULL, 16));
  NCCL_FAILS(ncclInvalidArgument, ncclRedOpDestroy(ncclSum, comm));
  NCCL_FAILS(ncclInvalidArgument, ncclCommFinalize(NULL));
  NCCL_OK(ncclCommDestroy(NULL)); /* as NCCL: nothing to do */
}

static void check_unsupported(ncclComm_t comm) {
  ncclComm_t newcomm = comm;
  ncclRedOp_t op = ncclSum;
  ncclWindow_t win = (ncclWindow_t)&op;
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  float scalar = 2, buf[4];
  int exclude = 0;
  NCCL_FAILS(ncclInvalidUsage, ncclCommShrink(comm, &exclude, 1, &newcomm, NULL, NCCL_SHRINK_DEFAULT));
  CHECK(newcomm == NULL, "ncclCommShrink left a communicator");
  NCCL_FAILS(ncclInvalidUsage, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  NCCL_FAILS(ncclInvalidUsage, ncclRedOpDestroy((ncclRedOp_t)ncclNumOps, comm));
  /* A default window is a hint; a symmetric one needs device memory (this is a host communicator). */
  NCCL_OK(ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_DEFAULT));
  CHECK(win != NULL, "ncclCommWindowRegister gave no window");
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  win = (ncclWindow_t)&op;
  NCCL_FAILS(ncclInvalidUsage, ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_COLL_SYMMETRIC));
  CHECK(win == NULL, "ncclCommWindowRegister left a window");
  NCCL_FAILS(ncclInvalidArgument, ncclCommWindowRegister(comm, buf, sizeof buf, &win, 0x80));
  NCCL_FAILS(ncclInvalidArgument, ncclCommWindowDeregister(comm, NULL));
  NCCL_FAILS(ncclInvalidUsage, ncclDevCommCreate(comm, NULL, NULL));
  NCCL_FAILS(ncclInvalidUsage, ncclDevCommDestroy(comm, NULL));
  NCCL_FAILS(ncclInvalidUsage, ncclGroupSimulateEnd(&info));
  NCCL_OK(ncclGroupStart());
  NCCL_FAILS(ncclInvalidUsage, ncclGroupSimulateEnd(&info));
  /* ... which ended the group: there is none left to end. */
  NCCL_FAILS(ncclInvalidUsage, ncclGroupEnd());
  /* A later flexcoll error replaces the shim's message. */
  NCCL_FAILS(ncclInvalidUsage, ncclCommShrink(comm, &exclude, 1, &newcomm, NULL, NCCL_SHRINK_DEFAULT));
  NCCL_FAILS(ncclInvalidArgument, ncclCommCount(comm, NULL));
  CHECK(strstr(ncclGetLastError(NULL), "not supported") == NULL, "stale message: %s", ncclGetLastError(NULL));
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE && version == 22800 && NCCL_VERSION(2, 28, 0) == 22800, "version %d", version);
  CHECK(strcmp(ncclGetErrorString(ncclInvalidUsage), ncclGetErrorString(ncclSuccess)) != 0 &&
            *ncclGetErrorString(ncclInvalidUsage),
        "error strings");
}

/* ---- ncclCommSplit ---------------------------------------------------------------------------- */

typedef struct {
  ncclComm_t parent, sub;
  int color, key, use_config;
  ncclResult_t res;
  pthread_t t;
} split_thread_t;

static void *split_main(void *arg) {
  split_thread_t *t = arg;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  t->sub = (ncclComm_t)t; /* must be overwritten */
  t->res = ncclCommSplit(t->parent, t->color, t->key, &t->sub, t->use_config ? &config : NULL);
  return NULL;
}

typedef struct {
  ncclComm_t comm;
  float in[64], out[64];
  ncclResult_t res;
  pthread_t t;
} split_reduce_t;

static void *split_reduce_main(void *arg) {
  split_reduce_t *t = arg;
  t->res = ncclAllReduce(t->in, t->out, 64, ncclFloat, ncclSum, t->comm, 0);
  return NULL;
}

/* One split of w's ranks (one thread per rank, as NCCL requires outside groups), checked: ranks
 * and counts, NOCOLOR, and an AllReduce over each new communicator that sums its members only. */
static void split_once(world_t *w, const int *color, const int *key, int use_config, const char *what) {
  int n = w->nranks;
  split_thread_t t[MAXR];
  for (int r = 0; r < n; r++) {
    t[r] = (split_thread_t){w->comms[r], NULL, color[r], key[r], use_config, ncclSuccess, 0};
    if (pthread_create(&t[r].t, NULL, split_main, &t[r])) split_main(&t[r]), t[r].t = 0;
  }
  for (int r = 0; r < n; r++)
    if (t[r].t) pthread_join(t[r].t, NULL);
  int ok = 1;
  for (int r = 0; r < n; r++) {
    CHECK(t[r].res == ncclSuccess, "%s, %d ranks: ncclCommSplit of rank %d returned %d: %s", what, n, r, (int)t[r].res,
          ncclGetLastError(NULL));
    ok &= t[r].res == ncclSuccess;
  }
  if (!ok) return;
  split_reduce_t red[MAXR];
  int nred = 0;
  for (int r = 0; r < n; r++) {
    if (color[r] == NCCL_SPLIT_NOCOLOR) {
      CHECK(t[r].sub == NULL, "%s: NCCL_SPLIT_NOCOLOR gave rank %d a communicator", what, r);
      continue;
    }
    int want_count = 0, want_rank = 0, count = -1, rank = -1;
    for (int q = 0; q < n; q++)
      if (color[q] == color[r]) {
        want_count++;
        if (key[q] < key[r] || (key[q] == key[r] && q < r)) want_rank++;
      }
    NCCL_OK(ncclCommCount(t[r].sub, &count));
    NCCL_OK(ncclCommUserRank(t[r].sub, &rank));
    CHECK(count == want_count && rank == want_rank, "%s: rank %d is rank %d of %d, expected %d of %d", what, r, rank, count,
          want_rank, want_count);
    red[nred] = (split_reduce_t){.comm = t[r].sub};
    for (int i = 0; i < 64; i++) red[nred].in[i] = (float)((r + 1) * 100 + i);
    nred++;
  }
  for (int k = 0; k < nred; k++)
    if (pthread_create(&red[k].t, NULL, split_reduce_main, &red[k])) split_reduce_main(&red[k]), red[k].t = 0;
  for (int k = 0; k < nred; k++)
    if (red[k].t) pthread_join(red[k].t, NULL);
  for (int r = 0, k = 0; r < n; r++) {
    if (color[r] == NCCL_SPLIT_NOCOLOR) continue;
    CHECK(red[k].res == ncclSuccess, "%s: AllReduce on rank %d's new communicator returned %d", what, r, (int)red[k].res);
    int bad = 0;
    for (int i = 0; i < 64; i++) {
      float want = 0;
      for (int q = 0; q < n; q++)
        if (color[q] == color[r]) want += (float)((q + 1) * 100 + i);
      bad += red[k].out[i] != want;
    }
    CHECK(bad == 0, "%s: AllReduce on rank %d's new communicator: %d wrong elements", what, r, bad);
    k++;
  }
  world_t sub = {.nranks = 0};
  for (int r = 0; r < n; r++)
    if (t[r].sub) sub.comms[sub.nranks++] = t[r].sub;
  destroy_all(&sub);
}

static void check_split(world_t *w) {
  int n = w->nranks, before = failures;
  int color[MAXR], key[MAXR];
  for (int r = 0; r < n; r++) color[r] = r % 2, key[r] = -r;
  split_once(w, color, key, 0, "split by parity, reversed");
  for (int r = 0; r < n; r++) color[r] = r == 0 ? NCCL_SPLIT_NOCOLOR : 5, key[r] = 0;
  split_once(w, color, key, 1, "split without rank 0, with a config");
  /* Inside a group flexcoll refuses the split at once (one thread cannot wait for all ranks). */
  ncclComm_t newcomm = w->comms[0];
  NCCL_OK(ncclGroupStart());
  NCCL_FAILS(ncclInvalidUsage, ncclCommSplit(w->comms[0], 0, 0, &newcomm, NULL));
  NCCL_OK(ncclGroupEnd());
  CHECK(newcomm == NULL, "a refused ncclCommSplit left a communicator");
  CHECK(strstr(ncclGetLastError(NULL), "group") != NULL, "message: %s", ncclGetLastError(NULL));
  printf("%s ncclCommSplit, %d ranks: ranks, NOCOLOR, AllReduce on the new communicators%s\n",
         failures == before ? "ok  " : "FAIL", n, failures == before ? "" : " (see above)");
}

/* ---- the parts --------------------------------------------------------------------------------- */

/* Inits inside one group from one thread, with a collective on the new communicators queued in the
 * same group: the handles exist before ncclGroupEnd initialises them. */
static void group_init(world_t *w) {
  ncclUniqueId id;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  float in[MAXR][64], out[MAXR][64];
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < w->nranks; r++) {
    for (int i = 0; i < 64; i++) in[r][i] = (float)(r * 100 + i);
    w->comms[r] = NULL;
    NCCL_OK(ncclCommInitRankConfig(&w->comms[r], w->nranks, id, r, &config));
    CHECK(w->comms[r] != NULL, "no handle inside the group");
    ncclResult_t async = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(w->comms[r], &async));
    CHECK(async == ncclInProgress, "a communicator queued for initialisation reports %d, not ncclInProgress", (int)async);
    NCCL_OK(ncclAllReduce(in[r], out[r], 64, ncclFloat, ncclMax, w->comms[r], 0));
  }
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < w->nranks; r++) {
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += out[r][i] != (float)((w->nranks - 1) * 100 + i);
    CHECK(bad == 0, "group init: rank %d has %d wrong elements of the AllReduce queued with its init", r, bad);
  }
}

static void host_part(void) {
  for (int n = 2; n <= MAXR; n++) {
    world_t w = {.nranks = n, .label = "host, ncclCommInitRank"};
    if (!init_threads(&w, 0)) continue;
    check_queries(&w);
    w.threads = 1;
    run_suite(&w);
    w.threads = 0;
    run_suite(&w);
    if (n == 2) check_bad_arguments(w.comms[0], n), check_unsupported(w.comms[1]);
    check_split(&w);
    destroy_all(&w);
  }
  world_t g = {.nranks = MAXR, .label = "host, group init"};
  group_init(&g);
  run_suite(&g);
  for (int r = 0; r < g.nranks; r++) NCCL_OK(ncclCommAbort(g.comms[r])); /* frees them */
  world_t a = {.nranks = 2, .label = "host, ncclCommInitAll"};
  NCCL_OK(ncclCommInitAll(a.comms, 2, NULL));
  if (a.comms[0] && a.comms[1]) check_queries(&a), run_suite(&a), destroy_in_turn(&a);
  world_t s = {.nranks = 2, .threads = 1, .label = "host, ncclCommInitRankScalable"};
  if (init_threads(&s, 1)) run_suite(&s), destroy_all(&s);
}

/* Symmetric windows (ncclMemAlloc + ncclCommWindowRegister, collective: a group from one thread),
 * then a large AllReduce at the same offset of each window (flexcoll's direct path), checked. */
static void gpu_window(world_t *w) {
  const size_t bytes = 64 << 20, count = 4 << 20, off = 4096; /* 16 MB of floats, past one-shot */
  void *buf[2] = {NULL, NULL};
  ncclWindow_t win[2] = {NULL, NULL};
  for (int r = 0; r < 2; r++) {
    cudaSetDevice(r);
    NCCL_OK(ncclMemAlloc(&buf[r], bytes));
  }
  if (!buf[0] || !buf[1]) return;
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommWindowRegister(w->comms[r], buf[r], bytes, &win[r], NCCL_WIN_COLL_SYMMETRIC));
  NCCL_OK(ncclGroupEnd());
  CHECK(win[0] && win[1], "ncclCommWindowRegister gave no window");
  float *host = malloc(count * sizeof *host);
  for (int r = 0; r < 2 && host; r++) {
    for (size_t i = 0; i < count; i++) host[i] = (float)(r + 1) * (float)(i % 1000);
    cudaSetDevice(r);
    CHECK(cudaMemcpy((char *)buf[r] + off, host, count * sizeof *host, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++)
    NCCL_OK(ncclAllReduce((char *)buf[r] + off, (char *)buf[r] + off + (32 << 20), count, ncclFloat, ncclSum, w->comms[r],
                          w->streams[r]));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < 2 && host; r++) {
    cudaSetDevice(r);
    CHECK(cudaStreamSynchronize(w->streams[r]) == cudaSuccess, "stream");
    CHECK(cudaMemcpy(host, (char *)buf[r] + off + (32 << 20), count * sizeof *host, cudaMemcpyDeviceToHost) == cudaSuccess,
          "download");
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) bad += host[i] != 3.0f * (float)(i % 1000);
    CHECK(bad == 0, "AllReduce in symmetric windows: rank %d has %zu wrong elements", r, bad);
  }
  free(host);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommWindowDeregister(w->comms[r], win[r]));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < 2; r++) {
    cudaSetDevice(r);
    NCCL_OK(ncclMemFree(buf[r]));
  }
}

static void gpu_part(void) {
  world_t w = {.nranks = 2, .gpu = 1, .label = "GPU, ncclCommInitAll"};
  NCCL_OK(ncclCommInitAll(w.comms, 2, NULL));
  if (!w.comms[0] || !w.comms[1]) return;
  for (int r = 0; r < 2; r++) {
    cudaSetDevice(r);
    CHECK(cudaStreamCreate(&w.streams[r]) == cudaSuccess, "cudaStreamCreate on device %d", r);
  }
  check_queries(&w);
  run_suite(&w);
  w.threads = 1;
  run_suite(&w);
  void *p = NULL;
  cudaSetDevice(1);
  NCCL_OK(ncclMemAlloc(&p, 1 << 20));
  int dev = -1;
  struct cudaPointerAttributes attr;
  CHECK(p && cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeDevice &&
            (dev = attr.device) == 1,
        "ncclMemAlloc gave %p on device %d", p, dev);
  NCCL_OK(ncclMemFree(p));
  gpu_window(&w);
  destroy_in_turn(&w);
  for (int r = 0; r < 2; r++) cudaSetDevice(r), cudaStreamDestroy(w.streams[r]);
}

/* ---- processes --------------------------------------------------------------------------------- */

static int count_gpus(void) {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

/* Runs part in a child process (hiding the GPUs when asked); 1 when it passed. */
static int run_child(const char *name, void (*part)(void), int hide_gpus) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (hide_gpus) setenv("CUDA_VISIBLE_DEVICES", "", 1);
    alarm(CHILD_TIMEOUT_S);
    part();
    fflush(stdout);
    _exit(failures ? 1 : 0);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
  if (WIFSIGNALED(status))
    fprintf(stderr, "FAIL %s part: killed by signal %d%s\n", name, WTERMSIG(status),
            WTERMSIG(status) == SIGALRM ? " (timed out)" : "");
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void) {
  const char *s = getenv("FC_TEST_SEED");
  seed = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
  if (!seed) seed = 1;
  printf("test_nccl_shim: seed 0x%llx (FC_TEST_SEED to repeat)\n", (unsigned long long)seed);
  setenv("FLEXCOLL_TIMEOUT_MS", "60000", 0);
  int ngpus = count_gpus();
  if (ngpus > 0) fc_test_gpu_serialize("[test_nccl_shim]");
  int ok = run_child("host", host_part, 1);
  printf("%s host part\n", ok ? "PASS" : "FAIL");
  if (ngpus >= 2) {
    int gok = run_child("GPU", gpu_part, 0);
    printf("%s GPU part (%d GPUs)\n", gok ? "PASS" : "FAIL", ngpus);
    ok &= gok;
  } else {
    printf("SKIP GPU part: %d GPU(s), it needs 2\n", ngpus);
  }
  return ok ? 0 : 1;
}
