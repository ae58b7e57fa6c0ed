/* reduce.cu — elementwise reduction, AVG's division and an SM-driven copy (kernels.h).
 *
 * Every kernel is a grid-stride loop over 16-byte vectors plus a scalar loop over the elements
 * before the first and after the last vector.  Vectors are used when all pointers share the
 * same offset modulo 16 (the usual case: aligned buffers, or equal offsets into them); the
 * scalar head then brings them to a 16-byte boundary.  Otherwise everything is scalar.
 * Buffers must be aligned to their element size, as on the host (fc_kernel_reduce/divide
 * return cudaErrorInvalidValue otherwise).
 *
 * The arithmetic lives in ops.cuh and equals lib/host/reduce.c bit for bit.
 */
#include <stdint.h>

#include "kernels/ops.cuh"

namespace {

/* Launch shape: 512 threads; at most 4 blocks per SM of an H200 (132 SMs) — enough to fill
 * the memory pipes, while a grid-stride loop handles any count.  Each thread handles up to
 * FC_UNROLL vectors per iteration, all loads issued before the stores, for memory-level
 * parallelism. */
constexpr unsigned FC_THREADS = 512;
constexpr unsigned FC_REDUCE_MAX_BLOCKS = 132 * 4;
constexpr unsigned FC_UNROLL = 4;

/* Enough blocks for `items` units of work at FC_UNROLL per thread, at least 1, at most
 * FC_REDUCE_MAX_BLOCKS. */
unsigned fc_grid(size_t items) {
  const size_t per_block = (size_t)FC_THREADS * FC_UNROLL;
  const size_t blocks = (items + per_block - 1) / per_block;
  return blocks < 1 ? 1u : blocks > FC_REDUCE_MAX_BLOCKS ? FC_REDUCE_MAX_BLOCKS : (unsigned)blocks;
}

/* How a buffer of `count` elements of `esize` bytes splits: `head` scalar elements, then
 * `nvec` 16-byte vectors, then scalar elements up to count. */
struct fc_split {
  size_t head, nvec;
};

/* ptrs all at the same offset modulo 16 (and element aligned, checked by the caller):
 * vectors after a scalar head; else no vectors at all. */
fc_split fc_split_of(const uintptr_t *ptrs, int nptrs, size_t count, size_t esize) {
  const uintptr_t mis = ptrs[0] & 15u;
  for (int i = 1; i < nptrs; i++)
    if ((ptrs[i] & 15u) != mis) return {count, 0};
  size_t head = mis ? (16u - mis) / esize : 0;
  if (head > count) head = count;
  return {head, (count - head) / (16u / esize)};
}

/* The i-th scalar element: the head elements, then the ones after the vectors. */
__device__ __forceinline__ size_t fc_scalar_index(size_t i, size_t head, size_t tail_start) {
  return i < head ? i : tail_start + (i - head);
}

template <typename T, class Op>
__global__ void __launch_bounds__(FC_THREADS)
    fc_reduce_kernel(T *dst, const T *a, const T *b, size_t count, size_t head, size_t nvec) {
  typedef fc_vec<T> vec;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nthreads = (size_t)gridDim.x * blockDim.x;
  /* No __restrict__ and no read-only (nc) loads: dst may be a or b.  Exact aliasing is safe
   * because each element is read and then written by the same thread. */
  vec *vd = (vec *)(dst + head);
  const vec *va = (const vec *)(a + head), *vb = (const vec *)(b + head);
  for (size_t i = tid; i < nvec; i += nthreads * FC_UNROLL) {
    vec x[FC_UNROLL], y[FC_UNROLL];
#pragma unroll
    for (unsigned k = 0; k < FC_UNROLL; k++)
      if (i + k * nthreads < nvec) x[k] = va[i + k * nthreads], y[k] = vb[i + k * nthreads];
#pragma unroll
    for (unsigned k = 0; k < FC_UNROLL; k++)
      if (i + k * nthreads < nvec) vd[i + k * nthreads] = fc_vec_apply<T, Op>(x[k], y[k]);
  }
  const size_t tail_start = head + nvec * vec::N;
  const size_t nscalar = head + (count - tail_start);
  for (size_t i = tid; i < nscalar; i += nthreads) {
    const size_t e = fc_scalar_index(i, head, tail_start);
    dst[e] = Op::apply(a[e], b[e]);
  }
}

template <typename T>
__global__ void __launch_bounds__(FC_THREADS)
    fc_divide_kernel(T *buf, size_t count, size_t head, size_t nvec, int n) {
  typedef fc_vec<T> vec;
  typedef typename fc_divisor<T>::type divisor_t;
  const divisor_t dn = (divisor_t)n;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nthreads = (size_t)gridDim.x * blockDim.x;
  vec *vb = (vec *)(buf + head);
  for (size_t i = tid; i < nvec; i += nthreads * FC_UNROLL) {
    vec x[FC_UNROLL];
#pragma unroll
    for (unsigned k = 0; k < FC_UNROLL; k++)
      if (i + k * nthreads < nvec) x[k] = vb[i + k * nthreads];
#pragma unroll
    for (unsigned k = 0; k < FC_UNROLL; k++) {
      if (i + k * nthreads >= nvec) continue;
#pragma unroll
      for (int j = 0; j < vec::N; j++) x[k].e[j] = fc_div(x[k].e[j], dn);
      vb[i + k * nthreads] = x[k];
    }
  }
  const size_t tail_start = head + nvec * vec::N;
  const size_t nscalar = head + (count - tail_start);
  for (size_t i = tid; i < nscalar; i += nthreads) {
    const size_t e = fc_scalar_index(i, head, tail_start);
    buf[e] = fc_div(buf[e], dn);
  }
}

/* Copy in units of U (16, 8, 4, 2 or 1 bytes): `head` bytes, `nunits` units, then the rest
 * bytewise. */
template <typename U>
__global__ void __launch_bounds__(FC_THREADS)
    fc_copy_kernel(char *dst, const char *src, size_t bytes, size_t head, size_t nunits) {
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nthreads = (size_t)gridDim.x * blockDim.x;
  U *ud = (U *)(dst + head);
  const U *us = (const U *)(src + head);
  for (size_t i = tid; i < nunits; i += nthreads * FC_UNROLL) {
    U x[FC_UNROLL];
#pragma unroll
    for (unsigned k = 0; k < FC_UNROLL; k++)
      if (i + k * nthreads < nunits) x[k] = us[i + k * nthreads];
#pragma unroll
    for (unsigned k = 0; k < FC_UNROLL; k++)
      if (i + k * nthreads < nunits) ud[i + k * nthreads] = x[k];
  }
  const size_t tail_start = head + nunits * sizeof(U);
  const size_t nscalar = head + (bytes - tail_start);
  for (size_t i = tid; i < nscalar; i += nthreads) {
    const size_t e = fc_scalar_index(i, head, tail_start);
    dst[e] = src[e];
  }
}

/* Launch errors (bad configuration, no device) are reported now; execution errors surface on
 * the stream later, as for any kernel. */
int fc_launched() { return (int)cudaGetLastError(); }

bool fc_elem_aligned(const void *p, size_t esize) { return ((uintptr_t)p & (esize - 1)) == 0; }

/* fc_dispatch target for fc_kernel_reduce. */
struct fc_reduce_launch {
  void *dst;
  const void *a, *b;
  size_t count;
  cudaStream_t stream;
  template <typename V, typename D, class Op> int run() {
    if (!fc_elem_aligned(dst, sizeof(V)) || !fc_elem_aligned(a, sizeof(V)) || !fc_elem_aligned(b, sizeof(V)))
      return (int)cudaErrorInvalidValue;
    const uintptr_t ptrs[3] = {(uintptr_t)dst, (uintptr_t)a, (uintptr_t)b};
    const fc_split s = fc_split_of(ptrs, 3, count, sizeof(V));
    const size_t work = s.nvec + (count - s.nvec * fc_vec<V>::N);
    fc_reduce_kernel<V, Op><<<fc_grid(work), FC_THREADS, 0, stream>>>((V *)dst, (const V *)a, (const V *)b, count,
                                                                      s.head, s.nvec);
    return fc_launched();
  }
};

/* fc_dispatch target for fc_kernel_divide (only D matters; dispatched with SUM). */
struct fc_divide_launch {
  void *buf;
  size_t count;
  int n;
  cudaStream_t stream;
  template <typename V, typename D, class Op> int run() {
    if (!fc_elem_aligned(buf, sizeof(D))) return (int)cudaErrorInvalidValue;
    const uintptr_t ptr = (uintptr_t)buf;
    const fc_split s = fc_split_of(&ptr, 1, count, sizeof(D));
    const size_t work = s.nvec + (count - s.nvec * fc_vec<D>::N);
    fc_divide_kernel<D><<<fc_grid(work), FC_THREADS, 0, stream>>>((D *)buf, count, s.head, s.nvec, n);
    return fc_launched();
  }
};

template <typename U> int fc_copy_launch(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  const size_t w = sizeof(U);
  size_t head = (w - ((uintptr_t)dst & (w - 1))) & (w - 1);
  if (head > bytes) head = bytes;
  const size_t nunits = (bytes - head) / w;
  const size_t work = nunits + (bytes - nunits * w);
  fc_copy_kernel<U><<<fc_grid(work), FC_THREADS, 0, stream>>>((char *)dst, (const char *)src, bytes, head, nunits);
  return fc_launched();
}

}  // namespace

