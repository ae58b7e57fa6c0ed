/* rdma_rcache.c — registrations of user buffers kept between rendezvous messages (rdma_rcache.h).
 *
 * One list in recency order (most recent first) of the cached entries: a lookup walks it for an
 * entry that covers the request, so the list is kept short (FC_RCACHE_MAX_ENTRIES) as well as
 * bounded in bytes.  Collectives reuse a handful of buffers, so a hit is found in the first few
 * entries.  Entries outside the list (registered for one message, or invalidated while held) are
 * deregistered when their last holder puts them back.
 *
 * A device cache (fc_rcache_new_device) keys its entries by the CUDA allocation's buffer id as
 * well as the range, and registers through fc_rdma_reg_device (dma-buf, else by address). */
#define _GNU_SOURCE
#include "config.h"

#if HAVE_VERBS_H
#include "rdma_rcache.h"
#include "rdma_dev.h"
#include "gpu/gpu.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* A linear lookup over more entries than this would cost more than the registrations it saves
 * on the small messages just above the threshold. */
#define FC_RCACHE_MAX_ENTRIES 256

struct fc_rc_ent {
  uintptr_t lo, hi; /* whole pages */
  int access;       /* as asked (without the cache's extra flags) */
  int refs;
  int cached;       /* in the list */
  unsigned long long id; /* a device cache's: the allocation's buffer id (0: none known) */
  int how;               /* a device cache's: FC_RDMA_REG_DMABUF or FC_RDMA_REG_ADDRESS */
  struct ibv_mr *mr;
  fc_rc_ent_t *prev, *next;
};

struct fc_rcache {
  const fc_verbs_t *v;
  struct ibv_pd *pd;
  size_t max_bytes, bytes, entries;
  int extra_access;
  uintptr_t page;
  fc_rc_ent_t *head, *tail;
  unsigned long long hits, misses, evictions, stale;
};

fc_rcache_t *fc_rcache_new(const fc_verbs_t *v, struct ibv_pd *pd, size_t max_bytes, int extra_access) {
  fc_rcache_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->v = v;
  c->pd = pd;
  c->max_bytes = max_bytes;
  c->extra_access = extra_access;
  long pg = sysconf(_SC_PAGESIZE);
  c->page = pg > 0 ? (uintptr_t)pg : 4096;
  return c;
}

static void unlink_ent(fc_rcache_t *c, fc_rc_ent_t *e) {
  if (!e->cached) return;
  if (e->prev) e->prev->next = e->next;
  else c->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else c->tail = e->prev;
  e->prev = e->next = NULL;
  e->cached = 0;
  c->bytes -= e->hi - e->lo;
  c->entries--;
}

static void push_front(fc_rcache_t *c, fc_rc_ent_t *e) {
  e->prev = NULL;
  e->next = c->head;
  if (c->head) c->head->prev = e;
  else c->tail = e;
  c->head = e;
  e->cached = 1;
  c->bytes += e->hi - e->lo;
  c->entries++;
}

static void drop(fc_rcache_t *c, fc_rc_ent_t *e) {
  unlink_ent(c, e);
  if (e->mr) c->v->dereg_mr(e->mr);
  free(e);
}

/* Least recently used first, skipping entries in use, until the bounds hold (entries in use
 * may keep the cache over its bound until they are put back). */
static void evict(fc_rcache_t *c) {
  for (fc_rc_ent_t *e = c->tail, *prev; e; e = prev) {
    if (c->bytes <= c->max_bytes && c->entries <= FC_RCACHE_MAX_ENTRIES) break;
    prev = e->prev;
    if (e->refs) continue;
    drop(c, e);
    c->evictions++;
  }
}

/* A cached entry of buffer id `id` (0: host memory) covering [lo, hi) with at least `access`,
 * made the most recent and held by the caller; NULL (a miss counted) where there is none. */
static fc_rc_ent_t *find(fc_rcache_t *c, unsigned long long id, uintptr_t lo, uintptr_t hi, int access) {
  for (fc_rc_ent_t *e = c->head; e; e = e->next)
    if (e->id == id && e->lo <= lo && hi <= e->hi && (e->access & access) == access) {
      c->hits++;
      unlink_ent(c, e);
      push_front(c, e);
      e->refs++;
      return e;
    }
  c->misses++;
  return NULL;
}

/* A new registration mr of [lo, hi), held by the caller; kept in the list where `cacheable` and
 * within the bound, else deregistered when given back.  NULL where out of memory (mr then goes). */
