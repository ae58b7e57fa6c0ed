/* gpu.c — CUDA devices: which device a communicator drives, memory-type detection, the staging
 * areas peers write into (mapped through CUDA IPC between processes, peer access within one),
 * and the watch over device work (timeouts, abort).  Compiled on every build: without CUDA
 * (HAVE_CUDA 0) there are no devices and every buffer is host memory. */
#define _GNU_SOURCE
#include "config.h"
#include "gpu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "clock.h"
#include "comm.h"
#include "error.h"
#include "param.h"
#include "topo.h"
#include "sched/sched.h"

#if HAVE_CUDA
#include "device.h"

/* -1: by rank count (plan_layout). */
FC_PARAM_INT(oneshot_max, "ONESHOT_MAX_BYTES", -1)
/* One-shot messages up to this many bytes per rank take the LL kernels (oneshot.cu). */
FC_PARAM_INT(ll_max, "LL_MAX_BYTES", 64 << 10)
/* Most blocks of a plain one-shot grid (1..FC_MAX_BLOCKS). */
FC_PARAM_INT(oneshot_blocks, "ONESHOT_BLOCKS", FC_ONESHOT_BLOCKS)
/* Pipelined kernels for 2 ranks above the one-shot limit, on buffers outside windows (0: off). */
FC_PARAM_INT(pipeline, "PIPELINE", 1)
/* Their grid, threads per block, sub-slots per block and pushing threads per block (kernels.h;
 * 0: a quarter of the block pushes, the rest reduces).  Measured (2x H200, allreduce without
 * windows, busbw at 512 MB, NCCL 314-316 in the same runs, docs/PERFORMANCE.md): 128x512 with
 * 256 / 192 / 128 pushing threads 302 / 344 / 350, with 320 / 384 / 448 271 / 286 / 186 (the
 * reduction, three memory streams per step, needs more threads than the stores over NVLink);
 * 128x1024 with 512 / 256 349 / 352; 4 sub-slots (half the bytes per step) lose a fifth.  512
 * threads: two such grids (two communicators at once) still fit on the GPU together, two
 * blocks per SM, and leave room to compute kernels overlapping the collective; a block that
 * cannot be resident would leave its peer block spinning until the timeout. */
FC_PARAM_INT(pipeline_blocks, "PIPELINE_BLOCKS", FC_MAX_BLOCKS)
FC_PARAM_INT(pipeline_threads, "PIPELINE_THREADS", 512)
FC_PARAM_INT(pipeline_subslots, "PIPELINE_SUBSLOTS", 2)
FC_PARAM_INT(pipeline_push_threads, "PIPELINE_PUSH_THREADS", 0)
/* Ring kernels above the one-shot limit for any rank count (0: the algorithms' schedules), their most
 * blocks, sub-slots and area (lib/kernels/ring.cu). */
FC_PARAM_INT(ring_kernel, "RING_KERNEL", 1)
FC_PARAM_INT(ring_blocks, "RING_BLOCKS", 32)
FC_PARAM_INT(ring_subslots, "RING_SUBSLOTS", 2)
FC_PARAM_INT(ring_area_bytes, "RING_AREA_BYTES", 16 << 20)

#define CUDA_CHECK(comm, call)                                                                        \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess)                                                                            \
      return fc_error((comm), FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s failed: %s (%s:%d)", #call,          \
                      cudaGetErrorString(e_), __FILE__, __LINE__);                                    \
  } while (0)

int fc_gpu_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* no driver or no device: a host-only process, not an error */
    return 0;
  }
  return n;
}

int fc_gpu_current_device(void) {
  int d;
  if (fc_gpu_count() == 0) return FLEXCOLL_CONFIG_UNDEF;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return FLEXCOLL_CONFIG_UNDEF;
  }
  return d;
}

int fc_gpu_stream_capturing(flexcoll_stream_t stream) {
  if (!stream) return 0;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing((cudaStream_t)stream, &st);
  if (e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureUnsupported) {
    cudaGetLastError();
    return 2;
  }
  if (e != cudaSuccess) {
    cudaGetLastError(); /* not a stream of this context: the enqueue reports it */
    return 0;
  }
  return st != cudaStreamCaptureStatusNone;
}

fc_mem_t fc_mem_query(const void *ptr, int *device, int *pinned) {
  struct cudaPointerAttributes attr;
  *device = -1;
  *pinned = 0;
  /* A CUDA query per buffer is most of a small host call's cost: pages found to be plain host
   * memory are remembered until something is unmapped or pinned (host_pages.c). */
  if (fc_host_pages_known(ptr)) return FC_MEM_HOST;
  const uint64_t epoch = fc_host_pages_epoch();
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return FC_MEM_HOST;
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    /* Plain host memory only: CUDA's own pinned allocations are unmapped by the driver, maybe
     * out of UCM's sight, and their addresses could come back as device memory. */
    if (attr.type == cudaMemoryTypeUnregistered) fc_host_pages_note(ptr, epoch);
    *pinned = attr.type == cudaMemoryTypeHost;
    return FC_MEM_HOST;
  }
  *device = attr.device;
  return FC_MEM_DEVICE;
}

fc_mem_t fc_mem_type(const void *ptr, int *device) {
  int pinned;
  return fc_mem_query(ptr, device, &pinned);
}

