/* oneshot.cu — one-shot allreduce and allgather for small messages, plain and LL (the
 * protocols: oneshot.cuh). */
#include "kernels/oneshot.cuh"

namespace {

template <typename V, typename D, class Op, bool AVG>
__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_oneshot_allreduce_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes) {
  fc_epoch_begin(a);
  size_t lo, hi;
  fc_block_range(bytes, &lo, &hi);
  const int par = (int)(fc_seq() & 1);
  fc_post(a, par, fc_seq(), send, lo, hi);
  if (fc_wait(a, par, fc_seq())) fc_combine<V, D, Op, AVG>(a, par, send, recv, lo, hi);
  fc_epoch_end(a, 0);
}

__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_oneshot_allgather_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes) {
  fc_epoch_begin(a);
  size_t lo, hi;
  fc_block_range(bytes, &lo, &hi);
  const int par = (int)(fc_seq() & 1);
  fc_post(a, par, fc_seq(), send, lo, hi);
  if (fc_wait(a, par, fc_seq())) {
    const char *local = fc_pick(a.stage, a.rank);
    for (int q = 0; q < a.nranks; q++)
      fc_block_copy(recv + (size_t)q * bytes + lo, fc_src(a, par, send, local, q) + lo, hi - lo);
  }
  fc_epoch_end(a, 0);
}

template <typename V, typename D, class Op, bool AVG>
__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_ll_allreduce_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes) {
  typedef fc_vec<V> vec;
  fc_epoch_begin(a);
  const int par = (int)(fc_seq() & 1);
  const uint32_t flag = (uint32_t)fc_seq();
  const long long start = fc_now_ns();
  char *local = fc_pick(a.ll, a.rank);
  const size_t units = (bytes + 15) / 16;
  for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += (size_t)gridDim.x * blockDim.x) {
    vec own;
    own.raw = fc_load16(send, 16 * u, bytes);
    fc_ll_post(a, par, u, own.raw, flag);
    vec acc;
    if (!fc_ll_reduce_unit<V, D, Op, AVG>(a, local, par, u, flag, start, own, &acc)) break;
    fc_store16(recv, 16 * u, bytes, acc.raw);
  }
  fc_epoch_end(a, 0);
}

/* Unit u of an LL allgather: ours to every peer, everyone's into recv.  False after a timeout
 * or abort (reported through *error). */
__device__ __forceinline__ bool fc_ll_allgather_unit(const fc_oneshot_args_t &a, const char *send, char *recv,
                                                     size_t bytes, char *local, int par, uint32_t flag, long long start,
                                                     size_t u) {
  const uint4 own = fc_load16(send, 16 * u, bytes);
  fc_ll_post(a, par, u, own, flag);
#pragma unroll
  for (int q = 0; q < FC_ONESHOT_MAX_RANKS; q++) {
    if (q >= a.nranks) break;
    uint4 v = own;
    if (q != a.rank && !fc_ll_read(a, fc_ll_lines(a, local, par, q, u), flag, start, &v)) {
      fc_ll_timed_out(a);
      return false;
    }
    fc_store16(recv + (size_t)q * bytes, 16 * u, bytes, v);
  }
  return true;
}

__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_ll_allgather_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes) {
  fc_epoch_begin(a);
  const int par = (int)(fc_seq() & 1);
  const uint32_t flag = (uint32_t)fc_seq();
  const long long start = fc_now_ns();
  char *local = fc_pick(a.ll, a.rank);
  const size_t units = (bytes + 15) / 16;
  for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += (size_t)gridDim.x * blockDim.x)
    if (!fc_ll_allgather_unit(a, send, recv, bytes, local, par, flag, start, u)) break;
  fc_epoch_end(a, 0);
}

/* fc_dispatch target for the allreduce. */
struct fc_oneshot_launch {
  const fc_oneshot_args_t *args;
  const void *send;
  void *recv;
  size_t count;
  bool avg;
  cudaStream_t stream;
  template <typename V, typename D, class Op> int run() {
    if (((uintptr_t)send | (uintptr_t)recv) & (sizeof(V) - 1)) return (int)cudaErrorInvalidValue;
    const size_t bytes = count * sizeof(V);
    if (!fc_args_ok(args, bytes)) return (int)cudaErrorInvalidValue;
    /* AVG over one rank divides by 1: skipped, as fc_host_divide skips n <= 1. */
    if (fc_use_ll(args, bytes)) {
      if (avg && args->nranks > 1)
        fc_ll_allreduce_kernel<V, D, Op, true>
            <<<fc_ll_grid(args, bytes), FC_OS_THREADS, 0, stream>>>(*args, (const char *)send, (char *)recv, bytes);
      else
        fc_ll_allreduce_kernel<V, D, Op, false>
            <<<fc_ll_grid(args, bytes), FC_OS_THREADS, 0, stream>>>(*args, (const char *)send, (char *)recv, bytes);
      return (int)cudaGetLastError();
    }
    if (avg && args->nranks > 1)
      fc_oneshot_allreduce_kernel<V, D, Op, true>
          <<<fc_oneshot_grid(args, bytes), FC_OS_THREADS, 0, stream>>>(*args, (const char *)send, (char *)recv, bytes);
    else
      fc_oneshot_allreduce_kernel<V, D, Op, false>
          <<<fc_oneshot_grid(args, bytes), FC_OS_THREADS, 0, stream>>>(*args, (const char *)send, (char *)recv, bytes);
    return (int)cudaGetLastError();
  }
};

}  // namespace

