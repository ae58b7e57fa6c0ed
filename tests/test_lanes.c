/* test_lanes.c — stage 2 of the ring kernels' two lanes (nvlink and pcie) on a GPU.
 *
 * Two ranks, threads of this process, share GPU 0 (the lent node has one): every allreduce of
 * 32 MiB runs the ring kernel, split between the NVLink lane (same-device peer access here) and
 * the pcie lane (pinned host memory).  The kernel times both lanes; the host takes the records
 * and every few calls the ranks exchange them and re-balance.  The test makes the pcie lane look
 * 30 times slower for a while (fc_gpu_lanes_set_throttle scales its measured times, as
 * fc_links_set_throttle does for host links) and then normal again: its model bandwidth and its
 * share of a chunk must fall, then come back; both ranks must hold the same models and split
 * at the end of every phase; and every call's result must be bitwise the first one's, whatever
 * the split (the inputs are random floats, so a change of the reduction order would show).  The
 * lanes' statistics (flexcoll_comm_get_link_stats) must carry busy time, and the pcie entry's
 * share must fall with the lane.
 *
 * Exit 77 (automake's skip) where there is no GPU. */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flexcoll.h"
#include "gpu/gpu.h"
#define TEST_TAG "[test_lanes]"
#include "gpu_ranks.h"
#include "gpu_serial.h"

#define NRANKS 2
#define COUNT (8u << 20) /* floats: 32 MiB, above FLEXCOLL_LANE_STAGE2_BYTES's default */
#define NPHASES 3
static const int phase_calls[NPHASES] = {64, 48, 80};
static const double phase_throttle[NPHASES] = {1, 30, 1};

typedef struct {
  FC_TEST_RANK_MEMBERS;
  int have[NPHASES];
  double beta[NPHASES][2];
  size_t pc[NPHASES];
  double share[NPHASES], busy[NPHASES][2];
} rank_t;

/* The pcie entry's share and both lanes' busy time from the link statistics. */
static void lane_stats(rank_t *r, flexcoll_comm_t comm, int phase) {
  flexcoll_link_stats_t st[16];
  int n = 0;
  EXPECT(r, flexcoll_comm_get_link_stats(comm, st, 16, &n) == FLEXCOLL_SUCCESS, "get_link_stats: %s",
         flexcoll_get_last_error(comm));
  for (int i = 0; i < n && i < 16; i++) {
    if (!strcmp(st[i].name, "nvlink")) r->busy[phase][0] = st[i].busy_us;
    if (!strcmp(st[i].name, "pcie")) r->busy[phase][1] = st[i].busy_us, r->share[phase] = st[i].share;
  }
}

