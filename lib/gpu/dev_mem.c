/* dev_mem.c — device memory for the links that move it themselves (gpu.h): the rdma link reads
 * and writes user device buffers through the NIC (GPUDirect RDMA) where it can register them,
 * and copies them where it cannot; the host executor, running a schedule on device buffers,
 * reduces and copies them here.
 *
 * Copies and reductions run on one non-blocking stream per device, made at the first use and
 * kept for the process: cudaMemcpy would run on the legacy default stream, which waits for every blocking
 * stream's work on the device, and another rank's kernel sharing the GPU may be spinning there
 * until this very copy lands.
 *
 * Pageable host memory never meets the device here either.  The driver copies it through
 * staging buffers of its own, shared by the process's streams, so such a copy can wait behind
 * any pageable copy the application queued behind one of our kernels (a result copied into a
 * malloc'd buffer), while that kernel spins for the very bytes the copy moves.  Copies between
 * device memory and pageable memory go through a pinned bounce buffer of our own, per device,
 * made by fc_mem_prepare where a caller knows it will copy while kernels run (a ring lane's proxy
 * over a link), else at the first such copy.  A link whose own host memory meets device bytes
 * on every message (the rdma link's slots) pins it instead (fc_mem_pin), so that those copies go
 * by DMA in one step.
 *
 * A registration goes through dma-buf, as NVIDIA's open kernel modules and rdma-core (34+)
 * offer it: the allocation around the buffer is exported as a dma-buf file descriptor
 * (cuMemGetHandleForAddressRange) and the NIC's driver maps those pages itself; the older
 * nvidia-peermem module, which lets ibv_reg_mr take a device address, is the rdma link's
 * fallback. */
#define _GNU_SOURCE
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "gpu/gpu.h"

#if HAVE_CUDA
#include <pthread.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "gpu/device.h"
#include "kernels/kernels.h"

#define MAX_DEVICES 64

/* The bounce buffer's size: copies longer than it go in pieces. */
#define BOUNCE_BYTES ((size_t)4 << 20)

static pthread_mutex_t copy_lock[MAX_DEVICES];
static cudaStream_t copy_stream[MAX_DEVICES];
static char *bounce[MAX_DEVICES]; /* pinned, under copy_lock */
static pthread_once_t copy_once = PTHREAD_ONCE_INIT;

static void copy_init(void) {
  for (int d = 0; d < MAX_DEVICES; d++) pthread_mutex_init(&copy_lock[d], NULL);
}

/* Let dev's stream go without waiting for it (the caller has set why): -1. */
static int stream_drop(int dev, int prev) {
  pthread_mutex_unlock(&copy_lock[dev]);
  fc_gpu_leave_device(prev);
  return -1;
}

/* The copy stream of dev (the device of memory the caller asked fc_mem_type about), locked and
 * current: dev, or -1 with the reason (then nothing is held). */
static int stream_enter(int dev, const char *what, int *prev, char *why, size_t len) {
  if (dev < 0 || dev >= MAX_DEVICES) {
    snprintf(why, len, "%s: no device memory (device %d)", what, dev);
    return -1;
  }
  pthread_once(&copy_once, copy_init);
  *prev = fc_gpu_switch_device(dev);
  pthread_mutex_lock(&copy_lock[dev]);
  if (!copy_stream[dev] && cudaStreamCreateWithFlags(&copy_stream[dev], cudaStreamNonBlocking) != cudaSuccess) {
    copy_stream[dev] = NULL;
    snprintf(why, len, "%s: cannot create a stream on device %d: %s", what, dev, cudaGetErrorString(cudaGetLastError()));
    return stream_drop(dev, *prev);
  }
  return dev;
}

/* The device of device memory at ptr, or -1. */
static int device_of(const void *ptr) {
  int dev = -1;
  return fc_mem_type(ptr, &dev) == FC_MEM_DEVICE ? dev : -1;
}

/* dev's bounce buffer (its stream held): made now if it is not yet; NULL with the reason. */
static char *bounce_of(int dev, char *why, size_t len) {
  if (!bounce[dev] && cudaHostAlloc((void **)&bounce[dev], BOUNCE_BYTES, cudaHostAllocPortable) != cudaSuccess) {
    bounce[dev] = NULL;
    snprintf(why, len, "cannot allocate %zu bytes of pinned memory: %s", BOUNCE_BYTES,
             cudaGetErrorString(cudaGetLastError()));
  }
  return bounce[dev];
}

/* Wait for what was enqueued (e: the enqueue's own error), then let the stream go. */
static int stream_leave(int dev, int prev, cudaError_t e, const char *what, char *why, size_t len) {
  if (e == cudaSuccess) e = cudaStreamSynchronize(copy_stream[dev]);
  pthread_mutex_unlock(&copy_lock[dev]);
  if (e != cudaSuccess) {
    snprintf(why, len, "%s: %s", what, cudaGetErrorString(e));
    cudaGetLastError();
  }
  fc_gpu_leave_device(prev);
  return e == cudaSuccess ? 0 : -1;
}

