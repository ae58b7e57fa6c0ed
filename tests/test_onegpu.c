/* test_onegpu.c — every collective, datatype and op with several ranks sharing one GPU.
 *
 * Ranks are threads of one process, all on device 0, so the test runs on a one-GPU node; each
 * rank's communicator is created in its own thread, concurrently, as frameworks do.  For each
 * rank count N (FC_ONEGPU_RANKS, default "2,3,4,8") it checks:
 *  - allreduce, allgather, reduce_scatter, broadcast, reduce (roots 0 and N-1), alltoall and a
 *    send/recv ring (rank -> rank+1 in a group), in place (NCCL's convention: allgather sendbuf =
 *    recvbuf + rank*count, reduce_scatter recvbuf = sendbuf + rank*recvcount, the others
 *    sendbuf = recvbuf; not the ring) and out of place,
 *    over all 10 datatypes and the 5 ops, at counts 0, 1, 7, 1001 (the full product), 65539
 *    (cycling through the (datatype, op) pairs: the full product would cost minutes for what
 *    the small counts already cover) and 3000017 (float32 SUM only: the large paths);
 *  - results exactly against a host reference: inputs are fresh per call and small integers,
 *    so every sum, product, max and min is exact in every datatype, float16 and bfloat16
 *    included (PROD takes values in {-2,-1,1,2}, with few enough 2s that int8 holds it).  AVG
 *    of integers truncates toward zero and is compared exactly; AVG of floats is sum/N, which
 *    is not exact in binary, and a kernel may divide in float before rounding to 16 bits: it is
 *    compared to within one unit in the last place of the datatype;
 *  - 256 bytes of 0xA5 poison before and after every buffer survive, and out-of-place inputs
 *    are unchanged;
 *  - allreduce results are bitwise identical on every rank (a reduction order that differs per
 *    rank would pass the exact check on integers and still split replicas in training);
 *  - calls rotate over 3 streams per rank with no synchronization between them until results
 *    are checked: the library, not the caller, orders calls on a communicator;
 *  - with N = 4, two more communicators per rank, {0,1},{2,3} (TP) and {0,2},{1,3} (DP), as
 *    PyTorch builds them, with allreduces alternating between them and no sync in between.
 * Then, once per environment, a hang: 2 ranks with timeout_ms = 3000, rank 1 never calls while
 * rank 0 calls allreduce: rank 0's async error must turn FLEXCOLL_TIMEOUT within 13 s, and
 * flexcoll_comm_abort must return on both ranks.
 *
 * The library reads its environment once per process, so each environment runs in a forked
 * child that sets it before its first CUDA call (the parent never touches CUDA; even the GPU
 * probe runs in a child), with a calibration cache of its own (FLEXCOLL_CACHE_DIR in /tmp): the
 * ring lanes are calibrated in every environment, under its hardware queues.  Environments
 * (FC_ONEGPU_ENVS, default all but j):
 *   a  defaults (and CUDA_DEVICE_MAX_CONNECTIONS=32, see envs[])
 *   b  FLEXCOLL_ONESHOT_MAX_BYTES=0: no one-shot kernels, every non-empty call takes the N-rank
 *      ring, alltoall or point-to-point kernels
 *   c  FLEXCOLL_ONESHOT_MAX_BYTES=0 FLEXCOLL_RING_KERNEL=0: the algorithms' schedules (lib/algos),
 *      round by round on the caller's stream, each round's transfers one point-to-point kernel
 *   d  CUDA_DEVICE_MAX_CONNECTIONS=1 FLEXCOLL_ONESHOT_MAX_BYTES=0, one stream per rank in
 *      lockstep (g_lockstep says why)
 *   e  CUDA_DEVICE_MAX_CONNECTIONS=1, likewise
 *   f  FLEXCOLL_ONESHOT_MAX_BYTES=0 FLEXCOLL_LINK_SHARES=nvlink:0.5,pcie:0.5: every ring chunk
 *      half through host memory (the pcie link), half over the peers' device memory
 *   g  FLEXCOLL_LINKS=pcie,shm,tcp (no nvlink), 1 MiB host areas: no peer access (the peers'
 *      device memory is never mapped, as between GPUs that cannot reach each other); every
 *      collective the ring kernels run goes through host memory whole (the pcie lane alone),
 *      at every size; the others (alltoall, sends and receives) through host copies
 *   h  CUDA_DEVICE_MAX_CONNECTIONS=1, lockstep, FLEXCOLL_ONESHOT_MAX_BYTES=0,
 *      FLEXCOLL_LINK_SHARES=nvlink:0.9,pcie:0.1
 *   i  FLEXCOLL_ONESHOT_MAX_BYTES=0 FLEXCOLL_ALGO=tree: the tree schedules as in c (the trees
 *      where the collective has one, the ring's schedule elsewhere)
 *   j  as g, with FLEXCOLL_PCIE_ENGINE=ce: the pcie lane's bytes moved by copy engines, a
 *      proxy thread per rank (lib/gpu/pcie_ce.c)
 *   k  FLEXCOLL_LINKS=shm,tcp FLEXCOLL_UCX_CUDA=0: neither peer access nor the pcie lane, and
 *      links that take host memory only: every collective through host copies of its buffers
 *      (in-place reduce_scatter's rank 0, whose recv starts at its send, included)
 *   l  FLEXCOLL_LINKS=shm,tcp: the host schedules on the device buffers, handed to UCX's CUDA
 *      transports where UCX has them (else as k)
 *   m  FLEXCOLL_LINKS=rdma,shm,tcp FLEXCOLL_RING_LANE=rdma on the fake verbs provider: every
 *      ring call's messages sent by the ranks' proxies over the rdma link, device memory to
 *      device memory (builds with the fake only: Check and verbs.h)
 *   n  as m with nvlink, FLEXCOLL_ONESHOT_MAX_BYTES=0 FLEXCOLL_LINK_SHARES=nvlink:0.5,rdma:0.5:
 *      half of every ring chunk over the rdma lane beside NVLink
 *   o  as m with FLEXCOLL_RING_LANE_INBAND=1: the lane's descriptors and acknowledgements over
 *      the link too, as between hosts
 *   p  three lanes: FLEXCOLL_RING_LANE=pcie,rdma FLEXCOLL_ONESHOT_MAX_BYTES=0
 *      FLEXCOLL_LINK_SHARES=nvlink:0.4,pcie:0.3,rdma:0.3: every ring chunk over NVLink, host
 *      memory and the rdma link at once
 *   q  as p without nvlink, FLEXCOLL_LINK_SHARES=pcie:0.5,rdma:0.5: every ring call through the
 *      two side lanes alone
 * In f, g, h, j, p and q the links' statistics must show bytes on pcie (and none on nvlink in g,
 * j, k, l, m, o and q); in m, n, o, p and q a second rdma entry toward the next rank (the lane,
 * beside the host link) with bytes.
 * Other knobs: FC_ONEGPU_QUICK=1 (counts 1, 1001, 65539; float32, int32, bfloat16 only).  Every
 * wait is bounded by a watchdog (alarm, 120 s per phase, FC_ONEGPU_PHASE_ALARM seconds where set)
 * that prints "HANG: <phase> <call>" and where each rank's thread is, and exits; a crash prints
 * its backtrace and the same.
 * One line per (environment, N, phase) goes to stderr, then a summary.  Exit 77 (automake's
 * skip) where there is no GPU. */
#define _GNU_SOURCE
#include <cuda_runtime.h>
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

#include "flexcoll.h"
#include "crash_report.h"
#include "gpu_serial.h"

#define TAG "[test_onegpu]"
#define GUARD 256
#define POISON 0xA5
#define NSTREAMS 3
#define MAX_RANKS 64
#define BATCH_CALLS 8
#define LARGE_COUNT 3000017u
/* Seconds a phase may take before the watchdog reports a HANG (FC_ONEGPU_PHASE_ALARM: shorter,
 * where the node's time is short and a stall is expected). */
