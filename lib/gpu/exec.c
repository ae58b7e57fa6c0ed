/* exec.c — device-memory collectives, stream-ordered.
 *
 * Small allreduce, allgather, reduce_scatter and broadcast (up to the one-shot limit on the
 * largest buffer): one one-shot kernel per rank (lib/kernels/oneshot.cu).  Larger ones in
 * symmetric windows: direct mode (direct.c); outside windows between 2 ranks on two GPUs: one
 * pipelined kernel per rank (lib/kernels/pipeline.cu), through the same staging area; else,
 * and every reduce, for any rank count: one ring kernel per rank (lib/kernels/ring.cu).
 * Alltoall of up to 8 ranks: one alltoall kernel per rank (lib/kernels/alltoall.cu).  All of
 * these keep their sequence state on the device and run one after another per communicator
 * (kernel_order_before/after).
 * Send/recv batches, and alltoalls the alltoall kernel does not take: one point-to-point kernel
 * per rank (lib/kernels/p2p.cu).  What none of them takes (FLEXCOLL_ALGO forcing an algorithm,
 * FLEXCOLL_RING_KERNEL=0) runs the algorithm's schedule (lib/algos) on the caller's stream,
 * round by round, each round's transfers one point-to-point kernel (run_schedule).  So every
 * wait on a peer is inside a kernel that bounds it, with its counters on the device: no host
 * round trip, no stream waiting on a peer in a hardware queue, and every path with peer access
 * but direct mode (direct.c) replays from a CUDA graph; a captured call skips direct mode. */
#define _GNU_SOURCE
#include "config.h"

#if HAVE_CUDA
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "device.h"
#include "dtype.h"
#include "error.h"
#include "host/host.h"
#include "kernels/ring_plan.h"
#include "sched/sched.h"

typedef struct {
  struct flexcoll_comm *comm;
  struct fc_gpu *g;
  char *bufs[3]; /* FC_BUF_SEND, FC_BUF_RECV, FC_BUF_SCRATCH of a collective's schedule */
  size_t esize;
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  int capturing; /* the stream is being captured into a CUDA graph */
} fc_dexec_t;

/* Device schedules are collectives' only (a point-to-point batch is one kernel), so their steps
 * name no FC_BUF_EXT buffer. */
static char *dref(fc_dexec_t *x, int buf, size_t off) { return x->bufs[buf] + off * x->esize; }

/* The arguments of the next one-shot or pipelined kernel: constants of the communicator only
 * (the graph rule: the kernel takes its seq and counter base from g->epoch on the device). */
static fc_oneshot_args_t kernel_args(struct fc_gpu *g, const fc_algo_args_t *args) {
  fc_oneshot_args_t a = {.rank = args->rank, .nranks = args->nranks, .epoch = g->epoch,
                         .slot_bytes = g->oneshot_slot, .timeout_ns = g->timeout_ns, .error = g->error_dev};
  g->oneshot_seq++;
  a.ll_max = g->ll_max;
  a.max_blocks = g->oneshot_blocks;
  a.pipe_blocks = g->pipe_blocks;
  a.pipe_threads = g->pipe_threads;
  a.pipe_subslots = g->pipe_subslots;
  a.pipe_push_threads = g->pipe_push_threads;
  for (int p = 0; p < args->nranks; p++) {
    a.stage[p] = g->peers[p].stage + g->oneshot_off;
    a.flags[p] = (uint64_t *)(g->peers[p].stage + g->oneshot_flags_off);
    a.ll[p] = g->peers[p].stage + g->ll_off;
  }
  return a;
}

/* One-shot and pipelined kernels of a communicator must run one after another (the staging
 * parity and the device epoch rely on it), also when the caller alternates streams: the next
 * one waits for the last one (before launch), and records itself (after).  A captured kernel
 * follows its predecessor on the same stream (fc_gpu_graph_refusal), so it waits for nothing;
 * it records nothing either, since an event recorded inside a capture cannot be waited on
 * outside it: the application orders the graph's launches with the communicator's other calls
 * (the streams it launches them on), as it orders any stream work. */
static flexcoll_result_t kernel_order_before(fc_dexec_t *x, cudaStream_t stream) {
  struct fc_gpu *g = x->g;
  /* Captured: the previous kernel, if on another stream, had finished (graph_refusal asked). */
  if (g->oneshot_seq > 1 && g->oneshot_stream != stream && !x->capturing)
    CUDA_TRY(x->comm, cudaStreamWaitEvent(stream, g->ev_oneshot, 0));
  return FLEXCOLL_SUCCESS;
}

/* Whether the communicator's last eager kernel has finished.  Asked in relaxed capture mode: a
 * thread that captures (or any thread, while another captures in global mode) may not query
 * events otherwise. */
static int last_kernel_done(const struct fc_gpu *g) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const cudaError_t e = cudaEventQuery(g->ev_oneshot);
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaGetLastError();
  return e == cudaSuccess;
}

/* A capture on another stream than the communicator's previous kernel: allowed once that kernel
 * has finished (frameworks warm up on one stream, synchronise, then capture on another), since
 * the graph then needs no dependency from outside its capture; its replays, like any stream
 * work, must be ordered by the application with the communicator's other calls. */
