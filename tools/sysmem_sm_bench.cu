/* sysmem_sm_bench.cu — how fast SMs read and write pinned host memory, against the copy engines.
 *
 * The pcie lane of the ring kernels (lib/kernels/ring.cu) moves its bytes with SM stores into a
 * peer's pinned host area and SM loads from its own: this measures those two access patterns
 * alone and together (half the blocks reading, half writing, as two ranks' lanes do on one
 * GPU), for load flavours (.cg, .cv: the lane must not read a stale cached line), vectors in
 * flight per thread and block counts, next to cudaMemcpyAsync in each direction and both at
 * once (the raw staged copy's hops).  GB/s of payload per direction, best of 5.
 *
 * Not built by make (a development benchmark for docs/PERFORMANCE.md):
 *   nvcc -O3 -arch=sm_90 -o sysmem_sm_bench tools/sysmem_sm_bench.cu && ./sysmem_sm_bench [MiB]
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

constexpr int THREADS = 512;

template <bool CV> __device__ __forceinline__ uint4 load(const uint4 *p) { return CV ? __ldcv(p) : __ldcg(p); }

/* Blocks [0, rblocks) copy host src -> device dst; blocks [rblocks, grid) copy device wsrc ->
 * host wdst.  Each block owns a contiguous part; each thread keeps U vectors in flight. */
template <bool CV, int U>
__global__ void __launch_bounds__(THREADS) sm_copy(const uint4 *src, uint4 *dst, const uint4 *wsrc, uint4 *wdst,
                                                   size_t nvec, unsigned rblocks) {
  const bool reader = blockIdx.x < rblocks;
  const unsigned idx = reader ? blockIdx.x : blockIdx.x - rblocks;
  const unsigned nb = reader ? rblocks : gridDim.x - rblocks;
  const uint4 *s = reader ? src : wsrc;
  uint4 *d = reader ? dst : wdst;
  const size_t per = (nvec + nb - 1) / nb, lo = idx * per, hi = lo + per < nvec ? lo + per : nvec;
  size_t i = lo + threadIdx.x;
  for (; i + (U - 1) * THREADS < hi; i += U * THREADS) {
    uint4 v[U];
#pragma unroll
    for (int j = 0; j < U; j++) v[j] = reader ? load<CV>(s + i + j * THREADS) : __ldcg(s + i + j * THREADS);
#pragma unroll
    for (int j = 0; j < U; j++) d[i + j * THREADS] = v[j];
  }
  for (; i < hi; i += THREADS) d[i] = reader ? load<CV>(s + i) : __ldcg(s + i);
}

static float time_ms(cudaStream_t st, void (*fn)(void *), void *ctx) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int r = 0; r < 6; r++) {
    CK(cudaEventRecord(a, st));
    fn(ctx);
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0 && ms < best) best = ms; /* the first run warms up */
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return best;
}

struct run_t {
  uint4 *h_src, *h_dst, *d_src, *d_dst;
  size_t bytes;
  unsigned rblocks, wblocks;
  int cv, unroll;
  cudaStream_t st, st2;
};

template <bool CV, int U> static void launch_t(run_t *r) {
  const unsigned grid = r->rblocks + r->wblocks;
  sm_copy<CV, U><<<grid, THREADS, 0, r->st>>>(r->h_src, r->d_dst, r->d_src, r->h_dst, r->bytes / 16, r->rblocks);
}

static void launch(void *ctx) {
  run_t *r = (run_t *)ctx;
  switch (r->unroll * 2 + r->cv) {
    case 8: launch_t<false, 4>(r); break;
    case 9: launch_t<true, 4>(r); break;
    case 16: launch_t<false, 8>(r); break;
    case 17: launch_t<true, 8>(r); break;
    case 32: launch_t<false, 16>(r); break;
    default: launch_t<true, 16>(r); break;
  }
  CK(cudaGetLastError());
}

static int g_dir; /* 1: H2D, 2: D2H, 3: both on two streams */
static void copy_engines(void *ctx) {
  run_t *r = (run_t *)ctx;
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CK(cudaEventRecord(e, r->st));
  CK(cudaStreamWaitEvent(r->st2, e, 0));
  if (g_dir & 1) CK(cudaMemcpyAsync(r->d_dst, r->h_src, r->bytes, cudaMemcpyHostToDevice, r->st));
  if (g_dir & 2) CK(cudaMemcpyAsync(r->h_dst, r->d_src, r->bytes, cudaMemcpyDeviceToHost, g_dir == 3 ? r->st2 : r->st));
  CK(cudaEventRecord(e, r->st2));
  CK(cudaStreamWaitEvent(r->st, e, 0));
  CK(cudaEventDestroy(e));
}

int main(int argc, char **argv) {
  run_t r = {};
  r.bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 256) << 20;
  CK(cudaSetDevice(0));
  CK(cudaHostAlloc((void **)&r.h_src, r.bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  CK(cudaHostAlloc((void **)&r.h_dst, r.bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  CK(cudaMalloc((void **)&r.d_src, r.bytes));
  CK(cudaMalloc((void **)&r.d_dst, r.bytes));
  CK(cudaMemset(r.d_src, 1, r.bytes));
  for (size_t i = 0; i < r.bytes / 16; i += 4096) r.h_src[i] = make_uint4(1, 2, 3, 4);
  CK(cudaStreamCreateWithFlags(&r.st, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&r.st2, cudaStreamNonBlocking));
  const double mb = (double)r.bytes / 1e6;
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("# %s, %d SMs, %zu MiB per direction, GB/s per direction (best of 5)\n", p.name, p.multiProcessorCount,
         r.bytes >> 20);
  const char *names[] = {"", "copy engine H2D", "copy engine D2H", "copy engines both"};
  for (g_dir = 1; g_dir <= 3; g_dir++) printf("%-40s %8.1f\n", names[g_dir], mb / time_ms(r.st, copy_engines, &r));
  printf("# SM copies: kind load unroll blocks -> GB/s\n");
  const unsigned blocks[] = {8, 16, 32, 64, 128};
  const int unrolls[] = {4, 8, 16};
  for (int kind = 0; kind < 3; kind++) {          /* 0: read host, 1: write host, 2: both */
    for (int cv = kind == 1 ? 0 : 1; cv >= 0; cv--) { /* writes have no load flavour */
      for (int u : unrolls) {
        for (unsigned b : blocks) {
          r.cv = cv;
          r.unroll = u;
          r.rblocks = kind == 1 ? 0 : b;
          r.wblocks = kind == 0 ? 0 : b;
          const float ms = time_ms(r.st, launch, &r);
          printf("%-6s %-3s U=%-2d blocks=%-4u %8.1f\n", kind == 0 ? "read" : kind == 1 ? "write" : "both",
                 kind == 1 ? "-" : cv ? "cv" : "cg", u, b, mb / ms);
        }
      }
    }
  }
  return 0;
}