extern "C" int fc_kernel_reduce(void *dst, const void *a, const void *b, size_t count, flexcoll_datatype_t dtype,
                                flexcoll_op_t op, flexcoll_stream_t stream) {
  if ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES || (unsigned)op >= FLEXCOLL_NUM_OPS) return (int)cudaErrorInvalidValue;
  if (count == 0) return (int)cudaSuccess;
  fc_reduce_launch l = {dst, a, b, count, (cudaStream_t)stream};
  return fc_dispatch(dtype, op, l);
}

extern "C" int fc_kernel_divide(void *buf, size_t count, flexcoll_datatype_t dtype, int n, flexcoll_stream_t stream) {
  if ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES) return (int)cudaErrorInvalidValue;
  /* As fc_host_divide: n <= 1 changes nothing (and n < 1 would be meaningless). */
  if (count == 0 || n <= 1) return (int)cudaSuccess;
  fc_divide_launch l = {buf, count, n, (cudaStream_t)stream};
  return fc_dispatch(dtype, FLEXCOLL_SUM, l);
}

extern "C" int fc_kernel_copy(void *dst, const void *src, size_t bytes, flexcoll_stream_t stream) {
  if (bytes == 0) return (int)cudaSuccess;
  /* The widest unit in which dst and src are equally misaligned: after a head of bytes both
   * are aligned to it. */
  const uintptr_t diff = (uintptr_t)dst ^ (uintptr_t)src;
  cudaStream_t s = (cudaStream_t)stream;
  if ((diff & 15u) == 0) return fc_copy_launch<uint4>(dst, src, bytes, s);
  if ((diff & 7u) == 0) return fc_copy_launch<uint2>(dst, src, bytes, s);
  if ((diff & 3u) == 0) return fc_copy_launch<unsigned int>(dst, src, bytes, s);
  if ((diff & 1u) == 0) return fc_copy_launch<unsigned short>(dst, src, bytes, s);
  return fc_copy_launch<unsigned char>(dst, src, bytes, s);
}

