/* test_capture.c — device collectives on a stream that is being captured into a CUDA graph.
 *
 * The one-shot and ring kernels (and the pipelined ones, which two ranks on one GPU do not use,
 * so they are not reached here) keep their sequence state on the device: a captured call
 * replays correctly, and eager calls between replays stay in step with it; so do the alltoall
 * and point-to-point kernels.  Captured, each
 * collective at LL, plain one-shot and ring sizes (reduce: ring at every size; alltoall, a group
 * of a send and a receive, and gather: their own kernels; alltoall in place too, with its
 * temporary copy's allocation, copy and free in the graph) is replayed
 * hundreds to thousands of times on fresh inputs (written outside the graph, different per
 * replay and rank) and its results checked exactly, with eager calls in between.  The replays'
 * buffers are symmetric windows: eager calls there from 1 MB take direct mode (host counters in
 * stream memory operations), so a captured one must take the kernels instead.  With
 * FLEXCOLL_RING_KERNEL=0 (set by the caller) the calls the ring kernels would take run the
 * algorithms' schedules, a point-to-point kernel per round, and are replayed alike.  Every other
 * path (host memory, a collective in a group, a capture on another stream
 * while the communicator's previous kernel there still runs) would replay stale host counters,
 * need a dependency from outside the capture, or not be in the graph at all: it must be refused
 * with FLEXCOLL_INVALID_USAGE and a message that says why, before enqueuing anything, so the
 * captured graph stays empty, the capture valid and the communicator usable.
 *
 * Then the same again without peer access (FLEXCOLL_LINKS=pcie,shm,tcp: the peers' device memory
 * is never mapped, as between GPUs that cannot reach each other): the ring kernels run every
 * allreduce, allgather, reduce_scatter, broadcast and reduce through host memory (the pcie
 * lane alone) and are captured and replayed (fewer times); alltoall, sends and receives and
 * gather go through host copies and must be refused.  With FLEXCOLL_LINKS or
 * FLEXCOLL_RING_KERNEL=0 set by the caller, only the first pass runs.
 *
 * Host buffers of checked copies are pinned: a pageable copy behind a rank's waiting kernel holds
 * the other rank's thread back (docs/ARCHITECTURE.md, known problems), and the last rank destroys
 * each graph late so that round 5 would stall on them; FC_CAPTURE_PAGEABLE=1 takes pageable ones,
 * to see that happen.
 *
 * Ranks are threads of this process, all on device 0 (several ranks may share a GPU), so the
 * test runs on a one-GPU node.  Exit 77 (automake's skip) where there is no GPU.  Not under
 * CUDA_DEVICE_MAX_CONNECTIONS=1: with one hardware queue, threads of one process on one GPU
 * deadlock as soon as a rank enqueues its next call before its peer's kernel of this one has
 * started (tests/test_onegpu.c, g_lockstep, says why and tests one queue in lockstep). */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flexcoll.h"
#define TEST_TAG "[test_capture]"
#include "gpu_ranks.h"
#include "gpu_serial.h"

#define NRANKS 2
#define COUNT 1000
#define LATE_RANK_US 20000

/* FLEXCOLL_RING_KERNEL=0: the algorithms' schedules run what the ring kernels would. */
static int g_schedules = 0;
/* FC_CAPTURE_PAGEABLE=1: the checked copies through pageable buffers, as before session 35, to
 * see the test fail (the stall at round 5 that the late graph destruction provokes). */
static int g_pageable = 0;
/* This pass leaves nvlink out (FLEXCOLL_LINKS): no peer access; replays divided by this. */
static int g_no_peer = 0;
#define NO_PEER_REPLAY_DIV 10

typedef struct {
  FC_TEST_RANK_MEMBERS;
} rank_t;

/* One AllReduce outside any capture, checked: the communicator still works.  host is pinned
 * (COUNT floats): while this thread copies to pageable memory behind its kernel, another rank's
 * thread of this process can block (in its own pageable copies, or in cudaGraphExecDestroy) until
 * that kernel ends, which waits for that rank's (docs/ARCHITECTURE.md, known problems). */
