/* test_gpu_failure.c — device collectives whose peer process dies, aborts, or never calls.
 *
 * A job loses a rank in ways that no thread test shows: the process is SIGKILLed in the middle
 * of a kernel (its GPU context and the memory its peers mapped through CUDA IPC vanish, its
 * sockets close without a goodbye), or it aborts, or it hangs.  The survivors must find out
 * through flexcoll_comm_get_async_error (device calls return when enqueued, so that is the only
 * place a kernel's failure shows), get out with flexcoll_comm_abort, find their stream idle
 * again, and exit normally, because that is what lets a framework restart the job instead of
 * hanging it.  So ranks are separate processes here, all on device 0 (one H200 node runs it),
 * each with timeout_ms = 4000:
 *   kill-2, kill-3  2 and 3 ranks loop over float32 sum allreduces of 4 MiB and 64 MiB (with 2
 *                   ranks 4 MiB is below the one-shot limit of 8 MiB, so both the one-shot and
 *                   the ring kernels are in flight; with 3 the limit is 1 MiB: ring only), the
 *                   first few checked exactly; the last rank says it is looping, and 200 ms
 *                   later the parent SIGKILLs it.  Every survivor's async error (or a call's
 *                   direct result) must be FLEXCOLL_REMOTE_ERROR or FLEXCOLL_TIMEOUT within
 *                   timeout + 10 s of the kill, abort must return within 10 s, the stream must
 *                   be idle 10 s after it, and the device memory that cudaMemGetInfo calls free
 *                   must come back to within 64 MiB of what it was before init (a leak here
 *                   is a leak at every restart of a long job).  The victim starts CUDA only
 *                   after the survivors measured, and they measure again after it is reaped,
 *                   so that the other processes on the GPU are in the same state both times.
 *   kill-hosts      kill-2 with the 2 ranks as two hosts (FLEXCOLL_HOSTID): no peer access between
 *                   them, so the allreduces run the host schedule (through host copies, or on
 *                   the device buffers where a link takes them) and the kill lands in a host
 *                   wait rather than a kernel's.
 *   kill-lane       kill-hosts with the ring kernels' lane over rdma on the fake verbs provider
 *                   (FLEXCOLL_RING_LANE=rdma, in band between the "hosts"): the allreduces run in
 *                   the ring kernels, and the kill lands in a kernel waiting for the lane's
 *                   proxy, whose link to the dead rank breaks.
 *   silent-lane     silent with the same two "hosts" and lane: the survivor's kernel waits on the
 *                   lane and must time out, its proxy stop without waiting for acknowledgements.
 *   abort           2 ranks; rank 1 stops calling and aborts while rank 0 has a stream of
 *                   64 MiB allreduces waiting for it: rank 0 as above, both exit 0.
 *   silent          2 ranks; rank 1 initialises and never calls: rank 0's 64 MiB allreduce
 *                   must end in FLEXCOLL_TIMEOUT within timeout + 10 s; then both abort.
 * Without MPS, processes on one GPU take turns in time slices, so kernels that spin on each other
 * progress at the switches: slower than the threads of tests/test_onegpu.c, hence few iterations.
 * Times of the kill and of the abort are CLOCK_MONOTONIC, the same in every process of the node,
 * and travel through the pipes by which the parent steers its children.
 *
 * The parent never touches CUDA: a process that initialised CUDA cannot fork children that use
 * it, so even the GPU probe runs in a child.  It makes each case's unique id before forking (the
 * id is plain bytes; the parent stays the bootstrap root).  The library reads its environment
 * once per process, which one process per rank gives for free.  Every wait is bounded: alarm()
 * watchdogs in the children print "HANG: <case> <what>" and _exit(1), and the parent kills the
 * children of a case still running after CASE_LIMIT.  Ranks print their own lines, the parent
 * one line per case and a summary; FC_GPUFAIL_CASES (default
 * "kill-2,kill-3,kill-hosts,kill-lane,abort,silent,silent-lane") picks cases; the lane's cases
 * are skipped, saying so, where the build has no fake verbs provider.  Exit 77 (automake's skip) where there is no GPU, or where device 0 is in
 * exclusive-process mode (ranks cannot share it). */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flexcoll.h"
#include "gpu_serial.h"

#define TAG "[test_gpu_failure]"
#define TIMEOUT_MS 4000
#define DETECT_LIMIT (TIMEOUT_MS / 1000.0 + 10.0)
#define ABORT_LIMIT 10.0
#define IDLE_LIMIT 10.0
#define MEM_TOLERANCE_MIB 64.0
#define SMALL_COUNT ((size_t)1 << 20) /* 4 MiB of float32 */
#define BIG_COUNT ((size_t)1 << 24)   /* 64 MiB */
#define CHECKED 4                     /* iterations checked exactly before the failure */
#define STREAM_CALLS 4                /* allreduces rank 0 of "abort" leaves waiting */
#define KILL_DELAY_US 200000
#define CASE_LIMIT 60.0               /* the parent kills a case's children after this */
#define SETUP_ALARM 45                /* CUDA context, buffers, init, checked iterations */

