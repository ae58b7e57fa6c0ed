/* ring.cu — allreduce, allgather, reduce_scatter, broadcast and reduce for any number of ranks:
 * one kernel per rank and call, each rank writing only into the next rank's ring area and
 * reading only its own (kernels.h has the interface and the counters' layout).
 *
 * The message is cut into chunks (allreduce: n of them; allgather and reduce_scatter: one per
 * rank's block; broadcast and reduce: one), each chunk into one part per block of the grid, and
 * each part into slices of at most a sub-slot.  For every slice, a block runs the ring's steps
 * in order; one step receives a message from the previous rank (its sub-slot in our area),
 * folds it with our own operand, writes it into place and pushes it to the next rank, in one
 * pass over the bytes (loads from our area and our buffer, stores into our buffer and over
 * NVLink into the next rank's area), as NCCL's ring primitives do.  Which step does which of
 * these is the collective's (fc_ring_step_role):
 *   allreduce       2n-1 steps: a reduce-scatter (chunk c is folded from rank c+1 round to rank
 *                   c, whose step n-1 finishes it, divides for AVG and writes it) then an
 *                   allgather of the finished chunks round the ring;
 *   reduce_scatter  the first n steps of that;
 *   allgather       n steps: each rank's block travels n-1 hops, copied into place at each;
 *   broadcast       a chain from the root through root+1 ... root-1;
 *   reduce          a chain from root+1 through ... root, folding on the way.
 * The fold is always (what arrived) op (our operand), so a chunk's result depends on the ring
 * alone: bitwise the same on every rank and in every run.
 *
 * Flow control per block and edge, with messages numbered from the call's counter base: the
 * sender waits until the receiver has consumed message m - S (its ack counter for us) before
 * writing message m into sub-slot m % S, then raises the receiver's ready counter to m + 1; the
 * receiver waits for ready >= m + 1, consumes, and raises the sender's ack to m + 1.  A call
 * ends once the next rank has consumed all it was sent, so the next call, whatever its grid
 * and slice size, finds our area free.  No seq and no handshake: the ring area is not shared
 * with the one-shot kernels, whose parity argument (oneshot.cuh) therefore does not see these
 * calls. */
#include "kernels/oneshot.cuh"
#include "kernels/ring_plan.h"

