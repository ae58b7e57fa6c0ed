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
 * (With FLEXCOLL_PCIE_ENGINE=ce copy engines move the bytes after all, and with
 * FLEXCOLL_RING_LANE=rdma the rdma link does, device to device: a proxy thread per rank,
 * pcie_ce.c; the areas then hold the counters and descriptors the proxies follow.)
 *
 * The split of a chunk between the lanes comes from two cost models (nvlink, pcie), calibrated
 * at creation by timing the ring kernel on each lane alone, averaged over the ranks (every rank
 * splits alike), cached on disk by the topology; FLEXCOLL_LINK_SHARES fixes it instead, and
 * where the ranks have no peer access (or FLEXCOLL_LINKS leaves nvlink out, which leaves the
 * peers unmapped), the ring kernels run on this lane alone, every call through host memory whole.
 *
 * Stage 2: ring calls of at least FLEXCOLL_LANE_STAGE2_BYTES are timed by the kernel itself (each
 * lane's span on the device clock, published in a host-mapped record once the kernel is done:
 * kernels.h, fc_lane_record_t); before every ring call the host takes the records that are
 * there, without waiting.  Every FC_STAGE2_EVERY large calls rank 0 applies lib/sched's stage-2
 * rule to its own sums and posts the models on a board in shared memory; every rank puts update
 * m in force at the same large call, FC_LANE_STAGE2_LAG calls after rank 0 posted it, so the
 * split changes on every rank at the same call.  Not the bootstrap: an exchange there would make
 * an enqueue wait for every peer's host (a rank that stopped calling would hold the others' calls,
 * not only their kernels); rank 0 never waits, another rank only when its host runs that many
 * large calls ahead of rank 0's.  A captured call keeps the split of its capture in the graph
 * and is not timed. */
#define _GNU_SOURCE
#include "config.h"

#if HAVE_CUDA
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "clock.h"
#include "comm.h"
#include "error.h"
#include "gpu/device.h"
#include "kernels/ring_plan.h"
#include "log.h"
#include "param.h"
#include "topo.h"
#include "sched/sched.h"

FC_PARAM_INT(pcie_area_bytes, "PCIE_AREA_BYTES", 4 << 20)
FC_PARAM_INT(pcie_blocks, "PCIE_BLOCKS", 16)
FC_PARAM_INT(ring_lane_inband, "RING_LANE_INBAND", 0)
FC_PARAM_INT(ring_hops, "RING_HOPS", 1)
/* Ring calls from this size (count x type size) are timed and move the split (0: none): timing
 * costs a few atomics per block, an update a few microseconds of rank 0's host, so only calls
 * whose lane times are long against the device clock's steps and the launch skew between ranks. */
FC_PARAM_INT(lane_stage2_bytes, "LANE_STAGE2_BYTES", 16 << 20)
/* The pcie lane's smallest share per chunk (the model's min_bytes, kept through stage 2): one
 * pcie block's part (ring.cu, FC_RING_MIN_PART); less would leave its block mostly flag waits. */
#define FC_PCIE_MIN_SHARE (64u << 10)
/* Rank 0's update posted at its large call c is in force on every rank from call c +
 * FC_LANE_STAGE2_LAG + 1: another rank's host may run that many large calls ahead of rank 0's
 * before it has to wait for the update (a multiple of FC_STAGE2_EVERY). */
#define FC_LANE_STAGE2_LAG (2 * FC_STAGE2_EVERY)

/* FLEXCOLL_LINK_SHARES's fractions of the lanes (nvlink, then the side lanes by name: pcie, or
 * the host link that carries one) into p->fixed, normalised over the lanes that can carry bytes
 * (not nvlink where there is no NVLink lane); fixed[0] = -1 when it names none of them or gives
 * them nothing. */
static void fixed_fractions(fc_pcie_t *p) {
  p->fixed[0] = -1;
  const char *s = fc_param_str("FLEXCOLL_LINK_SHARES", NULL);
  if (!s) return;
  double f[FC_RING_LANES] = {0}, sum = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    char *colon = strchr(tok, ':');
    if (!colon) continue; /* links.c refuses the malformed list */
    *colon = 0;
    const double v = strtod(colon + 1, NULL);
    if (!strcmp(tok, "nvlink") && !p->only) f[0] = v;
    for (int k = 0; k < p->nside; k++)
      if (!strcmp(tok, p->side[k].name)) f[k + 1] = v;
  }
  for (int L = 0; L < FC_RING_LANES; L++) sum += f[L];
  if (!(sum > 0)) return;
  for (int L = 0; L < FC_RING_LANES; L++) p->fixed[L] = f[L] / sum;
}

static void shm_name(const struct flexcoll_comm *comm, const fc_side_lane_t *s, int rank, char *out, size_t len) {
  /* A hash of the unique id: the same on every rank, different for every communicator. */
  const uint64_t h = fc_hash_bytes(FC_HASH_INIT, &comm->init_id, sizeof comm->init_id);
  snprintf(out, len, "/flexcoll-lane%d-%016llx-%d", s->index, (unsigned long long)h, rank);
}

/* Map rank's host area here (create: it is ours, new and zeroed) and register it with CUDA;
 * *host NULL and a reason in why when that cannot be done. */
static void map_area(const struct flexcoll_comm *comm, const fc_side_lane_t *s, int rank, int create, char **host,
                     char **dev, char *why, size_t wlen) {
  char name[96];
  shm_name(comm, s, rank, name, sizeof name);
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
  int e = create ? posix_fallocate(fd, 0, (off_t)s->bytes) : 0;
  if (e) {
    snprintf(why, wlen, "reserving %zu bytes of %s: %s", s->bytes, name, strerror(e));
    close(fd);
    shm_unlink(name);
    return;
  }
  void *m = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    snprintf(why, wlen, "mmap of %s: %s", name, strerror(errno));
    if (create) shm_unlink(name);
    return;
  }
  cudaError_t ce = cudaHostRegister(m, s->bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  void *d = NULL;
  if (ce == cudaSuccess) ce = cudaHostGetDevicePointer(&d, m, 0);
  if (ce != cudaSuccess) {
    cudaGetLastError();
    snprintf(why, wlen, "registering %s with CUDA: %s", name, cudaGetErrorString(ce));
    munmap(m, s->bytes);
    if (create) shm_unlink(name);
    return;
  }
  *host = m;
  *dev = d;
}

