/* ce_streams_probe.cu — does the order in which streams are created decide how fast staged copies run?
 *
 * The pcie lane's copy-engine mover (lib/gpu/pcie_ce.c) gives every rank two streams, one copying
 * device -> pinned host, one host -> device; with two ranks on one GPU the four streams carry two
 * flows at once (rank 0's out feeds rank 1's in, and back).  Its speed came out bimodal across
 * process runs (docs/PERFORMANCE.md, session 15 and 17), as if fixed by something decided at set-up.
 * This probe creates the four streams in a given order, after a given number of other streams
 * (the driver assigns streams to hardware channels in creation order), then times the two flows
 * (4 MiB copies, an event between the hops, 8 host slots per flow) and prints GB/s delivered.
 *
 *   ORDER: the creation order of the four streams, letters d (a device -> host stream) and h
 *          (host -> device), e.g. dhdh (one rank after the other, the mover's order when ranks
 *          start one by one) or ddhh (the two ranks' out streams first); default dhdh
 *   SKIP:  streams created (and kept) before them; default 0
 *   THREADS=1: instead, two threads create one rank's pair each, at once (the mover's case)
 *   HOST:  where the host slots live: alloc (cudaHostAlloc, the default), shm (POSIX shared memory
 *          mapped and registered with cudaHostRegister, as the pcie lane's host areas are), or
 *          shmhuge (the same, the mapping advised MADV_HUGEPAGE before it is touched)
 *
 * Not built by make (a development probe for docs/PERFORMANCE.md):
 *   nvcc -O2 -arch=sm_90 -o ce_streams_probe tools/ce_streams_probe.cu
 *   for o in dhdh ddhh; do for s in 0 1 2 3; do ORDER=$o SKIP=$s ./ce_streams_probe; done; done
 */
#include <cuda_runtime.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "probe_check.h"

enum { FLOWS = 2, SLOTS = 8 };
static const size_t total = 256u << 20, slice = 4u << 20;
static cudaStream_t d2h[FLOWS], h2d[FLOWS];

/* Host slots as the pcie lane makes its host areas (lib/gpu/pcie.c), or from cudaHostAlloc. */
static char *host_slots(const char *how, size_t bytes, int f) {
  void *m = NULL;
  if (!strcmp(how, "alloc")) {
    CK(cudaHostAlloc(&m, bytes, cudaHostAllocDefault));
    return (char *)m;
  }
  char name[64];
  snprintf(name, sizeof name, "/ce_streams_probe.%d.%d", (int)getpid(), f);
  const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)bytes)) { perror("shm_open/ftruncate"); exit(1); }
  m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  shm_unlink(name);
  if (m == MAP_FAILED) { perror("mmap"); exit(1); }
  if (!strcmp(how, "shmhuge") && madvise(m, bytes, MADV_HUGEPAGE)) perror("madvise(MADV_HUGEPAGE)");
  memset(m, 0, bytes);
  CK(cudaHostRegister(m, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  return (char *)m;
}

static void *make_pair(void *arg) {
  const int r = (int)(size_t)arg;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&d2h[r], cudaStreamNonBlocking));      /* rank r's out: flow r */
  CK(cudaStreamCreateWithFlags(&h2d[1 - r], cudaStreamNonBlocking));  /* rank r's in: the other flow */
  return NULL;
}

int main() {
  const char *order = getenv("ORDER") ? getenv("ORDER") : "dhdh";
  const int skip = getenv("SKIP") ? atoi(getenv("SKIP")) : 0;
  const int threads = getenv("THREADS") && atoi(getenv("THREADS"));
  const char *how = getenv("HOST") ? getenv("HOST") : "alloc";
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  for (int i = 0; i < skip; i++) {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  if (threads) {
    pthread_t t[FLOWS];
    for (int r = 0; r < FLOWS; r++) pthread_create(&t[r], NULL, make_pair, (void *)(size_t)r);
    for (int r = 0; r < FLOWS; r++) pthread_join(t[r], NULL);
  } else {
    int nd = 0, nh = 0;
    for (const char *c = order; *c; c++) {
      if (*c == 'd' && nd < FLOWS) CK(cudaStreamCreateWithFlags(&d2h[nd++], cudaStreamNonBlocking));
      if (*c == 'h' && nh < FLOWS) CK(cudaStreamCreateWithFlags(&h2d[nh++], cudaStreamNonBlocking));
    }
    if (nd != FLOWS || nh != FLOWS) { printf("ORDER needs two d and two h\n"); return 2; }
  }
  char *src[FLOWS], *dst[FLOWS], *host[FLOWS];
  for (int f = 0; f < FLOWS; f++) {
    CK(cudaMalloc(&src[f], total));
    CK(cudaMalloc(&dst[f], total));
    host[f] = host_slots(how, SLOTS * slice, f);
  }
  const int n = (int)(total / slice);
  cudaEvent_t staged[FLOWS][SLOTS], landed[FLOWS][SLOTS], t0, t1;
  for (int f = 0; f < FLOWS; f++)
    for (int b = 0; b < SLOTS; b++) {
      CK(cudaEventCreateWithFlags(&staged[f][b], cudaEventDisableTiming));
      CK(cudaEventCreateWithFlags(&landed[f][b], cudaEventDisableTiming));
    }
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  float best = 1e30f, worst = 0;
  for (int rep = 0; rep < 4; rep++) {
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(t0, d2h[0]));
    for (int f = 0; f < FLOWS; f++) CK(cudaStreamWaitEvent(d2h[f], t0, 0));
    for (int i = 0; i < n; i++)
      for (int f = 0; f < FLOWS; f++) {
        const int b = i % SLOTS;
        if (i >= SLOTS) CK(cudaStreamWaitEvent(d2h[f], landed[f][b], 0));
        CK(cudaMemcpyAsync(host[f] + b * slice, src[f] + i * slice, slice, cudaMemcpyDeviceToHost, d2h[f]));
        CK(cudaEventRecord(staged[f][b], d2h[f]));
        CK(cudaStreamWaitEvent(h2d[f], staged[f][b], 0));
        CK(cudaMemcpyAsync(dst[f] + i * slice, host[f] + b * slice, slice, cudaMemcpyHostToDevice, h2d[f]));
        CK(cudaEventRecord(landed[f][b], h2d[f]));
      }
    for (int f = 0; f < FLOWS; f++) CK(cudaStreamWaitEvent(d2h[0], landed[f][(n - 1) % SLOTS], 0));
    CK(cudaEventRecord(t1, d2h[0]));
    CK(cudaEventSynchronize(t1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    if (rep && ms < best) best = ms; /* the first round warms up */
    if (rep && ms > worst) worst = ms;
  }
  printf("order %s skip %d%s host %s: %.1f GB/s delivered (two flows; slowest round %.1f)\n",
         threads ? "threads" : order, skip, threads ? " (two threads)" : "", how, FLOWS * total / (best * 1e-3) / 1e9,
         FLOWS * total / (worst * 1e-3) / 1e9);
  return 0;
}