namespace {

constexpr unsigned FC_RING_THREADS = 512;


/* What a block of the grid uses: its lane's areas and counters (its own ready and ack at
 * ctr[b] and ctr[FC_MAX_BLOCKS + b], b its index in the lane; a proxy's lane's ready at ready[b]
 * where the proxy raises it in device memory), and its bytes of a chunk.  In a ring by hops the
 * fields of the edge from the previous rank (area, ready, ack_prev, sys) and of the edge to the
 * next (area_next, ready_next, ack, ce and its descriptors) come from the edges' lanes. */
struct fc_ring_lane {
  char *area, *area_next;
  uint64_t *ready, *ack;            /* ours */
  uint64_t *ready_next, *ack_prev;  /* the neighbours' we raise */
  unsigned idx, blocks;
  size_t lo, hi;                    /* of a chunk, before the chunk's own end */
  size_t step, room;
  unsigned nslices;
  bool sys;                         /* the area is host memory, or written by a proxy */
  bool ce;                          /* pushes are published for the proxy (side lane's ce) */
  fc_pcie_desc_t *desc;             /* ce: this block's descriptors */
  uint64_t *sent, *pub;             /* ce: this block's published count, host-mapped and on the device */
};

/* The lane of this block: the NVLink lane's blocks first, then side lane 1's, then side lane 2's. */
__device__ __forceinline__ int fc_ring_lane_index(const fc_ring_io &io, unsigned *idx) {
  unsigned b = blockIdx.x;
  int L = 0;
  while (L < FC_RING_LANES - 1 && b >= io.blocks[L]) b -= io.blocks[L++];
  *idx = b;
  return L;
}

__device__ __forceinline__ fc_ring_lane fc_ring_lane_of(const fc_ring_args_t &a, const fc_ring_io &io) {
  fc_ring_lane l;
  const int L = fc_ring_lane_index(io, &l.idx);
  l.blocks = io.blocks[L];
  /* The lane of each edge: the block's own, or in a ring by hops each edge's (a.hops, L 0). */
  const fc_ring_side_t *in = a.hops ? (a.hop_in ? &a.side[a.hop_in - 1] : nullptr) : L ? &a.side[L - 1] : nullptr;
  const fc_ring_side_t *out = a.hops ? (a.hop_out ? &a.side[a.hop_out - 1] : nullptr) : in;
  /* The edge from the previous rank: our area, our ready counter, the previous rank's ack. */
  l.area = in ? in->area : a.area;
  l.ready = in && in->ce && in->ready ? in->ready + l.idx : (in ? in->ctr : a.ctr) + l.idx;
  l.ack_prev = (in ? in->ctr_prev : a.ctr_prev) + FC_MAX_BLOCKS + l.idx;
  l.sys = in != nullptr;
  /* The edge to the next rank: its area (or our outbox), its ready counter, our ack. */
  l.area_next = out ? out->area_next : a.area_next;
  l.ready_next = (out ? out->ctr_next : a.ctr_next) + l.idx;
  l.ack = (out ? out->ctr : a.ctr) + FC_MAX_BLOCKS + l.idx;
  l.ce = out && out->ce;
  l.desc = l.ce ? out->desc + (size_t)l.idx * FC_PCIE_DESCS : nullptr;
  l.sent = l.ce ? out->sent + l.idx : nullptr;
  l.pub = l.ce ? out->pub + l.idx : nullptr;
  l.lo = io.start[L] + (size_t)l.idx * io.part[L];
  if (l.lo > io.end[L]) l.lo = io.end[L];
  l.hi = l.lo + io.part[L] < io.end[L] ? l.lo + io.part[L] : io.end[L];
  l.step = io.step[L];
  l.room = io.room[L];
  l.nslices = io.nslices[L];
  return l;
}

/* What a rank does in ring step s of a slice. */
struct fc_ring_role {
  int chunk;
  bool recv;  /* consume a message from the previous rank */
  bool own;   /* fold in (or, without recv, send) our own operand */
  bool out;   /* write the result into recv */
  bool push;  /* send it to the next rank */
  bool fin;   /* the chunk is finished here (AVG divides) */
};

__device__ __forceinline__ int fc_mod(int x, int n) { return ((x % n) + n) % n; }

__device__ __forceinline__ fc_ring_role fc_ring_step_role(const fc_ring_args_t &a, const fc_ring_io &io, unsigned s) {
  const int n = a.nranks, me = a.rank, last = (int)io.steps - 1;
  const int si = (int)s;
  fc_ring_role r = {0, si > 0, false, false, false, false};
  switch (io.coll) {
    case FC_RING_ALLREDUCE:
      r.chunk = si <= n - 1 ? fc_mod(me - 1 - si, n) : fc_mod(me - (si - n + 1), n);
      r.own = si <= n - 1;
      r.out = si >= n - 1;
      r.fin = si == n - 1;
      r.push = si < last;
      break;
    case FC_RING_REDUCE_SCATTER:
      r.chunk = fc_mod(me - 1 - si, n);
      r.own = true;
      r.out = r.fin = si == last;
      r.push = si < last;
      break;
    case FC_RING_ALLGATHER:
      r.chunk = fc_mod(me - si, n);
      r.own = si == 0;
      r.out = true;
      r.push = si < last;
      break;
    case FC_RING_BROADCAST: {
      const int pos = fc_mod(me - io.root, n);
      r.recv = pos > 0;
      r.own = pos == 0;
      r.out = true;
      r.push = pos < n - 1;
      break;
    }
    default: { /* FC_RING_REDUCE */
      const int pos = fc_mod(me - io.root - 1, n);
      r.recv = pos > 0;
      r.own = true;
      r.out = r.fin = pos == n - 1;
      r.push = pos < n - 1;
      break;
    }
  }
  return r;
}

/* The call's counter base, read once per block (as fc_epoch_begin does for the one-shot
 * kernels: one load bypassing L1, before any use). */
__shared__ unsigned long long fc_ring_base_shared;
__device__ __forceinline__ uint64_t fc_ring_base() { return *(volatile unsigned long long *)&fc_ring_base_shared; }

/* Read the epoch, then count this block at once (see fc_pipe_call in pipeline.cu for why
 * counting first): the last block advances pipe_base by the call's messages and leaves seq. */
__device__ __forceinline__ void fc_ring_epoch(const fc_ring_args_t &a, unsigned long long msgs) {
  if (threadIdx.x == 0) {
    const unsigned long long b = fc_ld_volatile((const uint64_t *)&a.epoch->pipe_base);
    fc_ring_base_shared = b;
    __threadfence();
    if (atomicAdd(&a.epoch->done, 1u) == gridDim.x - 1) {
      __threadfence();
      atomicExch(&a.epoch->done, 0u);
      *(volatile unsigned long long *)&a.epoch->pipe_base = b + msgs;
    }
  }
  __syncthreads();
}

__device__ __forceinline__ unsigned long long fc_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Stage 2 (fc_ring_clock): when this block's first message from the previous rank arrived (0:
 * none yet).  A lane's time counts from there, not from the block's start: ranks launch their
 * kernels at different moments, and the wait for a late neighbour would otherwise count as the
 * lane's, the same absolute time on both lanes, which would make the lane with the smaller
 * share look the slower. */
