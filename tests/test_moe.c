/* test_moe.c — MoE dispatch and combine (flexcoll_moe_*) against a host reference.
 *
 * Ranks are threads of one process.  First, on every build, 2 host-only ranks (cuda_device -1):
 * every bad argument of create, dispatch, combine and destroy returns FLEXCOLL_INVALID_ARGUMENT
 * with a message naming it, and a valid create on a host-only communicator FLEXCOLL_INVALID_USAGE
 * saying so.  Then, on CUDA builds with a GPU, for each rank count N (FC_MOE_RANKS, default
 * "2,4,8"), all ranks on device 0, for several configurations (bfloat16, float16, float32, int8;
 * FENCE, SENTINEL, AUTO; top_k larger than N):
 *  - dispatch: per source, the received rows are compared as a permutation with what the source
 *    sent this rank: the count, each row's meta word (token index, top_k mask) and its bytes; a
 *    token is received once per destination rank however many of its experts live there;
 *    routings: random (ids < 0 and duplicate ids among them), T = 0, T = max_tokens, every token
 *    to one rank, every id -1, all k of a token the same expert; payloads carry ±0, NaNs (the
 *    all-ones pattern too, which SENTINEL turns into the canonical NaN), infinities;
 *  - combine: each rank's expert output row = received row * 0.5 + (rank + 1), rounded to the
 *    payload type (so a row taken from the wrong rank shows); out[t] compared bit for bit with
 *    the host's sum of weights[t][k] * row in fp32 in k order (NaN against any NaN);
 *  - bad arguments of a created moe (T out of range, NULL and host pointers, misalignment,
 *    combine without dispatch, out overlapping expert_out, int8 combine, destroyed handle), and
 *    a create with configurations that differ between ranks (INVALID_USAGE on all);
 *  - a CUDA graph of dispatch, an "expert" copy of the receive buffer into expert_out, and
 *    combine, replayed FC_MOE_REPLAYS times (1000 with FC_MOE_QUICK=1, else 10^4) with the
 *    routing and tokens rewritten in device memory before each replay; every replay's counts
 *    and output checked.
 * Then the failure cases with 2 ranks: rank 1 never calls dispatch → rank 0's async error is
 * FLEXCOLL_TIMEOUT within the timeout plus 10 s; with a long timeout, flexcoll_comm_abort
 * releases rank 0's waiting kernel within 10 s; rank 0 dispatches an expert id not below
 * num_experts → both dispatches end, rank 0's async error is FLEXCOLL_INVALID_ARGUMENT.  FC_MOE_QUICK=1 runs fewer cases; FC_MOE_GPUS=G
 * puts rank r on GPU r % G (default 1: all on GPU 0).  Every host buffer that a copy to or from
 * the device touches is pinned (pmalloc says why: pageable ones hung N=4).  Every phase is
 * bounded by a watchdog (alarm) that prints "HANG: <phase>".  Exit 77 (skip) on a CUDA build
 * without a GPU once the host-only checks passed. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef FC_TEST_CUDA
#include <cuda_runtime.h>
#endif

#include "flexcoll.h"
#ifdef FC_TEST_CUDA
#include "gpu_serial.h"
#endif

#define TAG "[test_moe]"
#define MAX_RANKS 8
#define PHASE_ALARM 300
#define MAX_MSGS 20

static int g_failures;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_phase[160] = "start";
static int g_quick;

static void on_alarm(int sig) {
  (void)sig;
  static const char head[] = TAG " HANG: ";
  ssize_t w = write(2, head, sizeof head - 1);
  w += write(2, g_phase, strnlen(g_phase, sizeof g_phase));
  w += write(2, "\n", 1);
  (void)w;
  _exit(1);
}

static __attribute__((unused)) double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define FAIL(rank, ...)                                                      \
  do {                                                                       \
    pthread_mutex_lock(&g_lock);                                             \
    if (g_failures++ < 200) {                                                \
      fprintf(stderr, TAG " FAIL [%s] rank %d: ", g_phase, (rank));          \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, "\n");                                                 \
    }                                                                        \
    pthread_mutex_unlock(&g_lock);                                           \
  } while (0)

/* res must be want, and the last error must name `word`. */
static void expect(int rank, flexcoll_comm_t comm, flexcoll_result_t res, flexcoll_result_t want, const char *word,
                   const char *what) {
  const char *msg = flexcoll_get_last_error(NULL);
  if (res != want) FAIL(rank, "%s: returned %s, want %s (%s)", what, flexcoll_get_error_string(res),
                        flexcoll_get_error_string(want), msg);
  else if (word && !strstr(msg, word)) FAIL(rank, "%s: the message does not name '%s': %s", what, word, msg);
  (void)comm;
}

static __attribute__((unused)) uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* ---- host-only: the argument checks ---------------------------------------------------------- */

static flexcoll_unique_id_t g_host_id;

