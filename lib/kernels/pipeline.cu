/* pipeline.cu — pipelined allreduce, allgather, reduce_scatter and broadcast between 2 ranks for
 * messages above the one-shot limit whose buffers the peer cannot address (no windows): SM
 * stores into the peer's staging area, fused with the reduction or copy at the receiver, in
 * steps, so that the link stays busy while earlier steps are consumed (kernels.h has the
 * interface; the one-shot protocol it builds on is in oneshot.cuh).
 *
 * Per block b (both ranks split the message alike, fc_block_range) and step k of its part, with
 * S = pipe_subslots sub-slots per block:
 *  - push: wait until the peer has drained sub-slot k % S from step k - S
 *    (its `ack` counter for us), copy step k of our data into that sub-slot of our region of the
 *    peer's staging area, then raise the peer's `ready` counter for us to base + k + 1;
 *  - consume: wait until our `ready` counter from the peer reaches base + k + 1, reduce (or copy)
 *    the sub-slot into place, then raise the peer's `ack` counter to base + k + 1.
 * When a rank pushes and also has work at its end (a received step, or its own data to copy into
 * place: every case but a broadcast's in-place root and its other rank), each block is two
 * teams: its first pipe_push_threads threads (a quarter by default) push and the others do the
 * rest, each team at its own pace with its own named barrier, so the link stays busy while the
 * block reduces (one team doing both in turn left the link idle for the reduction's share of
 * every step; the reduction reads two streams and writes one, and with half the block it was
 * the slower team).  Otherwise the whole block is one team.  Counters only grow over the
 * communicator's life (base: the steps of all earlier pipelined calls, epoch->pipe_base, which
 * the last block of each call advances on the device: fc_epoch_end), so a wait is "at least",
 * and stale values from earlier calls never satisfy it.
 *
 * Sharing the staging area with the one-shot kernels (see the parity argument in oneshot.cuh):
 * a pipelined call first posts and waits for the one-shot flags of its seq, carrying no data,
 * so it writes nothing before every peer's previous kernel has finished; and it ends only once
 * the peer has drained everything it sent, so the next kernel, of either kind, may write any
 * slot of ours at once. */
#include "kernels/oneshot.cuh"

