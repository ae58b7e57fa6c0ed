/* pcie.c — the pcie link of the ring kernels: a second ring through pinned host memory.
 *
 * Every rank owns a host staging area (POSIX shared memory, so that ranks in other processes
 * can map it too, registered with CUDA as mapped memory): counters first, then a ring area laid
 * out as the NVLink ring area in the staging allocation.  A rank maps its own and its two ring
 * neighbours' areas; the ring kernel's pcie blocks store into the next rank's area (posted
 * writes over this GPU's PCIe port) and read their own (loads over the port), with the same
 * counters protocol as the NVLink lane (lib/kernels/ring.cu).  No copy engine and no proxy
 * thread: a proxy's copies would sit in the same hardware queues as the kernel that waits for
 * them (the hardware-queue rule, docs/ARCHITECTURE.md), and the kernel already holds the data
 * in registers when it pushes; nothing of a call lives on the host, so graphs replay it.
 *
 * The split of a chunk between the lanes comes from two cost models (nvlink, pcie), calibrated
 * at creation by timing the ring kernel on each lane alone, averaged over the ranks (every rank
 * splits alike), cached on disk by the topology; FLEXCOLL_LINK_SHARES fixes it instead, and
 * where the ranks have no peer access (or FLEXCOLL_LINKS leaves nvlink out, which leaves the
 * peers unmapped), the ring kernels run on this lane alone, every call through host memory whole. */
#define _GNU_SOURCE
#include "config.h"

#if HAVE_CUDA
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"
#include "error.h"
#include "gpu/device.h"
#include "log.h"
#include "param.h"
#include "topo.h"

FC_PARAM_INT(pcie_area_bytes, "PCIE_AREA_BYTES", 4 << 20)
FC_PARAM_INT(pcie_blocks, "PCIE_BLOCKS", 16)

/* FLEXCOLL_LINK_SHARES's pcie fraction of nvlink + pcie; -1 when it names neither. */
static double fixed_fraction(void) {
  const char *s = fc_param_str("FLEXCOLL_LINK_SHARES", NULL);
  if (!s) return -1;
  double nv = 0, pc = 0;
  int named = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    char *colon = strchr(tok, ':');
    if (!colon) continue; /* links.c refuses the malformed list */
    *colon = 0;
    double f = strtod(colon + 1, NULL);
    if (!strcmp(tok, "nvlink")) nv = f, named = 1;
    if (!strcmp(tok, "pcie")) pc = f, named = 1;
  }
  if (!named || !(nv + pc > 0)) return -1;
  return pc / (nv + pc);
}

static void shm_name(const struct flexcoll_comm *comm, int rank, char *out, size_t len) {
  /* A hash of the unique id: the same on every rank, different for every communicator. */
  const uint64_t h = fc_hash_bytes(FC_HASH_INIT, &comm->init_id, sizeof comm->init_id);
  snprintf(out, len, "/flexcoll-pcie-%016llx-%d", (unsigned long long)h, rank);
}

/* Map rank's host area here (create: it is ours, new and zeroed) and register it with CUDA;
 * *host NULL and a reason in why when that cannot be done. */
static void map_area(const struct flexcoll_comm *comm, const fc_pcie_t *p, int rank, int create, char **host, char **dev,
                     char *why, size_t wlen) {
  char name[96];
  shm_name(comm, rank, name, sizeof name);
  *host = *dev = NULL;
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0 && create && errno == EEXIST) { /* left by a process that died in a communicator of the same id */
    shm_unlink(name);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) {
    snprintf(why, wlen, "shm_open(%s): %s", name, strerror(errno));
    return;
  }
  /* Reserve the pages now: a full /dev/shm fails here instead of raising SIGBUS at a store. */
  int e = create ? posix_fallocate(fd, 0, (off_t)p->bytes) : 0;
  if (e) {
    snprintf(why, wlen, "reserving %zu bytes of %s: %s", p->bytes, name, strerror(e));
    close(fd);
    shm_unlink(name);
    return;
  }
  void *m = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    snprintf(why, wlen, "mmap of %s: %s", name, strerror(errno));
    if (create) shm_unlink(name);
    return;
  }
  cudaError_t ce = cudaHostRegister(m, p->bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  void *d = NULL;
  if (ce == cudaSuccess) ce = cudaHostGetDevicePointer(&d, m, 0);
  if (ce != cudaSuccess) {
    cudaGetLastError();
    snprintf(why, wlen, "registering %s with CUDA: %s", name, cudaGetErrorString(ce));
    munmap(m, p->bytes);
    if (create) shm_unlink(name);
    return;
  }
  *host = m;
  *dev = d;
}

