/* p2p.cu — a batch of sends and receives as one kernel per rank (kernels.h has the interface).
 *
 * Every block takes the same share of every op (fc_block_range) and moves it in messages of at
 * most a sub-slot.  Within a batch, the messages of one direction of a pair are numbered on
 * from the pair's count so far (base): op j's messages follow those of the earlier ops on the
 * same pair and direction (msg_off).  In round r the block first pushes message r of every pair
 * it sends on (once the receiver has consumed message r - S of it), then consumes message r of
 * every pair it receives on; so a push waits only for consumptions of earlier rounds, which every
 * rank does before its later pushes, and no cycle of waits can form within a batch, whatever its
 * pattern (a send whose receive the peer posts only in a later batch waits for it, as NCCL's).
 * Counters only grow, so a stale value never satisfies a wait; a kernel ends once every receiver
 * has consumed all it was sent, so the next kernel finds its regions free. */
#include "kernels/oneshot.cuh"

namespace {

/* An op as the kernel runs it: the call's op plus its place in the pair's numbering. */
struct fc_p2p_run_op {
  char *buf;
  size_t bytes, step;
  int peer, is_send;
  unsigned msg_off, nsteps;
};
struct fc_p2p_batch {
  fc_p2p_run_op op[FC_P2P_KERNEL_OPS];
  int nops;
  unsigned rounds;
};

/* Each op's pair count at the kernel's start, read by every block before it counts itself (as
 * fc_epoch_begin); the last block to count adds the batch's messages. */
__shared__ unsigned long long fc_p2p_base_shared[FC_P2P_KERNEL_OPS];

__device__ __forceinline__ uint64_t *fc_p2p_base_of(const fc_p2p_args_t &a, const fc_p2p_run_op &o) {
  return a.base + (o.is_send ? 0 : a.nranks) + o.peer;
}

__device__ __forceinline__ void fc_p2p_epoch(const fc_p2p_args_t &a, const fc_p2p_batch &b) {
  for (int j = threadIdx.x; j < b.nops; j += blockDim.x)
    fc_p2p_base_shared[j] = fc_ld_volatile(fc_p2p_base_of(a, b.op[j]));
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.done, 1u) == gridDim.x - 1) {
      __threadfence();
      atomicExch(a.done, 0u);
      /* Ops of one pair and direction add up (each adds its own messages to the start value
       * read above, so sum them in order). */
      for (int j = 0; j < b.nops; j++) {
        uint64_t *p = fc_p2p_base_of(a, b.op[j]);
        *(volatile unsigned long long *)p = *(volatile unsigned long long *)p + b.op[j].nsteps;
      }
    }
  }
  __syncthreads();
}

/* Thread 0 waits until *flag >= target, then the system fence; false in every thread after a
 * timeout or abort (*error set). */
__device__ __forceinline__ bool fc_p2p_wait(const fc_p2p_args_t &a, const uint64_t *flag, uint64_t target) {
  __shared__ int ok_shared;
  if (threadIdx.x == 0) {
    const long long start = fc_now_ns();
    long long last_abort_check = start;
    const int ok = fc_poll(a, flag, target, start, &last_abort_check);
    if (!ok && a.error && *(volatile int *)a.error == 0) *(volatile int *)a.error = 1;
    __threadfence_system();
    ok_shared = ok;
  }
  __syncthreads();
  return ok_shared != 0;
}

__device__ __forceinline__ void fc_p2p_signal(uint64_t *flag, uint64_t v) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    fc_st_release_sys(flag, v);
  }
}

