/* direct.c — large device collectives copied straight between the ranks' own buffers.
 *
 * Why: a staging pipeline moves every byte twice (into the peer's staging slot, then
 * out of it) in slices of a few MB, and each copy-engine operation has a fixed cost of several
 * microseconds: on 2 H200s it tops out near 210 GB/s each way.  One copy-engine transfer of
 * hundreds of MB straight into the peer's buffer runs at ~387 GB/s (docs/PERFORMANCE.md).
 *
 * Where the peers' buffers are (peer_mem.c): in a symmetric window (flexcoll_window_register)
 * a buffer's peers sit at the same offset of their windows, mapped once at registration, so a
 * call needs no message at all and the host never waits.  Buffers outside windows take the
 * other device paths (exec.c), unless FLEXCOLL_DIRECT=2: then the ranks describe their buffers to one
 * another over the bootstrap at every call (a pointer between threads of one process, a CUDA
 * IPC handle and offset between processes, mappings cached), and the host waits for the peers
 * to reach the same call (never for device work).  If any rank cannot share a buffer (memory
 * from a stream-ordered pool, for one), all ranks learn it from that exchange and run the
 * staged schedule instead.
 *
 * On the device, per call (seq):
 *   arrive   every rank writes a descriptor of the call (collective, count, window offsets)
 *            into each peer's `desc` flag and seq into its `arrive` flag, from its stream: its
 *            buffers hold this call's input and earlier work is done with them; then waits for
 *            every peer's arrive, and for its desc to equal its own (ranks that disagree about
 *            the call wait there until the timeout instead of copying the wrong bytes).
 *   copy     allgather: each rank pushes its block into every peer's recvbuf (one copy-engine
 *            transfer per peer).  allreduce / reduce_scatter: rank r owns chunk r; it pulls
 *            chunk r of every peer's sendbuf into local scratch piece by piece (copy engine),
 *            reduces each piece with its own into recvbuf (kernel, reduce stream) and, for
 *            allreduce, pushes the reduced piece into every peer's recvbuf (copy engine).
 *            Pulls, reductions and pushes of successive pieces overlap on three streams.
 *            broadcast: the root pushes its buffer into every peer's recvbuf.
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
#include "topo.h"
#include "log.h"
#include "param.h"
#include "sched/sched.h"

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

/* What each rank tells the others at an exchange (FLEXCOLL_DIRECT=2). */
typedef struct {
  int32_t ok; /* every buffer of this rank can be shared */
  int32_t pad;
  fc_buf_desc_t buf[2]; /* send, recv */
} rank_desc_t;

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
  uint32_t desc;           /* what this call is: the same on every rank */
} direct_t;

/* Write value into flag `field` of ours at every peer, from stream s. */
static flexcoll_result_t post_flag(direct_t *d, cudaStream_t s, size_t field, uint32_t value) {
  struct fc_gpu *g = d->g;
  int me = d->comm->rank, n = d->comm->nranks;
  for (int q = 0; q < n; q++)
    if (q != me)
      CU_TRY(d->comm, g->write_value32(s, (CUdeviceptr)((char *)fc_pair_flags(g, g->peers[q].stage, me) + field), value, 0));
  return FLEXCOLL_SUCCESS;
}

/* Wait on s until every peer's flag `field` in our staging area compares to value. */
static flexcoll_result_t wait_all(direct_t *d, cudaStream_t s, size_t field, uint32_t value, unsigned how) {
  struct fc_gpu *g = d->g;
  int me = d->comm->rank, n = d->comm->nranks;
  for (int q = 0; q < n; q++)
    if (q != me)
      CU_TRY(d->comm, g->wait_value32(s, (CUdeviceptr)((char *)fc_pair_flags(g, g->stage, q) + field), value, how));
  return FLEXCOLL_SUCCESS;
}

/* arrive: tell every peer what this call is and that its buffers are ready on our side, then
 * wait for theirs.  The desc write lands first (each stream write is preceded by a memory
 * barrier), so once a peer's arrive is seen its desc is this call's. */
static flexcoll_result_t arrive(direct_t *d, cudaStream_t s) {
  FC_CHECK(post_flag(d, s, offsetof(fc_pair_flags_t, desc), d->desc));
  FC_CHECK(post_flag(d, s, offsetof(fc_pair_flags_t, arrive), d->seq));
  FC_CHECK(wait_all(d, s, offsetof(fc_pair_flags_t, arrive), d->seq, CU_STREAM_WAIT_VALUE_GEQ));
  return wait_all(d, s, offsetof(fc_pair_flags_t, desc), d->desc, CU_STREAM_WAIT_VALUE_EQ);
}

/* done: our copies (everything before on s) are complete; wait until the peers' are. */
static flexcoll_result_t finish(direct_t *d, cudaStream_t s) {
  FC_CHECK(post_flag(d, s, offsetof(fc_pair_flags_t, done), d->seq));
  return wait_all(d, s, offsetof(fc_pair_flags_t, done), d->seq, CU_STREAM_WAIT_VALUE_GEQ);
}

