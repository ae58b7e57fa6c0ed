/* perf_moe.c — flexcoll-perf --coll moe_dispatch|moe_combine: the time of one MoE dispatch (and
 * of one combine) for T tokens per rank, T = 1, f, f^2 ... up to --tokens, against the same
 * exchange through flexcoll_alltoall in the same run: an alltoall of the per-peer counts, then
 * one of the rows with every rank's block padded to T rows (what an alltoall needs when any
 * routing may send all T tokens to one peer).
 *
 * Routing: expert_ids[t][k] uniform over the experts (a token may meet the same rank twice; it
 * is sent once per rank), from a seed of (rank, T, t, k), so every rank knows everybody's and
 * checks its received counts.  Weights 1/top_k, expert outputs zero (combine's time does not
 * depend on the values; tests/test_moe checks them).  Without -G: iters calls back to back, the
 * time of one the maximum over ranks; -G N: the iters calls captured into a graph launched N
 * times.  moe_combine's time is that of dispatch + combine less dispatch alone (a combine needs
 * its dispatch).  algbw: this rank's token rows, once per destination rank, over the time. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "perf.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

typedef struct {
  const perf_opts_t *o;
  flexcoll_comm_t comm;
  int rank, nranks, device, T, status;
  void *stream;
  flexcoll_moe_t moe;
  void *tok, *eout, *out, *a2a_send, *a2a_recv, *cnt_send, *cnt_recv;
  int *ids;
  float *w;
  size_t row;
} moe_run_t;

/* A host allreduce on the communicator: barrier and maximum in one (as perf_run.c). */
static double max_all(moe_run_t *m, double v) {
  double out = v;
  if (flexcoll_allreduce(&v, &out, 1, FLEXCOLL_FLOAT64, FLEXCOLL_MAX, m->comm, NULL) != FLEXCOLL_SUCCESS) m->status = 1;
  return out;
}

static int expert_of(const perf_opts_t *o, int rank, int T, int t, int k) {
  return (int)(mix(((uint64_t)rank << 48) ^ ((uint64_t)T << 24) ^ ((uint64_t)t << 4) ^ (uint64_t)k) %
               (uint64_t)o->moe_experts);
}

/* The bodies that are timed: 0 on success. */
enum { B_DISPATCH, B_PAIR, B_ALLTOALL };
static int body(moe_run_t *m, int what) {
  if (what == B_ALLTOALL)
    return flexcoll_alltoall(m->cnt_send, m->cnt_recv, 1, FLEXCOLL_INT32, m->comm, m->stream) ||
           flexcoll_alltoall(m->a2a_send, m->a2a_recv, (size_t)m->T * m->row, FLEXCOLL_UINT8, m->comm, m->stream);
  if (flexcoll_moe_dispatch(m->moe, m->tok, m->ids, m->T, NULL, NULL, NULL, m->stream)) return 1;
  return what == B_PAIR && flexcoll_moe_combine(m->moe, m->eout, m->w, m->out, m->stream);
}

/* The time of one body, the maximum over ranks; 0 after a failure (reported). */
static double timed(moe_run_t *m, int what) {
  const perf_opts_t *o = m->o;
  int err = 0;
  for (int i = 0; i < o->warmup && !err; i++) err = body(m, what);
  err = perf_stream_sync(m->stream, m->device) || err;
  double t = 0;
  char why[256] = "";
  if (o->graph && !err) {
    void *graph = NULL;
    err = perf_graph_begin(m->stream, why, sizeof why);
    for (int i = 0; i < o->iters && !err; i++)
      if (body(m, what)) err = snprintf(why, sizeof why, "capturing: %s", flexcoll_get_last_error(m->comm)) > 0;
    char end_why[128] = "";
    if (perf_graph_end(m->stream, &graph, end_why, sizeof end_why) && !err) {
      snprintf(why, sizeof why, "%s", end_why);
      err = 1;
    }
    const int skip = max_all(m, err) > 0; /* nobody launches when a rank has no graph */
    const double t0 = now_s();
    for (int i = 0; i < o->graph && !skip && !err; i++) err = perf_graph_launch(graph, m->stream);
    err = perf_stream_sync(m->stream, m->device) || err || skip;
    t = (now_s() - t0) / ((double)o->iters * o->graph);
    perf_graph_destroy(graph);
  } else if (!err) {
    max_all(m, 0);
    const double t0 = now_s();
    for (int i = 0; i < o->iters && !err; i++) err = body(m, what);
    err = perf_stream_sync(m->stream, m->device) || err;
    t = (now_s() - t0) / o->iters;
  }
  if (err) {
    fprintf(stderr, "flexcoll-perf: rank %d: %s with %d tokens failed: %s\n", m->rank,
            what == B_ALLTOALL ? "the alltoall baseline" : what == B_PAIR ? "moe dispatch + combine" : "moe dispatch", m->T,
            why[0] ? why : flexcoll_get_last_error(m->comm));
    m->status = 1;
  }
  t = max_all(m, err ? -1 : t);
  return t > 0 ? t : 0;
}