static const char *other_stream_refusal(const struct fc_gpu *g, flexcoll_stream_t stream) {
  if (!g->oneshot_seq || g->oneshot_stream == (cudaStream_t)stream || last_kernel_done(g)) return NULL;
  return "the communicator's previous kernel, on another stream, has not finished, and the graph cannot wait for "
         "work outside its capture (synchronize that stream first, or capture on it)";
}
static flexcoll_result_t kernel_order_after(fc_dexec_t *x, cudaStream_t stream) {
  if (!x->capturing) CUDA_TRY(x->comm, cudaEventRecord(x->g->ev_oneshot, stream));
  x->g->oneshot_stream = stream;
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t run_oneshot(fc_dexec_t *x, const fc_algo_args_t *args, const void *send, void *recv,
                                     cudaStream_t stream) {
  fc_oneshot_args_t a = kernel_args(x->g, args);
  FC_CHECK(kernel_order_before(x, stream));
  switch (args->coll) {
    case FC_COLL_ALLREDUCE:
      CUDA_TRY(x->comm, fc_kernel_oneshot_allreduce(&a, send, recv, args->count, x->dtype, x->op, stream));
      break;
    case FC_COLL_ALLGATHER:
      CUDA_TRY(x->comm, fc_kernel_oneshot_allgather(&a, send, recv, args->count * x->esize, stream));
      break;
    case FC_COLL_REDUCE_SCATTER:
      CUDA_TRY(x->comm, fc_kernel_oneshot_reduce_scatter(&a, send, recv, args->count, x->dtype, x->op, stream));
      break;
    default:
      CUDA_TRY(x->comm, fc_kernel_oneshot_broadcast(&a, send, recv, args->count * x->esize, args->root, stream));
      break;
  }
  return kernel_order_after(x, stream);
}

/* Whether the pipelined kernels take this call (2 ranks, above the one-shot limit, buffers
 * that direct mode did not take). */
static int pipelined(const struct fc_gpu *g, const fc_algo_args_t *args) {
  return g->pipeline && args->nranks == 2 && !g->pcie.only &&
         (args->coll == FC_COLL_ALLREDUCE || args->coll == FC_COLL_ALLGATHER ||
          args->coll == FC_COLL_REDUCE_SCATTER || args->coll == FC_COLL_BROADCAST);
}

static flexcoll_result_t run_pipelined(fc_dexec_t *x, const fc_algo_args_t *args, const void *send, void *recv,
                                       cudaStream_t stream) {
  struct fc_gpu *g = x->g;
  const fc_pipe_coll_t coll = args->coll == FC_COLL_ALLREDUCE        ? FC_PIPE_ALLREDUCE
                              : args->coll == FC_COLL_ALLGATHER      ? FC_PIPE_ALLGATHER
                              : args->coll == FC_COLL_REDUCE_SCATTER ? FC_PIPE_REDUCE_SCATTER
                                                                     : FC_PIPE_BROADCAST;
  /* count: the whole buffer (allreduce, broadcast), one rank's block (allgather, reduce_scatter). */
  const size_t bytes = args->count * x->esize;
  fc_oneshot_args_t a = kernel_args(g, args);
  FC_CHECK(kernel_order_before(x, stream));
  CUDA_TRY(x->comm, fc_kernel_pipe_collective(&a, coll, send, recv, bytes, x->dtype, x->op, args->root, stream));
  return kernel_order_after(x, stream);
}

/* Whether a ring kernel takes this call: the collectives it knows, on a communicator that
 * uses them (FLEXCOLL_RING_KERNEL), when neither the one-shot, direct nor pipelined path did,
 * and no algorithm is forced (FLEXCOLL_ALGO: that algorithm's schedule runs it, run_schedule). */
static int ring_takes(const struct fc_gpu *g, const fc_algo_args_t *args) {
  return g->ring && args->nranks >= 2 && fc_tuner_kernels() &&
         (args->coll == FC_COLL_ALLREDUCE || args->coll == FC_COLL_ALLGATHER || args->coll == FC_COLL_REDUCE_SCATTER ||
          args->coll == FC_COLL_BROADCAST || args->coll == FC_COLL_REDUCE);
}

void fc_gpu_ring_args(const struct flexcoll_comm *comm, const struct fc_gpu *g, fc_ring_args_t *a) {
  const int n = comm->nranks;
  /* Without peer access the neighbours' staging is not mapped (NULL): no NVLink lane (in a ring
   * by hops, none on an edge between hosts). */
  char *const next_stage = g->peers[g->ring_next].stage, *const prev_stage = g->peers[g->ring_prev].stage;
  *a = (fc_ring_args_t){.rank = g->ring_pos, .nranks = n, .epoch = g->epoch, .area = g->stage + g->ring_off,
                        .area_next = next_stage ? next_stage + g->ring_off : NULL,
                        .ctr = (uint64_t *)(g->stage + g->ring_ctr_off),
                        .ctr_next = next_stage ? (uint64_t *)(next_stage + g->ring_ctr_off) : NULL,
                        .ctr_prev = prev_stage ? (uint64_t *)(prev_stage + g->ring_ctr_off) : NULL,
                        .area_bytes = g->ring_bytes, .blocks = g->ring_blocks, .subslots = g->ring_subslots,
                        .timeout_ns = g->timeout_ns, .error = g->error_dev, .ring_rank = g->ring_rank_dev,
                        .hops = g->pcie.hops, .hop_in = g->pcie.hop_in, .hop_out = g->pcie.hop_out};
  for (int k = 0; k < g->pcie.nside; k++) {
    const fc_side_lane_t *s = &g->pcie.side[k];
    if (!s->on) continue;
    /* Through a proxy the kernel reads our inbox and writes our outbox (device memory); the
     * proxies move the bytes (through the host areas, or over the link). */
    fc_ring_side_t *sd = &a->side[k];
    sd->area = s->ce ? s->boxes + s->area_bytes : s->own + s->ctr_bytes;
    sd->area_next = s->ce ? s->boxes : s->next + s->ctr_bytes;
    sd->ce = s->ce;
    sd->desc = s->ce ? (fc_pcie_desc_t *)(s->own + FC_PCIE_DESC_OFF) : NULL;
    sd->sent = s->ce ? (uint64_t *)(s->own + FC_PCIE_SENT_OFF) : NULL;
    sd->pub = s->ce ? s->pub : NULL;
    sd->ready = s->ce ? s->ready : NULL;
    sd->ctr = (uint64_t *)s->own;
    sd->ctr_next = (uint64_t *)s->next;
    sd->ctr_prev = (uint64_t *)s->prev;
    sd->area_bytes = s->area_bytes;
    sd->blocks = s->blocks;
    /* A ring by hops: a block's sub-slots lie at the same offsets in both edges' areas, and the
     * grid is the link lane's (few blocks, large messages: each costs the link a message, and a
     * ring runs at its slowest edge's speed, so more blocks on the NVLink edges gain nothing). */
    if (a->hops && s->area_bytes < a->area_bytes) a->area_bytes = s->area_bytes;
    if (a->hops && s->blocks < a->blocks) a->blocks = s->blocks;
  }
}

/* The links' statistics of a ring call: what this rank pushes to the next rank on each lane. */
static void count_ring_bytes(struct fc_gpu *g, fc_ring_coll_t coll, const fc_algo_args_t *args, size_t bytes,
                             const fc_ring_args_t *a, int root) {
  const size_t chunk = fc_ring_chunk_bytes(coll, bytes, args->nranks);
  const unsigned long long pushes = (unsigned long long)fc_ring_pushes(coll, a->rank, args->nranks, root);
  /* Allreduce's last chunk may be short: its lanes are cut at the same offsets, so the side lanes
   * (the chunk's first bytes) lose least; counted as full chunks (statistics only).  In a ring by
   * hops every byte we push goes on the lane of our edge to the next rank. */
  size_t start[FC_RING_LANES] = {0}, end[FC_RING_LANES] = {0};
  if (a->hops) end[a->hop_out] = chunk;
  else fc_ring_lane_cut(a, chunk, start, end);
  for (int L = 0; L < FC_RING_LANES; L++) g->pcie.sent[L] += pushes * (end[L] - start[L]);
  /* Where large calls are timed, the shares come from their records (pcie.c, take_records). */
  if (g->pcie.stage2_bytes) return;
  for (int L = 0; L < FC_RING_LANES; L++) g->pcie.share[L] = chunk ? (double)(end[L] - start[L]) / (double)chunk : 0;
}

static flexcoll_result_t run_ring(fc_dexec_t *x, const fc_algo_args_t *args, const void *send, void *recv,
                                  cudaStream_t stream) {
  struct fc_gpu *g = x->g;
  const fc_ring_coll_t coll = args->coll == FC_COLL_ALLREDUCE        ? FC_RING_ALLREDUCE
                              : args->coll == FC_COLL_ALLGATHER      ? FC_RING_ALLGATHER
                              : args->coll == FC_COLL_REDUCE_SCATTER ? FC_RING_REDUCE_SCATTER
                              : args->coll == FC_COLL_BROADCAST      ? FC_RING_BROADCAST
                                                                     : FC_RING_REDUCE;
  fc_ring_args_t a;
  fc_gpu_ring_args(x->comm, g, &a);
  const size_t bytes = args->count * x->esize;
  const size_t chunk = fc_ring_chunk_bytes(coll, bytes, args->nranks);
  /* The place of the root, the ring's start: the kernel counts places in the ring, which visits
   * hosts in turn. */
  const int root = fc_gpu_ring_place(x->comm, args->root);
  /* The split is a function of the size, the most chunk messages a rank pushes (a chain's last
   * rank pushes none) and the shared models (which stage 2 changes on every rank at the same
   * large call, fc_pcie_after_ring): the same on every rank. */
  const int most_pushes = fc_ring_pushes(coll, root, args->nranks, root);
  size_t side[FC_RING_SIDE_LANES];
  fc_pcie_split(g, chunk, most_pushes > 0 ? (unsigned)most_pushes : 1, side);
  for (int k = 0; k < FC_RING_SIDE_LANES; k++) {
    a.side[k].chunk_bytes = side[k];
    if (side[k])
      FC_TRACE(FC_SUB_SCHED, "%s of %zu bytes: %s carries %zu bytes of each ring chunk", fc_coll_name(args->coll),
               bytes, g->pcie.side[k].name, side[k]);
  }
  const int large = fc_pcie_before_ring(g, bytes, chunk, fc_ring_pushes(coll, a.rank, args->nranks, root),
                                        x->capturing, &a);
  g->oneshot_seq++; /* a kernel of the communicator's chain (kernel_order_before) */
  FC_CHECK(kernel_order_before(x, stream));
  /* A proxy that has dozed off is woken now, as the kernel it will serve is enqueued. */
  for (int k = 0; k < FC_RING_SIDE_LANES; k++)
    if ((a.side[k].chunk_bytes || a.hops) && a.side[k].ce) fc_pcie_ce_kick(&g->pcie.side[k]);
  const int e = fc_kernel_ring_collective(&a, coll, send, recv, bytes, x->dtype, x->op, root, stream);
  if (e) {
    if (a.clk) g->pcie.issued--; /* no record will come for it */
    return fc_error(x->comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "fc_kernel_ring_collective failed: %s",
                    cudaGetErrorString((cudaError_t)e));
  }
  count_ring_bytes(g, coll, args, bytes, &a, root);
  FC_CHECK(kernel_order_after(x, stream));
  return fc_pcie_after_ring(x->comm, g, large);
}

/* Whether the alltoall kernel takes this call: as ring_takes (FLEXCOLL_RING_KERNEL switches both
 * kinds), up to the one-shot kernels' rank count, with one-shot slots big enough to stage its
 * steps (FLEXCOLL_ONESHOT_MAX_BYTES). */
static int alltoall_kernel(const struct fc_gpu *g, const fc_algo_args_t *args) {
  return g->ring && args->coll == FC_COLL_ALLTOALL && args->nranks >= 2 && args->nranks <= FC_ONESHOT_MAX_RANKS &&
         fc_tuner_kernels() && g->oneshot_slot >= FC_ALLTOALL_MIN_ROOM;
}

/* Whether the point-to-point kernel runs the batches: the same on every rank (communicator
 * constants only), so that both ends of a pair use it; so it must take every batch. */
static int p2p_kernel(const struct fc_gpu *g) { return g->p2p_region != 0; }

/* An alltoall the alltoall kernel does not take (more ranks than it knows, or no one-shot
 * slots) runs as one batch of the point-to-point kernel, a send and a receive per peer: one
 * kernel per rank and call, its counters on the device, rather than a schedule's kernel per round. */
static int alltoall_by_p2p(const struct fc_gpu *g, const fc_algo_args_t *args) {
  return args->coll == FC_COLL_ALLTOALL && args->nranks >= 2 && 2 * (args->nranks - 1) <= FC_P2P_MAX_OPS &&
         p2p_kernel(g) && !alltoall_kernel(g, args);
}

static flexcoll_result_t run_alltoall(fc_dexec_t *x, const fc_algo_args_t *args, const void *send, void *recv,
                                      cudaStream_t stream) {
  fc_oneshot_args_t a = kernel_args(x->g, args);
  FC_CHECK(kernel_order_before(x, stream));
  CUDA_TRY(x->comm, fc_kernel_alltoall(&a, send, recv, args->count * x->esize, stream));
  return kernel_order_after(x, stream);
}

/* Elements of a collective that one rank writes into a peer's one-shot slot, which
 * FLEXCOLL_ONESHOT_MAX_BYTES bounds: the larger buffer, except for reduce_scatter, whose
 * kernel sends each peer only that peer's chunk (so it stays one-shot up to n times further). */
static size_t oneshot_bytes(const fc_algo_args_t *args, size_t largest) {
  return args->coll == FC_COLL_REDUCE_SCATTER ? args->count : largest;
}

/* Elements of the collective's larger buffer. */
static size_t largest_count(const fc_algo_args_t *args) {
  const size_t recv = fc_coll_recv_count(args->coll, args->count, args->nranks);
  const size_t send = fc_coll_send_count(args->coll, args->count, args->nranks);
  return send > recv ? send : recv;
}

/* Without peer access (or with FLEXCOLL_LINKS leaving nvlink out), what the ring kernels can run
 * goes through them, on the pcie lane alone, whatever its size: the one-shot, pipelined and
 * direct paths need the peers' device memory. */
static int ring_only(const struct fc_gpu *g, const fc_algo_args_t *args) {
  return g->pcie.only && args->coll != FC_COLL_ALLTOALL;
}

/* Whether a call on a communicator without peer access runs through host copies: all that moves
 * data between ranks but what the ring kernels take on the pcie lane. */
static int through_host(const struct fc_gpu *g, const fc_algo_args_t *args) {
  return !g->p2p && args->nranks > 1 && args->count && !(ring_only(g, args) && ring_takes(g, args));
}

/* Whether the one-shot kernels take the collective (sizes only: a graph's replays take the
 * path of its capture). */
static int takes_oneshot(const struct fc_gpu *g, const fc_algo_args_t *args, size_t esize) {
  return args->coll != FC_COLL_REDUCE && args->coll != FC_COLL_ALLTOALL && !ring_only(g, args) &&
         oneshot_bytes(args, largest_count(args)) * esize <= g->oneshot_slot && args->nranks <= FC_ONESHOT_MAX_RANKS;
}

/* Captured, a call must take a kernel that keeps its sequence state on the device (the host
 * copies block on the host), and follow the communicator's previous such kernel on the same
 * stream (kernel_order_before would otherwise wait on an event outside the capture).  Direct
 * mode bakes host counters into stream-memory operations, so a captured call in a window takes
 * the kernels instead (run_coll): windows are a speed-up, never a requirement.  Decided as
 * fc_gpu_run decides.  An in-place alltoall is decided as out of place: it runs from a
 * stream-ordered copy (alltoall_through_copy), whose allocation, copy and free capture as graph
 * nodes, and the path an alltoall takes does not depend on its sendbuf. */
const char *fc_gpu_graph_refusal(struct flexcoll_comm *comm, const fc_algo_args_t *args, flexcoll_stream_t stream) {
  const struct fc_gpu *g = comm->gpu;
  if (through_host(g, args))
    return g->pcie.side[0].on ? "the GPUs have no peer access and the ring kernels do not run this call, so it runs through host copies"
                      : "the GPUs have no peer access, so the call runs through host copies";
  if (args->count == 0 || args->nranks == 1) return NULL;
  return other_stream_refusal(g, stream);
}

/* A copy between a device buffer and host memory on the caller's stream, waited for.  Not
 * cudaMemcpy: it runs on the legacy default stream, which the caller's non-blocking stream does
 * not wait for (the caller's next work could read a result before it lands; from pageable
 * memory cudaMemcpy may return before the bytes reach the device), and which itself waits for
 * every blocking stream's work on the device, other communicators' kernels included. */
static cudaError_t stream_copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}