int fc_mem_copy(void *dst, const void *src, size_t bytes, char *why, size_t len) {
  if (!bytes || dst == src) return 0;
  int ddev, sdev, dpinned, spinned;
  const fc_mem_t dt = fc_mem_query(dst, &ddev, &dpinned), st = fc_mem_query(src, &sdev, &spinned);
  if (dt == FC_MEM_HOST && st == FC_MEM_HOST) {
    memcpy(dst, src, bytes);
    return 0;
  }
  char what[64];
  snprintf(what, sizeof what, "copying %zu bytes %s device memory", bytes, dt == FC_MEM_DEVICE ? "into" : "out of");
  int prev;
  const int dev = stream_enter(dt == FC_MEM_DEVICE ? ddev : sdev, what, &prev, why, len);
  if (dev < 0) return -1;
  const int to_host = dt == FC_MEM_HOST, from_host = st == FC_MEM_HOST;
  if ((!to_host || dpinned) && (!from_host || spinned))
    return stream_leave(dev, prev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_stream[dev]), what, why, len);
  /* Pageable on one side: through the bounce buffer, a piece at a time. */
  char *b = bounce_of(dev, why, len);
  if (!b) return stream_drop(dev, prev);
  cudaError_t e = cudaSuccess;
  for (size_t at = 0; e == cudaSuccess && at < bytes; at += BOUNCE_BYTES) {
    const size_t n = bytes - at < BOUNCE_BYTES ? bytes - at : BOUNCE_BYTES;
    if (from_host) memcpy(b, (const char *)src + at, n);
    e = cudaMemcpyAsync(from_host ? (char *)dst + at : b, from_host ? b : (const char *)src + at, n, cudaMemcpyDefault,
                        copy_stream[dev]);
    if (e == cudaSuccess) e = cudaStreamSynchronize(copy_stream[dev]);
    if (e == cudaSuccess && to_host) memcpy((char *)dst + at, b, n);
  }
  return stream_leave(dev, prev, e, what, why, len);
}

int fc_mem_prepare(int device, void *warm, char *why, size_t len) {
  int prev;
  const int dev = stream_enter(device, "preparing device copies", &prev, why, len);
  if (dev < 0) return -1;
  char *b = bounce_of(dev, why, len);
  if (!b) return stream_drop(dev, prev);
  /* A first copy each way (the bytes go back where they were). */
  cudaError_t e = cudaSuccess;
  if (warm) e = cudaMemcpyAsync(b, warm, 16, cudaMemcpyDeviceToHost, copy_stream[dev]);
  if (warm && e == cudaSuccess) e = cudaMemcpyAsync(warm, b, 16, cudaMemcpyHostToDevice, copy_stream[dev]);
  return stream_leave(dev, prev, e, "preparing device copies", why, len);
}

int fc_mem_pin(void *ptr, size_t bytes, char *why, size_t len) {
  /* Portable: ranks of one process may run on other devices, and one link's slots serve them. */
  const cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    snprintf(why, len, "cudaHostRegister of %zu bytes: %s", bytes, cudaGetErrorString(e));
    cudaGetLastError();
    return -1;
  }
  fc_host_pages_forget();
  return 0;
}

void fc_mem_unpin(void *ptr) {
  if (ptr && cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
}

int fc_mem_reduce(void *dst, const void *a, const void *b, size_t count, flexcoll_datatype_t dtype, flexcoll_op_t op,
                  char *why, size_t len) {
  if (!count) return 0;
  const char *what = "reducing on the device";
  int prev;
  const int dev = stream_enter(device_of(dst), what, &prev, why, len);
  if (dev < 0) return -1;
  const cudaError_t e = (cudaError_t)fc_kernel_reduce(dst, a, b, count, dtype, op, copy_stream[dev]);
  return stream_leave(dev, prev, e, what, why, len);
}

int fc_mem_divide(void *buf, size_t count, flexcoll_datatype_t dtype, int n, char *why, size_t len) {
  if (!count) return 0;
  const char *what = "dividing on the device";
  int prev;
  const int dev = stream_enter(device_of(buf), what, &prev, why, len);
  if (dev < 0) return -1;
  return stream_leave(dev, prev, (cudaError_t)fc_kernel_divide(buf, count, dtype, n, copy_stream[dev]), what, why, len);
}

void *fc_mem_alloc_device(int device, size_t bytes, char *why, size_t len) {
  void *p = NULL;
  const int prev = fc_gpu_switch_device(device);
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    snprintf(why, len, "cudaMalloc of %zu bytes on device %d: %s", bytes, device, cudaGetErrorString(e));
    cudaGetLastError();
    p = NULL;
  }
  fc_gpu_leave_device(prev);
  return p;
}

void fc_mem_free_device(void *p) {
  const int dev = p ? device_of(p) : -1;
  if (dev < 0) return;
  const int prev = fc_gpu_switch_device(dev);
  if (cudaFree(p) != cudaSuccess) cudaGetLastError();
  fc_gpu_leave_device(prev);
}