__shared__ unsigned long long fc_ring_first_shared;

/* Thread 0 waits for our ready counter (recv) and ack counter (before a push), then a system
 * fence (the acquire side); false in every thread after a timeout or abort (*error set). */
__device__ __forceinline__ bool fc_ring_wait(const fc_ring_args_t &a, const fc_ring_lane &l, uint64_t ready_target,
                                             uint64_t ack_target) {
  __shared__ int ok_shared;
  if (threadIdx.x == 0) {
    const long long start = fc_now_ns();
    long long last_abort_check = start;
    int ok = 1;
    if (ready_target) ok = fc_poll(a, l.ready, ready_target, start, &last_abort_check);
    if (ok && ready_target && a.clk && !fc_ring_first_shared) fc_ring_first_shared = fc_globaltimer();
    if (ok && ack_target) ok = fc_poll(a, l.ack, ack_target, start, &last_abort_check);
    if (!ok && a.error && *(volatile int *)a.error == 0) *(volatile int *)a.error = 1;
    __threadfence_system();
    ok_shared = ok;
  }
  __syncthreads();
  return ok_shared != 0;
}

/* The block's published count of a copy-engine lane (thread 0's), from pub at its start. */
__shared__ unsigned long long fc_ring_pub_shared;

/* After the block's accesses of a step: raise the next rank's ready (a push) and the previous
 * rank's ack (a receive), behind a system fence (as fc_post_flags).  On a copy-engine lane a push
 * is published for our proxy instead (the message at off in the outbox, bytes long): it raises
 * the next rank's ready once the bytes have landed there. */
__device__ __forceinline__ void fc_ring_signal(const fc_ring_lane &l, uint64_t ready_value, uint64_t ack_value,
                                               size_t off, size_t bytes) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (ready_value && l.ce) {
      const unsigned long long n = fc_ring_pub_shared;
      volatile fc_pcie_desc_t *d = l.desc + n % FC_PCIE_DESCS;
      d->off = off;
      d->bytes = bytes;
      d->ready = ready_value;
      fc_ring_pub_shared = n + 1;
      fc_st_release_sys(l.sent, n + 1);
    } else if (ready_value) {
      fc_st_release_sys(l.ready_next, ready_value);
    }
    if (ack_value) fc_st_release_sys(l.ack_prev, ack_value);
  }
}

/* One step over n bytes: v = in (or own alone), folded with own when both, divided when AVG
 * finishes here, stored to out and nxt (each may be NULL).  16-byte vectors when every pointer
 * is aligned, four of them loaded before any store (the stores may go over NVLink: more in
 * flight); the rest in units of V. */