/* This rank's area's name, once every rank that maps the area has done so. */
static void unlink_own_area(const struct flexcoll_comm *comm, const fc_side_lane_t *s) {
  char name[96];
  shm_name(comm, s, comm->rank, name, sizeof name);
  shm_unlink(name);
}

static void unmap_area(const fc_side_lane_t *s, char **host) {
  if (!*host) return;
  cudaHostUnregister(*host);
  munmap(*host, s->bytes);
  *host = NULL;
}

/* One side lane's proxy, mappings and state, all of it (also of a lane that never opened). */
static void close_side(fc_side_lane_t *s) {
  fc_pcie_ce_stop(s); /* before the areas it copies through go */
  s->ce = 0;
  if (s->prev_host == s->next_host) s->prev_host = NULL; /* one mapping for both with 2 ranks */
  unmap_area(s, &s->next_host);
  unmap_area(s, &s->prev_host);
  unmap_area(s, &s->own_host);
  cudaGetLastError();
  s->on = s->inband = 0;
  s->link = NULL;
  s->next = s->prev = NULL;
}

void fc_pcie_close(struct fc_gpu *g) {
  fc_pcie_t *p = &g->pcie;
  for (int k = 0; k < FC_RING_SIDE_LANES; k++) close_side(&p->side[k]);
  p->nside = 0;
  if (p->board) munmap(p->board, FC_LANE_BOARD_ENTRIES * sizeof *p->board);
  p->board = NULL;
  p->adapt = 0;
  /* Without the lanes, FLEXCOLL_LINKS=pcie cannot route anything through them: the usual paths. */
  p->only = 0;
}

void fc_pcie_report_timeout(struct fc_gpu *g, int rank) {
  for (int k = 0; k < g->pcie.nside; k++) {
    fc_side_lane_t *s = &g->pcie.side[k]; /* the kernel-driven lanes (a proxy reports its own) */
    if (!s->on || s->ce || s->stall_reported || !s->own_host) continue;
    s->stall_reported = 1;
    const volatile uint64_t *own = (const uint64_t *)s->own_host, *prev = (const uint64_t *)s->prev_host,
                            *next = (const uint64_t *)s->next_host;
    for (unsigned b = 0; b < s->blocks; b++) {
      const uint64_t ready = own[b], ack = own[FC_MAX_BLOCKS + b];
      if (!ready && !ack) continue;
      /* Ours: the previous rank raises ready (what it pushed), the next rank ack (what it took);
       * we raise the next rank's ready and the previous rank's ack. */
      FC_WARN("rank %d: %s lane (kernels) at the timeout, block %u: ready %llu, ack %llu; the next rank's ready "
              "%llu, the previous rank's ack %llu",
              rank, s->name, b, (unsigned long long)ready, (unsigned long long)ack,
              next ? (unsigned long long)next[b] : 0ull, prev ? (unsigned long long)prev[FC_MAX_BLOCKS + b] : 0ull);
    }
  }
}

/* Whether every rank says ok (collective). */
static flexcoll_result_t everyone(struct flexcoll_comm *comm, int ok, int *all_ok) {
  int first_not = -1;
  flexcoll_result_t res = fc_bootstrap_agree(comm->bootstrap, ok, &first_not);
  *all_ok = first_not < 0;
  return res;
}

/* ---- calibration --------------------------------------------------------------------------- */

/* Microseconds of one ring allgather of `bytes` per rank on lane L alone (0: NVLink, k + 1: side
 * lane k; the fastest of a few, after a warm-up), or a negative number when a launch failed.  Every
 * rank runs the same kernels in the same order and waits for each before the next.  Timed by the
 * host around the launch and cudaStreamSynchronize, not by events: an event recorded behind the
 * kernel is work queued behind it, and where ranks of one process share a GPU's hardware queue
 * (CUDA_DEVICE_MAX_CONNECTIONS=1, or more streams than queues) it held back the peer's kernel
 * that this one was waiting for, so creation hung until every kernel timed out.  The host's
 * launch and wake-up add a few microseconds to alpha, the same on every lane. */
static double time_lane(struct flexcoll_comm *comm, struct fc_gpu *g, int L, size_t bytes, char *buf) {
  fc_ring_args_t a;
  fc_gpu_ring_args(comm, g, &a);
  for (int k = 0; k < FC_RING_SIDE_LANES; k++) a.side[k].chunk_bytes = k + 1 == L ? bytes : 0;
  double best = -1;
  for (int rep = 0; rep < 4; rep++) {
    if (L) fc_pcie_ce_kick(&g->pcie.side[L - 1]); /* as run_ring does: a dozing proxy would add its sleep */
    const double t0 = fc_now_us();
    int e = fc_kernel_ring_collective(&a, FC_RING_ALLGATHER, buf + (size_t)comm->rank * bytes, buf, bytes, FLEXCOLL_UINT8,
                                      FLEXCOLL_SUM, 0, g->util_stream);
    if (e || cudaStreamSynchronize(g->util_stream) != cudaSuccess) {
      best = -1;
      break;
    }
    const double us = fc_now_us() - t0;
    if (rep > 0 && (best < 0 || us < best)) best = us;
  }
  cudaGetLastError();
  return best;
}

/* The lanes' models from two sizes (bytes pushed per rank against time, fc_cost_from_two): every
 * lane that can carry bytes (not NVLink where there is no NVLink lane); 0 when a timing failed.
 * The buffer is the staging allocation's point-to-point area (idle during creation):
 * cudaMalloc and cudaFree may wait for the whole device, where other communicators' kernels
 * (TP and DP groups being created at the same time) may wait for this very thread. */