static void allreduce_checked(rank_t *r, flexcoll_comm_t comm, float *dev, float *host, cudaStream_t s, int round) {
  for (int i = 0; i < COUNT; i++) host[i] = (float)(r->rank + 1) * (float)(i % 7 + round);
  /* On s; the legacy stream only where no capture runs in the other thread (its work would join it). */
  cudaMemcpyAsync(dev, host, COUNT * sizeof(float), cudaMemcpyHostToDevice, s);
  flexcoll_result_t res = flexcoll_allreduce(dev, dev, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "allreduce outside capture: %s", flexcoll_get_last_error(comm));
  cudaMemcpyAsync(host, dev, COUNT * sizeof(float), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  float ranksum = NRANKS * (NRANKS + 1) / 2.0f;
  int bad = 0, first = -1;
  for (int i = 0; i < COUNT; i++)
    if (host[i] != ranksum * (float)(i % 7 + round)) {
      if (first < 0) first = i;
      bad++;
    }
  /* The first wrong element and its neighbours' values say which part went astray. */
  EXPECT(r, bad == 0, "allreduce outside capture (round %d): %d wrong elements, the first %d: %g (want %g; this rank's input %g)",
         round, bad, first, first >= 0 ? host[first] : 0.0f, first >= 0 ? ranksum * (float)(first % 7 + round) : 0.0f,
         first >= 0 ? (float)(r->rank + 1) * (float)(first % 7 + round) : 0.0f);
}

/* Whether the comm's last error names the graph capture (every refusal says why). */
static void expect_refused(rank_t *r, flexcoll_comm_t comm, flexcoll_result_t res, const char *name) {
  const char *why = flexcoll_get_last_error(comm);
  EXPECT(r, res == FLEXCOLL_INVALID_USAGE, "captured %s returned %d (%s), not FLEXCOLL_INVALID_USAGE", name, (int)res,
         flexcoll_get_error_string(res));
  if (res == FLEXCOLL_INVALID_USAGE)
    EXPECT(r, why && strstr(why, "CUDA graph"), "captured %s: the error does not name the CUDA graph capture: \"%s\"",
           name, why ? why : "");
}

/* End a capture in which every call was refused: it must still be valid, its graph empty. */
static void end_empty_capture(rank_t *r, cudaStream_t s, const char *what) {
  cudaGraph_t graph = NULL;
  cudaError_t ce = cudaStreamEndCapture(s, &graph);
  EXPECT(r, ce == cudaSuccess, "%s: cudaStreamEndCapture (the capture must stay valid): %s", what, cudaGetErrorString(ce));
  if (graph) {
    size_t nodes = 99;
    cudaGraphGetNodes(graph, NULL, &nodes);
    EXPECT(r, nodes == 0, "%s: the refused calls left %zu nodes in the captured graph", what, nodes);
    cudaGraphDestroy(graph);
  }
}

/* What the refusal tests use: small device buffers (dev, 2 * COUNT floats) and host ones
 * (pageable: refused as host memory); pinned (but for FC_CAPTURE_PAGEABLE), COUNT floats for
 * allreduce_checked. */
typedef struct {
  float *dev, *host, *pinned;
} bufs_t;

/* Capture on s in `mode` and try every call that must stay refused; the capture stays valid and
 * empty.  Calls that the one-shot kernels take are captured elsewhere (replay_case). */
static void refused_calls(rank_t *r, flexcoll_comm_t comm, const bufs_t *b, cudaStream_t s,
                          enum cudaStreamCaptureMode mode) {
  cudaError_t ce = cudaStreamBeginCapture(s, mode);
  EXPECT(r, ce == cudaSuccess, "cudaStreamBeginCapture: %s", cudaGetErrorString(ce));
  if (ce != cudaSuccess) return;
  const int peer = (r->rank + 1) % NRANKS;
  expect_refused(r, comm, flexcoll_send(b->host, COUNT, FLEXCOLL_FLOAT32, peer, comm, s), "send from host memory");
  expect_refused(r, comm, flexcoll_allreduce(b->host, b->host, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s),
                 "allreduce on host memory");
  if (g_no_peer) {
    expect_refused(r, comm, flexcoll_alltoall(b->dev, b->dev + COUNT, COUNT / NRANKS, FLEXCOLL_FLOAT32, comm, s),
                   "alltoall without peer access");
    expect_refused(r, comm, flexcoll_send(b->dev, COUNT, FLEXCOLL_FLOAT32, peer, comm, s), "send without peer access");
    expect_refused(r, comm, flexcoll_recv(b->dev, COUNT, FLEXCOLL_FLOAT32, peer, comm, s), "recv without peer access");
  }
  /* In a group the refusal comes at the call, so the group never holds half a collective. */
  flexcoll_group_start();
  flexcoll_result_t res = flexcoll_allreduce(b->dev, b->dev, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
  expect_refused(r, comm, res, "allreduce in a group");
  flexcoll_result_t end = flexcoll_group_end();
  EXPECT(r, end == FLEXCOLL_SUCCESS, "group_end after a refused call: %d", (int)end);
  /* Nothing to move: accepted, and nothing captured. */
  res = flexcoll_allreduce(b->dev, b->dev, 0, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "captured allreduce of 0 elements: %s", flexcoll_get_last_error(comm));
  end_empty_capture(r, s, mode == cudaStreamCaptureModeRelaxed ? "refusals (relaxed)" : "refusals (thread-local)");
}

static pthread_barrier_t g_barrier;

/* The communicator's previous kernel ran on s2.  Rank 0 captures on s while that kernel still
 * waits for rank 1's (which starts only after the barrier): the graph would need a dependency
 * from outside its capture, so the call is refused.  Rank 1 captures after its kernel on s2
 * finished (as frameworks warm up on one stream, synchronise and capture on another): allowed,
 * one kernel node and no wait; that graph is not launched (rank 0's has nothing to meet it).
 * Eager calls on s then move the chain back. */
static void capture_after_other_stream(rank_t *r, flexcoll_comm_t comm, float *dev, cudaStream_t s, cudaStream_t s2) {
  if (r->rank == 1) pthread_barrier_wait(&g_barrier);
  flexcoll_result_t res = flexcoll_allreduce(dev, dev, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s2);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "allreduce on a second stream: %s", flexcoll_get_last_error(comm));
  if (r->rank == 1) cudaStreamSynchronize(s2);
  cudaError_t ce = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  EXPECT(r, ce == cudaSuccess, "cudaStreamBeginCapture: %s", cudaGetErrorString(ce));
  if (ce == cudaSuccess) {
    res = flexcoll_allreduce(dev, dev, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
    if (r->rank == 0) {
      expect_refused(r, comm, res, "allreduce while a kernel on another stream runs");
      const char *why = flexcoll_get_last_error(comm);
      EXPECT(r, why && strstr(why, "another stream"), "the refusal does not name the other stream: \"%s\"",
             why ? why : "");
      end_empty_capture(r, s, "capture while a kernel on another stream runs");
    } else {
      EXPECT(r, res == FLEXCOLL_SUCCESS, "allreduce captured after a finished kernel on another stream: %s",
             flexcoll_get_last_error(comm));
      cudaGraph_t graph = NULL;
      ce = cudaStreamEndCapture(s, &graph);
      size_t nodes = 0;
      if (ce == cudaSuccess && graph) cudaGraphGetNodes(graph, NULL, &nodes);
      EXPECT(r, ce == cudaSuccess && nodes == 1, "capture after a finished kernel on another stream: %s, %zu nodes",
             cudaGetErrorString(ce), nodes);
      if (graph) cudaGraphDestroy(graph);
    }
  }
  if (r->rank == 0) {
    pthread_barrier_wait(&g_barrier);
    cudaStreamSynchronize(s2);
  }
}

/* ---- captured one-shot calls, replayed ---- */

typedef enum { K_ALLREDUCE, K_ALLGATHER, K_REDUCE_SCATTER, K_BROADCAST, K_REDUCE, K_ALLTOALL, K_SENDRECV, K_GATHER } kind_t;
typedef struct {
  const char *name;
  kind_t kind;
  flexcoll_datatype_t dt; /* FLOAT32, INT32 or BFLOAT16 */
  flexcoll_op_t op;       /* SUM or MAX */
  int inplace;            /* sendbuf == recvbuf (alltoall only here) */
} coll_t;
static const coll_t colls[] = {
    {"allreduce float32 sum", K_ALLREDUCE, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0},
    {"allreduce int32 max", K_ALLREDUCE, FLEXCOLL_INT32, FLEXCOLL_MAX, 0},
    {"allreduce bfloat16 sum", K_ALLREDUCE, FLEXCOLL_BFLOAT16, FLEXCOLL_SUM, 0},
    {"allgather int32", K_ALLGATHER, FLEXCOLL_INT32, FLEXCOLL_SUM, 0},
    {"reduce_scatter float32 sum", K_REDUCE_SCATTER, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0},
    {"broadcast float32 root 1", K_BROADCAST, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0},
    {"reduce int32 sum root 1", K_REDUCE, FLEXCOLL_INT32, FLEXCOLL_SUM, 0},
    {"alltoall int32", K_ALLTOALL, FLEXCOLL_INT32, FLEXCOLL_SUM, 0},
    {"alltoall int32 in place", K_ALLTOALL, FLEXCOLL_INT32, FLEXCOLL_SUM, 1},
    {"send/recv in a group bfloat16", K_SENDRECV, FLEXCOLL_BFLOAT16, FLEXCOLL_SUM, 0},
    {"gather float32 root 1", K_GATHER, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0},
};
#define NCOLLS (sizeof colls / sizeof colls[0])
/* LL sizes (up to 64 KiB per rank), a plain one, and one above the one-shot limit of 2 ranks
 * (8 MiB) for 4-byte types: the ring kernels (lib/kernels/ring.cu; reduce takes them at every
 * size), whose counters live on the device too. */
static const size_t counts[] = {1, 7, 1000, 100003, 2200001};
#define NCOUNTS (sizeof counts / sizeof counts[0])
#define MAX_COUNT 2200001
#define BIG_REPLAYS 300
#define VARIANTS 8   /* inputs prepared per case; replay i takes variant (3i + 1) % VARIANTS */
#define REPLAYS 2000
#define LONG_REPLAYS 10000
#define ROOT 1

/* Element i of rank q's send buffer in variant v: a small integer (exact in bfloat16, and its
 * sums too), different per rank, variant and position, negative ones included. */
static int value(int q, int v, size_t i) { return (int)((i * 7 + (size_t)v * 13 + (size_t)q * 29) % 61) - 30; }

static size_t dt_size(flexcoll_datatype_t dt) { return dt == FLEXCOLL_BFLOAT16 ? 2 : 4; }
static size_t send_elems(const coll_t *c, size_t n) { return c->kind == K_REDUCE_SCATTER || c->kind == K_ALLTOALL ? NRANKS * n : n; }
static size_t recv_elems(const coll_t *c, size_t n) {
  return c->kind == K_ALLGATHER || c->kind == K_ALLTOALL || c->kind == K_GATHER ? NRANKS * n : n;
}

static void put(flexcoll_datatype_t dt, void *buf, size_t i, int x) {
  if (dt == FLEXCOLL_INT32) {
    ((int32_t *)buf)[i] = x;
  } else {
    float f = (float)x;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if (dt == FLEXCOLL_BFLOAT16) ((uint16_t *)buf)[i] = (uint16_t)(bits >> 16); /* exact: small integers */
    else ((float *)buf)[i] = f;
  }
}
static int get(flexcoll_datatype_t dt, const void *buf, size_t i) {
  if (dt == FLEXCOLL_INT32) return ((const int32_t *)buf)[i];
  float f;
  if (dt == FLEXCOLL_BFLOAT16) {
    uint32_t bits = (uint32_t)((const uint16_t *)buf)[i] << 16;
    memcpy(&f, &bits, 4);
  } else {
    f = ((const float *)buf)[i];
  }
  /* Not a small integer (the poison, say): never expected. */
  return f >= -1e6f && f <= 1e6f && f == (float)(int)f ? (int)f : 1 << 30;
}

/* Element i of rank `rank`'s result in variant v. */
static int expected(const coll_t *c, int rank, int v, size_t n, size_t i) {
  switch (c->kind) {
    case K_ALLGATHER: return value((int)(i / n), v, i % n);
    case K_BROADCAST: return value(ROOT, v, i);
    case K_ALLTOALL: return value((int)(i / n), v, (size_t)rank * n + i % n); /* rank q's block for us */
    case K_SENDRECV: return value((rank + NRANKS - 1) % NRANKS, v, i);                 /* from the left */
    case K_GATHER:
      if (rank != ROOT) return 1 << 30; /* the poison: recvbuf is the root's only */
      return value((int)(i / n), v, i % n);
    case K_REDUCE:
      /* recvbuf is the root's only: still the poison, as get reads it */
      if (rank != ROOT) return c->dt == FLEXCOLL_INT32 ? 0x7f7f7f7f : 1 << 30;
      /* fall through */
    default: {
      const size_t at = c->kind == K_REDUCE_SCATTER ? (size_t)rank * n + i : i;
      int acc = value(0, v, at);
      for (int q = 1; q < NRANKS; q++) acc = c->op == FLEXCOLL_MAX ? (value(q, v, at) > acc ? value(q, v, at) : acc)
                                                                 : acc + value(q, v, at);
      return acc;
    }
  }
}

/* Device buffers of the replay cases (sized for the largest) and host ones to prepare and check. */
typedef struct {
  char *table;              /* VARIANTS rows of ROW bytes: the inputs */
  char *send, *recv;
  float *eager_in, *eager_out;
  char *host;               /* a row, or a result (pinned, as every buffer copied while a peer's kernel may wait) */
  float *eager_host;        /* an eager call's result (pinned) */
  flexcoll_window_t win[2]; /* send and recv are in windows */
} replay_bufs_t;
#define ROW ((size_t)NRANKS * MAX_COUNT * 4)
#define EAGER_MAX 30000
/* Bytes of a result not written yet: 0x7f7f7f7f as int32, about 3.4e38 as float and bfloat16,
 * far from every expected value. */
#define POISON 0x7f

static flexcoll_result_t issue(const coll_t *c, size_t n, const void *send, void *recv, flexcoll_comm_t comm,
                               cudaStream_t s) {
  switch (c->kind) {
    case K_ALLGATHER: return flexcoll_allgather(send, recv, n, c->dt, comm, s);
    case K_REDUCE_SCATTER: return flexcoll_reduce_scatter(send, recv, n, c->dt, c->op, comm, s);
    case K_BROADCAST: return flexcoll_broadcast(send, recv, n, c->dt, ROOT, comm, s);
    case K_REDUCE: return flexcoll_reduce(send, recv, n, c->dt, c->op, ROOT, comm, s);
    case K_ALLTOALL: return flexcoll_alltoall(send, recv, n, c->dt, comm, s);
    case K_GATHER: return flexcoll_gather(send, recv, n, c->dt, ROOT, comm, s);
    case K_SENDRECV: {
      /* A ring exchange, as frameworks' pipeline stages batch it: one group, one kernel. */
      int rank = 0, nranks = 0;
      flexcoll_comm_user_rank(comm, &rank);
      flexcoll_comm_count(comm, &nranks);
      flexcoll_group_start();
      flexcoll_result_t a = flexcoll_send(send, n, c->dt, (rank + 1) % nranks, comm, s);
      flexcoll_result_t b = flexcoll_recv(recv, n, c->dt, (rank + nranks - 1) % nranks, comm, s);
      flexcoll_result_t e = flexcoll_group_end();
      return a != FLEXCOLL_SUCCESS ? a : b != FLEXCOLL_SUCCESS ? b : e;
    }
    default: return flexcoll_allreduce(send, recv, n, c->dt, c->op, comm, s);
  }
}

/* Capture one call into a graph and instantiate it; NULL (reported) when that failed. */
static cudaGraphExec_t capture(rank_t *r, flexcoll_comm_t comm, const coll_t *c, size_t n, const replay_bufs_t *b,
                               cudaStream_t s) {
  cudaError_t ce = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  EXPECT(r, ce == cudaSuccess, "%s count %zu: cudaStreamBeginCapture: %s", c->name, n, cudaGetErrorString(ce));
  if (ce != cudaSuccess) return NULL;
  flexcoll_result_t res = issue(c, n, c->inplace ? b->recv : b->send, b->recv, comm, s);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "%s count %zu: captured call refused: %s", c->name, n, flexcoll_get_last_error(comm));
  cudaGraph_t graph = NULL;
  ce = cudaStreamEndCapture(s, &graph);
  EXPECT(r, ce == cudaSuccess && graph, "%s count %zu: cudaStreamEndCapture: %s", c->name, n, cudaGetErrorString(ce));
  if (ce != cudaSuccess || !graph) return NULL;
  size_t nodes = 0, events = 0;
  cudaGraphGetNodes(graph, NULL, &nodes);
  cudaGraphNode_t list[256];
  size_t listed = nodes < 256 ? nodes : 256;
  cudaGraphGetNodes(graph, list, &listed);
  for (size_t i = 0; i < listed; i++) {
    enum cudaGraphNodeType t;
    if (cudaGraphNodeGetType(list[i], &t) == cudaSuccess && (t == cudaGraphNodeTypeEventRecord || t == cudaGraphNodeTypeWaitEvent))
      events++;
  }
  /* The kernel alone: no event wait or record from the ordering of the communicator's kernels.
   * In place, an alltoall also allocates, fills and frees its copy of the input.  A schedule
   * (g_schedules) has a kernel per round, copies, reductions and its scratch's allocation and
   * free: any number of nodes, but no event either. */
  const size_t want_nodes = c->inplace ? 4 : 1;
  EXPECT(r, (g_schedules && nodes <= 256) || nodes == want_nodes, "%s count %zu: the captured graph has %zu nodes, not %zu",
         c->name, n, nodes, want_nodes);
  EXPECT(r, events == 0, "%s count %zu: the captured graph has %zu event nodes", c->name, n, events);
  cudaGraphExec_t exec = NULL;
  ce = cudaGraphInstantiate(&exec, graph, 0);
  EXPECT(r, ce == cudaSuccess, "%s count %zu: cudaGraphInstantiate: %s", c->name, n, cudaGetErrorString(ce));
  cudaGraphDestroy(graph);
  return res == FLEXCOLL_SUCCESS && ce == cudaSuccess && (g_schedules || nodes == want_nodes) && !events ? exec : NULL;
}

/* The inputs of every variant, uploaded on s. */
static void prepare_inputs(rank_t *r, const coll_t *c, size_t n, const replay_bufs_t *b, cudaStream_t s) {
  const size_t elems = send_elems(c, n), bytes = elems * dt_size(c->dt);
  for (int v = 0; v < VARIANTS; v++) {
    for (size_t i = 0; i < elems; i++) put(c->dt, b->host, i, value(r->rank, v, i));
    cudaMemcpyAsync(b->table + (size_t)v * ROW, b->host, bytes, cudaMemcpyHostToDevice, s);
    cudaStreamSynchronize(s); /* b->host is refilled next */
  }
}

/* Wait for s and compare the result of variant v (and the last eager call's, eager_n
 * elements, 0: none); false after a failure, reported. */
static int check_replay(rank_t *r, flexcoll_comm_t comm, const coll_t *c, size_t n, const replay_bufs_t *b,
                        cudaStream_t s, int v, long replay, size_t eager_n) {
  const size_t elems = recv_elems(c, n);
  cudaMemcpyAsync(b->host, b->recv, elems * dt_size(c->dt), cudaMemcpyDeviceToHost, s);
  cudaError_t ce = cudaStreamSynchronize(s);
  flexcoll_result_t async = FLEXCOLL_SUCCESS;
  flexcoll_comm_get_async_error(comm, &async);
  EXPECT(r, ce == cudaSuccess && async == FLEXCOLL_SUCCESS, "%s count %zu replay %ld: stream %s, async error %d",
         c->name, n, replay, cudaGetErrorString(ce), (int)async);
  if (ce != cudaSuccess || async != FLEXCOLL_SUCCESS) return 0;
  for (size_t i = 0; i < elems; i++) {
    const int want = expected(c, r->rank, v, n, i), got = get(c->dt, b->host, i);
    if (got != want) {
      EXPECT(r, 0, "%s count %zu replay %ld (variant %d): element %zu is %d, not %d", c->name, n, replay, v, i, got, want);
      return 0;
    }
  }
  if (!eager_n) return 1;
  const float *host = b->eager_host;
  cudaMemcpyAsync(b->eager_host, b->eager_out, eager_n * sizeof(float), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  for (size_t i = 0; i < eager_n; i++) {
    int want = 0;
    for (int q = 0; q < NRANKS; q++) want += value(q, 0, i);
    if (host[i] != (float)want) {
      EXPECT(r, 0, "eager allreduce of %zu between replays of %s count %zu (replay %ld): element %zu is %g, not %d",
             eager_n, c->name, n, replay, i, host[i], want);
      return 0;
    }
  }
  return 1;
}

static int g_votes[NRANKS];

/* Whether every rank says ok (all ranks call it at the same point): the ranks stop together,
 * so no rank's kernel is left waiting for a peer that stopped. */
static int agree(rank_t *r, int ok) {
  g_votes[r->rank] = ok;
  pthread_barrier_wait(&g_barrier);
  int all = 1;
  for (int q = 0; q < NRANKS; q++) all &= g_votes[q];
  pthread_barrier_wait(&g_barrier);
  return all;
}

/* An eager allreduce of n floats between replays, on the same stream: its kernel advances the
 * same device epoch as the replays. */
static void eager_call(rank_t *r, flexcoll_comm_t comm, const replay_bufs_t *b, cudaStream_t s, size_t n) {
  cudaMemsetAsync(b->eager_out, POISON, n * sizeof(float), s);
  flexcoll_result_t res = flexcoll_allreduce(b->eager_in, b->eager_out, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "eager allreduce of %zu between replays: %s", n, flexcoll_get_last_error(comm));
}

/* Capture one call of c with n elements, replay it `replays` times on fresh inputs (copied in
 * outside the graph; the result poisoned first where it is checked), an eager call after every
 * tenth, checking every 97th replay and the last.  False when the ranks stopped on a failure. */
static int replay_case(rank_t *r, flexcoll_comm_t comm, const replay_bufs_t *b, cudaStream_t s, const coll_t *c,
                       size_t n, long replays) {
  prepare_inputs(r, c, n, b, s);
  cudaGraphExec_t exec = capture(r, comm, c, n, b, s);
  if (!agree(r, exec != NULL)) {
    if (exec) cudaGraphExecDestroy(exec);
    return 0;
  }
  const size_t es = dt_size(c->dt), sbytes = send_elems(c, n) * es, rbytes = recv_elems(c, n) * es;
  size_t eager_n = 0;
  int ok = 1;
  for (long i = 0; i < replays && ok; i++) {
    const int v = (int)((3 * i + 1) % VARIANTS), check = i % 97 == 0 || i == replays - 1;
    /* In place the input goes where the result lands (and is the poison's place too). */
    cudaMemcpyAsync(c->inplace ? b->recv : b->send, b->table + (size_t)v * ROW, sbytes, cudaMemcpyDeviceToDevice, s);
    if (check && !c->inplace) cudaMemsetAsync(b->recv, POISON, rbytes, s);
    cudaError_t ce = cudaGraphLaunch(exec, s);
    EXPECT(r, ce == cudaSuccess, "%s count %zu replay %ld: cudaGraphLaunch: %s", c->name, n, i, cudaGetErrorString(ce));
    if (i % 10 == 3) eager_call(r, comm, b, s, eager_n = (i / 10) % 2 ? 5 : EAGER_MAX);
    if (check) ok = agree(r, ce == cudaSuccess && check_replay(r, comm, c, n, b, s, v, i, eager_n));
  }
  cudaStreamSynchronize(s);
  /* The last rank destroys its graph late: its peer has moved on to its next call by then, and
   * that call must not hold the destruction back (replay_all's last case: allreduce_checked). */
  if (r->rank == NRANKS - 1) usleep(LATE_RANK_US);
  cudaGraphExecDestroy(exec);
  return ok;
}

/* Every collective at every size, captured and replayed; the first case the longest. */
static void replay_all(rank_t *r, flexcoll_comm_t comm, const replay_bufs_t *b, cudaStream_t s) {
  int cases = 0;
  long replays = 0;
  for (size_t k = 0; k < NCOLLS; k++)
    for (size_t j = 0; j < NCOUNTS; j++) {
      const kind_t kind = colls[k].kind;
      /* Without peer access these go through host copies: refused (refused_calls). */
      if (g_no_peer && (kind == K_ALLTOALL || kind == K_SENDRECV || kind == K_GATHER)) continue;
      long n = k == 0 && j == 2 ? LONG_REPLAYS : counts[j] == MAX_COUNT ? BIG_REPLAYS : REPLAYS;
      if (g_no_peer) n /= NO_PEER_REPLAY_DIV;
      if (!replay_case(r, comm, b, s, &colls[k], counts[j], n)) return;
      cases++;
      replays += n;
    }
  if (r->rank == 0)
    fprintf(stderr, "[test_capture] %d captured calls replayed %ld times in all%s\n", cases, replays,
            g_no_peer ? " (no peer access: the ring kernels through host memory)" : "");
}

/* Device, host and window buffers of both parts; false (reported) when some allocation failed. */
static int alloc_all(rank_t *r, flexcoll_comm_t comm, bufs_t *b, replay_bufs_t *rb, cudaStream_t s) {
  memset(b, 0, sizeof *b);
  memset(rb, 0, sizeof *rb);
  int ok = cudaMalloc((void **)&b->dev, 2 * COUNT * sizeof(float)) == cudaSuccess &&
           cudaMalloc((void **)&rb->table, VARIANTS * ROW) == cudaSuccess &&
           cudaMalloc((void **)&rb->send, ROW) == cudaSuccess && cudaMalloc((void **)&rb->recv, ROW) == cudaSuccess &&
           cudaMalloc((void **)&rb->eager_in, EAGER_MAX * sizeof(float)) == cudaSuccess &&
           cudaMalloc((void **)&rb->eager_out, EAGER_MAX * sizeof(float)) == cudaSuccess;
  b->host = calloc(2 * COUNT, sizeof(float));
  if (g_pageable) {
    b->pinned = malloc(COUNT * sizeof(float));
    rb->host = malloc(ROW);
    rb->eager_host = malloc(EAGER_MAX * sizeof(float));
    ok = ok && b->host && b->pinned && rb->host && rb->eager_host;
  } else {
    ok = ok && b->host && cudaMallocHost((void **)&b->pinned, COUNT * sizeof(float)) == cudaSuccess &&
         cudaMallocHost((void **)&rb->host, ROW) == cudaSuccess &&
         cudaMallocHost((void **)&rb->eager_host, EAGER_MAX * sizeof(float)) == cudaSuccess;
  }
  EXPECT(r, ok, "allocating the buffers failed");
  if (!ok) return 0;
  for (size_t i = 0; i < EAGER_MAX; i++) ((float *)rb->host)[i] = (float)value(r->rank, 0, i);
  cudaMemcpyAsync(rb->eager_in, rb->host, EAGER_MAX * sizeof(float), cudaMemcpyHostToDevice, s);
  cudaStreamSynchronize(s);
  /* The replays' buffers in windows (collective, the same order on every rank): eager, their
   * calls from 1 MB would take direct mode, which keeps counters on the host; captured they must
   * take the kernels instead, and replay right. */
  for (int w = 0; w < 2; w++)
    if (flexcoll_window_register(comm, w ? rb->recv : rb->send, ROW, &rb->win[w]) != FLEXCOLL_SUCCESS) {
      EXPECT(r, 0, "flexcoll_window_register of the replays' %s buffer: %s", w ? "recv" : "send",
             flexcoll_get_last_error(comm));
      return 0;
    }
  return 1;
}

static void free_all(flexcoll_comm_t comm, bufs_t *b, replay_bufs_t *rb) {
  for (int w = 0; w < 2; w++)
    if (rb->win[w]) flexcoll_window_deregister(comm, rb->win[w]);
  cudaFree(b->dev);
  cudaFree(rb->table), cudaFree(rb->send), cudaFree(rb->recv), cudaFree(rb->eager_in), cudaFree(rb->eager_out);
  free(b->host);
  if (g_pageable) free(b->pinned), free(rb->host), free(rb->eager_host);
  else cudaFreeHost(b->pinned), cudaFreeHost(rb->host), cudaFreeHost(rb->eager_host);
}

static void *rank_main(void *arg) {
  rank_t *r = arg;
  cudaSetDevice(0);
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = 0;
  config.timeout_ms = 20000; /* a lost peer fails the test, not hangs it */
  flexcoll_comm_t comm = NULL;
  flexcoll_result_t res = flexcoll_comm_init_rank(&comm, NRANKS, r->id, r->rank, &config);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "comm_init_rank: %s", flexcoll_get_last_error(NULL));
  if (!agree(r, res == FLEXCOLL_SUCCESS)) {
    if (comm) flexcoll_comm_destroy(comm);
    return NULL;
  }
  cudaStream_t s, s2;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  bufs_t b;
  replay_bufs_t rb;
  if (agree(r, alloc_all(r, comm, &b, &rb, s))) {
    allreduce_checked(r, comm, b.dev, b.pinned, s, 1);
    refused_calls(r, comm, &b, s, cudaStreamCaptureModeThreadLocal);
    allreduce_checked(r, comm, b.dev, b.pinned, s, 2);
    refused_calls(r, comm, &b, s, cudaStreamCaptureModeRelaxed);
    allreduce_checked(r, comm, b.dev, b.pinned, s, 3);
    capture_after_other_stream(r, comm, b.dev, s, s2);
    allreduce_checked(r, comm, b.dev, b.pinned, s, 4); /* back on s: captures there are allowed again */
    replay_all(r, comm, &rb, s);
    allreduce_checked(r, comm, b.dev, b.pinned, s, 5);
    agree(r, 1); /* no capture runs in the other thread from here on */
    /* A NULL (legacy default) stream is never captured and stays accepted.  Rank 0's only: the
     * legacy stream is one for every thread of the process, so both ranks' kernels there would
     * run one after the other, the first waiting for the second until it timed out. */
    allreduce_checked(r, comm, b.dev, b.pinned, r->rank == 0 ? NULL : s, 6);
  }
  /* Nothing timed out on the way, not even where no result was checked. */
  flexcoll_result_t async = FLEXCOLL_SUCCESS;
  EXPECT(r, flexcoll_comm_get_async_error(comm, &async) == FLEXCOLL_SUCCESS && async == FLEXCOLL_SUCCESS,
         "the communicator failed on the way: async error %d (%s)", (int)async, flexcoll_get_last_error(comm));
  cudaStreamSynchronize(s);
  free_all(comm, &b, &rb);
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
  res = flexcoll_comm_destroy(comm);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "comm_destroy: %d", (int)res);
  return NULL;
}