/* What each rank tells the others about its GPU and staging area. */
typedef struct {
  uint64_t host_hash;
  int pid, device;
  int oneshot_resident, ring_resident; /* blocks of such kernels that fit on the GPU at once (0: unknown) */
  char pci_bus_id[32];
  cudaIpcMemHandle_t handle;
  void *stage; /* valid in the owner's process only */
} fc_gpu_peer_info_t;

/* Staging layout, the same on every rank: one-shot slots and flags, the LL area, pair flags, the
 * ring and point-to-point counters, then the ring and point-to-point areas. */
static void plan_layout(struct fc_gpu *g, int nranks) {
  size_t align = 4096;
  /* One-shot moves the whole message to every peer: as cheap as a ring for 2 ranks (up to 8 MB
   * it beats the pipelined paths on latency), (n-1)/2 times the traffic beyond. */
  int64_t oneshot = fc_param_oneshot_max();
  if (oneshot < 0) oneshot = nranks <= 2 ? 8 << 20 : 1 << 20;
  g->oneshot_slot = ((size_t)oneshot + align - 1) / align * align;
  g->oneshot_off = 0;
  g->oneshot_flags_off = g->oneshot_off + 2 * (size_t)nranks * g->oneshot_slot;
  /* The LL area (2 parities x nranks slots of 2 lines per 16 bytes) lies between the flags and
   * the pair flags, so that the one memset at set-up clears all three. */
  int64_t ll = fc_param_ll_max();
  if (ll < 0) ll = 0;
  if ((size_t)ll > g->oneshot_slot) ll = (int64_t)g->oneshot_slot;
  g->ll_max = (size_t)ll / 16 * 16;
  int64_t blocks = fc_param_oneshot_blocks();
  g->oneshot_blocks = blocks < 1 ? 1u : blocks > FC_MAX_BLOCKS ? (unsigned)FC_MAX_BLOCKS : (unsigned)blocks;
  /* Flags: 2 parities x nranks x blocks for the one-shot kernels, then as many counters for
   * the pipelined ones (ready and ack per sender and block, kernels.h). */
  int64_t pb = fc_param_pipeline_blocks(), pt = fc_param_pipeline_threads(), ps = fc_param_pipeline_subslots();
  if (pb < 1 || pb > FC_MAX_BLOCKS)
    FC_WARN("FLEXCOLL_PIPELINE_BLOCKS=%lld is not 1..%d; clamped", (long long)pb, FC_MAX_BLOCKS);
  if (pt != 512 && pt != 1024)
    FC_WARN("FLEXCOLL_PIPELINE_THREADS=%lld is not 512 or 1024; using %d", (long long)pt, pt <= 512 ? 512 : 1024);
  if (ps != 2 && ps != 4)
    FC_WARN("FLEXCOLL_PIPELINE_SUBSLOTS=%lld is not 2 or 4; using %d", (long long)ps, ps <= 2 ? 2 : 4);
  g->pipe_blocks = pb < 1 ? 1u : pb > FC_MAX_BLOCKS ? (unsigned)FC_MAX_BLOCKS : (unsigned)pb;
  g->pipe_threads = pt <= 512 ? 512u : 1024u;
  g->pipe_subslots = ps <= 2 ? 2u : 4u;
  int64_t pp = fc_param_pipeline_push_threads();
  if (pp != 0 && (pp % 32 != 0 || pp < 32 || pp > (int64_t)g->pipe_threads - 32)) {
    FC_WARN("FLEXCOLL_PIPELINE_PUSH_THREADS=%lld is not a multiple of 32 in 32..%u; using a quarter of the block",
            (long long)pp, g->pipe_threads - 32);
    pp = 0;
  }
  g->pipe_push_threads = pp ? (unsigned)pp : g->pipe_threads / 4;
  g->pipeline = nranks == 2 && fc_param_pipeline() != 0 &&
                fc_pipe_room_bytes(g->oneshot_slot, g->pipe_blocks, g->pipe_subslots) >= FC_PIPE_MIN_STEP_BYTES;
  g->ll_off = g->oneshot_flags_off + ((4 * (size_t)nranks * FC_MAX_BLOCKS * 8 + align - 1) / align * align);
  g->pair_flags_off = g->ll_off + ((2 * (size_t)nranks * 2 * g->ll_max + align - 1) / align * align);
  /* The ring and point-to-point kernels' counters (ready and ack per block) before their areas,
   * inside the range zeroed at set-up. */
  g->ring_ctr_off = g->pair_flags_off + ((nranks * sizeof(fc_pair_flags_t) + align - 1) / align * align);
  g->p2p_ctr_off = g->ring_ctr_off + ((2 * FC_MAX_BLOCKS * sizeof(uint64_t) + align - 1) / align * align);
  g->ring_off = g->p2p_ctr_off + ((2 * (size_t)nranks * FC_MAX_BLOCKS * sizeof(uint64_t) + align - 1) / align * align);
  int64_t rb = fc_param_ring_blocks(), rs = fc_param_ring_subslots(), ra = fc_param_ring_area_bytes();
  g->ring_blocks = rb < 1 ? 1u : rb > FC_MAX_BLOCKS ? (unsigned)FC_MAX_BLOCKS : (unsigned)rb;
  g->ring_subslots = rs < 2 ? 2u : rs > 8 ? 8u : (unsigned)rs;
  g->ring = nranks >= 2 && fc_param_ring_kernel() != 0;
  g->ring_bytes = g->ring ? ((size_t)(ra < (64 << 10) ? (64 << 10) : ra) + align - 1) / align * align : 0;
  /* One region per sender: 16 MiB shared out, 256 KiB to 2 MiB each. */
  size_t region = ((size_t)16 << 20) / (size_t)nranks;
  region = region < ((size_t)256 << 10) ? (size_t)256 << 10 : region > ((size_t)2 << 20) ? (size_t)2 << 20 : region;
  g->p2p_region = nranks >= 2 ? region / align * align : 0;
  g->p2p_off = g->ring_off + g->ring_bytes;
  g->stage_bytes = g->p2p_off + (size_t)nranks * g->p2p_region;
}

