/* host_pages.c — pages known to hold no CUDA memory: fc_mem_type's shortcut past a CUDA query
 * per buffer and call (gpu.h).
 *
 * Why it is safe: CUDA can put device, managed or its own pinned memory only at addresses that
 * nothing else maps, so a page that was ordinary host memory when CUDA was asked stays host
 * memory until it is unmapped.  UCM (UCX's memory hooks, already loaded with UCX) reports every
 * unmapping in the process (munmap, mremap, brk, shmdt, a fixed mmap over old pages) before it
 * happens; each one advances a process-wide count, and an answer noted under an older count is
 * no longer trusted.  Where UCM cannot give those events, or FLEXCOLL_MEM_TYPE_CACHE=0, nothing
 * is remembered and every call asks CUDA, as before.
 *
 * Only plain host memory is remembered (fc_mem_type notes what CUDA calls unregistered): a freed
 * device buffer's address may come back on another device, and CUDA's own pinned allocations are
 * unmapped by the driver, perhaps out of UCM's sight.  Pinning plain memory (fc_mem_pin) counts
 * as an unmapping: the page stays host memory, but copies should now reach it by DMA.
 * Each thread keeps its own few pages (ranks as threads never share or lock). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <ucm/api/ucm.h>

#include "gpu/gpu.h"
#include "log.h"
#include "param.h"

FC_PARAM_INT(mem_type_cache, "MEM_TYPE_CACHE", 1)

#define PAGE_SHIFT 12
#define PAGES 16 /* per thread: a few buffers in turn (send, recv, a couple of tensors) */

static atomic_uint_fast64_t g_unmaps;
static int g_enabled;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static __thread struct {
  uintptr_t page1; /* page number + 1 (0: empty) */
  uint64_t epoch;
} t_pages[PAGES];

static void on_unmap(ucm_event_type_t type, ucm_event_t *event, void *arg) {
  (void)type;
  (void)event;
  (void)arg;
  atomic_fetch_add(&g_unmaps, 1);
}

void fc_host_pages_forget(void) { atomic_fetch_add(&g_unmaps, 1); }

static void install(void) {
  if (!fc_param_mem_type_cache()) {
    FC_INFO(FC_SUB_INIT, "memory type cache off (FLEXCOLL_MEM_TYPE_CACHE=0): CUDA is asked at every call");
    return;
  }
  ucs_status_t s = ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, on_unmap, NULL);
  if (s != UCS_OK) {
    FC_INFO(FC_SUB_INIT, "memory type cache off: UCM gives no unmap events (%s); CUDA is asked at every call",
            ucs_status_string(s));
    return;
  }
  g_enabled = 1;
}

uint64_t fc_host_pages_epoch(void) {
  pthread_once(&g_once, install);
  return g_enabled ? (uint64_t)atomic_load(&g_unmaps) : UINT64_MAX;
}

static unsigned slot_of(uintptr_t page) { return (unsigned)((page ^ (page >> 7)) % PAGES); }

int fc_host_pages_known(const void *ptr) {
  const uint64_t now = fc_host_pages_epoch();
  if (now == UINT64_MAX) return 0;
  const uintptr_t page = (uintptr_t)ptr >> PAGE_SHIFT;
  const unsigned i = slot_of(page);
  return t_pages[i].page1 == page + 1 && t_pages[i].epoch == now;
}

void fc_host_pages_note(const void *ptr, uint64_t epoch) {
  if (epoch == UINT64_MAX) return;
  const uintptr_t page = (uintptr_t)ptr >> PAGE_SHIFT;
  const unsigned i = slot_of(page);
  t_pages[i].page1 = page + 1;
  t_pages[i].epoch = epoch;
}