/* Rows every rank's dispatch should bring here for T tokens, against what it did: wrong sources. */
static int check_counts(moe_run_t *m) {
  const perf_opts_t *o = m->o;
  const int per_rank = o->moe_experts / m->nranks;
  int *counts_dev = NULL, got[1024], wrong = 0;
  /* The copy follows the dispatch on the stream and waits for both. */
  if (flexcoll_moe_dispatch(m->moe, m->tok, m->ids, m->T, NULL, &counts_dev, NULL, m->stream) ||
      perf_copy(got, counts_dev, (size_t)m->nranks * sizeof(int), m->device, m->stream))
    return m->nranks;
  for (int s = 0; s < m->nranks; s++) {
    int want = 0;
    for (int t = 0; t < m->T; t++)
      for (int k = 0; k < o->moe_top_k; k++)
        if (expert_of(o, s, m->T, t, k) / per_rank == m->rank) { want++; break; }
    wrong += got[s] != want;
  }
  /* A combine returns this dispatch, so that the timed loops start from a clean pair. */
  if (perf_coll_from_name(o->coll) == PERF_MOE_COMBINE &&
      (flexcoll_moe_combine(m->moe, m->eout, m->w, m->out, m->stream) || perf_stream_sync(m->stream, m->device)))
    wrong++;
  return wrong;
}