static flexcoll_result_t load_stream_memops(struct flexcoll_comm *comm, struct fc_gpu *g) {
  enum cudaDriverEntryPointQueryResult q;
  void *w = NULL, *v = NULL;
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &v, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess ||
      cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &w, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "the CUDA driver has no stream memory operations");
  g->wait_value32 = (fc_wait_value32_fn)v;
  g->write_value32 = (fc_write_value32_fn)w;
  /* Direct mode finds the allocation around a user buffer with it (optional: without it,
   * buffers are not shared between processes). */
  void *r = NULL;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &r, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    g->get_address_range = (fc_get_address_range_fn)r;
  cudaGetLastError();
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t alloc_local(struct flexcoll_comm *comm, struct fc_gpu *g) {
  plan_layout(g, comm->nranks);
  CUDA_CHECK(comm, cudaStreamCreateWithFlags(&g->util_stream, cudaStreamNonBlocking));
  CUDA_CHECK(comm, cudaMalloc((void **)&g->stage, g->stage_bytes));
  /* On our own stream, not the legacy one: other communicators' kernels may be waiting on peers
   * on this device, and a legacy-stream memset would wait for them. */
  CUDA_CHECK(comm, cudaMemsetAsync(g->stage + g->oneshot_flags_off, 0, g->ring_off - g->oneshot_flags_off, g->util_stream));
  CUDA_CHECK(comm, cudaMalloc((void **)&g->epoch, sizeof *g->epoch));
  CUDA_CHECK(comm, cudaMemsetAsync(g->epoch, 0, sizeof *g->epoch, g->util_stream));
  const size_t base_bytes = (2 * (size_t)comm->nranks + 1) * sizeof(uint64_t);
  CUDA_CHECK(comm, cudaMalloc((void **)&g->p2p_base, base_bytes));
  CUDA_CHECK(comm, cudaMemsetAsync(g->p2p_base, 0, base_bytes, g->util_stream));
  CUDA_CHECK(comm, cudaMalloc((void **)&g->p2p_peer_area, (size_t)comm->nranks * sizeof(char *)));
  CUDA_CHECK(comm, cudaMalloc((void **)&g->p2p_peer_ctr, (size_t)comm->nranks * sizeof(uint64_t *)));
  CUDA_CHECK(comm, cudaMalloc((void **)&g->lane_clk, sizeof *g->lane_clk));
  CUDA_CHECK(comm, cudaMemsetAsync(g->lane_clk, 0, sizeof *g->lane_clk, g->util_stream));
  CUDA_CHECK(comm, cudaStreamSynchronize(g->util_stream));
  CUDA_CHECK(comm, cudaHostAlloc((void **)&g->lane_rec, FC_LANE_RECORDS * sizeof *g->lane_rec,
                                 cudaHostAllocMapped | cudaHostAllocPortable));
  memset(g->lane_rec, 0, FC_LANE_RECORDS * sizeof *g->lane_rec);
  CUDA_CHECK(comm, cudaHostGetDevicePointer((void **)&g->lane_rec_dev, g->lane_rec, 0));
  CUDA_CHECK(comm, cudaHostAlloc((void **)&g->error_host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  *g->error_host = 0;
  CUDA_CHECK(comm, cudaHostGetDevicePointer((void **)&g->error_dev, g->error_host, 0));
  CUDA_CHECK(comm, cudaEventCreateWithFlags(&g->ev_user, cudaEventDisableTiming));
  CUDA_CHECK(comm, cudaEventCreateWithFlags(&g->ev_send, cudaEventDisableTiming));
  CUDA_CHECK(comm, cudaEventCreateWithFlags(&g->ev_recv, cudaEventDisableTiming));
  CUDA_CHECK(comm, cudaEventCreateWithFlags(&g->ev_oneshot, cudaEventDisableTiming));
  for (int i = 0; i < 64; i++) CUDA_CHECK(comm, cudaEventCreateWithFlags(&g->inflight_ev[i], cudaEventDisableTiming));
  CUDA_CHECK(comm, cudaEventCreateWithFlags(&g->ev_local, cudaEventDisableTiming));
  for (int i = 0; i < FC_DIRECT_EVENTS; i++) {
    CUDA_CHECK(comm, cudaEventCreateWithFlags(&g->ev_pulled[i], cudaEventDisableTiming));
    CUDA_CHECK(comm, cudaEventCreateWithFlags(&g->ev_reduced[i], cudaEventDisableTiming));
  }
  g->timeout_ns = fc_kernel_timeout_ns(comm->timeout_ms);
  /* Lazy loading would load each kernel at its first launch, waiting for queued work that may
   * wait on peers (a deadlock in the middle of a collective): load them all now. */
  int e = fc_kernels_preload_reduce();
  if (!e) e = fc_kernels_preload_oneshot();
  if (!e) e = fc_kernels_preload_pipeline();
  if (!e) e = fc_kernels_preload_ring();
  if (!e) e = fc_kernels_preload_alltoall();
  if (!e) e = fc_kernels_preload_p2p();
  if (e) return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "loading the kernels failed: %s", cudaGetErrorString((cudaError_t)e));
  return FLEXCOLL_SUCCESS;
}

/* Map peer q's staging area: its pointer in this process, or its IPC handle from another.  A
 * peer on another host has no peer access, whatever its GPU's PCI address: identical nodes put
 * their GPUs at the same addresses, and its IPC handle means nothing here. */
static flexcoll_result_t map_peer(struct flexcoll_comm *comm, struct fc_gpu *g, const fc_gpu_peer_info_t *me,
                                  const fc_gpu_peer_info_t *p, fc_peer_t *peer) {
  if (p->host_hash != me->host_hash) return FLEXCOLL_SUCCESS;
  int local_dev;
  if (cudaDeviceGetByPCIBusId(&local_dev, p->pci_bus_id) != cudaSuccess) {
    cudaGetLastError();
    return FLEXCOLL_SUCCESS; /* not visible here: no peer access */
  }
  int can = 0;
  peer->same_device = local_dev == g->device;
  if (local_dev != g->device) {
    cudaDeviceCanAccessPeer(&can, g->device, local_dev);
    if (!can) return FLEXCOLL_SUCCESS;
    cudaError_t e = cudaDeviceEnablePeerAccess(local_dev, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
      return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "cudaDeviceEnablePeerAccess(%d): %s", local_dev, cudaGetErrorString(e));
    cudaGetLastError();
  }
  if (p->pid == me->pid && p->host_hash == me->host_hash) {
    peer->stage = p->stage;
    peer->same_process = 1;
  } else {
    g->any_ipc_peer = 1;
    CUDA_CHECK(comm, cudaIpcOpenMemHandle((void **)&peer->stage, p->handle, cudaIpcMemLazyEnablePeerAccess));
    peer->ipc_opened = 1;
  }
  return FLEXCOLL_SUCCESS;
}

/* Blocks of a family of kernels that fit on this GPU at once: SMs times blocks per SM. */
static int resident_blocks(int device, int per_sm) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms * per_sm;
}

