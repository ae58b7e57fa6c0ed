/* perf_cuda.c — flexcoll-perf's buffers and streams: CUDA device memory when built with CUDA,
 * plain host memory for device -1 (and on builds without CUDA). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "perf.h"

#if HAVE_CUDA
#include <cuda_runtime.h>

int perf_gpu_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
  return n;
}
int perf_set_device(int dev) { return cudaSetDevice(dev) != cudaSuccess; }
void perf_device_info(int device, perf_device_t *d) {
  struct cudaDeviceProp p;
  d->device = device;
  snprintf(d->name, sizeof d->name, "host");
  if (device >= 0 && cudaGetDeviceProperties(&p, device) == cudaSuccess) {
    snprintf(d->name, sizeof d->name, "%.63s", p.name);
    d->pci_bus = p.pciBusID;
  }
}
void *perf_alloc(size_t bytes, int device) {
  if (device < 0) return malloc(bytes);
  void *p = NULL;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}
void perf_free(void *p, int device) {
  if (device < 0) free(p);
  else cudaFree(p);
}
int perf_copy(void *dst, const void *src, size_t bytes, int device, void *stream) {
  if (device < 0) { memcpy(dst, src, bytes); return 0; }
  /* On the rank's own stream, waited for: cudaMemcpy runs on the legacy stream, which the
   * rank's non-blocking stream does not wait for, and from pageable memory it may return
   * before its bytes reached the device, so a collective could read them before they land. */
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream) != cudaSuccess ||
         cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess;
}
void *perf_stream_create(int device) {
  cudaStream_t s = NULL;
  (void)device;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return s;
}
void perf_stream_destroy(void *stream, int device) { (void)device; cudaStreamDestroy((cudaStream_t)stream); }
int perf_stream_sync(void *stream, int device) {
  if (device < 0) return 0;
  return cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess;
}
int perf_graph_begin(void *stream, char *err, size_t errlen) {
  cudaError_t e = cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) snprintf(err, errlen, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
  return e != cudaSuccess;
}
int perf_graph_end(void *stream, void **graph, char *err, size_t errlen) {
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
  if (g) cudaGraphDestroy(g);
  if (e != cudaSuccess) snprintf(err, errlen, "ending the capture: %s", cudaGetErrorString(e));
  *graph = exec;
  return e != cudaSuccess;
}
int perf_graph_launch(void *graph, void *stream) {
  return cudaGraphLaunch((cudaGraphExec_t)graph, (cudaStream_t)stream) != cudaSuccess;
}
void perf_graph_destroy(void *graph) {
  if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}
#else
int perf_gpu_count(void) { return 0; }
void perf_device_info(int device, perf_device_t *d) {
  d->device = device;
  snprintf(d->name, sizeof d->name, "host");
}
int perf_set_device(int dev) { (void)dev; return 1; }
void *perf_alloc(size_t bytes, int device) { (void)device; return malloc(bytes); }
void perf_free(void *p, int device) { (void)device; free(p); }
int perf_copy(void *dst, const void *src, size_t bytes, int device, void *stream) {
  (void)device;
  (void)stream;
  memcpy(dst, src, bytes);
  return 0;
}
void *perf_stream_create(int device) { (void)device; return NULL; }
void perf_stream_destroy(void *stream, int device) { (void)stream; (void)device; }
int perf_stream_sync(void *stream, int device) { (void)stream; (void)device; return 0; }
int perf_graph_begin(void *stream, char *err, size_t errlen) {
  (void)stream;
  snprintf(err, errlen, "this build has no CUDA");
  return 1;
}
int perf_graph_end(void *stream, void **graph, char *err, size_t errlen) {
  (void)stream;
  *graph = NULL;
  snprintf(err, errlen, "this build has no CUDA");
  return 1;
}
int perf_graph_launch(void *graph, void *stream) { (void)graph; (void)stream; return 1; }
void perf_graph_destroy(void *graph) { (void)graph; }
#endif