enum { K_KILL, K_ABORT, K_SILENT };
typedef struct {
  const char *name;
  int kind, nranks;
  int hosts; /* > 1: rank r on "host" r mod hosts (FLEXCOLL_HOSTID), no peer access between them */
  int lane;  /* the ring kernels' lane over rdma on the fake provider */
} case_t;
static const case_t cases[] = {
    {"kill-2", K_KILL, 2, 1, 0},      {"kill-3", K_KILL, 3, 1, 0}, {"kill-hosts", K_KILL, 2, 2, 0},
    {"kill-lane", K_KILL, 2, 2, 1},   {"abort", K_ABORT, 2, 1, 0}, {"silent", K_SILENT, 2, 1, 0},
    {"silent-lane", K_SILENT, 2, 2, 1},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* One message between the parent and a child; a few bytes, so a pipe carries it whole. */
typedef struct {
  char tag;
  double a, b, c;
} msg_t;

/* Not fabs: no -lm for one call. */
static double abs_d(double x) { return x < 0 ? -x : x; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the child's side ---- */

static const char *g_case = "probe";
static int g_rank = -1;
static char g_what[256] = "start";
static int g_to = -1, g_from = -1; /* pipes to and from the parent */
static double g_event_t = -1;      /* when the peer was killed or aborted; < 0: not known yet */

static void put(const char *s) { (void)!write(2, s, strnlen(s, 512)); }
static void on_alarm(int sig) {
  (void)sig;
  char rank[2] = {(char)('0' + (g_rank >= 0 && g_rank < 10 ? g_rank : 0)), 0};
  put(TAG " HANG: "), put(g_case), put(" rank "), put(rank), put(": "), put(g_what), put("\n");
  _exit(1);
}

/* What the child waits for next, and for how long at most before the watchdog says so. */
static void phase(unsigned secs, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_what, sizeof g_what, fmt, ap);
  va_end(ap);
  alarm(secs);
}

static void say(const char *fmt, ...) {
  char line[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, TAG " %s rank %d: %s\n", g_case, g_rank, line);
}

typedef struct {
  int rank, nranks, fail;
  flexcoll_comm_t comm;
  cudaStream_t s;
  float *send, *recv, *host;
} rk_t;

#define FAIL(r, ...)              \
  do {                            \
    say("FAIL: " __VA_ARGS__);    \
    (r)->fail++;                  \
  } while (0)

static void tell(char tag, double a, double b, double c) {
  msg_t m = {tag, a, b, c};
  (void)!write(g_to, &m, sizeof m);
}

/* The next message from the parent within limit_s (0: only one already there); 1 when it has
 * tag `want`. */
static int hear(char want, double limit_s, msg_t *m) {
  struct pollfd p = {g_from, POLLIN, 0};
  int k;
  do k = poll(&p, 1, (int)(limit_s * 1000));
  while (k < 0 && errno == EINTR);
  if (k <= 0) return 0;
  msg_t got;
  ssize_t n;
  do n = read(g_from, &got, sizeof got);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof got) {
    say("the parent's pipe closed");
    _exit(1);
  }
  if (got.tag != want) {
    say("unexpected message '%c' from the parent (waiting for '%c')", got.tag, want);
    return 0;
  }
  if (m) *m = got;
  return 1;
}

/* The time of the peer's failure, once the parent has sent it. */
static void poll_event(void) {
  msg_t m;
  if (g_event_t < 0 && hear('E', 0, &m)) g_event_t = m.a;
}

static const char *res_name(flexcoll_result_t r) { return flexcoll_get_error_string(r); }
static int peer_failure(flexcoll_result_t r) { return r == FLEXCOLL_REMOTE_ERROR || r == FLEXCOLL_TIMEOUT; }

/* Device 0, its context made (cudaFree(0)) and everything this test allocates, so that a
 * cudaMemGetInfo now and one after destroy see the library's share alone. */
static int setup_device(rk_t *r) {
  cudaError_t ce = cudaSetDevice(0);
  if (ce == cudaSuccess) ce = cudaFree(0);
  if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking);
  if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->send, BIG_COUNT * sizeof(float));
  if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->recv, BIG_COUNT * sizeof(float));
  r->host = malloc(BIG_COUNT * sizeof(float));
  if (ce != cudaSuccess || !r->host) {
    FAIL(r, "setting up device 0: %s", ce != cudaSuccess ? cudaGetErrorString(ce) : "out of host memory");
    return 0;
  }
  return 1;
}

