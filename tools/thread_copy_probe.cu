/* thread_copy_probe.cu — which CUDA calls of one thread wait for another thread's kernel?
 *
 * Ranks that are threads of one process on one GPU (tests/test_capture, tests/test_onegpu) share
 * the process's CUDA context.  A rank's kernel waits for its peer's; if the peer's thread is held
 * in a CUDA call until that kernel ends, neither moves until the kernel's timeout.  Session 35
 * traced test_capture's stall at its round 5 (docs/ARCHITECTURE.md, known problems) to such a
 * pair.  This probe times each candidate: thread A launches a kernel that spins on a flag (up to
 * 3 s), then makes call A; thread B sleeps 200 ms, makes call B, then launches the kernel that
 * raises the flag.  "DEADLOCK" means B's kernel only ran after A's gave up.
 *
 *   nvcc -arch=sm_90 -o thread_copy_probe tools/thread_copy_probe.cu && ./thread_copy_probe
 *
 * Results (H100, session 35): docs/PERFORMANCE.md, "Session 35". */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__global__ void spin(volatile int *flag, int *gave_up) {
  long long t0 = clock64();
  while (!*flag) {
    if (clock64() - t0 > 3LL * 2000000000LL) { *gave_up = 1; return; }
  }
}
__global__ void raise_flag(volatile int *flag) { *flag = 1; __threadfence_system(); }
__global__ void nop() {}

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static int *flag, *gave_up, *dbuf;
static char *pinned;
static const char *opA, *opB;
static cudaGraphExec_t gexec;

static void *thread_a(void *) {
  cudaSetDevice(0);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  spin<<<1, 1, 0, s>>>(flag, gave_up);
  double t = now();
  static char page[4096];
  if (!strcmp(opA, "d2h_pageable")) cudaMemcpyAsync(page, dbuf, 4096, cudaMemcpyDeviceToHost, s);
  else if (!strcmp(opA, "d2h_pinned")) cudaMemcpyAsync(pinned, dbuf, 4096, cudaMemcpyDeviceToHost, s);
  else if (!strcmp(opA, "sync")) cudaStreamSynchronize(s);
  double a = now() - t;
  cudaStreamSynchronize(s);
  fprintf(stderr, "  A: %s took %.3f s\n", opA, a);
  return NULL;
}
static void *thread_b(void *) {
  cudaSetDevice(0);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  usleep(200000);
  static char page[4096];
  double t = now();
  if (!strcmp(opB, "h2d_pageable")) cudaMemcpyAsync(dbuf + 2048, page, 4096, cudaMemcpyHostToDevice, s);
  else if (!strcmp(opB, "h2d_pinned")) cudaMemcpyAsync(dbuf + 2048, pinned + 4096, 4096, cudaMemcpyHostToDevice, s);
  else if (!strcmp(opB, "d2h_pageable")) cudaMemcpyAsync(page, dbuf + 2048, 4096, cudaMemcpyDeviceToHost, s);
  else if (!strcmp(opB, "graph_exec_destroy")) cudaGraphExecDestroy(gexec);
  else if (!strcmp(opB, "malloc")) { void *p; cudaMalloc(&p, 1 << 20); }
  else if (!strcmp(opB, "free")) { void *p; cudaMalloc(&p, 1 << 20); t = now(); cudaFree(p); }
  else if (!strcmp(opB, "memset")) cudaMemsetAsync(dbuf + 2048, 0, 4096, s);
  else if (!strcmp(opB, "event_sync_other")) { cudaEvent_t e; cudaEventCreate(&e); cudaEventRecord(e, s); cudaEventSynchronize(e); }
  double b = now() - t;
  raise_flag<<<1, 1, 0, s>>>(flag);
  cudaStreamSynchronize(s);
  fprintf(stderr, "  B: %s took %.3f s\n", opB, b);
  return NULL;
}

int main(int argc, char **argv) {
  int nd = 0;
  if (cudaGetDeviceCount(&nd) != cudaSuccess || !nd) { fprintf(stderr, "no GPU\n"); return 77; }
  cudaSetDevice(0);
  cudaMalloc(&flag, 4); cudaMalloc(&gave_up, 4); cudaMalloc(&dbuf, 1 << 16);
  cudaMallocHost(&pinned, 1 << 16);
  const char *pairs[][2] = {{"d2h_pageable", "h2d_pageable"}, {"d2h_pageable", "h2d_pinned"}, {"d2h_pageable", "memset"},
                            {"d2h_pageable", "d2h_pageable"}, {"sync", "h2d_pageable"}, {"d2h_pinned", "h2d_pageable"},
                            {"sync", "graph_exec_destroy"}, {"d2h_pageable", "graph_exec_destroy"},
                            {"sync", "malloc"}, {"sync", "free"}, {"sync", "event_sync_other"}};
  for (auto &p : pairs) {
    opA = p[0]; opB = p[1];
    cudaMemset(flag, 0, 4); cudaMemset(gave_up, 0, 4);
    { // a launched and finished graph for B to destroy
      cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      cudaGraph_t g; cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal); nop<<<1, 1, 0, s>>>(); cudaStreamEndCapture(s, &g);
      cudaGraphInstantiate(&gexec, g, 0); cudaGraphDestroy(g); cudaGraphLaunch(gexec, s); cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
    cudaDeviceSynchronize();
    fprintf(stderr, "A %s while its kernel waits; B %s before raising the flag:\n", opA, opB);
    pthread_t a, b;
    pthread_create(&a, NULL, thread_a, NULL); pthread_create(&b, NULL, thread_b, NULL);
    pthread_join(a, NULL); pthread_join(b, NULL);
    int g = 0; cudaMemcpy(&g, gave_up, 4, cudaMemcpyDeviceToHost);
    fprintf(stderr, "  -> %s\n", g ? "DEADLOCK (A's kernel gave up after 3 s)" : "ok");
    if (strcmp(opB, "graph_exec_destroy")) cudaGraphExecDestroy(gexec);
  }
  return 0;
}