static int calibrate(struct flexcoll_comm *comm, struct fc_gpu *g, fc_link_model_t *m) {
  size_t room = g->p2p_region; /* per rank */
  size_t big = room < ((size_t)4 << 20) ? room / 16 * 16 : (size_t)4 << 20;
  const size_t sizes[2] = {big / 16, big};
  char *buf = g->stage + g->p2p_off;
  if (sizes[0] < 16) return 0;
  /* Every rank times every lane and size whatever its own results: the timings are ring kernels
   * of all ranks together, and a rank that stopped after its first failed fit (two ranks
   * time-slicing one GPU can time the larger size faster) left its peers' next kernel waiting
   * for it.  The ranks agree on the outcome afterwards (seed_models). */
  int ok = 1;
  const fc_pcie_t *p = &g->pcie;
  for (int lane = 0; lane <= p->nside; lane++) {
    m[lane] = (fc_link_model_t){.alpha_us = 0, .beta = 0, .min_bytes = lane ? FC_PCIE_MIN_SHARE : 0, .port = -1};
    if (!lane && p->only) continue; /* beta 0: the balancer gives it nothing */
    double x[2], y[2];
    int measured = 1;
    for (int k = 0; k < 2; k++) {
      x[k] = (double)sizes[k] * (comm->nranks - 1);
      y[k] = time_lane(comm, g, lane, sizes[k], buf);
      measured &= y[k] > 0;
    }
    ok &= measured && fc_cost_from_two(&m[lane], x[0], y[0], x[1], y[1]) == FLEXCOLL_SUCCESS;
  }
  cudaGetLastError();
  return ok;
}

/* The cache key, ring-n<ranks>-<hash>-<lane>-<lane>...: a hash of the lanes' shape and every
 * rank's host and GPU (connect_peers gathered them), then the lanes' names (flexcoll-info lists
 * the cached models by them, as the host links'). */
static void cache_key(const struct flexcoll_comm *comm, const struct fc_gpu *g, char *key, size_t len) {
  const fc_pcie_t *p = &g->pcie;
  char shape[512];
  size_t at = (size_t)snprintf(shape, sizeof shape, "blocks %u subslots %u area %zu where %016llx", g->ring_blocks,
                               g->ring_subslots, g->ring_bytes, (unsigned long long)g->where_hash);
  for (int k = 0; k < p->nside && at < sizeof shape; k++)
    at += (size_t)snprintf(shape + at, sizeof shape - at, "; %s blocks %u area %zu", p->side[k].name,
                           p->side[k].blocks, p->side[k].area_bytes);
  const uint64_t h = fc_hash_bytes(FC_HASH_INIT, shape, strlen(shape));
  at = (size_t)snprintf(key, len, "ring-n%d-%016llx-%s", comm->nranks, (unsigned long long)h,
                        p->only ? "nvlink.none" : "nvlink");
  for (int k = 0; k < p->nside && at < len; k++)
    at += (size_t)snprintf(key + at, len - at, "-%s%s", p->side[k].name, p->side[k].ce && !p->side[k].link ? ".ce" : "");
}

/* What the GPU's own PCIe link carries per direction, MB/s, from its negotiated speed and width
 * (sysfs); 0 when unknown.  Every byte of a side lane crosses it, host staging's and a NIC's
 * alike, so the side lanes share it in the model. */
static double gpu_port_beta(int device) {
  char bus[32], path[160], text[64];
  if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  for (char *c = bus; *c; c++) *c = (char)(*c >= 'A' && *c <= 'F' ? *c - 'A' + 'a' : *c);
  double gts = 0, width = 0;
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/%s", bus, k ? "current_link_width" : "current_link_speed");
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const int got = fgets(text, sizeof text, f) != NULL;
    fclose(f);
    if (!got) return 0;
    *(k ? &width : &gts) = strtod(text, NULL);
  }
  if (!(gts > 0 && width > 0)) return 0;
  /* 8b/10b up to 5 GT/s (PCIe 1 and 2), 128b/130b from 8 GT/s. */
  const double coding = gts <= 5 ? 0.8 : 128.0 / 130.0;
  return gts * 1e3 * width * coding / 8;
}

/* The side lanes share the GPU's PCIe port (kept out of the cache: the topology's, like port). */
static void set_ports(struct fc_gpu *g) {
  fc_pcie_t *p = &g->pcie;
  const double port_beta = p->nside > 1 ? gpu_port_beta(g->device) : 0;
  p->model[0].port = -1;
  for (int k = 0; k < p->nside; k++) {
    p->model[k + 1].port = p->nside > 1 ? 0 : -1;
    p->model[k + 1].port_beta = port_beta;
  }
}

/* The lanes' models: from the cache when every rank has them, else calibrated; then rank 0's
 * everywhere (every rank must split alike). */
static flexcoll_result_t seed_models(struct flexcoll_comm *comm, struct fc_gpu *g) {
  fc_pcie_t *p = &g->pcie;
  const int n = 1 + p->nside;
  const double t0 = fc_now_ms();
  char key[512];
  cache_key(comm, g, key, sizeof key);
  const char *dir = fc_cost_cache_dir();
  int have = dir && fc_cost_cache_load(dir, key, p->model, n) == FLEXCOLL_SUCCESS, all_have = 0;
  FC_CHECK(everyone(comm, have, &all_have));
  int fresh = 0;
  if (!all_have) {
    /* A timing can fail (a kernel launch refused): the ranks agree on each attempt, so they
     * measure again together. */
    int all_fresh = 0;
    for (int attempt = 0; attempt < 3 && !all_fresh; attempt++) {
      fresh = calibrate(comm, g, p->model);
      FC_CHECK(everyone(comm, fresh, &all_fresh));
    }
    fresh = all_fresh;
    if (!all_fresh) {
      for (int k = 0; k < p->nside; k++) {
        FC_INFO(FC_SUB_SCHED, "rank %d: ring lane %s off: its calibration failed on some rank", comm->rank,
                p->side[k].name);
        p->side[k].on = 0;
      }
      return FLEXCOLL_SUCCESS;
    }
  }
  /* Rank 0's models, bit for bit, on every rank (its GPU's port too: ranks may sit on GPUs
   * whose links were trained differently). */
  set_ports(g);
  fc_link_model_t *all = calloc((size_t)comm->nranks * n, sizeof *all);
  if (!all) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  memcpy(&all[(size_t)n * comm->rank], p->model, (size_t)n * sizeof *all);
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, all, (size_t)n * sizeof *all);
  if (res == FLEXCOLL_SUCCESS) memcpy(p->model, all, (size_t)n * sizeof *all);
  free(all);
  FC_CHECK(res);
  if (fresh && comm->rank == 0 && dir) fc_cost_cache_save(dir, key, p->model, n);
  char text[320];
  size_t at = 0;
  for (int L = 0; L < n && at < sizeof text; L++)
    at += (size_t)snprintf(text + at, sizeof text - at, "%s%s alpha %.1f us beta %.0f MB/s", L ? ", " : "",
                           L ? p->side[L - 1].name : "nvlink", p->model[L].alpha_us, p->model[L].beta);
  FC_INFO(FC_SUB_SCHED, "rank %d: ring lanes %s in %.1f ms: %s%s", comm->rank,
          all_have ? "from the cache" : "calibrated", fc_now_ms() - t0, text,
          p->nside > 1 ? " (the side lanes share the GPU's PCIe port)" : "");
  return FLEXCOLL_SUCCESS;
}