/* Ranks that share a GPU each run their one-shot and ring kernels at the same time, and every
 * block spins until the matching blocks of the others run: all their grids must fit on the GPU
 * at once, four times over (more communicators on the same ranks with calls in flight together:
 * the world, TP and DP groups as PyTorch builds them), or the first ones to start wait for
 * blocks that never do.  Grids must be equal on all ranks, so every rank computes the caps from
 * the same facts: the most ranks on any one GPU, the fewest resident blocks of any rank's GPU. */
static void cap_shared_gpu_grids(struct flexcoll_comm *comm, struct fc_gpu *g, const fc_gpu_peer_info_t *all) {
  int sharing = 1, oneshot_room = 0, ring_room = 0;
  for (int q = 0; q < comm->nranks; q++) {
    int on_gpu = 0;
    for (int r = 0; r < comm->nranks; r++)
      on_gpu += all[r].host_hash == all[q].host_hash && strcmp(all[r].pci_bus_id, all[q].pci_bus_id) == 0;
    if (on_gpu > sharing) sharing = on_gpu;
    if (q == 0 || all[q].oneshot_resident < oneshot_room) oneshot_room = all[q].oneshot_resident;
    if (q == 0 || all[q].ring_resident < ring_room) ring_room = all[q].ring_resident;
  }
  if (sharing < 2) return;
  /* Unknown capacity: one block per SM of a small GPU. */
  unsigned os_cap = (unsigned)(oneshot_room > 0 ? oneshot_room : 16) / (4u * (unsigned)sharing);
  unsigned ring_cap = (unsigned)(ring_room > 0 ? ring_room : 16) / (4u * (unsigned)sharing);
  if (os_cap < 1) os_cap = 1;
  if (ring_cap < 1) ring_cap = 1;
  if (g->oneshot_blocks > os_cap) g->oneshot_blocks = os_cap;
  if (g->ring_blocks > ring_cap) g->ring_blocks = ring_cap;
  FC_INFO(FC_SUB_GPU, "rank %d: up to %d ranks share a GPU: one-shot grids of at most %u blocks, ring grids of %u",
          comm->rank, sharing, g->oneshot_blocks, g->ring_blocks);
}

