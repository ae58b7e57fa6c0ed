/* peer_mem.c — the peers' user memory, mapped here for direct mode (direct.c).
 *
 * Two ways to know where a peer's buffer is:
 *   windows   registered once by all ranks together (flexcoll_window_register): each rank's
 *             window is mapped into every peer at registration; a call on window memory finds
 *             the peers' buffers at the same offset of their windows, with no message at all.
 *   exchange  (FLEXCOLL_DIRECT=2, unregistered buffers) the ranks describe their buffers to
 *             one another over the bootstrap at every call (direct.c).
 * Both map other processes' allocations through CUDA IPC, into one cache per communicator:
 * an allocation is opened once however many windows or calls use it.  Windows pin their
 * entries; unpinned ones are closed when the cache fills. */
#define _GNU_SOURCE
#include "config.h"

#if HAVE_CUDA
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "device.h"
#include "error.h"
#include "log.h"

#define WINDOW_MAGIC 0x77696e646f77ULL /* "window" */

int fc_peer_mem_describe(struct fc_gpu *g, const void *ptr, fc_buf_desc_t *d) {
  memset(d, 0, sizeof *d);
  if (!ptr) return 1;
  d->ptr = (uint64_t)(uintptr_t)ptr;
  if (!g->any_ipc_peer) return 1;
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!g->get_address_range || g->get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
    return 0;
  if (cudaIpcGetMemHandle(&d->handle, (void *)(uintptr_t)base) != cudaSuccess) {
    cudaGetLastError(); /* e.g. memory from cudaMallocAsync pools: not shareable this way */
    return 0;
  }
  d->offset = (uint64_t)((uintptr_t)ptr - (uintptr_t)base);
  return 1;
}

/* Close every unpinned mapping (the caller has made sure no work in flight uses them). */
static void release_unpinned(struct fc_gpu *g) {
  int kept = 0;
  for (int i = 0; i < g->ipc_cached; i++) {
    if (g->ipc_cache[i].pins) g->ipc_cache[kept++] = g->ipc_cache[i];
    else cudaIpcCloseMemHandle(g->ipc_cache[i].base);
  }
  g->ipc_cached = kept;
  cudaGetLastError();
}

void fc_peer_mem_release(struct fc_gpu *g) {
  for (struct flexcoll_window *w = g->windows, *next; w; w = next) {
    next = w->next;
    w->magic = 0;
    free(w->peer);
    free(w);
  }
  g->windows = NULL;
  for (int i = 0; i < g->ipc_cached; i++) g->ipc_cache[i].pins = 0;
  release_unpinned(g);
}

/* Wait until this communicator's device work is done: it may copy through cached mappings (and
 * a direct call ends only when the peers are done with our buffers too). */
static void quiesce(struct fc_gpu *g) { fc_gpu_side_streams_sync(g); }

flexcoll_result_t fc_peer_mem_reserve(struct fc_gpu *g, int entries) {
  if (g->ipc_cached <= FC_IPC_CACHE - entries) return FLEXCOLL_SUCCESS;
  quiesce(g);
  release_unpinned(g);
  return g->ipc_cached <= FC_IPC_CACHE - entries ? FLEXCOLL_SUCCESS : FLEXCOLL_INVALID_USAGE;
}

flexcoll_result_t fc_peer_mem_map(struct flexcoll_comm *comm, int q, const fc_buf_desc_t *d, int pin, char **out) {
  struct fc_gpu *g = comm->gpu;
  *out = NULL;
  if (!d->ptr) return FLEXCOLL_SUCCESS;
  if (g->peers[q].same_process) {
    *out = (char *)(uintptr_t)d->ptr;
    return FLEXCOLL_SUCCESS;
  }
  for (int i = 0; i < g->ipc_cached; i++)
    if (g->ipc_cache[i].peer == q && !memcmp(&g->ipc_cache[i].handle, &d->handle, sizeof d->handle)) {
      g->ipc_cache[i].pins += pin;
      *out = g->ipc_cache[i].base + d->offset;
      return FLEXCOLL_SUCCESS;
    }
  if (g->ipc_cached == FC_IPC_CACHE)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "more than %d peer allocations mapped at once (windows)", FC_IPC_CACHE);
  fc_ipc_entry_t *e = &g->ipc_cache[g->ipc_cached];
  cudaError_t err = cudaIpcOpenMemHandle((void **)&e->base, d->handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess)
    return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "mapping rank %d's buffer (cudaIpcOpenMemHandle): %s", q,
                    cudaGetErrorString(err));
  e->peer = q;
  e->handle = d->handle;
  e->pins = pin;
  g->ipc_cached++;
  *out = e->base + d->offset;
  return FLEXCOLL_SUCCESS;
}