static void unmap_area(fc_pcie_t *p, char **host) {
  if (!*host) return;
  cudaHostUnregister(*host);
  munmap(*host, p->bytes);
  *host = NULL;
}

void fc_pcie_close(struct fc_gpu *g) {
  fc_pcie_t *p = &g->pcie;
  if (p->prev_host == p->next_host) p->prev_host = NULL; /* one mapping for both with 2 ranks */
  unmap_area(p, &p->next_host);
  unmap_area(p, &p->prev_host);
  unmap_area(p, &p->own_host);
  cudaGetLastError();
  /* Without the link, FLEXCOLL_LINKS=pcie cannot route anything through it: the usual paths. */
  p->on = p->only = 0;
}

/* Whether every rank says ok (collective). */
static flexcoll_result_t everyone(struct flexcoll_comm *comm, int ok, int *all_ok) {
  int first_not = -1;
  flexcoll_result_t res = fc_bootstrap_agree(comm->bootstrap, ok, &first_not);
  *all_ok = first_not < 0;
  return res;
}

/* ---- calibration --------------------------------------------------------------------------- */

/* Microseconds of one ring allgather of `bytes` per rank on one lane alone (the fastest of a
 * few, after a warm-up), or a negative number when a launch failed.  Every rank runs the same
 * kernels in the same order; each waits for its own before the next, so ranks sharing a GPU
 * with one hardware queue never queue a kernel behind one that waits for them. */
