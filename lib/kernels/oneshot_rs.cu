/* oneshot_rs.cu — one-shot reduce_scatter and broadcast for small messages, plain and LL (the
 * protocols: oneshot.cuh).  A file of its own so that its instantiations compile beside
 * oneshot.cu's. */
#include "kernels/oneshot.cuh"

namespace {

/* ---- reduce_scatter and broadcast: the same protocols, other data ----
 * reduce_scatter: rank r sends peer p only chunk p of its sendbuf (bytes per chunk) and reduces
 * chunk r.  broadcast: the root sends its buffer; the others send nothing but still post their
 * flags (plain) or lines (LL) and wait for everyone's, which keeps the two-parity argument true
 * for every rank (each kernel sees every peer's kernel of the same call). */

template <typename V, typename D, class Op, bool AVG>
__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_oneshot_reduce_scatter_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes) {
  fc_epoch_begin(a);
  size_t lo, hi;
  fc_block_range(bytes, &lo, &hi);
  const int par = (int)(fc_seq() & 1);
#pragma unroll
  for (int p = 0; p < FC_ONESHOT_MAX_RANKS; p++)
    if (p < a.nranks && p != a.rank)
      fc_block_copy(a.stage[p] + fc_slot_off(a, par, a.rank) + lo, send + (size_t)p * bytes + lo, hi - lo);
  fc_post_flags(a, par, fc_seq());
  if (fc_wait(a, par, fc_seq())) fc_combine<V, D, Op, AVG>(a, par, send + (size_t)a.rank * bytes, recv, lo, hi);
  fc_epoch_end(a, 0);
}

__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_oneshot_broadcast_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes, int root) {
  fc_epoch_begin(a);
  size_t lo, hi;
  fc_block_range(bytes, &lo, &hi);
  const int par = (int)(fc_seq() & 1);
  fc_post(a, par, fc_seq(), a.rank == root ? send : nullptr, lo, hi);
  if (fc_wait(a, par, fc_seq())) {
    const char *src = a.rank == root ? send : fc_pick(a.stage, a.rank) + fc_slot_off(a, par, root);
    if (src != recv) fc_block_copy(recv + lo, src + lo, hi - lo);
  }
  fc_epoch_end(a, 0);
}

template <typename V, typename D, class Op, bool AVG>
__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_ll_reduce_scatter_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes) {
  typedef fc_vec<V> vec;
  fc_epoch_begin(a);
  const int par = (int)(fc_seq() & 1);
  const uint32_t flag = (uint32_t)fc_seq();
  const long long start = fc_now_ns();
  char *local = fc_pick(a.ll, a.rank);
  const size_t units = (bytes + 15) / 16;
  for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += (size_t)gridDim.x * blockDim.x) {
#pragma unroll
    for (int p = 0; p < FC_ONESHOT_MAX_RANKS; p++)
      if (p < a.nranks && p != a.rank) {
        const uint4 v = fc_load16(send + (size_t)p * bytes, 16 * u, bytes);
        uint4 *dst = fc_ll_lines(a, a.ll[p], par, a.rank, u);
        fc_ll_store(dst, v.x, v.y, flag);
        fc_ll_store(dst + 1, v.z, v.w, flag);
      }
    vec own;
    own.raw = fc_load16(send + (size_t)a.rank * bytes, 16 * u, bytes);
    vec acc;
    if (!fc_ll_reduce_unit<V, D, Op, AVG>(a, local, par, u, flag, start, own, &acc)) break;
    fc_store16(recv, 16 * u, bytes, acc.raw);
  }
  fc_epoch_end(a, 0);
}

/* Unit u of an LL broadcast (every rank posts, the others' lines are awaited); false after a
 * timeout or abort (reported through *error). */
__device__ __forceinline__ bool fc_ll_broadcast_unit(const fc_oneshot_args_t &a, const char *send, char *recv,
                                                     size_t bytes, int root, char *local, int par, uint32_t flag,
                                                     long long start, size_t u) {
  /* Non-roots post zeros: their lines only say that they have reached this call. */
  const uint4 own = a.rank == root ? fc_load16(send, 16 * u, bytes) : make_uint4(0, 0, 0, 0);
  fc_ll_post(a, par, u, own, flag);
  uint4 got = own;
#pragma unroll
  for (int q = 0; q < FC_ONESHOT_MAX_RANKS; q++) {
    if (q >= a.nranks) break;
    uint4 v;
    if (q != a.rank && !fc_ll_read(a, fc_ll_lines(a, local, par, q, u), flag, start, &v)) {
      fc_ll_timed_out(a);
      return false;
    }
    if (q == root && q != a.rank) got = v;
  }
  if (a.rank != root || send != recv) fc_store16(recv, 16 * u, bytes, got);
  return true;
}