typedef CUresult (*get_range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*get_handle_fn)(void *, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
typedef CUresult (*get_attrs_fn)(unsigned, CUpointer_attribute *, void **, CUdeviceptr);
static get_range_fn get_range;
static get_handle_fn get_handle;
static get_attrs_fn get_attrs;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

/* The driver's functions through the runtime (the library links cudart, not libcuda). */
static void *driver_fn(const char *name) {
  enum cudaDriverEntryPointQueryResult q;
  void *f = NULL;
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    f = NULL;
  cudaGetLastError();
  return f;
}

static void driver_init(void) {
  get_range = (get_range_fn)driver_fn("cuMemGetAddressRange");
  get_handle = (get_handle_fn)driver_fn("cuMemGetHandleForAddressRange");
  get_attrs = (get_attrs_fn)driver_fn("cuPointerGetAttributes");
}

int fc_gpu_alloc_of(const void *ptr, fc_gpu_alloc_t *a) {
  pthread_once(&driver_once, driver_init);
  if (!get_attrs) return -1;
  /* One driver call (the rdma link asks at every rendezvous message).  Pointer attributes need
   * no current context: a pointer names its own.  Memory from a pool (cudaMallocAsync) or mapped
   * by the virtual memory API is not cudaMalloc's: neither answers as legacy IPC capable. */
  CUdeviceptr base = 0;
  size_t size = 0;
  unsigned long long id = 0;
  int legacy = 0;
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  void *values[] = {&id, &base, &size, &legacy};
  /* Unlike cuPointerGetAttribute, a pointer CUDA does not know is no error here: its values
   * stay zero, and no allocation has id or size zero. */
  if (get_attrs(4, which, values, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS || !id || !size) return -1;
  a->base = (uintptr_t)base;
  a->size = size;
  a->id = id;
  a->plain = legacy != 0;
  return 0;
}

int fc_gpu_dmabuf(const void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why, size_t len) {
  int dev = -1;
  if (fc_mem_type(ptr, &dev) != FC_MEM_DEVICE) {
    snprintf(why, len, "not device memory");
    return -1;
  }
  pthread_once(&driver_once, driver_init);
  if (!get_range || !get_handle) {
    snprintf(why, len, "the CUDA driver cannot export memory as a dma-buf (no cuMemGetHandleForAddressRange)");
    return -1;
  }
  /* The whole allocation, in whole pages (the export's unit; cudaMalloc's physical granularity
   * is larger, so the rounding stays inside memory the allocation holds). */
  const int prev = fc_gpu_switch_device(dev);
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = get_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t span = (size + page - 1) / page * page;
  int out = -1;
  if (r == CUDA_SUCCESS && (uintptr_t)ptr + bytes > base + size) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS && base % page) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) r = get_handle(&out, base, span, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  fc_gpu_leave_device(prev);
  if (r != CUDA_SUCCESS || out < 0) {
    if (r == CUDA_ERROR_NOT_SUPPORTED)
      snprintf(why, len, "GPU %d cannot export memory as a dma-buf (that needs NVIDIA's open kernel modules)", dev);
    else snprintf(why, len, "exporting %zu bytes of GPU %d as a dma-buf failed (CUDA error %d)", span, dev, (int)r);
    return -1;
  }
  *fd = out;
  *offset = (uint64_t)((uintptr_t)ptr - base);
  return 0;
}
#else
int fc_gpu_alloc_of(const void *ptr, fc_gpu_alloc_t *a) {
  (void)ptr, (void)a;
  return -1;
}
int fc_mem_copy(void *dst, const void *src, size_t bytes, char *why, size_t len) {
  (void)why, (void)len;
  if (bytes && dst != src) memcpy(dst, src, bytes);
  return 0;
}
int fc_mem_prepare(int device, void *warm, char *why, size_t len) {
  (void)device, (void)warm;
  snprintf(why, len, "flexcoll was built without CUDA");
  return -1;
}
int fc_mem_pin(void *ptr, size_t bytes, char *why, size_t len) {
  (void)ptr, (void)bytes;
  snprintf(why, len, "flexcoll was built without CUDA");
  return -1;
}
void fc_mem_unpin(void *ptr) { (void)ptr; }
int fc_gpu_dmabuf(const void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why, size_t len) {
  (void)ptr, (void)bytes, (void)fd, (void)offset;
  snprintf(why, len, "flexcoll was built without CUDA");
  return -1;
}
int fc_mem_reduce(void *dst, const void *a, const void *b, size_t count, flexcoll_datatype_t dtype, flexcoll_op_t op,
                  char *why, size_t len) {
  (void)dst, (void)a, (void)b, (void)count, (void)dtype, (void)op;
  snprintf(why, len, "flexcoll was built without CUDA");
  return -1;
}
int fc_mem_divide(void *buf, size_t count, flexcoll_datatype_t dtype, int n, char *why, size_t len) {
  (void)buf, (void)count, (void)dtype, (void)n;
  snprintf(why, len, "flexcoll was built without CUDA");
  return -1;
}
void *fc_mem_alloc_device(int device, size_t bytes, char *why, size_t len) {
  (void)device, (void)bytes;
  snprintf(why, len, "flexcoll was built without CUDA");
  return NULL;
}
void fc_mem_free_device(void *p) { (void)p; }
#endif
