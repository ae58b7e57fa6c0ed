/* direct.c — large device collectives copied straight between the ranks' own buffers.
 *
 * Why: the staged pipeline (exec.c) moves every byte twice (into the peer's staging slot, then
 * out of it) in slices of a few MB, and each copy-engine operation has a fixed cost of several
 * microseconds: on 2 H200s it tops out near 210 GB/s each way.  One copy-engine transfer of
 * hundreds of MB straight into the peer's buffer runs at ~387 GB/s (docs/PERFORMANCE.md).
 *
 * How: at each call the ranks exchange where their buffers are (a pointer between threads of
 * one process, a CUDA IPC handle and offset between processes; peers' allocations stay mapped
 * in a small cache).  That exchange goes over the bootstrap, so a direct call waits on the host
 * for the peers to reach the same call; it never waits for device work.  The tuner uses it
 * only from FLEXCOLL_DIRECT_MIN_BYTES up, where the copies take far longer than the exchange.
 * If any rank cannot share a buffer (memory from a stream-ordered pool, for one), all ranks
 * learn it from the same exchange and run the staged schedule instead.
 *
 * On the device, per call (seq):
 *   arrive   every rank writes seq into each peer's `arrive` flag from its stream: its buffers
 *            hold this call's input and earlier work is done with them; then waits for every
 *            peer's.
 *   copy     allgather: each rank pushes its block into every peer's recvbuf (one copy-engine
 *            transfer per peer).  allreduce / reduce_scatter: rank r owns chunk r; it pulls
 *            chunk r of every peer's sendbuf into local scratch piece by piece (copy engine),
 *            reduces each piece with its own into recvbuf (kernel, reduce stream) and, for
 *            allreduce, pushes the reduced piece into every peer's recvbuf (copy engine).
 *            Pulls, reductions and pushes of successive pieces overlap on three streams.
 *            broadcast: non-roots pull the root's buffer.
 *   done     every rank writes seq into each peer's `done` flag once its copies have
 *            completed (stream order; the write carries a memory barrier), and waits for
 *            every peer's: after that nobody touches its buffers, and its stream goes on.
 * Every wait is a stream memory operation (bounded as a whole by the communicator's timeout
 * tracking; abort releases it by moving the flags far ahead). */
#define _GNU_SOURCE
#include "config.h"

#if HAVE_CUDA
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "device.h"
#include "dtype.h"
#include "error.h"
#include "log.h"
#include "param.h"

FC_PARAM_INT(direct_piece_bytes, "DIRECT_PIECE_BYTES", 64 << 20)
FC_PARAM_INT(direct_pieces, "DIRECT_PIECES", 2)

/* Pieces smaller than this cost more in per-copy overhead than they gain in overlap (each
 * copy-engine transfer costs ~5 us on top of its bytes; 16 MB pieces reached 340 GB/s busbw at
 * 512 MB, 4 x 64 MB pieces 356). */
#define MIN_PIECE_BYTES (2u << 20)
/* Scratch slots per peer: a pull may run this many pieces ahead of the reductions, which take
 * a fraction of a pull's time. */
#define SCRATCH_SLOTS 2
_Static_assert(FC_DIRECT_EVENTS > SCRATCH_SLOTS, "a slot's reduced event must survive until its reuse");

/* What one rank tells the others about one of its buffers. */
typedef struct {
  uint64_t ptr;               /* in the owner's address space; 0: no buffer */
  uint64_t offset;            /* from the start of its allocation */
  cudaIpcMemHandle_t handle;  /* of that allocation (when some peer is in another process) */
} buf_desc_t;

typedef struct {
  int32_t ok; /* every buffer of this rank can be shared */
  int32_t pad;
  buf_desc_t buf[2]; /* send, recv */
} rank_desc_t;

