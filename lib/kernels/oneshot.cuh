/* oneshot.cuh — what the one-shot kernels share (oneshot.cu: allreduce and allgather;
 * oneshot_rs.cu: reduce_scatter and broadcast; kernels.h has the C interface).
 *
 * Protocol, per block b of the grid (fc_oneshot_grid; every rank splits the message identically):
 *  1. post: copy this rank's bytes [lo, hi) of sendbuf into slot `rank` (parity seq&1) of every
 *     peer's staging area; __syncthreads; thread 0 fences at system scope and stores seq into
 *     flag [parity][rank][b] of every peer with a release store.
 *  2. wait: thread 0 polls this rank's own flags [parity][q][b] until each reaches seq, bounded
 *     by timeout_ns of the global timer; on timeout it stores 1 to *error and the whole block
 *     skips to its end (fc_epoch_end, which every block reaches on every path).  After the
 *     flags a system fence orders the slot reads after them.
 *  3. combine: allreduce reduces [lo, hi) over ranks 0..n-1 in that order (own values from
 *     sendbuf, the others from the local slots) so every rank computes bitwise the same
 *     result; allgather copies each rank's [lo, hi) to recvbuf.
 * reduce_scatter posts each peer only its chunk and reduces its own; broadcast posts the root's
 * data, and the other ranks post their flags alone (oneshot_rs.cu).
 *
 * seq comes from the device (fc_dev_epoch_t in kernels.h): every block reads epoch->seq + 1 at
 * its start (fc_epoch_begin, into shared memory) and the last block to count itself stores it
 * back (fc_epoch_end: at the kernel's end, on every exit path, timeouts included).  So a kernel replayed from a CUDA
 * graph takes the next number, as an eagerly launched one does, and eager and replayed calls
 * share one sequence.
 *
 * Why two parities suffice (what the host must guarantee): a rank's one-shot kernels run one
 * after another (same stream, or otherwise ordered), so seq grows by exactly 1 per kernel that
 * runs, on every rank alike as long as the ranks run the same calls.  Then when rank r writes
 * parity P for seq, its kernel seq-1 has seen a flag of each peer's kernel seq-1, which started
 * only after that peer's kernel seq-2 (the previous reader of parity P) had finished.  A call
 * that launches nothing (count 0) must not consume a seq number (it does not: no kernel, no
 * epoch advance).  After a timeout the staging area's state is unknown: abort the communicator
 * (or re-zero the flags and the epoch on every rank).
 */
#ifndef FC_KERNELS_ONESHOT_CUH
#define FC_KERNELS_ONESHOT_CUH

#include <stdint.h>

#include "kernels/ops.cuh"