static flexcoll_result_t connect_peers(struct flexcoll_comm *comm, struct fc_gpu *g) {
  fc_gpu_peer_info_t *all = calloc((size_t)comm->nranks, sizeof *all);
  g->peers = calloc((size_t)comm->nranks, sizeof *g->peers);
  if (!all || !g->peers) { free(all); return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory"); }
  fc_gpu_peer_info_t *me = &all[comm->rank];
  me->host_hash = fc_topo_host_hash();
  me->pid = getpid();
  me->device = g->device;
  me->stage = g->stage;
  me->oneshot_resident = resident_blocks(g->device, fc_kernels_oneshot_blocks_per_sm());
  me->ring_resident = resident_blocks(g->device, fc_kernels_ring_blocks_per_sm());
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (cudaDeviceGetPCIBusId(me->pci_bus_id, sizeof me->pci_bus_id, g->device) != cudaSuccess ||
      cudaIpcGetMemHandle(&me->handle, g->stage) != cudaSuccess) {
    res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "cannot describe device %d for its peers: %s", g->device,
                   cudaGetErrorString(cudaGetLastError()));
    goto out;
  }
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, all, sizeof *all), res, out);
  g->where_hash = FC_HASH_INIT;
  for (int q = 0; q < comm->nranks; q++) {
    g->where_hash = fc_hash_bytes(g->where_hash, &all[q].host_hash, sizeof all[q].host_hash);
    g->where_hash = fc_hash_bytes(g->where_hash, all[q].pci_bus_id, strlen(all[q].pci_bus_id));
  }
  /* FLEXCOLL_LINKS without nvlink: no peer's device memory is used, as where peer access is
   * missing (the ring kernels then run through host memory, the rest through host copies). */
  const int use_nvlink = fc_links_names("nvlink");
  g->p2p = use_nvlink;
  g->peers[comm->rank].stage = g->stage;
  for (int q = 0; q < comm->nranks && res == FLEXCOLL_SUCCESS && use_nvlink; q++) {
    if (q == comm->rank) continue;
    res = map_peer(comm, g, me, &all[q], &g->peers[q]);
    if (!g->peers[q].stage) g->p2p = 0;
  }
  /* Every rank must take the same path for a call: peer access one way only counts as none. */
  if (res == FLEXCOLL_SUCCESS) {
    int first_not = -1;
    res = fc_bootstrap_agree(comm->bootstrap, g->p2p, &first_not);
    if (first_not >= 0) g->p2p = 0;
  }
  /* A pipelined kernel's blocks wait for the peer's and fill most SMs: two ranks on one GPU
   * could not both be resident (each rank sees the same, so both decide alike). */
  if (res == FLEXCOLL_SUCCESS && g->pipeline && comm->nranks == 2 && g->peers[1 - comm->rank].same_device) g->pipeline = 0;
  if (res == FLEXCOLL_SUCCESS) cap_shared_gpu_grids(comm, g, all);
  /* Point-to-point batches are often small and several run at once (pipeline stages): a
   * smaller grid than the collectives'. */
  g->p2p_blocks = g->ring_blocks < 16 ? g->ring_blocks : 16;
  if (res == FLEXCOLL_SUCCESS)
    FC_INFO(FC_SUB_GPU, "rank %d: GPU %d (%s), %s, staging %zu MB", comm->rank, g->device, me->pci_bus_id,
            g->p2p     ? "peer access to every rank"
            : use_nvlink ? "some ranks lack peer access: device collectives go through host memory"
                         : "nvlink left out (FLEXCOLL_LINKS): device collectives go through host memory",
            g->stage_bytes >> 20);
out:
  free(all);
  return res;
}

/* The point-to-point kernel finds the peers' areas and counters in device arrays (any rank count). */
static flexcoll_result_t upload_p2p_peers(struct flexcoll_comm *comm, struct fc_gpu *g) {
  char **area = calloc((size_t)comm->nranks, sizeof *area);
  uint64_t **ctr = calloc((size_t)comm->nranks, sizeof *ctr);
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (!area || !ctr) {
    res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  } else {
    for (int q = 0; q < comm->nranks; q++) {
      area[q] = g->peers[q].stage + g->p2p_off;
      ctr[q] = (uint64_t *)(g->peers[q].stage + g->p2p_ctr_off);
    }
    size_t bytes = (size_t)comm->nranks * sizeof(char *);
    if (cudaMemcpyAsync(g->p2p_peer_area, area, bytes, cudaMemcpyHostToDevice, g->util_stream) != cudaSuccess ||
        cudaMemcpyAsync(g->p2p_peer_ctr, ctr, bytes, cudaMemcpyHostToDevice, g->util_stream) != cudaSuccess ||
        cudaStreamSynchronize(g->util_stream) != cudaSuccess)
      res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "uploading the peers' point-to-point areas: %s",
                     cudaGetErrorString(cudaGetLastError()));
  }
  free(area);
  free(ctr);
  return res;
}

/* The ring kernels' order: the links' host-by-host order where the ranks are on several hosts,
 * so that a ring crosses each host boundary once whatever the numbering (and a ring by hops can
 * take NVLink between the ranks of a host); by rank otherwise.  The rank at each place goes to
 * the device for allgather's and reduce_scatter's blocks. */
static int ring_by_host(const struct flexcoll_comm *comm) {
  const fc_links_t *l = comm->links;
  return l && l->nhosts > 1 && l->order && l->pos;
}