static void *host_rank(void *arg) {
  const int rank = (int)(intptr_t)arg;
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = -1;
  config.timeout_ms = 20000;
  flexcoll_comm_t comm = NULL;
  if (flexcoll_comm_init_rank(&comm, 2, g_host_id, rank, &config) != FLEXCOLL_SUCCESS) {
    FAIL(rank, "host comm_init_rank: %s", flexcoll_get_last_error(NULL));
    return NULL;
  }
  flexcoll_moe_t m = (flexcoll_moe_t)(intptr_t)1;
  const flexcoll_moe_config_t good = {sizeof(flexcoll_moe_config_t), FLEXCOLL_MOE_CONFIG_VERSION, 16, 64,
                                      FLEXCOLL_BFLOAT16, 2, 4, FLEXCOLL_MOE_AUTO};
  flexcoll_moe_config_t c;
  expect(rank, comm, flexcoll_moe_create(comm, &good, NULL), FLEXCOLL_INVALID_ARGUMENT, "moe", "create moe NULL");
  expect(rank, comm, flexcoll_moe_create(NULL, &good, &m), FLEXCOLL_INVALID_ARGUMENT, "comm", "create comm NULL");
  if (m) FAIL(rank, "create with comm NULL left *moe set");
  expect(rank, comm, flexcoll_moe_create(comm, NULL, &m), FLEXCOLL_INVALID_ARGUMENT, "cfg", "create cfg NULL");
  struct { const char *field, *word; } bad[] = {
      {"size", "FLEXCOLL_MOE_CONFIG_INITIALIZER"}, {"version", "FLEXCOLL_MOE_CONFIG_INITIALIZER"},
      {"max_tokens0", "max_tokens"}, {"max_tokens_big", "max_tokens"}, {"hidden0", "hidden"},
      {"hidden_odd", "hidden"}, {"dtype", "dtype"}, {"top_k0", "top_k"}, {"top_k_big", "top_k"},
      {"experts", "num_experts"}, {"experts0", "num_experts"}, {"sync", "sync"}, {"int8_sentinel", "sync"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    c = good;
    const char *f = bad[i].field;
    if (!strcmp(f, "size")) c.size = 0;
    else if (!strcmp(f, "version")) c.version = 99;
    else if (!strcmp(f, "max_tokens0")) c.max_tokens = 0;
    else if (!strcmp(f, "max_tokens_big")) c.max_tokens = 65537;
    else if (!strcmp(f, "hidden0")) c.hidden = 0;
    else if (!strcmp(f, "hidden_odd")) c.hidden = 7; /* 14 bytes a row */
    else if (!strcmp(f, "dtype")) c.dtype = FLEXCOLL_INT32;
    else if (!strcmp(f, "top_k0")) c.top_k = 0;
    else if (!strcmp(f, "top_k_big")) c.top_k = 16;
    else if (!strcmp(f, "experts")) c.num_experts = 3;
    else if (!strcmp(f, "experts0")) c.num_experts = 0;
    else if (!strcmp(f, "sync")) c.sync = (flexcoll_moe_sync_t)7;
    else if (!strcmp(f, "int8_sentinel")) c.dtype = FLEXCOLL_INT8, c.sync = FLEXCOLL_MOE_SENTINEL;
    char what[64];
    snprintf(what, sizeof what, "create with bad %s", f);
    m = (flexcoll_moe_t)(intptr_t)1;
    expect(rank, comm, flexcoll_moe_create(comm, &c, &m), FLEXCOLL_INVALID_ARGUMENT, bad[i].word, what);
    if (m) FAIL(rank, "%s left *moe set", what);
  }
  expect(rank, comm, flexcoll_moe_create(comm, &good, &m), FLEXCOLL_INVALID_USAGE, "host-only", "create host-only");
  expect(rank, comm, flexcoll_moe_dispatch(NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL), FLEXCOLL_INVALID_ARGUMENT,
         "moe", "dispatch moe NULL");
  int junk[16] = {0};
  expect(rank, comm, flexcoll_moe_dispatch((flexcoll_moe_t)junk, NULL, NULL, 0, NULL, NULL, NULL, NULL),
         FLEXCOLL_INVALID_ARGUMENT, "live", "dispatch made-up handle");
  expect(rank, comm, flexcoll_moe_combine(NULL, NULL, NULL, NULL, NULL), FLEXCOLL_INVALID_ARGUMENT, "moe",
         "combine moe NULL");
  expect(rank, comm, flexcoll_moe_combine((flexcoll_moe_t)junk, NULL, NULL, NULL, NULL), FLEXCOLL_INVALID_ARGUMENT,
         "live", "combine made-up handle");
  expect(rank, comm, flexcoll_moe_destroy(NULL), FLEXCOLL_INVALID_ARGUMENT, "moe", "destroy moe NULL");
  expect(rank, comm, flexcoll_moe_destroy((flexcoll_moe_t)junk), FLEXCOLL_INVALID_ARGUMENT, "live",
         "destroy made-up handle");
  flexcoll_comm_destroy(comm);
  return NULL;
}

static int run_host_checks(void) {
  snprintf(g_phase, sizeof g_phase, "host-only argument checks");
  alarm(PHASE_ALARM);
  const int before = g_failures;
  if (flexcoll_get_unique_id(&g_host_id) != FLEXCOLL_SUCCESS) {
    FAIL(-1, "get_unique_id: %s", flexcoll_get_last_error(NULL));
    return 1;
  }
  pthread_t th[2];
  for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, host_rank, (void *)(intptr_t)r);
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  fprintf(stderr, TAG " host-only argument checks: %s\n", g_failures == before ? "PASS" : "FAIL");
  return g_failures != before;
}

#ifdef FC_TEST_CUDA

/* ---- values --------------------------------------------------------------------------------- */

