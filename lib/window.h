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
  int host;                  /* host memory (lib/host/window.c); else device memory */
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

#endif