static unsigned g_phase_alarm = 120;
#define PHASE_ALARM g_phase_alarm
#define HANG_TIMEOUT_MS 3000
#define MAX_MSGS 40 /* error lines per rank and phase: a broken path fails thousands of elements */

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_BROADCAST, C_REDUCE, C_ALLTOALL, C_SENDRECV, NKINDS };
static const char *kind_names[NKINDS] = {"allreduce", "allgather", "reduce_scatter", "broadcast",
                                         "reduce",    "alltoall",  "sendrecv"};
static const char *dt_names[FLEXCOLL_NUM_DATATYPES] = {"int8",  "uint8",   "int32",    "uint32",  "int64",
                                                       "uint64", "float16", "bfloat16", "float32", "float64"};
static const char *op_names[FLEXCOLL_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

typedef struct {
  int kind, dt, op, root, inplace;
  size_t n;          /* count as the API takes it: per rank for allgather, reduce_scatter, alltoall */
  unsigned seed;     /* fresh inputs per call */
} case_t;

/* ---- the watchdog: what runs now, for the HANG line ---- */

static char g_phase[128] = "start";
static char g_call[256] = "";
/* Where each rank's thread is (a string literal) and the seed of its call, so that a HANG or a
 * crash says which rank stopped where: inside a flexcoll call, waiting for its streams, at a
 * barrier... */
static const char *volatile g_where[MAX_RANKS];
static volatile unsigned g_where_seed[MAX_RANKS];
static volatile int g_where_n;
static void where(int rank, const char *what, unsigned seed) {
  g_where_seed[rank] = seed;
  g_where[rank] = what;
}

/* A buffer rank 0 may be rewriting meanwhile: no further than its end. */
static void write_bounded(const char *buf, size_t size) {
  if (write(2, buf, strnlen(buf, size)) < 0) _exit(125);
}

/* What runs now and where every rank is (async-signal-safe). */
static void write_context(void) {
  write_bounded(g_phase, sizeof g_phase);
  crash_report_write(" ");
  write_bounded(g_call, sizeof g_call);
  crash_report_write("\n");
  for (int q = 0; q < g_where_n && q < MAX_RANKS; q++) {
    const char *w = g_where[q];
    crash_report_write(TAG "   rank ");
    crash_report_write_number((unsigned long)q, 10);
    crash_report_write(": ");
    crash_report_write(w ? w : "not started");
    crash_report_write(" (call seed ");
    crash_report_write_number(g_where_seed[q], 10);
    crash_report_write(")\n");
  }
}

static void on_alarm(int sig) {
  (void)sig;
  crash_report_write(TAG " HANG: ");
  write_context();
  _exit(1);
}
static void on_crash_context(void) {
  crash_report_write(TAG " at the crash: ");
  write_context();
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- values and their encodings ---- */

static size_t dt_size(int dt) {
  switch (dt) {
    case FLEXCOLL_INT8: case FLEXCOLL_UINT8: return 1;
    case FLEXCOLL_FLOAT16: case FLEXCOLL_BFLOAT16: return 2;
    case FLEXCOLL_INT32: case FLEXCOLL_UINT32: case FLEXCOLL_FLOAT32: return 4;
    default: return 8;
  }
}
static int dt_unsigned(int dt) {
  return dt == FLEXCOLL_UINT8 || dt == FLEXCOLL_UINT32 || dt == FLEXCOLL_UINT64;
}
static int dt_float(int dt) { return dt >= FLEXCOLL_FLOAT16; }
/* Relative size of one unit in the last place. */
static double dt_ulp(int dt) {
  switch (dt) {
    case FLEXCOLL_FLOAT16: return ldexp(1, -10);
    case FLEXCOLL_BFLOAT16: return ldexp(1, -7);
    case FLEXCOLL_FLOAT32: return ldexp(1, -23);
    default: return ldexp(1, -52);
  }
}
/* Ranks below this may contribute a 2 to a PROD: the product stays representable. */
static int dt_max_twos(int dt) {
  switch (dt) {
    case FLEXCOLL_INT8: return 6;
    case FLEXCOLL_UINT8: return 7;
    case FLEXCOLL_FLOAT16: return 14;
    default: return 30;
  }
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int reduces(int kind) { return kind == C_ALLREDUCE || kind == C_REDUCE_SCATTER || kind == C_REDUCE; }

/* Element i of rank q's send buffer: a small integer, exact in every datatype, whose sums over
 * nranks (<= 8: |v| <= 15, so int8 holds 8 of them) and products stay exact too. */
static int inval(const case_t *c, int nranks, int q, size_t i) {
  const uint64_t h = mix(((uint64_t)c->seed << 40) ^ ((uint64_t)q << 32) ^ i);
  if (reduces(c->kind) && c->op == FLEXCOLL_PROD) {
    const int mag = q < dt_max_twos(c->dt) && (h & 1) ? 2 : 1;
    return !dt_unsigned(c->dt) && (h & 2) ? -mag : mag;
  }
  int lim = nranks <= 8 ? 15 : 120 / nranks;
  if (lim < 1) lim = 1;
  if (dt_unsigned(c->dt)) return (int)((h >> 8) % (uint64_t)(lim + 1));
  return (int)((h >> 8) % (uint64_t)(2 * lim + 1)) - lim;
}

/* float16 bits of a small integer (|v| < 2048: exact). */
static uint16_t half_bits(int v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  const unsigned a = (unsigned)(v < 0 ? -v : v);
  const int e = 31 - __builtin_clz(a);
  return (uint16_t)(sign | (unsigned)(e + 15) << 10 | ((a << (10 - e)) & 0x3ff));
}
static double half_value(uint16_t b) {
  const int e = (b >> 10) & 0x1f, m = b & 0x3ff;
  const double mag = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return b & 0x8000 ? -mag : mag;
}

static void put(int dt, void *buf, size_t i, int v) {
  switch (dt) {
    case FLEXCOLL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case FLEXCOLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case FLEXCOLL_INT32: ((int32_t *)buf)[i] = v; break;
    case FLEXCOLL_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case FLEXCOLL_INT64: ((int64_t *)buf)[i] = v; break;
    case FLEXCOLL_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case FLEXCOLL_FLOAT16: ((uint16_t *)buf)[i] = half_bits(v); break;
    case FLEXCOLL_BFLOAT16: {
      float f = (float)v;
      uint32_t bits;
      memcpy(&bits, &f, 4);
      ((uint16_t *)buf)[i] = (uint16_t)(bits >> 16); /* exact: small integers */
      break;
    }
    case FLEXCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
  }
}
static double get(int dt, const void *buf, size_t i) {
  switch (dt) {
    case FLEXCOLL_INT8: return ((const int8_t *)buf)[i];
    case FLEXCOLL_UINT8: return ((const uint8_t *)buf)[i];
    case FLEXCOLL_INT32: return ((const int32_t *)buf)[i];
    case FLEXCOLL_UINT32: return ((const uint32_t *)buf)[i];
    case FLEXCOLL_INT64: return (double)((const int64_t *)buf)[i];
    case FLEXCOLL_UINT64: return (double)((const uint64_t *)buf)[i];
    case FLEXCOLL_FLOAT16: return half_value(((const uint16_t *)buf)[i]);
    case FLEXCOLL_BFLOAT16: {
      uint32_t bits = (uint32_t)((const uint16_t *)buf)[i] << 16;
      float f;
      memcpy(&f, &bits, 4);
      return f;
    }
    case FLEXCOLL_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
  }
}

/* op over all ranks of element i of their send buffers; *approx: AVG of a float type. */
static double reduced(const case_t *c, int nranks, size_t i, int *approx) {
  double acc = inval(c, nranks, 0, i);
  for (int q = 1; q < nranks; q++) {
    const double v = inval(c, nranks, q, i);
    switch (c->op) {
      case FLEXCOLL_PROD: acc *= v; break;
      case FLEXCOLL_MAX: acc = v > acc ? v : acc; break;
      case FLEXCOLL_MIN: acc = v < acc ? v : acc; break;
      default: acc += v; break;
    }
  }
  if (c->op == FLEXCOLL_AVG) {
    if (dt_float(c->dt)) {
      *approx = 1;
      return acc / nranks;
    }
    return trunc(acc / nranks); /* exact: small integers; C's integer division truncates too */
  }
  return acc;
}

/* ---- the cases ---- */

static int g_quick;
/* One hardware queue (envs d, e): every call of every rank goes into it in issue order, and a
 * kernel that must wait for the same stream's previous one holds back everything behind it,
 * including the peers' kernels that previous one is waiting for.  Ranks that are threads of one
 * process on one GPU then deadlock on any second call issued before the first finished — an
 * artifact of sharing one process's queue (ranks in their own processes, as frameworks run
 * them, each have their own).  So there each rank uses one stream and waits for every call
 * before the next (lockstep): what stays under test is that one call completes with one queue,
 * which the staged schedule's two side streams could not. */
static int g_lockstep;
/* Streams a rank rotates its calls over (and makes: a stream made and left idle still takes a
 * hardware queue in CUDA's rotation).  The ranks' streams must each have a queue of their own
 * (see Q32): with 32 queues, each rank's library stream beside its own, 8 ranks of 3 streams
 * came to share queues now and then (the forced tree's first 8-rank call hung in 1 of 2 full runs
 * on the node, session 21), so more ranks get fewer streams: at most 32 / N - 2 each. */
static int g_nstreams = NSTREAMS;
static int streams_per_rank(int nranks) {
  if (g_lockstep) return 1;
  const int fit = 32 / nranks - 2;
  return fit < 1 ? 1 : fit < NSTREAMS ? fit : NSTREAMS;
}
static int g_nindex; /* which entry of FC_ONEGPU_RANKS runs: each starts the pair cycle elsewhere */

static const int quick_dts[] = {FLEXCOLL_FLOAT32, FLEXCOLL_INT32, FLEXCOLL_BFLOAT16};

/* The cases of one collective for nranks, in the same order on every rank; returns how many. */
static size_t build_cases(int kind, int nranks, case_t *out, unsigned *seed) {
  static const size_t full_counts[] = {0, 1, 7, 1001, 65539, LARGE_COUNT};
  static const size_t quick_counts[] = {1, 1001, 65539};
  const size_t *counts = g_quick ? quick_counts : full_counts;
  const int ncounts = g_quick ? 3 : 6;
  int dts[FLEXCOLL_NUM_DATATYPES], ndts = 0;
  for (int d = 0; d < (g_quick ? 3 : FLEXCOLL_NUM_DATATYPES); d++) dts[ndts++] = g_quick ? quick_dts[d] : d;
  const int nops = reduces(kind) ? FLEXCOLL_NUM_OPS : 1;
  int roots[2] = {0, nranks - 1}, nroots = kind == C_BROADCAST || kind == C_REDUCE ? 2 : 1;
  const int ninplace = kind == C_SENDRECV ? 1 : 2; /* a send/recv ring has no in-place form */
  size_t k = 0;
  /* Where the (datatype, op) pairs of the bigger counts go on: each N of the list takes the next
   * ones, so that the default list covers most pairs at 65539 too. */
  unsigned cycle = 10u * (unsigned)g_nindex;
  for (int ci = 0; ci < ncounts; ci++) {
    const size_t n = counts[ci];
    for (int ri = 0; ri < nroots; ri++)
      for (int ip = 0; ip < ninplace; ip++) {
        case_t c = {.kind = kind, .root = roots[ri], .inplace = ip, .n = n, .op = FLEXCOLL_SUM};
        if (n == LARGE_COUNT) {
          c.dt = FLEXCOLL_FLOAT32;
          c.seed = (*seed)++;
          out[k++] = c;
        } else if (n <= 1001) {
          for (int d = 0; d < ndts; d++)
            for (int o = 0; o < nops; o++) {
              c.dt = dts[d];
              c.op = o;
              c.seed = (*seed)++;
              out[k++] = c;
            }
        } else {
          for (int j = 0; j < 5; j++, cycle++) {
            /* Stepping by a count prime to ndts*nops covers every pair over the calls. */
            const unsigned p = (cycle * 7u) % (unsigned)(ndts * nops);
            c.dt = dts[p % (unsigned)ndts];
            c.op = (int)(p / (unsigned)ndts);
            c.seed = (*seed)++;
            out[k++] = c;
          }
        }
      }
  }
  return k;
}
#define MAX_CASES_PER_KIND 2000

static size_t send_elems(const case_t *c, int nranks) {
  return c->kind == C_REDUCE_SCATTER || c->kind == C_ALLTOALL ? (size_t)nranks * c->n : c->n;
}
static size_t recv_elems(const case_t *c, int nranks) {
  return c->kind == C_ALLGATHER || c->kind == C_ALLTOALL ? (size_t)nranks * c->n : c->n;
}
static size_t region(size_t bytes) { return (GUARD + bytes + GUARD + 255) & ~(size_t)255; }
/* Device bytes one call takes: its regions, each with its guards. */
static size_t footprint(const case_t *c, int nranks) {
  const size_t es = dt_size(c->dt), s = send_elems(c, nranks) * es, r = recv_elems(c, nranks) * es;
  return c->inplace ? region(s > r ? s : r) : region(s) + region(r);
}

/* ---- per-rank state and the shared bookkeeping of a child ---- */

typedef struct {
  int rank;
  flexcoll_comm_t comm, tp, dp;
  cudaStream_t s[NSTREAMS];
  char *dev, *host; /* arena on the device, its pinned mirror (same offsets) */
  size_t cap;
  int failures, msgs;
  unsigned calls;
} rank_t;

static int g_nranks;
static size_t g_cap; /* arena bytes per rank: the largest call, or a whole batch */
static rank_t g_ranks[MAX_RANKS];
static pthread_barrier_t g_barrier;
static flexcoll_unique_id_t g_id, g_tp_ids[2], g_dp_ids[2];
static int g_votes[MAX_RANKS];
static char g_env;
static int g_phase_fail; /* phases that failed in this child */
static double g_phase_t0;
static int g_phase_f0;

#define FAIL(r, ...)                                         \
  do {                                                       \
    (r)->failures++;                                         \
    if ((r)->msgs++ < MAX_MSGS) {                            \
      char m_[512];                                          \
      snprintf(m_, sizeof m_, __VA_ARGS__);                  \
      fprintf(stderr, TAG " env %c N=%d rank %d: %s\n", g_env, g_nranks, (r)->rank, m_); \
    }                                                        \
  } while (0)

static int total_failures(void) {
  int f = 0;
  for (int q = 0; q < g_nranks; q++) f += __atomic_load_n(&g_ranks[q].failures, __ATOMIC_RELAXED);
  return f;
}

/* Whether every rank says ok (all call it at the same point). */
static int agree(rank_t *r, int ok) {
  g_votes[r->rank] = ok;
  pthread_barrier_wait(&g_barrier);
  int all = 1;
  for (int q = 0; q < g_nranks; q++) all &= g_votes[q];
  pthread_barrier_wait(&g_barrier);
  return all;
}

/* Phases start and end together on every rank; rank 0 arms the watchdog and reports. */
static void phase_begin(rank_t *r, const char *name) {
  where(r->rank, "at the barrier that begins a phase", 0);
  pthread_barrier_wait(&g_barrier);
  if (r->rank == 0) {
    snprintf(g_phase, sizeof g_phase, "env %c N=%d %s", g_env, g_nranks, name);
    g_call[0] = 0;
    alarm(PHASE_ALARM);
    g_phase_t0 = now_s();
    g_phase_f0 = total_failures();
    for (int q = 0; q < g_nranks; q++) g_ranks[q].msgs = 0;
  }
  pthread_barrier_wait(&g_barrier);
}
static void phase_end(rank_t *r) {
  where(r->rank, "at the barrier that ends a phase", 0);
  pthread_barrier_wait(&g_barrier);
  if (r->rank == 0) {
    const int f = total_failures() - g_phase_f0;
    fprintf(stderr, TAG " %s: %.2f s %s", g_phase, now_s() - g_phase_t0, f ? "FAIL" : "PASS");
    if (f) fprintf(stderr, " (%d failures)", f);
    fprintf(stderr, "\n");
    g_phase_fail += f != 0;
  }
  pthread_barrier_wait(&g_barrier);
}

static void describe(const case_t *c, char *buf, size_t len) {
  snprintf(buf, len, "%s %s %s count %zu root %d %s (seed %u)", kind_names[c->kind], dt_names[c->dt],
           reduces(c->kind) ? op_names[c->op] : "-", c->n, c->root, c->inplace ? "in place" : "out of place",
           c->seed);
}

/* ---- one batch of calls: issued without synchronization, then checked together ---- */

typedef struct {
  const case_t *c;
  size_t soff, roff;   /* arena offsets of the send and recv regions (equal: in place) */
  size_t sbytes, rbytes;
  char *sendp, *recvp; /* what the call got, device pointers */
  int ok;              /* the call was accepted */
} pend_t;

static void check_guards(rank_t *r, const case_t *c, const char *which, size_t off, size_t bytes) {
  const unsigned char *h = (const unsigned char *)r->host + off;
  for (size_t i = 0; i < GUARD; i++) {
    if (h[i] != POISON || h[GUARD + bytes + i] != POISON) {
      char d[200];
      describe(c, d, sizeof d);
      FAIL(r, "%s: the guard %s the %s buffer was overwritten (byte %zu of it)", d,
           h[i] != POISON ? "before" : "after", which, i);
      return;
    }
  }
}

/* Compare elems elements of the host copy at data with want(i); report the first mismatch. */
static void check_elems(rank_t *r, const case_t *c, const char *which, const char *data, size_t first,
                        size_t elems, size_t index_base) {
  const int nr = g_nranks, me = r->rank;
  size_t bad = 0, first_bad = 0;
  double got_bad = 0, want_bad = 0;
  for (size_t j = first; j < first + elems; j++) {
    const size_t i = j + index_base; /* index in the collective's own output numbering */
    int approx = 0;
    double want;
    switch (c->kind) {
      case C_ALLREDUCE: case C_REDUCE: want = reduced(c, nr, i, &approx); break;
      case C_REDUCE_SCATTER: want = reduced(c, nr, (size_t)me * c->n + i, &approx); break;
      case C_ALLGATHER: want = inval(c, nr, (int)(i / c->n), i % c->n); break;
      case C_BROADCAST: want = inval(c, nr, c->root, i); break;
      case C_ALLTOALL: want = inval(c, nr, (int)(i / c->n), (size_t)me * c->n + i % c->n); break;
      case C_SENDRECV: want = inval(c, nr, (me + nr - 1) % nr, i); break;
      default: want = inval(c, nr, me, i); break; /* an input, unchanged */
    }
    if (which[0] == 's') want = inval(c, nr, me, i), approx = 0; /* the send buffer, unchanged */
    const double got = get(c->dt, data, j - first);
    const int ok = approx ? fabs(got - want) <= fabs(want) * dt_ulp(c->dt) : got == want;
    if (!ok && bad++ == 0) first_bad = i, got_bad = got, want_bad = want;
  }
  if (bad) {
    char d[200];
    describe(c, d, sizeof d);
    FAIL(r, "%s: %zu wrong elements in the %s buffer, the first [%zu] = %g, not %g", d, bad, which, first_bad, got_bad,
         want_bad);
  }
}

static void check_call(rank_t *r, const pend_t *p) {
  const case_t *c = p->c;
  const int nr = g_nranks, me = r->rank;
  const size_t es = dt_size(c->dt), ns = send_elems(c, nr), nrv = recv_elems(c, nr);
  if (!c->inplace) {
    check_guards(r, c, "send", p->soff, ns * es);
    check_elems(r, c, "send", r->host + p->soff + GUARD, 0, ns, 0);
  }
  const size_t rregion_bytes = c->inplace ? (ns > nrv ? ns : nrv) * es : nrv * es;
  check_guards(r, c, "recv", p->roff, rregion_bytes);
  const char *rdata = r->host + p->roff + GUARD;
  if (c->kind == C_REDUCE && me != c->root) return; /* recvbuf is only the root's; NCCL says no more */
  if (c->inplace && c->kind == C_REDUCE_SCATTER) {
    /* The rest of the in-place sendbuf is the library's to use: only the own slice is checked. */
    check_elems(r, c, "recv", rdata + (size_t)me * c->n * es, 0, c->n, 0);
    return;
  }
  check_elems(r, c, "recv", rdata, 0, nrv, 0);
}

static void issue_call(rank_t *r, pend_t *p, size_t *top) {
  const case_t *c = p->c;
  const int nr = g_nranks, me = r->rank;
  const size_t es = dt_size(c->dt), ns = send_elems(c, nr), nrv = recv_elems(c, nr);
  cudaStream_t s = r->s[r->calls++ % g_nstreams];
  if (me == 0) describe(c, g_call, sizeof g_call);
  char *dev = r->dev, *host = r->host;
  size_t in_off; /* where the input goes in the arena */
  if (c->inplace) {
    const size_t bytes = (ns > nrv ? ns : nrv) * es;
    p->soff = p->roff = *top;
    p->sbytes = p->rbytes = region(bytes);
    *top += p->rbytes;
    char *base = dev + p->roff + GUARD;
    p->recvp = p->sendp = base;
    if (c->kind == C_ALLGATHER) p->sendp = base + (size_t)me * c->n * es;
    if (c->kind == C_REDUCE_SCATTER) p->recvp = base + (size_t)me * c->n * es;
    in_off = (size_t)(p->sendp - dev);
  } else {
    p->soff = *top;
    p->sbytes = region(ns * es);
    *top += p->sbytes;
    p->roff = *top;
    p->rbytes = region(nrv * es);
    *top += p->rbytes;
    p->sendp = dev + p->soff + GUARD;
    p->recvp = dev + p->roff + GUARD;
    in_off = p->soff + GUARD;
  }
  for (size_t i = 0; i < ns; i++) put(c->dt, host + in_off, i, inval(c, nr, me, i));
  cudaMemsetAsync(dev + p->soff, POISON, p->sbytes, s);
  if (!c->inplace) cudaMemsetAsync(dev + p->roff, POISON, p->rbytes, s);
  if (ns) cudaMemcpyAsync(dev + in_off, host + in_off, ns * es, cudaMemcpyHostToDevice, s);
  flexcoll_result_t res;
  const int dt = c->dt, op = c->op;
  where(me, "inside the flexcoll call", c->seed);
  switch (c->kind) {
    case C_ALLREDUCE: res = flexcoll_allreduce(p->sendp, p->recvp, c->n, dt, op, r->comm, s); break;
    case C_ALLGATHER: res = flexcoll_allgather(p->sendp, p->recvp, c->n, dt, r->comm, s); break;
    case C_REDUCE_SCATTER: res = flexcoll_reduce_scatter(p->sendp, p->recvp, c->n, dt, op, r->comm, s); break;
    case C_BROADCAST: res = flexcoll_broadcast(p->sendp, p->recvp, c->n, dt, c->root, r->comm, s); break;
    case C_REDUCE: res = flexcoll_reduce(p->sendp, p->recvp, c->n, dt, op, c->root, r->comm, s); break;
    case C_ALLTOALL: res = flexcoll_alltoall(p->sendp, p->recvp, c->n, dt, r->comm, s); break;
    default: {
      flexcoll_group_start();
      res = flexcoll_send(p->sendp, c->n, dt, (me + 1) % nr, r->comm, s);
      flexcoll_result_t r2 = flexcoll_recv(p->recvp, c->n, dt, (me + nr - 1) % nr, r->comm, s);
      flexcoll_result_t r3 = flexcoll_group_end();
      if (res == FLEXCOLL_SUCCESS) res = r2 != FLEXCOLL_SUCCESS ? r2 : r3;
      break;
    }
  }
  p->ok = res == FLEXCOLL_SUCCESS;
  if (!p->ok) {
    char d[200];
    describe(c, d, sizeof d);
    FAIL(r, "%s: returned %s: %s", d, flexcoll_get_error_string(res), flexcoll_get_last_error(r->comm));
  }
  where(me, "enqueuing the copies after its call", c->seed);
  /* With one queue nothing may follow the kernel before it is done (g_lockstep). */
  if (g_lockstep) cudaStreamSynchronize(s);
  cudaMemcpyAsync(host + p->soff, dev + p->soff, p->sbytes, cudaMemcpyDeviceToHost, s);
  if (!c->inplace) cudaMemcpyAsync(host + p->roff, dev + p->roff, p->rbytes, cudaMemcpyDeviceToHost, s);
}

static void finish_batch(rank_t *r, pend_t *batch, int nb) {
  where(r->rank, "waiting for its streams (cudaStreamSynchronize) after a batch of calls", nb ? batch[nb - 1].c->seed : 0);
  for (int k = 0; k < g_nstreams; k++) {
    cudaError_t ce = cudaStreamSynchronize(r->s[k]);
    if (ce != cudaSuccess) FAIL(r, "stream %d: %s", k, cudaGetErrorString(ce));
  }
  flexcoll_result_t async = FLEXCOLL_SUCCESS;
  flexcoll_comm_get_async_error(r->comm, &async);
  if (async != FLEXCOLL_SUCCESS) FAIL(r, "async error %s: %s", flexcoll_get_error_string(async), flexcoll_get_last_error(r->comm));
  where(r->rank, "checking its results, then at the barrier after the checks", nb ? batch[nb - 1].c->seed : 0);
  for (int b = 0; b < nb; b++)
    if (batch[b].ok) check_call(r, &batch[b]);
  /* Every rank's copies are in place: compare the allreduce results byte for byte with rank 0's
   * (the arenas' layouts are the same on every rank). */
  pthread_barrier_wait(&g_barrier);
  if (r->rank != 0)
    for (int b = 0; b < nb; b++) {
      const pend_t *p = &batch[b];
      if (p->c->kind != C_ALLREDUCE) continue;
      const size_t bytes = p->c->n * dt_size(p->c->dt);
      const size_t at = (size_t)(p->recvp - r->dev);
      if (memcmp(r->host + at, g_ranks[0].host + at, bytes)) {
        char d[200];
        describe(p->c, d, sizeof d);
        FAIL(r, "%s: the result differs from rank 0's in its bytes", d);
      }
    }
  pthread_barrier_wait(&g_barrier); /* rank 0's copies are reused next */
}

static void run_cases(rank_t *r, const case_t *cases, size_t ncases) {
  pend_t batch[BATCH_CALLS];
  int nb = 0;
  size_t top = 0;
  for (size_t k = 0; k < ncases; k++) {
    const size_t need = footprint(&cases[k], g_nranks);
    if (nb == (g_lockstep ? 1 : BATCH_CALLS) || (nb && top + need > r->cap)) {
      finish_batch(r, batch, nb);
      nb = 0;
      top = 0;
    }
    batch[nb].c = &cases[k];
    issue_call(r, &batch[nb++], &top);
  }
  if (nb) finish_batch(r, batch, nb);
}

/* ---- TP and DP groups of 4 ranks ---- */

#define TPDP_ROUNDS 6
#define TPDP_SMALL 1000
#define TPDP_BIG (1u << 20)
static size_t tpdp_count(int round) { return round % 2 ? TPDP_BIG : TPDP_SMALL; }
static float tpdp_val(int iter, int round, int g, int rank, size_t i) {
  return (float)((int)(mix(((uint64_t)iter << 48) ^ ((uint64_t)round << 40) ^ ((uint64_t)g << 36) ^
                           ((uint64_t)rank << 32) ^ i) % 31) - 15);
}

static void tpdp(rank_t *r) {
  const int me = r->rank;
  /* Members of my group: TP {0,1},{2,3}; DP {0,2},{1,3}. */
  const int members[2][2] = {{me & ~1, me | 1}, {me & 1, (me & 1) + 2}};
  flexcoll_comm_t comms[2] = {r->tp, r->dp};
  for (int iter = 0; iter < 3; iter++) {
    size_t top = 0;
    size_t off[TPDP_ROUNDS][2];
    for (int round = 0; round < TPDP_ROUNDS; round++)
      for (int g = 0; g < 2; g++) {
        const size_t n = tpdp_count(round), bytes = n * sizeof(float);
        cudaStream_t s = r->s[r->calls++ % g_nstreams];
        off[round][g] = top;
        float *in = (float *)(r->host + top), *out;
        for (size_t i = 0; i < n; i++) in[i] = tpdp_val(iter, round, g, me, i);
        cudaMemcpyAsync(r->dev + top, in, bytes, cudaMemcpyHostToDevice, s);
        cudaMemsetAsync(r->dev + top + bytes, POISON, bytes, s);
        out = (float *)(r->dev + top + bytes);
        if (me == 0)
          snprintf(g_call, sizeof g_call, "%s allreduce of %zu float32, iteration %d round %d", g ? "DP" : "TP", n,
                   iter, round);
        flexcoll_result_t res = flexcoll_allreduce(r->dev + top, out, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comms[g], s);
        if (res != FLEXCOLL_SUCCESS)
          FAIL(r, "%s allreduce round %d: %s", g ? "DP" : "TP", round, flexcoll_get_last_error(comms[g]));
        /* With one queue nothing may follow the kernel before it is done (g_lockstep). */
        if (g_lockstep) cudaStreamSynchronize(s);
        cudaMemcpyAsync(r->host + top + bytes, out, bytes, cudaMemcpyDeviceToHost, s);
        top += 2 * bytes;
      }
    for (int k = 0; k < g_nstreams; k++) cudaStreamSynchronize(r->s[k]);
    for (int round = 0; round < TPDP_ROUNDS; round++)
      for (int g = 0; g < 2; g++) {
        const size_t n = tpdp_count(round);
        const float *out = (const float *)(r->host + off[round][g] + n * sizeof(float));
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
          const float want = tpdp_val(iter, round, g, members[g][0], i) + tpdp_val(iter, round, g, members[g][1], i);
          if (out[i] != want && bad++ == 0) first = i;
        }
        if (bad)
          FAIL(r, "%s allreduce of %zu (iteration %d round %d): %zu wrong elements, the first [%zu] = %g", g ? "DP" : "TP",
               n, iter, round, bad, first, out[first]);
      }
  }
}

/* ---- a rank of one N ---- */


static size_t max_footprint(int nranks, case_t *cases) {
  size_t m = (size_t)16 << 20;
  unsigned seed = 0;
  for (int k = 0; k < NKINDS; k++) {
    size_t nc = build_cases(k, nranks, cases, &seed);
    for (size_t i = 0; i < nc; i++) {
      size_t f = footprint(&cases[i], nranks);
      if (f > m) m = f;
    }
  }
  const size_t tpdp_bytes = TPDP_ROUNDS * 2 * 2 * (size_t)TPDP_BIG * sizeof(float);
  if (nranks == 4 && tpdp_bytes > m) m = tpdp_bytes;
  return m;
}

/* Where the environment puts a share on the pcie link, the statistics must show bytes on it
 * (the ring calls above carried them); nvlink's must be there in every environment. */
/* The environments whose ring lane goes over the rdma link (the fake provider). */
static int rdma_env(char key) { return key == 'm' || key == 'n' || key == 'o' || key == 'p' || key == 'q'; }

static void check_link_stats(rank_t *r) {
  flexcoll_link_stats_t st[64]; /* 8 ranks: 3 host links x 7 peers, then the lanes */
  int n = 0;
  flexcoll_result_t res = flexcoll_comm_get_link_stats(r->comm, st, 64, &n);
  if (res != FLEXCOLL_SUCCESS) {
    FAIL(r, "comm_get_link_stats: %s", flexcoll_get_last_error(r->comm));
    return;
  }
  unsigned long long nv = 0, pc = 0, rd = 0;
  int have_nv = 0, have_pc = 0, rd_next = 0;
  const int next = (r->rank + 1) % g_nranks;
  for (int i = 0; i < n && i < 64; i++) {
    if (!strcmp(st[i].name, "nvlink")) have_nv = 1, nv += st[i].bytes;
    if (!strcmp(st[i].name, "pcie")) have_pc = 1, pc += st[i].bytes;
    if (!strcmp(st[i].name, "rdma") && st[i].peer == next) rd_next++, rd += st[i].bytes;
  }
  if (rdma_env(g_env) && (rd_next < 2 || rd == 0))
    FAIL(r, "%d rdma entries toward the next rank with %llu bytes: the ring lane over rdma is not on", rd_next, rd);
  const char *links = getenv("FLEXCOLL_LINKS");
  const int want_pc = g_env == 'f' || g_env == 'g' || g_env == 'h' || g_env == 'j' || g_env == 'p' || g_env == 'q';
  if (!have_nv && !(links && !strstr(links, "nvlink"))) FAIL(r, "no nvlink link in the statistics (%d links)", n);
  if (want_pc && (!have_pc || pc == 0))
    FAIL(r, "the pcie link carried %llu bytes (%s in the statistics)", pc, have_pc ? "listed" : "not listed");
  if (links && !strstr(links, "nvlink") && (have_nv || nv != 0))
    FAIL(r, "FLEXCOLL_LINKS without nvlink, yet nvlink is listed (%llu bytes): the peers were mapped", nv);
}

static void *rank_main(void *arg) {
  rank_t *r = arg;
  cudaSetDevice(0);
  for (int k = 0; k < g_nstreams; k++) cudaStreamCreateWithFlags(&r->s[k], cudaStreamNonBlocking);
  /* Everything is allocated before the first collective: cudaMalloc and cudaFree may wait for
   * the whole device, whose kernels wait for ranks that would be stuck here. */
  r->cap = g_cap;
  int ok = cudaMalloc((void **)&r->dev, r->cap) == cudaSuccess &&
           cudaMallocHost((void **)&r->host, r->cap) == cudaSuccess;
  if (!ok) FAIL(r, "allocating %zu bytes on the device and pinned on the host failed", r->cap);
  case_t *cases = malloc(MAX_CASES_PER_KIND * sizeof *cases);

  phase_begin(r, "init");
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = 0;
  config.timeout_ms = 20000; /* a lost peer fails the test, not hangs it */
  where(r->rank, "inside flexcoll_comm_init_rank", 0);
  flexcoll_result_t res = flexcoll_comm_init_rank(&r->comm, g_nranks, g_id, r->rank, &config);
  if (res != FLEXCOLL_SUCCESS) FAIL(r, "comm_init_rank: %s", flexcoll_get_last_error(NULL));
  ok = agree(r, ok && res == FLEXCOLL_SUCCESS && cases);
  if (ok && g_nranks == 4) {
    /* Every rank joins its TP group first, then its DP group: both inits are collective. */
    res = flexcoll_comm_init_rank(&r->tp, 2, g_tp_ids[r->rank / 2], r->rank % 2, &config);
    if (res != FLEXCOLL_SUCCESS) FAIL(r, "TP comm_init_rank: %s", flexcoll_get_last_error(NULL));
    flexcoll_result_t res2 = flexcoll_comm_init_rank(&r->dp, 2, g_dp_ids[r->rank % 2], r->rank / 2, &config);
    if (res2 != FLEXCOLL_SUCCESS) FAIL(r, "DP comm_init_rank: %s", flexcoll_get_last_error(NULL));
    ok = agree(r, res == FLEXCOLL_SUCCESS && res2 == FLEXCOLL_SUCCESS);
  }
  phase_end(r);

  if (ok) {
    unsigned seed = 1;
    /* Every kind, with one hardware queue too: each call is one kernel per rank (the one-shot,
     * ring, alltoall or point-to-point kernels).  Envs c and i are not run with one queue: a
     * schedule is a kernel per round, and a rank's next round, queued behind its running kernel
     * of this one, would hold back a peer's kernel of this round in the one queue that ranks of
     * one process on one GPU share. */
    for (int kind = 0; kind < NKINDS; kind++) {
      size_t nc = build_cases(kind, g_nranks, cases, &seed);
      phase_begin(r, kind_names[kind]);
      run_cases(r, cases, nc);
      phase_end(r);
    }
    if (g_nranks == 4) {
      phase_begin(r, "tp-dp");
      where(r->rank, "in the TP and DP rounds", 0);
      tpdp(r);
      phase_end(r);
    }
    phase_begin(r, "links");
    check_link_stats(r);
    phase_end(r);
  }

  phase_begin(r, "destroy");
  where(r->rank, "destroying its communicators", 0);
  for (int k = 0; k < g_nstreams; k++) cudaStreamSynchronize(r->s[k]);
  flexcoll_comm_t all[3] = {r->comm, r->tp, r->dp};
  for (int k = 0; k < 3; k++)
    if (all[k] && (res = flexcoll_comm_destroy(all[k])) != FLEXCOLL_SUCCESS)
      FAIL(r, "comm_destroy: %s", flexcoll_get_error_string(res));
  pthread_barrier_wait(&g_barrier); /* no rank's kernel left when the memory goes */
  cudaFree(r->dev);
  cudaFreeHost(r->host);
  for (int k = 0; k < g_nstreams; k++) cudaStreamDestroy(r->s[k]);
  free(cases);
  phase_end(r);
  return NULL;
}

static int run_nranks(int nranks) {
  g_nranks = nranks;
  g_nstreams = streams_per_rank(nranks);
  memset(g_ranks, 0, sizeof g_ranks);
  flexcoll_result_t res = flexcoll_get_unique_id(&g_id);
  for (int g = 0; g < 2 && nranks == 4 && res == FLEXCOLL_SUCCESS; g++) {
    res = flexcoll_get_unique_id(&g_tp_ids[g]);
    if (res == FLEXCOLL_SUCCESS) res = flexcoll_get_unique_id(&g_dp_ids[g]);
  }
  if (res != FLEXCOLL_SUCCESS) {
    fprintf(stderr, TAG " env %c N=%d: get_unique_id: %s\n", g_env, nranks, flexcoll_get_last_error(NULL));
    return 1;
  }
  snprintf(g_phase, sizeof g_phase, "env %c N=%d setup", g_env, nranks);
  g_call[0] = 0;
  alarm(PHASE_ALARM);
  case_t *cases = malloc(MAX_CASES_PER_KIND * sizeof *cases);
  if (!cases) return 1;
  g_cap = max_footprint(nranks, cases);
  free(cases);
  pthread_barrier_init(&g_barrier, NULL, (unsigned)nranks);
  for (int q = 0; q < MAX_RANKS; q++) where(q, NULL, 0);
  g_where_n = nranks;
  pthread_t th[MAX_RANKS];
  for (int q = 0; q < nranks; q++) {
    g_ranks[q].rank = q;
    pthread_create(&th[q], NULL, rank_main, &g_ranks[q]);
  }
  for (int q = 0; q < nranks; q++) pthread_join(th[q], NULL);
  pthread_barrier_destroy(&g_barrier);
  return total_failures() != 0;
}

/* ---- the hang: rank 1 never calls ---- */

typedef struct {
  int rank, failures;
  flexcoll_unique_id_t id;
} hang_rank_t;
static pthread_barrier_t g_hang_barrier;
static int g_hang_abort_fail[2];

static void *hang_main(void *arg) {
  hang_rank_t *h = arg;
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *buf = NULL;
  const size_t n = (size_t)1 << 20;
  if (cudaMalloc((void **)&buf, n * sizeof(float)) != cudaSuccess) buf = NULL;
  else if (cudaMemsetAsync(buf, 0, n * sizeof(float), s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess) {
    cudaFree(buf);
    buf = NULL;
  }
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = 0;
  config.timeout_ms = HANG_TIMEOUT_MS;
  flexcoll_comm_t comm = NULL;
  where(h->rank, "hang: inside flexcoll_comm_init_rank", 0);
  flexcoll_result_t res = flexcoll_comm_init_rank(&comm, 2, h->id, h->rank, &config);
  int ok = res == FLEXCOLL_SUCCESS && buf;
  if (!ok) {
    fprintf(stderr, TAG " env %c hang rank %d: init: %s\n", g_env, h->rank, flexcoll_get_last_error(NULL));
    h->failures++;
  }
  pthread_barrier_wait(&g_hang_barrier);
  if (h->rank == 0 && ok) {
    snprintf(g_phase, sizeof g_phase, "env %c N=2 hang-detect", g_env);
    snprintf(g_call, sizeof g_call, "allreduce of %zu float32 with rank 1 absent, polling the async error", n);
    alarm(PHASE_ALARM);
    const double t0 = now_s(), limit = HANG_TIMEOUT_MS / 1000.0 + 10;
    where(0, "hang: inside the allreduce that rank 1 does not make", 0);
    res = flexcoll_allreduce(buf, buf, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
    /* Enqueued, or (a path that waits on the host) already timed out. */
    if (res != FLEXCOLL_SUCCESS && res != FLEXCOLL_TIMEOUT) {
      fprintf(stderr, TAG " env %c hang: allreduce returned %s: %s\n", g_env, flexcoll_get_error_string(res),
              flexcoll_get_last_error(comm));
      h->failures++;
    }
    flexcoll_result_t async = FLEXCOLL_SUCCESS;
    where(0, "hang: polling its stream and the async error", 0);
    for (;;) {
      cudaError_t q = cudaStreamQuery(s);
      flexcoll_comm_get_async_error(comm, &async);
      if (async != FLEXCOLL_SUCCESS) break;
      if (q == cudaSuccess && res == FLEXCOLL_SUCCESS) {
        fprintf(stderr, TAG " env %c hang: the allreduce finished without rank 1\n", g_env);
        h->failures++;
        break;
      }
      if (now_s() - t0 > limit) break;
      usleep(10000);
    }
    const double took = now_s() - t0;
    if (async != FLEXCOLL_TIMEOUT) {
      fprintf(stderr, TAG " env %c hang: async error %s after %.2f s, not FLEXCOLL_TIMEOUT within %.0f s\n", g_env,
              flexcoll_get_error_string(async), took, limit);
      h->failures++;
    } else if (!strstr(flexcoll_get_last_error(comm), "peer")) {
      /* The code alone does not say what failed: the last error must (whichever path timed out). */
      fprintf(stderr, TAG " env %c hang: FLEXCOLL_TIMEOUT with the last error \"%s\", which names no peer\n", g_env,
              flexcoll_get_last_error(comm));
      h->failures++;
    }
    fprintf(stderr, TAG " env %c N=2 hang-detect: %.2f s %s\n", g_env, took,
            async == FLEXCOLL_TIMEOUT && !h->failures ? "PASS" : "FAIL");
  }
  pthread_barrier_wait(&g_hang_barrier);
  if (h->rank == 0) {
    snprintf(g_phase, sizeof g_phase, "env %c N=2 hang-abort", g_env);
    snprintf(g_call, sizeof g_call, "flexcoll_comm_abort / destroy on both ranks");
    alarm(PHASE_ALARM);
  }
  pthread_barrier_wait(&g_hang_barrier);
  const double t0 = now_s();
  const int failures_before = h->failures;
  where(h->rank, "hang-abort: inside flexcoll_comm_abort", 0);
  if (comm) {
    res = flexcoll_comm_abort(comm);
    if (res != FLEXCOLL_SUCCESS) {
      fprintf(stderr, TAG " env %c hang rank %d: comm_abort: %s\n", g_env, h->rank, flexcoll_get_error_string(res));
      h->failures++;
    }
  }
  /* Aborted, the kernel that waited for rank 1 must end. */
  where(h->rank, "hang-abort: waiting for its stream after the abort", 0);
  while (cudaStreamQuery(s) == cudaErrorNotReady && now_s() - t0 < 10) usleep(10000);
  if (cudaStreamQuery(s) == cudaErrorNotReady) {
    fprintf(stderr, TAG " env %c hang rank %d: the stream still runs 10 s after the abort\n", g_env, h->rank);
    h->failures++;
  }
  where(h->rank, "hang-abort: inside flexcoll_comm_destroy", 0);
  if (comm) flexcoll_comm_destroy(comm);
  where(h->rank, "hang-abort: at the barrier after the destroy", 0);
  g_hang_abort_fail[h->rank] = h->failures != failures_before;
  pthread_barrier_wait(&g_hang_barrier);
  if (h->rank == 0)
    fprintf(stderr, TAG " env %c N=2 hang-abort: %.2f s %s\n", g_env, now_s() - t0,
            g_hang_abort_fail[0] || g_hang_abort_fail[1] ? "FAIL" : "PASS");
  return NULL;
}

static int run_hang(void) {
  hang_rank_t hr[2] = {{.rank = 0}, {.rank = 1}};
  if (flexcoll_get_unique_id(&hr[0].id) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, TAG " env %c hang: get_unique_id: %s\n", g_env, flexcoll_get_last_error(NULL));
    return 1;
  }
  hr[1].id = hr[0].id;
  pthread_barrier_init(&g_hang_barrier, NULL, 2);
  for (int q = 0; q < MAX_RANKS; q++) where(q, NULL, 0);
  g_where_n = 2;
  pthread_t th[2];
  for (int q = 0; q < 2; q++) pthread_create(&th[q], NULL, hang_main, &hr[q]);
  for (int q = 0; q < 2; q++) pthread_join(th[q], NULL);
  const int f = hr[0].failures + hr[1].failures;
  fprintf(stderr, TAG " env %c N=2 hang: %s\n", g_env, f ? "FAIL" : "PASS");
  return f != 0;
}

/* ---- environments, each in a child ---- */

typedef struct {
  char key;
  const char *vars[5][2];
  int one_queue; /* CUDA_DEVICE_MAX_CONNECTIONS=1: lockstep (g_lockstep) */
} env_t;
/* a-c: 32 hardware queues, so that the ranks' 3 streams each (and the library's own) get queues
 * of their own: a communicator orders its kernels on different streams with an event wait, and
 * at the head of a queue shared with another rank's stream that wait holds back the other
 * rank's kernel it is waiting for (the one-process, one-GPU artifact of g_lockstep again; with
 * 8, four ranks of 3 streams share queues). */
#define Q32 {"CUDA_DEVICE_MAX_CONNECTIONS", "32"}
static const env_t envs[] = {
    {'a', {Q32}, 0},
    {'b', {Q32, {"FLEXCOLL_ONESHOT_MAX_BYTES", "0"}}, 0},
    {'c', {Q32, {"FLEXCOLL_ONESHOT_MAX_BYTES", "0"}, {"FLEXCOLL_RING_KERNEL", "0"}}, 0},
    {'d', {{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}, {"FLEXCOLL_ONESHOT_MAX_BYTES", "0"}}, 1},
    {'e', {{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}}, 1},
    /* The pcie link (host staging): half of every ring chunk through host memory; all of it
     * (FLEXCOLL_LINKS without nvlink: every size through the ring kernels); a sliver of it with
     * one hardware queue. */
    {'f', {Q32, {"FLEXCOLL_ONESHOT_MAX_BYTES", "0"}, {"FLEXCOLL_LINK_SHARES", "nvlink:0.5,pcie:0.5"}}, 0},
    {'g', {Q32, {"FLEXCOLL_LINKS", "pcie,shm,tcp"}, {"FLEXCOLL_PCIE_AREA_BYTES", "1M"}}, 0},
    {'h', {{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}, {"FLEXCOLL_ONESHOT_MAX_BYTES", "0"}, {"FLEXCOLL_LINK_SHARES", "nvlink:0.9,pcie:0.1"}}, 1},
    {'i', {Q32, {"FLEXCOLL_ONESHOT_MAX_BYTES", "0"}, {"FLEXCOLL_ALGO", "tree"}}, 0},
    /* The pcie link through copy engines (a proxy thread per rank), every ring call through it. */
    {'j', {Q32, {"FLEXCOLL_LINKS", "pcie,shm,tcp"}, {"FLEXCOLL_PCIE_ENGINE", "ce"}, {"FLEXCOLL_PCIE_AREA_BYTES", "1M"}}, 0},
    /* No device path at all: the host schedules, on host copies (k) or the device buffers (l). */
    {'k', {Q32, {"FLEXCOLL_LINKS", "shm,tcp"}, {"FLEXCOLL_UCX_CUDA", "0"}}, 0},
    {'l', {Q32, {"FLEXCOLL_LINKS", "shm,tcp"}}, 0},
    /* The ring kernels' second lane over the rdma link (the fake provider: child_main). */
    {'m', {Q32, {"FLEXCOLL_LINKS", "rdma,shm,tcp"}, {"FLEXCOLL_RING_LANE", "rdma"}, {"FLEXCOLL_PCIE_AREA_BYTES", "1M"}}, 0},
    {'n',
     {Q32, {"FLEXCOLL_LINKS", "nvlink,rdma,shm,tcp"}, {"FLEXCOLL_RING_LANE", "rdma"}, {"FLEXCOLL_ONESHOT_MAX_BYTES", "0"},
      {"FLEXCOLL_LINK_SHARES", "nvlink:0.5,rdma:0.5"}},
     0},
    {'o',
     {Q32, {"FLEXCOLL_LINKS", "rdma,shm,tcp"}, {"FLEXCOLL_RING_LANE", "rdma"}, {"FLEXCOLL_PCIE_AREA_BYTES", "1M"},
      {"FLEXCOLL_RING_LANE_INBAND", "1"}},
     0},
    /* Three lanes: NVLink, host memory and the rdma link, each with a fixed share (p); the two
     * side lanes alone, without peer access (q). */
    {'p',
     {Q32, {"FLEXCOLL_LINKS", "nvlink,pcie,rdma,shm,tcp"}, {"FLEXCOLL_RING_LANE", "pcie,rdma"},
      {"FLEXCOLL_ONESHOT_MAX_BYTES", "0"}, {"FLEXCOLL_LINK_SHARES", "nvlink:0.4,pcie:0.3,rdma:0.3"}},
     0},
    {'q',
     {Q32, {"FLEXCOLL_LINKS", "pcie,rdma,shm,tcp"}, {"FLEXCOLL_RING_LANE", "pcie,rdma"},
      {"FLEXCOLL_PCIE_AREA_BYTES", "1M"}, {"FLEXCOLL_LINK_SHARES", "pcie:0.5,rdma:0.5"}},
     0},
};
#define NENVS (int)(sizeof envs / sizeof envs[0])

static int env_flag(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

static int parse_ranks(int *out) {
  const char *s = getenv("FC_ONEGPU_RANKS");
  if (!s || !*s) s = "2,3,4,8";
  int n = 0;
  while (*s && n < 16) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 2 || v > MAX_RANKS) {
      fprintf(stderr, TAG " FC_ONEGPU_RANKS: \"%s\" is not a list of rank counts 2..%d\n", s, MAX_RANKS);
      return -1;
    }
    out[n++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return n;
}

/* A calibration cache of the environment's own, removed when it ends (as the other tests
 * remove theirs). */
static int cache_make(char *dir) {
  if (!mkdtemp(dir)) {
    perror(TAG " mkdtemp");
    return -1;
  }
  setenv("FLEXCOLL_CACHE_DIR", dir, 1);
  return 0;
}
static void cache_remove(const char *dir) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, TAG " could not remove %s\n", dir);
}

/* The child of one environment: its exit status says whether everything passed. */

static int child_main(const env_t *e, const int *ranks, int nranks_list) {
  /* Defaults are defaults: the knobs of the other environments come from nowhere else. */
  unsetenv("FLEXCOLL_ONESHOT_MAX_BYTES");
  unsetenv("FLEXCOLL_RING_KERNEL");
  unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  unsetenv("FLEXCOLL_LINK_SHARES");
  unsetenv("FLEXCOLL_LINKS");
  unsetenv("FLEXCOLL_PCIE_AREA_BYTES");
  unsetenv("FLEXCOLL_ALGO");
  unsetenv("FLEXCOLL_PCIE_ENGINE");
  unsetenv("FLEXCOLL_RING_LANE");
  unsetenv("FLEXCOLL_RING_LANE_INBAND");
  unsetenv("FLEXCOLL_VERBS_PROVIDER");
  for (int k = 0; k < 5; k++)
    if (e->vars[k][0]) setenv(e->vars[k][0], e->vars[k][1], 1);
  if (rdma_env(e->key)) {
#ifdef FC_FAKE_VERBS_LIB
    setenv("FLEXCOLL_VERBS_PROVIDER", "fake", 1);
    setenv("FLEXCOLL_VERBS_FAKE_LIB", FC_FAKE_VERBS_LIB, 1);
#else
    fprintf(stderr, TAG " env %c: skipped (this build has no fake verbs provider: Check and verbs.h)\n", e->key);
    return 0;
#endif
  }
  g_env = e->key;
  g_lockstep = e->one_queue;
  /* Every environment calibrates the ring lanes for itself, under its own hardware queues: with
   * a model left by an earlier run or environment the calibration would never run here (with one
   * queue it hung creation, which the cached model hid). */
  char cache[] = "/tmp/fc-test-onegpu-XXXXXX";
  if (cache_make(cache)) return 1;
  signal(SIGALRM, on_alarm);
  crash_report_install(TAG, on_crash_context);
  int failed = 0;
  for (int i = 0; i < nranks_list; i++) {
    g_nindex = i;
    failed |= run_nranks(ranks[i]);
  }
  failed |= run_hang();
  alarm(0);
  cache_remove(cache);
  return failed || g_phase_fail ? 1 : 0;
}

/* Wait for child pid, bounded (its own watchdog should fire long before). */
static int wait_child(pid_t pid, double limit_s) {
  const double t0 = now_s();
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0) return -1;
    if (now_s() - t0 > limit_s) {
      fprintf(stderr, TAG " child %d still runs after %.0f s: killed\n", (int)pid, limit_s);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    usleep(50000);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  fprintf(stderr, TAG " child %d died of signal %d\n", (int)pid, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return -1;
}

int main(void) {
  g_quick = env_flag("FC_ONEGPU_QUICK");
  if (getenv("FC_ONEGPU_PHASE_ALARM") && atoi(getenv("FC_ONEGPU_PHASE_ALARM")) > 0)
    g_phase_alarm = (unsigned)atoi(getenv("FC_ONEGPU_PHASE_ALARM"));
  int ranks[16];
  const int nranks_list = parse_ranks(ranks);
  if (nranks_list < 0) return 1;
  const char *sel = getenv("FC_ONEGPU_ENVS");
  if (!sel || !*sel) sel = "a,b,c,d,e,f,g,h,i,k,l,m,n,o,p,q";
  setvbuf(stderr, NULL, _IONBF, 0);

  /* The GPU probe in a child too: the parent's CUDA state would not survive a fork. */
  pid_t pid = fork();
  if (pid == 0) {
    int ngpus = 0;
    cudaError_t ce = cudaGetDeviceCount(&ngpus);
    if (ce != cudaSuccess || ngpus == 0) {
      fprintf(stderr, TAG " no GPU (%s): skipped\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device");
      _exit(77);
    }
    _exit(0);
  }
  const int probe = pid < 0 ? -1 : wait_child(pid, 120);
  if (probe == 77) return 77;
  fc_test_gpu_serialize(TAG);
  if (probe != 0) {
    fprintf(stderr, TAG " the GPU probe failed\n");
    return 1;
  }

  int results[NENVS], ran = 0, failed = 0;
  const double limit = (double)nranks_list * 10 * PHASE_ALARM + 4 * PHASE_ALARM;
  for (int k = 0; k < NENVS; k++) {
    results[k] = -2; /* not selected */
    if (!strchr(sel, envs[k].key)) continue;
    ran++;
    fprintf(stderr, TAG " env %c:", envs[k].key);
    for (int v = 0; v < 3 && envs[k].vars[v][0]; v++) fprintf(stderr, " %s=%s", envs[k].vars[v][0], envs[k].vars[v][1]);
    fprintf(stderr, "%s\n", envs[k].vars[0][0] ? "" : " defaults");
    pid = fork();
    if (pid == 0) _exit(child_main(&envs[k], ranks, nranks_list));
    results[k] = pid < 0 ? -1 : wait_child(pid, limit);
    failed += results[k] != 0;
  }
  fprintf(stderr, TAG " summary:");
  for (int k = 0; k < NENVS; k++)
    if (results[k] != -2) fprintf(stderr, " %c=%s", envs[k].key, results[k] == 0 ? "PASS" : "FAIL");
  fprintf(stderr, "%s\n", ran ? "" : " no environment selected");
  fprintf(stderr, TAG " %s (%d of %d environments failed%s)\n", failed || !ran ? "FAILED" : "passed", failed, ran,
          g_quick ? ", quick" : "");
  return failed || !ran ? 1 : 0;
}
