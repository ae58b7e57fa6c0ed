/* rdma_rcache.h — the rdma link's registration cache for rendezvous buffers (rdma_rcache.c).
 *
 * A rendezvous message needs the user's buffer registered on both sides; registering it per
 * message costs a system call and, for pinned memory, pinning every page, which dominates messages
 * just above the zero-copy threshold.  The cache keeps registrations of whole pages, keyed by
 * (address range, access), hands out any one that covers a request with at least its access, and
 * deregisters the least recently used ones that nobody holds once more than its bound of bytes is
 * registered.  With a bound of 0 every registration is for its message alone (the old behaviour).
 *
 * Whether caching is safe is the caller's decision (rdma.c): a cached pinned registration
 * outlives a buffer the user unmaps and maps again at the same address (it still points at the
 * old pages), so rdma.c caches only registrations that follow the page tables (on-demand paging),
 * or pinned ones where the user promised not to unmap (FLEXCOLL_RDMA_RCACHE_PINNED).
 *
 * Device buffers (GPUDirect RDMA) have a cache of their own, always safe: its entries carry the
 * CUDA allocation's buffer id, which no later allocation gets, so memory freed and allocated
 * again at the same address misses; entries of freed allocations are deregistered at the next
 * miss.  A registration covers the whole allocation where that is at most a quarter of the
 * bound (other buffers carved from it then hit), else the request. */
#ifndef FC_RDMA_RCACHE_H
#define FC_RDMA_RCACHE_H

#include <stddef.h>

#include "verbs.h"

typedef struct fc_rcache fc_rcache_t;
typedef struct fc_rc_ent fc_rc_ent_t;

typedef struct {
  unsigned long long hits, misses, evictions;
  unsigned long long stale; /* device entries dropped because their allocation was freed */
  size_t bytes;   /* registered in cached entries now */
  size_t entries; /* cached entries now */
} fc_rcache_stats_t;

/* A cache over pd.  max_bytes: the most bytes kept registered (0: nothing kept); extra_access:
 * flags every registration takes (IBV_ACCESS_ON_DEMAND).  NULL when out of memory. */
fc_rcache_t *fc_rcache_new(const fc_verbs_t *v, struct ibv_pd *pd, size_t max_bytes, int extra_access);
/* A registration covering [buf, buf + len) (len > 0) with at least `access`, held until
 * fc_rcache_put(*ent).  NULL (errno set) when ibv_reg_mr fails. */
struct ibv_mr *fc_rcache_get(fc_rcache_t *c, void *buf, size_t len, int access, fc_rc_ent_t **ent);
/* A device cache over pd (the same bound; 0: every registration for its message alone). */
fc_rcache_t *fc_rcache_new_device(const fc_verbs_t *v, struct ibv_pd *pd, size_t max_bytes);
/* A registration of device memory covering [buf, buf + len) with at least `access`, through
 * fc_rdma_reg_device (*how: which way, FC_RDMA_REG_*), held until fc_rcache_put(*ent).  NULL, with
 * the reason in why, where the memory cannot be registered. */
struct ibv_mr *fc_rcache_get_device(fc_rcache_t *c, void *buf, size_t len, int access, fc_rc_ent_t **ent, int *how,
                                    char *why, size_t wlen);
/* Give back what get handed out.  invalidate: never hand this registration out again, and
 * deregister it as soon as nobody holds it (a receive given up: a peer still writing into it must
 * fail, not write into memory its owner took back). */
void fc_rcache_put(fc_rcache_t *c, fc_rc_ent_t *e, int invalidate);
void fc_rcache_stats(const fc_rcache_t *c, fc_rcache_stats_t *s);
/* Deregister everything and free the cache: only once no queue pair can use the registrations
 * and every holder has put its entry back. */
void fc_rcache_free(fc_rcache_t *c);

#endif