template <typename V, typename D, class Op, bool AVG, bool SYS>
__device__ __forceinline__ void fc_ring_xfer(const char *in, const char *own, char *out, char *nxt, size_t n,
                                             bool fin, typename fc_divisor<D>::type dn) {
  typedef fc_vec<V> vec;
  const char *first = in ? in : own;
  const char *second = in ? own : nullptr;
  /* Only what arrived can be host memory (SYS: the pcie lane); our own operand never is. */
  const bool first_sys = SYS && in;
  const uintptr_t al = (uintptr_t)first | (uintptr_t)second | (uintptr_t)out | (uintptr_t)nxt;
  const size_t vend = (al & 15u) == 0 ? n & ~(size_t)15 : 0;
  const bool divide = AVG && fin;
  const size_t stride = 16 * (size_t)blockDim.x;
  size_t i = 16 * (size_t)threadIdx.x;
  for (; i + 3 * stride < vend; i += 4 * stride) {
    vec v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = first_sys ? fc_vec_ld<V, true>(first + i + j * stride) : fc_vec_ld<V>(first + i + j * stride);
    if (second) {
      vec w[4];
#pragma unroll
      for (int j = 0; j < 4; j++) w[j] = fc_vec_ld_cg<V>(second + i + j * stride);
#pragma unroll
      for (int j = 0; j < 4; j++) v[j] = fc_vec_apply<V, Op>(v[j], w[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
      if (divide)
#pragma unroll
        for (int e = 0; e < vec::N; e++) v[j].e[e] = fc_avg<V, D>(v[j].e[e], dn);
      if (out) *(uint4 *)(out + i + j * stride) = v[j].raw;
      if (nxt) *(uint4 *)(nxt + i + j * stride) = v[j].raw;
    }
  }
  for (; i < vend; i += stride) {
    vec v = first_sys ? fc_vec_ld<V, true>(first + i) : fc_vec_ld<V>(first + i);
    if (second) v = fc_vec_apply<V, Op>(v, fc_vec_ld_cg<V>(second + i));
    if (divide)
#pragma unroll
      for (int e = 0; e < vec::N; e++) v.e[e] = fc_avg<V, D>(v.e[e], dn);
    if (out) *(uint4 *)(out + i) = v.raw;
    if (nxt) *(uint4 *)(nxt + i) = v.raw;
  }
  for (size_t k = vend + sizeof(V) * threadIdx.x; k < n; k += sizeof(V) * blockDim.x) {
    V v = first_sys ? fc_ld<V, true>(first + k) : fc_ld<V>(first + k);
    if (second) v = Op::apply(v, fc_ld_cg<V>(second + k));
    if (divide) v = fc_avg<V, D>(v, dn);
    if (out) *(V *)(out + k) = v;
    if (nxt) *(V *)(nxt + k) = v;
  }
}

template <typename V, typename D, class Op, bool AVG>
__device__ __forceinline__ void fc_ring_run(const fc_ring_args_t &a, const fc_ring_io &io) {
  const unsigned S = a.subslots;
  const uint64_t base = fc_ring_base();
  const typename fc_divisor<D>::type dn = (typename fc_divisor<D>::type)a.nranks;
  const fc_ring_lane l = fc_ring_lane_of(a, io);
  uint64_t pushed = 0, received = 0; /* this call's messages on our two edges, this block */
  if (l.ce && threadIdx.x == 0) fc_ring_pub_shared = *(volatile unsigned long long *)l.pub; /* read before any signal */
  for (unsigned k = 0; k < l.nslices; k++) {
    for (unsigned s = 0; s < io.steps; s++) {
      const fc_ring_role r = fc_ring_step_role(a, io, s);
      /* This slice's bytes of the chunk: [lo, hi) of it. */
      const size_t cstart = (size_t)r.chunk * io.chunk;
      const size_t clen = cstart >= io.total ? 0 : (io.total - cstart < io.chunk ? io.total - cstart : io.chunk);
      const size_t pend = l.hi < clen ? l.hi : clen;
      size_t lo = l.lo + (size_t)k * l.step;
      if (lo > pend) lo = pend;
      const size_t hi = lo + l.step < pend ? lo + l.step : pend;
      const uint64_t ready_target = r.recv ? base + received + 1 : 0;
      const uint64_t ack_target = r.push && pushed >= S ? base + pushed - S + 1 : 0;
      if ((ready_target || ack_target) && !fc_ring_wait(a, l, ready_target, ack_target)) goto done;
      const char *in = r.recv ? l.area + ((size_t)(received % S) * l.blocks + l.idx) * l.room : nullptr;
      char *nxt = r.push ? l.area_next + ((size_t)(pushed % S) * l.blocks + l.idx) * l.room : nullptr;
      /* Allgather's and reduce_scatter's chunk of a place is the block of the rank there
       * (allreduce's chunks are the buffer's, in order, whatever the places). */
      const bool by_rank = a.ring_rank && (io.coll == FC_RING_ALLGATHER || io.coll == FC_RING_REDUCE_SCATTER);
      const size_t block = by_rank ? (size_t)a.ring_rank[r.chunk] : (size_t)r.chunk;
      const char *own = r.own ? io.send + block * io.own_stride + lo : nullptr;
      char *out = r.out ? io.recv + block * io.out_stride + lo : nullptr;
      if (out == own && !r.recv) out = nullptr; /* our own data, in place: already there */
      if (l.sys) fc_ring_xfer<V, D, Op, AVG, true>(in, own, out, nxt, hi - lo, r.fin, dn);
      else fc_ring_xfer<V, D, Op, AVG, false>(in, own, out, nxt, hi - lo, r.fin, dn);
      if (r.push) pushed++;
      if (r.recv) received++;
      if (r.push || r.recv)
        fc_ring_signal(l, r.push ? base + pushed : 0, r.recv ? base + received : 0, nxt ? (size_t)(nxt - l.area_next) : 0,
                       hi - lo);
    }
  }
  /* Everything we sent has been consumed: the next call may reuse the next rank's area. */
  if (pushed) fc_ring_wait(a, l, 0, base + pushed);
done:
  if (l.ce && threadIdx.x == 0) *(volatile unsigned long long *)l.pub = fc_ring_pub_shared;
}

/* Stage 2 (kernels.h, fc_lane_clock_t): thread 0 of every block folds the block's start (its
 * first arrival, else its launch: a chain's first rank receives nothing) and end into its
 * lane's span; the last block to finish publishes the call's record and zeroes the clock.
 * Reached on every path (a block that gave up on a wait too), so that the clock is clean for
 * the next call whatever happened. */
__device__ __forceinline__ void fc_ring_clock(const fc_ring_args_t &a, const fc_ring_io &io, unsigned long long t0) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  fc_lane_clock_t *c = a.clk;
  unsigned idx;
  const int L = fc_ring_lane_index(io, &idx);
  const unsigned long long first = fc_ring_first_shared;
  atomicMax(&c->start_inv[L], ~(first ? first : t0));
  atomicMax(&c->end[L], fc_globaltimer());
  __threadfence();
  if (atomicAdd(&c->done, 1u) != gridDim.x - 1) return;
  __threadfence();
  fc_lane_record_t *r = a.rec + a.call % FC_LANE_RECORDS;
  for (int k = 0; k < FC_RING_LANES; k++) {
    const unsigned long long s = atomicExch(&c->start_inv[k], 0ull), e = atomicExch(&c->end[k], 0ull);
    r->ns[k] = s && e > ~s ? e - ~s : 0;
    r->bytes[k] = io.blocks[k] ? a.lane_bytes[k] : 0;
  }
  atomicExch(&c->done, 0u);
  __threadfence_system();
  *(volatile unsigned long long *)&r->call = a.call;
}

template <typename V, typename D, class Op, bool AVG>
__global__ void __launch_bounds__(FC_RING_THREADS, 2) fc_ring_kernel(const fc_ring_args_t a, const fc_ring_io io) {
  const unsigned long long t0 = a.clk ? fc_globaltimer() : 0;
  if (threadIdx.x == 0) fc_ring_first_shared = 0; /* fc_ring_epoch's barrier publishes it */
  fc_ring_epoch(a, io.msgs);
  fc_ring_run<V, D, Op, AVG>(a, io);
  if (a.clk) fc_ring_clock(a, io, t0);
}

struct fc_ring_launch {
  const fc_ring_args_t *args;
  fc_ring_io io;
  unsigned grid;
  bool avg;
  cudaStream_t stream;
  template <typename V, typename D, class Op> int run() {
    if ((((uintptr_t)io.send | (uintptr_t)io.recv) & (sizeof(V) - 1)) || io.chunk % sizeof(V)) return (int)cudaErrorInvalidValue;
    if (avg) fc_ring_kernel<V, D, Op, true><<<grid, FC_RING_THREADS, 0, stream>>>(*args, io);
    else fc_ring_kernel<V, D, Op, false><<<grid, FC_RING_THREADS, 0, stream>>>(*args, io);
    return (int)cudaGetLastError();
  }
};

/* Copies (allgather, broadcast) in bytes: any size and alignment. */
typedef unsigned char fc_ring_byte;

/* Visits every instance: load it now (see fc_kernels_preload_reduce) and record the fewest
 * blocks of any that fit on one SM. */
struct fc_ring_visit {
  int per_sm = 1 << 30;
  template <typename V, typename D, class Op> int run() {
    int e = visit(fc_ring_kernel<V, D, Op, true>);
    return e ? e : visit(fc_ring_kernel<V, D, Op, false>);
  }
  template <class K> int visit(K kernel) {
    cudaFuncAttributes attr;
    int e = (int)cudaFuncGetAttributes(&attr, kernel), nb = 0;
    if (!e) e = (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, FC_RING_THREADS, 0);
    if (!e && nb < per_sm) per_sm = nb;
    return e;
  }
};

bool fc_ring_side_ok(const fc_ring_side_t *s, unsigned blocks) {
  return !s->chunk_bytes ||
         (s->area && s->area_next && s->ctr && s->ctr_next && s->ctr_prev &&
          (((uintptr_t)s->area | (uintptr_t)s->area_next | s->area_bytes) & 15u) == 0 && s->blocks >= 1 &&
          2 * s->blocks <= blocks && (!s->ce || (s->desc && s->sent && s->pub)));
}

/* A ring by hops: each edge's lane has what the blocks use of it, and no side lane splits chunks. */
bool fc_ring_hops_ok(const fc_ring_args_t *a) {
  for (int k = 0; k < FC_RING_SIDE_LANES; k++)
    if (a->side[k].chunk_bytes) return false;
  if (a->hop_in < 0 || a->hop_in > FC_RING_SIDE_LANES || a->hop_out < 0 || a->hop_out > FC_RING_SIDE_LANES) return false;
  const fc_ring_side_t *in = a->hop_in ? &a->side[a->hop_in - 1] : nullptr;
  const fc_ring_side_t *out = a->hop_out ? &a->side[a->hop_out - 1] : nullptr;
  const bool in_ok = in ? in->area && in->ctr && in->ctr_prev : a->area && a->ctr && a->ctr_prev;
  const bool out_ok = out ? out->area_next && out->ctr && out->ctr_next && (!out->ce || (out->desc && out->sent && out->pub))
                          : a->area_next && a->ctr && a->ctr_next;
  const uintptr_t al = (uintptr_t)(in ? in->area : a->area) | (uintptr_t)(out ? out->area_next : a->area_next);
  return in_ok && out_ok && (al & 15u) == 0;
}

/* What every ring call needs, whatever its lanes. */
bool fc_ring_common_ok(const fc_ring_args_t *a) {
  return a->nranks >= 2 && a->rank >= 0 && a->rank < a->nranks && a->epoch && ((uintptr_t)a->epoch & 15u) == 0 &&
         (a->area_bytes & 15u) == 0 && a->blocks >= 1 && a->blocks <= FC_MAX_BLOCKS && a->subslots >= 2 &&
         a->subslots <= 8 && (!a->clk || (a->rec && ((uintptr_t)a->clk & 7u) == 0 && a->call));
}

/* nvlink: whether the NVLink lane carries bytes (without peer access it has no peer area and
 * the side lanes take whole chunks). */
bool fc_ring_args_ok(const fc_ring_args_t *a, bool nvlink) {
  if (!a || !fc_ring_common_ok(a)) return false;
  if (a->hops) return fc_ring_hops_ok(a);
  unsigned side_blocks = 0;
  for (int k = 0; k < FC_RING_SIDE_LANES; k++) {
    if (!fc_ring_side_ok(&a->side[k], a->blocks)) return false;
    if (a->side[k].chunk_bytes) side_blocks += a->side[k].blocks;
  }
  return (!nvlink || (a->area && a->area_next && a->ctr && a->ctr_next && a->ctr_prev && ((uintptr_t)a->area & 15u) == 0 &&
                      ((uintptr_t)a->area_next & 15u) == 0)) &&
         side_blocks < a->blocks + (nvlink ? 0u : 1u);
}

}  // namespace