/* Rank 0's board (collective): rank 0 creates it, every rank maps it, then its name goes.  Where
 * that fails on some rank, stage 2 stays off on all (the split keeps its calibration; one INFO
 * line says why). */
static flexcoll_result_t open_board(struct flexcoll_comm *comm, fc_pcie_t *p) {
  const size_t bytes = FC_LANE_BOARD_ENTRIES * sizeof *p->board;
  char name[96], why[160] = "";
  const uint64_t h = fc_hash_bytes(FC_HASH_INIT, &comm->init_id, sizeof comm->init_id);
  snprintf(name, sizeof name, "/flexcoll-pcie-%016llx-board", (unsigned long long)h);
  int ok = 1, all_ok = 0;
  if (comm->rank == 0) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) { /* left by a process that died in a communicator of the same id */
      shm_unlink(name);
      fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    int e = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    void *m = e ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!e && m == MAP_FAILED) e = errno;
    if (fd >= 0) close(fd);
    if (e) {
      snprintf(why, sizeof why, "rank 0 cannot create %s: %s", name, strerror(e));
      if (fd >= 0) shm_unlink(name);
      ok = 0;
    } else {
      p->board = m;
    }
  }
  flexcoll_result_t res = everyone(comm, ok, &all_ok);
  if (res != FLEXCOLL_SUCCESS) all_ok = 0; /* the name goes below all the same */
  if (all_ok && comm->rank != 0) {
    const int fd = shm_open(name, O_RDWR, 0600);
    void *m = fd < 0 ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) snprintf(why, sizeof why, "rank %d cannot map %s: %s", comm->rank, name, strerror(errno));
    else p->board = m;
    if (fd >= 0) close(fd);
    ok = p->board != NULL;
  }
  if (all_ok) res = everyone(comm, ok, &all_ok);
  if (comm->rank == 0 && p->board) shm_unlink(name); /* mapped by every rank that could */
  if (res != FLEXCOLL_SUCCESS) {
    if (p->board) munmap(p->board, bytes);
    p->board = NULL;
    return res;
  }
  if (!all_ok) {
    if (p->board) munmap(p->board, bytes);
    p->board = NULL;
    FC_INFO(FC_SUB_SCHED, "rank %d: ring lanes: stage 2 off, the split stays as calibrated: %s", comm->rank,
            why[0] ? why : "another rank could not map the board");
    return FLEXCOLL_SUCCESS;
  }
  memcpy(p->next_model, p->model, sizeof p->next_model);
  p->adapt = 1;
  return FLEXCOLL_SUCCESS;
}

/* ---- open ---------------------------------------------------------------------------------- */

/* The host link that carries the second lane where FLEXCOLL_RING_LANE names one: its first rail,
 * on here and reaching both ring neighbours, taking device buffers; NULL and why otherwise. */
static fc_link_t *lane_link(const struct flexcoll_comm *comm, const char *name, int next, int prev, char *why,
                            size_t len) {
  fc_links_t *l = comm->links;
  for (int i = 0; l && i < l->n; i++) {
    fc_link_t *k = &l->link[i];
    if (strcmp(k->ops->name, name) || k->rail != 0) continue;
    if (k->off || (k->on && (!k->on[next] || !k->on[prev])) || !k->reach[next] || !k->reach[prev]) {
      snprintf(why, len, "link %s does not join rank %d to both its ring neighbours", name, comm->rank);
      return NULL;
    }
    if (!k->device_memory) {
      snprintf(why, len, "link %s takes host memory only (the lane moves device memory)", name);
      return NULL;
    }
    return k;
  }
  snprintf(why, len, "no %s link is open (FLEXCOLL_LINKS, or see the NET INFO lines)", name);
  return NULL;
}

/* A side lane's blocks: as asked, at least one, at most half the ring grid shared out among the
 * side lanes asked for (the NVLink lane keeps the rest). */
static unsigned lane_blocks(int64_t asked, unsigned ring_blocks, int lanes) {
  const unsigned b = asked < 1 ? 1u : (unsigned)asked, cap = ring_blocks / (2u * (unsigned)lanes);
  return b > cap ? cap : b;
}

/* Open side lane s over `name` (pcie: host memory; rdma: that link), one of `lanes` asked for
 * (collective).  s->on where every rank has it; else one INFO line says why and s is closed. */
