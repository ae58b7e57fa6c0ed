/* test_gpu.c — the device-memory path through the public API, on 1 or 2 GPUs.
 *
 * Exits 77 (automake: skipped) when there is no GPU.  The GPU count is probed in a forked child:
 * a process that has initialised CUDA cannot hand CUDA to the children it forks afterwards, and
 * every case here runs in children (the environment is read once per process).  Nothing in the
 * main process or in Check's test processes touches CUDA.
 *
 * Topologies
 *   1proc  one process drives min(GPUs, 2) ranks: flexcoll_comm_init_all(comms, n, NULL), one user
 *          stream per GPU (cudaStreamCreate), every collective issued for all ranks from ONE
 *          thread inside flexcoll_group_start/end.  With one GPU: n = 1.
 *   2proc  two forked processes, GPU 0 and GPU 1 (cudaSetDevice(rank) after the fork,
 *          config.cuda_device = rank, flexcoll_comm_init_rank with an id the parent made before
 *          forking), plain calls (no group).  Left out with fewer than 2 GPUs.
 *
 * Cases (CK_RUN_CASE=<name> runs one; each loop index is one forked child, or pair of children)
 *   p1, p2   (1proc, 2proc) x 10 variants, one per child because the library reads its
 *            environment once per process (FC_TEST_VARIANT=0,4 runs only those):
 *              0 ring      FLEXCOLL_ALGO=ring ONESHOT_MAX_BYTES=0: the ring's schedule
 *              1 ring      the same, plus a 256 MB float32-sum case for every collective (out
 *                          of place)
 *              2 tree      tree, ONESHOT_MAX_BYTES=0 (reduce_scatter: ring only, skipped)
 *              3 kernels   FLEXCOLL_RING_KERNEL=0 with nothing forced: what the ring kernels
 *                          would run goes through the schedules the tuner picks
 *              4 default   nothing forced: the one-shot kernels (LL up to 64 KiB per rank, plain
 *                          up to 8 MiB) for allreduce, allgather, reduce_scatter and broadcast,
 *                          auto engine; counts at and just above the one-shot limit, and of
 *                          20-40 MB (the pipelined kernels with 2 ranks); buffers
 *                          misaligned by one element on every other call
 *              5 ring, FLEXCOLL_CHUNK_SIZE=65536            } one pipelining knob each, so a
 *              6 ring, FLEXCOLL_RING_BLOCKS=1                } failure points at it; 1000003
 *              7 tree, FLEXCOLL_CHUNK_SIZE=65536            } elements only
 *              8 direct    FLEXCOLL_DIRECT=2, DIRECT_MIN_BYTES=1, DIRECT_RS_MIN_BYTES=1,
 *                          ONESHOT_MAX_BYTES=0: allreduce, allgather, reduce_scatter and
 *                          broadcast of every size copied straight between the ranks' buffers,
 *                          their addresses exchanged at each call (lib/gpu/direct.c); counts as
 *                          variant 4, buffers misaligned on every other call, plus the 256 MB case
 *              9 window    as 8 with FLEXCOLL_DIRECT left at 1: every arena is a symmetric
 *                          window (flexcoll_window_register, in a group in 1proc; re-registered
 *                          when it grows), so direct mode finds the peers' buffers at the same
 *                          offsets with no exchange (buffers are laid out alike on every rank)
 *            Variants 0-4: every collective x datatype (10) x op (5 where it reduces) x count
 *            {0, 1, 7} (default: also 4099) x root {0, n-1} x in place / out of place.
 *            All variants: 1000003 elements for 7 datatypes, each reducing collective cycling
 *            through the 5 ops (float32 also sum), in and out of place, both roots.
 *            ONESHOT_MAX_BYTES=0 sends even 1-element allreduce/allgather through the ring/tree
 *            schedule executor, so that algorithm x engine covers every count.
 *   multi    (1proc, 2proc) two communicators on the same GPUs at once (two init_all pairs; in
 *            2proc two init_rank communicators per process), each on its own user stream, ten
 *            calls in flight together, one wait; three rounds (mixed sizes, all small, all big).
 *   burst    (1proc, 2proc) 1000 back-to-back allreduces of 1 KiB, then 1000 of 4 MiB, one stream
 *            sync at the end of each: no hang, the exact result of the chain (rank 0 in place,
 *            the others add a constant: every call must count once), and cudaMemGetInfo before
 *            and after within 16 MiB on every GPU.
 *   streams  (1proc, 2proc) one communicator, consecutive calls rotated over 3 user streams with
 *            no synchronisation in between (NCCL semantics: calls on a communicator run in the
 *            order they were issued whatever their streams): 30 small calls, then 12 mixed.
 *   host     (1proc, 2proc) host-memory calls on GPU communicators (complete on return: checked
 *            before any CUDA synchronisation); FLEXCOLL_INVALID_USAGE for a host sendbuf with a
 *            device recvbuf (and the reverse), device buffer left untouched; window misuse:
 *            NULL/0 arguments and unknown windows (INVALID_ARGUMENT at once), host memory and
 *            unequal sizes (INVALID_USAGE on every rank), a range past the allocation
 *            (INVALID_ARGUMENT); communicator still usable afterwards.
 *
 * Every call: device buffers carved from one cudaMalloc per rank with 256+ poisoned bytes around
 * each buffer; the whole allocation is poisoned with cudaMemsetAsync(0xA5) on the user stream
 * before the inputs are copied in; after the stream is done everything is copied back and
 * compared with the harness's reference (fresh random data, the seed printed; integers and
 * max/min exact, floats within hx_tolerance); inputs must be unchanged and the bytes around the
 * buffers (and a non-root's recvbuf in reduce) still poison.
 *
 * Hangs: children run with FLEXCOLL_TIMEOUT_MS=60000.  Waits poll the streams and
 * flexcoll_comm_get_async_error (timeout + 20 s at most); every batch of calls also runs under
 * alarm(timeout + 40 s), whose handler prints "HANG: watchdog expired <where>: <the call>" and
 * exits, for hangs inside a library or CUDA call; after a fatal error the communicators are
 * aborted under a 20 s watchdog.  A 2proc rank still running 15 s after its peer failed is killed.
 *
 * Environment: FC_TEST_SEED reproduces the data; FC_TEST_NO_BIG=1 leaves out the 1000003-element
 * and 256 MB calls; FC_TEST_VARIANT=i,j,... runs only those p1/p2 variants; FC_TEST_TIMEOUT_MS
 * replaces the children's 60000; FC_TEST_VERBOSE=1 prints every call.  Progress and timing lines
 * go to stderr.
 */
#define _GNU_SOURCE
#include <check.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "harness.h"
#include "gpu_serial.h"

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_BROADCAST, C_REDUCE, NCOLLS };
static const char *const coll_names[NCOLLS] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"};
static int coll_reduces(int c) { return c == C_ALLREDUCE || c == C_REDUCE_SCATTER || c == C_REDUCE; }
static int coll_rooted(int c) { return c == C_BROADCAST || c == C_REDUCE; }

#define BIG_COUNT 1000003
#define HUGE_BYTES ((size_t)256 << 20)
#define ONESHOT_DEFAULT ((size_t)8 << 20) /* lib/gpu/gpu.c, for 1 or 2 ranks */
#define GUARD 256                 /* poisoned bytes (at least) before and after every buffer */
#define MAX_LOCAL 2               /* ranks driven by one process */
#define MAX_SETS 2                /* communicators per rank */
#define NSTREAMS 3                /* user streams per GPU */
#define BURST_CALLS 1000
#define BURST_SMALL_COUNT 256     /* uint32: 1 KiB, the one-shot kernel by default */
#define BURST_BIG_COUNT (1u << 20) /* uint32: 4 MiB, the schedule executor */
#define MEM_SLACK ((size_t)16 << 20)

static int g_ngpus;   /* probed in main, before any test */
static int g_verbose; /* FC_TEST_VERBOSE */
static int g_no_big;  /* FC_TEST_NO_BIG */
static int g_timeout_ms = 60000;  /* FLEXCOLL_TIMEOUT_MS of the children (FC_TEST_TIMEOUT_MS) */
static const char *g_variants;    /* FC_TEST_VARIANT: indices of the variants to run, NULL: all */
#define WATCHDOG_S 20             /* after a fatal error, the child dies if it cannot leave in time */

/* A wait on the streams longer than this is a hang (after the library's own timeout). */
static double wait_limit_s(void) { return g_timeout_ms / 1000.0 + 20.0; }

/* ---- watchdog: a hang inside a library or CUDA call never returns to the test's polling loop, so
 * every batch runs under alarm(); the handler prints what was going on and leaves.  (Our children
 * must not keep Check's inherited SIGALRM handler: it SIGKILLs the test's whole process group.) */
static char g_wd_msg[640];
static size_t g_wd_len;

static void wd_handler(int sig) {
  (void)sig;
  ssize_t k = write(2, g_wd_msg, g_wd_len);
  (void)k;
  _exit(2);
}

static void wd_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = wd_handler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, NULL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
}

/* Say what the process is doing, for the watchdog's message. */
static void wd_note(const hx_rank_t *r, const char *doing) {
  int n = snprintf(g_wd_msg, sizeof g_wd_msg, "[%s] FAIL rank %d (FC_TEST_SEED=0x%016" PRIx64 "): HANG: watchdog expired %s: %s\n",
                   r->label, r->rank, hx_seed(), doing, r->what[0] ? r->what : "-");
  g_wd_len = n < 0 ? 0 : (size_t)n < sizeof g_wd_msg ? (size_t)n : sizeof g_wd_msg - 1;
}

/* Arm the watchdog for one step (a batch, a burst, a destroy). */
static void wd_arm(const hx_rank_t *r, const char *doing) {
  wd_note(r, doing);
  alarm((unsigned)(g_timeout_ms / 1000 + 40));
}

/* ---- variants: one child process each ---------------------------------------------------------- */

typedef struct {
  const char *name;
  const char *algo;         /* FLEXCOLL_ALGO; NULL: unset */
  const char *const *env;   /* more settings (a name without '=' is unset) */
  int small;                /* counts 0, 1, 7 over every dtype and op */
  int small_4099;           /* and 4099 (spreads the one-shot kernel over all its blocks) */
  int edge;                 /* counts at and just above the default one-shot limit */
  int big;                  /* 1000003 elements, a subset of dtypes and ops */
  int huge;                 /* 256 MB float32 sum, every collective, out of place */
  int misalign;             /* buffers misaligned by one element on every other call */
  int windows;              /* the arenas are symmetric windows (flexcoll_window_register) */
} variant_t;

#define ENV_COMMON                                                                                        \
  "FLEXCOLL_RING_BLOCKS", "FLEXCOLL_RING_KERNEL", "FLEXCOLL_CHUNK_SIZE", "FLEXCOLL_DIRECT", "FLEXCOLL_DIRECT_MIN_BYTES", "FLEXCOLL_DIRECT_RS_MIN_BYTES", "FLEXCOLL_LL_MAX_BYTES", "FLEXCOLL_ONESHOT_BLOCKS", \
      "FLEXCOLL_DIRECT_PIECE_BYTES", "FLEXCOLL_DIRECT_PIECES", "FLEXCOLL_PIPELINE", "FLEXCOLL_PIPELINE_BLOCKS", \
      "FLEXCOLL_PIPELINE_THREADS", "FLEXCOLL_PIPELINE_SUBSLOTS", "FLEXCOLL_PIPELINE_PUSH_THREADS"