namespace {

/* Sub-slot j of this block in a staging area: the area's slots taken as one run of
 * gridDim.x x pipe_subslots steps (only the peer writes into it: fc_pipe_room_bytes). */
__device__ __forceinline__ char *fc_pipe_subslot(char *area, unsigned j, size_t step) {
  return area + ((size_t)j * gridDim.x + blockIdx.x) * step;
}

/* The threads of a block that work together: tid of n, synchronised by named barrier `bar`
 * (0: the whole block, __syncthreads). */
struct fc_pipe_team {
  unsigned tid, n, bar;
  __device__ __forceinline__ void sync() const {
    /* Constant barrier ids: with a register id ptxas reserves all 16 of them. */
    if (bar == 0) __syncthreads();
    else if (bar == 1) asm volatile("bar.sync 1, %0;" ::"r"(n) : "memory");
    else asm volatile("bar.sync 2, %0;" ::"r"(n) : "memory");
  }
};

/* The team's first thread waits until *gate >= gate_target (a shared-memory counter of the
 * block's other team; gate NULL: none) and then until *flag >= target (fc_poll), then a system
 * fence (the acquire side, as fc_wait); the team's later accesses come after it.  False in
 * every thread of the team after a timeout or abort (*error set). */
__device__ __forceinline__ bool fc_pipe_wait(const fc_oneshot_args_t &a, const fc_pipe_team &t, const uint64_t *flag,
                                             uint64_t target, unsigned *gate = nullptr,
                                             unsigned gate_target = 0) {
  __shared__ int ok_shared[3]; /* per barrier id */
  if (t.tid == 0) {
    const long long start = fc_now_ns();
    long long last_abort_check = start;
    int ok = 1;
    while (gate && atomicOr(gate, 0u) < gate_target)
      if (fc_wait_expired(a, start, &last_abort_check)) {
        ok = 0;
        break;
      }
    if (ok) ok = fc_poll(a, flag, target, start, &last_abort_check);
    if (!ok && a.error && *(volatile int *)a.error == 0) *(volatile int *)a.error = 1;
    __threadfence_system();
    ok_shared[t.bar] = ok;
  }
  t.sync();
  return ok_shared[t.bar] != 0;
}

/* Every access of the team so far, then its first thread stores v to a peer's counter (as
 * fc_post_flags: barrier, system fence, release store). */
__device__ __forceinline__ void fc_pipe_signal(const fc_pipe_team &t, uint64_t *flag, uint64_t v) {
  t.sync();
  if (t.tid == 0) {
    __threadfence_system();
    fc_st_release_sys(flag, v);
  }
}

/* n bytes src -> dst by the team: when both are 16-byte aligned, four 16-byte loads per thread
 * before their stores (the stores may go over NVLink: more of them in flight), else
 * fc_block_copy. */
__device__ __forceinline__ void fc_pipe_copy_bytes(const fc_pipe_team &t, char *dst, const char *src, size_t n) {
  if ((((uintptr_t)dst | (uintptr_t)src) & 15u) != 0) {
    fc_block_copy(dst, src, n, t.tid, t.n);
    return;
  }
  const size_t nvec = n / 16, stride = t.n;
  size_t i = t.tid;
  for (; i + 3 * stride < nvec; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = __ldcg((const uint4 *)src + i + j * stride);
#pragma unroll
    for (int j = 0; j < 4; j++) ((uint4 *)dst)[i + j * stride] = v[j];
  }
  for (; i < nvec; i += stride) ((uint4 *)dst)[i] = __ldcg((const uint4 *)src + i);
  for (size_t b = nvec * 16 + t.tid; b < n; b += stride) dst[b] = (char)fc_ld_cg<unsigned char>(src + b);
}

/* What a rank does in a pipelined call. */
struct fc_pipe_io {
  const char *push; /* our data for the peer, [lo, hi) of it per block; NULL: we send nothing */
  bool receive;     /* whether the peer pushes to us */
  const char *own;  /* reduce: our operand; copy: a local source for own_out (NULL: none) */
  char *own_out;    /* copy: where own goes */
  char *out;        /* where the received data (reduced with own, or copied) goes */
  size_t bytes;     /* of the message that is split into blocks and steps */
};

/* Consumers of one step: n bytes at offset off of the message, the peer's in `slot`. */
template <typename V, typename D, class Op, bool AVG> struct fc_pipe_reduce {
  /* out = rank 0's operand op rank 1's (both ranks get bitwise the same), AVG halved. */
  __device__ __forceinline__ void operator()(const fc_oneshot_args_t &a, const fc_pipe_team &t, const fc_pipe_io &io,
                                             const char *slot, size_t off, size_t n) const {
    typedef fc_vec<V> vec;
    const char *own = io.own + off;
    char *out = io.out + off;
    const bool own_first = a.rank == 0;
    const typename fc_divisor<D>::type dn = (typename fc_divisor<D>::type)a.nranks;
    const size_t vend = (((uintptr_t)own | (uintptr_t)out) & 15u) == 0 ? n & ~(size_t)15 : 0;
    /* Two vectors per thread and round: all four loads before the arithmetic. */
    const size_t stride = 16 * (size_t)t.n;
    size_t i = 16 * (size_t)t.tid;
    for (; i < vend; i += 2 * stride) {
      const bool two = i + stride < vend;
      const vec x0 = fc_vec_ld_cg<V>(own + i), y0 = fc_vec_ld_cg<V>(slot + i);
      vec x1 = x0, y1 = y0;
      if (two) x1 = fc_vec_ld_cg<V>(own + i + stride), y1 = fc_vec_ld_cg<V>(slot + i + stride);
      *(uint4 *)(out + i) = combine(x0, y0, own_first, dn).raw;
      if (two) *(uint4 *)(out + i + stride) = combine(x1, y1, own_first, dn).raw;
    }
    for (size_t i = vend + sizeof(V) * t.tid; i < n; i += sizeof(V) * t.n) {
      const V x = fc_ld_cg<V>(own + i), y = fc_ld_cg<V>(slot + i);
      V acc = own_first ? Op::apply(x, y) : Op::apply(y, x);
      if (AVG) acc = fc_avg<V, D>(acc, dn);
      *(V *)(out + i) = acc;
    }
  }
  static __device__ __forceinline__ fc_vec<V> combine(const fc_vec<V> &own, const fc_vec<V> &peer, bool own_first,
                                                      typename fc_divisor<D>::type dn) {
    fc_vec<V> acc = own_first ? fc_vec_apply<V, Op>(own, peer) : fc_vec_apply<V, Op>(peer, own);
    if (AVG)
#pragma unroll
      for (int j = 0; j < fc_vec<V>::N; j++) acc.e[j] = fc_avg<V, D>(acc.e[j], dn);
    return acc;
  }
  static constexpr bool copies_own = false;
};
struct fc_pipe_copy {
  __device__ __forceinline__ void operator()(const fc_oneshot_args_t &, const fc_pipe_team &t, const fc_pipe_io &io,
                                             const char *slot, size_t off, size_t n) const {
    fc_pipe_copy_bytes(t, io.out + off, slot, n);
  }
  static constexpr bool copies_own = true;
};

template <class Consume>
__device__ __forceinline__ void fc_pipe_run(const fc_oneshot_args_t &a, const fc_pipe_io &io, const Consume &consume,
                                            size_t nsteps) {
  const int par = (int)(fc_seq() & 1), peer = 1 - a.rank;
  __shared__ unsigned pushed_steps;
  if (threadIdx.x == 0) pushed_steps = 0;
  /* The peer's kernel of this call has started: its earlier ones are done with our data. */
  fc_post_flags(a, par, fc_seq());
  if (!fc_wait(a, par, fc_seq())) return;
  size_t lo, hi;
  fc_block_range(io.bytes, &lo, &hi);
  const unsigned subslots = a.pipe_subslots;
  const size_t step = fc_pipe_step_bytes(io.bytes, a.slot_bytes, gridDim.x, subslots);
  uint64_t *mine = fc_pick(a.flags, a.rank), *theirs = fc_pick(a.flags, peer);
  char *local = fc_pick(a.stage, a.rank), *remote = fc_pick(a.stage, peer);
  /* Bytes [*o, *o + *n) of the message in step k of this block. */
  auto span = [&](size_t k, size_t *o, size_t *n) {
    const size_t s = lo + k * step < hi ? lo + k * step : hi, e = s + step < hi ? s + step : hi;
    *o = s;
    *n = e - s;
  };
  /* Two teams (the first pipe_push_threads threads and the others) when we push and also
   * receive or copy our own data into place (a broadcast's root out of place), else one. */
  const bool copies_own = Consume::copies_own && io.own && io.own != io.own_out;
  const bool split = io.push && (io.receive || copies_own);
  /* In place (allreduce with sendbuf == recvbuf), the consumers must not write step k before
   * the pushers have read it: they wait for the pushers' count of steps sent (this call's, in
   * shared memory, zeroed before the handshake's barriers). */
  const bool gated = split && io.out < io.push + io.bytes && io.push < io.out + io.bytes;
  unsigned *gate = gated ? &pushed_steps : nullptr;
  const unsigned npush = a.pipe_push_threads;
  const bool pusher = split ? threadIdx.x < npush : io.push != nullptr, consumer = !split || !pusher;
  const fc_pipe_team team = !split ? fc_pipe_team{threadIdx.x, blockDim.x, 0}
                            : pusher ? fc_pipe_team{threadIdx.x, npush, 1}
                                     : fc_pipe_team{threadIdx.x - npush, blockDim.x - npush, 2};
  for (size_t k = 0; k < nsteps; k++) {
    size_t o, n;
    span(k, &o, &n);
    if (pusher) {
      if (k >= subslots &&
          !fc_pipe_wait(a, team, fc_pipe_flag(a, mine, 1, peer), fc_pipe_base() + k - subslots + 1))
        return;
      fc_pipe_copy_bytes(team, fc_pipe_subslot(remote, (unsigned)(k % subslots), step), io.push + o, n);
      fc_pipe_signal(team, fc_pipe_flag(a, theirs, 0, a.rank), fc_pipe_base() + k + 1);
      if (gated && team.tid == 0) {
        /* The team's loads of step k are done (the barrier in the signal).  Atomics, not
         * volatile accesses: the teams share no barrier, and racecheck counts those as races. */
        __threadfence_block();
        atomicExch(&pushed_steps, (unsigned)k + 1);
      }
    }
    if (!consumer) continue;
    if (copies_own) fc_pipe_copy_bytes(team, io.own_out + o, io.own + o, n);
    if (!io.receive) continue;
    if (!fc_pipe_wait(a, team, fc_pipe_flag(a, mine, 0, peer), fc_pipe_base() + k + 1, gate, (unsigned)k + 1)) return;
    consume(a, team, io, fc_pipe_subslot(local, (unsigned)(k % subslots), step), o, n);
    fc_pipe_signal(team, fc_pipe_flag(a, theirs, 1, a.rank), fc_pipe_base() + k + 1);
  }
  /* Everything we sent has been drained (see the top of the file). */
  if (pusher) fc_pipe_wait(a, team, fc_pipe_flag(a, mine, 1, peer), fc_pipe_base() + nsteps);
}

/* A whole pipelined call: the epoch read, then at once counted and (by the last block) advanced
 * by the call's steps (the same in every block and on every rank: they depend on the size and
 * the grid only), then the run, whichever way it ends.  Counting before the run rather than
 * after it: any code after the run's divergent exits (team barriers, early returns) took
 * ptxas from 39-52 registers to 64 with spills; counting first needs no common exit at all,
 * and every block has read the epoch by then, which is all fc_epoch_end requires. */
template <class Consume> __device__ __forceinline__ void fc_pipe_call(const fc_oneshot_args_t &a, const fc_pipe_io &io) {
  fc_epoch_begin(a);
  const size_t nsteps = fc_pipe_steps(io.bytes, a.slot_bytes, gridDim.x, a.pipe_subslots);
  fc_epoch_end(a, nsteps);
  fc_pipe_run(a, io, Consume(), nsteps);
}

/* THREADS: 512 or 1024 per block (pipe_threads); the grid is pipe_blocks. */
template <typename V, typename D, class Op, bool AVG, unsigned THREADS>
__global__ void __launch_bounds__(THREADS) fc_pipe_reduce_kernel(const fc_oneshot_args_t a, fc_pipe_io io) {
  fc_pipe_call<fc_pipe_reduce<V, D, Op, AVG> >(a, io);
}

template <unsigned THREADS>
__global__ void __launch_bounds__(THREADS) fc_pipe_copy_kernel(const fc_oneshot_args_t a, fc_pipe_io io) {
  fc_pipe_call<fc_pipe_copy>(a, io);
}

struct fc_pipe_reduce_launch {
  const fc_oneshot_args_t *args;
  fc_pipe_io io;
  bool avg;
  cudaStream_t stream;
  template <typename V, typename D, class Op> int run() {
    if ((((uintptr_t)io.push | (uintptr_t)io.own | (uintptr_t)io.out) & (sizeof(V) - 1)) || io.bytes % sizeof(V))
      return (int)cudaErrorInvalidValue;
    const unsigned g = args->pipe_blocks;
    if (args->pipe_threads == 1024) {
      if (avg) fc_pipe_reduce_kernel<V, D, Op, true, 1024><<<g, 1024, 0, stream>>>(*args, io);
      else fc_pipe_reduce_kernel<V, D, Op, false, 1024><<<g, 1024, 0, stream>>>(*args, io);
    } else {
      if (avg) fc_pipe_reduce_kernel<V, D, Op, true, 512><<<g, 512, 0, stream>>>(*args, io);
      else fc_pipe_reduce_kernel<V, D, Op, false, 512><<<g, 512, 0, stream>>>(*args, io);
    }
    return (int)cudaGetLastError();
  }
};

struct fc_pipe_preload {
  template <typename V, typename D, class Op> int run() {
    cudaFuncAttributes a;
    int e = (int)cudaFuncGetAttributes(&a, fc_pipe_reduce_kernel<V, D, Op, true, 512>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_pipe_reduce_kernel<V, D, Op, false, 512>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_pipe_reduce_kernel<V, D, Op, true, 1024>);
    return e ? e : (int)cudaFuncGetAttributes(&a, fc_pipe_reduce_kernel<V, D, Op, false, 1024>);
  }
};

/* What the kernels assume of the arguments (the one-shot ones, 2 ranks, their shape, room for
 * the steps). */
bool fc_pipe_args_ok(const fc_oneshot_args_t *a) {
  return fc_args_ok(a, 0) && a->nranks == 2 && a->pipe_blocks >= 1 && a->pipe_blocks <= FC_MAX_BLOCKS &&
         (a->pipe_threads == 512 || a->pipe_threads == 1024) && (a->pipe_subslots == 2 || a->pipe_subslots == 4) &&
         a->pipe_push_threads % 32 == 0 && a->pipe_push_threads >= 32 && a->pipe_push_threads <= a->pipe_threads - 32 &&
         fc_pipe_room_bytes(a->slot_bytes, a->pipe_blocks, a->pipe_subslots) >= FC_PIPE_MIN_STEP_BYTES;
}

}  // namespace