namespace {

constexpr unsigned FC_OS_THREADS = 512;

/* Byte offset of slot q of parity `par` in a staging area (slot_bytes is a multiple of 16). */
__device__ __forceinline__ size_t fc_slot_off(const fc_oneshot_args_t &a, int par, int q) {
  return ((size_t)par * (size_t)a.nranks + (size_t)q) * a.slot_bytes;
}
/* Word index of flag [par][q][b]. */
__device__ __forceinline__ size_t fc_flag_idx(const fc_oneshot_args_t &a, int par, int q, int b) {
  return ((size_t)par * (size_t)a.nranks + (size_t)q) * FC_MAX_BLOCKS + (size_t)b;
}

/* Counters after the one-shot flags, of the pipelined (pipeline.cu) and alltoall (alltoall.cu)
 * kernels: [kind][sender][block] (kind 0: ready, 1: ack), this block's. */
__device__ __forceinline__ uint64_t *fc_pipe_flag(const fc_oneshot_args_t &a, uint64_t *flags, int kind, int sender) {
  return flags + ((size_t)(2 + kind) * (size_t)a.nranks + (size_t)sender) * FC_MAX_BLOCKS + blockIdx.x;
}

/* Block b's bytes [lo, hi): 16-byte granules split evenly, so bounds are element aligned and
 * vector aligned relative to the buffer start. */
__device__ __forceinline__ void fc_block_range(size_t bytes, size_t *lo, size_t *hi) {
  const size_t granules = (bytes + 15) / 16;
  const size_t per = (granules + gridDim.x - 1) / gridDim.x;
  const size_t l = (size_t)blockIdx.x * per * 16, h = l + per * 16;
  *lo = l < bytes ? l : bytes;
  *hi = h < bytes ? h : bytes;
}

__device__ __forceinline__ void fc_st_release_sys(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t fc_ld_volatile(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/* This block's call (kernels.h, fc_dev_epoch_t): its seq and its counters' base, set by
 * fc_epoch_begin.  At a fixed shared address and read where used (fc_seq, fc_pipe_base), not
 * held in registers from the kernel's start to its end (fc_epoch_end): the pipelined kernels
 * are at their register budget, and values live across their loops pushed it over. */
__shared__ unsigned long long fc_epoch_shared[2];
__device__ __forceinline__ uint64_t fc_seq() { return *(volatile unsigned long long *)&fc_epoch_shared[0]; }
__device__ __forceinline__ uint64_t fc_pipe_base() { return *(volatile unsigned long long *)&fc_epoch_shared[1]; }

/* Every block's first step: thread 0 reads the epoch (one 16-byte load, bypassing L1 where an
 * earlier kernel's line could linger) for the whole block.  The barrier puts every thread's use
 * of the numbers after the read, hence before this block's fc_epoch_end, and the epoch changes
 * only once every block has passed it. */
__device__ __forceinline__ void fc_epoch_begin(const fc_oneshot_args_t &a) {
  if (threadIdx.x == 0) {
    unsigned long long s, b;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(s), "=l"(b) : "l"(a.epoch) : "memory");
    fc_epoch_shared[0] = s + 1;
    fc_epoch_shared[1] = b;
  }
  __syncthreads();
}

/* Once per block, after fc_epoch_begin, on every path: the one-shot kernels at their end (no
 * barrier: a block's threads may have left their loops at different points), the pipelined
 * ones right after the read (pipeline.cu says why).  Thread 0 counts its block; the last block
 * advances the epoch for the next call, pipe_base by the call's pipelined steps (0 for
 * one-shot; the same in every block and on every rank).  The epoch must change only once
 * every block has read it, which the count ensures wherever it stands after the read.
 * The fences order the reads of the epoch at the start of every block (release side, with the
 * counting atomic) before the last block's stores (acquire side), so no block can read the
 * advanced values.  The next kernel sees the stores: it starts after this one has completed. */
__device__ __forceinline__ void fc_epoch_end(const fc_oneshot_args_t &a, uint64_t pipe_steps) {
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(&a.epoch->done, 1u) != gridDim.x - 1) return;
  __threadfence();
  atomicExch(&a.epoch->done, 0u);
  *(volatile unsigned long long *)&a.epoch->pipe_base = fc_pipe_base() + pipe_steps;
  *(volatile unsigned long long *)&a.epoch->seq = fc_seq();
}

/* arr[i] for a runtime i, with constant indices only: indexing a kernel parameter's array
 * with a runtime index would copy the whole parameter block to local memory. */
template <typename P> __device__ __forceinline__ P fc_pick(P const (&arr)[FC_ONESHOT_MAX_RANKS], int i) {
  P r = arr[0];
#pragma unroll
  for (int p = 1; p < FC_ONESHOT_MAX_RANKS; p++)
    if (p == i) r = arr[p];
  return r;
}

/* Copy n bytes from src to the same offset of every peer's slot, in units of U (src's
 * alignment; the peers' slots are 16-byte aligned), the rest bytewise.  Each unit is loaded
 * once and stored to all peers (constant peer indices, see fc_pick). */
template <typename U>
__device__ __forceinline__ void fc_fanout(const fc_oneshot_args_t &a, size_t dst_off, const char *src, size_t n) {
  const size_t nunits = n / sizeof(U);
  for (size_t i = threadIdx.x; i < nunits; i += blockDim.x) {
    const U v = ((const U *)src)[i];
#pragma unroll
    for (int p = 0; p < FC_ONESHOT_MAX_RANKS; p++)
      if (p < a.nranks && p != a.rank) ((U *)(a.stage[p] + dst_off))[i] = v;
  }
  for (size_t i = nunits * sizeof(U) + threadIdx.x; i < n; i += blockDim.x) {
    const char v = src[i];
#pragma unroll
    for (int p = 0; p < FC_ONESHOT_MAX_RANKS; p++)
      if (p < a.nranks && p != a.rank) a.stage[p][dst_off + i] = v;
  }
}

/* This block's flag to every peer, once its data stores are issued.  All threads' data stores
 * precede thread 0's fence (bar.sync orders them at block scope, the system-scope fence and
 * release store are cumulative), so a peer that sees the flag sees the data. */
__device__ __forceinline__ void fc_post_flags(const fc_oneshot_args_t &a, int par, uint64_t seq) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
#pragma unroll
    for (int p = 0; p < FC_ONESHOT_MAX_RANKS; p++)
      if (p < a.nranks && p != a.rank) fc_st_release_sys(a.flags[p] + fc_flag_idx(a, par, a.rank, blockIdx.x), seq);
  }
}

