/* gpu.h — the device-memory path: CUDA devices, peer mappings, kernels and copy engines.
 * On builds without CUDA (HAVE_CUDA 0) every communicator is host-only and device memory
 * cannot occur. */
#ifndef FC_GPU_H
#define FC_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "flexcoll.h"
#include "algos/algos.h"

struct flexcoll_comm;

typedef enum { FC_MEM_HOST, FC_MEM_DEVICE } fc_mem_t;

/* Where ptr lives: device memory (cudaMalloc, managed) or host memory (anything else);
 * *device gets the CUDA device of device memory (-1 otherwise). */
fc_mem_t fc_mem_type(const void *ptr, int *device);
/* fc_mem_type's answer and, for host memory, whether it is pinned (CUDA's own or registered with
 * it, so that a copy reaches it by DMA without the driver's staging), from one CUDA query. */
fc_mem_t fc_mem_query(const void *ptr, int *device, int *pinned);
/* Pages known to hold no CUDA memory (host_pages.c), fc_mem_type's shortcut past a CUDA query
 * per buffer: a page CUDA called host memory stays so until something in the process is
 * unmapped (UCM's events, counted).  fc_host_pages_epoch: the count to note an answer under,
 * read before asking CUDA; UINT64_MAX where nothing may be remembered (UCM gives no events, or
 * FLEXCOLL_MEM_TYPE_CACHE=0).  Per thread, a few recent pages. */
uint64_t fc_host_pages_epoch(void);
int fc_host_pages_known(const void *ptr);
void fc_host_pages_note(const void *ptr, uint64_t epoch);
/* Forget every page noted: host memory was just pinned (fc_mem_pin), and a page noted as plain
 * would otherwise keep being copied through the bounce buffer. */
void fc_host_pages_forget(void);
/* Device memory for links that move it themselves (dev_mem.c: the rdma link's GPUDirect path).
 * fc_mem_copy: bytes from src to dst, either in host or device memory, done when it returns; on
 * a non-blocking stream of the device involved, so it waits for nothing else on that device
 * (other ranks' kernels spinning there for this very rank).  0, or -1 with the reason in why.
 * fc_gpu_dmabuf: a dma-buf file descriptor (the caller closes it) of the allocation around device
 * pointer ptr, whole pages, and ptr's offset in it, for ibv_reg_dmabuf_mr; -1 with the reason
 * where the driver cannot export it (no dma-buf support, memory it cannot export). */
int fc_mem_copy(void *dst, const void *src, size_t bytes, char *why, size_t len);
/* What fc_mem_copy needs on device (its stream, and the pinned buffer it moves pageable host
 * memory through), made now, while no kernel of the caller's waits for a copy (making them, or
 * a stream's first copy, may wait for the device); warm: device memory of at least 16 bytes
 * copied out and back, or NULL.  0, or -1 with the reason (fc_mem_copy then tries again at its
 * first use). */
int fc_mem_prepare(int device, void *warm, char *why, size_t len);
/* Host memory a link copies device bytes through while kernels run (the rdma link's slots),
 * pinned with CUDA, so that fc_mem_copy moves it by DMA instead of through the bounce buffer.
 * Like fc_mem_prepare, called while no kernel of the caller's waits for a copy.  0, or -1 with
 * the reason (the memory then stays pageable, and copies stay correct).  fc_mem_unpin undoes
 * it before the memory is freed. */
int fc_mem_pin(void *ptr, size_t bytes, char *why, size_t len);
void fc_mem_unpin(void *ptr);
/* For a host schedule run on device buffers (lib/host, fc_host_run_device), on the same stream
 * as fc_mem_copy and done when they return; 0, or -1 with the reason in why.
 * fc_mem_reduce: dst[i] = a[i] op b[i] over count elements of device memory (AVG as SUM), dst may
 * alias a or b; fc_mem_divide: buf[i] /= n.  Both with flexcoll's kernels (lib/kernels), whose
 * rounding is lib/host/reduce.c's.  fc_mem_alloc_device: bytes of plain device memory
 * (cudaMalloc: a NIC can register it through a dma-buf) on device, or NULL with the reason;
 * fc_mem_free_device frees it (NULL: nothing). */
int fc_mem_reduce(void *dst, const void *a, const void *b, size_t count, flexcoll_datatype_t dtype, flexcoll_op_t op,
                  char *why, size_t len);
int fc_mem_divide(void *buf, size_t count, flexcoll_datatype_t dtype, int n, char *why, size_t len);
void *fc_mem_alloc_device(int device, size_t bytes, char *why, size_t len);
void fc_mem_free_device(void *p);
/* The CUDA allocation around device pointer ptr: its first address, its size, its buffer id
 * (CU_POINTER_ATTRIBUTE_BUFFER_ID: never given to another allocation while the process lives,
 * so memory freed and allocated again at the same address has a new one), and whether it is a
 * plain cudaMalloc allocation (not from a memory pool, whose pieces and physical pages the pool
 * hands around itself, nor mapped by the virtual memory API, which can map other memory at the
 * same address).  0, or -1 where ptr is no live CUDA allocation (freed, host memory, no CUDA). */
typedef struct {
  uintptr_t base;
  size_t size;
  unsigned long long id;
  int plain;
} fc_gpu_alloc_t;
int fc_gpu_alloc_of(const void *ptr, fc_gpu_alloc_t *a);
int fc_gpu_dmabuf(const void *ptr, size_t bytes, int *fd, uint64_t *offset, char *why, size_t len);
/* Number of CUDA devices usable here (0 without CUDA or without a GPU). */
int fc_gpu_count(void);
/* The calling thread's current CUDA device; FLEXCOLL_CONFIG_UNDEF without a GPU. */
int fc_gpu_current_device(void);
/* Whether comm is to run on a GPU, asked before fc_gpu_comm_init (the links open first, and
 * decide by it whether they take device buffers): its configured device (comm.c resolves it
 * before the links) on a machine with a GPU. */