static double time_lane(struct flexcoll_comm *comm, struct fc_gpu *g, int pcie, size_t bytes, char *buf) {
  fc_ring_args_t a;
  fc_gpu_ring_args(comm, g, &a);
  a.pc_chunk_bytes = pcie ? bytes : 0;
  if (!pcie) a.pc_area = NULL, a.pc_chunk_bytes = 0;
  cudaEvent_t t0, t1;
  if (cudaEventCreate(&t0) != cudaSuccess) return -1;
  if (cudaEventCreate(&t1) != cudaSuccess) {
    cudaEventDestroy(t0);
    return -1;
  }
  double best = -1;
  for (int rep = 0; rep < 4; rep++) {
    cudaEventRecord(t0, g->util_stream);
    int e = fc_kernel_ring_collective(&a, FC_RING_ALLGATHER, buf + (size_t)comm->rank * bytes, buf, bytes, FLEXCOLL_UINT8,
                                      FLEXCOLL_SUM, 0, g->util_stream);
    cudaEventRecord(t1, g->util_stream);
    if (e || cudaEventSynchronize(t1) != cudaSuccess) {
      best = -1;
      break;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    if (rep > 0 && (best < 0 || ms * 1e3 < best)) best = ms * 1e3;
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaGetLastError();
  return best;
}

/* Fit both lanes' models from two sizes (bytes pushed per rank against time); 0 on failure.
 * The buffer is the staging allocation's slots (the staged schedule's, idle during creation):
 * cudaMalloc and cudaFree may wait for the whole device, where other communicators' kernels
 * (TP and DP groups being created at the same time) may wait for this very thread. */
static int calibrate(struct flexcoll_comm *comm, struct fc_gpu *g, fc_link_model_t *m) {
  size_t room = (size_t)g->nslots * g->slice_bytes; /* per rank */
  size_t big = room < ((size_t)4 << 20) ? room / 16 * 16 : (size_t)4 << 20;
  const size_t sizes[2] = {big / 16, big};
  char *buf = g->stage + g->slots_off;
  if (sizes[0] < 16) return 0;
  int ok = 1;
  for (int lane = 0; lane < 2 && ok; lane++) {
    double x[2], y[2];
    for (int k = 0; k < 2 && ok; k++) {
      x[k] = (double)sizes[k] * (comm->nranks - 1);
      y[k] = time_lane(comm, g, lane, sizes[k], buf);
      ok = y[k] > 0;
    }
    m[lane] = (fc_link_model_t){.alpha_us = 0, .beta = 0, .min_bytes = lane ? 64 << 10 : 0, .port = -1};
    if (ok) ok = fc_cost_fit(&m[lane], x, y, 2) == FLEXCOLL_SUCCESS;
  }
  cudaGetLastError();
  return ok;
}

/* The cache key: the lanes' shape and every rank's host and GPU (connect_peers gathered them). */
static void cache_key(const struct flexcoll_comm *comm, const struct fc_gpu *g, char *key, size_t len) {
  snprintf(key, len, "ring-lanes nvlink,pcie ranks %d blocks %u+%u subslots %u areas %zu+%zu where %016llx", comm->nranks,
           g->ring_blocks, g->pcie.blocks, g->ring_subslots, g->ring_bytes, g->pcie.area_bytes,
           (unsigned long long)g->where_hash);
}

/* The lanes' models: from the cache when every rank has them, else calibrated; then rank 0's
 * everywhere (every rank must split alike). */
static flexcoll_result_t seed_models(struct flexcoll_comm *comm, struct fc_gpu *g) {
  fc_pcie_t *p = &g->pcie;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  char key[256];
  cache_key(comm, g, key, sizeof key);
  const char *dir = fc_cost_cache_dir();
  int have = dir && fc_cost_cache_load(dir, key, p->model, 2) == FLEXCOLL_SUCCESS, all_have = 0;
  FC_CHECK(everyone(comm, have, &all_have));
  int fresh = 0;
  if (!all_have) {
    fresh = calibrate(comm, g, p->model);
    int all_fresh = 0;
    FC_CHECK(everyone(comm, fresh, &all_fresh));
    if (!all_fresh) {
      p->on = 0;
      FC_INFO(FC_SUB_SCHED, "rank %d: pcie link off: its calibration failed on some rank", comm->rank);
      return FLEXCOLL_SUCCESS;
    }
  }
  /* Rank 0's models, bit for bit, on every rank. */
  fc_link_model_t *all = calloc((size_t)comm->nranks * 2, sizeof *all);
  if (!all) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  memcpy(&all[2 * comm->rank], p->model, 2 * sizeof *all);
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, all, 2 * sizeof *all);
  if (res == FLEXCOLL_SUCCESS) memcpy(p->model, all, 2 * sizeof *all);
  free(all);
  FC_CHECK(res);
  if (fresh && comm->rank == 0 && dir) fc_cost_cache_save(dir, key, p->model, 2);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  FC_INFO(FC_SUB_SCHED,
          "rank %d: ring lanes %s in %.1f ms: nvlink alpha %.1f us beta %.0f MB/s, pcie alpha %.1f us beta %.0f MB/s",
          comm->rank, all_have ? "from the cache" : "calibrated",
          (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6, p->model[0].alpha_us,
          p->model[0].beta, p->model[1].alpha_us, p->model[1].beta);
  return FLEXCOLL_SUCCESS;
}

/* ---- open ---------------------------------------------------------------------------------- */

flexcoll_result_t fc_pcie_open(struct flexcoll_comm *comm, struct fc_gpu *g) {
  fc_pcie_t *p = &g->pcie;
  memset(p, 0, sizeof *p);
  const int n = comm->nranks, next = (comm->rank + 1) % n, prev = (comm->rank + n - 1) % n;
  char why[256] = "";
  int64_t area = fc_param_pcie_area_bytes(), blocks = fc_param_pcie_blocks();
  p->ctr_bytes = 4096; /* 2 * FC_MAX_BLOCKS counters, page aligned */
  p->area_bytes = (size_t)(area < (64 << 10) ? (64 << 10) : area) / 16 * 16;
  p->bytes = p->ctr_bytes + p->area_bytes;
  p->blocks = blocks < 1 ? 1u : (unsigned)blocks;
  if (p->blocks > g->ring_blocks / 2) p->blocks = g->ring_blocks / 2;
  int want = 1;
  if (!fc_links_names("pcie")) snprintf(why, sizeof why, "FLEXCOLL_LINKS leaves it out"), want = 0;
  else if (!g->ring) snprintf(why, sizeof why, "the ring kernels are off (FLEXCOLL_RING_KERNEL=0)"), want = 0;
  else if (p->blocks < 1) snprintf(why, sizeof why, "ring grids of %u blocks leave none for it", g->ring_blocks), want = 0;
  /* Every rank decides alike on the above (communicator constants); the mappings may still fail
   * on one rank, so they are agreed on. */
  if (!want) {
    FC_INFO(FC_SUB_SCHED, "rank %d: pcie link off: %s", comm->rank, why);
    return FLEXCOLL_SUCCESS;
  }
  map_area(comm, p, comm->rank, 1, &p->own_host, &p->own, why, sizeof why);
  int ok = p->own_host != NULL, all_ok = 0;
  FC_CHECK(everyone(comm, ok, &all_ok));
  if (all_ok) {
    map_area(comm, p, next, 0, &p->next_host, &p->next, why, sizeof why);
    if (p->next_host && prev != next) map_area(comm, p, prev, 0, &p->prev_host, &p->prev, why, sizeof why);
    else p->prev_host = p->next_host, p->prev = p->next;
    ok = p->next_host && p->prev_host;
    /* Everyone has mapped what it needs of ours (or failed): the name can go. */
    flexcoll_result_t res = everyone(comm, ok, &all_ok);
    char name[96];
    shm_name(comm, comm->rank, name, sizeof name);
    shm_unlink(name);
    FC_CHECK(res);
  } else {
    char name[96];
    shm_name(comm, comm->rank, name, sizeof name);
    if (p->own_host) shm_unlink(name);
    if (!why[0]) snprintf(why, sizeof why, "another rank could not create its host area");
  }
  if (!all_ok) {
    fc_pcie_close(g);
    FC_INFO(FC_SUB_SCHED, "rank %d: pcie link off: %s", comm->rank, why[0] ? why : "another rank could not map its areas");
    return FLEXCOLL_SUCCESS;
  }
  p->on = 1;
  /* Without peer access (or without nvlink by choice, which leaves the peers unmapped) the
   * NVLink lane has nowhere to write: the ring kernels run on this lane alone. */
  p->only = !g->p2p;
  p->fixed = fixed_fraction();
  if (!p->only && p->fixed < 0) FC_CHECK(seed_models(comm, g));
  if (p->on)
    FC_INFO(FC_SUB_SCHED, "rank %d: pcie link on: %zu KiB host ring area per rank, up to %u blocks, %s", comm->rank,
            p->area_bytes >> 10, p->blocks,
            p->only ? "every ring call through it (no peer access)" : p->fixed >= 0 ? "fixed share" : "balanced share");
  else
    fc_pcie_close(g);
  return FLEXCOLL_SUCCESS;
}

size_t fc_pcie_split(const struct fc_gpu *g, size_t chunk) {
  const fc_pcie_t *p = &g->pcie;
  if (!p->on || chunk == 0) return 0;
  if (p->only) return chunk;
  size_t pc;
  if (p->fixed >= 0) {
    pc = (size_t)((double)chunk * p->fixed);
  } else {
    size_t shares[2] = {0, 0};
    if (fc_balance(p->model, NULL, 2, chunk, 16, shares, NULL) != FLEXCOLL_SUCCESS) return 0;
    pc = shares[1];
  }
  if (pc >= chunk) return chunk;
  return pc / 16 * 16;
}

int fc_gpu_link_stats(struct flexcoll_comm *comm, flexcoll_link_stats_t *stats, int max) {
  const struct fc_gpu *g = comm->gpu;
  if (!g || comm->nranks < 2) return 0;
  /* The lanes this communicator has: nvlink with peer access, pcie where its lane is on. */
  const int has[2] = {g->p2p, g->ring && g->pcie.on};
  static const char *const names[2] = {"nvlink", "pcie"};
  int k = 0; /* lanes counted; those that fit in max written (as the host links are) */
  for (int L = 0; L < 2; L++) {
    if (!has[L] || k++ >= max) continue;
    flexcoll_link_stats_t *s = &stats[k - 1];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", names[L]);
    s->peer = (comm->rank + 1) % comm->nranks;
    s->bytes = g->pcie.sent[L];
    s->share = g->pcie.share[L];
  }
  return k;
}
#endif