/* Host memory of at least `bytes` in slot k of the communicator's host copies, kept between
 * calls at the largest size asked (until the communicator is destroyed): a fresh allocation per
 * call would fault every page of it in again at each call.
 * Pageable, not pinned: pinning (cudaHostAlloc, cudaHostRegister) and freeing pinned memory may
 * wait for the whole device, where other communicators' kernels may wait for this rank. */
static char *host_copy(struct fc_gpu *g, int k, size_t bytes) {
  if (g->host_copy_bytes[k] >= bytes + 1) return g->host_copy[k];
  free(g->host_copy[k]); /* not realloc: the old bytes are not needed */
  g->host_copy[k] = malloc(bytes + 1);
  g->host_copy_bytes[k] = g->host_copy[k] ? bytes + 1 : 0;
  return g->host_copy[k];
}

/* Peers without peer access: run the host algorithm on copies (correct, not fast, blocking). */
static flexcoll_result_t run_through_host(fc_dexec_t *x, const fc_algo_args_t *args, const void *send, void *recv,
                                          cudaStream_t stream) {
  struct flexcoll_comm *comm = x->comm;
  size_t sbytes = fc_coll_send_count(args->coll, args->count, args->nranks) * x->esize;
  size_t rbytes = fc_coll_recv_count(args->coll, args->count, args->nranks) * x->esize;
  /* Send inside recv (in place): staged at its place in the host copy of recv, whose other
   * bytes are outputs only.  Recv inside send (in-place reduce_scatter) needs nothing: the
   * result is copied back.  An in-place alltoall reads its input from hs, a copy apart. */
  const fc_coll_io_t io = fc_coll_io(args, send, recv, x->esize);
  char *hr = host_copy(x->g, 1, rbytes), *hs = io.send_in_recv ? hr : host_copy(x->g, 0, sbytes);
  if (!hs || !hr) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory for host copies of %zu and %zu bytes",
                                  sbytes, rbytes);
  char *hsend = hs + io.send_off;
  if (cudaStreamSynchronize(stream) != cudaSuccess ||
      (io.send_read && stream_copy(hsend, send, sbytes, cudaMemcpyDeviceToHost, stream) != cudaSuccess))
    return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "staging device buffers in host memory: %s",
                    cudaGetErrorString(cudaGetLastError()));
  FC_CHECK(fc_host_run(comm, args, send ? hsend : NULL, recv ? hr : NULL, x->dtype, x->op));
  if (io.recv_written && stream_copy(recv, hr, rbytes, cudaMemcpyHostToDevice, stream) != cudaSuccess)
    return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "copying a result to the device: %s",
                    cudaGetErrorString(cudaGetLastError()));
  return FLEXCOLL_SUCCESS;
}