static flexcoll_result_t open_side(struct flexcoll_comm *comm, struct fc_gpu *g, fc_side_lane_t *s, const char *name,
                                   int lanes) {
  const int next = g->ring_next, prev = g->ring_prev;
  char why[256] = "";
  const char *engine = fc_param_str("FLEXCOLL_PCIE_ENGINE", "sm");
  const int over_link = !strcmp(name, "rdma");
  s->name = over_link ? "rdma" : "pcie";
  int64_t area = fc_param_pcie_area_bytes(), blocks = fc_param_pcie_blocks();
  /* Through copy engines every message costs the proxies two copies and two stream writes to
   * enqueue, so the lane wants few blocks and large messages (docs/PERFORMANCE.md, session 15);
   * the kernel's own loads and stores want many blocks.  A link's messages cost a proxy's turn
   * each too. */
  if (!strcmp(engine, "ce") || over_link) {
    if (!fc_param_str("FLEXCOLL_PCIE_BLOCKS", NULL)) blocks = 4;
    if (!fc_param_str("FLEXCOLL_PCIE_AREA_BYTES", NULL)) area = 32 << 20;
  }
  /* The same on every rank whatever its engine or lane: ranks map each other's areas (over a link
   * only their counters and descriptors are used, and the host ring area stays for the kernel's
   * own engine should the link's proxy not start everywhere). */
  s->ctr_bytes = FC_PCIE_CTR_BYTES;
  s->area_bytes = (size_t)(area < (64 << 10) ? (64 << 10) : area) / 16 * 16;
  s->bytes = s->ctr_bytes + s->area_bytes;
  s->blocks = lane_blocks(blocks, g->ring_blocks, lanes);
  int want = 1;
  if (!fc_links_names(s->name)) snprintf(why, sizeof why, "FLEXCOLL_LINKS leaves it out"), want = 0;
  else if (!g->ring) snprintf(why, sizeof why, "the ring kernels are off (FLEXCOLL_RING_KERNEL=0)"), want = 0;
  /* The ring visits every rank, so some neighbours are on another host, where this host's
   * shared memory does not reach (on one machine under several FLEXCOLL_HOSTIDs the mapping
   * would still work and join "hosts" that must not share memory). */
  else if (comm->links && comm->links->nhosts > 1 && !over_link)
    snprintf(why, sizeof why, "the ranks are on %d hosts (the ring areas are shared memory of one host)",
             comm->links->nhosts), want = 0;
  else if (s->blocks < 1) snprintf(why, sizeof why, "ring grids of %u blocks leave none for it", g->ring_blocks), want = 0;
  /* Every rank decides alike on the above (communicator constants); whether the link is there
   * toward both neighbours, and the mappings, may differ between ranks, so they are agreed on. */
  if (want && over_link) {
    s->link = lane_link(comm, s->name, next, prev, why, sizeof why);
    FC_CHECK(everyone(comm, s->link != NULL, &want));
    if (!want && !why[0]) snprintf(why, sizeof why, "another rank has no rdma link toward its ring neighbours");
  }
  if (!want) {
    FC_INFO(FC_SUB_SCHED, "rank %d: ring lane %s off: %s", comm->rank, s->name, why);
    close_side(s);
    return FLEXCOLL_SUCCESS;
  }
  /* Over a link between hosts no rank maps another's area: the lane's descriptors and
   * acknowledgements go over the link too (in band), and the kernel's pointers to its
   * neighbours' counters point into our own area (pc_ctr_next is not written on a proxy's lane;
   * pc_ctr_prev's ack half is the stand-in the proxy forwards).  FLEXCOLL_RING_LANE_INBAND=1
   * does so within one host too. */
  s->inband = over_link && ((comm->links && comm->links->nhosts > 1) || fc_param_ring_lane_inband() != 0);
  map_area(comm, s, comm->rank, 1, &s->own_host, &s->own, why, sizeof why);
  int ok = s->own_host != NULL, all_ok = 0;
  FC_CHECK(everyone(comm, ok, &all_ok));
  if (!all_ok && !why[0]) snprintf(why, sizeof why, "another rank could not create its host area");
  if (all_ok && !s->inband) {
    map_area(comm, s, next, 0, &s->next_host, &s->next, why, sizeof why);
    if (s->next_host && prev != next) map_area(comm, s, prev, 0, &s->prev_host, &s->prev, why, sizeof why);
    else s->prev_host = s->next_host, s->prev = s->next;
    ok = s->next_host && s->prev_host;
    /* Everyone has mapped what it needs of ours (or failed): the name can go (below). */
    const flexcoll_result_t res = everyone(comm, ok, &all_ok);
    if (res != FLEXCOLL_SUCCESS) {
      unlink_own_area(comm, s);
      return res;
    }
    /* Ranks of one host that cannot map each other's shared memory (containers with a /dev/shm
     * each, say) still have the link: over it the lane goes in band (agreed: all_ok is). */
    if (!all_ok && over_link) {
      FC_INFO(FC_SUB_SCHED, "rank %d: ring lane %s in band: %s", comm->rank, s->name,
              why[0] ? why : "another rank could not map its ring neighbours' host areas");
      if (s->prev_host == s->next_host) s->prev_host = NULL;
      unmap_area(s, &s->next_host);
      unmap_area(s, &s->prev_host);
      s->inband = all_ok = 1;
    }
  }
  if (all_ok && s->inband) {
    s->next = s->own;
    s->prev = s->own + FC_PCIE_PREV_OFF;
  }
  if (s->own_host) unlink_own_area(comm, s); /* mapped by whoever needs it, or given up */
  if (!all_ok) {
    close_side(s);
    FC_INFO(FC_SUB_SCHED, "rank %d: ring lane %s off: %s", comm->rank, s->name,
            why[0] ? why : "another rank could not map its areas");
    return FLEXCOLL_SUCCESS;
  }
  s->on = 1;
  /* The proxy's mover (copy engines, or the link) where asked for and started on every rank;
   * else every rank's kernel moves the bytes itself, through the host areas. */
  if (!strcmp(engine, "ce") || s->link) {
    why[0] = 0;
    /* With one hardware queue the proxy's copies and counter writes were held back behind the
     * spinning ring kernels (the node, session 17: the first call stopped for good); the default
     * queues and 32 worked, 2 to 7 are not measured. */
    const char *queues = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (queues && atoi(queues) < 8)
      snprintf(why, sizeof why, "CUDA_DEVICE_MAX_CONNECTIONS=%s (copy engines need at least 8 hardware queues)", queues);
    else FC_CHECK(fc_pcie_ce_start(comm, g, s, why, sizeof why));
    int all_ce = 0;
    FC_CHECK(everyone(comm, s->proxy != NULL, &all_ce));
    if (!all_ce && s->link) {
      /* The lane was asked of the link: without its proxy on every rank it is off (the kernel's
       * own engine would make it the pcie lane, which FLEXCOLL_RING_LANE did not choose). */
      FC_INFO(FC_SUB_SCHED, "rank %d: ring lane %s off: %s", comm->rank, s->name,
              why[0] ? why : "another rank could not start its proxy");
      close_side(s);
      return FLEXCOLL_SUCCESS;
    }
    if (!all_ce) {
      fc_pcie_ce_stop(s); /* not a link's lane (above): a ring by hops never gets here */
      /* Every rank falls back alike (agreed above): the kernel's own default block count. */
      if (!fc_param_str("FLEXCOLL_PCIE_BLOCKS", NULL)) s->blocks = lane_blocks(fc_param_pcie_blocks(), g->ring_blocks, lanes);
      FC_INFO(FC_SUB_SCHED, "rank %d: ring lane pcie: copy engines off, the ring kernel moves its bytes: %s", comm->rank,
              why[0] ? why : "another rank could not start its proxy");
    }
    s->ce = all_ce;
  }
  return FLEXCOLL_SUCCESS;
}

