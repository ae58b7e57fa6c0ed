/* test_lanes.c — stage 2 of the ring kernels' lanes on a GPU: NVLink and one or two side lanes.
 *
 * Two ranks, threads of this process, share GPU 0 (the lent node has one): every allreduce (32
 * MiB, 128 MiB with the rdma lane) runs the ring kernel, split between the NVLink lane (same-device peer access here) and
 * the side lanes: pcie (pinned host memory), and in the three-lane cases also rdma (the rdma link
 * on the fake verbs provider, device to device).  The kernel times every lane; the host takes the
 * records and every few calls the ranks re-balance.  Each case makes one side lane look 30 times
 * slower for a while (fc_gpu_lanes_set_throttle scales its measured times, as
 * fc_links_set_throttle does for host links) and then normal again: its model bandwidth and its
 * part of a chunk must fall, then come back; both ranks must hold the same models and split at
 * the end of every phase; and every call's result must be bitwise the first one's, whatever the
 * split (the inputs are random floats, so a change of the reduction order would show).  The
 * lanes' statistics (flexcoll_comm_get_link_stats) must carry busy time, and the throttled lane's
 * share (its mean over the phase's calls) must fall with it.  Cases: nvlink+pcie with pcie
 * slowed; nvlink+pcie+rdma with rdma slowed, then with pcie slowed (the three-lane cases need the
 * fake provider: skipped without it).  FC_LANES_CASES=0,1,2 picks cases.
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
typedef struct {
  const char *lanes;    /* FLEXCOLL_RING_LANE */
  const char *slowed;   /* the side lane throttled in phase 1 */
  size_t count;         /* floats per allreduce, above FLEXCOLL_LANE_STAGE2_BYTES's default */
} case_t;
/* With the rdma lane, 128 MiB: the fake provider's lane costs about half a millisecond a call
 * (its alpha), which a 16 MiB chunk's NVLink time on one H100 did not reach, so the balancer gave
 * it no part at all (session 31); a 64 MiB chunk gives it a few hundred KiB. */
static const case_t cases[] = {{"pcie", "pcie", 8u << 20}, {"pcie,rdma", "rdma", 32u << 20}, {"pcie,rdma", "pcie", 32u << 20}};
#define NCASES (int)(sizeof cases / sizeof cases[0])
static const case_t *g_case;
#define COUNT (g_case->count)
#define NPHASES 3
/* The recovery is the longest phase: a lane left idle is measured again only through probe
 * shares every few exchanges, and a probe's small part mostly pays the lane's fixed cost (the fake
 * rdma lane's rose only to a sixth of its part in 80 calls on an H100, session 32). */
static const int phase_calls[NPHASES] = {64, 48, 160};
static const double phase_throttle[NPHASES] = {1, 30, 1};

typedef struct {
  FC_TEST_RANK_MEMBERS;
  int lanes[NPHASES]; /* the lanes fc_gpu_lanes_state reports */
  fc_gpu_lane_state_t state[NPHASES][FC_GPU_LANES];
  int slow;           /* the throttled lane's index in state */
  double share[NPHASES]; /* the throttled lane's share in the statistics, the phase's mean */
  double busy[NPHASES][FC_GPU_LANES];
} rank_t;

/* The link statistics: every lane's busy time into busy (NULL: not wanted); the throttled lane's
 * share of the last collective returned. */