static int describe(struct fc_gpu *g, const void *ptr, buf_desc_t *d) {
  memset(d, 0, sizeof *d);
  if (!ptr) return 1;
  d->ptr = (uint64_t)(uintptr_t)ptr;
  if (!g->any_ipc_peer) return 1;
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!g->get_address_range || g->get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
    return 0;
  if (cudaIpcGetMemHandle(&d->handle, (void *)(uintptr_t)base) != cudaSuccess) {
    cudaGetLastError(); /* e.g. memory from cudaMallocAsync pools: not shareable this way */
    return 0;
  }
  d->offset = (uint64_t)((uintptr_t)ptr - (uintptr_t)base);
  return 1;
}

void fc_gpu_direct_release(struct fc_gpu *g) {
  for (int i = 0; i < g->ipc_cached; i++) cudaIpcCloseMemHandle(g->ipc_cache[i].base);
  g->ipc_cached = 0;
  cudaGetLastError();
}

/* Peer q's buffer d as a pointer valid here (the caller makes room in the cache). */
static flexcoll_result_t map_buffer(struct flexcoll_comm *comm, int q, const buf_desc_t *d, char **out) {
  struct fc_gpu *g = comm->gpu;
  *out = NULL;
  if (!d->ptr) return FLEXCOLL_SUCCESS;
  if (g->peers[q].same_process) {
    *out = (char *)(uintptr_t)d->ptr;
    return FLEXCOLL_SUCCESS;
  }
  for (int i = 0; i < g->ipc_cached; i++)
    if (g->ipc_cache[i].peer == q && !memcmp(&g->ipc_cache[i].handle, &d->handle, sizeof d->handle)) {
      *out = g->ipc_cache[i].base + d->offset;
      return FLEXCOLL_SUCCESS;
    }
  fc_ipc_entry_t *e = &g->ipc_cache[g->ipc_cached];
  cudaError_t err = cudaIpcOpenMemHandle((void **)&e->base, d->handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess)
    return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "mapping rank %d's buffer (cudaIpcOpenMemHandle): %s", q,
                    cudaGetErrorString(err));
  e->peer = q;
  e->handle = d->handle;
  g->ipc_cached++;
  *out = e->base + d->offset;
  return FLEXCOLL_SUCCESS;
}

typedef struct {
  struct flexcoll_comm *comm;
  struct fc_gpu *g;
  const fc_algo_args_t *args;
  char *send, *recv;       /* ours */
  char **peer_send, **peer_recv; /* [q]: peer q's, mapped here */
  size_t esize;
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  uint32_t seq;
} direct_t;

/* Write seq into flag `field` of ours at every peer, from stream s, then wait on s until every
 * peer's has reached seq in our staging area. */
static flexcoll_result_t signal_and_wait(direct_t *d, cudaStream_t s, size_t field) {
  struct fc_gpu *g = d->g;
  int me = d->comm->rank, n = d->comm->nranks;
  for (int q = 0; q < n; q++)
    if (q != me)
      CU_TRY(d->comm, g->write_value32(s, (CUdeviceptr)((char *)fc_pair_flags(g, g->peers[q].stage, me) + field), d->seq, 0));
  for (int q = 0; q < n; q++)
    if (q != me)
      CU_TRY(d->comm, g->wait_value32(s, (CUdeviceptr)((char *)fc_pair_flags(g, g->stage, q) + field), d->seq,
                                      CU_STREAM_WAIT_VALUE_GEQ));
  return FLEXCOLL_SUCCESS;
}

/* arrive: tell every peer this call's buffers are ready on our side, then wait for theirs. */
static flexcoll_result_t arrive(direct_t *d, cudaStream_t s) {
  return signal_and_wait(d, s, offsetof(fc_pair_flags_t, arrive));
}

/* done: our copies (everything before on s) are complete; wait until the peers' are. */
static flexcoll_result_t finish(direct_t *d, cudaStream_t s) {
  return signal_and_wait(d, s, offsetof(fc_pair_flags_t, done));
}

