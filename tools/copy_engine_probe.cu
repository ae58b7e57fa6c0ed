/* copy_engine_probe.cu — may a proxy thread feed a spinning kernel through copy engines?
 *
 * The pcie lane's copy-engine mover (lib/gpu/pcie_ce.c) enqueues copies and stream memory writes
 * that ring kernels already running on the device wait for.  That is safe only if those
 * operations are never held back behind the kernels (the hardware-queue rule,
 * docs/ARCHITECTURE.md).  This asks the device, for the CUDA_DEVICE_MAX_CONNECTIONS it runs with:
 *   1. a kernel spins on a host-mapped word; another stream copies (H2D, D2H, D2D) and then writes
 *      the word with cuStreamWriteValue32: does the kernel see it?
 *   2. the same with 1 or 40 streams whose heads wait (cudaStreamWaitEvent) for the spinning
 *      kernel, at the least and greatest stream priority: is the write held back?  (Run it with
 *      WARM=1 too: a fresh process's first operations are, which is why the mover does one copy
 *      and one write on each of its streams at start.)
 *   3. SM stores to pinned host memory with copy engines reading it back at once, and SM loads
 *      with copy engines writing: GB/s each way (what a mixed lane could reach).
 *
 * Not built by make (a development probe for docs/PERFORMANCE.md):
 *   nvcc -O2 -arch=sm_90 -o copy_engine_probe tools/copy_engine_probe.cu -lcuda
 *   for c in 1 8; do CUDA_DEVICE_MAX_CONNECTIONS=$c ./copy_engine_probe; CUDA_DEVICE_MAX_CONNECTIONS=$c WARM=1 ./copy_engine_probe; done
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "probe_check.h"

static double now_s() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Spins until *flag == want or timeout_ns: *result 1 (seen) or 2 (timed out). */
__global__ void spin(volatile unsigned *flag, unsigned want, unsigned long long timeout_ns, unsigned *result) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    if (*flag == want) {
      *result = 1;
      return;
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > timeout_ns) {
      *result = 2;
      return;
    }
  }
}

__global__ void tiny(int *p) {
  if (p) *p = 1;
}

constexpr int T = 512;
__global__ void smcopy(const uint4 *s, uint4 *d, size_t nvec, int cv) {
  size_t per = (nvec + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = lo + per < nvec ? lo + per : nvec;
  size_t i = lo + threadIdx.x;
  for (; i + 7 * T < hi; i += 8 * T) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = cv ? __ldcv(s + i + j * T) : __ldcg(s + i + j * T);
#pragma unroll
    for (int j = 0; j < 8; j++) d[i + j * T] = v[j];
  }
  for (; i < hi; i += T) d[i] = s[i];
}