/* Whether the ring kernels may run by hops (collective, the same answer on every rank): ranks on
 * several hosts (where the pcie lane never opens, so the rdma lane is the one side lane),
 * FLEXCOLL_RING_HOPS, the rdma lane asked, nvlink among FLEXCOLL_LINKS, and on every rank peer
 * access to each ring neighbour on its own host (why says what is missing here, for the INFO line). */
static flexcoll_result_t hops_possible(struct flexcoll_comm *comm, struct fc_gpu *g, const char *const *asked,
                                       int lanes, int *possible, char *why, size_t wlen) {
  const fc_links_t *l = comm->links;
  int rdma = 0;
  for (int i = 0; i < lanes; i++) rdma |= !strcmp(asked[i], "rdma");
  *possible = 0;
  if (!l || l->nhosts < 2 || !rdma || !g->ring) return FLEXCOLL_SUCCESS;
  if (!fc_param_ring_hops()) {
    snprintf(why, wlen, "FLEXCOLL_RING_HOPS=0");
    return FLEXCOLL_SUCCESS;
  }
  if (!fc_links_names("nvlink")) {
    snprintf(why, wlen, "FLEXCOLL_LINKS leaves nvlink out");
    return FLEXCOLL_SUCCESS;
  }
  int ok = 1;
  const int me = l->host[comm->rank];
  if (l->host[g->ring_next] == me && !g->peers[g->ring_next].stage) ok = 0;
  if (l->host[g->ring_prev] == me && !g->peers[g->ring_prev].stage) ok = 0;
  if (!ok) snprintf(why, wlen, "no peer access to a ring neighbour on this host");
  FC_CHECK(everyone(comm, ok, possible));
  if (ok && !*possible) snprintf(why, wlen, "another rank has no peer access to a ring neighbour on its host");
  return FLEXCOLL_SUCCESS;
}

/* A ring by hops: each edge on NVLink within our host, on the link's lane (side lane 0) to
 * another host. */
static void set_hops(const struct flexcoll_comm *comm, struct fc_gpu *g) {
  fc_pcie_t *p = &g->pcie;
  const int *host = comm->links->host, me = host[comm->rank];
  p->hops = 1;
  p->hop_in = host[g->ring_prev] == me ? 0 : 1;
  p->hop_out = host[g->ring_next] == me ? 0 : 1;
  p->stage2_bytes = 0; /* nothing to balance: each edge has one lane */
  FC_INFO(FC_SUB_SCHED,
          "rank %d: ring kernels by hops, host by host: from rank %d over %s, to rank %d over %s (%u blocks, whole parts)",
          comm->rank, g->ring_prev, p->hop_in ? p->side[0].name : "nvlink", g->ring_next,
          p->hop_out ? p->side[0].name : "nvlink", p->side[0].blocks);
}

flexcoll_result_t fc_pcie_open(struct flexcoll_comm *comm, struct fc_gpu *g) {
  fc_pcie_t *p = &g->pcie;
  memset(p, 0, sizeof *p);
  for (int k = 0; k < FC_RING_SIDE_LANES; k++) p->side[k].index = k;
  /* The NVLink lane's calls are timed for the statistics even where no side lane is on. */
  const int64_t s2 = fc_param_lane_stage2_bytes();
  p->stage2_bytes = s2 > 0 ? (size_t)s2 : 0;
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_PCIE_ENGINE")); /* sm or ce */
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_PCIE_CE_READY"));
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_RING_LANE")); /* pcie, rdma, or both */
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_RING_LANE_INBAND"));
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_RING_HOPS"));
  /* One side lane per name, in the list's order (the check above allows each name once); a lane
   * that does not open leaves its place to the next. */
  char names[64];
  snprintf(names, sizeof names, "%s", fc_param_str("FLEXCOLL_RING_LANE", "pcie"));
  const char *asked[FC_RING_SIDE_LANES];
  int lanes = 0;
  for (char *save = NULL, *tok = strtok_r(names, ", ", &save); tok && lanes < FC_RING_SIDE_LANES;
       tok = strtok_r(NULL, ", ", &save))
    asked[lanes++] = tok;
  int hops = 0;
  char hops_why[160] = "";
  FC_CHECK(hops_possible(comm, g, asked, lanes, &hops, hops_why, sizeof hops_why));
  for (int i = 0; i < lanes; i++) {
    fc_side_lane_t *s = &p->side[p->nside];
    FC_CHECK(open_side(comm, g, s, asked[i], lanes));
    if (s->on) {
      p->nside++;
    } else {
      const int index = s->index;
      memset(s, 0, sizeof *s);
      s->index = index;
    }
  }
  if (!p->nside) {
    fc_pcie_close(g);
    return FLEXCOLL_SUCCESS;
  }
  /* Without peer access (or without nvlink by choice, which leaves the peers unmapped) the
   * NVLink lane has nowhere to write: the ring kernels run on the side lanes alone. */
  p->only = !g->p2p;
  if (hops) set_hops(comm, g); /* the one lane on, the link's (hops_possible), is on everywhere */
  else if (hops_why[0] && p->side[0].link)
    FC_INFO(FC_SUB_SCHED, "rank %d: ring kernels not by hops (every hop over %s): %s", comm->rank, p->side[0].name,
            hops_why);
  fixed_fractions(p);
  const int balanced = !p->hops && p->fixed[0] < 0 && !(p->only && p->nside == 1);
  if (balanced) FC_CHECK(seed_models(comm, g));
  /* seed_models may have turned the lanes off (a failed calibration). */
  if (!p->side[0].on) {
    fc_pcie_close(g);
    return FLEXCOLL_SUCCESS;
  }
  if (balanced && p->stage2_bytes > 0) FC_CHECK(open_board(comm, p));
  for (int k = 0; k < p->nside; k++) {
    const fc_side_lane_t *s = &p->side[k];
    FC_INFO(FC_SUB_SCHED, "rank %d: ring lane %s on: %zu KiB ring area per rank, up to %u blocks, %s, %s", comm->rank,
            s->name, s->area_bytes >> 10, s->blocks,
            s->inband ? "each message, descriptor and acknowledgement one of the link's (in band)"
            : s->link ? "each message one of the link's, sent and received by a proxy thread"
            : s->ce   ? "copy engines"
                      : "the kernel's loads and stores",
            p->hops                  ? "the edges between hosts (by hops)"
            : p->only && p->nside == 1 ? "every ring call through it (no peer access)"
            : p->fixed[0] >= 0       ? "fixed share"
                                     : "balanced share");
  }
  return FLEXCOLL_SUCCESS;
}