static size_t esize_of(flexcoll_datatype_t dt) {
  return dt == FLEXCOLL_FLOAT32 ? 4 : dt == FLEXCOLL_INT8 ? 1 : 2;
}
static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bf16_f(uint16_t h) { return bits_f((uint32_t)h << 16); }
static uint16_t f_bf16(float f) {
  uint32_t u = f_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static float f16_f(uint16_t h) {
  const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return bits_f(s | 0x7f800000u | (m << 13));
  if (e == 0) { float v = ldexpf((float)m, -24); return s ? -v : v; }
  return bits_f(s | ((e + 112) << 23) | (m << 13));
}
static uint16_t f_f16(float f) {
  const uint32_t x = f_bits(f), sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
  if (ax < 0x38800000u) return (uint16_t)(sign | (uint16_t)nearbyint((double)bits_f(ax) * 16777216.0));
  uint32_t h = ((((ax >> 23) - 112) << 10) | ((ax & 0x7fffff) >> 13));
  const uint32_t rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}
static float get_f(flexcoll_datatype_t dt, const void *row, size_t j) {
  if (dt == FLEXCOLL_FLOAT32) { float f; memcpy(&f, (const char *)row + 4 * j, 4); return f; }
  uint16_t h;
  memcpy(&h, (const char *)row + 2 * j, 2);
  return dt == FLEXCOLL_BFLOAT16 ? bf16_f(h) : f16_f(h);
}
static void put_f(flexcoll_datatype_t dt, void *row, size_t j, float f) {
  if (dt == FLEXCOLL_FLOAT32) { memcpy((char *)row + 4 * j, &f, 4); return; }
  const uint16_t h = dt == FLEXCOLL_BFLOAT16 ? f_bf16(f) : f_f16(f);
  memcpy((char *)row + 2 * j, &h, 2);
}
/* SENTINEL: the all-ones element arrives as the canonical NaN. */
static void fix_row(flexcoll_datatype_t dt, void *row, size_t hidden) {
  for (size_t j = 0; j < hidden; j++) {
    if (dt == FLEXCOLL_FLOAT32) {
      uint32_t u; memcpy(&u, (char *)row + 4 * j, 4);
      if (u == 0xffffffffu) { u = 0x7fc00000u; memcpy((char *)row + 4 * j, &u, 4); }
    } else if (dt != FLEXCOLL_INT8) {
      uint16_t h; memcpy(&h, (char *)row + 2 * j, 2);
      if (h == 0xffff) { h = dt == FLEXCOLL_BFLOAT16 ? 0x7fc0 : 0x7e00; memcpy((char *)row + 2 * j, &h, 2); }
    }
  }
}

/* ---- a configuration and the inputs of every rank (computed from seeds, by every rank) ----- */

typedef struct {
  const char *name;
  flexcoll_datatype_t dtype;
  flexcoll_moe_sync_t sync;
  int hidden, top_k, experts_per_rank, max_tokens;
} moe_case_t;

enum { R_RANDOM, R_EMPTY_T, R_FULL_T, R_ONE_RANK, R_NONE, R_DUP, R_NROUTES };
static const char *route_names[R_NROUTES] = {"random", "T=0", "T=max_tokens", "all to one rank", "all ids -1",
                                             "duplicate ids"};

typedef struct {
  int T;
  int *ids;      /* [max_tokens][top_k] */
  char *tokens;  /* [max_tokens][row] */
  float *w;      /* [max_tokens][top_k] */
} inputs_t;

static int g_nranks;
static pthread_barrier_t g_barrier;
static flexcoll_unique_id_t g_id;

/* The inputs of rank s for (case, routing, call) from a seed: every rank computes anyone's. */
static void gen_inputs(const moe_case_t *c, int nranks, int s, int route, uint64_t call, inputs_t *in) {
  const size_t es = esize_of(c->dtype), row = (size_t)c->hidden * es;
  const int E = c->experts_per_rank * nranks;
  uint64_t seed = mix(((uint64_t)s << 48) ^ ((uint64_t)route << 40) ^ call ^ ((uint64_t)c->hidden << 20));
  switch (route) {
    case R_EMPTY_T: in->T = 0; break;
    case R_FULL_T: in->T = c->max_tokens; break;
    default: in->T = (int)(mix(seed++) % (uint64_t)(c->max_tokens + 1)); break;
  }
  const int target = (int)(call % (uint64_t)nranks);
  for (int t = 0; t < c->max_tokens; t++)
    for (int k = 0; k < c->top_k; k++) {
      const uint64_t r = mix(seed++);
      int id;
      switch (route) {
        case R_ONE_RANK: id = target * c->experts_per_rank + (int)(r % (uint64_t)c->experts_per_rank); break;
        case R_NONE: id = -1 - (int)(r % 3); break;
        case R_DUP: id = k == 0 ? (int)(r % (uint64_t)E) : in->ids[t * c->top_k]; break;
        default: id = r % 10 == 0 ? -1 : (int)(r % (uint64_t)E); break;
      }
      in->ids[t * c->top_k + k] = id;
      in->w[t * c->top_k + k] = (float)((int)(mix(seed++) % 33) - 16) / 8.0f;
    }
  static const uint32_t sp32[] = {0x00000000u, 0x80000000u, 0x7fc00001u, 0xffffffffu, 0xff800000u, 0xffc00000u};
  static const uint16_t sp16[] = {0x0000, 0x8000, 0x7fc1, 0xffff, 0xff80, 0xffc0};
  static const uint16_t sph[] = {0x0000, 0x8000, 0x7e01, 0xffff, 0xfc00, 0xfe00};
  for (int t = 0; t < c->max_tokens; t++) {
    char *p = in->tokens + (size_t)t * row;
    for (int j = 0; j < c->hidden; j++) {
      const uint64_t r = mix(seed++);
      if (c->dtype == FLEXCOLL_INT8) { p[j] = (char)r; continue; }
      if (r % 41 == 0) { /* a special value */
        const int k = (int)((r >> 8) % 6);
        if (c->dtype == FLEXCOLL_FLOAT32) memcpy(p + 4 * j, &sp32[k], 4);
        else memcpy(p + 2 * j, c->dtype == FLEXCOLL_BFLOAT16 ? &sp16[k] : &sph[k], 2);
        continue;
      }
      put_f(c->dtype, p, (size_t)j, (float)((int)(r % 512) - 256) / 32.0f);
    }
  }
}

static int rank_of(const moe_case_t *c, int nranks, int id) {
  return id >= 0 && id < c->experts_per_rank * nranks ? id / c->experts_per_rank : -1;
}

/* The expert's output for a received row on rank d (the same on host and as uploaded). */
static void expert_row(const moe_case_t *c, int d, const char *in_row, char *out_row) {
  for (int j = 0; j < c->hidden; j++)
    put_f(c->dtype, out_row, (size_t)j, get_f(c->dtype, in_row, (size_t)j) * 0.5f + (float)(d + 1));
}

static int same_float(flexcoll_datatype_t dt, const char *a, const char *b, size_t j) {
  const float x = get_f(dt, a, j), y = get_f(dt, b, j);
  if (isnan(x) || isnan(y)) return isnan(x) && isnan(y);
  return memcmp(a + j * esize_of(dt), b + j * esize_of(dt), esize_of(dt)) == 0;
}

/* The host's combine of token t of `me` (sentinel: as the rows arrive; identity: the expert
 * returns its input, else expert_row's function of the rank). */
static void ref_combine(const moe_case_t *c, int nranks, const inputs_t *in, int t, int sentinel, int identity,
                        char *out_row, char *scratch) {
  const size_t row = (size_t)c->hidden * esize_of(c->dtype);
  memcpy(scratch, in->tokens + (size_t)t * row, row);
  if (sentinel) fix_row(c->dtype, scratch, (size_t)c->hidden);
  for (int j = 0; j < c->hidden; j++) {
    float acc = 0.0f;
    const float x0 = get_f(c->dtype, scratch, (size_t)j);
    for (int k = 0; k < c->top_k; k++) {
      const int d = rank_of(c, nranks, in->ids[t * c->top_k + k]);
      if (d < 0) continue;
      float x = x0;
      if (!identity) {
        char tmp[4];
        put_f(c->dtype, tmp, 0, x * 0.5f + (float)(d + 1));
        x = get_f(c->dtype, tmp, 0);
      }
      const float p = in->w[t * c->top_k + k] * x;
      acc = acc + p;
    }
    put_f(c->dtype, out_row, (size_t)j, acc);
  }
}

typedef struct {
  int rank;
  flexcoll_comm_t comm;
  cudaStream_t s;
} rank_t;

#define CK(r, call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) FAIL((r)->rank, "%s: %s", #call, cudaGetErrorString(e_));  \
  } while (0)

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) { fprintf(stderr, TAG " out of memory\n"); exit(1); }
  return p;
}

/* Every host buffer that a copy to or from the device touches is pinned, never malloc'd: the
 * driver stages a copy of pageable memory through pinned buffers of its own, which the ranks'
 * threads share, and a device-to-host copy of pageable memory returns only once it is done.  A
 * rank's thread copying back behind its dispatch or combine (which waits for the peers' kernels)
 * then held up the host-to-device copies a peer's thread makes before it launches its own: the
 * peer never launched, and the ranks that had launched timed out (N=4 "all to one rank", whose
 * receiving rank finishes its host-side checks last; the earlier routings only passed because
 * the ranks arrived together).  Allocated before a case's first call and freed after its last,
 * when no kernel runs (cudaMallocHost and cudaFreeHost may wait for the device). */