static const char *const env_sched[] = {"FLEXCOLL_ONESHOT_MAX_BYTES=0", ENV_COMMON, NULL};
static const char *const env_no_kernels[] = {"FLEXCOLL_ONESHOT_MAX_BYTES=0", "FLEXCOLL_RING_KERNEL=0",
                                             "FLEXCOLL_RING_BLOCKS", "FLEXCOLL_CHUNK_SIZE", NULL};
static const char *const env_default[] = {"FLEXCOLL_ONESHOT_MAX_BYTES", ENV_COMMON, NULL};
/* The pipelining knobs one at a time, so that a failure points at one of them. */
static const char *const env_chunks[] = {"FLEXCOLL_ONESHOT_MAX_BYTES=0", "FLEXCOLL_RING_KERNEL", "FLEXCOLL_RING_BLOCKS",
                                         "FLEXCOLL_CHUNK_SIZE=65536", NULL};
static const char *const env_one_block[] = {"FLEXCOLL_ONESHOT_MAX_BYTES=0", "FLEXCOLL_RING_KERNEL",
                                            "FLEXCOLL_RING_BLOCKS=1", "FLEXCOLL_CHUNK_SIZE", NULL};

/* Direct mode for every size: ranks with empty chunks, one-element pieces, misaligned buffers.
 * "direct": unregistered buffers, their addresses exchanged at every call (FLEXCOLL_DIRECT=2);
 * "window": the buffers in symmetric windows (the default FLEXCOLL_DIRECT=1). */
static const char *const env_direct[] = {"FLEXCOLL_ONESHOT_MAX_BYTES=0", "FLEXCOLL_RING_KERNEL",
                                         "FLEXCOLL_RING_BLOCKS", "FLEXCOLL_CHUNK_SIZE",
                                         "FLEXCOLL_DIRECT=2", "FLEXCOLL_DIRECT_MIN_BYTES=1",
                                         "FLEXCOLL_DIRECT_RS_MIN_BYTES=1", "FLEXCOLL_DIRECT_PIECE_BYTES",
                                         "FLEXCOLL_DIRECT_PIECES", NULL};
static const char *const env_window[] = {"FLEXCOLL_ONESHOT_MAX_BYTES=0", "FLEXCOLL_RING_KERNEL",
                                         "FLEXCOLL_RING_BLOCKS", "FLEXCOLL_CHUNK_SIZE",
                                         "FLEXCOLL_DIRECT", "FLEXCOLL_DIRECT_MIN_BYTES=1",
                                         "FLEXCOLL_DIRECT_RS_MIN_BYTES=1", "FLEXCOLL_DIRECT_PIECE_BYTES",
                                         "FLEXCOLL_DIRECT_PIECES", NULL};

static const variant_t variants[] = {
    {"ring", "ring", env_sched, 1, 0, 0, 1, 0, 0, 0},
    {"ring, 256 MB", "ring", env_sched, 1, 0, 0, 1, 1, 0, 0},
    {"tree", "tree", env_sched, 1, 0, 0, 1, 0, 0, 0},
    {"no kernels", NULL, env_no_kernels, 1, 0, 0, 1, 0, 0, 0},
    {"default", NULL, env_default, 1, 1, 1, 1, 0, 1, 0},
    {"ring 64KiB chunks", "ring", env_chunks, 0, 0, 0, 1, 0, 0, 0},
    {"ring kernels, 1 block", NULL, env_one_block, 0, 0, 0, 1, 0, 0, 0},
    {"tree 64KiB chunks", "tree", env_chunks, 0, 0, 0, 1, 0, 0, 0},
    {"direct", NULL, env_direct, 1, 1, 0, 1, 1, 1, 0},
    {"window", NULL, env_window, 1, 1, 0, 1, 1, 1, 1},
};
#define NVARIANTS ((int)(sizeof variants / sizeof variants[0]))

/* ---- one process's view: its ranks, communicators, streams ------------------------------------- */

typedef struct {
  hx_rank_t *r;
  const variant_t *v;    /* matrix cases; NULL otherwise */
  const char *topo;      /* "1proc" or "2proc" */
  int nranks;            /* ranks of every communicator */
  int nlocal, first;     /* local ranks first .. first+nlocal-1 */
  int nsets;             /* communicators per rank */
  flexcoll_comm_t comm[MAX_SETS][MAX_LOCAL];
  int dev[MAX_LOCAL];
  cudaStream_t stream[MAX_LOCAL][NSTREAMS];
  char *arena[MAX_LOCAL]; /* device memory the calls' buffers are carved from */
  flexcoll_window_t win[MAX_LOCAL]; /* the arena as a window of comm set 0 (variant "window") */
  size_t arena_cap[MAX_LOCAL], arena_used[MAX_LOCAL];
  uint64_t call;          /* index of the next call: the same sequence on every rank */
} ctx_t;