int fc_gpu_ring_place(const struct flexcoll_comm *comm, int rank) {
  return ring_by_host(comm) ? comm->links->pos[rank] : rank;
}

static flexcoll_result_t set_ring_order(struct flexcoll_comm *comm, struct fc_gpu *g) {
  const int n = comm->nranks;
  const fc_links_t *l = comm->links;
  const int by_host = ring_by_host(comm);
  g->ring_pos = fc_gpu_ring_place(comm, comm->rank);
  g->ring_next = by_host ? l->order[(g->ring_pos + 1) % n] : (comm->rank + 1) % n;
  g->ring_prev = by_host ? l->order[(g->ring_pos + n - 1) % n] : (comm->rank + n - 1) % n;
  int identity = 1;
  for (int p = 0; by_host && p < n; p++) identity &= l->order[p] == p;
  if (!by_host || identity) return FLEXCOLL_SUCCESS;
  const size_t bytes = (size_t)n * sizeof(int);
  CUDA_CHECK(comm, cudaMalloc((void **)&g->ring_rank_dev, bytes));
  CUDA_CHECK(comm, cudaMemcpyAsync(g->ring_rank_dev, l->order, bytes, cudaMemcpyHostToDevice, g->util_stream));
  CUDA_CHECK(comm, cudaStreamSynchronize(g->util_stream));
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t gpu_comm_setup(struct flexcoll_comm *comm, int want) {
  struct fc_gpu *g = calloc(1, sizeof *g);
  if (!g) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  comm->gpu = g;
  comm->cuda_device = g->device = want;
  fc_topo_log_once();
  FC_CHECK(load_stream_memops(comm, g));
  FC_CHECK(alloc_local(comm, g));
  FC_CHECK(connect_peers(comm, g));
  if (g->p2p) FC_CHECK(upload_p2p_peers(comm, g));
  FC_CHECK(set_ring_order(comm, g));
  /* Peers must not write into staging areas before their owners have cleared the flags. */
  FC_CHECK(fc_bootstrap_barrier(comm->bootstrap));
  FC_CHECK(fc_pcie_open(comm, g));
  return FLEXCOLL_SUCCESS;
}

int fc_gpu_switch_device(int device) {
  int prev = -1;
  cudaGetDevice(&prev);
  /* Also when it is current already: that makes its context current in a thread that has none
   * yet (a group's worker), for the driver calls that follow. */
  cudaSetDevice(device);
  return prev != device ? prev : -1;
}

int fc_gpu_enter_device(const struct flexcoll_comm *comm) {
  const int want = comm->init_config.cuda_device;
  int prev = -1;
  if (want < 0 || want >= fc_gpu_count() || cudaGetDevice(&prev) != cudaSuccess ||
      cudaSetDevice(want) != cudaSuccess || cudaFree(NULL) != cudaSuccess) {
    cudaGetLastError(); /* fc_gpu_comm_init reports what is wrong with the device */
    if (prev >= 0) cudaSetDevice(prev);
    return -1;
  }
  return prev != want ? prev : -1;
}

void fc_gpu_leave_device(int previous) {
  if (previous >= 0) cudaSetDevice(previous);
}

flexcoll_result_t fc_gpu_comm_init(struct flexcoll_comm *comm) {
  int want = comm->init_config.cuda_device;
  int count = fc_gpu_count();
  comm->cuda_device = -1;
  if (want == -1 || count == 0) return FLEXCOLL_SUCCESS;
  if (want == FLEXCOLL_CONFIG_UNDEF) {
    CUDA_CHECK(comm, cudaGetDevice(&want));
  } else if (want < 0 || want >= count) {
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "config.cuda_device %d: this process sees %d device(s)", want, count);
  }
  /* The caller's current device is the caller's. */
  const int prev = fc_gpu_switch_device(want);
  const flexcoll_result_t res = gpu_comm_setup(comm, want);
  fc_gpu_leave_device(prev);
  return res;
}


/* Direct mode's three streams, made at its first call: every other path runs on the caller's
 * stream, and each stream a communicator holds may share a hardware queue with a peer's work
 * (CUDA_DEVICE_MAX_CONNECTIONS), so a communicator that never goes direct makes none. */
flexcoll_result_t fc_gpu_side_streams(struct flexcoll_comm *comm, struct fc_gpu *g) {
  cudaStream_t *s[3] = {&g->send_stream, &g->recv_stream, &g->reduce_stream};
  for (int i = 0; i < 3; i++)
    if (!*s[i]) CUDA_TRY(comm, cudaStreamCreateWithFlags(s[i], cudaStreamNonBlocking));
  return FLEXCOLL_SUCCESS;
}

/* Wait for direct mode's streams, where they exist. */
void fc_gpu_side_streams_sync(struct fc_gpu *g) {
  cudaStream_t s[3] = {g->send_stream, g->recv_stream, g->reduce_stream};
  for (int i = 0; i < 3; i++)
    if (s[i]) cudaStreamSynchronize(s[i]);
}