static void *pmalloc(size_t n) {
  void *p = NULL;
  if (cudaMallocHost(&p, n ? n : 1) != cudaSuccess || !p) {
    fprintf(stderr, TAG " out of pinned host memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

/* cudaMemcpyAsync on the rank's stream between the device and a pinned host buffer; a pageable
 * one fails the test here instead of letting it hang as above. */
static void hcopy(rank_t *r, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  const void *host = kind == cudaMemcpyHostToDevice ? src : dst;
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, host) != cudaSuccess || a.type != cudaMemoryTypeHost) {
    cudaGetLastError();
    FAIL(r->rank, "a copy %s pageable host memory %p (the test pins every such buffer: pmalloc)",
         kind == cudaMemcpyHostToDevice ? "from" : "to", host);
    return;
  }
  CK(r, cudaMemcpyAsync(dst, src, n, kind, r->s));
}

static int g_votes[MAX_RANKS];
/* Whether every rank says ok (a barrier for all of them). */
static int agree_all(const rank_t *r, int ok) {
  g_votes[r->rank] = ok;
  pthread_barrier_wait(&g_barrier);
  int all = 1;
  for (int q = 0; q < g_nranks; q++) all &= g_votes[q] != 0;
  pthread_barrier_wait(&g_barrier);
  return all;
}

/* Check this rank's received rows of one dispatch (everything copied back to the host). */
static void check_dispatch(rank_t *r, const moe_case_t *c, int sentinel_known, int sentinel, inputs_t *all,
                           const int *counts, const int *meta, const char *recv, const char *what) {
  const int n = g_nranks, me = r->rank, K = c->top_k;
  const size_t row = (size_t)c->hidden * esize_of(c->dtype);
  char *want = xmalloc(row);
  char *seen = xmalloc((size_t)c->max_tokens);
  int msgs = 0;
  for (int s = 0; s < n; s++) {
    const inputs_t *in = &all[s];
    int expect_n = 0;
    for (int t = 0; t < in->T; t++)
      for (int k = 0; k < K; k++)
        if (rank_of(c, n, in->ids[t * K + k]) == me) { expect_n++; break; }
    if (counts[s] != expect_n) {
      FAIL(me, "%s: %d rows from rank %d, want %d", what, counts[s], s, expect_n);
      continue;
    }
    memset(seen, 0, (size_t)c->max_tokens);
    for (int i = 0; i < counts[s] && msgs < MAX_MSGS; i++) {
      const int m = meta[(size_t)s * c->max_tokens + i];
      const int t = FLEXCOLL_MOE_META_TOKEN(m), mask = FLEXCOLL_MOE_META_MASK(m);
      if (t >= in->T || seen[t]) {
        FAIL(me, "%s: row %d from rank %d names token %d (T %d, %s)", what, i, s, t, in->T, t < in->T ? "twice" : "out of range");
        msgs++;
        continue;
      }
      seen[t] = 1;
      int want_mask = 0;
      for (int k = 0; k < K; k++)
        if (rank_of(c, n, in->ids[t * K + k]) == me) want_mask |= 1 << k;
      if (mask != want_mask) {
        FAIL(me, "%s: token %d of rank %d: mask 0x%x, want 0x%x", what, t, s, mask, want_mask);
        msgs++;
      }
      memcpy(want, in->tokens + (size_t)t * row, row);
      const char *got = recv + ((size_t)s * c->max_tokens + i) * row;
      if (sentinel) fix_row(c->dtype, want, (size_t)c->hidden);
      int bad = memcmp(got, want, row) != 0;
      if (bad && !sentinel_known) { /* AUTO: either mode's bytes */
        fix_row(c->dtype, want, (size_t)c->hidden);
        bad = memcmp(got, want, row) != 0;
      }
      if (bad) {
        size_t j = 0;
        while (j < row && got[j] == want[j]) j++;
        FAIL(me, "%s: token %d of rank %d (row %d): byte %zu is 0x%02x, want 0x%02x", what, t, s, i, j,
             (unsigned char)got[j], (unsigned char)want[j]);
        msgs++;
      }
    }
  }
  free(want);
  free(seen);
}

static void check_combine(rank_t *r, const moe_case_t *c, const inputs_t *in, int sentinel, int identity,
                          const char *out, const char *what) {
  const size_t row = (size_t)c->hidden * esize_of(c->dtype);
  char *want = xmalloc(row), *scratch = xmalloc(row);
  int msgs = 0;
  for (int t = 0; t < in->T && msgs < MAX_MSGS; t++) {
    ref_combine(c, g_nranks, in, t, sentinel, identity, want, scratch);
    const char *got = out + (size_t)t * row;
    for (int j = 0; j < c->hidden; j++)
      if (!same_float(c->dtype, got, want, (size_t)j)) {
        FAIL(r->rank, "%s: out[%d][%d] = %g, want %g", what, t, j, (double)get_f(c->dtype, got, (size_t)j),
             (double)get_f(c->dtype, want, (size_t)j));
        msgs++;
        break;
      }
  }
  free(want);
  free(scratch);
}

static void alloc_inputs(const moe_case_t *c, inputs_t *in) {
  const size_t row = (size_t)c->hidden * esize_of(c->dtype);
  in->ids = pmalloc((size_t)c->max_tokens * c->top_k * sizeof(int));
  in->w = pmalloc((size_t)c->max_tokens * c->top_k * sizeof(float));
  in->tokens = pmalloc((size_t)c->max_tokens * row);
}
static void free_inputs(inputs_t *in) {
  cudaFreeHost(in->ids);
  cudaFreeHost(in->w);
  cudaFreeHost(in->tokens);
}

/* Does this configuration take SENTINEL (1), FENCE (0), or is it up to AUTO (-1)? */
static int mode_of(const moe_case_t *c) {
  if (c->sync == FLEXCOLL_MOE_SENTINEL) return 1;
  if (c->sync == FLEXCOLL_MOE_FENCE || c->dtype == FLEXCOLL_INT8) return 0;
  return -1;
}

/* Bad arguments on a created moe, between a dispatch and its combine (nothing is launched). */
static void bad_calls(rank_t *r, flexcoll_moe_t m, const moe_case_t *c, int T, void *tok_dev, int *ids_dev,
                      void *eout, float *w_dev, void *out_dev) {
  static char host_buf[64] __attribute__((aligned(16)));
  void *rt = NULL;
  expect(r->rank, r->comm, flexcoll_moe_dispatch(m, tok_dev, ids_dev, -1, &rt, NULL, NULL, r->s),
         FLEXCOLL_INVALID_ARGUMENT, "T", "dispatch T -1");
  if (rt) FAIL(r->rank, "a failed dispatch left recv_tokens set");
  expect(r->rank, r->comm, flexcoll_moe_dispatch(m, tok_dev, ids_dev, c->max_tokens + 1, NULL, NULL, NULL, r->s),
         FLEXCOLL_INVALID_ARGUMENT, "T", "dispatch T > max_tokens");
  expect(r->rank, r->comm, flexcoll_moe_dispatch(m, NULL, ids_dev, 1, NULL, NULL, NULL, r->s),
         FLEXCOLL_INVALID_ARGUMENT, "tokens", "dispatch tokens NULL");
  expect(r->rank, r->comm, flexcoll_moe_dispatch(m, host_buf, ids_dev, 1, NULL, NULL, NULL, r->s),
         FLEXCOLL_INVALID_ARGUMENT, "tokens", "dispatch tokens in host memory");
  expect(r->rank, r->comm, flexcoll_moe_dispatch(m, (char *)tok_dev + 2, ids_dev, 1, NULL, NULL, NULL, r->s),
         FLEXCOLL_INVALID_ARGUMENT, "tokens", "dispatch tokens misaligned");
  expect(r->rank, r->comm, flexcoll_moe_dispatch(m, tok_dev, NULL, 1, NULL, NULL, NULL, r->s),
         FLEXCOLL_INVALID_ARGUMENT, "expert_ids", "dispatch expert_ids NULL");
  if (c->dtype == FLEXCOLL_INT8) {
    expect(r->rank, r->comm, flexcoll_moe_combine(m, eout, w_dev, out_dev, r->s), FLEXCOLL_INVALID_USAGE, "int8",
           "combine of int8");
    return;
  }
  expect(r->rank, r->comm, flexcoll_moe_combine(m, NULL, w_dev, out_dev, r->s), FLEXCOLL_INVALID_ARGUMENT,
         "expert_out", "combine expert_out NULL");
  if (T == 0) return; /* weights and out are not read then */
  expect(r->rank, r->comm, flexcoll_moe_combine(m, eout, NULL, out_dev, r->s), FLEXCOLL_INVALID_ARGUMENT, "weights",
         "combine weights NULL");
  expect(r->rank, r->comm, flexcoll_moe_combine(m, eout, w_dev, NULL, r->s), FLEXCOLL_INVALID_ARGUMENT, "out",
         "combine out NULL");
  expect(r->rank, r->comm, flexcoll_moe_combine(m, eout, w_dev, eout, r->s), FLEXCOLL_INVALID_ARGUMENT, "overlaps",
         "combine out = expert_out");
}

/* The moe configuration of case c for n ranks. */
static flexcoll_moe_config_t case_config(const moe_case_t *c, int n) {
  flexcoll_moe_config_t cfg = FLEXCOLL_MOE_CONFIG_INITIALIZER;
  cfg.max_tokens = c->max_tokens;
  cfg.hidden = c->hidden;
  cfg.dtype = c->dtype;
  cfg.top_k = c->top_k;
  cfg.num_experts = c->experts_per_rank * n;
  cfg.sync = c->sync;
  return cfg;
}

/* A rank's device buffers for case c: its tokens, expert ids and weights (max_tokens rows), the
 * expert outputs in the receive buffer's rank-major layout, and the combined output. */
typedef struct {
  char *tok, *eout, *out;
  int *ids;
  float *w;
} case_dev_t;

static void case_dev_alloc(rank_t *r, const moe_case_t *c, int n, case_dev_t *d) {
  const size_t row = (size_t)c->hidden * esize_of(c->dtype), rows = (size_t)n * c->max_tokens;
  memset(d, 0, sizeof *d);
  CK(r, cudaMalloc((void **)&d->tok, (size_t)c->max_tokens * row));
  CK(r, cudaMalloc((void **)&d->ids, (size_t)c->max_tokens * c->top_k * sizeof(int)));
  CK(r, cudaMalloc((void **)&d->w, (size_t)c->max_tokens * c->top_k * sizeof(float)));
  CK(r, cudaMalloc((void **)&d->eout, rows * row));
  CK(r, cudaMalloc((void **)&d->out, (size_t)c->max_tokens * row));
}

/* This rank's inputs of a call into its device buffers. */
static void case_dev_upload(rank_t *r, const moe_case_t *c, const inputs_t *in, case_dev_t *d) {
  const size_t row = (size_t)c->hidden * esize_of(c->dtype);
  hcopy(r, d->tok, in->tokens, (size_t)c->max_tokens * row, cudaMemcpyHostToDevice);
  hcopy(r, d->ids, in->ids, (size_t)c->max_tokens * c->top_k * sizeof(int), cudaMemcpyHostToDevice);
  hcopy(r, d->w, in->w, (size_t)c->max_tokens * c->top_k * sizeof(float), cudaMemcpyHostToDevice);
}

static void case_dev_free(case_dev_t *d) {
  cudaFree(d->tok);
  cudaFree(d->ids);
  cudaFree(d->w);
  cudaFree(d->eout);
  cudaFree(d->out);
}

static void run_case(rank_t *r, const moe_case_t *c) {
  const int n = g_nranks, me = r->rank;
  const size_t row = (size_t)c->hidden * esize_of(c->dtype), rows = (size_t)n * c->max_tokens;
  const int floats = c->dtype != FLEXCOLL_INT8, mode = mode_of(c);
  const flexcoll_moe_config_t cfg = case_config(c, n);
  flexcoll_moe_t m = NULL;
  flexcoll_result_t res = flexcoll_moe_create(r->comm, &cfg, &m);
  if (res != FLEXCOLL_SUCCESS) FAIL(me, "moe_create: %s", flexcoll_get_last_error(NULL));
  inputs_t all[MAX_RANKS];
  for (int s = 0; s < n; s++) alloc_inputs(c, &all[s]);
  case_dev_t d;
  case_dev_alloc(r, c, n, &d);
  int *counts = pmalloc((size_t)n * sizeof(int));
  int *meta = pmalloc(rows * sizeof(int));
  char *recv = pmalloc(rows * row), *eout = pmalloc(rows * row), *out = pmalloc((size_t)c->max_tokens * row);
  if (!agree_all(r, m != NULL)) goto done;

  const int reps = g_quick ? 1 : 3;
  for (int route = 0; route < R_NROUTES; route++)
    for (int rep = 0; rep < reps; rep++) {
      const uint64_t call = (uint64_t)rep * 7 + 1;
      char what[160];
      snprintf(what, sizeof what, "N=%d %s %s rep %d", n, c->name, route_names[route], rep);
      for (int s = 0; s < n; s++) gen_inputs(c, n, s, route, call, &all[s]);
      inputs_t *in = &all[me];
      case_dev_upload(r, c, in, &d);
      void *recv_dev = NULL;
      int *counts_dev = NULL, *meta_dev = NULL;
      res = flexcoll_moe_dispatch(m, d.tok, d.ids, in->T, &recv_dev, &counts_dev, &meta_dev, r->s);
      if (res != FLEXCOLL_SUCCESS) {
        FAIL(me, "%s: dispatch: %s", what, flexcoll_get_last_error(NULL));
        goto done;
      }
      hcopy(r, counts, counts_dev, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost);
      hcopy(r, meta, meta_dev, rows * sizeof(int), cudaMemcpyDeviceToHost);
      hcopy(r, recv, recv_dev, rows * row, cudaMemcpyDeviceToHost);
      CK(r, cudaStreamSynchronize(r->s));
      flexcoll_result_t async = FLEXCOLL_SUCCESS;
      flexcoll_comm_get_async_error(r->comm, &async);
      if (async != FLEXCOLL_SUCCESS) FAIL(me, "%s: async error %s after dispatch", what, flexcoll_get_error_string(async));
      check_dispatch(r, c, mode >= 0, mode == 1, all, counts, meta, recv, what);
      if (route == R_RANDOM && rep == 0) bad_calls(r, m, c, in->T, d.tok, d.ids, d.eout, d.w, d.out);
      if (floats) {
        /* The experts: received rows * 0.5 + (rank + 1); the rest of the buffer poisoned. */
        memset(eout, 0xff, rows * row);
        for (int s = 0; s < n; s++)
          for (int i = 0; i < counts[s] && i < c->max_tokens; i++) {
            const size_t at = ((size_t)s * c->max_tokens + i) * row;
            expert_row(c, me, recv + at, eout + at);
          }
        hcopy(r, d.eout, eout, rows * row, cudaMemcpyHostToDevice);
        CK(r, cudaMemsetAsync(d.out, 0x5a, (size_t)c->max_tokens * row, r->s));
        res = flexcoll_moe_combine(m, d.eout, d.w, d.out, r->s);
        if (res != FLEXCOLL_SUCCESS) {
          FAIL(me, "%s: combine: %s", what, flexcoll_get_last_error(NULL));
          goto done;
        }
        hcopy(r, out, d.out, (size_t)c->max_tokens * row, cudaMemcpyDeviceToHost);
        CK(r, cudaStreamSynchronize(r->s));
        flexcoll_comm_get_async_error(r->comm, &async);
        if (async != FLEXCOLL_SUCCESS) FAIL(me, "%s: async error %s after combine", what, flexcoll_get_error_string(async));
        /* AUTO: ref with the rows as SENTINEL delivers them; NaN matches NaN either way. */
        check_combine(r, c, in, mode != 0, 0, out, what);
        /* Nothing past T written. */
        for (size_t b = (size_t)in->T * row; b < (size_t)c->max_tokens * row; b++)
          if ((unsigned char)out[b] != 0x5a) {
            FAIL(me, "%s: combine wrote past T (byte %zu)", what, b);
            break;
          }
      }
      pthread_barrier_wait(&g_barrier); /* every rank's check read the inputs of this call */
    }
  if (floats) {
    /* The same moe after a combine that was refused: the state is unchanged. */
    expect(me, r->comm, flexcoll_moe_combine(m, d.eout, d.w, d.out, r->s), FLEXCOLL_INVALID_USAGE, "dispatch",
           "combine without a dispatch");
  }
done:
  cudaStreamSynchronize(r->s);
  pthread_barrier_wait(&g_barrier);
  if (m && (res = flexcoll_moe_destroy(m)) != FLEXCOLL_SUCCESS) FAIL(me, "moe_destroy: %s", flexcoll_get_last_error(NULL));
  if (m) expect(me, r->comm, flexcoll_moe_dispatch(m, NULL, NULL, 0, NULL, NULL, NULL, r->s), FLEXCOLL_INVALID_ARGUMENT,
                "live", "dispatch on a destroyed moe");
  pthread_barrier_wait(&g_barrier); /* no kernel of any rank runs while memory is freed */
  case_dev_free(&d);
  for (int s = 0; s < n; s++) free_inputs(&all[s]);
  cudaFreeHost(counts);
  cudaFreeHost(meta);
  cudaFreeHost(recv);
  cudaFreeHost(eout);
  cudaFreeHost(out);
  pthread_barrier_wait(&g_barrier);
}

/* A graph of dispatch, an identity expert (a copy of the receive buffer) and combine, replayed
 * with new routing and tokens written into its device buffers before each replay. */
static void run_graph(rank_t *r, const moe_case_t *c, int replays) {
  const int n = g_nranks, me = r->rank;
  const size_t row = (size_t)c->hidden * esize_of(c->dtype), rows = (size_t)n * c->max_tokens;
  const int T = c->max_tokens / 2 + 1;
  const flexcoll_moe_config_t cfg = case_config(c, n);
  flexcoll_moe_t m = NULL;
  if (flexcoll_moe_create(r->comm, &cfg, &m) != FLEXCOLL_SUCCESS) FAIL(me, "graph moe_create: %s", flexcoll_get_last_error(NULL));
  inputs_t all[MAX_RANKS];
  for (int s = 0; s < n; s++) alloc_inputs(c, &all[s]);
  case_dev_t d;
  case_dev_alloc(r, c, n, &d);
  int *counts = NULL; /* pinned: a captured copy cannot take pageable memory */
  char *out = NULL;
  CK(r, cudaMallocHost((void **)&counts, (size_t)n * sizeof(int)));
  CK(r, cudaMallocHost((void **)&out, (size_t)c->max_tokens * row));
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  int ok = agree_all(r, m != NULL && counts && out);
  if (ok) {
    void *recv_dev = NULL;
    int *counts_dev = NULL;
    CK(r, cudaStreamBeginCapture(r->s, cudaStreamCaptureModeThreadLocal));
    flexcoll_result_t r1 = flexcoll_moe_dispatch(m, d.tok, d.ids, T, &recv_dev, &counts_dev, NULL, r->s);
    if (r1 == FLEXCOLL_SUCCESS) CK(r, cudaMemcpyAsync(d.eout, recv_dev, rows * row, cudaMemcpyDeviceToDevice, r->s));
    flexcoll_result_t r2 = r1 == FLEXCOLL_SUCCESS ? flexcoll_moe_combine(m, d.eout, d.w, d.out, r->s) : r1;
    if (r1 == FLEXCOLL_SUCCESS && counts_dev)
      CK(r, cudaMemcpyAsync(counts, counts_dev, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost, r->s));
    CK(r, cudaMemcpyAsync(out, d.out, (size_t)c->max_tokens * row, cudaMemcpyDeviceToHost, r->s));
    CK(r, cudaStreamEndCapture(r->s, &graph));
    if (r1 != FLEXCOLL_SUCCESS || r2 != FLEXCOLL_SUCCESS) FAIL(me, "captured calls: %s", flexcoll_get_last_error(NULL));
    if (graph) CK(r, cudaGraphInstantiate(&exec, graph, 0));
    ok = exec != NULL && r1 == FLEXCOLL_SUCCESS && r2 == FLEXCOLL_SUCCESS;
  }
  ok = agree_all(r, ok);
  int bad_replays = 0;
  for (int i = 0; ok && i < replays; i++) {
    for (int s = 0; s < n; s++) {
      gen_inputs(c, n, s, i % 4 == 3 ? R_ONE_RANK : R_RANDOM, (uint64_t)i + 1000, &all[s]);
      all[s].T = T; /* baked into the graph */
    }
    inputs_t *in = &all[me];
    case_dev_upload(r, c, in, &d);
    CK(r, cudaGraphLaunch(exec, r->s));
    CK(r, cudaStreamSynchronize(r->s));
    const int before = g_failures;
    for (int s = 0; s < n; s++) {
      int want = 0;
      for (int t = 0; t < T; t++)
        for (int k = 0; k < c->top_k; k++)
          if (rank_of(c, n, all[s].ids[t * c->top_k + k]) == me) { want++; break; }
      if (counts[s] != want) FAIL(me, "replay %d: %d rows from rank %d, want %d", i, counts[s], s, want);
    }
    char what[96];
    snprintf(what, sizeof what, "N=%d graph %s replay %d", n, c->name, i);
    check_combine(r, c, in, mode_of(c) != 0, 1, out, what);
    if (g_failures != before && ++bad_replays > 3) break;
    pthread_barrier_wait(&g_barrier); /* the inputs of this replay are read by every rank */
  }
  flexcoll_result_t async = FLEXCOLL_SUCCESS;
  flexcoll_comm_get_async_error(r->comm, &async);
  if (async != FLEXCOLL_SUCCESS) FAIL(me, "graph: async error %s", flexcoll_get_error_string(async));
  if (bad_replays > 3) exit(1); /* the others wait at the barrier: the failures say enough */
  cudaStreamSynchronize(r->s);
  pthread_barrier_wait(&g_barrier);
  if (m && flexcoll_moe_destroy(m) != FLEXCOLL_SUCCESS) FAIL(me, "graph moe_destroy: %s", flexcoll_get_last_error(NULL));
  pthread_barrier_wait(&g_barrier);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  case_dev_free(&d);
  for (int s = 0; s < n; s++) free_inputs(&all[s]);
  cudaFreeHost(counts);
  cudaFreeHost(out);
  pthread_barrier_wait(&g_barrier);
}

/* Ranks disagreeing on the configuration: every rank gets INVALID_USAGE, nobody hangs. */
static void run_mismatch(rank_t *r) {
  flexcoll_moe_config_t cfg = FLEXCOLL_MOE_CONFIG_INITIALIZER;
  cfg.max_tokens = 8;
  cfg.hidden = r->rank == 0 ? 64 : 128;
  cfg.top_k = 2;
  cfg.num_experts = g_nranks;
  flexcoll_moe_t m = NULL;
  expect(r->rank, r->comm, flexcoll_moe_create(r->comm, &cfg, &m), FLEXCOLL_INVALID_USAGE, "differs",
         "create with configurations that differ");
  if (m) flexcoll_moe_destroy(m);
  pthread_barrier_wait(&g_barrier);
}

static const moe_case_t g_cases[] = {
    {"bf16 fence", FLEXCOLL_BFLOAT16, FLEXCOLL_MOE_FENCE, 256, 4, 2, 64},
    {"bf16 sentinel", FLEXCOLL_BFLOAT16, FLEXCOLL_MOE_SENTINEL, 256, 4, 2, 64},
    {"f32 sentinel top_k 8", FLEXCOLL_FLOAT32, FLEXCOLL_MOE_SENTINEL, 68, 8, 4, 33},
    {"f16 auto top_k 2", FLEXCOLL_FLOAT16, FLEXCOLL_MOE_AUTO, 128, 2, 1, 40},
    {"int8 fence top_k 3", FLEXCOLL_INT8, FLEXCOLL_MOE_FENCE, 64, 3, 3, 50},
    {"f32 fence top_k 15", FLEXCOLL_FLOAT32, FLEXCOLL_MOE_FENCE, 4, 15, 2, 17},
    {"bf16 deepseek fence", FLEXCOLL_BFLOAT16, FLEXCOLL_MOE_FENCE, 7168, 8, 32, 48},
    {"bf16 deepseek sentinel", FLEXCOLL_BFLOAT16, FLEXCOLL_MOE_SENTINEL, 7168, 8, 32, 48},
};
static const moe_case_t g_graph_cases[] = {
    {"bf16 sentinel", FLEXCOLL_BFLOAT16, FLEXCOLL_MOE_SENTINEL, 128, 4, 2, 24},
    {"f32 fence", FLEXCOLL_FLOAT32, FLEXCOLL_MOE_FENCE, 64, 8, 2, 24},
};
static int g_replays;

static int g_ngpus = 1; /* FC_MOE_GPUS: rank r on GPU r % g_ngpus */

static void *rank_main(void *arg) {
  rank_t *r = arg;
  cudaSetDevice(r->rank % g_ngpus);
  cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking);
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = r->rank % g_ngpus;
  config.timeout_ms = 20000; /* a lost peer fails the test, not hangs it */
  if (flexcoll_comm_init_rank(&r->comm, g_nranks, g_id, r->rank, &config) != FLEXCOLL_SUCCESS)
    FAIL(r->rank, "comm_init_rank: %s", flexcoll_get_last_error(NULL));
  if (!agree_all(r, r->comm != NULL)) return NULL;
  const size_t ncases = sizeof g_cases / sizeof g_cases[0];
  for (size_t k = 0; k < ncases; k++) {
    if (r->rank == 0) {
      snprintf(g_phase, sizeof g_phase, "N=%d %s", g_nranks, g_cases[k].name);
      alarm(PHASE_ALARM);
    }
    const int before = g_failures;
    const double t0 = now_s();
    run_case(r, &g_cases[k]);
    if (r->rank == 0)
      fprintf(stderr, TAG " N=%d %-24s %6.2f s %s\n", g_nranks, g_cases[k].name, now_s() - t0,
              g_failures == before ? "PASS" : "FAIL");
  }
  for (size_t k = 0; k < sizeof g_graph_cases / sizeof g_graph_cases[0]; k++) {
    if (r->rank == 0) {
      snprintf(g_phase, sizeof g_phase, "N=%d graph %s", g_nranks, g_graph_cases[k].name);
      alarm(PHASE_ALARM);
    }
    const int before = g_failures;
    const double t0 = now_s();
    run_graph(r, &g_graph_cases[k], g_replays);
    if (r->rank == 0)
      fprintf(stderr, TAG " N=%d graph %-18s %d replays %6.2f s %s\n", g_nranks, g_graph_cases[k].name, g_replays,
              now_s() - t0, g_failures == before ? "PASS" : "FAIL");
  }
  if (r->rank == 0) snprintf(g_phase, sizeof g_phase, "N=%d mismatched configurations", g_nranks);
  run_mismatch(r);
  cudaStreamSynchronize(r->s);
  pthread_barrier_wait(&g_barrier);
  flexcoll_comm_destroy(r->comm);
  cudaStreamDestroy(r->s);
  return NULL;
}