static int init_comm(rk_t *r, const flexcoll_unique_id_t *id) {
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = 0;
  config.timeout_ms = TIMEOUT_MS;
  phase(SETUP_ALARM, "flexcoll_comm_init_rank (%d ranks)", r->nranks);
  flexcoll_result_t res = flexcoll_comm_init_rank(&r->comm, r->nranks, *id, r->rank, &config);
  if (res != FLEXCOLL_SUCCESS) {
    FAIL(r, "flexcoll_comm_init_rank: %s: %s", res_name(res), flexcoll_get_last_error(NULL));
    r->comm = NULL;
    return 0;
  }
  return 1;
}

static size_t count_of(int kind, int it) { return kind == K_KILL && it % 2 == 0 ? SMALL_COUNT : BIG_COUNT; }

/* One allreduce of fresh small integers (exact sums), waited for with the async error polled
 * and compared element by element. */
static int checked_allreduce(rk_t *r, size_t n, int it) {
  phase(SETUP_ALARM, "checked allreduce %d of %zu float32", it, n);
  for (size_t i = 0; i < n; i++) r->host[i] = (float)(r->rank + 1) * (float)(i % 13 + (size_t)it);
  /* On the rank's stream and waited for: a cudaMemcpy from pageable memory may return before
   * its bytes land, and the non-blocking stream would not wait for it. */
  if (cudaMemcpyAsync(r->send, r->host, n * sizeof(float), cudaMemcpyHostToDevice, r->s) != cudaSuccess ||
      cudaStreamSynchronize(r->s) != cudaSuccess) {
    FAIL(r, "copying the input failed");
    return 0;
  }
  flexcoll_result_t res = flexcoll_allreduce(r->send, r->recv, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r->comm, r->s);
  if (res != FLEXCOLL_SUCCESS) {
    FAIL(r, "allreduce %d of %zu before the failure: %s: %s", it, n, res_name(res), flexcoll_get_last_error(r->comm));
    return 0;
  }
  cudaError_t q;
  flexcoll_result_t async = FLEXCOLL_SUCCESS;
  while ((q = cudaStreamQuery(r->s)) == cudaErrorNotReady) {
    flexcoll_comm_get_async_error(r->comm, &async);
    if (async != FLEXCOLL_SUCCESS) break;
    usleep(1000);
  }
  if (q != cudaSuccess && q != cudaErrorNotReady) {
    FAIL(r, "allreduce %d of %zu before the failure: stream: %s", it, n, cudaGetErrorString(q));
    return 0;
  }
  if (async != FLEXCOLL_SUCCESS) {
    FAIL(r, "allreduce %d of %zu before the failure: async error %s: %s", it, n, res_name(async),
         flexcoll_get_last_error(r->comm));
    return 0;
  }
  if (cudaMemcpy(r->host, r->recv, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
    FAIL(r, "cudaMemcpy of the result failed");
    return 0;
  }
  const float ranksum = (float)(r->nranks * (r->nranks + 1) / 2);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (r->host[i] != ranksum * (float)(i % 13 + (size_t)it) && !bad++) first = i;
  if (bad) {
    FAIL(r, "allreduce %d of %zu: %zu wrong elements, the first [%zu] = %g, not %g", it, n, bad, first,
         r->host[first], ranksum * (float)(first % 13 + (size_t)it));
    return 0;
  }
  return 1;
}

typedef struct {
  flexcoll_result_t err; /* SUCCESS: nothing seen */
  double t;
  int direct;            /* a call returned it, not get_async_error */
} detect_t;

/* Poll comm until it reports an error: keep_calling enqueues the next allreduce of the
 * sequence whenever the stream is idle (so calls are in flight when the peer goes), else the
 * work already enqueued must not finish.  The deadline is timeout + 10 s after the peer's
 * failure once the parent has said when that was, else `fallback`.  Returns 0 on time-out. */
static int drive(rk_t *r, int kind, int it, int keep_calling, double fallback, detect_t *d) {
  int stopped = !keep_calling, stream_bad = 0;
  d->err = FLEXCOLL_SUCCESS;
  d->direct = 0;
  for (;;) {
    const double now = now_s();
    poll_event();
    flexcoll_result_t async = FLEXCOLL_SUCCESS;
    flexcoll_comm_get_async_error(r->comm, &async);
    if (async != FLEXCOLL_SUCCESS && async != FLEXCOLL_IN_PROGRESS) {
      d->err = async;
      d->t = now_s();
      return 1;
    }
    const cudaError_t q = cudaStreamQuery(r->s);
    if (q != cudaSuccess && q != cudaErrorNotReady && !stream_bad) {
      /* A failed kernel: the async error should follow; keep polling for it. */
      say("the stream reports %s", cudaGetErrorString(q));
      stream_bad = stopped = 1;
    }
    if (q == cudaSuccess && !keep_calling) {
      FAIL(r, "the allreduces finished without the peer (async error still %s)", res_name(async));
      return 0;
    }
    if (q == cudaSuccess && !stopped) {
      const size_t n = count_of(kind, it);
      flexcoll_result_t res = flexcoll_allreduce(r->send, r->recv, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r->comm, r->s);
      snprintf(g_what, sizeof g_what, "allreduce %d of %zu float32 while the peer goes", it, n);
      it++;
      if (peer_failure(res)) {
        d->err = res;
        d->t = now_s(); /* when it returned: a blocking call (host copies) may have started before the kill */
        d->direct = 1;
        return 1;
      }
      if (res != FLEXCOLL_SUCCESS) {
        say("allreduce %d returned %s (%s); waiting for the async error", it - 1, res_name(res),
            flexcoll_get_last_error(r->comm));
        stopped = 1;
      }
    }
    if (now > (g_event_t >= 0 ? g_event_t + DETECT_LIMIT : fallback)) return 0;
    usleep(1000);
  }
}

/* Judge a detection against the peer's failure at g_event_t (waited for here when the
 * parent has not sent it yet); allowed: REMOTE_ERROR or TIMEOUT, or TIMEOUT only. */
static double judge(rk_t *r, int found, const detect_t *d, int timeout_only, const char *cause) {
  if (g_event_t < 0) {
    msg_t m;
    phase(30, "waiting for the time of the %s", cause);
    if (hear('E', 25, &m)) g_event_t = m.a;
  }
  if (!found) {
    FAIL(r, "no error within %.0f s of the %s", DETECT_LIMIT, cause);
    return NAN;
  }
  if (g_event_t < 0) {
    FAIL(r, "%s %s, but the parent never said when the %s was", res_name(d->err), d->direct ? "returned" : "(async)",
         cause);
    return NAN;
  }
  const double lat = d->t - g_event_t;
  const int ok_kind = timeout_only ? d->err == FLEXCOLL_TIMEOUT : peer_failure(d->err);
  if (!ok_kind) FAIL(r, "%s%s after the %s, not %s: %s", res_name(d->err), d->direct ? " returned" : " (async)", cause,
                     timeout_only ? "FLEXCOLL_TIMEOUT" : "FLEXCOLL_REMOTE_ERROR or FLEXCOLL_TIMEOUT",
                     flexcoll_get_last_error(r->comm));
  else if (lat < 0) FAIL(r, "%s %.3f s BEFORE the %s", res_name(d->err), -lat, cause);
  else if (lat > DETECT_LIMIT) FAIL(r, "%s only %.2f s after the %s (limit %.0f s)", res_name(d->err), lat, cause,
                                    DETECT_LIMIT);
  else say("%s%s %.3f s after the %s", res_name(d->err), d->direct ? " returned by allreduce" : " (async)", lat,
           cause);
  return lat;
}

/* Abort (bounded), wait for the stream to drain, destroy; the time of abort + drain. */
static double finish(rk_t *r) {
  if (!r->comm) return NAN;
  phase((unsigned)ABORT_LIMIT + 5, "flexcoll_comm_abort");
  const double t0 = now_s();
  flexcoll_result_t res = flexcoll_comm_abort(r->comm);
  const double ta = now_s() - t0;
  if (res != FLEXCOLL_SUCCESS) FAIL(r, "flexcoll_comm_abort: %s", res_name(res));
  if (ta > ABORT_LIMIT) FAIL(r, "flexcoll_comm_abort took %.2f s (limit %.0f s)", ta, ABORT_LIMIT);
  phase((unsigned)IDLE_LIMIT + 5, "waiting for the stream after the abort");
  cudaError_t q;
  while ((q = cudaStreamQuery(r->s)) == cudaErrorNotReady && now_s() - t0 < ta + IDLE_LIMIT) usleep(1000);
  const double ti = now_s() - t0;
  if (q == cudaErrorNotReady) FAIL(r, "the stream still runs %.0f s after the abort", IDLE_LIMIT);
  phase(30, "flexcoll_comm_destroy after the abort");
  const double t1 = now_s();
  res = flexcoll_comm_destroy(r->comm);
  r->comm = NULL;
  if (res != FLEXCOLL_SUCCESS) FAIL(r, "flexcoll_comm_destroy after the abort: %s", res_name(res));
  say("abort %.3f s, stream idle %.3f s after it (%s), destroy %.3f s", ta, ti, cudaGetErrorString(q), now_s() - t1);
  return ti;
}

static double free_mib(rk_t *r) {
  size_t fr = 0, total = 0;
  cudaError_t ce = cudaMemGetInfo(&fr, &total);
  if (ce != cudaSuccess) {
    FAIL(r, "cudaMemGetInfo: %s", cudaGetErrorString(ce));
    return NAN;
  }
  return (double)fr / (1024.0 * 1024.0);
}

/* kill-N: ranks 0..N-2 survive, N-1 is killed. */
static int child_kill(rk_t *r, const flexcoll_unique_id_t *id) {
  const int victim = r->rank == r->nranks - 1;
  double before = NAN, lat = NAN, drain = NAN, diff = NAN;
  phase(SETUP_ALARM + 10, "waiting for the parent's go");
  if (victim && !hear('G', SETUP_ALARM, NULL)) return 1; /* CUDA only once the survivors measured */
  phase(SETUP_ALARM, "setting up device 0");
  if (!setup_device(r)) return 1;
  if (!victim) {
    tell('W', 0, 0, 0);
    phase(SETUP_ALARM + 10, "waiting for the other survivors' contexts");
    if (!hear('G', SETUP_ALARM, NULL)) return 1;
    before = free_mib(r);
    tell('M', 0, 0, 0);
  }
  if (!init_comm(r, id)) return 1;
  int it = 0;
  for (; it < CHECKED; it++)
    if (!checked_allreduce(r, count_of(K_KILL, it), it)) return 1;
  detect_t d;
  if (victim) {
    tell('R', 0, 0, 0);
    phase(SETUP_ALARM, "looping, waiting to be killed");
    drive(r, K_KILL, it, 1, now_s() + SETUP_ALARM, &d);
    say("FAIL: still alive (%s)", d.err != FLEXCOLL_SUCCESS ? res_name(d.err) : "no error");
    for (;;) pause(); /* the parent's kill, or the watchdog */
  }
  phase((unsigned)(DETECT_LIMIT + SETUP_ALARM), "allreduces in flight, waiting for an error after the kill");
  const int found = drive(r, K_KILL, it, 1, now_s() + SETUP_ALARM, &d);
  lat = judge(r, found, &d, 0, "kill");
  drain = finish(r);
  tell('D', 0, 0, 0);
  phase(40, "waiting for the other survivors to destroy");
  if (!hear('G', 35, NULL)) return 1;
  /* The driver may release the killed process's memory a little after it is reaped. */
  phase(10, "cudaMemGetInfo after destroy");
  for (int k = 0; k < 30; k++) {
    diff = before - free_mib(r);
    if (!(abs_d(diff) > MEM_TOLERANCE_MIB)) break;
    usleep(100000);
  }
  if (!(abs_d(diff) <= MEM_TOLERANCE_MIB))
    FAIL(r, "device memory: %.1f MiB free before init, %.1f MiB less after abort + destroy (limit %.0f MiB)", before, diff,
         MEM_TOLERANCE_MIB);
  else say("device memory: %.1f MiB free before init, %+.1f MiB not given back after abort + destroy", before, diff);
  tell('T', lat, drain, diff);
  return 0;
}

/* abort: rank 0 waits with a stream of allreduces while rank 1 aborts. */
static int child_abort(rk_t *r, const flexcoll_unique_id_t *id) {
  phase(SETUP_ALARM, "setting up device 0");
  if (!setup_device(r) || !init_comm(r, id)) return 1;
  for (int it = 0; it < CHECKED; it++)
    if (!checked_allreduce(r, BIG_COUNT, it)) return 1;
  if (r->rank == 1) {
    phase(SETUP_ALARM + 5, "waiting for the parent to say rank 0 is waiting");
    if (!hear('A', SETUP_ALARM, NULL)) return 1;
    usleep(KILL_DELAY_US);
    const double t = now_s();
    tell('E', t, 0, 0);
    say("aborting while rank 0 waits");
    finish(r);
    return 0;
  }
  phase(SETUP_ALARM, "enqueuing %d allreduces of %zu float32 that rank 1 will not join", STREAM_CALLS, BIG_COUNT);
  detect_t d = {FLEXCOLL_SUCCESS, 0, 0};
  int found = 0;
  for (int k = 0; k < STREAM_CALLS && !found; k++) {
    flexcoll_result_t res = flexcoll_allreduce(r->send, r->recv, BIG_COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r->comm, r->s);
    if (peer_failure(res)) d = (detect_t){res, now_s(), 1}, found = 1;
    else if (res != FLEXCOLL_SUCCESS) {
      FAIL(r, "allreduce %d of the stream: %s: %s", k, res_name(res), flexcoll_get_last_error(r->comm));
      break;
    }
  }
  tell('I', 0, 0, 0);
  phase((unsigned)(DETECT_LIMIT + SETUP_ALARM), "waiting for an error after rank 1's abort");
  if (!found) found = drive(r, K_ABORT, CHECKED + STREAM_CALLS, 0, now_s() + SETUP_ALARM, &d);
  const double lat = judge(r, found, &d, 0, "peer's abort");
  const double drain = finish(r);
  tell('T', lat, drain, NAN);
  return 0;
}

/* silent: rank 1 initialises and waits for the parent; rank 0 must time out. */
static int child_silent(rk_t *r, const flexcoll_unique_id_t *id) {
  phase(SETUP_ALARM, "setting up device 0");
  if (!setup_device(r) || !init_comm(r, id)) return 1;
  if (r->rank == 1) {
    phase((unsigned)CASE_LIMIT, "initialised, never calling, waiting for the parent");
    if (!hear('G', CASE_LIMIT - 5, NULL)) return 1;
    finish(r);
    return 0;
  }
  phase((unsigned)(DETECT_LIMIT + 5), "allreduce of %zu float32 that rank 1 never joins", BIG_COUNT);
  detect_t d = {FLEXCOLL_SUCCESS, 0, 0};
  int found = 0;
  g_event_t = now_s();
  flexcoll_result_t res = flexcoll_allreduce(r->send, r->recv, BIG_COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r->comm, r->s);
  if (peer_failure(res)) d = (detect_t){res, now_s(), 1}, found = 1;
  else if (res != FLEXCOLL_SUCCESS)
    FAIL(r, "allreduce: %s: %s", res_name(res), flexcoll_get_last_error(r->comm));
  if (!found && res == FLEXCOLL_SUCCESS) found = drive(r, K_SILENT, 0, 0, g_event_t + DETECT_LIMIT, &d);
  const double lat = judge(r, found, &d, 1, "call");
  const double drain = finish(r);
  tell('D', 0, 0, 0);
  tell('T', lat, drain, NAN);
  return 0;
}

static int child_main(const case_t *c, int rank, const flexcoll_unique_id_t *id) {
  g_case = c->name;
  g_rank = rank;
  signal(SIGALRM, on_alarm);
  signal(SIGPIPE, SIG_DFL); /* a write to a dead peer's socket must not be hidden from the library */
  rk_t r;
  memset(&r, 0, sizeof r);
  r.rank = rank;
  r.nranks = c->nranks;
  if (c->hosts > 1) {
    char host[32];
    snprintf(host, sizeof host, "fc-gpufail-%d", rank % c->hosts);
    setenv("FLEXCOLL_HOSTID", host, 1);
  }
#ifdef FC_FAKE_VERBS_LIB
  if (c->lane) {
    setenv("FLEXCOLL_LINKS", "rdma,shm,tcp", 1);
    setenv("FLEXCOLL_RING_LANE", "rdma", 1);
    setenv("FLEXCOLL_VERBS_PROVIDER", "fake", 1);
    setenv("FLEXCOLL_VERBS_FAKE_LIB", FC_FAKE_VERBS_LIB, 1);
  }
#endif
  int rc = c->kind == K_KILL ? child_kill(&r, id) : c->kind == K_ABORT ? child_abort(&r, id) : child_silent(&r, id);
  phase(30, "freeing the buffers");
  if (r.comm) { /* left early: get out as a failed job would */
    flexcoll_comm_abort(r.comm);
    flexcoll_comm_destroy(r.comm);
  }
  cudaFree(r.send);
  cudaFree(r.recv);
  if (r.s) cudaStreamDestroy(r.s);
  free(r.host);
  say("%s", rc || r.fail ? "FAIL" : "ok");
  phase(30, "exit (library and CUDA teardown)");
  return rc || r.fail ? 1 : 0;
}

/* ---- the parent's side ---- */

typedef struct {
  pid_t pid;
  int to, from, done, status;
} kid_t;

static int fork_kid(kid_t *kids, int rank, const case_t *c, const flexcoll_unique_id_t *id) {
  int down[2], up[2];
  if (pipe(down)) return 0;
  if (pipe(up)) {
    close(down[0]), close(down[1]);
    return 0;
  }
  const pid_t parent = getpid();
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    close(down[0]), close(down[1]), close(up[0]), close(up[1]);
    return 0;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(3);
    for (int q = 0; q < rank; q++) close(kids[q].to), close(kids[q].from);
    close(down[1]), close(up[0]);
    g_from = down[0];
    g_to = up[1];
    exit(child_main(c, rank, id)); /* exit, not _exit: a crash in teardown counts */
  }
  close(down[0]), close(up[1]);
  kids[rank] = (kid_t){pid, down[1], up[0], 0, 0};
  return 1;
}