/* Step 1: this block's part of sendbuf to every peer (send NULL: no data, a broadcast's
 * non-root), then its flag to every peer. */
__device__ __forceinline__ void fc_post(const fc_oneshot_args_t &a, int par, uint64_t seq, const char *send, size_t lo,
                                        size_t hi) {
  if (!send) {
    fc_post_flags(a, par, seq);
    return;
  }
  const size_t off = fc_slot_off(a, par, a.rank) + lo;
  const char *src = send + lo;
  const uintptr_t al = (uintptr_t)src;
  if ((al & 15u) == 0) fc_fanout<uint4>(a, off, src, hi - lo);
  else if ((al & 7u) == 0) fc_fanout<uint2>(a, off, src, hi - lo);
  else if ((al & 3u) == 0) fc_fanout<unsigned int>(a, off, src, hi - lo);
  else fc_fanout<unsigned char>(a, off, src, hi - lo);
  fc_post_flags(a, par, seq);
}

/* The abort word (*error, host memory mapped into the GPU, written by fc_gpu_comm_abort) is
 * read at most once per FC_ABORT_CHECK_NS of a wait, never in the first one:
 * each read is a round trip over PCIe, and when every block's poll read it on each spin the
 * reads queued behind one another (~1 us per block and call, a whole measurement at a time,
 * while the two ranks ran a few microseconds out of step).  An abort may wait that long. */
constexpr long long FC_ABORT_CHECK_NS = 500000;

/* The GPU's global timer in nanoseconds, the same on every SM.  Not clock64: that counts one
 * SM's cycles, and a block that time-slicing between processes takes off the GPU may resume
 * on another SM, whose counter is unrelated; a wait measured across that switch could end at
 * once, and the kernel give up on a peer that was on its way. */
__device__ __forceinline__ long long fc_now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return (long long)t;
}

/* True once a wait begun at `start` must give up: the global timer has run past the deadline, or the
 * host has aborted the communicator (*error == 2).  *last_abort_check starts at start.
 * A: any kernel arguments with timeout_ns and error (fc_oneshot_args_t, fc_ring_args_t). */
template <class A>
__device__ __forceinline__ bool fc_wait_expired(const A &a, long long start, long long *last_abort_check) {
  const long long now = fc_now_ns();
  if ((uint64_t)(now - start) > a.timeout_ns) return true;
  if (now - *last_abort_check < FC_ABORT_CHECK_NS) return false;
  *last_abort_check = now;
  return a.error && *(const volatile int *)a.error == 2;
}

/* Thread 0 polls one flag until it reaches target (flags only grow: a one-shot flag holds the
 * seq of an earlier call until this one's arrives); false once the wait expired
 * (fc_wait_expired).  Tight polling first (latency), then __nanosleep with doubling backoff up
 * to 256 ns. */
template <class A>
__device__ __forceinline__ bool fc_poll(const A &a, const uint64_t *flag, uint64_t target, long long start,
                                        long long *last_abort_check) {
  unsigned spins = 0, ns = 32;
  while (fc_ld_volatile(flag) < target) {
    if (fc_wait_expired(a, start, last_abort_check)) return false;
    if (++spins > 64) {
      __nanosleep(ns);
      if (ns < 256) ns *= 2;
    }
  }
  return true;
}

/* Step 2.  Returns false (in every thread) when a peer did not arrive in time. */
__device__ __forceinline__ bool fc_wait(const fc_oneshot_args_t &a, int par, uint64_t seq) {
  __shared__ int ok_shared;
  if (threadIdx.x == 0) {
    const long long start = fc_now_ns();
    long long last_abort_check = start;
    const uint64_t *mine = fc_pick(a.flags, a.rank);
    int ok = 1;
    for (int q = 0; q < a.nranks && ok; q++)
      if (q != a.rank) ok = fc_poll(a, mine + fc_flag_idx(a, par, q, blockIdx.x), seq, start, &last_abort_check);
    /* A timeout says so; an abort (2) is left as it is. */
    if (!ok && a.error && *(volatile int *)a.error == 0) *(volatile int *)a.error = 1;
    /* Acquire side: the block's slot reads (after the barrier below) come after the flags
     * were seen; on timeout it pushes the error word out to the host. */
    __threadfence_system();
    ok_shared = ok;
  }
  __syncthreads();
  return ok_shared != 0;
}