/* Whether every transfer of a batch may hand its device buffer to the host links: each peer is
 * another rank that some link toward it takes device memory over (rdma: registered with the NIC,
 * GPUDirect RDMA; shm and tcp through UCX's CUDA transports; lib/transports), and the pair's
 * transfers keep to such links (fc_links_split).  A send to this
 * rank itself stays with host copies. */
static int links_take_device(struct flexcoll_comm *comm, const fc_p2p_op_t *ops, int nops) {
  for (int i = 0; i < nops; i++)
    if (ops[i].count && (ops[i].peer == comm->rank || !fc_links_device_memory(comm->links, comm->rank, ops[i].peer)))
      return 0;
  return 1;
}

/* Whether a call without peer access may hand its device buffers to the host links as
 * they are: some link toward every peer takes device memory (as links_take_device for a
 * batch); the schedule's reductions then run on the device (fc_host_run_device).  Every rank
 * decides alike: the links are the same on every rank. */
static int every_peer_takes_device(struct flexcoll_comm *comm) {
  for (int p = 0; p < comm->nranks; p++)
    if (p != comm->rank && !fc_links_device_memory(comm->links, comm->rank, p)) return 0;
  return 1;
}

/* Peers without peer access: send and receive through host copies (blocking), or straight from
 * and into the device buffers where the links take them. */