static fc_rc_ent_t *adopt(fc_rcache_t *c, struct ibv_mr *mr, uintptr_t lo, uintptr_t hi, int access,
                          unsigned long long id, int cacheable) {
  fc_rc_ent_t *e = calloc(1, sizeof *e);
  if (!e) {
    c->v->dereg_mr(mr);
    return errno = ENOMEM, NULL;
  }
  *e = (fc_rc_ent_t){.lo = lo, .hi = hi, .access = access, .refs = 1, .id = id, .mr = mr};
  if (cacheable && hi - lo <= c->max_bytes) {
    push_front(c, e);
    evict(c);
  }
  return e;
}

struct ibv_mr *fc_rcache_get(fc_rcache_t *c, void *buf, size_t len, int access, fc_rc_ent_t **ent) {
  *ent = NULL;
  const uintptr_t lo = (uintptr_t)buf & ~(c->page - 1);
  const uintptr_t hi = ((uintptr_t)buf + len + c->page - 1) & ~(c->page - 1);
  fc_rc_ent_t *e = find(c, 0, lo, hi, access);
  if (!e) {
    /* Whole pages: the kernel pins (or maps) whole pages anyway, and a neighbouring buffer in the
     * same pages then hits. */
    errno = 0;
    struct ibv_mr *mr = c->v->reg_mr(c->pd, (void *)lo, hi - lo, access | c->extra_access);
    if (!mr) return errno = errno ? errno : ENOMEM, NULL;
    if (!(e = adopt(c, mr, lo, hi, access, 0, 1))) return NULL;
  }
  *ent = e;
  return e->mr;
}

fc_rcache_t *fc_rcache_new_device(const fc_verbs_t *v, struct ibv_pd *pd, size_t max_bytes) {
  return fc_rcache_new(v, pd, max_bytes, 0);
}

/* Entries nobody holds whose allocation is gone (freed: its buffer id no longer answers at that
 * address).  A registration of device memory may keep the memory itself from going back to the
 * driver, so they go as soon as a miss (which costs a registration anyway) notices. */
static void sweep_freed(fc_rcache_t *c) {
  for (fc_rc_ent_t *e = c->head, *next; e; e = next) {
    next = e->next;
    fc_gpu_alloc_t a;
    if (e->refs || (fc_gpu_alloc_of((const void *)e->lo, &a) == 0 && a.id == e->id)) continue;
    drop(c, e);
    c->stale++;
  }
}

struct ibv_mr *fc_rcache_get_device(fc_rcache_t *c, void *buf, size_t len, int access, fc_rc_ent_t **ent, int *how,
                                    char *why, size_t wlen) {
  *ent = NULL;
  uintptr_t lo = (uintptr_t)buf, hi = lo + len;
  fc_gpu_alloc_t a;
  const int known = fc_gpu_alloc_of(buf, &a) == 0 && a.id != 0 && a.plain;
  fc_rc_ent_t *e = known ? find(c, a.id, lo, hi, access) : NULL;
  if (e) {
    *how = e->how;
    *ent = e;
    return e->mr;
  }
  if (!known) {
    c->misses++;
  } else {
    sweep_freed(c);
    /* The whole allocation where it is small against the bound: other buffers carved from it
     * (a framework's caching allocator hands out pieces of one allocation) then hit too. */
    if (a.size <= c->max_bytes / 4 && a.base <= lo && hi <= a.base + a.size) lo = a.base, hi = a.base + a.size;
  }
  struct ibv_mr *mr = fc_rdma_reg_device(c->v, c->pd, (void *)lo, hi - lo, access, how, why, wlen);
  if (!mr) return NULL;
  /* Without a buffer id of a plain allocation nothing could tell a reallocation: that
   * registration is for this message alone. */
  if (!(e = adopt(c, mr, lo, hi, access, known ? a.id : 0, known))) {
    snprintf(why, wlen, "out of memory");
    *how = FC_RDMA_REG_NONE;
    return NULL;
  }
  e->how = *how;
  *ent = e;
  return e->mr;
}

void fc_rcache_put(fc_rcache_t *c, fc_rc_ent_t *e, int invalidate) {
  if (!e) return;
  if (invalidate) unlink_ent(c, e);
  if (--e->refs > 0) return;
  if (!e->cached) drop(c, e);
  else evict(c);
}

void fc_rcache_stats(const fc_rcache_t *c, fc_rcache_stats_t *s) {
  s->hits = c->hits;
  s->misses = c->misses;
  s->evictions = c->evictions;
  s->stale = c->stale;
  s->bytes = c->bytes;
  s->entries = c->entries;
}

void fc_rcache_free(fc_rcache_t *c) {
  if (!c) return;
  while (c->head) drop(c, c->head);
  free(c);
}

#endif
