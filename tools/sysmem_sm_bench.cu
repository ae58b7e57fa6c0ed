/* sysmem_sm_bench.cu — how fast SMs read and write pinned host memory, against the copy engines.
 *
 * The pcie lane of the ring kernels (lib/kernels/ring.cu) moves its bytes with SM stores into a
 * peer's pinned host area and SM loads from its own: this measures those two access patterns
 * alone and together (half the blocks reading, half writing, as two ranks' lanes do on one
 * GPU), for load flavours (.cg, .cv: the lane must not read a stale cached line), vectors in
 * flight per thread and block counts, next to cudaMemcpyAsync in each direction and both at
 * once (the raw staged copy's hops).  GB/s of payload per direction, best of 5.
 *
 * A second part (`./sysmem_sm_bench MiB tma`) asks whether the ceiling of loads and stores at once
 * belongs to the port or to the way SMs ask: readers and writers in unequal numbers, and copies
 * through shared memory by the Tensor Memory Accelerator (cp.async.bulk: one thread issues
 * requests of a whole stage, as a copy engine does), in stages of a few KiB.
 *
 * Not built by make (a development benchmark for docs/PERFORMANCE.md):
 *   nvcc -O3 -arch=sm_90 -o sysmem_sm_bench tools/sysmem_sm_bench.cu && ./sysmem_sm_bench [MiB] [tma]
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* TMA copies: blocks [0, rblocks) copy host src -> device dst, the rest device wsrc -> host wdst,
 * each block its contiguous part in stages of `stage` bytes, `nstage` stages in flight: bulk loads
 * into shared memory (an mbarrier per stage counts the bytes), bulk stores out of it; a stage is
 * loaded again once its store has read it (wait_group.read 1: the newest store may still run). */
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bulk_load(unsigned dst, const void *src, unsigned bytes, unsigned bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__global__ void tma_copy(const char *src, char *dst, const char *wsrc, char *wdst, size_t bytes, unsigned rblocks,
                         unsigned stage, unsigned nstage) {
  extern __shared__ __align__(128) char buf[];
  __shared__ __align__(8) unsigned long long bars[16];
  if (threadIdx.x != 0) return;
  const bool reader = blockIdx.x < rblocks;
  const unsigned idx = reader ? blockIdx.x : blockIdx.x - rblocks;
  const unsigned nb = reader ? rblocks : gridDim.x - rblocks;
  const char *s = reader ? src : wsrc;
  char *d = reader ? dst : wdst;
  size_t per = (bytes + nb - 1) / nb;
  per = (per + 15) & ~(size_t)15;
  const size_t lo = idx * per, hi = lo + per < bytes ? lo + per : bytes;
  if (lo >= hi) return;
  const size_t n = (hi - lo + stage - 1) / stage;
  for (unsigned k = 0; k < nstage; k++)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[k])) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  auto len = [&](size_t k) { return (unsigned)(lo + (k + 1) * stage <= hi ? stage : hi - lo - k * stage); };
  for (size_t k = 0; k < n && k < nstage; k++) bulk_load(smem_u32(buf + k * stage), s + lo + k * stage, len(k), smem_u32(&bars[k]));
  for (size_t k = 0; k < n; k++) {
    const unsigned st = k % nstage;
    bar_wait(smem_u32(&bars[st]), (unsigned)((k / nstage) & 1));
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(d + lo + k * stage),
                 "r"(smem_u32(buf + st * stage)), "r"(len(k))
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    if (k >= 1 && k - 1 + nstage < n) {
      const size_t j = k - 1 + nstage; /* refill the stage store k-1 has finished reading */
      const unsigned sj = j % nstage;
      bulk_load(smem_u32(buf + sj * stage), s + lo + j * stage, len(j), smem_u32(&bars[sj]));
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
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
  unsigned stage, nstage;
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

static void launch_tma(void *ctx) {
  run_t *r = (run_t *)ctx;
  const unsigned smem = r->stage * r->nstage;
  CK(cudaFuncSetAttribute(tma_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  tma_copy<<<r->rblocks + r->wblocks, 32, smem, r->st>>>((const char *)r->h_src, (char *)r->d_dst,
                                                          (const char *)r->d_src, (char *)r->h_dst, r->bytes,
                                                          r->rblocks, r->stage, r->nstage);
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
  if (argc > 2) { /* the second part: unequal readers and writers, and TMA copies */
    printf("# SM loads and stores at once, unequal: readers writers (cv, U=8) -> GB/s each way (the slower)\n");
    const unsigned rb[] = {64, 96, 128, 192}, wb[] = {16, 32, 64};
    r.cv = 1;
    r.unroll = 8;
    for (unsigned a : rb)
      for (unsigned b : wb) {
        r.rblocks = a;
        r.wblocks = b;
        printf("both   cv  U=8  readers=%-4u writers=%-4u %8.1f\n", a, b, mb / time_ms(r.st, launch, &r));
      }
    memset(r.h_src, 0x5a, r.bytes);
    CK(cudaMemset(r.d_dst, 0, r.bytes));
    printf("# TMA: kind stage nstage blocks(readers+writers) -> GB/s per direction\n");
    const unsigned stages[] = {4096, 16384, 32768}, nstages[] = {2, 4}, tb[] = {16, 32, 64, 132};
    for (int kind = 0; kind < 3; kind++)
      for (unsigned sz : stages)
        for (unsigned ns : nstages)
          for (unsigned b : tb) {
            r.stage = sz;
            r.nstage = ns;
            r.rblocks = kind == 1 ? 0 : b;
            r.wblocks = kind == 0 ? 0 : b;
            const float ms = time_ms(r.st, launch_tma, &r);
            /* check the last run's bytes both ways */
            static uint4 probe[2];
            CK(cudaMemcpy(probe, (char *)r.d_dst + r.bytes - 32, 32, cudaMemcpyDeviceToHost));
            const bool ok = kind == 1 || memcmp(probe, (char *)r.h_src + r.bytes - 32, 32) == 0;
            printf("tma-%-5s stage=%-6u n=%u blocks=%-4u %8.1f%s\n", kind == 0 ? "read" : kind == 1 ? "write" : "both",
                   sz, ns, b, mb / ms, ok ? "" : " WRONG");
          }
    return 0;
  }
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