static flexcoll_result_t p2p_through_host(fc_dexec_t *x, const fc_p2p_op_t *ops, int nops, void *const *bufs,
                                          cudaStream_t stream) {
  struct flexcoll_comm *comm = x->comm;
  if (links_take_device(comm, ops, nops)) {
    /* The buffers hold what the stream wrote before this call once it is drained; what the
     * links write has landed when the batch returns, before anything later on the stream. */
    if (cudaStreamSynchronize(stream) != cudaSuccess)
      return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "stream failed: %s", cudaGetErrorString(cudaGetLastError()));
    return fc_host_run_p2p(comm, ops, nops, bufs);
  }
  /* One block of the communicator's host copies holds every transfer, each at a multiple of 64
   * bytes from its start; the copies of a direction are enqueued together and waited for once. */
  size_t total = 0;
  for (int i = 0; i < nops; i++) total += (ops[i].count + 63) & ~(size_t)63;
  char *block = host_copy(x->g, 0, total);
  void **host = calloc((size_t)nops, sizeof *host);
  if (!block || !host) {
    free(host);
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory for host copies of %zu bytes", total);
  }
  cudaError_t e = cudaStreamSynchronize(stream);
  for (int i = 0; i < nops; i++) {
    host[i] = block;
    block += (ops[i].count + 63) & ~(size_t)63;
    if (e == cudaSuccess && ops[i].is_send && ops[i].count)
      e = cudaMemcpyAsync(host[i], bufs[i], ops[i].count, cudaMemcpyDeviceToHost, stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  flexcoll_result_t res = e != cudaSuccess ? fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR,
                                                      "copying send buffers to the host: %s", cudaGetErrorString(e))
                                           : fc_host_run_p2p(comm, ops, nops, host);
  for (int i = 0; i < nops && res == FLEXCOLL_SUCCESS && e == cudaSuccess; i++)
    if (!ops[i].is_send && ops[i].count) e = cudaMemcpyAsync(bufs[i], host[i], ops[i].count, cudaMemcpyHostToDevice, stream);
  if (res == FLEXCOLL_SUCCESS && e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (res == FLEXCOLL_SUCCESS && e != cudaSuccess)
    res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "copying received buffers to the device: %s",
                   cudaGetErrorString(e));
  cudaGetLastError();
  free(host);
  return res;
}

/* Make the communicator's device current for the enqueue; returns the caller's to restore
 * (fc_gpu_leave_device). */
static int enter_device(struct fc_gpu *g) {
  const int prev = fc_gpu_switch_device(g->device);
  /* The kernel wrappers read launch errors with cudaGetLastError: a stale error left by an
   * earlier call (ours or the application's) must not fail a launch half-way through enqueuing
   * a collective, which would leave the peers waiting. */
  cudaGetLastError();
  return prev;
}

_Static_assert(FC_P2P_KERNEL_OPS >= FC_P2P_MAX_OPS, "the point-to-point kernel takes every batch");