/* Drop one pin of the cache entry mapped at `mapping`; the last one closes it, so that the
 * owner's memory is really freed when it frees it (no work in flight may use it). */
static void unpin(struct fc_gpu *g, const char *mapping) {
  for (int i = 0; i < g->ipc_cached; i++)
    if (g->ipc_cache[i].base == mapping && g->ipc_cache[i].pins > 0) {
      if (--g->ipc_cache[i].pins == 0) {
        cudaIpcCloseMemHandle(g->ipc_cache[i].base);
        cudaGetLastError();
        g->ipc_cache[i] = g->ipc_cache[--g->ipc_cached];
      }
      return;
    }
}

/* What one rank tells the others when registering a window. */
typedef struct {
  int32_t error;  /* FLEXCOLL_SUCCESS or why this rank cannot register */
  int32_t pad;
  uint64_t bytes;
  fc_buf_desc_t buf;
} window_desc_t;

/* This rank's part: the buffer must be comm's device memory, inside one allocation. */
static flexcoll_result_t describe_window(struct flexcoll_comm *comm, void *buf, size_t bytes, window_desc_t *d) {
  struct fc_gpu *g = comm->gpu;
  int dev = -1;
  if (fc_mem_type(buf, &dev) != FC_MEM_DEVICE)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "flexcoll_window_register: buf %p is not device memory", buf);
  if (dev != g->device)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "flexcoll_window_register: buf is memory of CUDA device %d but the communicator drives device %d",
                    dev, g->device);
  CUdeviceptr base = 0;
  size_t size = 0;
  if (!g->get_address_range || g->get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)buf) != CUDA_SUCCESS)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "flexcoll_window_register: the allocation around buf is unknown to CUDA");
  if ((uintptr_t)buf - (uintptr_t)base + bytes > size || (uintptr_t)buf - (uintptr_t)base + bytes < bytes)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                    "flexcoll_window_register: bytes %zu run past the end of buf's allocation (%zu bytes from buf)",
                    bytes, size - ((uintptr_t)buf - (uintptr_t)base));
  d->bytes = bytes;
  if (!fc_peer_mem_describe(g, buf, &d->buf))
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "flexcoll_window_register: buf cannot be shared with other processes (cudaIpcGetMemHandle failed; "
                    "memory from cudaMallocAsync pools cannot)");
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t window_register(struct flexcoll_comm *comm, void *buf, size_t bytes,
                                         struct flexcoll_window **out) {
  struct fc_gpu *g = comm->gpu;
  int me = comm->rank, n = comm->nranks;
  window_desc_t *all = calloc((size_t)n, sizeof *all);
  struct flexcoll_window *w = calloc(1, sizeof *w);
  char **peer = calloc(2 * (size_t)n, sizeof *peer); /* then the mappings */
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (!all || !w || !peer) { res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory"); goto fail; }
  /* A rank that cannot register still takes part in the exchange, so that every rank returns
   * an error instead of waiting for it. */
  all[me].error = describe_window(comm, buf, bytes, &all[me]);
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, all, sizeof *all), res, fail);
  if (all[me].error != FLEXCOLL_SUCCESS) { res = all[me].error; goto fail; }
  for (int q = 0; q < n; q++) {
    if (all[q].error != FLEXCOLL_SUCCESS) {
      res = fc_error(comm, FLEXCOLL_INVALID_USAGE, "flexcoll_window_register: rank %d could not register its buffer", q);
      goto fail;
    }
    if (all[q].bytes != bytes) {
      res = fc_error(comm, FLEXCOLL_INVALID_USAGE,
                     "flexcoll_window_register: rank %d registers %llu bytes, this rank %zu (windows must be equal)", q,
                     (unsigned long long)all[q].bytes, bytes);
      goto fail;
    }
  }
  /* Without peer access (agreed by every rank at creation) nothing is mapped: the window is
   * kept, so that its calls and its deregistration work, and its calls take the paths without
   * peer access (windows are a speed-up, never a requirement). */
  if (!g->p2p) {
    peer[me] = buf; /* the others stay NULL (calloc) */
    goto registered;
  }
  res = fc_peer_mem_reserve(g, n);
  if (res != FLEXCOLL_SUCCESS) {
    res = fc_error(comm, res, "flexcoll_window_register: more than %d peer allocations mapped at once", FC_IPC_CACHE);
    goto fail;
  }
  /* Every rank maps the same peers; a failure here fails this rank's call only, and its peers
   * would hold a window it lacks: the communicator is unusable then. */
  for (int q = 0; q < n; q++) {
    if (q == me) { peer[q] = buf; continue; }
    res = fc_peer_mem_map(comm, q, &all[q].buf, 1, &peer[q]);
    if (res == FLEXCOLL_SUCCESS && !g->peers[q].same_process) peer[n + q] = peer[q] - all[q].buf.offset;
    if (res != FLEXCOLL_SUCCESS) {
      quiesce(g);
      for (int p = 0; p < q; p++)
        if (peer[n + p]) unpin(g, peer[n + p]);
      fc_comm_set_async_error(comm, res);
      goto fail;
    }
  }