int perf_moe_sweep(const perf_opts_t *o, flexcoll_comm_t comm, int rank, int nranks, int device, void *stream) {
  const int combine = perf_coll_from_name(o->coll) == PERF_MOE_COMBINE;
  const flexcoll_datatype_t dt = o->dtype_given ? o->dtype : FLEXCOLL_BFLOAT16;
  moe_run_t m = {.o = o, .comm = comm, .rank = rank, .nranks = nranks, .device = device, .stream = stream};
  m.row = (size_t)o->moe_hidden * fc_dtype_size(dt);
  const size_t maxT = (size_t)o->moe_tokens, rows = (size_t)nranks * maxT;
  if (nranks > 1024) {
    if (rank == 0) fprintf(stderr, "flexcoll-perf: --coll %s: at most 1024 ranks\n", o->coll);
    return 1;
  }
  flexcoll_moe_config_t cfg = FLEXCOLL_MOE_CONFIG_INITIALIZER;
  cfg.max_tokens = o->moe_tokens;
  cfg.hidden = o->moe_hidden;
  cfg.dtype = dt;
  cfg.top_k = o->moe_top_k;
  cfg.num_experts = o->moe_experts;
  cfg.sync = o->moe_sync;
  if (flexcoll_moe_create(comm, &cfg, &m.moe) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "flexcoll-perf: rank %d: flexcoll_moe_create: %s\n", rank, flexcoll_get_last_error(NULL));
    return 1;
  }
  m.tok = perf_alloc(maxT * m.row, device);
  m.ids = perf_alloc(maxT * (size_t)o->moe_top_k * sizeof(int), device);
  m.w = perf_alloc(maxT * (size_t)o->moe_top_k * sizeof(float), device);
  m.eout = perf_alloc(rows * m.row, device);
  m.out = perf_alloc(maxT * m.row, device);
  m.a2a_send = perf_alloc(rows * m.row, device);
  m.a2a_recv = perf_alloc(rows * m.row, device);
  m.cnt_send = perf_alloc((size_t)nranks * sizeof(int), device);
  m.cnt_recv = perf_alloc((size_t)nranks * sizeof(int), device);
  /* Zeros for the device buffers, then the weights; the routing after them. */
  const size_t wbytes = maxT * (size_t)o->moe_top_k * sizeof(float);
  size_t host_bytes = rows * m.row > wbytes ? rows * m.row : wbytes;
  if (host_bytes < (size_t)nranks * sizeof(int)) host_bytes = (size_t)nranks * sizeof(int);
  char *host = calloc(1, host_bytes + maxT * (size_t)o->moe_top_k * sizeof(int));
  int ok = m.tok && m.ids && m.w && m.eout && m.out && m.a2a_send && m.a2a_recv && m.cnt_send && m.cnt_recv && host;
  if (ok) { /* zeros everywhere: tokens, expert outputs, the baseline's buffers */
    ok = !perf_copy(m.eout, host, rows * m.row, device, m.stream) &&
         !perf_copy(m.a2a_send, host, rows * m.row, device, m.stream) &&
         !perf_copy(m.tok, host, maxT * m.row, device, m.stream) &&
         !perf_copy(m.cnt_send, host, (size_t)nranks * sizeof(int), device, m.stream);
    float *w = (float *)host;
    for (size_t i = 0; i < maxT * (size_t)o->moe_top_k; i++) w[i] = 1.0f / (float)o->moe_top_k;
    ok = ok && !perf_copy(m.w, w, maxT * (size_t)o->moe_top_k * sizeof(float), device, m.stream);
  }
  if (max_all(&m, !ok) > 0) {
    if (!ok) fprintf(stderr, "flexcoll-perf: rank %d: allocating the MoE buffers (%zu tokens of %zu bytes) failed\n", rank,
                     maxT, m.row);
    m.status = 1;
  }
  if (rank == 0 && !m.status) {
    printf("# flexcoll-perf --coll %s: %d ranks, hidden %d %s (%zu bytes a token), top_k %d, %d experts, sync %s%s\n",
           o->coll, nranks, o->moe_hidden, fc_dtype_name(dt), m.row, o->moe_top_k, o->moe_experts,
           o->moe_sync == FLEXCOLL_MOE_FENCE ? "fence" : o->moe_sync == FLEXCOLL_MOE_SENTINEL ? "sentinel" : "auto",
           o->graph ? ", CUDA graph launches" : "");
    printf("# baseline: flexcoll_alltoall of the counts, then of T rows per peer (padded)\n");
    printf("#%9s %11s %13s %13s %13s %11s %11s %7s\n", "tokens", "rows_sent", "dispatch(us)", "combine(us)",
           "alltoall(us)", "algbw(GB/s)", "vs_a2a", "wrong");
  }
  const int per_rank = o->moe_experts / (nranks > 0 ? nranks : 1);
  int wrong_total = 0;
  for (size_t T = 1; T <= maxT && !m.status;) {
    m.T = (int)T;
    int *ids = (int *)(host + host_bytes);
    size_t sent = 0;
    for (int t = 0; t < m.T; t++) {
      int dests = 0; /* distinct destination ranks of this token: it is sent once to each */
      for (int k = 0; k < o->moe_top_k; k++) {
        const int e = expert_of(o, rank, m.T, t, k), d = e / per_rank;
        ids[t * o->moe_top_k + k] = e;
        int dup = 0;
        for (int j = 0; j < k; j++) dup |= ids[t * o->moe_top_k + j] / per_rank == d;
        dests += !dup;
      }
      sent += (size_t)dests;
    }
    if (perf_copy(m.ids, ids, (size_t)m.T * o->moe_top_k * sizeof(int), device, m.stream)) m.status = 1;
    const int wrong = o->check && !m.status ? check_counts(&m) : 0;
    const double td = timed(&m, B_DISPATCH);
    const double tp = combine ? timed(&m, B_PAIR) : 0;
    const double ta = timed(&m, B_ALLTOALL);
    const double sent_max = max_all(&m, (double)sent);
    const int wrong_max = (int)max_all(&m, (double)wrong);
    wrong_total += wrong_max;
    if (rank == 0) {
      const double tc = combine && tp > td ? tp - td : 0;
      const double tm = combine ? tc : td;
      char ctime[32] = "-";
      if (combine) snprintf(ctime, sizeof ctime, "%.2f", tc * 1e6);
      printf(" %9zu %11.0f %13.2f %13s %13.2f %11.2f %11.2f %7d\n", T, sent_max, td * 1e6, ctime, ta * 1e6,
             tm > 0 ? sent_max * (double)m.row / tm / 1e9 : 0, tm > 0 ? ta / tm : 0, wrong_max);
    }
    size_t next = (size_t)((double)T * o->step);
    T = next > T ? next : T + 1;
  }
  if (rank == 0) printf("# %s: %d wrong counts\n", wrong_total ? "FAILED" : "done", wrong_total);
  if (flexcoll_moe_destroy(m.moe) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "flexcoll-perf: rank %d: flexcoll_moe_destroy: %s\n", rank, flexcoll_get_last_error(NULL));
    m.status = 1;
  }
  perf_free(m.tok, device);
  perf_free(m.ids, device);
  perf_free(m.w, device);
  perf_free(m.eout, device);
  perf_free(m.out, device);
  perf_free(m.a2a_send, device);
  perf_free(m.a2a_recv, device);
  perf_free(m.cnt_send, device);
  perf_free(m.cnt_recv, device);
  free(host);
  return m.status || wrong_total;
}