/* One batch of the point-to-point kernel, unordered (the callers order it, kernel_order_*). */
static flexcoll_result_t launch_p2p(fc_dexec_t *x, const fc_p2p_op_t *ops, int nops, void *const *bufs,
                                    cudaStream_t stream) {
  struct fc_gpu *g = x->g;
  struct flexcoll_comm *comm = x->comm;
  fc_p2p_kop_t kops[FC_P2P_KERNEL_OPS];
  for (int i = 0; i < nops; i++)
    kops[i] = (fc_p2p_kop_t){.buf = (char *)bufs[i], .bytes = ops[i].count, .peer = ops[i].peer, .is_send = ops[i].is_send};
  fc_p2p_args_t a = {.rank = comm->rank, .nranks = comm->nranks, .base = g->p2p_base,
                     .done = (unsigned *)(g->p2p_base + 2 * (size_t)comm->nranks), .area = g->stage + g->p2p_off,
                     .ctr = (uint64_t *)(g->stage + g->p2p_ctr_off), .peer_area = g->p2p_peer_area,
                     .peer_ctr = g->p2p_peer_ctr, .region_bytes = g->p2p_region, .blocks = g->p2p_blocks,
                     .subslots = 2, .timeout_ns = g->timeout_ns, .error = g->error_dev};
  g->oneshot_seq++; /* a kernel of the communicator's chain (kernel_order_before) */
  CUDA_TRY(comm, fc_kernel_p2p(&a, kops, nops, stream));
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t run_p2p_kernel(fc_dexec_t *x, const fc_p2p_op_t *ops, int nops, void *const *bufs,
                                        cudaStream_t stream) {
  FC_CHECK(kernel_order_before(x, stream));
  FC_CHECK(launch_p2p(x, ops, nops, bufs, stream));
  return kernel_order_after(x, stream);
}

/* Round r of a schedule: its local copies and reductions, then its transfers as one batch of the
 * point-to-point kernel (a receive that reduces lands at tmp first: the batch only moves bytes),
 * then those receives' reductions.  The steps of a round touch disjoint memory (lib/algos), so
 * this order is one of those the round allows.  All of a round's transfers go in one batch:
 * split, a batch of sends could wait for receives that a peer posts only in the next one. */
static flexcoll_result_t schedule_round(fc_dexec_t *x, const fc_schedule_t *s, int r, char *tmp, cudaStream_t user) {
  struct flexcoll_comm *comm = x->comm;
  const size_t es = x->esize;
  fc_p2p_op_t ops[FC_P2P_MAX_OPS];
  void *bufs[FC_P2P_MAX_OPS];
  int k = 0;
  size_t t = 0;
  for (int i = s->round_start[r]; i < s->round_start[r + 1]; i++) {
    const fc_step_t *st = &s->steps[i];
    char *dst = dref(x, st->buf, st->off);
    if (st->kind == FC_STEP_COPY) {
      const char *src = dref(x, st->src_buf, st->src_off);
      if (dst != src && st->count)
        CUDA_TRY(comm, cudaMemcpyAsync(dst, src, st->count * es, cudaMemcpyDeviceToDevice, user));
      continue;
    }
    if (st->kind == FC_STEP_REDUCE) {
      if (st->count)
        CUDA_TRY(comm, fc_kernel_reduce(dst, dst, dref(x, st->src_buf, st->src_off), st->count, x->dtype, x->op, user));
      continue;
    }
    if (k == FC_P2P_MAX_OPS)
      return fc_error(comm, FLEXCOLL_INTERNAL_ERROR, "a schedule round of %d ranks has more than %d transfers",
                      comm->nranks, FC_P2P_MAX_OPS);
    ops[k] = (fc_p2p_op_t){.is_send = st->kind == FC_STEP_SEND, .peer = st->peer, .count = st->count * es};
    if (st->kind == FC_STEP_RECV_REDUCE) {
      bufs[k++] = tmp + t * es;
      t += st->count;
    } else {
      bufs[k++] = dst;
    }
  }
  if (k) FC_CHECK(launch_p2p(x, ops, k, bufs, user));
  t = 0;
  for (int i = s->round_start[r]; i < s->round_start[r + 1]; i++) {
    const fc_step_t *st = &s->steps[i];
    if (st->kind != FC_STEP_RECV_REDUCE) continue;
    if (st->count)
      CUDA_TRY(comm, fc_kernel_reduce(dref(x, st->buf, st->off), dref(x, st->src_buf, st->src_off), tmp + t * es,
                                      st->count, x->dtype, x->op, user));
    t += st->count;
  }
  return FLEXCOLL_SUCCESS;
}

/* Elements of the largest round's reducing receives: the room their operands need. */
static size_t schedule_tmp_count(const fc_schedule_t *s) {
  size_t most = 0;
  for (int r = 0; r < s->nrounds; r++) {
    size_t t = 0;
    for (int i = s->round_start[r]; i < s->round_start[r + 1]; i++)
      if (s->steps[i].kind == FC_STEP_RECV_REDUCE) t += s->steps[i].count;
    if (t > most) most = t;
  }
  return most;
}

/* An algorithm's schedule (lib/algos) on the caller's stream, round by round (schedule_round),
 * for what no kernel of its own takes: FLEXCOLL_ALGO forcing an algorithm, FLEXCOLL_RING_KERNEL=0.
 * Every wait on a peer is inside a point-to-point kernel, which bounds it and keeps its counters
 * on the device, and everything runs on the one stream: no stream waits on a peer stand in a
 * hardware queue (the hardware-queue rule), and a captured call replays.  The schedule's scratch
 * and the receives' temporary are allocated and freed stream-ordered (graph nodes when captured). */
static flexcoll_result_t run_schedule(fc_dexec_t *x, const fc_schedule_t *s, cudaStream_t user) {
  struct flexcoll_comm *comm = x->comm;
  const size_t align = 256, scratch = (s->scratch_count * x->esize + align - 1) / align * align;
  const size_t bytes = scratch + schedule_tmp_count(s) * x->esize;
  char *base = NULL;
  if (bytes) {
    const cudaError_t e = cudaMallocAsync((void **)&base, bytes, user);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "allocating %zu bytes of schedule scratch: %s", bytes,
                      cudaGetErrorString(e));
    }
  }
  x->bufs[FC_BUF_SCRATCH] = base;
  flexcoll_result_t res = kernel_order_before(x, user);
  for (int r = 0; r < s->nrounds && res == FLEXCOLL_SUCCESS; r++) res = schedule_round(x, s, r, base + scratch, user);
  if (res == FLEXCOLL_SUCCESS) res = kernel_order_after(x, user);
  /* Freed whatever happened: stream-ordered, after what of the call was enqueued. */
  if (base && cudaFreeAsync(base, user) != cudaSuccess) {
    cudaGetLastError();
    if (res == FLEXCOLL_SUCCESS) res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "freeing the schedule scratch");
  }
  return res;
}