void fc_pcie_split(const struct fc_gpu *g, size_t chunk, unsigned msgs, size_t *side) {
  const fc_pcie_t *p = &g->pcie;
  for (int k = p->hops ? 0 : p->nside; k < FC_RING_SIDE_LANES; k++) side[k] = 0; /* lanes that are not on */
  if (p->hops) return; /* each edge's lane carries its whole part (fc_ring_args_t.hops) */
  fc_lanes_split(p->model, p->probe, p->fixed[0] >= 0 ? p->fixed : NULL, !p->only, p->nside, chunk, msgs, side);
}

/* ---- stage 2 ------------------------------------------------------------------------------- */

/* The records of timed calls whose kernels have finished, in call order, into the measurements;
 * stops at the first one not yet published.  A record is read between two loads of its call
 * number: a kernel that overwrote it meanwhile (the host fell FC_LANE_RECORDS calls behind) makes
 * the two differ, and that call is skipped, as is one already overwritten. */
static void take_records(fc_pcie_t *p, const struct fc_gpu *g) {
  while (p->seen < p->issued) {
    const unsigned long long want = p->seen + 1;
    const fc_lane_record_t *r = &g->lane_rec[want % FC_LANE_RECORDS];
    const unsigned long long c = __atomic_load_n(&r->call, __ATOMIC_ACQUIRE);
    if (c < want) return; /* still running (or queued) */
    p->seen = want;
    if (c != want) continue; /* overwritten by a later call */
    unsigned long long ns[FC_RING_LANES], bytes[FC_RING_LANES], total = 0;
    for (int L = 0; L < FC_RING_LANES; L++) {
      ns[L] = __atomic_load_n(&r->ns[L], __ATOMIC_RELAXED);
      bytes[L] = __atomic_load_n(&r->bytes[L], __ATOMIC_RELAXED);
      total += bytes[L];
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->call, __ATOMIC_RELAXED) != want) continue;
    if (total) /* the last large call that finished */
      for (int L = 0; L < FC_RING_LANES; L++) p->share[L] = (double)bytes[L] / (double)total;
    for (int L = 0; L < FC_RING_LANES; L++) {
      if (!ns[L] || !bytes[L]) continue;
      const double us = (double)ns[L] / 1e3;
      p->busy_us[L] += us;
      if (!p->adapt) continue;
      p->meas_parts[L] += 1;
      p->meas_bytes[L] += (double)bytes[L];
      p->meas_us[L] += p->throttle[L] > 0 ? us * p->throttle[L] : us;
    }
  }
}

int fc_pcie_before_ring(struct fc_gpu *g, size_t bytes, size_t chunk, int pushes, int capturing, fc_ring_args_t *a) {
  fc_pcie_t *p = &g->pcie;
  take_records(p, g);
  const int large = p->stage2_bytes && bytes >= p->stage2_bytes;
  if (!large || capturing || !g->lane_clk) return large;
  /* A chain's last rank pushes nothing but still moves each chunk once (it receives it). */
  const unsigned long long msgs = pushes > 0 ? (unsigned long long)pushes : 1;
  size_t start[FC_RING_LANES], end[FC_RING_LANES];
  fc_ring_lane_cut(a, chunk, start, end);
  a->clk = g->lane_clk;
  a->rec = g->lane_rec_dev;
  a->call = ++p->issued;
  for (int L = 0; L < FC_RING_LANES; L++) a->lane_bytes[L] = msgs * (end[L] - start[L]);
  return large;
}

/* Rank 0: fold its measurements since its last update into next_model (lib/sched's stage-2 rule)
 * and post the result as update m. */