__global__ void __launch_bounds__(FC_OS_THREADS)
    fc_ll_broadcast_kernel(const fc_oneshot_args_t a, const char *send, char *recv, size_t bytes, int root) {
  fc_epoch_begin(a);
  const int par = (int)(fc_seq() & 1);
  const uint32_t flag = (uint32_t)fc_seq();
  const long long start = fc_now_ns();
  char *local = fc_pick(a.ll, a.rank);
  const size_t units = (bytes + 15) / 16;
  for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += (size_t)gridDim.x * blockDim.x)
    if (!fc_ll_broadcast_unit(a, send, recv, bytes, root, local, par, flag, start, u)) break;
  fc_epoch_end(a, 0);
}

/* fc_dispatch target for the reduce_scatter (count: elements of one rank's chunk). */
struct fc_oneshot_rs_launch {
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
    const bool div = avg && args->nranks > 1;
    const char *s = (const char *)send;
    char *r = (char *)recv;
    if (fc_use_ll(args, bytes)) {
      if (div) fc_ll_reduce_scatter_kernel<V, D, Op, true><<<fc_ll_grid(args, bytes), FC_OS_THREADS, 0, stream>>>(*args, s, r, bytes);
      else fc_ll_reduce_scatter_kernel<V, D, Op, false><<<fc_ll_grid(args, bytes), FC_OS_THREADS, 0, stream>>>(*args, s, r, bytes);
    } else if (div) {
      fc_oneshot_reduce_scatter_kernel<V, D, Op, true><<<fc_oneshot_grid(args, bytes), FC_OS_THREADS, 0, stream>>>(*args, s, r, bytes);
    } else {
      fc_oneshot_reduce_scatter_kernel<V, D, Op, false><<<fc_oneshot_grid(args, bytes), FC_OS_THREADS, 0, stream>>>(*args, s, r, bytes);
    }
    return (int)cudaGetLastError();
  }
};


struct fc_oneshot_rs_preload {
  template <typename V, typename D, class Op> int run() {
    cudaFuncAttributes a;
    int e = (int)cudaFuncGetAttributes(&a, fc_oneshot_reduce_scatter_kernel<V, D, Op, true>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_oneshot_reduce_scatter_kernel<V, D, Op, false>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_ll_reduce_scatter_kernel<V, D, Op, true>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_ll_reduce_scatter_kernel<V, D, Op, false>);
    return e;
  }
};

}  // namespace

extern "C" int fc_kernel_oneshot_reduce_scatter(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf,
                                                size_t recvcount, flexcoll_datatype_t dtype, flexcoll_op_t op,
                                                flexcoll_stream_t stream) {
  if ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES || (unsigned)op >= FLEXCOLL_NUM_OPS) return (int)cudaErrorInvalidValue;
  if (recvcount == 0) return (int)cudaSuccess;
  if (!args || recvcount > args->slot_bytes) return (int)cudaErrorInvalidValue;
  fc_oneshot_rs_launch l = {args, sendbuf, recvbuf, recvcount, op == FLEXCOLL_AVG, (cudaStream_t)stream};
  return fc_dispatch(dtype, op, l);
}

extern "C" int fc_kernel_oneshot_broadcast(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf,
                                           size_t bytes, int root, flexcoll_stream_t stream) {
  if (bytes == 0) return (int)cudaSuccess;
  if (!fc_args_ok(args, bytes) || root < 0 || root >= args->nranks || (args->rank == root && !sendbuf) || !recvbuf)
    return (int)cudaErrorInvalidValue;
  cudaStream_t s = (cudaStream_t)stream;
  if (fc_use_ll(args, bytes))
    fc_ll_broadcast_kernel<<<fc_ll_grid(args, bytes), FC_OS_THREADS, 0, s>>>(*args, (const char *)sendbuf, (char *)recvbuf, bytes, root);
  else
    fc_oneshot_broadcast_kernel<<<fc_oneshot_grid(args, bytes), FC_OS_THREADS, 0, s>>>(*args, (const char *)sendbuf,
                                                                                (char *)recvbuf, bytes, root);
  return (int)cudaGetLastError();
}

int fc_preload_oneshot_rs_bcast() {
  fc_oneshot_rs_preload p;
  int e = fc_dispatch_all(p);
  cudaFuncAttributes a;
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_oneshot_broadcast_kernel);
  return e ? e : (int)cudaFuncGetAttributes(&a, fc_ll_broadcast_kernel);
}