void fc_gpu_comm_fini(struct flexcoll_comm *comm) {
  struct fc_gpu *g = comm->gpu;
  if (!g) return;
  const int prev = fc_gpu_switch_device(g->device);
  if (!atomic_load(&comm->abort_flag)) fc_gpu_side_streams_sync(g);
  fc_peer_mem_release(g);
  /* No barrier with peers (destroy is local): every kernel ends only once its peers have
   * consumed what it sent them, so nobody writes into our staging area any more. */
  for (int q = 0; g->peers && q < comm->nranks; q++)
    if (g->peers[q].ipc_opened) cudaIpcCloseMemHandle(g->peers[q].stage);
  if (g->send_stream) cudaStreamDestroy(g->send_stream);
  if (g->recv_stream) cudaStreamDestroy(g->recv_stream);
  if (g->util_stream) cudaStreamDestroy(g->util_stream);
  if (g->reduce_stream) cudaStreamDestroy(g->reduce_stream);
  cudaEventDestroy(g->ev_local);
  for (int i = 0; i < FC_DIRECT_EVENTS; i++) {
    cudaEventDestroy(g->ev_pulled[i]);
    cudaEventDestroy(g->ev_reduced[i]);
  }
  cudaEventDestroy(g->ev_user);
  cudaEventDestroy(g->ev_send);
  cudaEventDestroy(g->ev_recv);
  cudaEventDestroy(g->ev_oneshot);
  for (int i = 0; i < 64; i++) cudaEventDestroy(g->inflight_ev[i]);
  fc_pcie_close(g);
  cudaFree(g->stage);
  cudaFree(g->epoch);
  cudaFree(g->p2p_base);
  cudaFree(g->ring_rank_dev);
  cudaFree(g->p2p_peer_area);
  cudaFree(g->p2p_peer_ctr);
  cudaFree(g->dev_scratch);
  free(g->host_copy[0]);
  free(g->host_copy[1]);
  cudaFree(g->lane_clk);
  cudaFreeHost(g->lane_rec);
  cudaFreeHost(g->error_host);
  cudaGetLastError();
  free(g->peers);
  free(g);
  comm->gpu = NULL;
  fc_gpu_leave_device(prev);
}

/* Release device work stuck on peers: kernels see the error flag; direct mode's stream waits see
 * their flags jump far ahead (the comparison is wrap-aware, so +2^30 satisfies any wait in flight). */
void fc_gpu_comm_abort(struct flexcoll_comm *comm) {
  struct fc_gpu *g = comm->gpu;
  if (!g) return;
  __atomic_store_n(g->error_host, FC_DEV_ERROR_ABORT, __ATOMIC_SEQ_CST);
  const int prev = fc_gpu_switch_device(g->device);
  for (int q = 0; q < comm->nranks; q++) {
    fc_pair_flags_t *f = (fc_pair_flags_t *)(g->stage + g->pair_flags_off) + q;
    g->write_value32(g->util_stream, (CUdeviceptr)&f->arrive, g->direct_seq + (1u << 30), 0);
    g->write_value32(g->util_stream, (CUdeviceptr)&f->done, g->direct_seq + (1u << 30), 0);
    g->write_value32(g->util_stream, (CUdeviceptr)&f->desc, g->direct_desc, 0);
  }
  cudaStreamSynchronize(g->util_stream);
  cudaGetLastError();
  fc_gpu_leave_device(prev);
}

void fc_gpu_track(struct flexcoll_comm *comm, cudaStream_t stream) {
  struct fc_gpu *g = comm->gpu;
  fc_gpu_poll_async_error(comm); /* retire finished entries first */
  if (g->inflight_head - g->inflight_tail == 64) return; /* full: the oldest still tells */
  unsigned i = g->inflight_head++ % 64;
  cudaEventRecord(g->inflight_ev[i], stream);
  g->inflight_t[i] = fc_now_ms();
}

/* The communicator's first error found in its device work becomes its async error, and why (a
 * printf format) becomes its last-error string (and a WARN line), so that flexcoll_get_last_error
 * after flexcoll_comm_get_async_error says what failed, not only the code.  Later ones are not
 * even formatted: get_async_error may be polled in a loop. */