/* Where rank q's values are read from: sendbuf for this rank, else the local slot
 * (local: this rank's staging area). */
__device__ __forceinline__ const char *fc_src(const fc_oneshot_args_t &a, int par, const char *send,
                                              const char *local, int q) {
  return q == a.rank ? send : local + fc_slot_off(a, par, q);
}

/* AVG's final division of one element: in the datatype's own type D (V has D's bits). */
template <typename V, typename D> __device__ __forceinline__ V fc_avg(V v, typename fc_divisor<D>::type dn) {
  D d;
  memcpy(&d, &v, sizeof d);
  d = fc_div(d, dn);
  memcpy(&v, &d, sizeof v);
  return v;
}

/* Step 3 of allreduce: recv[lo, hi) = op over ranks in order, optionally divided by nranks. */
template <typename V, typename D, class Op, bool AVG>
__device__ __forceinline__ void fc_combine(const fc_oneshot_args_t &a, int par, const char *send, char *recv,
                                           size_t lo, size_t hi) {
  typedef fc_vec<V> vec;
  const char *local = fc_pick(a.stage, a.rank);
  const typename fc_divisor<D>::type dn = (typename fc_divisor<D>::type)a.nranks;
  /* Slots are 16-byte aligned and lo is a multiple of 16: vectors when both user buffers are. */
  const bool vector = (((uintptr_t)send | (uintptr_t)recv) & 15u) == 0;
  const size_t vend = vector ? lo + ((hi - lo) & ~(size_t)15) : lo;
  for (size_t off = lo + 16 * (size_t)threadIdx.x; off < vend; off += 16 * (size_t)blockDim.x) {
    vec acc = fc_vec_ld_cg<V>(fc_src(a, par, send, local, 0) + off);
#pragma unroll
    for (int q = 1; q < FC_ONESHOT_MAX_RANKS; q++)
      if (q < a.nranks) acc = fc_vec_apply<V, Op>(acc, fc_vec_ld_cg<V>(fc_src(a, par, send, local, q) + off));
    if (AVG)
#pragma unroll
      for (int j = 0; j < vec::N; j++) acc.e[j] = fc_avg<V, D>(acc.e[j], dn);
    *(uint4 *)(recv + off) = acc.raw;
  }
  for (size_t off = vend + sizeof(V) * threadIdx.x; off < hi; off += sizeof(V) * blockDim.x) {
    V acc = fc_ld_cg<V>(fc_src(a, par, send, local, 0) + off);
#pragma unroll
    for (int q = 1; q < FC_ONESHOT_MAX_RANKS; q++)
      if (q < a.nranks) acc = Op::apply(acc, fc_ld_cg<V>(fc_src(a, par, send, local, q) + off));
    if (AVG) acc = fc_avg<V, D>(acc, dn);
    *(V *)(recv + off) = acc;
  }
}


/* n bytes src -> dst by threads tid of nthreads (the block, or part of it), in the widest unit
 * both are aligned to (L2 loads). */
template <typename U>
__device__ __forceinline__ void fc_block_copy_units(char *dst, const char *src, size_t n, unsigned tid, unsigned nthreads) {
  const size_t nunits = n / sizeof(U);
  for (size_t i = tid; i < nunits; i += nthreads) ((U *)dst)[i] = fc_ld_cg<U>(src + i * sizeof(U));
  for (size_t i = nunits * sizeof(U) + tid; i < n; i += nthreads) dst[i] = (char)fc_ld_cg<unsigned char>(src + i);
}
__device__ __forceinline__ void fc_block_copy(char *dst, const char *src, size_t n, unsigned tid = threadIdx.x,
                                              unsigned nthreads = blockDim.x) {
  const uintptr_t al = (uintptr_t)dst | (uintptr_t)src;
  if ((al & 15u) == 0) fc_block_copy_units<uint4>(dst, src, n, tid, nthreads);
  else if ((al & 7u) == 0) fc_block_copy_units<uint2>(dst, src, n, tid, nthreads);
  else if ((al & 3u) == 0) fc_block_copy_units<unsigned int>(dst, src, n, tid, nthreads);
  else fc_block_copy_units<unsigned char>(dst, src, n, tid, nthreads);
}