__device__ __forceinline__ void fc_p2p_run(const fc_p2p_args_t &a, const fc_p2p_batch &b) {
  const unsigned S = a.subslots;
  const size_t room = a.region_bytes / ((size_t)gridDim.x * S) / 16 * 16;
  const size_t n = (size_t)a.nranks, blk = blockIdx.x;
  for (unsigned r = 0; r < b.rounds; r++) {
    for (int pass = 0; pass < 2; pass++) { /* pushes, then consumptions */
      for (int j = 0; j < b.nops; j++) {
        const fc_p2p_run_op &o = b.op[j];
        if ((pass == 0) != (o.is_send != 0) || r < o.msg_off || r >= o.msg_off + o.nsteps) continue;
        const uint64_t base = fc_p2p_base_shared[j]; /* the pair's count at the batch's start */
        size_t lo, hi;
        fc_block_range(o.bytes, &lo, &hi);
        const size_t k = r - o.msg_off, s = lo + k * o.step < hi ? lo + k * o.step : hi;
        const size_t e = s + o.step < hi ? s + o.step : hi;
        const size_t slot = ((size_t)(r % S) * gridDim.x + blk) * room;
        if (o.is_send) {
          if (r >= S && !fc_p2p_wait(a, a.ctr + ((n + o.peer) * FC_MAX_BLOCKS + blk), base + r - S + 1)) return;
          fc_block_copy(a.peer_area[o.peer] + (size_t)a.rank * a.region_bytes + slot, o.buf + s, e - s);
          fc_p2p_signal(a.peer_ctr[o.peer] + ((size_t)a.rank * FC_MAX_BLOCKS + blk), base + r + 1);
        } else {
          if (!fc_p2p_wait(a, a.ctr + ((size_t)o.peer * FC_MAX_BLOCKS + blk), base + r + 1)) return;
          fc_block_copy(o.buf + s, a.area + (size_t)o.peer * a.region_bytes + slot, e - s);
          fc_p2p_signal(a.peer_ctr[o.peer] + ((n + a.rank) * FC_MAX_BLOCKS + blk), base + r + 1);
        }
      }
    }
  }
  /* Every receiver has consumed all we sent it (the last op of each pair says how far). */
  for (int j = 0; j < b.nops; j++) {
    const fc_p2p_run_op &o = b.op[j];
    if (!o.is_send || !o.nsteps) continue;
    const uint64_t base = fc_p2p_base_shared[j];
    if (!fc_p2p_wait(a, a.ctr + ((n + o.peer) * FC_MAX_BLOCKS + blk), base + o.msg_off + o.nsteps)) return;
  }
}

__global__ void __launch_bounds__(FC_OS_THREADS) fc_p2p_kernel(const fc_p2p_args_t a, const fc_p2p_batch b) {
  fc_p2p_epoch(a, b);
  fc_p2p_run(a, b);
}

}  // namespace

extern "C" int fc_kernel_p2p(const fc_p2p_args_t *args, const fc_p2p_kop_t *ops, int nops, flexcoll_stream_t stream) {
  if (!args || nops < 0 || nops > FC_P2P_KERNEL_OPS || args->nranks < 1 || args->rank < 0 ||
      args->rank >= args->nranks || !args->base || !args->done || !args->area || !args->ctr || !args->peer_area ||
      !args->peer_ctr || args->blocks < 1 || args->blocks > FC_MAX_BLOCKS || args->subslots < 2 ||
      (args->region_bytes & 15u))
    return (int)cudaErrorInvalidValue;
  const size_t room = args->region_bytes / ((size_t)args->blocks * args->subslots) / 16 * 16;
  if (room < 16) return (int)cudaErrorInvalidValue;
  fc_p2p_batch b; /* ~10 KB: the launch copies it (kernel parameters of up to 32 KB, CUDA 12.1) */
  static_assert(sizeof b < 32000, "a batch must fit the kernel parameters");
  b.nops = 0;
  b.rounds = 0;
  for (int i = 0; i < nops; i++) {
    const fc_p2p_kop_t *o = &ops[i];
    if (o->peer < 0 || o->peer >= args->nranks || (o->bytes && !o->buf)) return (int)cudaErrorInvalidValue;
    fc_p2p_run_op &r = b.op[b.nops++];
    r.buf = o->buf;
    r.bytes = o->bytes;
    r.peer = o->peer;
    r.is_send = o->is_send != 0;
    /* fc_block_range's share, in messages of at most a sub-slot: the same on both sides. */
    const size_t part = ((o->bytes + 15) / 16 + args->blocks - 1) / args->blocks * 16;
    r.step = part < room ? part : room;
    r.nsteps = o->bytes ? (unsigned)((part + r.step - 1) / r.step) : 0;
    r.msg_off = 0;
    for (int j = 0; j < i; j++)
      if (b.op[j].peer == r.peer && b.op[j].is_send == r.is_send) r.msg_off += b.op[j].nsteps;
    if (r.msg_off + r.nsteps > b.rounds) b.rounds = r.msg_off + r.nsteps;
  }
  if (b.rounds == 0) return (int)cudaSuccess; /* nothing moves, on both sides of every pair alike */
  fc_p2p_kernel<<<args->blocks, FC_OS_THREADS, 0, (cudaStream_t)stream>>>(*args, b);
  return (int)cudaGetLastError();
}

extern "C" int fc_kernels_preload_p2p(void) {
  cudaFuncAttributes a;
  return (int)cudaFuncGetAttributes(&a, fc_p2p_kernel);
}