static void send_kid(kid_t *k, char tag, double a) {
  msg_t m = {tag, a, 0, 0};
  (void)!write(k->to, &m, sizeof m);
}

/* The next message from kid `rank` before `deadline`; 1 when it has tag `want`. */
static int expect(const case_t *c, kid_t *k, int rank, char want, const char *what, double deadline, msg_t *m) {
  struct pollfd p = {k->from, POLLIN, 0};
  int n;
  do {
    double left = deadline - now_s();
    n = poll(&p, 1, left > 0 ? (int)(left * 1000) : 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    fprintf(stderr, TAG " %s: rank %d: no word that it %s before the case's limit (%.0f s)\n", c->name, rank, what,
            CASE_LIMIT);
    return 0;
  }
  msg_t got;
  ssize_t r;
  do r = read(k->from, &got, sizeof got);
  while (r < 0 && errno == EINTR);
  if (r != (ssize_t)sizeof got || got.tag != want) {
    fprintf(stderr, TAG " %s: rank %d %s before it %s\n", c->name, rank, r == 0 ? "exited" : "said something else",
            what);
    return 0;
  }
  if (m) *m = got;
  return 1;
}

/* Wait for kid k until deadline; kill it then. */
static void reap(const case_t *c, kid_t *k, int rank, double deadline) {
  while (!k->done) {
    pid_t w = waitpid(k->pid, &k->status, WNOHANG);
    if (w == k->pid || (w < 0 && errno != EINTR)) {
      k->done = w == k->pid ? 1 : 2;
      break;
    }
    if (now_s() > deadline) {
      fprintf(stderr, TAG " %s: rank %d (pid %d) still runs at the case's limit: killed\n", c->name, rank, (int)k->pid);
      kill(k->pid, SIGKILL);
      while (waitpid(k->pid, &k->status, 0) < 0 && errno == EINTR) {}
      k->done = 2;
    }
    usleep(5000);
  }
}

/* Whether kid k exited by itself with status 0 (reported otherwise). */
static int exited_ok(const case_t *c, const kid_t *k, int rank) {
  if (k->done == 1 && WIFEXITED(k->status) && WEXITSTATUS(k->status) == 0) return 1;
  if (k->done != 1) return 0; /* killed at the limit: said already */
  if (WIFEXITED(k->status))
    fprintf(stderr, TAG " %s: rank %d exited with status %d\n", c->name, rank, WEXITSTATUS(k->status));
  else if (WIFSIGNALED(k->status))
    fprintf(stderr, TAG " %s: rank %d died of signal %d (%s)\n", c->name, rank, WTERMSIG(k->status),
            strsignal(WTERMSIG(k->status)));
  return 0;
}

static int run_case(const case_t *c) {
  const double t0 = now_s(), deadline = t0 + CASE_LIMIT;
  flexcoll_unique_id_t id;
  flexcoll_result_t res = flexcoll_get_unique_id(&id);
  if (res != FLEXCOLL_SUCCESS) {
    fprintf(stderr, TAG " %s: FAIL: flexcoll_get_unique_id: %s\n", c->name, flexcoll_get_last_error(NULL));
    return 0;
  }
  kid_t kids[8];
  int n = 0, ok = 1;
  for (; n < c->nranks; n++)
    if (!fork_kid(kids, n, c, &id)) {
      fprintf(stderr, TAG " %s: fork: %s\n", c->name, strerror(errno));
      ok = 0;
      break;
    }
  const int last = c->nranks - 1;
  int survivors = c->kind == K_KILL ? last : 1; /* the ranks that report 'T' */
  double worst_lat = 0, worst_drain = 0, worst_mem = 0;
  msg_t m;
  if (ok && c->kind == K_KILL) {
    for (int q = 0; q < last && ok; q++) ok = expect(c, &kids[q], q, 'W', "set up its device", deadline, NULL);
    for (int q = 0; q < last && ok; q++) send_kid(&kids[q], 'G', 0);
    for (int q = 0; q < last && ok; q++) ok = expect(c, &kids[q], q, 'M', "measured free memory", deadline, NULL);
    if (ok) send_kid(&kids[last], 'G', 0);
    if (ok) ok = expect(c, &kids[last], last, 'R', "loops over allreduces", deadline, NULL);
    if (ok) {
      usleep(KILL_DELAY_US);
      const double t_kill = now_s();
      kill(kids[last].pid, SIGKILL);
      reap(c, &kids[last], last, now_s() + 20);
      if (!(kids[last].done == 1 && WIFSIGNALED(kids[last].status) && WTERMSIG(kids[last].status) == SIGKILL)) {
        fprintf(stderr, TAG " %s: rank %d was gone before the kill\n", c->name, last);
        exited_ok(c, &kids[last], last);
        ok = 0;
      }
      for (int q = 0; q < last; q++) send_kid(&kids[q], 'E', t_kill);
    }
    for (int q = 0; q < last && ok; q++) ok = expect(c, &kids[q], q, 'D', "destroyed its communicator", deadline, NULL);
    for (int q = 0; q < last && ok; q++) send_kid(&kids[q], 'G', 0);
  } else if (ok && c->kind == K_ABORT) {
    ok = expect(c, &kids[0], 0, 'I', "waits in its allreduces", deadline, NULL);
    if (ok) send_kid(&kids[1], 'A', 0);
    if (ok) ok = expect(c, &kids[1], 1, 'E', "aborts", deadline, &m);
    if (ok) send_kid(&kids[0], 'E', m.a);
  } else if (ok) {
    ok = expect(c, &kids[0], 0, 'D', "timed out and destroyed its communicator", deadline, NULL);
    if (ok) send_kid(&kids[1], 'G', 0);
  }
  for (int q = 0; q < survivors && ok; q++) {
    ok = expect(c, &kids[q], q, 'T', "reports its times", deadline, &m);
    if (ok) {
      if (!(m.a <= worst_lat)) worst_lat = m.a;
      if (!(m.b <= worst_drain)) worst_drain = m.b;
      if (!(abs_d(m.c) <= abs_d(worst_mem))) worst_mem = m.c;
    }
  }
  /* After a failed step, give the others a moment to say why, then stop them. */
  const double end = ok ? deadline : (now_s() + 3 < deadline ? now_s() + 3 : deadline);
  for (int q = 0; q < n; q++) {
    reap(c, &kids[q], q, end);
    if (!(c->kind == K_KILL && q == last)) ok &= exited_ok(c, &kids[q], q);
    close(kids[q].to), close(kids[q].from);
  }
  ok &= n == c->nranks;
  char mem[96] = "";
  if (c->kind == K_KILL) snprintf(mem, sizeof mem, ", device memory %+.1f MiB", worst_mem);
  fprintf(stderr, TAG " %s: %s (%d ranks; slowest rank: error %.3f s after the %s, abort + drain %.3f s%s; %.1f s in all)\n",
          c->name, ok ? "PASS" : "FAIL", c->nranks, worst_lat,
          c->kind == K_KILL ? "kill" : c->kind == K_ABORT ? "abort" : "call", worst_drain, mem, now_s() - t0);
  return ok;
}

/* cudaGetDeviceCount in a child: 0 usable, 77 no GPU or not shareable, else broken. */
static int probe(void) {
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    g_rank = 0;
    signal(SIGALRM, on_alarm);
    phase(60, "cudaGetDeviceCount");
    int ngpus = 0, mode = 0;
    cudaError_t ce = cudaGetDeviceCount(&ngpus);
    if (ce != cudaSuccess || ngpus == 0) {
      fprintf(stderr, TAG " no GPU (%s): skipped\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device");
      _exit(77);
    }
    if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0) == cudaSuccess &&
        (mode == cudaComputeModeExclusiveProcess || mode == cudaComputeModeProhibited)) {
      fprintf(stderr, TAG " device 0 cannot be shared by processes (compute mode %d): skipped\n", mode);
      _exit(77);
    }
    _exit(0);
  }
  int st = 0;
  const double limit = now_s() + 90;
  for (;;) {
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) return 1;
    if (now_s() > limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return 1;
    }
    usleep(20000);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(void) {
  setvbuf(stderr, NULL, _IONBF, 0);
  signal(SIGPIPE, SIG_IGN); /* a child that died leaves its pipe closed: the parent reports it */
  const char *sel = getenv("FC_GPUFAIL_CASES");
  if (!sel || !*sel) sel = "kill-2,kill-3,kill-hosts,kill-lane,abort,silent,silent-lane";
  const int p = probe();
  if (p == 77) return 77;
  fc_test_gpu_serialize(TAG);
  if (p != 0) {
    fprintf(stderr, TAG " the GPU probe failed (%d)\n", p);
    return 1;
  }
  int ran = 0, failed = 0;
  char summary[256] = "";
  for (int k = 0; k < NCASES; k++) {
    /* Whole names in the comma list: "kill-2" must not pick "kill-2x". */
    const size_t len = strlen(cases[k].name);
    int on = 0;
    for (const char *s = sel; (s = strstr(s, cases[k].name)); s += len)
      if ((s == sel || s[-1] == ',') && (s[len] == ',' || s[len] == '\0')) on = 1;
    if (!on) continue;
#ifndef FC_FAKE_VERBS_LIB
    if (cases[k].lane) {
      fprintf(stderr, TAG " %s: this build has no fake verbs provider: skipped\n", cases[k].name);
      continue;
    }
#endif
    ran++;
    const int ok = run_case(&cases[k]);
    failed += !ok;
    size_t used = strlen(summary);
    snprintf(summary + used, sizeof summary - used, " %s=%s", cases[k].name, ok ? "PASS" : "FAIL");
  }
  fprintf(stderr, TAG " summary:%s\n", ran ? summary : " no case selected");
  fprintf(stderr, TAG " %s (%d of %d cases failed)\n", failed || !ran ? "FAILED" : "passed", failed, ran);
  return failed || !ran ? 1 : 0;
}