static void device_work_failed(struct flexcoll_comm *comm, flexcoll_result_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void device_work_failed(struct flexcoll_comm *comm, flexcoll_result_t err, const char *fmt, ...) {
  if (atomic_load(&comm->async_error) != FLEXCOLL_SUCCESS) return;
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  fc_comm_set_async_error(comm, err);
  fc_error(comm, err, "rank %d: %s; abort and destroy the communicator", comm->rank, why);
}

void fc_gpu_note_kernel_error(struct flexcoll_comm *comm) {
  struct fc_gpu *g = comm->gpu;
  if (!g) return;
  const int found = __atomic_load_n(g->error_host, __ATOMIC_SEQ_CST);
  if (found == FC_DEV_ERROR_TIMEOUT) {
    device_work_failed(comm, FLEXCOLL_TIMEOUT, "a kernel of this communicator waited for a peer longer than the "
                       "timeout and gave up (a peer did not make the matching call, or its kernel could not start)");
    fc_pcie_report_timeout(g, comm->rank);
  }
  if (found == FC_DEV_ERROR_EXPERT_ID)
    device_work_failed(comm, FLEXCOLL_INVALID_ARGUMENT,
                       "flexcoll_moe_dispatch: expert_ids held an id not below cfg.num_experts (ids below 0 mean no "
                       "expert); that k of its token went nowhere");
}

void fc_gpu_poll_async_error(struct flexcoll_comm *comm) {
  struct fc_gpu *g = comm->gpu;
  if (!g) return;
  fc_gpu_note_kernel_error(comm);
  while (g->inflight_tail != g->inflight_head) {
    unsigned i = g->inflight_tail % 64;
    cudaError_t e = cudaEventQuery(g->inflight_ev[i]);
    if (e == cudaErrorNotReady) {
      const double age = fc_now_ms() - g->inflight_t[i];
      if (age > comm->timeout_ms)
        device_work_failed(comm, FLEXCOLL_TIMEOUT, "a call enqueued %.0f ms ago has not finished (timeout %d ms): a "
                           "peer did not make the matching call, or the work before it on a stream has not finished",
                           age, comm->timeout_ms);
      return;
    }
    if (e != cudaSuccess)
      device_work_failed(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "a call's work on its stream failed: %s",
                         cudaGetErrorString(e));
    g->inflight_tail++;
  }
}
#else
int fc_gpu_count(void) { return 0; }
int fc_gpu_current_device(void) { return FLEXCOLL_CONFIG_UNDEF; }
int fc_gpu_enter_device(const struct flexcoll_comm *comm) { (void)comm; return -1; }
void fc_gpu_leave_device(int previous) { (void)previous; }
int fc_gpu_stream_capturing(flexcoll_stream_t stream) { (void)stream; return 0; }
fc_mem_t fc_mem_type(const void *ptr, int *device) { (void)ptr; *device = -1; return FC_MEM_HOST; }
fc_mem_t fc_mem_query(const void *ptr, int *device, int *pinned) {
  *pinned = 0;
  return fc_mem_type(ptr, device);
}
flexcoll_result_t fc_gpu_comm_init(struct flexcoll_comm *comm) {
  comm->cuda_device = -1;
  if (comm->init_config.cuda_device >= 0)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "config.cuda_device %d: flexcoll was built without CUDA",
                    comm->init_config.cuda_device);
  return FLEXCOLL_SUCCESS;
}
void fc_gpu_comm_fini(struct flexcoll_comm *comm) { (void)comm; }
void fc_gpu_comm_abort(struct flexcoll_comm *comm) { (void)comm; }
void fc_gpu_poll_async_error(struct flexcoll_comm *comm) { (void)comm; }
void fc_gpu_note_kernel_error(struct flexcoll_comm *comm) { (void)comm; }
flexcoll_result_t fc_gpu_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf, void *recvbuf,
                             flexcoll_datatype_t dtype, flexcoll_op_t op, flexcoll_stream_t stream, int capturing) {
  (void)args; (void)sendbuf; (void)recvbuf; (void)dtype; (void)op; (void)stream; (void)capturing;
  return fc_error(comm, FLEXCOLL_INTERNAL_ERROR, "device memory seen by a build without CUDA");
}
const char *fc_gpu_graph_refusal(struct flexcoll_comm *comm, const fc_algo_args_t *args, flexcoll_stream_t stream) {
  (void)comm; (void)args; (void)stream;
  return "this build has no CUDA";
}
flexcoll_result_t fc_gpu_run_p2p(struct flexcoll_comm *comm, const fc_p2p_op_t *ops, int nops, void *const *bufs,
                                 flexcoll_stream_t stream, int capturing) {
  (void)ops; (void)nops; (void)bufs; (void)stream; (void)capturing;
  return fc_error(comm, FLEXCOLL_INTERNAL_ERROR, "device memory seen by a build without CUDA");
}
const char *fc_gpu_p2p_graph_refusal(struct flexcoll_comm *comm, flexcoll_stream_t stream) {
  (void)comm; (void)stream;
  return "this build has no CUDA";
}
int fc_gpu_link_stats(struct flexcoll_comm *comm, flexcoll_link_stats_t *stats, int max) {
  (void)comm; (void)stats; (void)max;
  return 0;
}
void fc_gpu_lanes_set_throttle(struct flexcoll_comm *comm, const char *name, double factor) {
  (void)comm; (void)name; (void)factor;
}
int fc_gpu_lanes_state(struct flexcoll_comm *comm, size_t chunk, fc_gpu_lane_state_t *lanes) {
  (void)comm; (void)chunk; (void)lanes;
  return 0;
}
/* Communicators of a build without CUDA are host-only: api.c refuses windows before these. */
flexcoll_result_t fc_gpu_window_register(struct flexcoll_comm *comm, void *buf, size_t bytes, struct flexcoll_window **out) {
  (void)buf; (void)bytes; (void)out;
  return fc_error(comm, FLEXCOLL_INTERNAL_ERROR, "a window on a build without CUDA");
}
flexcoll_result_t fc_gpu_window_deregister(struct flexcoll_comm *comm, struct flexcoll_window *w) {
  (void)w;
  return fc_error(comm, FLEXCOLL_INTERNAL_ERROR, "a window on a build without CUDA");
}
int fc_gpu_window_valid(struct flexcoll_comm *comm, const struct flexcoll_window *w) { (void)comm; (void)w; return 0; }
#endif

int fc_gpu_comm_wants_device(const struct flexcoll_comm *comm) {
  return comm->init_config.cuda_device >= 0 && fc_gpu_count() > 0;
}