registered:
  w->magic = WINDOW_MAGIC;
  w->comm = comm;
  w->base = buf;
  w->bytes = bytes;
  w->id = g->windows_registered++;
  w->peer = peer;
  w->mapping = peer + n;
  w->next = g->windows;
  g->windows = w;
  FC_INFO(FC_SUB_GPU, "rank %d: window %u registered: %zu bytes at %p%s", me, w->id, bytes, buf,
          g->p2p ? "" : " (no peer access: not mapped into the peers)");
  free(all);
  *out = w;
  return FLEXCOLL_SUCCESS;
fail:
  free(all);
  free(w);
  free(peer);
  return res;
}

static flexcoll_result_t window_deregister(struct flexcoll_comm *comm, struct flexcoll_window *w) {
  struct fc_gpu *g = comm->gpu;
  struct flexcoll_window **link = &g->windows;
  while (*link && *link != w) link = &(*link)->next;
  if (!*link)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_window_deregister: window is not registered on this communicator");
  /* Direct calls end when every peer is done with our buffers, and ours with theirs: once our
   * streams are idle nobody touches the window through this communicator. */
  quiesce(g);
  *link = w->next;
  for (int q = 0; q < comm->nranks; q++)
    if (w->mapping[q]) unpin(g, w->mapping[q]);
  FC_INFO(FC_SUB_GPU, "rank %d: window %u deregistered", comm->rank, w->id);
  w->magic = 0;
  free(w->peer);
  free(w);
  /* After the barrier no peer uses our buffer any more: the caller may free it. */
  return fc_bootstrap_barrier(comm->bootstrap);
}

/* IPC mappings and stream waits belong to the communicator's device, and the driver calls here
 * need its context current (fc_gpu_switch_device). */
flexcoll_result_t fc_gpu_window_register(struct flexcoll_comm *comm, void *buf, size_t bytes, struct flexcoll_window **out) {
  const int prev = fc_gpu_switch_device(comm->gpu->device);
  const flexcoll_result_t res = window_register(comm, buf, bytes, out);
  fc_gpu_leave_device(prev);
  return res;
}

flexcoll_result_t fc_gpu_window_deregister(struct flexcoll_comm *comm, struct flexcoll_window *w) {
  const int prev = fc_gpu_switch_device(comm->gpu->device);
  const flexcoll_result_t res = window_deregister(comm, w);
  fc_gpu_leave_device(prev);
  return res;
}

int fc_gpu_window_valid(struct flexcoll_comm *comm, const struct flexcoll_window *w) {
  return fc_window_listed(comm->gpu ? comm->gpu->windows : NULL, w);
}

int fc_peer_mem_window_of(struct fc_gpu *g, const void *ptr, size_t bytes, const struct flexcoll_window **w,
                          size_t *offset) {
  for (const struct flexcoll_window *x = g->windows; x; x = x->next)
    if (fc_window_covers(x, ptr, bytes, offset)) {
      *w = x;
      return 1;
    }
  return 0;
}
#endif