static flexcoll_result_t copy(direct_t *d, void *dst, const void *src, size_t bytes, cudaStream_t s) {
  if (bytes && dst != src) CUDA_TRY(d->comm, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  return FLEXCOLL_SUCCESS;
}

/* allgather: our block into every peer's recvbuf (nearest peer first, so that with more ranks
 * the pushes of all ranks spread over the links), and into our own. */
static flexcoll_result_t allgather(direct_t *d) {
  struct fc_gpu *g = d->g;
  int me = d->comm->rank, n = d->comm->nranks;
  size_t bytes = d->args->count * d->esize;
  FC_CHECK(copy(d, d->recv + (size_t)me * bytes, d->send, bytes, g->recv_stream));
  CUDA_TRY(d->comm, cudaEventRecord(g->ev_local, g->recv_stream));
  FC_CHECK(arrive(d, g->send_stream));
  for (int i = 1; i < n; i++) {
    int q = (me + i) % n;
    FC_CHECK(copy(d, d->peer_recv[q] + (size_t)me * bytes, d->send, bytes, g->send_stream));
  }
  CUDA_TRY(d->comm, cudaStreamWaitEvent(g->send_stream, g->ev_local, 0));
  return finish(d, g->send_stream);
}

/* broadcast: non-roots pull the root's buffer. */
static flexcoll_result_t broadcast(direct_t *d) {
  struct fc_gpu *g = d->g;
  int me = d->comm->rank, root = d->args->root;
  size_t bytes = d->args->count * d->esize;
  FC_CHECK(arrive(d, g->send_stream));
  if (me == root) FC_CHECK(copy(d, d->recv, d->send, bytes, g->send_stream));
  else FC_CHECK(copy(d, d->recv, d->peer_send[root], bytes, g->send_stream));
  return finish(d, g->send_stream);
}

/* allreduce and reduce_scatter: how our chunk is cut into pieces. */
typedef struct {
  size_t first, len;  /* our chunk: elements [first, first + len) of every rank's sendbuf */
  size_t out_off;     /* where its result goes in recvbuf (elements) */
  size_t piece, npieces, slots;
} plan_t;

static void plan_chunk(plan_t *p, size_t esize, size_t first, size_t len, size_t out_off) {
  p->first = first;
  p->len = len;
  p->out_off = out_off;
  /* About DIRECT_PIECES pieces (2 measured best from 16 MB to 512 MB: 4 and 8 lose up to 30%
   * at 16-64 MB to the fixed cost of each copy), each within [MIN_PIECE_BYTES, DIRECT_PIECE_BYTES], in 256-byte
   * units so that every piece keeps the buffers' 16-byte alignment (vectorised kernels). */
  int64_t k = fc_param_direct_pieces() > 0 ? fc_param_direct_pieces() : 1;
  size_t unit = 256 / esize, want = (len + (size_t)k - 1) / (size_t)k;
  size_t lo = MIN_PIECE_BYTES / esize, hi = (size_t)fc_param_direct_piece_bytes() / esize;
  if (hi < lo) hi = lo;
  size_t piece = want < lo ? lo : want > hi ? hi : want;
  p->piece = (piece + unit - 1) / unit * unit;
  p->npieces = len ? (len + p->piece - 1) / p->piece : 0;
  p->slots = p->npieces < SCRATCH_SLOTS ? p->npieces : SCRATCH_SLOTS;
}

/* Pull piece k of every peer's chunk into scratch, reduce it with ours into recvbuf, and
 * (allreduce) push the result into every peer's recvbuf.  Streams: recv = pulls, reduce =
 * kernels, send = pushes; events order them per piece. */
static flexcoll_result_t reduce_chunk(direct_t *d, const plan_t *p, char *scratch, int push) {
  struct flexcoll_comm *comm = d->comm;
  struct fc_gpu *g = d->g;
  int me = comm->rank, n = comm->nranks;
  size_t es = d->esize;
  for (size_t k = 0; k < p->npieces; k++) {
    size_t off = k * p->piece, cnt = p->len - off < p->piece ? p->len - off : p->piece;
    size_t slot = k % p->slots;
    int ev = (int)(k % FC_DIRECT_EVENTS);
    /* The slot's previous piece must be reduced before it is overwritten. */
    if (k >= p->slots)
      CUDA_TRY(comm, cudaStreamWaitEvent(g->recv_stream, g->ev_reduced[(k - p->slots) % FC_DIRECT_EVENTS], 0));
    for (int i = 1, j = 0; i < n; i++, j++) {
      int q = (me + i) % n;
      char *dst = scratch + ((size_t)j * p->slots + slot) * p->piece * es;
      FC_CHECK(copy(d, dst, d->peer_send[q] + (p->first + off) * es, cnt * es, g->recv_stream));
    }
    CUDA_TRY(comm, cudaEventRecord(g->ev_pulled[ev], g->recv_stream));
    CUDA_TRY(comm, cudaStreamWaitEvent(g->reduce_stream, g->ev_pulled[ev], 0));
    char *out = d->recv + (p->out_off + off) * es;
    const char *mine = d->send + (p->first + off) * es;
    for (int j = 0; j < n - 1; j++) {
      const char *theirs = scratch + ((size_t)j * p->slots + slot) * p->piece * es;
      if (fc_kernel_reduce(out, j == 0 ? mine : out, theirs, cnt, d->dtype, d->op, g->reduce_stream))
        return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "reduction kernel launch failed");
    }
    if (d->op == FLEXCOLL_AVG && fc_kernel_divide(out, cnt, d->dtype, n, g->reduce_stream))
      return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "average kernel launch failed");
    CUDA_TRY(comm, cudaEventRecord(g->ev_reduced[ev], g->reduce_stream));
    if (push) {
      CUDA_TRY(comm, cudaStreamWaitEvent(g->send_stream, g->ev_reduced[ev], 0));
      for (int i = 1; i < n; i++) {
        int q = (me + i) % n;
        FC_CHECK(copy(d, d->peer_recv[q] + (p->out_off + off) * es, out, cnt * es, g->send_stream));
      }
    }
  }
  /* finish() runs on the send stream: it must follow every pull (we are done reading the
   * peers' sendbufs) and every reduction (our recvbuf is final). */
  CUDA_TRY(comm, cudaEventRecord(g->ev_local, g->recv_stream));
  CUDA_TRY(comm, cudaStreamWaitEvent(g->send_stream, g->ev_local, 0));
  CUDA_TRY(comm, cudaEventRecord(g->ev_local, g->reduce_stream));
  CUDA_TRY(comm, cudaStreamWaitEvent(g->send_stream, g->ev_local, 0));
  return FLEXCOLL_SUCCESS;
}