/* ---- LL (low-latency) variant, for messages up to a.ll_max bytes per rank ----
 * A 16-byte line carries 8 bytes of data and the call's flag twice, {d0, flag, d1, flag},
 * written with one 16-byte volatile store; each 8-byte half arrives whole (NCCL's LL protocol
 * relies on the same), so a reader that sees both flags equal to (uint32_t)seq has both data
 * words of this call.  The readers poll the lines themselves: no fence and no separate flag
 * round trip, which is what the plain one-shot kernel pays per block.  The lines double the
 * bytes on the link, hence the size limit.  Each thread owns 16 data bytes (2 lines) of every
 * rank: it posts its own unit to every peer, then polls the peers' units at the same index.
 * The LL area is apart from the plain slots: stale plain data there could look like a flag.
 * Parity and reuse follow the same argument as the plain kernels (one epoch for both). */

__device__ __forceinline__ void fc_ll_store(uint4 *p, uint32_t d0, uint32_t d1, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag), "r"(d1), "r"(flag)
               : "memory");
}
__device__ __forceinline__ uint4 fc_ll_load(const uint4 *p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

/* Line pair of unit u in the slot that `sender` fills, parity par, of the LL area `area`. */
__device__ __forceinline__ uint4 *fc_ll_lines(const fc_oneshot_args_t &a, char *area, int par, int sender, size_t u) {
  const size_t slot_lines = a.ll_max / 8; /* 2 lines per 16 data bytes */
  return (uint4 *)area + ((size_t)par * (size_t)a.nranks + (size_t)sender) * slot_lines + 2 * u;
}

/* Wait for both lines to carry flag and return their 16 data bytes; false once the wait
 * expired (fc_wait_expired). */
__device__ __forceinline__ bool fc_ll_read(const fc_oneshot_args_t &a, const uint4 *lines, uint32_t flag, long long start,
                                           uint4 *out) {
  uint4 l0 = fc_ll_load(lines), l1 = fc_ll_load(lines + 1);
  unsigned spins = 0;
  long long last_abort_check = start;
  while (l0.y != flag || l0.w != flag || l1.y != flag || l1.w != flag) {
    if (++spins > 256) {
      spins = 0;
      if (fc_wait_expired(a, start, &last_abort_check)) return false;
    }
    if (l0.y != flag || l0.w != flag) l0 = fc_ll_load(lines);
    if (l1.y != flag || l1.w != flag) l1 = fc_ll_load(lines + 1);
  }
  *out = make_uint4(l0.x, l0.z, l1.x, l1.z);
  return true;
}

__device__ __forceinline__ void fc_ll_timed_out(const fc_oneshot_args_t &a) {
  if (a.error && *(volatile int *)a.error == 0) *(volatile int *)a.error = 1;
  __threadfence_system();
}

/* Bytes [off, off + 16) of buf clipped to n (zeros beyond), in one load when whole and aligned. */
__device__ __forceinline__ uint4 fc_load16(const char *buf, size_t off, size_t n) {
  if (off + 16 <= n && ((uintptr_t)(buf + off) & 15u) == 0) return *(const uint4 *)(buf + off);
  uint4 v = make_uint4(0, 0, 0, 0);
  unsigned char *c = (unsigned char *)&v;
  for (int i = 0; i < 16 && off + i < n; i++) c[i] = (unsigned char)buf[off + i];
  return v;
}
__device__ __forceinline__ void fc_store16(char *buf, size_t off, size_t n, uint4 v) {
  if (off + 16 <= n && ((uintptr_t)(buf + off) & 15u) == 0) {
    *(uint4 *)(buf + off) = v;
    return;
  }
  const unsigned char *c = (const unsigned char *)&v;
  for (int i = 0; i < 16 && off + i < n; i++) buf[off + i] = (char)c[i];
}

/* Unit u of a reduction in rank order 0..n-1 (as the plain kernels: every rank gets bitwise the
 * same result): ours is `own`, each peer's comes from its LL lines in our area `local`; AVG
 * divides at the end.  False after a timeout or abort (reported through *error). */
template <typename V, typename D, class Op, bool AVG>
__device__ __forceinline__ bool fc_ll_reduce_unit(const fc_oneshot_args_t &a, const char *local, int par, size_t u,
                                                  uint32_t flag, long long start, fc_vec<V> own, fc_vec<V> *out) {
  fc_vec<V> acc = own;
#pragma unroll
  for (int q = 0; q < FC_ONESHOT_MAX_RANKS; q++) {
    if (q >= a.nranks) break;
    fc_vec<V> v = own;
    if (q != a.rank && !fc_ll_read(a, fc_ll_lines(a, (char *)local, par, q, u), flag, start, &v.raw)) {
      fc_ll_timed_out(a);
      return false;
    }
    acc = q == 0 ? v : fc_vec_apply<V, Op>(acc, v);
  }
  if (AVG) {
    const typename fc_divisor<D>::type dn = (typename fc_divisor<D>::type)a.nranks;
#pragma unroll
    for (int j = 0; j < fc_vec<V>::N; j++) acc.e[j] = fc_avg<V, D>(acc.e[j], dn);
  }
  *out = acc;
  return true;
}

/* Post our 16 bytes of unit u to every peer. */
__device__ __forceinline__ void fc_ll_post(const fc_oneshot_args_t &a, int par, size_t u, uint4 v, uint32_t flag) {
#pragma unroll
  for (int p = 0; p < FC_ONESHOT_MAX_RANKS; p++)
    if (p < a.nranks && p != a.rank) {
      uint4 *dst = fc_ll_lines(a, a.ll[p], par, a.rank, u);
      fc_ll_store(dst, v.x, v.y, flag);
      fc_ll_store(dst + 1, v.z, v.w, flag);
    }
}

/* The LL grid: one thread per 16 bytes, up to the plain kernels' cap (every rank computes the
 * same from the same size and cap; the kernels loop over the units beyond). */
inline unsigned fc_ll_grid(const fc_oneshot_args_t *a, size_t bytes) {
  const size_t cap = a->max_blocks >= 1 && a->max_blocks < FC_ONESHOT_BLOCKS ? a->max_blocks : FC_ONESHOT_BLOCKS;
  const size_t units = (bytes + 15) / 16, b = (units + FC_OS_THREADS - 1) / FC_OS_THREADS;
  return b < 1 ? 1u : b > cap ? (unsigned)cap : (unsigned)b;
}

/* Whether a message of `bytes` per rank takes the LL kernels. */
inline bool fc_use_ll(const fc_oneshot_args_t *a, size_t bytes) {
  if (a->ll_max == 0 || bytes > a->ll_max || (a->ll_max & 15u)) return false;
  for (int p = 0; p < a->nranks; p++)
    if (!a->ll[p] || ((uintptr_t)a->ll[p] & 15u)) return false;
  return true;
}

/* The grid for a message of `bytes` (see kernels.h). */
inline unsigned fc_oneshot_grid(const fc_oneshot_args_t *a, size_t bytes) {
  const size_t cap = a->max_blocks >= 1 && a->max_blocks <= FC_MAX_BLOCKS ? a->max_blocks : FC_ONESHOT_BLOCKS;
  const size_t b = (bytes + FC_ONESHOT_BLOCK_BYTES - 1) / FC_ONESHOT_BLOCK_BYTES;
  return b < 1 ? 1u : b > cap ? (unsigned)cap : (unsigned)b;
}

/* What both collectives need of the arguments; the kernels rely on these without checking. */
inline bool fc_args_ok(const fc_oneshot_args_t *a, size_t bytes) {
  if (!a || a->nranks < 1 || a->nranks > FC_ONESHOT_MAX_RANKS || a->rank < 0 || a->rank >= a->nranks)
    return false;
  if (!a->epoch || ((uintptr_t)a->epoch & 15u) || bytes > a->slot_bytes || (a->slot_bytes & 15u)) return false;
  for (int p = 0; p < a->nranks; p++)
    if (!a->stage[p] || !a->flags[p] || ((uintptr_t)a->stage[p] & 15u) || ((uintptr_t)a->flags[p] & 7u))
      return false;
  return true;
}

}  // namespace

/* Loads oneshot_rs.cu's kernels (see fc_kernels_preload_oneshot). */
int fc_preload_oneshot_rs_bcast();

#endif