static int run_nranks(int n) {
  g_nranks = n;
  if (flexcoll_get_unique_id(&g_id) != FLEXCOLL_SUCCESS) {
    FAIL(-1, "get_unique_id: %s", flexcoll_get_last_error(NULL));
    return 1;
  }
  const int before = g_failures;
  pthread_barrier_init(&g_barrier, NULL, (unsigned)n);
  rank_t ranks[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  memset(ranks, 0, sizeof ranks);
  for (int q = 0; q < n; q++) {
    ranks[q].rank = q;
    pthread_create(&th[q], NULL, rank_main, &ranks[q]);
  }
  for (int q = 0; q < n; q++) pthread_join(th[q], NULL);
  pthread_barrier_destroy(&g_barrier);
  return g_failures != before;
}

/* ---- failures: a rank that never calls, and abort ---- */

/* The two-rank cases: rank 1 never dispatches (rank 0 times out, or is aborted), or both do and
 * rank 0 names an expert that does not exist. */
typedef enum { PAIR_ABSENT, PAIR_ABORT, PAIR_BAD_ID } pair_case_t;
typedef struct {
  int rank, timeout_ms;
  pair_case_t what;
  flexcoll_unique_id_t id;
} hang_t;
static pthread_barrier_t g_hang_barrier;

/* Both ranks dispatch 4 tokens; rank 0's token 1 names expert num_experts (2) for its second k.
 * The dispatch must end on both (the id goes nowhere); rank 0's async error becomes
 * FLEXCOLL_INVALID_ARGUMENT, its message naming expert_ids; rank 1's stays FLEXCOLL_SUCCESS. */
static void dispatch_bad_id(const hang_t *h, flexcoll_comm_t comm, flexcoll_moe_t m, char *tok, int *ids, int T,
                            cudaStream_t s) {
  static const int bad = 2; /* cfg.num_experts */
  if (h->rank == 0) cudaMemcpyAsync(ids + 1 * 2 + 1 /* token 1, k 1 */, &bad, sizeof bad, cudaMemcpyHostToDevice, s);
  const double t0 = now_s();
  if (flexcoll_moe_dispatch(m, tok, ids, T, NULL, NULL, NULL, s) != FLEXCOLL_SUCCESS)
    FAIL(h->rank, "dispatch with a bad expert id: %s", flexcoll_get_last_error(comm));
  while (cudaStreamQuery(s) == cudaErrorNotReady && now_s() - t0 < 10) usleep(10000);
  if (cudaStreamQuery(s) == cudaErrorNotReady) FAIL(h->rank, "the dispatch with a bad expert id still runs after 10 s");
  flexcoll_result_t async = FLEXCOLL_IN_PROGRESS;
  flexcoll_comm_get_async_error(comm, &async);
  const char *why = flexcoll_get_last_error(comm);
  if (h->rank == 1 && async != FLEXCOLL_SUCCESS)
    FAIL(1, "the peer of a bad expert id: async error %s, not FLEXCOLL_SUCCESS", flexcoll_get_error_string(async));
  if (h->rank == 0 && (async != FLEXCOLL_INVALID_ARGUMENT || !why || !strstr(why, "expert_ids")))
    FAIL(0, "expert id 2 of 2 experts: async error %s (\"%s\"), not FLEXCOLL_INVALID_ARGUMENT naming expert_ids",
         flexcoll_get_error_string(async), why ? why : "");
  else if (h->rank == 0)
    fprintf(stderr, TAG " expert id not below num_experts: FLEXCOLL_INVALID_ARGUMENT (\"%s\"): PASS\n", why);
  if (h->rank == 0) flexcoll_comm_abort(comm);
}

static void *hang_main(void *arg) {
  hang_t *h = arg;
  cudaSetDevice(h->rank % g_ngpus);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = h->rank % g_ngpus;
  config.timeout_ms = h->timeout_ms;
  flexcoll_comm_t comm = NULL;
  flexcoll_moe_t m = NULL;
  const int T = 4;
  char *tok = NULL;
  int *ids = NULL;
  cudaMalloc((void **)&tok, (size_t)T * 64 * 2);
  cudaMalloc((void **)&ids, (size_t)T * 2 * sizeof(int));
  /* On s and waited for: the legacy stream's memset would not order before s's work. */
  cudaMemsetAsync(ids, 0, (size_t)T * 2 * sizeof(int), s); /* expert 0: rank 0 itself */
  cudaMemsetAsync(tok, 0, (size_t)T * 64 * 2, s);
  cudaStreamSynchronize(s);
  if (flexcoll_comm_init_rank(&comm, 2, h->id, h->rank, &config) != FLEXCOLL_SUCCESS)
    FAIL(h->rank, "hang comm_init_rank: %s", flexcoll_get_last_error(NULL));
  flexcoll_moe_config_t cfg = FLEXCOLL_MOE_CONFIG_INITIALIZER;
  cfg.max_tokens = T;
  cfg.hidden = 64;
  cfg.top_k = 2;
  cfg.num_experts = 2;
  if (comm && flexcoll_moe_create(comm, &cfg, &m) != FLEXCOLL_SUCCESS)
    FAIL(h->rank, "hang moe_create: %s", flexcoll_get_last_error(NULL));
  pthread_barrier_wait(&g_hang_barrier);
  if (h->what == PAIR_BAD_ID && m) {
    dispatch_bad_id(h, comm, m, tok, ids, T, s);
  } else if (h->rank == 0 && m) {
    const double t0 = now_s(), limit = h->timeout_ms / 1000.0 + 10;
    flexcoll_result_t res = flexcoll_moe_dispatch(m, tok, ids, T, NULL, NULL, NULL, s);
    if (res != FLEXCOLL_SUCCESS) FAIL(0, "hang dispatch: %s", flexcoll_get_last_error(NULL));
    if (h->what == PAIR_ABORT) {
      usleep(500000);
      flexcoll_comm_abort(comm);
      while (cudaStreamQuery(s) == cudaErrorNotReady && now_s() - t0 < 10) usleep(10000);
      if (cudaStreamQuery(s) == cudaErrorNotReady) FAIL(0, "abort: the dispatch still waits 10 s after the abort");
      else fprintf(stderr, TAG " abort released the waiting dispatch after %.2f s: PASS\n", now_s() - t0);
    } else {
      flexcoll_result_t async = FLEXCOLL_SUCCESS;
      while (now_s() - t0 < limit) {
        flexcoll_comm_get_async_error(comm, &async);
        if (async != FLEXCOLL_SUCCESS) break;
        if (cudaStreamQuery(s) == cudaSuccess) {
          FAIL(0, "the dispatch finished without rank 1");
          break;
        }
        usleep(10000);
      }
      if (async != FLEXCOLL_TIMEOUT)
        FAIL(0, "async error %s after %.2f s, not FLEXCOLL_TIMEOUT within %.0f s", flexcoll_get_error_string(async),
             now_s() - t0, limit);
      else fprintf(stderr, TAG " rank 1 absent: FLEXCOLL_TIMEOUT after %.2f s (timeout %d ms): PASS\n", now_s() - t0,
                   h->timeout_ms);
      /* The kernel's own bound, not only the host's watch over the stream: it ends unaborted. */
      while (cudaStreamQuery(s) == cudaErrorNotReady && now_s() - t0 < limit) usleep(10000);
      if (cudaStreamQuery(s) == cudaErrorNotReady) FAIL(0, "the timed-out dispatch still runs %.0f s after it began", limit);
      flexcoll_comm_abort(comm);
    }
  }
  pthread_barrier_wait(&g_hang_barrier);
  if (h->rank == 1 && comm) flexcoll_comm_abort(comm);
  const double t1 = now_s();
  while (cudaStreamQuery(s) == cudaErrorNotReady && now_s() - t1 < 10) usleep(10000);
  if (m && flexcoll_moe_destroy(m) != FLEXCOLL_SUCCESS)
    FAIL(h->rank, "moe_destroy after abort: %s", flexcoll_get_last_error(NULL));
  pthread_barrier_wait(&g_hang_barrier);
  if (comm) flexcoll_comm_destroy(comm);
  cudaFree(tok);
  cudaFree(ids);
  cudaStreamDestroy(s);
  return NULL;
}

static int run_pair(int timeout_ms, pair_case_t what) {
  snprintf(g_phase, sizeof g_phase, "%s",
           what == PAIR_ABORT ? "abort releases" : what == PAIR_BAD_ID ? "bad expert id" : "rank 1 never calls");
  alarm(PHASE_ALARM);
  const int before = g_failures;
  hang_t h[2] = {{.rank = 0, .timeout_ms = timeout_ms, .what = what}, {.rank = 1, .timeout_ms = timeout_ms, .what = what}};
  if (flexcoll_get_unique_id(&h[0].id) != FLEXCOLL_SUCCESS) return 1;
  h[1].id = h[0].id;
  pthread_barrier_init(&g_hang_barrier, NULL, 2);
  pthread_t th[2];
  for (int q = 0; q < 2; q++) pthread_create(&th[q], NULL, hang_main, &h[q]);
  for (int q = 0; q < 2; q++) pthread_join(th[q], NULL);
  pthread_barrier_destroy(&g_hang_barrier);
  return g_failures != before;
}

#endif /* FC_TEST_CUDA */

int main(void) {
  setvbuf(stderr, NULL, _IONBF, 0);
  signal(SIGALRM, on_alarm);
  /* Ranks of one process on one GPU share its hardware queues: one per rank's stream, or a rank's
   * kernel can wait behind a peer's that waits for it (docs/ARCHITECTURE.md, "Hardware queues").
   * Set before anything touches CUDA. */
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const char *q = getenv("FC_MOE_QUICK");
  g_quick = q && *q && strcmp(q, "0") != 0;
  int failed = run_host_checks();
#ifndef FC_TEST_CUDA
  fprintf(stderr, TAG " %s (host-only build: no device part)\n", failed ? "FAILED" : "passed");
  return failed ? 1 : 0;
#else
  int ngpus = 0;
  cudaError_t ce = cudaGetDeviceCount(&ngpus);
  if (ce != cudaSuccess || ngpus == 0) {
    fprintf(stderr, TAG " no GPU (%s): device part skipped\n", ce != cudaSuccess ? cudaGetErrorString(ce) : "no device");
    return failed ? 1 : 77;
  }
  fc_test_gpu_serialize(TAG); /* one GPU test at a time under make check -j */
  const char *gv = getenv("FC_MOE_GPUS");
  if (gv && *gv) {
    g_ngpus = atoi(gv);
    if (g_ngpus < 1 || g_ngpus > ngpus) {
      fprintf(stderr, TAG " FC_MOE_GPUS=%s: between 1 and the %d visible GPU(s)\n", gv, ngpus);
      return 1;
    }
  }
  const char *rv = getenv("FC_MOE_REPLAYS");
  g_replays = rv && *rv ? atoi(rv) : g_quick ? 1000 : 10000;
  const char *list = getenv("FC_MOE_RANKS");
  if (!list || !*list) list = "2,4,8";
  char buf[64];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    const int n = atoi(tok);
    if (n < 2 || n > MAX_RANKS) {
      fprintf(stderr, TAG " FC_MOE_RANKS: %s is not a rank count in [2, %d]\n", tok, MAX_RANKS);
      return 1;
    }
    failed |= run_nranks(n);
  }
  failed |= run_pair(2000, PAIR_ABSENT);
  failed |= run_pair(600000, PAIR_ABORT);
  failed |= run_pair(20000, PAIR_BAD_ID);
  alarm(0);
  fprintf(stderr, TAG " %s (%d failures%s)\n", failed ? "FAILED" : "passed", g_failures, g_quick ? ", quick" : "");
  return failed ? 1 : 0;
#endif
}