extern "C" uint64_t fc_kernel_timeout_ns(int timeout_ms) {
  if (timeout_ms <= 0) return UINT64_MAX;
  return (uint64_t)timeout_ms * 1000000ull;
}

/* ---- loading every kernel up front ----
 * With CUDA's lazy module loading (the default since 12.2) the first launch of a kernel loads
 * it and waits for the work already queued on the device.  In the middle of a collective that
 * work waits on peers, whose own first launches wait likewise: a deadlock.  Asking for each
 * kernel's attributes loads it at communicator creation instead. */
namespace {
struct fc_reduce_preload {
  template <typename V, typename D, class Op> int run() {
    cudaFuncAttributes a;
    int e = (int)cudaFuncGetAttributes(&a, fc_reduce_kernel<V, Op>);
    if (!e) e = (int)cudaFuncGetAttributes(&a, fc_divide_kernel<D>);
    return e;
  }
};
}  // namespace

extern "C" int fc_kernels_preload_reduce(void) {
  fc_reduce_preload p;
  int e = fc_dispatch_all(p);
  cudaFuncAttributes a;
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_copy_kernel<uint4>);
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_copy_kernel<uint2>);
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_copy_kernel<unsigned int>);
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_copy_kernel<unsigned short>);
  if (!e) e = (int)cudaFuncGetAttributes(&a, fc_copy_kernel<unsigned char>);
  return e;
}
