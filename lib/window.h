/* window.h — a symmetric window (flexcoll_window_register): device memory, whose peers are mapped
 * through CUDA IPC (lib/gpu/peer_mem.c), or host memory from flexcoll_host_alloc, whose peers are
 * mapped as shared files (lib/host/window.c).  One type, so that the public handle is one. */
#ifndef FC_WINDOW_H
#define FC_WINDOW_H

#include <stddef.h>
#include <stdint.h>

struct flexcoll_comm;

struct flexcoll_window {
  uint64_t magic;
  struct flexcoll_comm *comm;
  unsigned id;               /* registration order: the same window has the same id on every rank */
  char *base;
  size_t bytes;
  char **peer;               /* [q]: rank q's window as addressed here ([rank]: base); NULL: not mapped */
  char **mapping;            /* device: [q] the IPC cache entry it lies in (NULL in this process);
                              * host: [q] the start of rank q's allocation as mapped here (NULL: not
                              * mapped by this window) */
  size_t *mapped;            /* host: [q] the bytes of mapping[q] */
  int mapped_all;            /* host: every rank mapped every peer's window (else calls ignore it) */
  struct flexcoll_window *next;
};

/* Whether [ptr, ptr + bytes) lies in w; *offset gets ptr's offset from w's start then. */
static inline int fc_window_covers(const struct flexcoll_window *w, const void *ptr, size_t bytes, size_t *offset) {
  const uintptr_t p = (uintptr_t)ptr, b = (uintptr_t)w->base;
  if (p < b || p - b > w->bytes || bytes > w->bytes - (p - b)) return 0;
  *offset = p - b;
  return 1;
}

/* Whether w is one of the windows of list (linked by next). */
static inline int fc_window_listed(const struct flexcoll_window *list, const struct flexcoll_window *w) {
  for (; list; list = list->next)
    if (list == w) return 1;
  return 0;
}

#endif