extern "C" int fc_kernel_ring_collective(const fc_ring_args_t *args, fc_ring_coll_t coll, const void *sendbuf,
                                         void *recvbuf, size_t bytes, flexcoll_datatype_t dtype, flexcoll_op_t op,
                                         int root, flexcoll_stream_t stream) {
  const bool reduces = coll == FC_RING_ALLREDUCE || coll == FC_RING_REDUCE_SCATTER || coll == FC_RING_REDUCE;
  if ((unsigned)coll > FC_RING_REDUCE) return (int)cudaErrorInvalidValue;
  if (reduces && ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES || (unsigned)op >= FLEXCOLL_NUM_OPS))
    return (int)cudaErrorInvalidValue;
  if (bytes == 0) return (int)cudaSuccess; /* nothing launched, on every rank alike */
  if (!args || args->nranks < 2) return (int)cudaErrorInvalidValue;
  size_t sides = 0;
  for (int k = 0; k < FC_RING_SIDE_LANES; k++) sides += args->side[k].chunk_bytes;
  const bool nvlink = sides < fc_ring_chunk_bytes(coll, bytes, args->nranks);
  if (!fc_ring_args_ok(args, nvlink) || root < 0 || root >= args->nranks) return (int)cudaErrorInvalidValue;
  fc_ring_launch l = {args, {}, 0, op == FLEXCOLL_AVG && reduces, (cudaStream_t)stream};
  if (!fc_ring_plan(args, coll, bytes, root, &l.io, &l.grid)) return (int)cudaErrorInvalidValue;
  l.io.send = (const char *)sendbuf;
  l.io.recv = (char *)recvbuf;
  if (!reduces) return l.run<fc_ring_byte, fc_ring_byte, fc_op_sum>();
  return fc_dispatch(dtype, op, l);
}

namespace {
int fc_ring_visit_all(int *per_sm) {
  fc_ring_visit v;
  int e = fc_dispatch_all(v);
  if (!e) e = v.visit(fc_ring_kernel<fc_ring_byte, fc_ring_byte, fc_op_sum, false>);
  if (!e && per_sm) *per_sm = v.per_sm;
  return e;
}
}  // namespace

extern "C" int fc_kernels_preload_ring(void) { return fc_ring_visit_all(nullptr); }

extern "C" int fc_ring_pushes(fc_ring_coll_t coll, int rank, int nranks, int root) {
  switch (coll) {
    case FC_RING_ALLREDUCE: return 2 * nranks - 2;
    case FC_RING_ALLGATHER:
    case FC_RING_REDUCE_SCATTER: return nranks - 1;
    case FC_RING_BROADCAST: return ((rank - root) % nranks + nranks) % nranks < nranks - 1;
    default: return ((rank - root - 1) % nranks + nranks) % nranks < nranks - 1;
  }
}

extern "C" int fc_kernels_ring_blocks_per_sm(void) {
  int per_sm = 0;
  if (fc_ring_visit_all(&per_sm)) {
    cudaGetLastError();
    return 0;
  }
  return per_sm;
}