int fc_gpu_comm_wants_device(const struct flexcoll_comm *comm);

/* Whether stream is being captured into a CUDA graph (1), or cannot be used because another
 * stream's capture forbids it (2); 0: neither.  A NULL stream (the legacy default stream) is
 * never captured. */
int fc_gpu_stream_capturing(flexcoll_stream_t stream);

/* Make the device comm's configuration names current on this thread, its context created, for
 * what runs before fc_gpu_comm_init: UCX opens its CUDA transports against the current context
 * (without one, its cuda_copy probe fails a driver call that compute-sanitizer reports).  Returns
 * the device to give back to fc_gpu_leave_device, -1 when nothing changed (no device, or one
 * fc_gpu_comm_init will refuse). */
int fc_gpu_enter_device(const struct flexcoll_comm *comm);
void fc_gpu_leave_device(int previous);

/* Choose the CUDA device of comm (config, else current; -1 when there is none) and set up what
 * device collectives need. */
flexcoll_result_t fc_gpu_comm_init(struct flexcoll_comm *comm);
void fc_gpu_comm_fini(struct flexcoll_comm *comm);
/* Release collectives stuck on the device (flexcoll_comm_abort). */
void fc_gpu_comm_abort(struct flexcoll_comm *comm);
/* Fold device-side failures (a spin that timed out) into comm->async_error. */
void fc_gpu_poll_async_error(struct flexcoll_comm *comm);
/* Whether a kernel of the communicator gave up waiting (its error word, host memory: one load,
 * no CUDA call); sets the async error FLEXCOLL_TIMEOUT then.  Every call asks it first, so the
 * calls after a kernel's timeout fail instead of running on a protocol out of step. */
void fc_gpu_note_kernel_error(struct flexcoll_comm *comm);
/* Enqueue a collective on device memory on stream (capturing: the stream is being captured
 * into a CUDA graph, and fc_gpu_graph_refusal has allowed the call). */
flexcoll_result_t fc_gpu_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf, void *recvbuf,
                             flexcoll_datatype_t dtype, flexcoll_op_t op, flexcoll_stream_t stream, int capturing);
/* Why this collective on device memory cannot be captured into a CUDA graph on stream (a
 * phrase for a message), or NULL when it can: captured, it takes a kernel that keeps its sequence
 * state on the device, right after the communicator's previous such kernel on the same stream.
 * Enqueues nothing. */
const char *fc_gpu_graph_refusal(struct flexcoll_comm *comm, const fc_algo_args_t *args, flexcoll_stream_t stream);

/* Enqueue a batch of point-to-point sends and receives (counts in bytes) over device buffers
 * (capturing: as fc_gpu_run's, allowed by fc_gpu_p2p_graph_refusal). */
flexcoll_result_t fc_gpu_run_p2p(struct flexcoll_comm *comm, const fc_p2p_op_t *ops, int nops, void *const *bufs,
                                 flexcoll_stream_t stream, int capturing);
/* Why a batch of sends and receives on device memory cannot be captured on stream (a phrase),
 * or NULL: it can when the point-to-point kernel (or, for one rank, a copy) runs it, right after
 * the communicator's previous kernel on the same stream.  Enqueues nothing. */
const char *fc_gpu_p2p_graph_refusal(struct flexcoll_comm *comm, flexcoll_stream_t stream);

/* The device links' statistics (nvlink, and pcie where it is on) toward the next rank of the
 * ring, as flexcoll_comm_get_link_stats reports them: written into stats up to max, the number
 * there are returned. */
int fc_gpu_link_stats(struct flexcoll_comm *comm, flexcoll_link_stats_t *stats, int max);
/* Tests: make device lane `name` ("nvlink", or a side lane's: "pcie", "rdma") look `factor`
 * times slower to stage 2 (its measured times are scaled; the statistics keep the real ones);
 * every rank of comm must do the same.  Without a GPU, nothing. */
void fc_gpu_lanes_set_throttle(struct flexcoll_comm *comm, const char *name, double factor);
/* Tests: the ring kernels' lanes whose split stage 2 moves (nvlink, then the side lanes that are
 * on): each one's model bandwidth (MB/s) and its bytes of a ring chunk of `chunk` bytes as the
 * next allreduce would split it, into lanes[0 ..] (room for FC_GPU_LANES); returns how many, 0 (and
 * nothing written) when comm has no side lane whose split stage 2 moves. */
#define FC_GPU_LANES 3
typedef struct {
  char name[16];
  double beta;
  size_t part;
} fc_gpu_lane_state_t;
int fc_gpu_lanes_state(struct flexcoll_comm *comm, size_t chunk, fc_gpu_lane_state_t *lanes);

/* Symmetric windows (flexcoll_window_register/deregister; collective; arguments checked by api.c). */
flexcoll_result_t fc_gpu_window_register(struct flexcoll_comm *comm, void *buf, size_t bytes, struct flexcoll_window **out);
flexcoll_result_t fc_gpu_window_deregister(struct flexcoll_comm *comm, struct flexcoll_window *w);
/* Whether w is a live window of comm. */
int fc_gpu_window_valid(struct flexcoll_comm *comm, const struct flexcoll_window *w);

#endif