static void *rank_main(void *arg) {
  rank_t *r = arg;
  cudaSetDevice(0);
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = 0;
  config.timeout_ms = 20000; /* a lost peer fails the test, not hangs it */
  flexcoll_comm_t comm = NULL;
  if (flexcoll_comm_init_rank(&comm, NRANKS, r->id, r->rank, &config) != FLEXCOLL_SUCCESS) {
    EXPECT(r, 0, "comm_init_rank: %s", flexcoll_get_last_error(NULL));
    return NULL;
  }
  cudaStream_t s;
  float *in = NULL, *out = NULL;
  float *host = malloc(COUNT * sizeof *host), *first = malloc(COUNT * sizeof *first);
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&in, COUNT * sizeof *in) != cudaSuccess ||
      cudaMalloc((void **)&out, COUNT * sizeof *out) != cudaSuccess || !host || !first) {
    EXPECT(r, 0, "allocating: %s", cudaGetErrorString(cudaGetLastError()));
    return NULL;
  }
  /* Floats of every magnitude: a sum whose order changed would change bits.  Both ranks' inputs
   * are made here; with two ranks each element's sum is the one addition of the two (IEEE
   * addition commutes), so the first call is checked against it bit for bit. */
  float *ref = malloc(COUNT * sizeof *ref);
  if (!ref) {
    EXPECT(r, 0, "out of memory");
    return NULL;
  }
  for (int q = 0; q < NRANKS; q++) {
    unsigned long long x = 0x9e3779b97f4a7c15ull * (unsigned long long)(q + 1);
    for (size_t i = 0; i < COUNT; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const float v = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * (float)(1u << (x % 20));
      if (q == r->rank) host[i] = v;
      ref[i] = q ? ref[i] + v : v;
    }
  }
  cudaMemcpyAsync(in, host, COUNT * sizeof *in, cudaMemcpyHostToDevice, s);
  cudaStreamSynchronize(s);
  int calls = 0, wrong_calls = 0;
  for (int phase = 0; phase < NPHASES && !r->failures; phase++) {
    fc_gpu_lanes_set_throttle(comm, "pcie", phase_throttle[phase]);
    for (int k = 0; k < phase_calls[phase] && !r->failures; k++, calls++) {
      flexcoll_result_t res = flexcoll_allreduce(in, out, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
      EXPECT(r, res == FLEXCOLL_SUCCESS, "allreduce %d: %s", calls, flexcoll_get_last_error(comm));
      /* Synchronised after every call, so that each record is taken a call later (an
       * application that never waits adapts as late as its host runs ahead). */
      cudaMemcpyAsync(calls ? host : first, out, COUNT * sizeof *out, cudaMemcpyDeviceToHost, s);
      EXPECT(r, cudaStreamSynchronize(s) == cudaSuccess, "call %d: %s", calls, cudaGetErrorString(cudaGetLastError()));
      flexcoll_result_t async = FLEXCOLL_SUCCESS;
      flexcoll_comm_get_async_error(comm, &async);
      EXPECT(r, async == FLEXCOLL_SUCCESS, "call %d: asynchronous error %s", calls, flexcoll_get_error_string(async));
      if (!calls) EXPECT(r, !memcmp(first, ref, COUNT * sizeof *ref), "the first allreduce is not the sum of the inputs");
      else if (memcmp(host, first, COUNT * sizeof *host)) wrong_calls++;
      EXPECT(r, wrong_calls == 0, "call %d gave other bits than the first (the split changed the result)", calls);
    }
    r->have[phase] = fc_gpu_lanes_state(comm, (size_t)COUNT * sizeof(float) / NRANKS, r->beta[phase], &r->pc[phase]);
    lane_stats(r, comm, phase);
    fprintf(stderr,
            "[test_lanes] rank %d phase %d (pcie x%.0f): models nvlink %.0f pcie %.0f MB/s, pcie %zu of a %u-byte chunk, "
            "share %.4f, busy nvlink %.0f pcie %.0f us\n",
            r->rank, phase, phase_throttle[phase], r->beta[phase][0], r->beta[phase][1], r->pc[phase],
            COUNT * 4 / NRANKS, r->share[phase], r->busy[phase][0], r->busy[phase][1]);
  }
  if (!r->failures) {
    EXPECT(r, r->have[0], "no adaptive pcie lane (is the pcie link off? FLEXCOLL_DEBUG=INFO says why)");
    EXPECT(r, r->pc[0] > 0, "the pcie lane carries nothing after %d calls (a probe should have found it)", phase_calls[0]);
    EXPECT(r, r->beta[1][1] < r->beta[0][1] / 4, "pcie 30x slower, yet its model kept %.0f MB/s (was %.0f)",
           r->beta[1][1], r->beta[0][1]);
    EXPECT(r, r->pc[1] < r->pc[0], "pcie 30x slower, yet its share of a chunk went from %zu to %zu", r->pc[0], r->pc[1]);
    EXPECT(r, r->beta[2][1] > 4 * r->beta[1][1], "pcie recovered, yet its model stayed at %.0f MB/s (slow: %.0f)",
           r->beta[2][1], r->beta[1][1]);
    EXPECT(r, r->pc[2] > r->pc[1] && r->pc[2] > r->pc[0] / 2, "pcie recovered, yet its share is %zu (slow %zu, before %zu)",
           r->pc[2], r->pc[1], r->pc[0]);
    EXPECT(r, r->busy[0][0] > 0 && r->busy[0][1] > 0, "link statistics without busy time: nvlink %.0f, pcie %.0f us",
           r->busy[0][0], r->busy[0][1]);
    EXPECT(r, r->share[0] > 0 && r->share[1] < r->share[0], "the pcie entry's share went from %.4f to %.4f while 30x slower",
           r->share[0], r->share[1]);
  }
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(s);
  free(host);
  free(first);
  free(ref);
  /* A rank that stopped early leaves its peer's kernels waiting: abort releases them. */
  if (r->failures) flexcoll_comm_abort(comm);
  flexcoll_comm_destroy(comm);
  return NULL;
}

int main(void) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("test_lanes: SKIP: no GPU\n");
    return 77;
  }
  fc_test_gpu_serialize("[test_lanes]");
  /* A fresh calibration, not a model some earlier run left in the user's cache. */
  char cache[] = "/tmp/fc-test-lanes-XXXXXX";
  if (!mkdtemp(cache)) {
    perror("mkdtemp");
    return 1;
  }
  setenv("FLEXCOLL_CACHE_DIR", cache, 1);
  unsetenv("FLEXCOLL_LINK_SHARES");
  unsetenv("FLEXCOLL_LINKS");
  unsetenv("FLEXCOLL_LANE_STAGE2_BYTES");
  flexcoll_unique_id_t id;
  if (flexcoll_get_unique_id(&id) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "[test_lanes] get_unique_id: %s\n", flexcoll_get_last_error(NULL));
    return 1;
  }
  rank_t ranks[NRANKS];
  memset(ranks, 0, sizeof ranks);
  int failures = fc_test_run_ranks(ranks, sizeof ranks[0], NRANKS, id, rank_main);
  /* Every rank holds the same models and splits alike, phase by phase. */
  for (int p = 0; p < NPHASES && !failures; p++)
    if (memcmp(ranks[0].beta[p], ranks[1].beta[p], sizeof ranks[0].beta[p]) || ranks[0].pc[p] != ranks[1].pc[p]) {
      fprintf(stderr, "[test_lanes] phase %d: rank 0 holds %.17g/%.17g MB/s and %zu pcie bytes, rank 1 %.17g/%.17g and %zu\n",
              p, ranks[0].beta[p][0], ranks[0].beta[p][1], ranks[0].pc[p], ranks[1].beta[p][0], ranks[1].beta[p][1],
              ranks[1].pc[p]);
      failures++;
    }
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
  if (system(cmd) != 0) fprintf(stderr, "[test_lanes] could not remove %s\n", cache);
  printf("test_lanes: %s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