static double lane_stats(rank_t *r, flexcoll_comm_t comm, int phase, double *busy) {
  flexcoll_link_stats_t st[16];
  int n = 0;
  double share = 0;
  EXPECT(r, flexcoll_comm_get_link_stats(comm, st, 16, &n) == FLEXCOLL_SUCCESS, "get_link_stats: %s",
         flexcoll_get_last_error(comm));
  for (int i = 0; i < n && i < 16; i++) {
    if (!strcmp(st[i].name, g_case->slowed)) share = st[i].share;
    for (int L = 0; busy && L < r->lanes[phase]; L++)
      if (!strcmp(st[i].name, r->state[phase][L].name)) busy[L] = st[i].busy_us;
  }
  return share;
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
    fc_gpu_lanes_set_throttle(comm, g_case->slowed, phase_throttle[phase]);
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
      /* The mean over the phase, not the last call's: a lane left idle gets a probe share now
       * and then, larger than the few bytes a slow lane's model gives it. */
      r->share[phase] += lane_stats(r, comm, phase, NULL) / phase_calls[phase];
    }
    r->lanes[phase] = fc_gpu_lanes_state(comm, (size_t)COUNT * sizeof(float) / NRANKS, r->state[phase]);
    lane_stats(r, comm, phase, r->busy[phase]);
    char text[256] = "";
    for (int L = 0, at = 0; L < r->lanes[phase]; L++)
      at += snprintf(text + at, sizeof text - (size_t)at, " %s %.0f MB/s %zu B busy %.0f us,", r->state[phase][L].name,
                     r->state[phase][L].beta, r->state[phase][L].part, r->busy[phase][L]);
    fprintf(stderr, "[test_lanes] lanes %s rank %d phase %d (%s x%.0f):%s %s share %.4f\n", g_case->lanes, r->rank, phase,
            g_case->slowed, phase_throttle[phase], text, g_case->slowed, r->share[phase]);
  }
  const int want = strchr(g_case->lanes, ',') ? 3 : 2;
  if (!r->failures) {
    EXPECT(r, r->lanes[0] == want, "%d adaptive lanes, not %d (is a side lane off? FLEXCOLL_DEBUG=INFO says why)",
           r->lanes[0], want);
    r->slow = -1;
    for (int L = 0; L < r->lanes[0]; L++)
      if (!strcmp(r->state[0][L].name, g_case->slowed)) r->slow = L;
    EXPECT(r, r->slow > 0, "no lane %s among the adaptive lanes", g_case->slowed);
  }
  for (int p = 1; p < NPHASES && !r->failures; p++)
    EXPECT(r, r->lanes[p] == r->lanes[0], "phase %d: %d lanes, phase 0 had %d", p, r->lanes[p], r->lanes[0]);
  if (!r->failures) {
    const int L = r->slow;
    const double b0 = r->state[0][L].beta, b1 = r->state[1][L].beta, b2 = r->state[2][L].beta;
    const size_t p0 = r->state[0][L].part, p1 = r->state[1][L].part, p2 = r->state[2][L].part;
    const char *nm = g_case->slowed;
    /* The lane to slow carries bytes once the models settle (a probe finds a lane the
     * calibration underrated); every lane has carried some in timed calls (busy time, below). */
    EXPECT(r, p0 > 0, "lane %s carries nothing after %d calls", nm, phase_calls[0]);
    EXPECT(r, b1 < b0 / 4, "%s 30x slower, yet its model kept %.0f MB/s (was %.0f)", nm, b1, b0);
    EXPECT(r, p1 < p0, "%s 30x slower, yet its part of a chunk went from %zu to %zu", nm, p0, p1);
    EXPECT(r, b2 > 4 * b1, "%s recovered, yet its model stayed at %.0f MB/s (slow: %.0f)", nm, b2, b1);
    EXPECT(r, p2 > p1 && p2 > p0 / 2, "%s recovered, yet its part is %zu (slow %zu, before %zu)", nm, p2, p1, p0);
    for (int k = 0; k < r->lanes[0]; k++)
      EXPECT(r, r->busy[0][k] > 0, "link statistics without busy time on %s", r->state[0][k].name);
    EXPECT(r, r->share[0] > 0 && r->share[1] < r->share[0],
           "the %s entry's mean share went from %.4f to %.4f while 30x slower", nm, r->share[0], r->share[1]);
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
  unsetenv("FLEXCOLL_PCIE_ENGINE");
  unsetenv("FLEXCOLL_LANE_STAGE2_BYTES");
  const char *pick = getenv("FC_LANES_CASES");
  int failures = 0;
  for (int c = 0; c < NCASES && !failures; c++) {
    char tag[8];
    snprintf(tag, sizeof tag, "%d", c);
    if (pick && !strstr(pick, tag)) continue;
    g_case = &cases[c];
    unsetenv("FLEXCOLL_VERBS_PROVIDER");
    setenv("FLEXCOLL_RING_LANE", g_case->lanes, 1);
    if (strstr(g_case->lanes, "rdma")) {
#ifdef FC_FAKE_VERBS_LIB
      setenv("FLEXCOLL_VERBS_PROVIDER", "fake", 1);
      setenv("FLEXCOLL_VERBS_FAKE_LIB", FC_FAKE_VERBS_LIB, 1);
#else
      fprintf(stderr, "[test_lanes] lanes %s: skipped (this build has no fake verbs provider: Check and verbs.h)\n",
              g_case->lanes);
      continue;
#endif
    }
    flexcoll_unique_id_t id;
    if (flexcoll_get_unique_id(&id) != FLEXCOLL_SUCCESS) {
      fprintf(stderr, "[test_lanes] get_unique_id: %s\n", flexcoll_get_last_error(NULL));
      return 1;
    }
    rank_t ranks[NRANKS];
    memset(ranks, 0, sizeof ranks);
    failures += fc_test_run_ranks(ranks, sizeof ranks[0], NRANKS, id, rank_main);
    /* Every rank holds the same models and splits alike, phase by phase. */
    for (int p = 0; p < NPHASES && !failures; p++)
      for (int L = 0; L < ranks[0].lanes[p]; L++)
        if (ranks[0].state[p][L].beta != ranks[1].state[p][L].beta ||
            ranks[0].state[p][L].part != ranks[1].state[p][L].part) {
          fprintf(stderr, "[test_lanes] lanes %s phase %d lane %s: rank 0 holds %.17g MB/s and %zu bytes, rank 1 %.17g and %zu\n",
                  g_case->lanes, p, ranks[0].state[p][L].name, ranks[0].state[p][L].beta, ranks[0].state[p][L].part,
                  ranks[1].state[p][L].beta, ranks[1].state[p][L].part);
          failures++;
        }
    fprintf(stderr, "[test_lanes] lanes %s, %s slowed: %s\n", g_case->lanes, g_case->slowed, failures ? "FAIL" : "PASS");
  }
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
  if (system(cmd) != 0) fprintf(stderr, "[test_lanes] could not remove %s\n", cache);
  printf("test_lanes: %s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