/* Our chunk of an allreduce of count elements: the ranks' chunks are equal runs of 256-byte
 * units (the last ones shorter or empty). */
static void allreduce_chunk(size_t count, size_t esize, int rank, int nranks, size_t *first, size_t *len) {
  size_t unit = 256 / esize, units = (count + unit - 1) / unit;
  size_t per = (units + (size_t)nranks - 1) / (size_t)nranks * unit;
  size_t lo = (size_t)rank * per, hi = lo + per;
  if (lo > count) lo = count;
  if (hi > count) hi = count;
  *first = lo;
  *len = hi - lo;
}

/* Everything on the device, after the exchange. */
static flexcoll_result_t enqueue(direct_t *d, cudaStream_t user) {
  struct flexcoll_comm *comm = d->comm;
  struct fc_gpu *g = d->g;
  const fc_algo_args_t *args = d->args;
  plan_t p = {0};
  char *scratch = NULL;
  if (args->coll == FC_COLL_ALLREDUCE) {
    size_t first, len;
    allreduce_chunk(args->count, d->esize, comm->rank, comm->nranks, &first, &len);
    plan_chunk(&p, d->esize, first, len, first);
  } else if (args->coll == FC_COLL_REDUCE_SCATTER) {
    plan_chunk(&p, d->esize, (size_t)comm->rank * args->count, args->count, 0);
  }
  /* Scratch first: it is grown on the user stream, before the side streams fork from it. */
  if (p.npieces) FC_CHECK(fc_gpu_scratch(comm, (size_t)(comm->nranks - 1) * p.slots * p.piece * d->esize, user, &scratch));
  d->seq = ++g->direct_seq;
  CUDA_TRY(comm, cudaEventRecord(g->ev_user, user));
  CUDA_TRY(comm, cudaStreamWaitEvent(g->send_stream, g->ev_user, 0));
  CUDA_TRY(comm, cudaStreamWaitEvent(g->recv_stream, g->ev_user, 0));
  CUDA_TRY(comm, cudaStreamWaitEvent(g->reduce_stream, g->ev_user, 0));
  switch (args->coll) {
    case FC_COLL_ALLGATHER: FC_CHECK(allgather(d)); break;
    case FC_COLL_BROADCAST: FC_CHECK(broadcast(d)); break;
    default:
      /* Pulls may start once the peers have arrived; pushes follow the pulls (events). */
      FC_CHECK(arrive(d, g->recv_stream));
      FC_CHECK(reduce_chunk(d, &p, scratch, args->coll == FC_COLL_ALLREDUCE));
      FC_CHECK(finish(d, g->send_stream));
      break;
  }
  /* The send stream has joined the others.  The user stream joins it, and so do the other
   * side streams: whatever the next call's user stream, its side work (and its use of the
   * scratch) then comes after all of this call's. */
  CUDA_TRY(comm, cudaEventRecord(g->ev_send, g->send_stream));
  CUDA_TRY(comm, cudaStreamWaitEvent(user, g->ev_send, 0));
  CUDA_TRY(comm, cudaStreamWaitEvent(g->recv_stream, g->ev_send, 0));
  CUDA_TRY(comm, cudaStreamWaitEvent(g->reduce_stream, g->ev_send, 0));
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_gpu_direct_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                                    void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op, cudaStream_t user,
                                    int *done) {
  struct fc_gpu *g = comm->gpu;
  int me = comm->rank, n = comm->nranks;
  *done = 0;
  /* Only the buffers the peers will touch are described (a broadcast's non-root sendbuf is
   * not even valid). */
  int is_root = me == args->root;
  const void *share_send = args->coll == FC_COLL_BROADCAST && !is_root ? NULL : sendbuf;
  const void *share_recv = args->coll == FC_COLL_ALLGATHER || args->coll == FC_COLL_ALLREDUCE ? recvbuf : NULL;
  rank_desc_t *all = calloc((size_t)n, sizeof *all);
  char **ptrs = calloc(2 * (size_t)n, sizeof *ptrs);
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (!all || !ptrs) { res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory"); goto out; }
  all[me].ok = describe(g, share_send, &all[me].buf[0]) && describe(g, share_recv, &all[me].buf[1]);
  /* A failed exchange leaves the bootstrap ring out of step: the communicator is done. */
  *done = 1;
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, all, sizeof *all), res, out);
  for (int q = 0; q < n; q++)
    if (!all[q].ok) {
      FC_TRACE(FC_SUB_COLL, "direct mode off for this call: rank %d cannot share its buffers", q);
      *done = 0;
      goto out;
    }
  direct_t d = {.comm = comm, .g = g, .args = args, .send = (char *)sendbuf, .recv = recvbuf, .peer_send = ptrs,
                .peer_recv = ptrs + n, .esize = fc_dtype_size(dtype), .dtype = dtype, .op = op};
  /* Room for every mapping of this call, so that none of them is released half-way. */
  if (g->ipc_cached > FC_IPC_CACHE - 2 * n) {
    cudaStreamSynchronize(g->send_stream);
    cudaStreamSynchronize(g->recv_stream);
    cudaStreamSynchronize(g->reduce_stream);
    fc_gpu_direct_release(g);
  }
  for (int q = 0; q < n && res == FLEXCOLL_SUCCESS; q++) {
    if (q == me) continue;
    res = map_buffer(comm, q, &all[q].buf[0], &d.peer_send[q]);
    if (res == FLEXCOLL_SUCCESS) res = map_buffer(comm, q, &all[q].buf[1], &d.peer_recv[q]);
  }
  if (res != FLEXCOLL_SUCCESS) goto out;
  res = enqueue(&d, user);
out:
  free(all);
  free(ptrs);
  return res;
}
#endif