int main() {
  const size_t bytes = (size_t)256 << 20;
  CK(cudaSetDevice(0));
  const char *c = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  int lo, hi;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  printf("# CUDA_DEVICE_MAX_CONNECTIONS=%s, stream priorities %d (least) .. %d (greatest)\n", c ? c : "(unset)", lo, hi);
  unsigned *flag, *res;
  CK(cudaHostAlloc((void **)&flag, 4096, cudaHostAllocMapped));
  CK(cudaHostAlloc((void **)&res, 4096, cudaHostAllocMapped));
  char *h1, *h2, *d1, *d2;
  CK(cudaHostAlloc((void **)&h1, bytes, cudaHostAllocMapped));
  CK(cudaHostAlloc((void **)&h2, bytes, cudaHostAllocMapped));
  CK(cudaMalloc((void **)&d1, bytes));
  CK(cudaMalloc((void **)&d2, bytes));
  int *scratch;
  CK(cudaMalloc((void **)&scratch, 4));
  CUdeviceptr fp;
  CK(cudaHostGetDevicePointer((void **)&fp, flag, 0));
  if (getenv("WARM")) {
    tiny<<<1, 1>>>(scratch);
    CK(cudaMemcpy(d1, h1, 1 << 20, cudaMemcpyHostToDevice));
    cuStreamWriteValue32(0, fp, 0, 0);
    CK(cudaDeviceSynchronize());
    printf("# warmed up: a kernel launched, a copy and a stream write done\n");
  }
  cudaStream_t a, b;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));

  /* 1. copies and a stream write on another stream while a kernel spins */
  static const char *what[] = {"H2D copy", "D2H copy", "D2D copy", "nothing"};
  for (int kind = 0; kind < 4; kind++) {
    *flag = 0;
    *res = 0;
    spin<<<1, 1, 0, a>>>(flag, 7, 3000000000ull, res);
    CK(cudaGetLastError());
    usleep(20000);
    const double t0 = now_s();
    if (kind == 0) CK(cudaMemcpyAsync(d1, h1, 64 << 20, cudaMemcpyHostToDevice, b));
    if (kind == 1) CK(cudaMemcpyAsync(h2, d2, 64 << 20, cudaMemcpyDeviceToHost, b));
    if (kind == 2) CK(cudaMemcpyAsync(d2, d1, 64 << 20, cudaMemcpyDeviceToDevice, b));
    if (cuStreamWriteValue32(b, fp, 7, 0) != CUDA_SUCCESS) printf("cuStreamWriteValue32 failed\n");
    CK(cudaStreamSynchronize(a));
    printf("1. %-8s then a stream write, another stream: %s after %.1f ms\n", what[kind],
           *res == 1 ? "seen" : "NOT SEEN (timed out)", (now_s() - t0) * 1e3);
    CK(cudaStreamSynchronize(b));
  }

  /* 2. the same behind streams waiting for the kernel */
  const int waiting[] = {1, 40, 1};
  for (int pi = 0; pi < 2; pi++)
    for (int wi = 0; wi < 3; wi++) {
      const int nw = waiting[wi];
      cudaStream_t p, w[64];
      for (int i = 0; i < nw; i++) CK(cudaStreamCreateWithFlags(&w[i], cudaStreamNonBlocking));
      CK(cudaStreamCreateWithPriority(&p, cudaStreamNonBlocking, pi ? hi : lo));
      cudaEvent_t ev;
      CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      *flag = 0;
      *res = 0;
      spin<<<1, 1, 0, a>>>(flag, 7, 2000000000ull, res);
      CK(cudaEventRecord(ev, a));
      for (int i = 0; i < nw; i++) {
        CK(cudaStreamWaitEvent(w[i], ev, 0));
        tiny<<<1, 1, 0, w[i]>>>(scratch);
      }
      usleep(10000);
      CK(cudaMemcpyAsync(d1, h1, 1 << 20, cudaMemcpyHostToDevice, p));
      if (cuStreamWriteValue32(p, fp, 7, 0) != CUDA_SUCCESS) printf("cuStreamWriteValue32 failed\n");
      CK(cudaStreamSynchronize(a));
      printf("2. copy + write at %s priority, %2d streams waiting for the kernel: %s\n", pi ? "greatest" : "least   ", nw,
             *res == 1 ? "seen" : "HELD BACK (the kernel timed out)");
      CK(cudaDeviceSynchronize());
      for (int i = 0; i < nw; i++) CK(cudaStreamDestroy(w[i]));
      CK(cudaStreamDestroy(p));
      CK(cudaEventDestroy(ev));
    }

  /* 3. SM one way and copy engines the other, at once */
  cudaEvent_t e0, e1, e2;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&e2));
  const int blocks[] = {16, 32, 64, 128};
  for (int mode = 0; mode < 2; mode++)
    for (int bl : blocks) {
      float best = 1e9f, bsm = 0, bce = 0;
      for (int rep = 0; rep < 5; rep++) {
        CK(cudaEventRecord(e0, a));
        CK(cudaStreamWaitEvent(b, e0, 0));
        if (mode == 0) {
          smcopy<<<bl, T, 0, a>>>((const uint4 *)d1, (uint4 *)h1, bytes / 16, 0);
          CK(cudaMemcpyAsync(d2, h2, bytes, cudaMemcpyHostToDevice, b));
        } else {
          smcopy<<<bl, T, 0, a>>>((const uint4 *)h1, (uint4 *)d1, bytes / 16, 1);
          CK(cudaMemcpyAsync(h2, d2, bytes, cudaMemcpyDeviceToHost, b));
        }
        CK(cudaEventRecord(e1, a));
        CK(cudaEventRecord(e2, b));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventSynchronize(e2));
        float m1, m2;
        CK(cudaEventElapsedTime(&m1, e0, e1));
        CK(cudaEventElapsedTime(&m2, e0, e2));
        const float m = m1 > m2 ? m1 : m2;
        if (rep && m < best) best = m, bsm = m1, bce = m2;
      }
      printf("3. %s blocks=%-4d SM %.1f GB/s, copy engine %.1f GB/s, both done: %.1f GB/s each way\n",
             mode == 0 ? "SM stores D2H + CE H2D" : "SM loads H2D + CE D2H ", bl, bytes / 1e6 / bsm, bytes / 1e6 / bce,
             bytes / 1e6 / best);
    }
  return 0;
}