/* Our own block is a copy on the stream; every other block a send and a receive of the batch. */
static flexcoll_result_t run_alltoall_p2p(fc_dexec_t *x, const fc_algo_args_t *args, const void *send, void *recv,
                                          cudaStream_t stream) {
  const int n = args->nranks, me = args->rank;
  const size_t block = args->count * x->esize;
  fc_p2p_op_t ops[FC_P2P_MAX_OPS];
  void *bufs[FC_P2P_MAX_OPS];
  int k = 0;
  for (int d = 1; d < n; d++) {
    const int to = (me + d) % n, from = (me + n - d) % n;
    ops[k] = (fc_p2p_op_t){.is_send = 1, .peer = to, .count = block};
    bufs[k++] = (char *)send + (size_t)to * block;
    ops[k] = (fc_p2p_op_t){.is_send = 0, .peer = from, .count = block};
    bufs[k++] = (char *)recv + (size_t)from * block;
  }
  if (send != recv)
    CUDA_TRY(x->comm, cudaMemcpyAsync((char *)recv + (size_t)me * block, (const char *)send + (size_t)me * block, block,
                                      cudaMemcpyDeviceToDevice, stream));
  return run_p2p_kernel(x, ops, k, bufs, stream);
}

/* One rank's batch: its k-th send to itself lands in its k-th receive from itself (the order
 * in which the pair's messages match on every path), as copies on the stream. */
static flexcoll_result_t p2p_self_copies(fc_dexec_t *x, const fc_p2p_op_t *ops, int nops, void *const *bufs,
                                         cudaStream_t stream) {
  int recv = 0;
  for (int s = 0; s < nops; s++) {
    if (!ops[s].is_send) continue;
    while (recv < nops && ops[recv].is_send) recv++;
    if (recv == nops)
      return fc_error(x->comm, FLEXCOLL_INVALID_USAGE, "flexcoll_send to itself (op %d) has no matching flexcoll_recv "
                      "in the same group", s);
    if (ops[recv].count != ops[s].count)
      return fc_error(x->comm, FLEXCOLL_INVALID_USAGE, "flexcoll_send of %zu bytes to itself met a flexcoll_recv "
                      "of %zu bytes", ops[s].count, ops[recv].count);
    if (ops[s].count && bufs[recv] != bufs[s])
      CUDA_TRY(x->comm, cudaMemcpyAsync(bufs[recv], bufs[s], ops[s].count, cudaMemcpyDeviceToDevice, stream));
    recv++;
  }
  while (recv < nops && ops[recv].is_send) recv++;
  if (recv < nops)
    return fc_error(x->comm, FLEXCOLL_INVALID_USAGE, "flexcoll_recv from itself (op %d) has no matching flexcoll_send "
                    "in the same group", recv);
  return FLEXCOLL_SUCCESS;
}

const char *fc_gpu_p2p_graph_refusal(struct flexcoll_comm *comm, flexcoll_stream_t stream) {
  const struct fc_gpu *g = comm->gpu;
  if (!g->p2p) return "the GPUs have no peer access, so the batch runs on the host links, blocking";
  if (comm->nranks == 1) return NULL;
  return other_stream_refusal(g, stream);
}

flexcoll_result_t fc_gpu_run_p2p(struct flexcoll_comm *comm, const fc_p2p_op_t *ops, int nops, void *const *bufs,
                                 flexcoll_stream_t stream, int capturing) {
  struct fc_gpu *g = comm->gpu;
  cudaStream_t user = (cudaStream_t)stream;
  int prev = enter_device(g);
  fc_dexec_t x = {.comm = comm, .g = g, .capturing = capturing};
  flexcoll_result_t res;
  if (comm->nranks == 1) {
    res = p2p_self_copies(&x, ops, nops, bufs, user);
  } else if (!g->p2p) {
    res = p2p_through_host(&x, ops, nops, bufs, user);
  } else {
    res = run_p2p_kernel(&x, ops, nops, bufs, user);
    /* The peers' kernels wait for this one, and it bounds its own waits. */
    if (res != FLEXCOLL_SUCCESS) fc_comm_set_async_error(comm, res);
  }
  fc_gpu_leave_device(prev);
  return res;
}