extern "C" int fc_kernel_oneshot_allreduce(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf,
                                           size_t count, flexcoll_datatype_t dtype, flexcoll_op_t op,
                                           flexcoll_stream_t stream) {
  if ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES || (unsigned)op >= FLEXCOLL_NUM_OPS) return (int)cudaErrorInvalidValue;
  /* Nothing launched, on every rank alike (count is the same everywhere); seq is not used. */
  if (count == 0) return (int)cudaSuccess;
  if (!args || count > args->slot_bytes) return (int)cudaErrorInvalidValue; /* count * size cannot overflow below */
  fc_oneshot_launch l = {args, sendbuf, recvbuf, count, op == FLEXCOLL_AVG, (cudaStream_t)stream};
  return fc_dispatch(dtype, op, l);
}

extern "C" int fc_kernel_oneshot_allgather(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf,
                                           size_t bytes, flexcoll_stream_t stream) {
  if (bytes == 0) return (int)cudaSuccess;
  if (!fc_args_ok(args, bytes)) return (int)cudaErrorInvalidValue;
  if (fc_use_ll(args, bytes)) {
    fc_ll_allgather_kernel<<<fc_ll_grid(args, bytes), FC_OS_THREADS, 0, (cudaStream_t)stream>>>(*args, (const char *)sendbuf,
                                                                                        (char *)recvbuf, bytes);
    return (int)cudaGetLastError();
  }
  fc_oneshot_allgather_kernel<<<fc_oneshot_grid(args, bytes), FC_OS_THREADS, 0, (cudaStream_t)stream>>>(
      *args, (const char *)sendbuf, (char *)recvbuf, bytes);
  return (int)cudaGetLastError();
}

/* Load every one-shot kernel now (see fc_kernels_preload_reduce in reduce.cu: a first launch
 * under lazy loading waits for the device's queued work, which may be waiting on peers). */
namespace {
struct fc_oneshot_preload {
  template <typename V, typename D, class Op> int run() {
    cudaFuncAttributes a;
    int e = (int)cudaFuncGetAttributes(&a, fc_oneshot_allreduce_kernel<V, D, Op, true>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_oneshot_allreduce_kernel<V, D, Op, false>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_ll_allreduce_kernel<V, D, Op, true>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_ll_allreduce_kernel<V, D, Op, false>);
    return e;
  }
};
}  // namespace

/* The fewest blocks of the allreduce kernels (the one-shot family's heaviest) that fit on one SM. */
namespace {
struct fc_oneshot_occupancy {
  int per_sm = 1 << 30;
  template <class K> int visit(K kernel) {
    int nb = 0, e = (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, FC_OS_THREADS, 0);
    if (!e && nb < per_sm) per_sm = nb;
    return e;
  }
  template <typename V, typename D, class Op> int run() {
    int e = visit(fc_oneshot_allreduce_kernel<V, D, Op, true>);
    if (!e) e = visit(fc_oneshot_allreduce_kernel<V, D, Op, false>);
    if (!e) e = visit(fc_ll_allreduce_kernel<V, D, Op, true>);
    return e ? e : visit(fc_ll_allreduce_kernel<V, D, Op, false>);
  }
};
}  // namespace

extern "C" int fc_kernels_oneshot_blocks_per_sm(void) {
  fc_oneshot_occupancy o;
  if (fc_dispatch_all(o)) {
    cudaGetLastError();
    return 0;
  }
  return o.per_sm;
}

extern "C" int fc_kernels_preload_oneshot(void) {
  fc_oneshot_preload p;
  int e = fc_dispatch_all(p);
  cudaFuncAttributes a;
  if (!e) e = fc_preload_oneshot_rs_bcast();
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_oneshot_allgather_kernel);
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_ll_allgather_kernel);
  return e;
}