extern "C" int fc_kernel_pipe_collective(const fc_oneshot_args_t *args, fc_pipe_coll_t coll, const void *sendbuf,
                                         void *recvbuf, size_t bytes, flexcoll_datatype_t dtype, flexcoll_op_t op,
                                         int root, flexcoll_stream_t stream) {
  const bool reduces = coll == FC_PIPE_ALLREDUCE || coll == FC_PIPE_REDUCE_SCATTER;
  if (reduces && ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES || (unsigned)op >= FLEXCOLL_NUM_OPS))
    return (int)cudaErrorInvalidValue;
  if (bytes == 0) return (int)cudaSuccess;
  if (!fc_pipe_args_ok(args) || root < 0 || root > 1) return (int)cudaErrorInvalidValue;
  const int me = args->rank, peer = 1 - me;
  const char *send = (const char *)sendbuf;
  char *recv = (char *)recvbuf;
  cudaStream_t s = (cudaStream_t)stream;
  fc_pipe_io io = {send, true, send, nullptr, recv, bytes};
  switch (coll) {
    case FC_PIPE_ALLREDUCE:
      break;
    case FC_PIPE_REDUCE_SCATTER: /* the peer's chunk to the peer, ours reduced into recv */
      io.push = send + (size_t)peer * bytes;
      io.own = send + (size_t)me * bytes;
      break;
    case FC_PIPE_ALLGATHER:      /* ours to the peer and into our block of recv; theirs into theirs */
      io.own_out = recv + (size_t)me * bytes;
      io.out = recv + (size_t)peer * bytes;
      break;
    case FC_PIPE_BROADCAST:      /* the root pushes (and copies its own); the other receives */
      if (me == root) {
        io.receive = false;
        io.own_out = recv;
      } else {
        io.push = nullptr;
        io.own = nullptr;
      }
      break;
    default:
      return (int)cudaErrorInvalidValue;
  }
  if (!reduces) {
    if (args->pipe_threads == 1024) fc_pipe_copy_kernel<1024><<<args->pipe_blocks, 1024, 0, s>>>(*args, io);
    else fc_pipe_copy_kernel<512><<<args->pipe_blocks, 512, 0, s>>>(*args, io);
    return (int)cudaGetLastError();
  }
  fc_pipe_reduce_launch l = {args, io, op == FLEXCOLL_AVG, s};
  return fc_dispatch(dtype, op, l);
}

extern "C" int fc_kernels_preload_pipeline(void) {
  fc_pipe_preload p;
  int e = fc_dispatch_all(p);
  cudaFuncAttributes a;
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_pipe_copy_kernel<512>);
  return e ? e : (int)cudaFuncGetAttributes(&a, fc_pipe_copy_kernel<1024>);
}