static int cu_ok(hx_rank_t *r, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 1;
  hx_fail(r, "%s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return 0;
}
#define CU(r, call) cu_ok((r), (call), #call)

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- one collective on every local rank ----------------------------------------------------------- */

typedef struct {
  int coll;
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  size_t count;  /* as the API takes it: allgather sendcount, reduce_scatter recvcount */
  int root, inplace;
  size_t shift;  /* bytes every buffer is moved off its 256-byte alignment */
  int host;      /* host memory (malloc) instead of device memory */
} spec_t;

typedef struct {
  int rank;                     /* global rank */
  int has_a, has_b;             /* in place: a is the buffer; out of place: a sendbuf, b recvbuf */
  size_t a_off, a_bytes, b_off, b_bytes, total;
  char *base;                   /* device (arena) or host allocation of total bytes */
  const void *send;
  void *recv;
} lbuf_t;

typedef struct {
  spec_t s;
  hx_data_t d;
  int set, sidx;                /* communicator set and user stream */
  lbuf_t lb[MAX_LOCAL];
} gcall_t;

static size_t send_elems(int coll, size_t cnt, int n) { return coll == C_REDUCE_SCATTER ? (size_t)n * cnt : cnt; }
static size_t recv_elems(int coll, size_t cnt, int n) { return coll == C_ALLGATHER ? (size_t)n * cnt : cnt; }

static void describe(char *buf, size_t len, const gcall_t *g) {
  const spec_t *s = &g->s;
  char root[32] = "", shift[48] = "";
  if (coll_rooted(s->coll)) snprintf(root, sizeof root, " root %d", s->root);
  if (s->shift) snprintf(shift, sizeof shift, " misaligned by %zu B", s->shift);
  snprintf(buf, len, "%s %s%s%s count %zu%s %s%s %s (call %" PRIu64 ", comm set %d, stream %d)", coll_names[s->coll],
           fc_dtype_name(s->dtype), coll_reduces(s->coll) ? " " : "", coll_reduces(s->coll) ? fc_op_name(s->op) : "",
           s->count, root, s->inplace ? "in place" : "out of place", shift, s->host ? "HOST memory" : "device memory",
           g->d.call, g->set, g->sidx);
}

/* Sizes and offsets of local rank li's buffers. */
static void layout(const ctx_t *c, gcall_t *g, int li) {
  lbuf_t *b = &g->lb[li];
  const spec_t *s = &g->s;
  const int n = c->nranks, me = c->first + li;
  const size_t es = fc_dtype_size(s->dtype), S = send_elems(s->coll, s->count, n), R = recv_elems(s->coll, s->count, n);
  memset(b, 0, sizeof *b);
  b->rank = me;
  if (s->inplace) {
    b->has_a = 1;
    b->a_bytes = (S > R ? S : R) * es;
  } else {
    /* Broadcast: a non-root passes NULL as sendbuf when the root is the last rank, else a buffer of
     * its own data that must be ignored.  Reduce: likewise NULL or a recvbuf that must stay poison. */
    b->has_a = !(s->coll == C_BROADCAST && me != s->root && s->root == n - 1);
    b->has_b = !(s->coll == C_REDUCE && me != s->root && s->root == n - 1);
    b->a_bytes = b->has_a ? S * es : 0;
    b->b_bytes = b->has_b ? R * es : 0;
  }
  /* Both regions on every rank, used or not: each buffer is at the same offset on every rank,
   * as symmetric windows require (an unused region must stay poison). */
  size_t cur = GUARD + s->shift;
  b->a_off = cur;
  cur = al256(cur + (s->inplace ? b->a_bytes : S * es));
  cur += GUARD + s->shift;
  b->b_off = cur;
  cur = al256(cur + R * es);
  b->total = cur + GUARD;
}

/* The input local rank li copies in: where (offset in the allocation) and how many elements. */
static int input_of(const ctx_t *c, const gcall_t *g, int li, size_t *off, size_t *count) {
  const lbuf_t *b = &g->lb[li];
  const spec_t *s = &g->s;
  const size_t es = fc_dtype_size(s->dtype);
  const int me = b->rank;
  *off = b->a_off;
  *count = s->count;
  switch (s->coll) {
    case C_ALLGATHER:
      if (s->inplace) *off += (size_t)me * s->count * es;
      return 1;
    case C_REDUCE_SCATTER: *count = (size_t)c->nranks * s->count; return 1;
    case C_BROADCAST: return s->inplace ? me == s->root : b->has_a;
    default: return 1;
  }
}

static void set_pointers(gcall_t *g, int li) {
  lbuf_t *b = &g->lb[li];
  const spec_t *s = &g->s;
  const size_t es = fc_dtype_size(s->dtype);
  char *A = b->has_a ? b->base + b->a_off : NULL, *B = b->has_b ? b->base + b->b_off : NULL;
  const size_t mine = (size_t)b->rank * s->count * es;
  if (s->inplace) {
    b->send = A;
    b->recv = A;
    if (s->coll == C_ALLGATHER) b->send = A + mine;
    if (s->coll == C_REDUCE_SCATTER) b->recv = A + mine;
  } else {
    b->send = A;
    b->recv = B;
  }
}

/* Poison local rank li's allocation and copy its input in (device: on the call's stream). */
static int upload(ctx_t *c, gcall_t *g, int li) {
  hx_rank_t *r = c->r;
  lbuf_t *b = &g->lb[li];
  size_t off, count;
  const size_t es = fc_dtype_size(g->s.dtype);
  int has_input = input_of(c, g, li, &off, &count);
  if (g->s.host) {
    memset(b->base, HX_POISON, b->total);
    if (has_input) hx_fill(&g->d, b->rank, b->base + off, 0, count);
    return 0;
  }
  cudaStream_t st = c->stream[li][g->sidx];
  if (!CU(r, cudaSetDevice(c->dev[li]))) return -1;
  if (!CU(r, cudaMemsetAsync(b->base, HX_POISON, b->total, st))) return -1;
  if (has_input && count) {
    void *tmp = malloc(count * es);
    if (!tmp) return hx_fail(r, "out of memory for a %zu-byte input", count * es), -1;
    hx_fill(&g->d, b->rank, tmp, 0, count);
    /* Pageable source: the call returns once the data is staged, so tmp may go at once. */
    int ok = CU(r, cudaMemcpyAsync(b->base + off, tmp, count * es, cudaMemcpyHostToDevice, st));
    free(tmp);
    if (!ok) return -1;
  }
  return 0;
}

static flexcoll_result_t issue_rank(const ctx_t *c, const gcall_t *g, int li) {
  const lbuf_t *b = &g->lb[li];
  const spec_t *s = &g->s;
  flexcoll_comm_t comm = c->comm[g->set][li];
  cudaStream_t st = s->host ? NULL : c->stream[li][g->sidx];
  switch (s->coll) {
    case C_ALLREDUCE: return flexcoll_allreduce(b->send, b->recv, s->count, s->dtype, s->op, comm, st);
    case C_ALLGATHER: return flexcoll_allgather(b->send, b->recv, s->count, s->dtype, comm, st);
    case C_REDUCE_SCATTER: return flexcoll_reduce_scatter(b->send, b->recv, s->count, s->dtype, s->op, comm, st);
    case C_BROADCAST: return flexcoll_broadcast(b->send, b->recv, s->count, s->dtype, s->root, comm, st);
    default: return flexcoll_reduce(b->send, b->recv, s->count, s->dtype, s->op, s->root, comm, st);
  }
}

/* Every byte of the allocation outside the buffers must still be poison. */
static void check_outside(hx_rank_t *r, const lbuf_t *b, int inplace, const unsigned char *img) {
  struct {
    size_t off, len;
    const char *name;
  } iv[2];
  int k = 0;
  if (b->has_a) {
    iv[k].off = b->a_off;
    iv[k].len = b->a_bytes;
    iv[k++].name = inplace ? "the buffer" : "sendbuf";
  }
  if (b->has_b) {
    iv[k].off = b->b_off;
    iv[k].len = b->b_bytes;
    iv[k++].name = "recvbuf";
  }
  size_t pos = 0;
  const char *prev = NULL;
  for (int i = 0; i <= k; i++) {
    const size_t end = i < k ? iv[i].off : b->total;
    size_t bad = 0, first = 0;
    for (size_t x = pos; x < end; x++)
      if (img[x] != HX_POISON) {
        if (!bad) first = x;
        bad++;
      }
    if (bad) {
      char where[160];
      if (prev && i < k)
        snprintf(where, sizeof where, "between %s and %s, first at byte %zu past the end of %s", prev, iv[i].name,
                 first - pos, prev);
      else if (prev)
        snprintf(where, sizeof where, "after %s, first at byte %zu past its end", prev, first - pos);
      else if (i < k)
        snprintf(where, sizeof where, "before %s, first %zu byte(s) before its start", iv[i].name, end - first);
      else
        snprintf(where, sizeof where, "in an allocation with no buffer, at byte %zu", first);
      hx_fail(r, "%zu poisoned byte(s) outside the buffers were written: %s", bad, where);
    }
    if (i < k) {
      pos = iv[i].off + iv[i].len;
      prev = iv[i].name;
    }
  }
}

/* Compare local rank li's allocation (img: its host copy) with the reference. */
static void check_rank(ctx_t *c, gcall_t *g, int li, const unsigned char *img) {
  hx_rank_t *r = c->r;
  const spec_t *s = &g->s;
  const lbuf_t *b = &g->lb[li];
  const hx_data_t *d = &g->d;
  const int n = c->nranks, me = b->rank;
  const size_t es = fc_dtype_size(s->dtype), cnt = s->count, m = (size_t)me;
  const unsigned char *A = img + b->a_off, *B = img + b->b_off;
  switch (s->coll) {
    case C_ALLREDUCE:
      if (s->inplace) {
        hx_check_reduced(r, "buffer (in place)", d, s->op, A, 0, cnt);
      } else {
        hx_check_reduced(r, "recvbuf", d, s->op, B, 0, cnt);
        hx_check_input(r, "sendbuf (must not change)", d, me, A, 0, cnt);
      }
      break;
    case C_ALLGATHER:
      if (s->inplace) {
        hx_check_gathered(r, "buffer (in place)", d, A, cnt);
      } else {
        hx_check_gathered(r, "recvbuf", d, B, cnt);
        hx_check_input(r, "sendbuf (must not change)", d, me, A, 0, cnt);
      }
      break;
    case C_REDUCE_SCATTER:
      if (s->inplace) {
        hx_check_reduced(r, "this rank's block of the buffer (in place)", d, s->op, A + m * cnt * es, m * cnt, cnt);
        hx_check_input(r, "buffer before this rank's block (must not change)", d, me, A, 0, m * cnt);
        hx_check_input(r, "buffer after this rank's block (must not change)", d, me, A + (m + 1) * cnt * es,
                       (m + 1) * cnt, ((size_t)n - m - 1) * cnt);
      } else {
        hx_check_reduced(r, "recvbuf", d, s->op, B, m * cnt, cnt);
        hx_check_input(r, "sendbuf (must not change)", d, me, A, 0, (size_t)n * cnt);
      }
      break;
    case C_BROADCAST:
      if (s->inplace) {
        hx_check_input(r, me == s->root ? "root's buffer (in place, must not change)" : "buffer (in place)", d, s->root,
                       A, 0, cnt);
      } else {
        hx_check_input(r, "recvbuf", d, s->root, B, 0, cnt);
        if (b->has_a)
          hx_check_input(r, me == s->root ? "sendbuf (must not change)" : "non-root's sendbuf (ignored, must not change)",
                         d, me, A, 0, cnt);
      }
      break;
    default: /* reduce */
      if (me == s->root) {
        if (s->inplace) {
          hx_check_reduced(r, "root's buffer (in place)", d, s->op, A, 0, cnt);
        } else {
          hx_check_reduced(r, "root's recvbuf", d, s->op, B, 0, cnt);
          hx_check_input(r, "sendbuf (must not change)", d, me, A, 0, cnt);
        }
      } else if (s->inplace) {
        hx_check_input(r, "non-root's buffer (in place: its input, must not change)", d, me, A, 0, cnt);
      } else {
        hx_check_input(r, "sendbuf (must not change)", d, me, A, 0, cnt);
        if (b->has_b) hx_check_poisoned(r, "non-root's recvbuf (must stay untouched)", B, b->b_bytes);
      }
      break;
  }
  check_outside(r, b, s->inplace, img);
}

/* Reserve `bytes` of device arena on local rank li (nothing of ours may be in flight). */
static int arena_reserve(ctx_t *c, int li, size_t bytes) {
  hx_rank_t *r = c->r;
  c->arena_used[li] = 0;
  if (bytes <= c->arena_cap[li]) return 0;
  if (!CU(r, cudaSetDevice(c->dev[li]))) return -1;
  if (c->arena[li]) {
    if (!CU(r, cudaDeviceSynchronize()) || !CU(r, cudaFree(c->arena[li]))) return -1;
    c->arena[li] = NULL;
    c->arena_cap[li] = 0;
  }
  size_t cap = bytes < ((size_t)64 << 20) ? ((size_t)64 << 20) : bytes;
  if (!CU(r, cudaMalloc((void **)&c->arena[li], cap))) return -1;
  c->arena_cap[li] = cap;
  return 0;
}

/* Variant "window": register (reg 1) or deregister every local arena as a symmetric window of
 * comm set 0.  Collective: inside a group when this process drives several ranks. */
static int windows_set(ctx_t *c, int reg) {
  hx_rank_t *r = c->r;
  if (!c->v || !c->v->windows) return 0;
  const int group = c->nlocal > 1;
  int ok = 1;
  if (group) ok &= hx_ok(r, flexcoll_group_start(), NULL, "flexcoll_group_start");
  for (int li = 0; li < c->nlocal; li++) {
    flexcoll_comm_t comm = c->comm[0][li];
    if (reg)
      ok &= hx_ok(r, flexcoll_window_register(comm, c->arena[li], c->arena_cap[li], &c->win[li]), comm,
                  "flexcoll_window_register");
    else if (c->win[li])
      ok &= hx_ok(r, flexcoll_window_deregister(comm, c->win[li]), comm, "flexcoll_window_deregister");
  }
  if (group) ok &= hx_ok(r, flexcoll_group_end(), NULL, "flexcoll_group_end");
  if (!reg)
    for (int li = 0; li < c->nlocal; li++) c->win[li] = NULL;
  if (ok && reg)
    for (int li = 0; li < c->nlocal; li++)
      if (!c->win[li]) ok = 0, hx_fail(r, "flexcoll_window_register succeeded without setting the window");
  return ok ? 0 : -1;
}

/* Arenas of need[li] bytes (the same on every rank), as windows in variant "window". */
static int arena_reserve_all(ctx_t *c, const size_t *need) {
  int grow = 0;
  for (int li = 0; li < c->nlocal; li++) {
    c->arena_used[li] = 0;
    grow |= need[li] > c->arena_cap[li];
  }
  if (!grow) return 0;
  if (windows_set(c, 0)) return -1;
  for (int li = 0; li < c->nlocal; li++)
    if (arena_reserve(c, li, need[li])) return -1;
  return windows_set(c, 1);
}

static int async_errors_ok(ctx_t *c, const char *when) {
  hx_rank_t *r = c->r;
  for (int s = 0; s < c->nsets; s++)
    for (int li = 0; li < c->nlocal; li++) {
      flexcoll_result_t ae = FLEXCOLL_SUCCESS;
      flexcoll_result_t res = flexcoll_comm_get_async_error(c->comm[s][li], &ae);
      if (res != FLEXCOLL_SUCCESS) {
        hx_fail(r, "%s: flexcoll_comm_get_async_error(set %d, rank %d) returned %d: %s", when, s, c->first + li, (int)res,
                flexcoll_get_last_error(c->comm[s][li]));
        return 0;
      }
      if (ae != FLEXCOLL_SUCCESS) {
        hx_fail(r, "%s: asynchronous error %d (%s) on comm set %d rank %d: %s", when, (int)ae,
                flexcoll_get_error_string(ae), s, c->first + li, flexcoll_get_last_error(c->comm[s][li]));
        return 0;
      }
    }
  return 1;
}

/* Wait until every user stream of this process is idle, polling the communicators' asynchronous
 * errors; a hang (wait_limit_s()) or an error is reported with r->what.  Returns 0 or -1. */
static int wait_all(ctx_t *c) {
  hx_rank_t *r = c->r;
  const double t0 = hx_now();
  double next_poll = t0 + 0.5;
  int pending[MAX_LOCAL][NSTREAMS];
  for (int li = 0; li < c->nlocal; li++)
    for (int k = 0; k < NSTREAMS; k++) pending[li][k] = 1;
  for (long spins = 0;; spins++) {
    int left = 0;
    for (int li = 0; li < c->nlocal; li++)
      for (int k = 0; k < NSTREAMS; k++) {
        if (!pending[li][k]) continue;
        cudaError_t e = cudaStreamQuery(c->stream[li][k]);
        if (e == cudaSuccess) {
          pending[li][k] = 0;
        } else if (e == cudaErrorNotReady) {
          left++;
        } else {
          hx_fail(r, "stream %d of GPU %d failed: %s (%s)", k, c->dev[li], cudaGetErrorName(e), cudaGetErrorString(e));
          return -1;
        }
      }
    if (!left) break;
    const double now = hx_now();
    if (now > next_poll) {
      if (!async_errors_ok(c, "while waiting for the streams")) return -1;
      next_poll = now + 0.5;
    }
    if (now - t0 > wait_limit_s()) {
      hx_fail(r, "HANG: %d stream(s) still busy after %.0f s (FLEXCOLL_TIMEOUT_MS=%s)", left, now - t0,
              getenv("FLEXCOLL_TIMEOUT_MS") ? getenv("FLEXCOLL_TIMEOUT_MS") : "unset");
      return -1;
    }
    if (spins < 2000) {
      sched_yield();
    } else {
      struct timespec ts = {0, 100 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  return async_errors_ok(c, "after the streams completed") ? 0 : -1;
}

/* Run calls specs[0..n) together: prepare all, issue all (in one group when this process drives
 * several ranks), wait once, check all.  Returns 0 (mismatches are counted in r->errors), or -1 on
 * a library error or hang (the ranks may then be out of step: stop). */
static int run_batch(ctx_t *c, const spec_t *specs, const int *sets, const int *sidx, int n) {
  hx_rank_t *r = c->r;
  const int saved_rank = r->rank;
  int rc = -1, any_device = 0, any_host = 0;
  gcall_t *g = calloc((size_t)n, sizeof *g);
  if (!g) return hx_fail(r, "out of memory"), -1;
  size_t need[MAX_LOCAL] = {0};
  for (int k = 0; k < n; k++) {
    g[k].s = specs[k];
    g[k].set = sets ? sets[k] : 0;
    g[k].sidx = sidx ? sidx[k] : 0;
    hx_data_t d = {specs[k].dtype, coll_reduces(specs[k].coll) ? hx_gen_for_op(specs[k].op) : HX_GEN_BITS, r->seed,
                   c->call++, c->nranks};
    g[k].d = d;
    any_device |= !specs[k].host;
    any_host |= specs[k].host;
    for (int li = 0; li < c->nlocal; li++) {
      layout(c, &g[k], li);
      if (!specs[k].host) need[li] += al256(g[k].lb[li].total);
    }
  }
  describe(r->what, sizeof r->what, &g[0]);
  if (g_verbose && c->first == 0) {
    fprintf(stderr, "[%s] %s%s\n", r->label, r->what, n > 1 ? " (and more in this batch)" : "");
    fflush(stderr);
  }
  wd_arm(r, "preparing the buffers of");
  if (any_device && arena_reserve_all(c, need)) goto out;
  for (int k = 0; k < n; k++)
    for (int li = 0; li < c->nlocal; li++) {
      lbuf_t *b = &g[k].lb[li];
      r->rank = b->rank;
      describe(r->what, sizeof r->what, &g[k]);
      if (g[k].s.host) {
        b->base = aligned_alloc(256, al256(b->total));
        if (!b->base) { hx_fail(r, "out of memory for %zu bytes", b->total); goto out; }
      } else {
        b->base = c->arena[li] + c->arena_used[li];
        c->arena_used[li] += al256(b->total);
      }
      set_pointers(&g[k], li);
      if (upload(c, &g[k], li)) goto out;
    }
  {
    const int group = c->nlocal > 1;
    int ok = 1;
    if (group) ok &= hx_ok(r, flexcoll_group_start(), NULL, "flexcoll_group_start");
    for (int k = 0; k < n && ok; k++)
      for (int li = 0; li < c->nlocal && ok; li++) {
        r->rank = g[k].lb[li].rank;
        describe(r->what, sizeof r->what, &g[k]);
        wd_note(r, "inside the flexcoll call (or flexcoll_group_end) of");
        ok &= hx_ok(r, issue_rank(c, &g[k], li), c->comm[g[k].set][li], coll_names[g[k].s.coll]);
      }
    if (group) {
      flexcoll_result_t res = flexcoll_group_end();
      if (ok) {
        snprintf(r->what + strlen(r->what), sizeof r->what - strlen(r->what), " [flexcoll_group_end of %d call(s)]", n);
        ok &= hx_ok(r, res, NULL, "flexcoll_group_end");
      }
    }
    if (!ok) goto out;
  }
  r->rank = c->first;
  /* Host calls are complete on return: check them before any CUDA synchronisation. */
  if (any_host)
    for (int k = 0; k < n; k++)
      if (g[k].s.host)
        for (int li = 0; li < c->nlocal; li++) {
          r->rank = g[k].lb[li].rank;
          describe(r->what, sizeof r->what, &g[k]);
          check_rank(c, &g[k], li, (const unsigned char *)g[k].lb[li].base);
        }
  if (any_device) {
    if (n > 1) snprintf(r->what, sizeof r->what, "waiting for a batch of %d calls (from call %" PRIu64 ")", n, g[0].d.call);
    else describe(r->what, sizeof r->what, &g[0]);
    wd_note(r, "waiting for");
    if (wait_all(c)) goto out;
    wd_note(r, "copying back the results of");
    for (int k = 0; k < n; k++) {
      if (g[k].s.host) continue;
      for (int li = 0; li < c->nlocal; li++) {
        lbuf_t *b = &g[k].lb[li];
        r->rank = b->rank;
        describe(r->what, sizeof r->what, &g[k]);
        unsigned char *img = malloc(b->total);
        if (!img) { hx_fail(r, "out of memory for %zu bytes", b->total); goto out; }
        if (!CU(r, cudaSetDevice(c->dev[li])) || !CU(r, cudaMemcpy(img, b->base, b->total, cudaMemcpyDeviceToHost))) {
          free(img);
          goto out;
        }
        check_rank(c, &g[k], li, img);
        free(img);
      }
    }
  }
  rc = 0;
out:
  if (rc == 0) alarm(0);
  for (int k = 0; k < n; k++)
    if (g[k].s.host)
      for (int li = 0; li < c->nlocal; li++) free(g[k].lb[li].base);
  free(g);
  r->rank = saved_rank;
  return rc;
}

static int run_one(ctx_t *c, const spec_t *s) { return run_batch(c, s, NULL, NULL, 1); }

static void progress(ctx_t *c, const char *what, long calls, double t0, long errors_before) {
  if (c->first != 0) return;
  long errs = c->r->errors - errors_before;
  fprintf(stderr, "[%s] %s: %ld call(s) %s in %.2f s\n", c->r->label, what, calls, errs ? "with ERRORS" : "ok",
          hx_now() - t0);
  fflush(stderr);
}

/* ---- the matrix (cases p1 and p2) --------------------------------------------------------------- */

static const flexcoll_datatype_t big_dtypes[] = {FLEXCOLL_INT8,     FLEXCOLL_UINT32,   FLEXCOLL_INT64,  FLEXCOLL_FLOAT16,
                                                 FLEXCOLL_BFLOAT16, FLEXCOLL_FLOAT32, FLEXCOLL_FLOAT64};
#define NBIG ((int)(sizeof big_dtypes / sizeof big_dtypes[0]))

static int matrix_body(ctx_t *c) {
  const variant_t *v = c->v;
  hx_rank_t *r = c->r;
  const int n = c->nranks;
  const int tree = v->algo && strcmp(v->algo, "tree") == 0;
  const double tall = hx_now();
  long total = 0;
  for (int coll = 0; coll < NCOLLS; coll++) {
    if (coll == C_REDUCE_SCATTER && tree) {
      if (c->first == 0) fprintf(stderr, "[%s] reduce_scatter: ring only (FLEXCOLL_ALGO=tree would rerun the ring)\n", r->label);
      continue;
    }
    const int nroots = coll_rooted(coll) && n > 1 ? 2 : 1;
    const int nops = coll_reduces(coll) ? FLEXCOLL_NUM_OPS : 1;
    double t0 = hx_now();
    long calls = 0, e0 = r->errors;
    /* counts 0, 1, 7 (4099): every dtype, op, root, in and out of place */
    if (v->small) {
      static const size_t counts[] = {0, 1, 7, 4099};
      const int ncounts = v->small_4099 ? 4 : 3;
      for (int k = 0; k < ncounts; k++)
        for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt++)
          for (int op = 0; op < nops; op++)
            for (int ri = 0; ri < nroots; ri++)
              for (int ip = 0; ip < 2; ip++) {
                spec_t s = {.coll = coll, .dtype = (flexcoll_datatype_t)dt, .op = (flexcoll_op_t)op, .count = counts[k],
                            .root = ri ? n - 1 : 0, .inplace = ip};
                if (v->misalign && (calls & 1)) s.shift = fc_dtype_size(s.dtype);
                if (run_one(c, &s)) return 1;
                calls++;
              }
      progress(c, coll_names[coll], calls, t0, e0);
    }
    /* around the default one-shot limit (8 MiB of one rank's data) */
    if (v->edge && coll != C_REDUCE) {
      static const struct {
        flexcoll_datatype_t dt;
        flexcoll_op_t op;
      } edge[] = {{FLEXCOLL_FLOAT32, FLEXCOLL_SUM}, {FLEXCOLL_BFLOAT16, FLEXCOLL_AVG}, {FLEXCOLL_INT8, FLEXCOLL_MAX},
                  {FLEXCOLL_FLOAT64, FLEXCOLL_MIN}};
      t0 = hx_now();
      long ecalls = 0;
      e0 = r->errors;
      for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++)
        for (int plus = 0; plus < 2; plus++) {
          /* The limit is on the larger buffer (all n blocks of an allgather's result), but on
           * a reduce_scatter's output (lib/gpu/exec.c, oneshot_bytes). */
          const size_t per = coll == C_ALLGATHER ? (size_t)n : 1;
          const size_t edge_count = ONESHOT_DEFAULT / fc_dtype_size(edge[k].dt) / per;
          for (int ip = 0; ip < 2; ip++) {
            spec_t s = {.coll = coll, .dtype = edge[k].dt, .op = edge[k].op,
                        .count = edge_count + (size_t)plus, .inplace = ip};
            if (v->misalign && (ecalls & 1)) s.shift = fc_dtype_size(s.dtype);
            if (run_one(c, &s)) return 1;
            ecalls++;
          }
        }
      calls += ecalls;
      char what[96];
      snprintf(what, sizeof what, "%s at the one-shot limit (8 MiB, and one element more)", coll_names[coll]);
      progress(c, what, ecalls, t0, e0);
      /* Past it between 2 ranks: the pipelined kernels (lib/kernels/pipeline.cu), here with more
       * steps per block than sub-slots (so the senders wait for drained sub-slots) and a tail:
       * 40 MB buffers (allreduce, broadcast) or blocks (allgather, reduce_scatter) of 20 MB. */
      t0 = hx_now();
      ecalls = 0;
      e0 = r->errors;
      const size_t long_bytes = coll == C_ALLGATHER || coll == C_REDUCE_SCATTER ? (size_t)20 << 20 : (size_t)40 << 20;
      /* Each dtype in and out of place, aligned and misaligned (the vector and element paths),
       * the root alternating. */
      for (size_t k = 0; k < 2; k++)
        for (int ip = 0; ip < 2; ip++)
          for (int mis = 0; mis < (v->misalign ? 2 : 1); mis++) {
            spec_t s = {.coll = coll, .dtype = edge[k].dt, .op = edge[k].op,
                        .count = long_bytes / fc_dtype_size(edge[k].dt) + 3, .root = (ip + mis) % n, .inplace = ip};
            if (mis) s.shift = fc_dtype_size(s.dtype);
            if (run_one(c, &s)) return 1;
            ecalls++;
          }
      calls += ecalls;
      snprintf(what, sizeof what, "%s of %zu MB%s", coll_names[coll], long_bytes >> 20,
               n == 2 ? " (the pipelined kernels)" : "");
      progress(c, what, ecalls, t0, e0);
    }
    /* 1000003 elements: 7 dtypes, the reducing collectives cycling through the ops */
    if (v->big && !g_no_big) {
      t0 = hx_now();
      long bcalls = 0;
      e0 = r->errors;
      for (int k = 0; k < NBIG; k++) {
        flexcoll_op_t ops[2] = {(flexcoll_op_t)((k + coll) % FLEXCOLL_NUM_OPS), FLEXCOLL_SUM};
        int nbops = coll_reduces(coll) && big_dtypes[k] == FLEXCOLL_FLOAT32 && ops[0] != FLEXCOLL_SUM ? 2 : 1;
        for (int o = 0; o < nbops; o++)
          for (int ip = 0; ip < 2; ip++) {
            spec_t s = {.coll = coll, .dtype = big_dtypes[k], .op = ops[o], .count = BIG_COUNT,
                        .root = coll_rooted(coll) ? (k + ip) % n : 0, .inplace = ip};
            if (v->misalign && (bcalls & 1)) s.shift = fc_dtype_size(s.dtype);
            if (run_one(c, &s)) return 1;
            bcalls++;
          }
      }
      calls += bcalls;
      char what[64];
      snprintf(what, sizeof what, "%s, count %d", coll_names[coll], BIG_COUNT);
      progress(c, what, bcalls, t0, e0);
    }
    /* 256 MB: float32 sum, out of place (allgather: recvbuf; reduce_scatter: sendbuf) */
    if (v->huge && !g_no_big) {
      size_t cnt = HUGE_BYTES / sizeof(float);
      if (coll == C_ALLGATHER || coll == C_REDUCE_SCATTER) cnt /= (size_t)n;
      spec_t s = {.coll = coll, .dtype = FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM, .count = cnt, .root = n - 1};
      if (c->first == 0) {
        fprintf(stderr, "[%s] %s 256 MB (count %zu) starting\n", r->label, coll_names[coll], cnt);
        fflush(stderr);
      }
      t0 = hx_now();
      e0 = r->errors;
      if (run_one(c, &s)) return 1;
      calls++;
      char what[64];
      snprintf(what, sizeof what, "%s 256 MB", coll_names[coll]);
      progress(c, what, 1, t0, e0);
    }
    total += calls;
  }
  if (c->first == 0)
    fprintf(stderr, "[%s] %ld calls in %.2f s, %ld error(s) on rank 0's side\n", r->label, total, hx_now() - tall,
            r->errors);
  return 0;
}

/* ---- several communicators and streams, back-to-back calls ------------------------------------- */

/* Two communicator sets at once: set s on user stream s, ten calls in flight, one wait. */
static int two_sets(ctx_t *c) {
  const int n = c->nranks;
  const size_t big = g_no_big ? 100003 : BIG_COUNT;
  static const flexcoll_datatype_t dts[] = {FLEXCOLL_FLOAT32, FLEXCOLL_BFLOAT16, FLEXCOLL_INT32, FLEXCOLL_FLOAT16,
                                            FLEXCOLL_UINT8};
  for (int rep = 0; rep < 3; rep++) {
    spec_t sp[10];
    int sets[10], sidx[10], k = 0;
    double t0 = hx_now();
    long e0 = c->r->errors;
    for (int j = 0; j < 5; j++)
      for (int set = 0; set < 2; set++) {
        spec_t s = {.coll = (j + 2 * set + rep) % NCOLLS, .dtype = dts[(j + set) % 5],
                    .op = (flexcoll_op_t)((j + set + rep) % FLEXCOLL_NUM_OPS),
                    /* rep 0: mixed sizes; rep 1: all small (one-shot kernels of both comms together); rep 2: all big */
                    .count = rep == 1 ? 1031 : rep == 2 ? big : ((j + set) % 2 ? 4099 : big),
                    .root = (j + set) % n, .inplace = (j + rep) % 2};
        sp[k] = s;
        sets[k] = set;
        sidx[k++] = set;
      }
    if (run_batch(c, sp, sets, sidx, k)) return 1;
    char what[96];
    snprintf(what, sizeof what, "two communicators at once, own streams, one wait (round %d)", rep);
    progress(c, what, k, t0, e0);
  }
  return 0;
}

/* BURST_CALLS allreduces (uint32 sum) of count elements back to back, one wait at the end.  Rank 0
 * works in place on a, every other rank q sends its constant c_q out of place into b, so after k
 * calls every rank holds a0 + k * (c_1 + ... + c_{n-1}) (wrapping): exact, and wrong when a call
 * is lost, doubled or reordered with its neighbours' data. */
static int burst_run(ctx_t *c, uint32_t **da, uint32_t **db, size_t count, int ncalls, int report) {
  hx_rank_t *r = c->r;
  const int n = c->nranks;
  const size_t bytes = count * sizeof(uint32_t);
  hx_data_t d = {FLEXCOLL_UINT32, HX_GEN_BITS, r->seed, c->call++, n};
  uint32_t *want = malloc(bytes), *tmp = malloc(bytes), *got = malloc(bytes);
  int rc = -1;
  if (!want || !tmp || !got) { hx_fail(r, "out of memory"); goto out; }
  snprintf(r->what, sizeof r->what, "%d back-to-back allreduce uint32 sum count %zu (call %" PRIu64 ")", ncalls, count,
           d.call);
  /* the expected chain: a0 + ncalls * sum(c_q) */
  hx_fill(&d, 0, want, 0, count);
  for (int q = 1; q < n; q++) {
    hx_fill(&d, q, tmp, 0, count);
    for (size_t j = 0; j < count; j++) want[j] += (uint32_t)ncalls * tmp[j];
  }
  for (int li = 0; li < c->nlocal; li++) {
    const int me = c->first + li;
    hx_fill(&d, me, tmp, 0, count);
    if (!CU(r, cudaSetDevice(c->dev[li])) || !CU(r, cudaMemcpy(da[li], tmp, bytes, cudaMemcpyHostToDevice)) ||
        !CU(r, cudaMemset(db[li], HX_POISON, bytes)) || !CU(r, cudaDeviceSynchronize()))
      goto out;
  }
  wd_arm(r, "during");
  const double t0 = hx_now();
  for (int k = 0; k < ncalls; k++) {
    int ok = 1;
    if (c->nlocal > 1) ok &= hx_ok(r, flexcoll_group_start(), NULL, "flexcoll_group_start");
    for (int li = 0; li < c->nlocal && ok; li++) {
      const int me = c->first + li;
      r->rank = me;
      ok &= hx_ok(r,
                  flexcoll_allreduce(da[li], me == 0 ? (void *)da[li] : (void *)db[li], count, FLEXCOLL_UINT32,
                                     FLEXCOLL_SUM, c->comm[0][li], c->stream[li][0]),
                  c->comm[0][li], "flexcoll_allreduce");
    }
    if (c->nlocal > 1) {
      flexcoll_result_t res = flexcoll_group_end();
      if (ok) ok &= hx_ok(r, res, NULL, "flexcoll_group_end");
    }
    r->rank = c->first;
    if (!ok) {
      hx_fail(r, "call %d of %d failed", k, ncalls);
      goto out;
    }
  }
  const double t_issue = hx_now() - t0;
  if (wait_all(c)) goto out;
  const double t_done = hx_now() - t0;
  for (int li = 0; li < c->nlocal; li++) {
    const int me = c->first + li;
    r->rank = me;
    if (!CU(r, cudaSetDevice(c->dev[li])) ||
        !CU(r, cudaMemcpy(got, me == 0 ? da[li] : db[li], bytes, cudaMemcpyDeviceToHost)))
      goto out;
    size_t bad = 0;
    for (size_t j = 0; j < count; j++)
      if (got[j] != want[j] && bad++ < 3)
        hx_fail(r, "%s: element %zu is %" PRIu32 ", expected %" PRIu32 " after %d calls", me == 0 ? "buffer (in place)" : "recvbuf",
                j, got[j], want[j], ncalls);
    if (bad) hx_fail(r, "%zu of %zu elements wrong", bad, count);
    if (me != 0) { /* the constant input must not change */
      if (!CU(r, cudaMemcpy(got, da[li], bytes, cudaMemcpyDeviceToHost))) goto out;
      hx_fill(&d, me, tmp, 0, count);
      if (memcmp(got, tmp, bytes)) hx_fail(r, "sendbuf changed (it must not)");
    }
  }
  r->rank = c->first;
  alarm(0);
  if (report && c->first == 0) {
    fprintf(stderr, "[%s] %d back-to-back allreduces of %zu B: issued in %.3f s, complete after %.3f s\n", r->label, ncalls,
            bytes, t_issue, t_done);
    fflush(stderr);
  }
  rc = 0;
out:
  r->rank = c->first;
  free(want);
  free(tmp);
  free(got);
  return rc;
}

static int burst(ctx_t *c) {
  hx_rank_t *r = c->r;
  uint32_t *da[MAX_LOCAL] = {NULL}, *db[MAX_LOCAL] = {NULL};
  size_t free0[MAX_LOCAL] = {0}, free1[MAX_LOCAL] = {0}, tot = 0;
  int rc = 1;
  const long e0 = r->errors;
  const double t0 = hx_now();
  for (int li = 0; li < c->nlocal; li++) {
    if (!CU(r, cudaSetDevice(c->dev[li])) || !CU(r, cudaMalloc((void **)&da[li], BURST_BIG_COUNT * sizeof(uint32_t))) ||
        !CU(r, cudaMalloc((void **)&db[li], BURST_BIG_COUNT * sizeof(uint32_t))))
      goto out;
  }
  /* warm-up: whatever the library allocates on first use */
  if (burst_run(c, da, db, BURST_SMALL_COUNT, 1, 0) || burst_run(c, da, db, BURST_BIG_COUNT, 1, 0)) goto out;
  for (int li = 0; li < c->nlocal; li++)
    if (!CU(r, cudaSetDevice(c->dev[li])) || !CU(r, cudaDeviceSynchronize()) || !CU(r, cudaMemGetInfo(&free0[li], &tot)))
      goto out;
  if (burst_run(c, da, db, BURST_SMALL_COUNT, BURST_CALLS, 1)) goto out;
  if (burst_run(c, da, db, BURST_BIG_COUNT, BURST_CALLS, 1)) goto out;
  for (int li = 0; li < c->nlocal; li++) {
    if (!CU(r, cudaSetDevice(c->dev[li])) || !CU(r, cudaDeviceSynchronize()) || !CU(r, cudaMemGetInfo(&free1[li], &tot)))
      goto out;
    size_t diff = free0[li] > free1[li] ? free0[li] - free1[li] : free1[li] - free0[li];
    r->rank = c->first + li;
    snprintf(r->what, sizeof r->what, "device memory across %d + %d back-to-back allreduces", BURST_CALLS, BURST_CALLS);
    if (diff >= MEM_SLACK)
      hx_fail(r, "GPU %d: free memory %zu MiB before, %zu MiB after (%s by %zu MiB; at most %zu MiB allowed)", c->dev[li],
              free0[li] >> 20, free1[li] >> 20, free1[li] < free0[li] ? "down" : "up", diff >> 20, MEM_SLACK >> 20);
    else if (c->first == 0 || g_verbose)
      fprintf(stderr, "[%s] GPU %d: free memory %zu MiB before, %zu MiB after the back-to-back calls\n", r->label,
              c->dev[li], free0[li] >> 20, free1[li] >> 20);
  }
  r->rank = c->first;
  rc = 0;
out:
  for (int li = 0; li < c->nlocal; li++) {
    cudaSetDevice(c->dev[li]);
    cudaDeviceSynchronize();
    if (da[li]) cudaFree(da[li]);
    if (db[li]) cudaFree(db[li]);
  }
  progress(c, "back-to-back allreduces (warm-up, 1000 x 1 KiB, 1000 x 4 MiB)", 2 + 2 * BURST_CALLS, t0, e0);
  return rc;
}

static int multi_body(ctx_t *c) { return two_sets(c); }
static int burst_body(ctx_t *c) { return burst(c); }

/* One communicator, consecutive calls on NSTREAMS user streams, nothing synchronised in between. */
static int streams_body(ctx_t *c) {
  const int n = c->nranks;
  const size_t big = g_no_big ? 100003 : BIG_COUNT;
  spec_t sp[30];
  int sidx[30];
  /* 1: small calls (the one-shot kernel in the default environment) */
  for (int k = 0; k < 30; k++) {
    spec_t s = {.coll = k % 2 ? C_ALLGATHER : C_ALLREDUCE, .dtype = k % 3 ? FLEXCOLL_FLOAT32 : FLEXCOLL_INT32,
                .op = (flexcoll_op_t)(k % FLEXCOLL_NUM_OPS), .count = 1031 + (size_t)k, .inplace = (k / 2) % 2};
    sp[k] = s;
    sidx[k] = k % NSTREAMS;
  }
  double t0 = hx_now();
  long e0 = c->r->errors;
  if (run_batch(c, sp, NULL, sidx, 30)) return 1;
  progress(c, "one communicator, 30 small calls rotated over 3 streams, one wait", 30, t0, e0);
  /* 2: pipelined calls (the schedule executor), and small ones among them */
  for (int k = 0; k < 12; k++) {
    static const int colls[4] = {C_ALLREDUCE, C_BROADCAST, C_REDUCE_SCATTER, C_ALLGATHER};
    spec_t s = {.coll = colls[k % 4], .dtype = k % 2 ? FLEXCOLL_BFLOAT16 : FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM,
                .count = k % 3 == 2 ? 777 : big, .root = k % n, .inplace = k % 2};
    sp[k] = s;
    sidx[k] = k % NSTREAMS;
  }
  t0 = hx_now();
  e0 = c->r->errors;
  if (run_batch(c, sp, NULL, sidx, 12)) return 1;
  progress(c, "one communicator, 12 mixed calls rotated over 3 streams, one wait", 12, t0, e0);
  return 0;
}

/* ---- host memory on GPU communicators; mixed memory kinds ------------------------------------- */

static int invalid_usage(ctx_t *c) {
  hx_rank_t *r = c->r;
  const int n = c->nranks;
  const size_t cnt = 7, bytes = (size_t)n * cnt * sizeof(float);
  int rc = -1;
  char *dsend[MAX_LOCAL] = {NULL}, *drecv[MAX_LOCAL] = {NULL};
  unsigned char *hsend = malloc(bytes), *hrecv = malloc(bytes), *copy = malloc(bytes), *orig = malloc(bytes);
  if (!hsend || !hrecv || !copy || !orig) { hx_fail(r, "out of memory"); goto out; }
  for (size_t i = 0; i < bytes; i++) orig[i] = (unsigned char)(i * 37 + 11);
  for (int li = 0; li < c->nlocal; li++) {
    const int me = c->first + li;
    flexcoll_comm_t comm = c->comm[0][li];
    cudaStream_t st = c->stream[li][0];
    r->rank = me;
    memcpy(hsend, orig, bytes);
    memset(hrecv, HX_POISON, bytes);
    if (!CU(r, cudaSetDevice(c->dev[li])) || !CU(r, cudaMalloc((void **)&dsend[li], bytes)) ||
        !CU(r, cudaMalloc((void **)&drecv[li], bytes)) || !CU(r, cudaMemcpy(dsend[li], orig, bytes, cudaMemcpyHostToDevice)) ||
        !CU(r, cudaMemset(drecv[li], HX_POISON, bytes)) || !CU(r, cudaDeviceSynchronize()))
      goto out;
    struct {
      const char *what;
      flexcoll_result_t res;
    } calls[7];
    int k = 0;
    const void *hs = hsend, *ds = dsend[li];
    void *hr = hrecv, *dr = drecv[li];
    /* outside any group: each call must fail at once, before it reaches a peer */
    calls[k].what = "allreduce(host sendbuf, device recvbuf)";
    calls[k++].res = flexcoll_allreduce(hs, dr, cnt, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, st);
    calls[k].what = "allreduce(device sendbuf, host recvbuf)";
    calls[k++].res = flexcoll_allreduce(ds, hr, cnt, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, st);
    calls[k].what = "allgather(host sendbuf, device recvbuf)";
    calls[k++].res = flexcoll_allgather(hs, dr, cnt, FLEXCOLL_FLOAT32, comm, st);
    calls[k].what = "reduce_scatter(host sendbuf, device recvbuf)";
    calls[k++].res = flexcoll_reduce_scatter(hs, dr, cnt, FLEXCOLL_FLOAT32, FLEXCOLL_MAX, comm, st);
    calls[k].what = "broadcast(host sendbuf, device recvbuf, root = this rank)";
    calls[k++].res = flexcoll_broadcast(hs, dr, cnt, FLEXCOLL_FLOAT32, me, comm, st);
    calls[k].what = "reduce(host sendbuf, device recvbuf, root = this rank)";
    calls[k++].res = flexcoll_reduce(hs, dr, cnt, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, me, comm, st);
    calls[k].what = "broadcast(device sendbuf, host recvbuf, root = this rank)";
    calls[k++].res = flexcoll_broadcast(ds, hr, cnt, FLEXCOLL_FLOAT32, me, comm, st);
    int fatal = 0;
    for (int i = 0; i < k; i++) {
      snprintf(r->what, sizeof r->what, "%s", calls[i].what);
      if (calls[i].res != FLEXCOLL_INVALID_USAGE) {
        hx_fail(r, "returned %d (%s), expected FLEXCOLL_INVALID_USAGE (%d); last error: %s", (int)calls[i].res,
                flexcoll_get_error_string(calls[i].res), (int)FLEXCOLL_INVALID_USAGE, flexcoll_get_last_error(comm));
        if (calls[i].res == FLEXCOLL_SUCCESS) fatal = 1; /* a call went out that the peers never match */
      } else if (g_verbose) {
        fprintf(stderr, "[%s] rank %d: %s -> FLEXCOLL_INVALID_USAGE: %s\n", r->label, me, calls[i].what,
                flexcoll_get_last_error(comm));
      }
    }
    if (fatal) goto out;
    snprintf(r->what, sizeof r->what, "after the rejected mixed-memory calls");
    if (!CU(r, cudaStreamSynchronize(st)) || !CU(r, cudaMemcpy(copy, drecv[li], bytes, cudaMemcpyDeviceToHost))) goto out;
    hx_check_poisoned(r, "device recvbuf of the rejected calls", copy, bytes);
    hx_check_poisoned(r, "host recvbuf of the rejected calls", hrecv, bytes);
    if (memcmp(hsend, orig, bytes)) hx_fail(r, "host sendbuf of the rejected calls changed");
  }
  r->rank = c->first;
  rc = 0;
out:
  r->rank = c->first;
  for (int li = 0; li < c->nlocal; li++) {
    cudaSetDevice(c->dev[li]);
    if (dsend[li]) cudaFree(dsend[li]);
    if (drecv[li]) cudaFree(drecv[li]);
  }
  free(hsend);
  free(hrecv);
  free(copy);
  free(orig);
  return rc;
}

/* One collective window registration on every local rank (a group when there are several):
 * every rank must get `expect`; on success the windows are deregistered again. */
static int window_collective(ctx_t *c, const char *what, void *const *buf, const size_t *bytes, flexcoll_result_t expect) {
  hx_rank_t *r = c->r;
  const int group = c->nlocal > 1;
  flexcoll_window_t w[MAX_LOCAL] = {NULL};
  flexcoll_result_t res[MAX_LOCAL + 1];
  snprintf(r->what, sizeof r->what, "flexcoll_window_register, %s", what);
  wd_arm(r, "in");
  if (group) flexcoll_group_start();
  for (int li = 0; li < c->nlocal; li++) res[li] = flexcoll_window_register(c->comm[0][li], buf[li], bytes[li], &w[li]);
  if (group) res[c->nlocal] = flexcoll_group_end();
  int bad = 0;
  /* In a group the calls are queued (SUCCESS) and the group's end reports. */
  for (int k = group ? c->nlocal : 0; k < c->nlocal + group; k++) {
    flexcoll_result_t got = res[k];
    if (got != expect) {
      hx_fail(r, "returned %d (%s) %s, expected %d (%s); last error: %s", (int)got, flexcoll_get_error_string(got),
              k == c->nlocal ? "from flexcoll_group_end" : "", (int)expect, flexcoll_get_error_string(expect),
              flexcoll_get_last_error(k == c->nlocal ? NULL : c->comm[0][k]));
      bad = 1;
    } else if (g_verbose) {
      fprintf(stderr, "[%s] %s -> %s: %s\n", r->label, what, flexcoll_get_error_string(got),
              flexcoll_get_last_error(k == c->nlocal ? NULL : c->comm[0][k]));
    }
  }
  if (expect == FLEXCOLL_SUCCESS && !bad) {
    if (group) flexcoll_group_start();
    for (int li = 0; li < c->nlocal; li++) res[li] = flexcoll_window_deregister(c->comm[0][li], w[li]);
    if (group) res[0] = flexcoll_group_end();
    if (res[0] != FLEXCOLL_SUCCESS) hx_fail(r, "flexcoll_window_deregister after %s: %s", what, flexcoll_get_last_error(NULL));
  }
  alarm(0);
  return bad ? -1 : 0;
}

/* flexcoll_window_register/deregister refuse bad arguments: at once when only this rank can
 * tell, on every rank together when the ranks disagree. */
static int window_misuse(ctx_t *c) {
  hx_rank_t *r = c->r;
  const size_t bytes = 1 << 20;
  char *dev[MAX_LOCAL] = {NULL};
  void *host[MAX_LOCAL] = {NULL}, *buf[MAX_LOCAL];
  size_t len[MAX_LOCAL];
  int rc = -1;
  for (int li = 0; li < c->nlocal; li++) {
    flexcoll_comm_t comm = c->comm[0][li];
    flexcoll_window_t w = NULL;
    if (!CU(r, cudaSetDevice(c->dev[li])) || !CU(r, cudaMalloc((void **)&dev[li], bytes))) goto out;
    host[li] = malloc(bytes);
    if (!host[li]) { hx_fail(r, "out of memory"); goto out; }
    struct {
      const char *what;
      flexcoll_result_t res;
    } calls[] = {
        {"register(buf NULL)", flexcoll_window_register(comm, NULL, bytes, &w)},
        {"register(bytes 0)", flexcoll_window_register(comm, dev[li], 0, &w)},
        {"register(window NULL)", flexcoll_window_register(comm, dev[li], bytes, NULL)},
        {"register(comm NULL)", flexcoll_window_register(NULL, dev[li], bytes, &w)},
        {"deregister(window NULL)", flexcoll_window_deregister(comm, NULL)},
        {"deregister(a pointer that is no window)", flexcoll_window_deregister(comm, (flexcoll_window_t)host[li])},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
      if (calls[i].res != FLEXCOLL_INVALID_ARGUMENT)
        hx_fail(r, "flexcoll_window_%s returned %d (%s), expected FLEXCOLL_INVALID_ARGUMENT; last error: %s", calls[i].what,
                (int)calls[i].res, flexcoll_get_error_string(calls[i].res), flexcoll_get_last_error(comm));
    if (w) hx_fail(r, "a refused flexcoll_window_register set the window");
  }
  for (int li = 0; li < c->nlocal; li++) buf[li] = host[li], len[li] = bytes;
  if (window_collective(c, "host memory on every rank", buf, len, FLEXCOLL_INVALID_USAGE)) goto out;
  for (int li = 0; li < c->nlocal; li++) buf[li] = dev[li] + 4096, len[li] = bytes;
  if (window_collective(c, "bytes past the end of the allocation", buf, len, FLEXCOLL_INVALID_ARGUMENT)) goto out;
  for (int li = 0; li < c->nlocal; li++) buf[li] = dev[li], len[li] = c->first + li == 0 ? bytes : bytes / 2;
  if (c->nranks > 1 && window_collective(c, "unequal sizes", buf, len, FLEXCOLL_INVALID_USAGE)) goto out;
  for (int li = 0; li < c->nlocal; li++) buf[li] = dev[li] + 256, len[li] = bytes - 256;
  if (window_collective(c, "a valid window", buf, len, FLEXCOLL_SUCCESS)) goto out;
  rc = 0;
out:
  r->what[0] = '\0';
  for (int li = 0; li < c->nlocal; li++) {
    cudaSetDevice(c->dev[li]);
    if (dev[li]) cudaFree(dev[li]);
    free(host[li]);
  }
  return rc;
}

static int host_body(ctx_t *c) {
  const int n = c->nranks;
  double t0 = hx_now();
  long calls = 0, e0 = c->r->errors;
  /* host buffers on GPU communicators: every collective, in and out of place */
  for (int coll = 0; coll < NCOLLS; coll++)
    for (int ip = 0; ip < 2; ip++)
      for (int k = 0; k < 2; k++) {
        spec_t s = {.coll = coll, .dtype = (flexcoll_datatype_t)((coll * 4 + ip * 2 + k) % FLEXCOLL_NUM_DATATYPES),
                    .op = (flexcoll_op_t)((coll + ip + k) % FLEXCOLL_NUM_OPS), .count = k ? 4099 : 7,
                    .root = (ip + k) % n, .inplace = ip, .host = 1};
        if (run_one(c, &s)) return 1;
        calls++;
      }
  if (!g_no_big) {
    spec_t s = {.coll = C_ALLREDUCE, .dtype = FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM, .count = BIG_COUNT, .host = 1};
    if (run_one(c, &s)) return 1;
    calls++;
  }
  progress(c, "host-memory calls on GPU communicators (checked on return)", calls, t0, e0);
  t0 = hx_now();
  e0 = c->r->errors;
  if (invalid_usage(c)) return 1;
  if (window_misuse(c)) return 1;
  /* the communicators still work, device and host memory */
  spec_t after[2] = {{.coll = C_ALLREDUCE, .dtype = FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM, .count = 4099},
                     {.coll = C_ALLREDUCE, .dtype = FLEXCOLL_INT64, .op = FLEXCOLL_MAX, .count = 7, .host = 1}};
  if (run_one(c, &after[0]) || run_one(c, &after[1])) return 1;
  progress(c, "FLEXCOLL_INVALID_USAGE for mixed host/device buffers, then usable", 9, t0, e0);
  return 0;
}

/* ---- process set-up: 1proc (init_all) and 2proc (fork, init_rank) ------------------------------- */

typedef int (*body_fn)(ctx_t *c);

typedef struct {
  const hx_opts_t *o;
  const variant_t *v;
  int nsets;
  body_fn fn;
} job_t;

static int ctx_setup(ctx_t *c) {
  hx_rank_t *r = c->r;
  snprintf(r->what, sizeof r->what, "set-up");
  for (int li = 0; li < c->nlocal; li++) {
    if (!CU(r, cudaSetDevice(c->dev[li]))) return -1;
    for (int k = 0; k < NSTREAMS; k++)
      if (!CU(r, cudaStreamCreate(&c->stream[li][k]))) return -1;
  }
  for (int s = 0; s < c->nsets; s++)
    for (int li = 0; li < c->nlocal; li++) {
      int count = -1, rank = -1, dev = -2;
      flexcoll_comm_t comm = c->comm[s][li];
      if (!hx_ok(r, flexcoll_comm_count(comm, &count), comm, "flexcoll_comm_count") ||
          !hx_ok(r, flexcoll_comm_user_rank(comm, &rank), comm, "flexcoll_comm_user_rank") ||
          !hx_ok(r, flexcoll_comm_cu_device(comm, &dev), comm, "flexcoll_comm_cu_device"))
        return -1;
      if (count != c->nranks || rank != c->first + li || dev != c->dev[li]) {
        hx_fail(r, "comm set %d local %d: count %d, rank %d, device %d; expected %d, %d, %d", s, li, count, rank, dev,
                c->nranks, c->first + li, c->dev[li]);
        return -1;
      }
    }
  r->what[0] = '\0';
  return 0;
}

typedef struct {
  flexcoll_comm_t comm;
  flexcoll_result_t res;
  pthread_t th;
} destroy_job_t;

static void *destroy_thread(void *arg) {
  destroy_job_t *j = arg;
  j->res = flexcoll_comm_destroy(j->comm);
  return NULL;
}

/* Destroying a GPU communicator waits for its peers: the ranks of one process go concurrently. */
static void destroy_set(ctx_t *c, int s) {
  hx_rank_t *r = c->r;
  destroy_job_t j[MAX_LOCAL];
  int started[MAX_LOCAL] = {0};
  for (int li = 0; li < c->nlocal; li++) {
    j[li].comm = c->comm[s][li];
    j[li].res = FLEXCOLL_SUCCESS;
    if (!j[li].comm) continue;
    if (c->nlocal == 1) {
      destroy_thread(&j[li]);
    } else if (pthread_create(&j[li].th, NULL, destroy_thread, &j[li]) == 0) {
      started[li] = 1;
    } else {
      hx_fail(r, "pthread_create failed");
      continue;
    }
  }
  for (int li = 0; li < c->nlocal; li++) {
    if (started[li]) pthread_join(j[li].th, NULL);
    if (j[li].comm && j[li].res != FLEXCOLL_SUCCESS) {
      snprintf(r->what, sizeof r->what, "flexcoll_comm_destroy(set %d, rank %d)", s, c->first + li);
      hx_fail(r, "returned %d (%s): %s", (int)j[li].res, flexcoll_get_error_string(j[li].res), flexcoll_get_last_error(NULL));
    }
    c->comm[s][li] = NULL;
  }
}

/* After the body: on success destroy everything cleanly; on a fatal error abort the communicators
 * (releases device work stuck on a peer) and leave.  Returns the process's exit status. */
static int ctx_finish(ctx_t *c, int rc) {
  hx_rank_t *r = c->r;
  if (rc || r->errors)
    fprintf(stderr, "[%s] rank %d%s: %s (%ld error(s))\n", r->label, c->first, c->nlocal > 1 ? " (and the other local ranks)" : "",
            rc ? "stopped early" : "done, with mismatches", r->errors);
  if (rc) {
    /* A hung collective may keep abort or the process's exit from finishing: a watchdog. */
    fprintf(stderr, "[%s] rank %d: aborting the communicators (SIGALRM in %d s if that or the exit hangs)\n", r->label,
            c->first, WATCHDOG_S);
    fflush(stderr);
    wd_note(r, "in flexcoll_comm_abort or the exit after");
    alarm(WATCHDOG_S);
    for (int s = 0; s < c->nsets; s++)
      for (int li = 0; li < c->nlocal; li++)
        if (c->comm[s][li]) flexcoll_comm_abort(c->comm[s][li]);
    fprintf(stderr, "[%s] rank %d: communicators aborted\n", r->label, c->first);
    fflush(stderr);
    return 1;
  }
  for (int li = 0; li < c->nlocal; li++) {
    cudaSetDevice(c->dev[li]);
    for (int k = 0; k < NSTREAMS; k++)
      if (c->stream[li][k]) CU(r, cudaStreamSynchronize(c->stream[li][k]));
  }
  snprintf(r->what, sizeof r->what, "flexcoll_window_deregister of the arenas");
  wd_arm(r, "in");
  windows_set(c, 0);
  snprintf(r->what, sizeof r->what, "flexcoll_comm_destroy of every communicator");
  wd_arm(r, "in");
  for (int s = 0; s < c->nsets; s++) destroy_set(c, s);
  alarm(0);
  for (int li = 0; li < c->nlocal; li++) {
    cudaSetDevice(c->dev[li]);
    for (int k = 0; k < NSTREAMS; k++)
      if (c->stream[li][k]) cudaStreamDestroy(c->stream[li][k]);
    if (c->arena[li]) cudaFree(c->arena[li]);
  }
  return r->errors != 0;
}

/* 1proc: the body of hx_run_process's child (the environment is already applied). */
static int onep_main(void *arg) {
  const job_t *j = arg;
  hx_rank_t r;
  const int n = g_ngpus >= 2 ? 2 : 1;
  wd_install();
  hx_rank_init(&r, j->o, 0, n, NULL);
  ctx_t c;
  memset(&c, 0, sizeof c);
  c.r = &r;
  c.v = j->v;
  c.topo = "1proc";
  c.nranks = c.nlocal = n;
  c.nsets = j->nsets;
  for (int li = 0; li < n; li++) c.dev[li] = li;
  for (int s = 0; s < c.nsets; s++) {
    snprintf(r.what, sizeof r.what, "flexcoll_comm_init_all(comms, %d, NULL), set %d", n, s);
    wd_arm(&r, "in");
    if (!hx_ok(&r, flexcoll_comm_init_all(c.comm[s], n, NULL), NULL, "flexcoll_comm_init_all")) return ctx_finish(&c, 1);
  }
  alarm(0);
  if (ctx_setup(&c)) return ctx_finish(&c, 1);
  return ctx_finish(&c, j->fn(&c));
}

/* 2proc: rank `rank` of two processes (forked, CUDA untouched before the fork). */
static int twop_rank_main(const job_t *j, int rank, const flexcoll_unique_id_t *ids) {
  hx_rank_t r;
  hx_rank_init(&r, j->o, rank, 2, NULL);
  ctx_t c;
  memset(&c, 0, sizeof c);
  c.r = &r;
  c.v = j->v;
  c.topo = "2proc";
  c.nranks = 2;
  c.nlocal = 1;
  c.first = rank;
  c.nsets = j->nsets;
  c.dev[0] = rank;
  snprintf(r.what, sizeof r.what, "cudaSetDevice(%d)", rank);
  if (!CU(&r, cudaSetDevice(rank))) return 1;
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = rank;
  for (int s = 0; s < c.nsets; s++) {
    snprintf(r.what, sizeof r.what, "flexcoll_comm_init_rank(2 ranks, rank %d, cuda_device %d), set %d", rank, rank, s);
    wd_arm(&r, "in");
    if (!hx_ok(&r, flexcoll_comm_init_rank(&c.comm[s][0], 2, ids[s], rank, &config), NULL, "flexcoll_comm_init_rank"))
      return ctx_finish(&c, 1);
  }
  alarm(0);
  if (ctx_setup(&c)) return ctx_finish(&c, 1);
  return ctx_finish(&c, j->fn(&c));
}

static void timing_line(const hx_opts_t *o, const char *mode, int nranks, double t0, int ok) {
  fprintf(stderr, "[hx] %-34s %-7s %2d ranks%s%-5s %8.2f s  %s\n", o->label, mode, nranks, o->algo ? "  algo=" : "       ",
          o->algo ? o->algo : "", hx_now() - t0, ok ? "ok" : "FAILED");
  fflush(stderr);
}

/* Fork the two ranks; wait until the deadline, and once one rank has failed give the other 15 s
 * to report before killing it.  Returns 1 when both exited 0. */
static int run_twop(const job_t *j) {
  const hx_opts_t *o = j->o;
  const double t0 = hx_now(), deadline = t0 + (o->deadline_s > 0 ? o->deadline_s : 300.0);
  (void)hx_seed();
  flexcoll_unique_id_t ids[MAX_SETS];
  for (int s = 0; s < j->nsets; s++) {
    flexcoll_result_t res = flexcoll_get_unique_id(&ids[s]);
    if (res != FLEXCOLL_SUCCESS) {
      fprintf(stderr, "[%s] flexcoll_get_unique_id returned %d: %s\n", o->label, (int)res, flexcoll_get_last_error(NULL));
      return 0;
    }
  }
  pid_t parent = getpid(), pids[2] = {-1, -1};
  fflush(stdout);
  fflush(stderr);
  for (int rank = 0; rank < 2; rank++) {
    pid_t p = fork();
    if (p < 0) {
      fprintf(stderr, "[%s] fork: %s\n", o->label, strerror(errno));
      if (pids[0] > 0) {
        kill(pids[0], SIGKILL);
        waitpid(pids[0], NULL, 0);
      }
      return 0;
    }
    if (p == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(3);
      wd_install();
      hx_apply_env(o);
      int rc = twop_rank_main(j, rank, ids);
      fflush(stdout);
      fflush(stderr);
      _exit(rc ? 1 : 0);
    }
    pids[rank] = p;
  }
  int status[2] = {0, 0}, done[2] = {0, 0}, ok = 1;
  double fail_at = 0;
  while (!done[0] || !done[1]) {
    int progressed = 0;
    for (int i = 0; i < 2; i++) {
      if (done[i]) continue;
      pid_t p = waitpid(pids[i], &status[i], WNOHANG);
      if (p == pids[i] || (p < 0 && errno == ECHILD)) {
        if (p < 0) status[i] = 0x7f00;
        done[i] = 1;
        progressed = 1;
        if (!(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0) && fail_at == 0) fail_at = hx_now();
      }
    }
    const double now = hx_now();
    if (now > deadline || (fail_at > 0 && now > fail_at + 15.0)) {
      for (int i = 0; i < 2; i++)
        if (!done[i]) {
          fprintf(stderr, "[%s] rank %d (pid %d) %s: killed\n", o->label, i, (int)pids[i],
                  now > deadline ? "did not finish before the deadline" : "still running 15 s after its peer failed");
          kill(pids[i], SIGKILL);
          while (waitpid(pids[i], &status[i], 0) < 0 && errno == EINTR) {}
          done[i] = 2;
        }
      break;
    }
    if (!progressed) {
      struct timespec ts = {0, 5 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  for (int i = 0; i < 2; i++) {
    if (done[i] == 1 && WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0) continue;
    ok = 0;
    if (done[i] == 1) {
      if (WIFEXITED(status[i]))
        fprintf(stderr, "[%s] rank %d (pid %d) exited with status %d\n", o->label, i, (int)pids[i], WEXITSTATUS(status[i]));
      else if (WIFSIGNALED(status[i]))
        fprintf(stderr, "[%s] rank %d (pid %d) killed by signal %d (%s)\n", o->label, i, (int)pids[i], WTERMSIG(status[i]),
                strsignal(WTERMSIG(status[i])));
    }
  }
  timing_line(o, "procs", 2, t0, ok);
  return ok;
}

static int run_topology(int twop, const hx_opts_t *o, const variant_t *v, int nsets, body_fn fn) {
  job_t j = {o, v, nsets, fn};
  if (twop) return run_twop(&j);
  return hx_run_process(o, onep_main, &j);
}

/* ---- test cases ----------------------------------------------------------------------------------- */

/* Whether FC_TEST_VARIANT (a list of indices, "0,4,5") selects variant i. */
static int variant_selected(int i) {
  if (!g_variants || !*g_variants) return 1;
  for (const char *p = g_variants; *p;) {
    char *end;
    long k = strtol(p, &end, 10);
    if (end == p) {
      p++;
      continue;
    }
    if (k == i) return 1;
    p = end;
  }
  return 0;
}

static int run_variant(int twop, int i) {
  const variant_t *v = &variants[i];
  char label[96];
  snprintf(label, sizeof label, "gpu %s %s", twop ? "2proc" : "1proc", v->name);
  if (!variant_selected(i)) {
    fprintf(stderr, "[test_gpu] === %s: not in FC_TEST_VARIANT=%s, skipped ===\n", label, g_variants);
    return 1;
  }
  hx_opts_t o = {.label = label, .algo = v->algo, .deadline_s = v->huge ? 420 : 300, .timeout_ms = g_timeout_ms,
                 .env = v->env};
  fprintf(stderr, "[test_gpu] === %s: every collective x dtype x op%s ===\n", label,
          v->small ? "" : " (1000003 elements only)");
  return run_topology(twop, &o, v, 1, matrix_body);
}

START_TEST(test_p1) { ck_assert_msg(run_variant(0, _i), "1proc %s: see stderr", variants[_i].name); }
END_TEST
START_TEST(test_p2) { ck_assert_msg(run_variant(1, _i), "2proc %s: see stderr", variants[_i].name); }
END_TEST

static int run_misc(int twop, const char *what, int nsets, body_fn fn) {
  char label[96];
  snprintf(label, sizeof label, "gpu %s %s", twop ? "2proc" : "1proc", what);
  static const char *const env[] = {"FLEXCOLL_NVLINK_ENGINE", "FLEXCOLL_ONESHOT_MAX_BYTES", ENV_COMMON, NULL};
  hx_opts_t o = {.label = label, .deadline_s = 300, .timeout_ms = g_timeout_ms, .env = env};
  fprintf(stderr, "[test_gpu] === %s ===\n", label);
  return run_topology(twop, &o, NULL, nsets, fn);
}

START_TEST(test_multi) { ck_assert_msg(run_misc(_i, "multi", 2, multi_body), "multi (%s): see stderr", _i ? "2proc" : "1proc"); }
END_TEST
START_TEST(test_burst) { ck_assert_msg(run_misc(_i, "burst", 1, burst_body), "burst (%s): see stderr", _i ? "2proc" : "1proc"); }
END_TEST
START_TEST(test_streams) {
  ck_assert_msg(run_misc(_i, "streams", 1, streams_body), "streams (%s): see stderr", _i ? "2proc" : "1proc");
}
END_TEST
START_TEST(test_host) { ck_assert_msg(run_misc(_i, "host", 1, host_body), "host (%s): see stderr", _i ? "2proc" : "1proc"); }
END_TEST

static Suite *gpu_suite(int ngpus) {
  Suite *s = suite_create("gpu");
  const int two = ngpus >= 2 ? 2 : 1; /* loop bound for cases with a 2proc second half */
  struct {
    const char *name;
    const TTest *test;
    int loops;
  } cases[] = {
      {"p1", test_p1, NVARIANTS}, {"p2", test_p2, ngpus >= 2 ? NVARIANTS : 0},
      {"multi", test_multi, two}, {"burst", test_burst, two}, {"streams", test_streams, two}, {"host", test_host, two},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (!cases[i].loops) continue;
    TCase *tc = tcase_create(cases[i].name);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, cases[i].test, 0, cases[i].loops);
    suite_add_tcase(s, tc);
  }
  return s;
}

/* Why cudaGetDeviceCount failed, in the words of a machine without a GPU: the runtime reports a
 * missing driver as an "insufficient" one, which sends a user looking for a driver upgrade. */
static void gpu_error_reason(cudaError_t e, char *why, size_t len) {
  const char *name = cudaGetErrorName(e);
  if (e == cudaErrorNoDevice)
    snprintf(why, len, "no GPU: the driver sees no device (%s)", name);
  else if (e == cudaErrorInsufficientDriver && access("/proc/driver/nvidia/version", F_OK) != 0)
    snprintf(why, len, "no GPU: no NVIDIA driver is loaded (%s)", name);
  else if (e == cudaErrorInsufficientDriver)
    snprintf(why, len, "the NVIDIA driver is older than this CUDA runtime (%s)", name);
  else
    snprintf(why, len, "cudaGetDeviceCount: %s (%s)", name, cudaGetErrorString(e));
}

/* cudaGetDeviceCount in a forked child, so that this process never initialises CUDA (its
 * children could not use CUDA after that).  Returns the count, or -1 when CUDA failed. */
static int probe_gpus(char *why, size_t len) {
  int fd[2];
  snprintf(why, len, "unknown");
  if (pipe(fd)) {
    snprintf(why, len, "pipe: %s", strerror(errno));
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t p = fork();
  if (p < 0) {
    snprintf(why, len, "fork: %s", strerror(errno));
    return -1;
  }
  if (p == 0) {
    close(fd[0]);
    alarm(120);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    int msg[2] = {(int)e, e == cudaSuccess ? n : 0};
    if (write(fd[1], msg, sizeof msg) != (ssize_t)sizeof msg) _exit(2);
    _exit(0);
  }
  close(fd[1]);
  int msg[2] = {-1, 0};
  ssize_t got = 0;
  while (got < (ssize_t)sizeof msg) {
    ssize_t k = read(fd[0], (char *)msg + got, sizeof msg - (size_t)got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += k;
  }
  close(fd[0]);
  int st = 0;
  while (waitpid(p, &st, 0) < 0 && errno == EINTR) {}
  if (got != (ssize_t)sizeof msg) {
    snprintf(why, len, "the probe process died (wait status 0x%x)", st);
    return -1;
  }
  if (msg[0] != (int)cudaSuccess) {
    gpu_error_reason((cudaError_t)msg[0], why, len);
    return -1;
  }
  return msg[1];
}

int main(void) {
  char why[256];
  int n = probe_gpus(why, sizeof why);
  if (n <= 0) {
    fprintf(stderr, "[test_gpu] %s: skipped\n", n < 0 ? why : "no GPU: cudaGetDeviceCount reports 0 devices");
    return 77;
  }
  fc_test_gpu_serialize("[test_gpu]");
  g_ngpus = n;
  g_verbose = getenv("FC_TEST_VERBOSE") && atoi(getenv("FC_TEST_VERBOSE"));
  g_no_big = getenv("FC_TEST_NO_BIG") && atoi(getenv("FC_TEST_NO_BIG"));
  g_variants = getenv("FC_TEST_VARIANT");
  if (getenv("FC_TEST_TIMEOUT_MS") && atoi(getenv("FC_TEST_TIMEOUT_MS")) > 0) g_timeout_ms = atoi(getenv("FC_TEST_TIMEOUT_MS"));
  uint64_t seed = hx_seed(); /* chosen and printed once; the forked tests inherit it */
  fprintf(stderr, "[test_gpu] %d GPU(s)%s%s\n", n,
          n >= 2 ? ": one process over GPUs 0 and 1, and two processes" : ": one rank only; the 2-GPU cases are skipped",
          g_no_big ? "; FC_TEST_NO_BIG: no 1000003-element or 256 MB calls" : "");
  double t0 = hx_now();
  SRunner *sr = srunner_create(gpu_suite(n));
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  fprintf(stderr, "[test_gpu] %s in %.1f s; FC_TEST_SEED=0x%016" PRIx64 " reproduces the data\n",
          failed ? "FAILED" : "passed", hx_now() - t0, seed);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