static flexcoll_result_t copy(direct_t *d, void *dst, const void *src, size_t bytes, cudaStream_t s) {
  if (bytes && dst != src) CUDA_TRY(d->comm, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  return FLEXCOLL_SUCCESS;
}

/* Our `bytes` at src into every peer's recvbuf at `off`, nearest peer first (so that with more
 * ranks the pushes of all ranks spread over the links), one copy-engine transfer each.  (Cutting
 * each into halves on two streams measured the same: 371 GB/s allgather busbw at 512 MB.) */
static flexcoll_result_t push_all(direct_t *d, size_t off, const char *src, size_t bytes) {
  int me = d->comm->rank, n = d->comm->nranks;
  for (int i = 1; i < n; i++) FC_CHECK(copy(d, d->peer_recv[(me + i) % n] + off, src, bytes, d->g->send_stream));
  return FLEXCOLL_SUCCESS;
}

/* allgather: our block into every peer's recvbuf, and (beside the pushes) into our own. */
static flexcoll_result_t allgather(direct_t *d) {
  struct fc_gpu *g = d->g;
  int me = d->comm->rank;
  size_t bytes = d->args->count * d->esize;
  FC_CHECK(copy(d, d->recv + (size_t)me * bytes, d->send, bytes, g->recv_stream));
  CUDA_TRY(d->comm, cudaEventRecord(g->ev_local, g->recv_stream));
  FC_CHECK(arrive(d, g->send_stream));
  FC_CHECK(push_all(d, (size_t)me * bytes, d->send, bytes));
  CUDA_TRY(d->comm, cudaStreamWaitEvent(g->send_stream, g->ev_local, 0));
  return finish(d, g->send_stream);
}

/* broadcast: the root pushes its buffer into every peer's recvbuf, and (beside the pushes, on
 * another stream) into its own. */
static flexcoll_result_t broadcast(direct_t *d) {
  struct fc_gpu *g = d->g;
  int root = d->comm->rank == d->args->root;
  size_t bytes = d->args->count * d->esize;
  if (root) {
    FC_CHECK(copy(d, d->recv, d->send, bytes, g->recv_stream));
    CUDA_TRY(d->comm, cudaEventRecord(g->ev_local, g->recv_stream));
  }
  FC_CHECK(arrive(d, g->send_stream));
  if (root) {
    FC_CHECK(push_all(d, 0, d->send, bytes));
    CUDA_TRY(d->comm, cudaStreamWaitEvent(g->send_stream, g->ev_local, 0));
  }
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

/* Scratch in device memory, grown stream-ordered on the caller's stream: after this
 * communicator's earlier work (which may still use the old scratch), without blocking the host
 * (a host wait here could wait on peers that are waiting on this thread). */
static flexcoll_result_t grow_scratch(struct flexcoll_comm *comm, size_t bytes, cudaStream_t user, char **out) {
  struct fc_gpu *g = comm->gpu;
  if (bytes > g->dev_scratch_bytes) {
    CUDA_TRY(comm, cudaEventRecord(g->ev_send, g->send_stream));
    CUDA_TRY(comm, cudaEventRecord(g->ev_recv, g->recv_stream));
    CUDA_TRY(comm, cudaEventRecord(g->ev_local, g->reduce_stream));
    CUDA_TRY(comm, cudaStreamWaitEvent(user, g->ev_send, 0));
    CUDA_TRY(comm, cudaStreamWaitEvent(user, g->ev_recv, 0));
    CUDA_TRY(comm, cudaStreamWaitEvent(user, g->ev_local, 0));
    if (g->dev_scratch) CUDA_TRY(comm, cudaFreeAsync(g->dev_scratch, user));
    g->dev_scratch = NULL;
    g->dev_scratch_bytes = 0;
    CUDA_TRY(comm, cudaMallocAsync((void **)&g->dev_scratch, bytes, user));
    g->dev_scratch_bytes = bytes;
  }
  *out = g->dev_scratch;
  return FLEXCOLL_SUCCESS;
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
  FC_CHECK(fc_gpu_side_streams(comm, g));
  /* Scratch first: it is grown on the user stream, before the side streams fork from it. */
  if (p.npieces) FC_CHECK(grow_scratch(comm, (size_t)(comm->nranks - 1) * p.slots * p.piece * d->esize, user, &scratch));
  d->seq = ++g->direct_seq;
  g->direct_desc = d->desc;
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

/* A 32-bit digest of what the call is: equal on every rank when the ranks agree on it. */
static uint32_t describe_call(const fc_algo_args_t *a, flexcoll_datatype_t dtype, flexcoll_op_t op, const uint64_t *w,
                              int nw) {
  uint64_t v[5 + 4] = {(uint64_t)a->coll, (uint64_t)a->count, (uint64_t)dtype, (uint64_t)op, (uint64_t)a->root};
  for (int i = 0; i < nw; i++) v[5 + i] = w[i];
  const uint64_t h = fc_hash_bytes(FC_HASH_INIT, v, (size_t)(5 + nw) * sizeof v[0]);
  return (uint32_t)(h ^ (h >> 32));
}

/* The peers' buffers through an exchange over the bootstrap (FLEXCOLL_DIRECT=2): *go = 0 when
 * some rank cannot share its buffers (every rank learns it from the same exchange). */
static flexcoll_result_t exchange(struct flexcoll_comm *comm, const void *share_send, const void *share_recv, char **ptrs,
                                  int *go) {
  struct fc_gpu *g = comm->gpu;
  int me = comm->rank, n = comm->nranks;
  rank_desc_t *all = calloc((size_t)n, sizeof *all);
  if (!all) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  all[me].ok = fc_peer_mem_describe(g, share_send, &all[me].buf[0]) && fc_peer_mem_describe(g, share_recv, &all[me].buf[1]);
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, all, sizeof *all);
  *go = res == FLEXCOLL_SUCCESS;
  for (int q = 0; q < n && *go; q++)
    if (!all[q].ok) {
      FC_TRACE(FC_SUB_COLL, "direct mode off for this call: rank %d cannot share its buffers", q);
      *go = 0;
    }
  /* Room for every mapping of this call, so that none of them is released half-way. */
  if (*go && fc_peer_mem_reserve(g, 2 * n) != FLEXCOLL_SUCCESS)
    res = fc_error(comm, FLEXCOLL_INVALID_USAGE, "no room to map the peers' buffers: too many windows");
  for (int q = 0; q < n && *go && res == FLEXCOLL_SUCCESS; q++) {
    if (q == me) continue;
    res = fc_peer_mem_map(comm, q, &all[q].buf[0], 0, &ptrs[q]);
    if (res == FLEXCOLL_SUCCESS) res = fc_peer_mem_map(comm, q, &all[q].buf[1], 0, &ptrs[n + q]);
  }
  free(all);
  return res;
}

/* The buffers the peers touch, and their sizes: allreduce both, reduce_scatter sendbuf
 * (pulled), allgather and broadcast recvbuf (pushed into); NULL: none. */
typedef struct {
  const void *send, *recv;
  size_t send_bytes, recv_bytes;
} shared_bufs_t;
static shared_bufs_t shared_bufs(const fc_algo_args_t *args, const void *sendbuf, const void *recvbuf, int n, size_t es) {
  shared_bufs_t b = {NULL, NULL, args->count * es, args->count * es};
  switch (args->coll) {
    case FC_COLL_ALLREDUCE: b.send = sendbuf; b.recv = recvbuf; break;
    case FC_COLL_REDUCE_SCATTER: b.send = sendbuf; b.send_bytes *= (size_t)n; break;
    case FC_COLL_ALLGATHER: b.recv = recvbuf; b.recv_bytes *= (size_t)n; break;
    default: b.recv = recvbuf; break;
  }
  return b;
}

flexcoll_result_t fc_gpu_direct_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                                    void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op, cudaStream_t user,
                                    int *done) {
  struct fc_gpu *g = comm->gpu;
  int n = comm->nranks;
  size_t es = fc_dtype_size(dtype);
  *done = 0;
  /* The exchange's driver calls need the device's context current, also in a thread (a group's
   * worker) where the runtime has not made it so yet. */
  cudaSetDevice(g->device);
  const shared_bufs_t b = shared_bufs(args, sendbuf, recvbuf, n, es);
  const void *share_send = b.send, *share_recv = b.recv;
  size_t send_bytes = b.send_bytes, recv_bytes = b.recv_bytes;
  char **ptrs = calloc(2 * (size_t)n, sizeof *ptrs);
  if (!ptrs) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  const struct flexcoll_window *ws = NULL, *wr = NULL;
  size_t os = 0, orecv = 0;
  uint64_t where[4] = {0};
  if ((!share_send || fc_peer_mem_window_of(g, share_send, send_bytes, &ws, &os)) &&
      (!share_recv || fc_peer_mem_window_of(g, share_recv, recv_bytes, &wr, &orecv))) {
    /* Windows: the peers' buffers are at the same offsets of their windows. */
    for (int q = 0; q < n; q++) {
      if (ws) ptrs[q] = ws->peer[q] + os;
      if (wr) ptrs[n + q] = wr->peer[q] + orecv;
    }
    where[0] = ws ? ws->id : ~0ull;
    where[1] = os;
    where[2] = wr ? wr->id : ~0ull;
    where[3] = orecv;
    *done = 1;
  } else if (fc_tuner_direct_exchange()) {
    /* Once the exchange has started the peers count on this call: a failure ends the communicator. */
    *done = 1;
    int go = 0;
    res = exchange(comm, share_send, share_recv, ptrs, &go);
    if (res == FLEXCOLL_SUCCESS && !go) *done = 0;
  }
  if (res == FLEXCOLL_SUCCESS && *done) {
    direct_t d = {.comm = comm, .g = g, .args = args, .send = (char *)sendbuf, .recv = recvbuf, .peer_send = ptrs,
                  .peer_recv = ptrs + n, .esize = es, .dtype = dtype, .op = op,
                  .desc = describe_call(args, dtype, op, where, 4)};
    res = enqueue(&d, user);
  }
  free(ptrs);
  return res;
}
#endif