int main(void) {
  int ngpus = 0;
  cudaError_t ce = cudaGetDeviceCount(&ngpus);
  if (ce != cudaSuccess || ngpus == 0) {
    fprintf(stderr, "[test_capture] no GPU (%s): skipped\n",
            ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device");
    return 77;
  }
  fc_test_gpu_serialize("[test_capture]");
  /* Warnings on unless asked otherwise: a kernel's timeout prints the pcie lane's counters, which
   * is what an unexplained stall of the pass without peer access needs (docs/ARCHITECTURE.md,
   * known problems). */
  setenv("FLEXCOLL_DEBUG", "WARN", 0);
  flexcoll_unique_id_t id;
  if (flexcoll_get_unique_id(&id) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "[test_capture] get_unique_id: %s\n", flexcoll_get_last_error(NULL));
    return 1;
  }
  /* Without the ring kernels (FLEXCOLL_RING_KERNEL=0) nothing runs without peer access but
   * host copies: the second pass is for them. */
  g_schedules = getenv("FLEXCOLL_RING_KERNEL") && atoi(getenv("FLEXCOLL_RING_KERNEL")) == 0;
  g_pageable = getenv("FC_CAPTURE_PAGEABLE") && atoi(getenv("FC_CAPTURE_PAGEABLE")) != 0;
  const char *links = getenv("FLEXCOLL_LINKS");
  const int passes = links || g_schedules ? 1 : 2;
  pthread_barrier_init(&g_barrier, NULL, NRANKS);
  int failures = 0;
  for (int pass = 0; pass < passes; pass++) {
    /* The library reads FLEXCOLL_LINKS at each communicator's creation; no thread runs now. */
    if (pass == 1) setenv("FLEXCOLL_LINKS", "pcie,shm,tcp", 1);
    links = getenv("FLEXCOLL_LINKS");
    g_no_peer = links && !strstr(links, "nvlink");
    if (pass == 1 && flexcoll_get_unique_id(&id) != FLEXCOLL_SUCCESS) {
      fprintf(stderr, "[test_capture] get_unique_id: %s\n", flexcoll_get_last_error(NULL));
      return 1;
    }
    rank_t ranks[NRANKS] = {0};
    failures += fc_test_run_ranks(ranks, sizeof ranks[0], NRANKS, id, rank_main);
  }
  fprintf(stderr, "[test_capture] %s (%d ranks on device 0)\n", failures ? "FAILED" : "passed", NRANKS);
  return failures ? 1 : 0;
}