/* A collective on the communicator's device (current), enqueued on `user`. */
static flexcoll_result_t run_coll(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                                  void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op, cudaStream_t user,
                                  int capturing) {
  struct fc_gpu *g = comm->gpu;
  fc_dexec_t x = {.comm = comm, .g = g, .esize = fc_dtype_size(dtype), .dtype = dtype, .op = op, .capturing = capturing};
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  const size_t largest = largest_count(args);
  if (through_host(g, args)) {
    if (!every_peer_takes_device(comm)) {
      res = run_through_host(&x, args, sendbuf, recvbuf, user);
    } else if (cudaStreamSynchronize(user) != cudaSuccess) {
      res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "stream failed: %s", cudaGetErrorString(cudaGetLastError()));
    } else {
      /* The buffers hold what the stream wrote before the call; what the links write has landed
       * when it returns, before anything later on the stream. */
      res = fc_host_run_device(comm, args, sendbuf, recvbuf, dtype, op);
    }
  } else if (args->count == 0) {
    /* nothing moves */
  } else if (args->nranks == 1) {
    /* Every collective of one rank is a copy (AVG divides by 1). */
    const size_t bytes = fc_coll_recv_count(args->coll, args->count, 1) * x.esize;
    if (sendbuf != recvbuf && cudaMemcpyAsync(recvbuf, sendbuf, bytes, cudaMemcpyDeviceToDevice, user) != cudaSuccess)
      res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "copying a one-rank %s: %s", fc_coll_name(args->coll),
                     cudaGetErrorString(cudaGetLastError()));
    goto out;
  } else if (takes_oneshot(g, args, x.esize)) {
    res = run_oneshot(&x, args, sendbuf, recvbuf, user);
    /* Its sequence number is spent and the peers' kernels wait for this one: the communicator is done. */
    if (res != FLEXCOLL_SUCCESS) fc_comm_set_async_error(comm, res);
    /* Not tracked: the kernel bounds its own waits (timeout_ns) and reports through the
     * error flag, and two CUDA calls fewer matter at a few microseconds per call. */
    goto out;
  } else {
    /* Not captured (fc_gpu_graph_refusal): every rank captures the same calls, so all skip it. */
    if (!capturing && !ring_only(g, args) && fc_tuner_direct(args->coll, largest * x.esize, args->nranks)) {
      int done = 0;
      res = fc_gpu_direct_run(comm, args, sendbuf, recvbuf, dtype, op, user, &done);
      /* Once the peers count on the call, a failure leaves them waiting: the communicator is done. */
      if (res != FLEXCOLL_SUCCESS && done) fc_comm_set_async_error(comm, res);
      if (res != FLEXCOLL_SUCCESS || done) goto tracked;
    }
    if (pipelined(g, args) || ring_takes(g, args) || alltoall_kernel(g, args) || alltoall_by_p2p(g, args)) {
      res = pipelined(g, args)         ? run_pipelined(&x, args, sendbuf, recvbuf, user)
            : alltoall_kernel(g, args) ? run_alltoall(&x, args, sendbuf, recvbuf, user)
            : alltoall_by_p2p(g, args) ? run_alltoall_p2p(&x, args, sendbuf, recvbuf, user)
                                       : run_ring(&x, args, sendbuf, recvbuf, user);
      /* As the one-shot kernels: the peers wait for this one, and it bounds its own waits. */
      if (res != FLEXCOLL_SUCCESS) fc_comm_set_async_error(comm, res);
      goto out;
    }
    fc_schedule_t *s = &comm->schedule;
    FC_CHECK_GOTO(fc_algo_build(s, args), res, out);
    x.bufs[FC_BUF_SEND] = (char *)sendbuf;
    x.bufs[FC_BUF_RECV] = recvbuf;
    res = run_schedule(&x, s, user);
    if (res == FLEXCOLL_SUCCESS && op == FLEXCOLL_AVG && s->result_count &&
        fc_kernel_divide(dref(&x, s->result_buf, s->result_off), s->result_count, dtype, comm->nranks, user))
      res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "average kernel launch failed");
    /* Half a collective may be enqueued: peers wait for the rest, so the communicator is done. */
    if (res != FLEXCOLL_SUCCESS) fc_comm_set_async_error(comm, res);
    goto out;
  }
tracked:
  if (res == FLEXCOLL_SUCCESS && g->p2p) fc_gpu_track(comm, user);
out:
  return res;
}

/* Whether the call is an in-place alltoall that run_coll cannot take as it is: every path with
 * peer access (the alltoall and point-to-point kernels, direct mode) writes a block into a
 * peer's buffer that the peer may not have sent yet, and so would the links that take device
 * memory (without either, run_through_host stages both buffers in separate host copies; one rank
 * has nothing to move). */
static int alltoall_needs_copy(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                               const void *recvbuf) {
  return args->coll == FC_COLL_ALLTOALL && sendbuf == recvbuf && args->count && args->nranks > 1 &&
         (comm->gpu->p2p || every_peer_takes_device(comm));
}

/* In-place alltoall: NCCL allows it (sendbuf == recvbuf) and nccl-tests runs it, but the
 * kernels and schedules read a block of the input after a peer may have overwritten it with
 * its own block.  So the input is copied to a temporary of the buffer's size and the alltoall
 * runs out of place from it.  The allocation, copy and free are stream-ordered on the caller's
 * stream (no device-wide synchronisation, which cudaMalloc/cudaFree would bring, with several
 * ranks on one GPU) and capturable: a captured call gets memory alloc and free nodes, and its
 * graph refusal is that of the out-of-place call (fc_gpu_graph_refusal decides alike). */
static flexcoll_result_t alltoall_through_copy(struct flexcoll_comm *comm, const fc_algo_args_t *args, void *buf,
                                               flexcoll_datatype_t dtype, flexcoll_op_t op, cudaStream_t user,
                                               int capturing) {
  const size_t bytes = fc_coll_send_count(args->coll, args->count, args->nranks) * fc_dtype_size(dtype);
  void *tmp = NULL;
  cudaError_t e = cudaMallocAsync(&tmp, bytes, user);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR,
                    "flexcoll_alltoall: allocating the %zu-byte copy of the in-place buffer: %s", bytes,
                    cudaGetErrorString(e));
  }
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  /* The copy reads the input: after the communicator's previous kernel, as the kernel itself
   * would wait for it (kernel_order_before), whatever stream that one ran on. */
  const struct fc_gpu *g = comm->gpu;
  e = cudaSuccess;
  if (!capturing && g->oneshot_seq && g->oneshot_stream != user) e = cudaStreamWaitEvent(user, g->ev_oneshot, 0);
  if (e == cudaSuccess) e = cudaMemcpyAsync(tmp, buf, bytes, cudaMemcpyDeviceToDevice, user);
  if (e != cudaSuccess) {
    cudaGetLastError();
    res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "flexcoll_alltoall: copying the in-place buffer: %s",
                   cudaGetErrorString(e));
  } else {
    res = run_coll(comm, args, tmp, buf, dtype, op, user, capturing);
  }
  /* Freed whatever happened: stream-ordered, after anything of the call that was enqueued. */
  e = cudaFreeAsync(tmp, user);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (res == FLEXCOLL_SUCCESS)
      res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR,
                     "flexcoll_alltoall: freeing the copy of the in-place buffer: %s", cudaGetErrorString(e));
  }
  return res;
}

flexcoll_result_t fc_gpu_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf, void *recvbuf,
                             flexcoll_datatype_t dtype, flexcoll_op_t op, flexcoll_stream_t stream, int capturing) {
  struct fc_gpu *g = comm->gpu;
  cudaStream_t user = (cudaStream_t)stream;
  int prev = enter_device(g);
  const flexcoll_result_t res = alltoall_needs_copy(comm, args, sendbuf, recvbuf)
                                    ? alltoall_through_copy(comm, args, recvbuf, dtype, op, user, capturing)
                                    : run_coll(comm, args, sendbuf, recvbuf, dtype, op, user, capturing);
  fc_gpu_leave_device(prev);
  return res;
}
#endif