static void post_update(fc_pcie_t *p, uint64_t m) {
  static const double floor[FC_RING_LANES] = {0, FC_PCIE_MIN_SHARE, FC_PCIE_MIN_SHARE};
  fc_stage2_update(p->next_model, p->next_idle, p->next_probe, p->next_hist, floor, 1 + p->nside, p->meas_parts,
                   p->meas_bytes, p->meas_us);
  fc_lane_board_entry_t *e = &p->board[m % FC_LANE_BOARD_ENTRIES];
  __atomic_store_n(&e->m, 0, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  memcpy(e->model, p->next_model, sizeof e->model);
  for (int L = 0; L < FC_RING_LANES; L++) {
    e->probe[L] = p->next_probe[L];
    e->parts[L] = p->meas_parts[L];
    e->us[L] = p->meas_us[L];
    p->meas_parts[L] = p->meas_bytes[L] = p->meas_us[L] = 0;
  }
  __atomic_store_n(&e->m, m, __ATOMIC_RELEASE);
}

/* Put update m in force, as every rank does at the same large call.  Rank 0 posted it
 * FC_LANE_STAGE2_LAG large calls earlier in its own call sequence, so only a rank whose host
 * runs that far ahead of rank 0's waits here, bounded by the timeout and abort. */
static flexcoll_result_t install_update(struct flexcoll_comm *comm, fc_pcie_t *p, uint64_t m, fc_lane_board_entry_t *out) {
  const fc_lane_board_entry_t *e = &p->board[m % FC_LANE_BOARD_ENTRIES];
  fc_lane_board_entry_t got;
  const double t0 = fc_now_ms();
  for (unsigned spins = 0;; spins++) {
    const uint64_t v = __atomic_load_n(&e->m, __ATOMIC_ACQUIRE);
    if (v == m) {
      memcpy(&got, e, sizeof got);
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (__atomic_load_n(&e->m, __ATOMIC_RELAXED) == m) break;
      continue;
    }
    if (v > m)
      return fc_error(comm, FLEXCOLL_INTERNAL_ERROR,
                      "ring lanes stage 2: rank 0 rewrote update %llu before rank %d took it (rank 0's host ran %d "
                      "updates ahead)",
                      (unsigned long long)m, comm->rank, FC_LANE_BOARD_ENTRIES);
    if (atomic_load(&comm->abort_flag))
      return fc_error(comm, FLEXCOLL_REMOTE_ERROR, "ring lanes stage 2: aborted while waiting for rank 0's update");
    const double ms = fc_now_ms() - t0;
    if (comm->timeout_ms > 0 && ms > comm->timeout_ms)
      return fc_error(comm, FLEXCOLL_TIMEOUT,
                      "ring lanes stage 2: rank 0 has not posted update %llu after %.0f ms (its host is behind, or gone)",
                      (unsigned long long)m, ms);
    /* Ranks may outnumber cores: let rank 0's thread run. */
    if (spins > 64) sched_yield();
  }
  memcpy(p->model, got.model, sizeof p->model);
  for (int L = 0; L < FC_RING_LANES; L++) p->probe[L] = got.probe[L];
  if (comm->rank != 0) /* only rank 0's measurements move the models */
    for (int L = 0; L < FC_RING_LANES; L++) p->meas_parts[L] = p->meas_bytes[L] = p->meas_us[L] = 0;
  *out = got;
  return FLEXCOLL_SUCCESS;
}

static double wall_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

flexcoll_result_t fc_pcie_after_ring(struct flexcoll_comm *comm, struct fc_gpu *g, int large) {
  fc_pcie_t *p = &g->pcie;
  if (!large || !p->adapt) return FLEXCOLL_SUCCESS;
  const unsigned c = ++p->large_calls;
  if (comm->rank == 0 && c % FC_STAGE2_EVERY == 0) post_update(p, c / FC_STAGE2_EVERY);
  if (c <= FC_LANE_STAGE2_LAG || (c - FC_LANE_STAGE2_LAG) % FC_STAGE2_EVERY) return FLEXCOLL_SUCCESS;
  const uint64_t m = (c - FC_LANE_STAGE2_LAG) / FC_STAGE2_EVERY;
  fc_lane_board_entry_t e = {0};
  FC_CHECK(install_update(comm, p, m, &e));
  const size_t ref = 64u << 20; /* an allgather's chunk to show the split at */
  size_t side[FC_RING_SIDE_LANES];
  fc_pcie_split(g, ref, (unsigned)comm->nranks - 1, side);
  char text[384];
  size_t at = 0;
  for (int L = 0; L <= p->nside && at < sizeof text; L++)
    at += (size_t)snprintf(text + at, sizeof text - at, "%s%s %.0f calls %.1f us, model %.1f us + %.0f MB/s%s%s",
                           L ? "; " : "", L ? p->side[L - 1].name : "nvlink", e.parts[L],
                           e.parts[L] > 0 ? e.us[L] / e.parts[L] : 0.0, p->model[L].alpha_us, p->model[L].beta,
                           p->probe[L] ? " (a probe)" : "",
                           L ? "" : " (rank 0's timed calls, the model)");
  at = 0;
  char split[128] = "";
  for (int k = 0; k < p->nside && at < sizeof split; k++)
    at += (size_t)snprintf(split + at, sizeof split - at, " %s %.4f", p->side[k].name, (double)side[k] / (double)ref);
  FC_INFO(FC_SUB_SCHED, "rank %d: ring lanes stage 2: update %llu in force from large call %u (wall %.3f s): %s; "
          "shares of a 64 MiB chunk:%s",
          comm->rank, (unsigned long long)m, c + 1, wall_s(), text, split);
  return FLEXCOLL_SUCCESS;
}

void fc_gpu_lanes_set_throttle(struct flexcoll_comm *comm, const char *name, double factor) {
  struct fc_gpu *g = comm->gpu;
  if (!g) return;
  if (!strcmp(name, "nvlink")) g->pcie.throttle[0] = factor;
  for (int k = 0; k < g->pcie.nside; k++)
    if (!strcmp(name, g->pcie.side[k].name)) g->pcie.throttle[k + 1] = factor;
}

_Static_assert(FC_GPU_LANES == FC_RING_LANES, "gpu.h's lane count is the ring kernels'");

int fc_gpu_lanes_state(struct flexcoll_comm *comm, size_t chunk, fc_gpu_lane_state_t *lanes) {
  const struct fc_gpu *g = comm->gpu;
  if (!g || !g->pcie.adapt) return 0;
  size_t side[FC_RING_SIDE_LANES], left = chunk;
  fc_pcie_split(g, chunk, 2 * ((unsigned)comm->nranks - 1), side);
  const int n = 1 + g->pcie.nside;
  for (int L = n - 1; L >= 0; L--) {
    fc_gpu_lane_state_t *x = &lanes[L];
    snprintf(x->name, sizeof x->name, "%s", L ? g->pcie.side[L - 1].name : "nvlink");
    x->beta = g->pcie.model[L].beta;
    x->part = L ? side[L - 1] : left;
    left -= x->part;
  }
  return n;
}

int fc_gpu_link_stats(struct flexcoll_comm *comm, flexcoll_link_stats_t *stats, int max) {
  struct fc_gpu *g = comm->gpu;
  if (!g || comm->nranks < 2) return 0;
  take_records(&g->pcie, g); /* busy_us up to the last timed call that has finished */
  /* The lanes this communicator has: nvlink with peer access, the side lanes (pcie, or the link
   * that carries one) that are on. */
  const fc_pcie_t *p = &g->pcie;
  int k = 0; /* lanes counted; those that fit in max written (as the host links are) */
  for (int L = 0; L < FC_RING_LANES; L++) {
    /* By hops, the lane of our edge to the next rank only. */
    const int has = p->hops ? L == p->hop_out : L ? g->ring && L <= p->nside : g->p2p;
    if (!has || k++ >= max) continue;
    flexcoll_link_stats_t *s = &stats[k - 1];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", L ? p->side[L - 1].name : "nvlink");
    s->peer = g->ring_next;
    s->bytes = p->sent[L];
    s->busy_us = p->busy_us[L];
    s->share = p->share[L];
  }
  return k;
}
#endif
