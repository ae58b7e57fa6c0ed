/* alltoall.cu — AllToAll as one kernel per rank (kernels.h has the interface).
 *
 * Every block of the grid takes the same share [lo, hi) of every rank-to-rank block
 * (fc_block_range) and moves it in steps of at most a sub-slot.  In step k, with sub-slot
 * j = k % 2 (the two parities' slots `rank` of a peer's one-shot area, shared out among the
 * blocks):
 *  - push: once every peer has consumed our step k - 2 (its ack counter for us), store step k
 *    of our block for q into sub-slot j of our slots in q's staging area, for every peer q,
 *    then raise each q's ready counter for us to base + k + 1;
 *  - consume: wait until every peer's ready counter reaches base + k + 1, copy sub-slot j of
 *    its slots in our area into its place in recvbuf, and raise its ack counter to base + k + 1.
 * Pushing to every peer before consuming any keeps all links busy at once; a peer blocks only
 * on steps every rank has already pushed.  Counters only grow (base: epoch->pipe_base, which the
 * call advances by its steps, the same on every rank), so a stale value never satisfies a wait.
 *
 * The one-shot area is shared with the one-shot and pipelined kernels: like the pipelined
 * kernels, the call takes a seq and first posts and waits for the one-shot flags of that seq,
 * carrying no data (so no peer's earlier kernel still reads its area), and it ends only once
 * every peer has consumed everything it was sent. */
#include "kernels/oneshot.cuh"

namespace {

/* A block's share of a rank-to-rank block is at least this (fewer blocks for smaller calls). */
constexpr size_t FC_ALLTOALL_MIN_PART = 64u << 10;

/* Thread 0 waits until counter `kind` of every peer (in our flags) reaches target, then a
 * system fence (the acquire side); false in every thread after a timeout or abort. */
__device__ __forceinline__ bool fc_a2a_wait(const fc_oneshot_args_t &a, int kind, uint64_t target) {
  __shared__ int ok_shared;
  if (threadIdx.x == 0) {
    const long long start = fc_now_ns();
    long long last_abort_check = start;
    uint64_t *mine = fc_pick(a.flags, a.rank);
    int ok = 1;
    for (int q = 0; q < a.nranks && ok; q++)
      if (q != a.rank) ok = fc_poll(a, fc_pipe_flag(a, mine, kind, q), target, start, &last_abort_check);
    if (!ok && a.error && *(volatile int *)a.error == 0) *(volatile int *)a.error = 1;
    __threadfence_system();
    ok_shared = ok;
  }
  __syncthreads();
  return ok_shared != 0;
}

/* After the block's accesses: counter `kind` for us in every peer's flags := v (barrier, system
 * fence, release stores, as fc_post_flags). */
__device__ __forceinline__ void fc_a2a_signal(const fc_oneshot_args_t &a, int kind, uint64_t v) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
#pragma unroll
    for (int p = 0; p < FC_ONESHOT_MAX_RANKS; p++)
      if (p < a.nranks && p != a.rank) fc_st_release_sys(fc_pipe_flag(a, a.flags[p], kind, a.rank), v);
  }
}

__device__ __forceinline__ void fc_a2a_run(const fc_oneshot_args_t &a, const char *send, char *recv, size_t bytes,
                                           size_t step, unsigned nsteps) {
  const int n = a.nranks, me = a.rank;
  const int par = (int)(fc_seq() & 1);
  fc_post_flags(a, par, fc_seq());
  if (!fc_wait(a, par, fc_seq())) return;
  const uint64_t base = fc_pipe_base();
  size_t lo, hi;
  fc_block_range(bytes, &lo, &hi);
  const size_t room = a.slot_bytes / gridDim.x / 16 * 16;
  const size_t at = (size_t)blockIdx.x * room;
  char *local = fc_pick(a.stage, me);
  fc_block_copy(recv + (size_t)me * bytes + lo, send + (size_t)me * bytes + lo, hi - lo);
  for (unsigned k = 0; k < nsteps; k++) {
    const size_t s = lo + (size_t)k * step < hi ? lo + (size_t)k * step : hi;
    const size_t e = s + step < hi ? s + step : hi;
    const int j = (int)(k & 1);
    if (k >= 2 && !fc_a2a_wait(a, 1, base + k - 1)) return;
    for (int d = 1; d < n; d++) {
      const int q = (me + d) % n;
      fc_block_copy(fc_pick(a.stage, q) + fc_slot_off(a, j, me) + at, send + (size_t)q * bytes + s, e - s);
    }
    fc_a2a_signal(a, 0, base + k + 1);
    if (!fc_a2a_wait(a, 0, base + k + 1)) return;
    for (int d = 1; d < n; d++) {
      const int q = (me + n - d) % n;
      fc_block_copy(recv + (size_t)q * bytes + s, local + fc_slot_off(a, j, q) + at, e - s);
    }
    fc_a2a_signal(a, 1, base + k + 1);
  }
  /* Every peer has consumed all we sent: our slots in its area are free for the next kernel. */
  fc_a2a_wait(a, 1, base + nsteps);
}

/* The epoch read, then at once counted and (by the last block) advanced by the call's steps
 * (see fc_pipe_call in pipeline.cu for why counting comes first). */
__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_alltoall_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes, size_t step,
                       unsigned nsteps) {
  fc_epoch_begin(a);
  fc_epoch_end(a, nsteps);
  fc_a2a_run(a, send, recv, bytes, step, nsteps);
}

}  // namespace

extern "C" int fc_kernel_alltoall(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf, size_t bytes,
                                  flexcoll_stream_t stream) {
  if (bytes == 0) return (int)cudaSuccess; /* nothing launched, on every rank alike */
  if (!fc_args_ok(args, 0) || args->nranks < 2 || args->slot_bytes < FC_ALLTOALL_MIN_ROOM || !sendbuf || !recvbuf)
    return (int)cudaErrorInvalidValue;
  /* The grid, sub-slot and step: the same on every rank (size and communicator constants). */
  const size_t cap = args->max_blocks >= 1 && args->max_blocks <= FC_MAX_BLOCKS ? args->max_blocks : FC_ONESHOT_BLOCKS;
  size_t g = (bytes + FC_ALLTOALL_MIN_PART - 1) / FC_ALLTOALL_MIN_PART;
  if (g > cap) g = cap;
  if (g > args->slot_bytes / FC_ALLTOALL_MIN_ROOM) g = args->slot_bytes / FC_ALLTOALL_MIN_ROOM;
  if (g < 1) g = 1;
  const size_t room = args->slot_bytes / g / 16 * 16;
  const size_t part = ((bytes + 15) / 16 + g - 1) / g * 16; /* fc_block_range's share */
  const size_t step = part < room ? part : room;
  const size_t nsteps = (part + step - 1) / step;
  fc_alltoall_kernel<<<(unsigned)g, FC_OS_THREADS, 0, (cudaStream_t)stream>>>(*args, (const char *)sendbuf,
                                                                             (char *)recvbuf, bytes, step,
                                                                             (unsigned)nsteps);
  return (int)cudaGetLastError();
}

extern "C" int fc_kernels_preload_alltoall(void) {
  cudaFuncAttributes a;
  return (int)cudaFuncGetAttributes(&a, fc_alltoall_kernel);
}
