/* test_coll.c — correctness of every collective through the public API, on host memory.
 *
 * Every collective (allreduce, allgather, reduce_scatter, broadcast, reduce, and alltoall) x
 * algorithm (FLEXCOLL_ALGO=ring and =tree; reduce_scatter and alltoall are ring only; =exchange
 * for all of them, 2 to 8 ranks) x datatype
 * (all 10) x op (all 5 where the collective reduces) x count {0, 1, 7} (and 1000003 for float32,
 * int8 and bfloat16 with sum/avg/max) x root {0, nranks-1} x in place / out of place, with 2, 3,
 * 4 and 8 ranks as forked processes, followed by flexcoll_send/recv patterns (ring shift, all
 * pairs, blocking pairs, bystanders); each rank loops over all the
 * combinations inside one communicator and compares with a reference it computes itself
 * (harness.h).  Then a representative subset at 64 MiB with 4 ranks, a subset through
 * flexcoll_comm_init_all threads (2 and 3 ranks), several communicators driven from one thread
 * inside flexcoll_group_start/end (init_all, init_rank inside a group, two communicators in one
 * group, nesting), processes that each drive two communicators in groups, and a rank that
 * destroys its communicator while its peers still finish (early_destroy).
 *
 * Every matrix also runs with FLEXCOLL_ALGO unset, where the tuner sends every host collective of
 * ranks on one host through the communicator's shared-memory segment (lib/host/shm.c); and
 * shm_bitwise compares that path's results bit for bit with the exchange over UCX
 * (FLEXCOLL_ALGO=exchange), also with every allreduce split and slots of 4 KiB (many rounds per
 * call), for 2, 3, 4 and 8 ranks as processes and 2 and 3 as threads: every collective x datatype
 * x op x counts 0, 1, 7, 1001, 8003 (and 70001 for four types), in place and out of place.
 *
 * Every output buffer is poisoned (0xA5) before each call and has poisoned guards on both sides
 * that must survive; inputs must be unchanged; a non-root's recvbuf in reduce must stay poisoned
 * (or is NULL); a non-root's sendbuf in broadcast is ignored (or NULL).
 *
 * Environment: FC_TEST_SEED reproduces a run's data (printed with every failure);
 * CK_RUN_CASE=<tcase> runs one case (procs2, procs3, procs4, procs8, procs_shm, big64, threads,
 * shm_bitwise, shm_bad_slot, group, multicomm, early_destroy); FC_TEST_NO_BIG=1 leaves out the 1000003-element calls;
 * FC_TEST_VERBOSE=1 times every large call (2: every call).  Timing lines go to stderr.
 */
#define _GNU_SOURCE
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "harness.h"
#include "pcall.h"

#define BIT(x) (1u << (x))
#define ALL_COLLS (BIT(NCOLLS) - 1)
#define ALL_DTYPES (BIT(FLEXCOLL_NUM_DATATYPES) - 1)
#define ALL_OPS (BIT(FLEXCOLL_NUM_OPS) - 1)
#define BIG_COUNT 1000003
#define MIB64 (64u << 20)

/* ---- the matrix: every rank runs the same sequence of calls ----------------------------------- */

typedef struct {
  unsigned colls, dtypes, ops;
  size_t counts[6];
  int ncounts;
  /* One more, larger size for a subset: big elements (big_bytes == 0) or big_bytes bytes for the
   * larger of the two buffers (allgather: recvbuf, reduce_scatter: sendbuf). */
  size_t big, big_bytes;
  unsigned big_colls, big_dtypes, big_ops, big_modes;
  int big_one_root;  /* big calls: only root nranks-1 */
  int both_roots;    /* roots 0 and nranks-1, else nranks-1 only */
  unsigned modes;    /* BIT(0): out of place, BIT(1): in place */
  int p2p;           /* also flexcoll_send/recv (p2p_phase) */
} matrix_t;

typedef struct {
  double t[NCOLLS];
  long calls[NCOLLS];
} coll_times_t;

static int verbose(void) {
  static int v = -1;
  if (v < 0) v = getenv("FC_TEST_VERBOSE") ? atoi(getenv("FC_TEST_VERBOSE")) : 0;
  return v;
}

/* Where run_one writes a digest of every result (FC_TEST_DIGESTS=<dir>/<run>, set for the ranks
 * of the bitwise comparisons: <dir>/<run>.rank<q>), NULL when it does not; per thread, since
 * ranks may be threads. */
static __thread FILE *digests;

static void write_digest(const pcall_t *p) {
  const size_t es = fc_dtype_size(p->dtype), n = (size_t)p->nranks;
  size_t elems = p->coll == C_ALLGATHER || p->coll == C_ALLTOALL ? n * p->count : p->count;
  if (p->coll == C_REDUCE && p->rank != p->root) elems = 0; /* nothing to compare */
  fprintf(digests, "%s %s %s count %zu %s %016llx\n", coll_names[p->coll], fc_dtype_name(p->dtype),
          coll_reduces(p->coll) ? fc_op_name(p->op) : "-", p->count, p->inplace ? "in" : "out",
          (unsigned long long)hx_digest(elems ? p->recv : NULL, elems * es));
}

/* Run one call on r->comm and check it.  Returns 0, or -1 when the library returned an error (the
 * ranks may then be out of step: stop). */
static int run_one(hx_rank_t *r, pcall_t *p, uint64_t call, coll_times_t *ct) {
  double t0 = hx_now();
  pcall_describe(r->what, sizeof r->what, p);
  if (pcall_prepare(r, p, r->seed, call) != 0) {
    pcall_free(p);
    return -1;
  }
  pcall_describe(r->what, sizeof r->what, p);
  flexcoll_result_t res = pcall_issue(p, r->comm);
  if (!hx_ok(r, res, r->comm, coll_names[p->coll])) {
    pcall_free(p);
    return -1;
  }
  if (digests) write_digest(p);
  pcall_check(r, p);
  double t = hx_now() - t0;
  ct->t[p->coll] += t;
  ct->calls[p->coll]++;
  if (verbose() && r->rank == 0 && (p->count >= 10000 || verbose() > 1))
    fprintf(stderr, "[%s] rank 0: %s: %.3f s\n", r->label, r->what, t);
  return 0;
}

/* ---- point to point: flexcoll_send / flexcoll_recv ------------------------------------------- */

/* A transfer from rank s to rank d carries the input of virtual rank s*n+d, so every pair's data
 * differs.  Each pattern is followed by an allreduce that checks the ranks are still in step. */
typedef struct {
  hx_buf_t b;
  void *p;
  int peer, is_send;
} xfer_t;

static int p2p_xfer_prepare(hx_rank_t *r, xfer_t *x, const hx_data_t *d, int peer, int is_send, size_t count) {
  const int n = r->nranks;
  memset(x, 0, sizeof *x);
  x->peer = peer;
  x->is_send = is_send;
  if (!(x->p = hx_buf_new(r, &x->b, count * fc_dtype_size(d->dtype)))) return -1;
  if (is_send) hx_fill(d, r->rank * n + peer, x->p, 0, count);
  return 0;
}

static flexcoll_result_t p2p_xfer_issue(hx_rank_t *r, xfer_t *x, const hx_data_t *d, size_t count) {
  if (x->is_send) return flexcoll_send(x->p, count, d->dtype, x->peer, r->comm, NULL);
  return flexcoll_recv(x->p, count, d->dtype, x->peer, r->comm, NULL);
}

static void p2p_xfer_check(hx_rank_t *r, xfer_t *x, const hx_data_t *d, size_t count) {
  const int n = r->nranks;
  char w[96];
  if (x->is_send) {
    snprintf(w, sizeof w, "sendbuf to rank %d (must not change)", x->peer);
    hx_check_input(r, w, d, r->rank * n + x->peer, x->p, 0, count);
  } else {
    snprintf(w, sizeof w, "recvbuf from rank %d", x->peer);
    hx_check_input(r, w, d, x->peer * n + r->rank, x->p, 0, count);
  }
  hx_buf_check_guards(r, w, &x->b);
  hx_buf_free(&x->b);
}

static int in_step(hx_rank_t *r, const char *after) {
  int32_t in = r->rank, out = -1;
  snprintf(r->what, sizeof r->what, "allreduce int32 sum count 1 after %s", after);
  if (!hx_ok(r, flexcoll_allreduce(&in, &out, 1, FLEXCOLL_INT32, FLEXCOLL_SUM, r->comm, NULL), r->comm, "allreduce"))
    return -1;
  if (out != r->nranks * (r->nranks - 1) / 2) hx_fail(r, "result %d, expected %d", (int)out, r->nranks * (r->nranks - 1) / 2);
  return 0;
}

/* Patterns: 0 ring shift (send to rank+1, receive from rank-1) plus a message to itself, in a
 * group; 1 every rank to every rank (itself included) in one group; 2 pairs (2k, 2k+1) outside a
 * group, the even rank sending first (an odd rank count leaves the last rank out: it calls
 * nothing); 3 only ranks 0 and n-1 exchange, in a group, the others call nothing. */
static int p2p_phase(hx_rank_t *r, uint64_t *call, size_t count, flexcoll_datatype_t dt) {
  const int n = r->nranks, me = r->rank;
  static const char *const names[4] = {"ring shift + self", "all pairs", "blocking pairs", "ranks 0 and n-1 only"};
  xfer_t *x = calloc((size_t)(2 * n + 2), sizeof *x);
  if (!x) return hx_fail(r, "out of memory");
  for (int pat = 0; pat < 4; pat++) {
    hx_data_t d = {dt, HX_GEN_BITS, r->seed, (*call)++, n * n};
    snprintf(r->what, sizeof r->what, "send/recv %s: %s count %zu (call %" PRIu64 ")", names[pat], fc_dtype_name(dt),
             count, d.call);
    int nx = 0, rc = 0, group = pat != 2;
    switch (pat) {
      case 0:
        rc |= p2p_xfer_prepare(r, &x[nx++], &d, (me + 1) % n, 1, count);
        rc |= p2p_xfer_prepare(r, &x[nx++], &d, me, 1, count);
        rc |= p2p_xfer_prepare(r, &x[nx++], &d, (me + n - 1) % n, 0, count);
        rc |= p2p_xfer_prepare(r, &x[nx++], &d, me, 0, count);
        break;
      case 1:
        for (int q = 0; q < n; q++) rc |= p2p_xfer_prepare(r, &x[nx++], &d, q, 1, count);
        for (int q = 0; q < n; q++) rc |= p2p_xfer_prepare(r, &x[nx++], &d, (me + n - q) % n, 0, count);
        break;
      case 2:
        if ((me ^ 1) < n) {
          rc |= p2p_xfer_prepare(r, &x[nx++], &d, me ^ 1, !(me & 1), count);
          rc |= p2p_xfer_prepare(r, &x[nx++], &d, me ^ 1, me & 1, count);
        }
        break;
      default:
        if (me == 0 || me == n - 1) {
          rc |= p2p_xfer_prepare(r, &x[nx++], &d, n - 1 - me, 1, count);
          rc |= p2p_xfer_prepare(r, &x[nx++], &d, n - 1 - me, 0, count);
        }
        break;
    }
    if (rc) { free(x); return 1; }
    int ok = 1;
    if (group && nx) ok &= hx_ok(r, flexcoll_group_start(), NULL, "flexcoll_group_start");
    for (int i = 0; i < nx && ok; i++)
      ok &= hx_ok(r, p2p_xfer_issue(r, &x[i], &d, count), r->comm, x[i].is_send ? "flexcoll_send" : "flexcoll_recv");
    if (group && nx) ok &= hx_ok(r, flexcoll_group_end(), r->comm, "flexcoll_group_end");
    if (!ok) { free(x); return 1; }
    for (int i = 0; i < nx; i++) p2p_xfer_check(r, &x[i], &d, count);
    if (in_step(r, names[pat])) { free(x); return 1; }
  }
  free(x);
  return 0;
}

static int matrix_calls(hx_rank_t *r);

static int matrix_rank(hx_rank_t *r) {
  const char *dpath = getenv("FC_TEST_DIGESTS");
  if (dpath) {
    char path[400];
    snprintf(path, sizeof path, "%s.rank%d", dpath, r->rank);
    if (!(digests = fopen(path, "w"))) return hx_fail(r, "cannot write %s", path);
  }
  int rc = matrix_calls(r);
  if (digests) fclose(digests);
  digests = NULL;
  return rc;
}

static int matrix_calls(hx_rank_t *r) {
  const matrix_t *m = r->arg;
  const int n = r->nranks;
  const int tree = r->algo && strcmp(r->algo, "tree") == 0;
  const int no_big = getenv("FC_TEST_NO_BIG") && atoi(getenv("FC_TEST_NO_BIG"));
  coll_times_t ct;
  memset(&ct, 0, sizeof ct);
  uint64_t call = 0;
  double t0 = hx_now();
  for (int c = 0; c < NCOLLS; c++) {
    if (!(m->colls & BIT(c))) continue;
    if (coll_ring_only(c) && tree) continue; /* FLEXCOLL_ALGO=tree would run the ring again */
    for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt++) {
      for (int op = 0; op < FLEXCOLL_NUM_OPS; op++) {
        if (!coll_reduces(c) && op > 0) continue; /* one pass for allgather and broadcast */
        int nsizes = m->ncounts + ((m->big || m->big_bytes) && !no_big);
        for (int k = 0; k < nsizes; k++) {
          int big = k == m->ncounts;
          size_t count;
          if (!big) {
            if (!(m->dtypes & BIT(dt)) || (coll_reduces(c) && !(m->ops & BIT(op)))) continue;
            count = m->counts[k];
          } else {
            if (!(m->big_colls & BIT(c)) || !(m->big_dtypes & BIT(dt))) continue;
            if (c == C_ALLTOALL && dt != FLEXCOLL_FLOAT32) continue; /* n x count each: one is enough */
            if (coll_reduces(c) && !(m->big_ops & BIT(op))) continue;
            count = m->big;
            if (m->big_bytes) {
              count = m->big_bytes / fc_dtype_size((flexcoll_datatype_t)dt);
              if (c == C_ALLGATHER || c == C_REDUCE_SCATTER) count /= (size_t)n;
            }
          }
          for (int ri = 0; ri < 2; ri++) {
            int root = ri == 0 ? n - 1 : 0;
            if (ri == 1 && (!coll_rooted(c) || !m->both_roots || (big && m->big_one_root) || n == 1)) continue;
            for (int ip = 0; ip < 2; ip++) {
              if (!((big ? m->big_modes : m->modes) & BIT(ip))) continue;
              pcall_t p = {.coll = c, .dtype = (flexcoll_datatype_t)dt, .op = (flexcoll_op_t)op, .count = count,
                           .root = coll_rooted(c) ? root : 0, .inplace = ip, .rank = r->rank, .nranks = n};
              if (run_one(r, &p, call++, &ct) != 0) return 1;
            }
          }
        }
      }
    }
  }
  if (m->p2p) {
    double tp = hx_now();
    static const size_t p2p_counts[] = {0, 1, 7, 1000, 262147};
    for (size_t k = 0; k < sizeof p2p_counts / sizeof p2p_counts[0]; k++)
      for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt++) {
        if (k == 4 && dt != FLEXCOLL_FLOAT32) continue;
        if (p2p_phase(r, &call, p2p_counts[k], (flexcoll_datatype_t)dt)) return 1;
      }
    if (r->rank == 0) fprintf(stderr, "[%s] rank 0: send/recv %.2f s\n", r->label, hx_now() - tp);
  }
  r->what[0] = '\0';
  if (r->rank == 0) {
    char line[512];
    int len = snprintf(line, sizeof line, "[%s] rank 0: %" PRIu64 " calls in %.2f s:", r->label, call, hx_now() - t0);
    for (int c = 0; c < NCOLLS && len < (int)sizeof line; c++)
      if (ct.calls[c])
        len += snprintf(line + len, sizeof line - (size_t)len, " %s %ld/%.2fs", coll_names[c], ct.calls[c], ct.t[c]);
    fprintf(stderr, "%s\n", line);
  }
  return 0;
}

/* The full matrix of the forked-process cases. */
static const matrix_t full_matrix = {
    .colls = ALL_COLLS, .dtypes = ALL_DTYPES, .ops = ALL_OPS, .counts = {0, 1, 7}, .ncounts = 3,
    .big = BIG_COUNT, .big_colls = ALL_COLLS,
    .big_dtypes = BIT(FLEXCOLL_FLOAT32) | BIT(FLEXCOLL_INT8) | BIT(FLEXCOLL_BFLOAT16),
    .big_ops = BIT(FLEXCOLL_SUM) | BIT(FLEXCOLL_AVG) | BIT(FLEXCOLL_MAX), .big_modes = BIT(0) | BIT(1),
    .big_one_root = 1, .both_roots = 1, .modes = BIT(0) | BIT(1), .p2p = 1};

/* FLEXCOLL_ALGO of each loop of a case; NULL (the last): unset, so the tuner chooses, which on
 * one host means the shared-memory path (lib/host/shm.c) for every host collective. */
static const char *const algos[4] = {"ring", "tree", "exchange", NULL};
#define ALGO_NAME(a) ((a) ? (a) : "default (shared memory)")

static int run_matrix_procs(int nranks, const char *algo, const matrix_t *m) {
  char label[64];
  snprintf(label, sizeof label, "procs n=%d %s", nranks, ALGO_NAME(algo));
  hx_opts_t o = {.label = label, .algo = algo, .deadline_s = 240};
  return hx_run_procs(nranks, &o, matrix_rank, (void *)m);
}

START_TEST(test_procs2) {
  ck_assert_msg(run_matrix_procs(2, algos[_i], &full_matrix), "2 ranks, %s: see stderr", ALGO_NAME(algos[_i]));
}
END_TEST

/* The full matrix over UCX's shared-memory transports: the default peer-failure mode keeps UCX
 * 1.13 on TCP (the cases above), FLEXCOLL_UCX_PEER_FAILURE=0 lets it use shared memory and
 * cross-memory attach. */
START_TEST(test_procs_shm) {
  static const char *const env[] = {"FLEXCOLL_UCX_PEER_FAILURE=0", NULL};
  char label[64];
  snprintf(label, sizeof label, "procs n=3 %s shm", algos[_i]);
  hx_opts_t o = {.label = label, .algo = algos[_i], .deadline_s = 240, .env = env};
  ck_assert_msg(hx_run_procs(3, &o, matrix_rank, (void *)&full_matrix), "3 ranks over shared memory, %s: see stderr",
                algos[_i]);
}
END_TEST
START_TEST(test_procs3) {
  ck_assert_msg(run_matrix_procs(3, algos[_i], &full_matrix), "3 ranks, %s: see stderr", ALGO_NAME(algos[_i]));
}
END_TEST
START_TEST(test_procs4) {
  ck_assert_msg(run_matrix_procs(4, algos[_i], &full_matrix), "4 ranks, %s: see stderr", ALGO_NAME(algos[_i]));
}
END_TEST
START_TEST(test_procs8) {
  ck_assert_msg(run_matrix_procs(8, algos[_i], &full_matrix), "8 ranks, %s: see stderr", ALGO_NAME(algos[_i]));
}
END_TEST

/* 64 MiB (the larger buffer of each call), 4 ranks: allreduce float32 sum under ring and tree;
 * allgather, reduce_scatter and broadcast (ring; broadcast also tree). */
static const matrix_t big64_ring = {
    .colls = BIT(C_ALLREDUCE) | BIT(C_ALLGATHER) | BIT(C_REDUCE_SCATTER) | BIT(C_BROADCAST), .ncounts = 0,
    .big_bytes = MIB64, .big_colls = ALL_COLLS, .big_dtypes = BIT(FLEXCOLL_FLOAT32), .big_ops = BIT(FLEXCOLL_SUM),
    .big_modes = BIT(0), .big_one_root = 1};
static const matrix_t big64_tree = {
    .colls = BIT(C_ALLREDUCE) | BIT(C_BROADCAST), .ncounts = 0, .big_bytes = MIB64, .big_colls = ALL_COLLS,
    .big_dtypes = BIT(FLEXCOLL_FLOAT32), .big_ops = BIT(FLEXCOLL_SUM), .big_modes = BIT(0), .big_one_root = 1};

START_TEST(test_big64) {
  char label[64];
  const char *algo = _i == 2 ? NULL : algos[_i];
  snprintf(label, sizeof label, "64MiB n=4 %s", ALGO_NAME(algo));
  hx_opts_t o = {.label = label, .algo = algo, .deadline_s = 240};
  ck_assert_msg(hx_run_procs(4, &o, matrix_rank, (void *)(_i == 1 ? &big64_tree : &big64_ring)),
                "64 MiB, 4 ranks, %s: see stderr", ALGO_NAME(algo));
}
END_TEST

/* Threads of one process (flexcoll_comm_init_all): a subset. */
static const matrix_t threads_matrix = {
    .colls = ALL_COLLS,
    .dtypes = BIT(FLEXCOLL_INT8) | BIT(FLEXCOLL_UINT32) | BIT(FLEXCOLL_INT64) | BIT(FLEXCOLL_FLOAT16) |
              BIT(FLEXCOLL_BFLOAT16) | BIT(FLEXCOLL_FLOAT32) | BIT(FLEXCOLL_FLOAT64),
    .ops = ALL_OPS, .counts = {0, 1, 7, 1000}, .ncounts = 4, .big = 100003, .big_colls = ALL_COLLS,
    .big_dtypes = BIT(FLEXCOLL_FLOAT32), .big_ops = BIT(FLEXCOLL_SUM), .big_modes = BIT(0) | BIT(1), .big_one_root = 1,
    .both_roots = 1, .modes = BIT(0) | BIT(1), .p2p = 1};

START_TEST(test_threads) {
  static const char *const per_case[3] = {"ring", "tree", NULL};
  int nranks = 2 + _i / 3;
  const char *algo = per_case[_i % 3];
  char label[64];
  snprintf(label, sizeof label, "threads n=%d %s", nranks, ALGO_NAME(algo));
  hx_opts_t o = {.label = label, .algo = algo, .deadline_s = 180};
  ck_assert_msg(hx_run_threads(nranks, &o, matrix_rank, (void *)&threads_matrix), "threads, %d ranks, %s: see stderr",
                nranks, ALGO_NAME(algo));
}
END_TEST

/* ---- the shared-memory path, bitwise against the exchange over UCX -------------------------------- */

/* Every collective x dtype x op, counts 0, 1, 7, odd, not divisible by 2, 3, 4 or 8, and one
 * larger than a slot for some types (several rounds per call), in and out of place. */
static const matrix_t bitwise_matrix = {
    .colls = ALL_COLLS, .dtypes = ALL_DTYPES, .ops = ALL_OPS, .counts = {0, 1, 7, 1001, 8003}, .ncounts = 5,
    .big = 70001, .big_colls = ALL_COLLS,
    .big_dtypes = BIT(FLEXCOLL_FLOAT32) | BIT(FLEXCOLL_FLOAT16) | BIT(FLEXCOLL_INT64) | BIT(FLEXCOLL_UINT8),
    .big_ops = BIT(FLEXCOLL_SUM) | BIT(FLEXCOLL_MAX) | BIT(FLEXCOLL_AVG), .big_modes = BIT(0) | BIT(1),
    .both_roots = 1, .modes = BIT(0) | BIT(1)};

static char g_dir[256]; /* the digests of the bitwise comparisons */

/* One run of bitwise_matrix, its digests under g_dir/<run>; env: more settings (NULL-ended). */
static int bitwise_run(int nranks, int threads, const char *run, const char *algo, const char *const *env) {
  char dig[400];
  snprintf(dig, sizeof dig, "FC_TEST_DIGESTS=%s/%s", g_dir, run);
  const char *all[8] = {dig};
  int k = 1;
  for (; env && *env && k < 7; env++) all[k++] = *env;
  all[k] = NULL;
  /* One label for all runs of a configuration: it salts the seed, and they must see the same data. */
  char label[64];
  snprintf(label, sizeof label, "bitwise %s n=%d", threads ? "threads" : "procs", nranks);
  fprintf(stderr, "[%s] run %s\n", label, run);
  hx_opts_t o = {.label = label, .algo = algo, .env = all, .deadline_s = 400};
  return threads ? hx_run_threads(nranks, &o, matrix_rank, (void *)&bitwise_matrix)
                 : hx_run_procs(nranks, &o, matrix_rank, (void *)&bitwise_matrix);
}

/* The default (the shared-memory path at every size), and the same with every allreduce split
 * and slots of one page (many rounds per call, parts of a few lines), must give the bits of the
 * exchange over UCX (FLEXCOLL_ALGO=exchange), besides being right (the reference checks). */
START_TEST(test_shm_bitwise) {
  static const int ranks[] = {2, 3, 4, 8, 2, 3};
  const int nranks = ranks[_i], threads = _i >= 4;
  char ref[32], dflt[32], small[32];
  snprintf(ref, sizeof ref, "exchange-%d-%d", nranks, threads);
  snprintf(dflt, sizeof dflt, "shm-%d-%d", nranks, threads);
  snprintf(small, sizeof small, "shm-small-%d-%d", nranks, threads);
  /* (The small slots with non-temporal stores to recv at every size, the default slots with plain ones.) */
  static const char *const small_env[] = {"FLEXCOLL_SHM_SPLIT_MIN_BYTES=0", "FLEXCOLL_SHM_SLOT_BYTES=4096",
                                          "FLEXCOLL_SHM_NT_MIN_BYTES=0", NULL};
  ck_assert_msg(bitwise_run(nranks, threads, ref, "exchange", NULL), "%d ranks, FLEXCOLL_ALGO=exchange: see stderr", nranks);
  ck_assert_msg(bitwise_run(nranks, threads, dflt, NULL, NULL), "%d ranks, shared memory: see stderr", nranks);
  ck_assert_msg(bitwise_run(nranks, threads, small, NULL, small_env), "%d ranks, shared memory, split, 4 KiB slots: see stderr",
                nranks);
  ck_assert_msg(hx_same_digests("test_coll", g_dir, nranks, ref, dflt), "%d ranks (%s): the shared-memory path differs "
                "from the exchange", nranks, threads ? "threads" : "processes");
  ck_assert_msg(hx_same_digests("test_coll", g_dir, nranks, ref, small), "%d ranks (%s): the shared-memory path with 4 KiB "
                "slots, split, differs from the exchange", nranks, threads ? "threads" : "processes");
  /* Helper threads (lib/host/shm.c's pool) at every size, whatever the cores: 3 per rank over
   * the default slots (parts of several fold blocks, cut unevenly), 2 over 4 KiB slots (parts of
   * a few lines, some empty). */
  char thr[32], thr_small[32];
  snprintf(thr, sizeof thr, "shm-threads-%d-%d", nranks, threads);
  snprintf(thr_small, sizeof thr_small, "shm-threads-small-%d-%d", nranks, threads);
  static const char *const thr_env[] = {"FLEXCOLL_SHM_SPLIT_MIN_BYTES=0", "FLEXCOLL_SHM_THREADS=3",
                                        "FLEXCOLL_SHM_THREADS_MIN_BYTES=0", "FLEXCOLL_SHM_NT_MIN_BYTES=0", NULL};
  static const char *const thr_small_env[] = {"FLEXCOLL_SHM_SPLIT_MIN_BYTES=0", "FLEXCOLL_SHM_SLOT_BYTES=4096",
                                              "FLEXCOLL_SHM_THREADS=2", "FLEXCOLL_SHM_THREADS_MIN_BYTES=0", NULL};
  ck_assert_msg(bitwise_run(nranks, threads, thr, NULL, thr_env), "%d ranks, shared memory, split, 3 threads: see stderr",
                nranks);
  ck_assert_msg(bitwise_run(nranks, threads, thr_small, NULL, thr_small_env),
                "%d ranks, shared memory, split, 4 KiB slots, 2 threads: see stderr", nranks);
  ck_assert_msg(hx_same_digests("test_coll", g_dir, nranks, ref, thr), "%d ranks (%s): the shared-memory path with 3 "
                "threads per rank differs from the exchange", nranks, threads ? "threads" : "processes");
  ck_assert_msg(hx_same_digests("test_coll", g_dir, nranks, ref, thr_small), "%d ranks (%s): the shared-memory path with "
                "2 threads per rank and 4 KiB slots differs from the exchange", nranks, threads ? "threads" : "processes");
}
END_TEST

/* A slot size the segment cannot be cut into: every rank's creation fails, naming the setting. */
static int bad_slot_body(void *arg) {
  const hx_opts_t *o = arg;
  hx_rank_t rr, *r = &rr;
  hx_rank_init(r, o, 0, 2, NULL);
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  flexcoll_comm_t c[2] = {NULL, NULL};
  snprintf(r->what, sizeof r->what, "flexcoll_comm_init_all(2) with FLEXCOLL_SHM_SLOT_BYTES=5000");
  flexcoll_result_t res = flexcoll_comm_init_all(c, 2, NULL);
  const char *e = flexcoll_get_last_error(NULL);
  if (res != FLEXCOLL_INVALID_ARGUMENT) hx_fail(r, "returned %d (%s), expected FLEXCOLL_INVALID_ARGUMENT", res, e);
  else if (!strstr(e, "FLEXCOLL_SHM_SLOT_BYTES")) hx_fail(r, "the error does not name the setting: %s", e);
  return r->errors != 0;
}

START_TEST(test_shm_bad_slot) {
  static const char *const env[] = {"FLEXCOLL_SHM_SLOT_BYTES=5000", NULL};
  hx_opts_t o = {.label = "bad slot size", .env = env, .deadline_s = 60};
  ck_assert_msg(hx_run_process(&o, bad_slot_body, &o), "FLEXCOLL_SHM_SLOT_BYTES=5000: see stderr");
}
END_TEST

/* ---- groups: several communicators from one thread ---------------------------------------------- */

/* The calls of one collective on every rank of a communicator whose ranks all live in this thread. */
typedef struct {
  pcall_t p[8];
  int n;
} gcall_t;

static uint64_t group_call_id;

static int gcall_prepare(hx_rank_t *r, gcall_t *g, int n, int coll, flexcoll_datatype_t dt, flexcoll_op_t op,
                         size_t count, int root, int inplace) {
  uint64_t call = group_call_id++;
  g->n = n;
  for (int i = 0; i < n; i++) {
    pcall_t p = {.coll = coll, .dtype = dt, .op = op, .count = count, .root = root, .inplace = inplace, .rank = i,
                 .nranks = n};
    g->p[i] = p;
    r->rank = i;
    pcall_describe(r->what, sizeof r->what, &g->p[i]);
    if (pcall_prepare(r, &g->p[i], r->seed, call) != 0) return -1;
  }
  r->rank = 0;
  return 0;
}

/* Issue g on comms[0..n) (rank i on comms[i]); inside a group, this only queues. */
static int gcall_issue(hx_rank_t *r, gcall_t *g, flexcoll_comm_t *comms) {
  int ok = 1;
  for (int i = 0; i < g->n; i++) {
    r->rank = i;
    pcall_describe(r->what, sizeof r->what, &g->p[i]);
    ok &= hx_ok(r, pcall_issue(&g->p[i], comms[i]), comms[i], coll_names[g->p[i].coll]);
  }
  r->rank = 0;
  return ok;
}

static void gcall_check(hx_rank_t *r, gcall_t *g) {
  for (int i = 0; i < g->n; i++) pcall_check(r, &g->p[i]);
}

/* Nothing of g may have run yet (it is queued in an open group): every out-of-place recvbuf of an
 * allreduce is still all poison. */
static void gcall_check_not_run(hx_rank_t *r, gcall_t *g, const char *when) {
  for (int i = 0; i < g->n; i++) {
    pcall_t *p = &g->p[i];
    if (p->coll != C_ALLREDUCE || p->inplace) continue;
    r->rank = i;
    char what[300];
    snprintf(what, sizeof what, "recvbuf %s (the call must only be queued)", when);
    pcall_describe(r->what, sizeof r->what, p);
    hx_check_poisoned(r, what, p->recv, p->count * fc_dtype_size(p->dtype));
  }
  r->rank = 0;
}

static int group_end_ok(hx_rank_t *r, const char *what) {
  snprintf(r->what, sizeof r->what, "%s", what);
  flexcoll_result_t res = flexcoll_group_end();
  return hx_ok(r, res, NULL, "flexcoll_group_end");
}

static int group_start_ok(hx_rank_t *r, const char *what) {
  snprintf(r->what, sizeof r->what, "%s", what);
  return hx_ok(r, flexcoll_group_start(), NULL, "flexcoll_group_start");
}

/* One collective on every rank of comms, in one group; then check. */
static int group_one(hx_rank_t *r, flexcoll_comm_t *comms, int n, int coll, flexcoll_datatype_t dt, flexcoll_op_t op,
                     size_t count, int root, int inplace) {
  gcall_t g;
  if (gcall_prepare(r, &g, n, coll, dt, op, count, root, inplace) != 0) return -1;
  if (!group_start_ok(r, "group of one collective")) return -1;
  int ok = gcall_issue(r, &g, comms);
  ok &= group_end_ok(r, "group of one collective");
  if (!ok) return -1;
  gcall_check(r, &g);
  return 0;
}

/* One after the other from this thread, as NCCL programs free the ranks of ncclCommInitAll.  (A
 * destroy may wait for peers up to the timeout; a slow one shows in the timing lines.) */
static int destroy_all(hx_rank_t *r, flexcoll_comm_t *comms, int n) {
  int ok = 1;
  for (int i = 0; i < n; i++) {
    double t0 = hx_now();
    snprintf(r->what, sizeof r->what, "flexcoll_comm_destroy(rank %d of %d) from one thread", i, n);
    ok &= hx_ok(r, flexcoll_comm_destroy(comms[i]), NULL, "flexcoll_comm_destroy");
    if (hx_now() - t0 > 5.0)
      fprintf(stderr, "[%s] note: %s took %.1f s\n", r->label, r->what, hx_now() - t0);
  }
  return ok;
}

static int init_all_ok(hx_rank_t *r, flexcoll_comm_t *comms, int n) {
  snprintf(r->what, sizeof r->what, "flexcoll_comm_init_all(%d)", n);
  return hx_ok(r, flexcoll_comm_init_all(comms, n, NULL), NULL, "flexcoll_comm_init_all");
}

static int group_body(void *arg) {
  const hx_opts_t *o = arg;
  hx_rank_t rr, *r = &rr;
  hx_rank_init(r, o, 0, 2, NULL);
  setenv("CUDA_VISIBLE_DEVICES", "", 1); /* host ranks (init_all with NULL devlist) */
  flexcoll_comm_t c2[2], d2[2], c3[3];
  double t0 = hx_now();

  /* 1. Two ranks of init_all, one allreduce on each inside a group: every dtype and op. */
  if (!init_all_ok(r, c2, 2)) return 1;
  for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt++)
    for (int op = 0; op < FLEXCOLL_NUM_OPS; op++)
      for (int ip = 0; ip < 2; ip++)
        if (group_one(r, c2, 2, C_ALLREDUCE, (flexcoll_datatype_t)dt, (flexcoll_op_t)op, dt % 2 ? 7 : 1000, 0, ip))
          return 1;
  /* Every collective, in and out of place, both roots. */
  for (int c = 0; c < NCOLLS; c++)
    for (int root = 0; root < 2; root++)
      for (int ip = 0; ip < 2; ip++) {
        if (root && !coll_rooted(c)) continue;
        if (group_one(r, c2, 2, c, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 1001, root, ip)) return 1;
        if (group_one(r, c2, 2, c, FLEXCOLL_INT32, FLEXCOLL_MAX, 3, root, ip)) return 1;
      }
  /* Count 0 inside a group. */
  if (group_one(r, c2, 2, C_ALLREDUCE, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0, 0, 0)) return 1;
  fprintf(stderr, "[%s] group: single collectives %.2f s\n", o->label, hx_now() - t0);

  /* 2. Several collectives per communicator in one group: they run in order per communicator. */
  {
    gcall_t g[NCOLLS * 2];
    int ng = 0, ok = 1;
    for (int c = 0; c < NCOLLS; c++)
      for (int ip = 0; ip < 2; ip++)
        if (gcall_prepare(r, &g[ng++], 2, c, c % 2 ? FLEXCOLL_BFLOAT16 : FLEXCOLL_INT64,
                          c == C_REDUCE ? FLEXCOLL_PROD : FLEXCOLL_SUM, 500 + (size_t)c, c % 2, ip))
          return 1;
    if (!group_start_ok(r, "group of 10 collectives per communicator")) return 1;
    for (int i = 0; i < ng; i++) ok &= gcall_issue(r, &g[i], c2);
    ok &= group_end_ok(r, "group of 10 collectives per communicator");
    if (!ok) return 1;
    for (int i = 0; i < ng; i++) gcall_check(r, &g[i]);
  }

  /* 3. Nesting: only the outermost group_end runs the calls.
   *   start(1) allreduce(c0) start(2) allreduce(c1) broadcast(c0) end(2) [nothing ran]
   *   start(2) start(3) broadcast(c1) end(3) end(2) [nothing ran] end(1) [all ran] */
  {
    gcall_t a, b;
    if (gcall_prepare(r, &a, 2, C_ALLREDUCE, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, 777, 0, 0)) return 1;
    if (gcall_prepare(r, &b, 2, C_BROADCAST, FLEXCOLL_UINT8, FLEXCOLL_SUM, 333, 1, 0)) return 1;
    int ok = group_start_ok(r, "nested groups: level 1");
    ok &= hx_ok(r, pcall_issue(&a.p[0], c2[0]), c2[0], "allreduce (rank 0, nested level 1)");
    ok &= group_start_ok(r, "nested groups: level 2");
    ok &= hx_ok(r, pcall_issue(&a.p[1], c2[1]), c2[1], "allreduce (rank 1, nested level 2)");
    ok &= hx_ok(r, pcall_issue(&b.p[0], c2[0]), c2[0], "broadcast (rank 0, nested level 2)");
    ok &= group_end_ok(r, "nested groups: end of level 2");
    if (!ok) return 1;
    gcall_check_not_run(r, &a, "after an inner group_end");
    ok &= group_start_ok(r, "nested groups: level 2 again");
    ok &= group_start_ok(r, "nested groups: level 3");
    ok &= hx_ok(r, pcall_issue(&b.p[1], c2[1]), c2[1], "broadcast (rank 1, nested level 3)");
    ok &= group_end_ok(r, "nested groups: end of level 3");
    ok &= group_end_ok(r, "nested groups: end of level 2");
    if (!ok) return 1;
    gcall_check_not_run(r, &a, "after two inner group_ends");
    if (!group_end_ok(r, "nested groups: end of level 1")) return 1;
    gcall_check(r, &a);
    gcall_check(r, &b);
  }

  /* 4. Two communicators (2 ranks each) in one group: four ranks driven by one thread. */
  if (!init_all_ok(r, d2, 2)) return 1;
  {
    gcall_t a, b;
    if (gcall_prepare(r, &a, 2, C_ALLREDUCE, FLEXCOLL_FLOAT32, FLEXCOLL_AVG, 4099, 0, 0)) return 1;
    if (gcall_prepare(r, &b, 2, C_REDUCE_SCATTER, FLEXCOLL_INT32, FLEXCOLL_SUM, 1025, 0, 1)) return 1;
    int ok = group_start_ok(r, "two communicators in one group");
    ok &= gcall_issue(r, &a, c2);
    ok &= gcall_issue(r, &b, d2);
    ok &= group_end_ok(r, "two communicators in one group");
    if (!ok) return 1;
    gcall_check(r, &a);
    gcall_check(r, &b);
  }
  if (!destroy_all(r, d2, 2)) return 1;

  /* 5. Ranks created with flexcoll_comm_init_rank inside a group, used in the same group. */
  {
    flexcoll_unique_id_t id;
    snprintf(r->what, sizeof r->what, "flexcoll_get_unique_id");
    if (!hx_ok(r, flexcoll_get_unique_id(&id), NULL, "flexcoll_get_unique_id")) return 1;
    gcall_t a;
    if (gcall_prepare(r, &a, 2, C_ALLREDUCE, FLEXCOLL_FLOAT16, FLEXCOLL_SUM, 129, 0, 0)) return 1;
    int ok = group_start_ok(r, "init_rank inside a group");
    for (int i = 0; i < 2 && ok; i++) {
      snprintf(r->what, sizeof r->what, "flexcoll_comm_init_rank(rank %d) inside a group", i);
      ok &= hx_ok(r, flexcoll_comm_init_rank(&d2[i], 2, id, i, NULL), NULL, "flexcoll_comm_init_rank");
    }
    if (ok) ok &= gcall_issue(r, &a, d2);
    ok &= group_end_ok(r, "init_rank inside a group");
    if (!ok) return 1;
    gcall_check(r, &a);
    if (group_one(r, d2, 2, C_BROADCAST, FLEXCOLL_INT8, FLEXCOLL_SUM, 17, 1, 1)) return 1;
    if (!destroy_all(r, d2, 2)) return 1;
  }
  if (!destroy_all(r, c2, 2)) return 1;

  /* 6. Three ranks of init_all in one thread. */
  r->nranks = 3;
  if (!init_all_ok(r, c3, 3)) return 1;
  for (int c = 0; c < NCOLLS; c++)
    for (int ip = 0; ip < 2; ip++) {
      if (group_one(r, c3, 3, c, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 1000, 2, ip)) return 1;
      if (group_one(r, c3, 3, c, FLEXCOLL_UINT64, FLEXCOLL_MIN, 7, 1, ip)) return 1;
    }
  if (!destroy_all(r, c3, 3)) return 1;
  fprintf(stderr, "[%s] group: all %.2f s\n", o->label, hx_now() - t0);
  return r->errors != 0;
}

START_TEST(test_group) {
  const char *algo = _i == 2 ? NULL : algos[_i];
  char label[64];
  snprintf(label, sizeof label, "group %s", ALGO_NAME(algo));
  hx_opts_t o = {.label = label, .algo = algo, .deadline_s = 200};
  ck_assert_msg(hx_run_process(&o, group_body, &o), "groups (%s): see stderr", ALGO_NAME(algo));
}
END_TEST

/* ---- processes that each drive two communicators in groups ------------------------------------ */

static int multicomm_rank(hx_rank_t *r) {
  const int n = r->nranks;
  coll_times_t ct;
  memset(&ct, 0, sizeof ct);
  uint64_t call = 0;
  for (int c = 0; c < NCOLLS; c++)
    for (int ip = 0; ip < 2; ip++)
      for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt += 3) {
        /* Comm 0 runs collective c, comm 1 collective (c+2)%NCOLLS, in one group. */
        pcall_t p[2];
        for (int k = 0; k < 2; k++) {
          int coll = (c + 2 * k) % NCOLLS;
          pcall_t q = {.coll = coll, .dtype = (flexcoll_datatype_t)dt, .op = (flexcoll_op_t)((dt + k) % FLEXCOLL_NUM_OPS),
                       .count = 100 + (size_t)dt * 37, .root = (c + k) % n, .inplace = ip, .rank = r->rank, .nranks = n};
          p[k] = q;
          pcall_describe(r->what, sizeof r->what, &p[k]);
          if (pcall_prepare(r, &p[k], r->seed ^ (uint64_t)k << 40, call++) != 0) return 1;
        }
        int ok = group_start_ok(r, "group over two communicators");
        for (int k = 0; k < 2; k++) {
          pcall_describe(r->what, sizeof r->what, &p[k]);
          ok &= hx_ok(r, pcall_issue(&p[k], r->comms[k]), r->comms[k], coll_names[p[k].coll]);
        }
        ok &= group_end_ok(r, "group over two communicators");
        if (!ok) return 1;
        for (int k = 0; k < 2; k++) pcall_check(r, &p[k]);
      }
  return 0;
}

START_TEST(test_multicomm) {
  hx_opts_t o = {.label = "two comms per process n=3", .ncomms = 2, .deadline_s = 200};
  ck_assert_msg(hx_run_procs(3, &o, multicomm_rank, NULL), "two communicators per process: see stderr");
}
END_TEST

/* ---- a rank that is done early destroys its communicator -------------------------------------- */

/* Every rank makes the same 300 reduce calls (int32 sum, count 1, root 0, ring chain 2 -> 1 -> 0)
 * and then destroys its communicator, as the API allows ("once the communicator's work is done").
 * Rank 2 only sends, and small sends complete without waiting for the receiver, so it is done
 * first; rank 1 is slow (2 ms of "work" after each call), so rank 0 waits on it, long after rank 2
 * has gone.  Nothing rank 0 or 1 still needs depends on rank 2 any more (its messages were
 * delivered), so both must complete with the right results. */
static int early_rank(hx_rank_t *r) {
  int32_t in = r->rank + 1, out = 0;
  const int32_t want = r->nranks * (r->nranks + 1) / 2;
  for (int i = 0; i < 300; i++) {
    snprintf(r->what, sizeof r->what, "reduce int32 sum count 1 root 0, call %d of 300", i);
    flexcoll_result_t res = flexcoll_reduce(&in, r->rank == 0 ? &out : NULL, 1, FLEXCOLL_INT32, FLEXCOLL_SUM, 0,
                                            r->comm, NULL);
    if (!hx_ok(r, res, r->comm, "reduce")) return 1;
    if (r->rank == 0 && out != want) hx_fail(r, "result %d, expected %d", (int)out, (int)want);
    if (r->rank == 1) {
      struct timespec ts = {0, 2 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  return 0;
}

START_TEST(test_early_destroy) {
  hx_opts_t o = {.label = "early destroy n=3 ring", .algo = "ring", .deadline_s = 120};
  ck_assert_msg(hx_run_procs(3, &o, early_rank, NULL), "early destroy: see stderr");
}
END_TEST

/* ---- main ---------------------------------------------------------------------------------------- */

static Suite *coll_suite(void) {
  Suite *s = suite_create("coll");
  struct {
    const char *name;
    const TTest *test;
    int loops;
  } cases[] = {
      {"procs2", test_procs2, 4}, {"procs3", test_procs3, 4}, {"procs4", test_procs4, 4},
      {"procs8", test_procs8, 4}, {"procs_shm", test_procs_shm, 2}, {"big64", test_big64, 3},
      {"threads", test_threads, 6}, {"shm_bitwise", test_shm_bitwise, 6},
      {"shm_bad_slot", test_shm_bad_slot, 1},
      {"group", test_group, 3},   {"multicomm", test_multicomm, 1}, {"early_destroy", test_early_destroy, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    TCase *tc = tcase_create(cases[i].name);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, cases[i].test, 0, cases[i].loops);
    suite_add_tcase(s, tc);
  }
  return s;
}

/* ---- launcher mode: one rank of a job that a script starts (tests/test_hosts.sh) --------------
 * `test_coll --launcher MODE` is one rank: flexcoll_comm_init_from_env (FLEXCOLL_RANK, NRANKS,
 * ROOT), then MODE:
 *   matrix       the forked cases' full matrix (full_matrix: every collective, datatype and op,
 *                odd counts, both roots, in place and out, send/recv), checked against the
 *                reference, under FLEXCOLL_ALGO as set; FC_TEST_SEED must be the same on every
 *                rank (each rank computes every rank's inputs from it).  Then float32 allreduces
 *                whose results must be bitwise the same on every rank (launcher_same_bits), and
 *                one line per link and peer from flexcoll_comm_get_link_stats ("link NAME peer P
 *                bytes B").
 *   init         the communicator's creation alone; prints its result ("init: CODE message").
 *   until-error  float32 sum allreduces of 1 Mi elements until one fails; after 20 calls it
 *                creates the file FC_TEST_READY (the script then breaks the network).  Prints
 *                "error CODE after N calls at T" (T: CLOCK_REALTIME seconds) and exits 0 when
 *                the error is REMOTE_ERROR or TIMEOUT, 1 otherwise or when none came within
 *                FC_TEST_LOOP_S seconds (default 120).
 *   sent-per-call  an allgather of 4 MiB (recv) and a reduce_scatter of 8 MiB (send), float32,
 *                each checked; after each, the bytes this rank sent to every peer during it, from
 *                the link statistics ("COLL peer P bytes B"): test_hosts.sh's slow case checks
 *                that ranks on hosts joined by a slow link send one block each to the other host
 *                (two dimensions; the flat ring's would send 0 or 3).
 * Exit 0 on success. */
static double realtime_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int launcher_until_error(flexcoll_comm_t comm, int rank) {
  const size_t count = 1u << 20;
  float *buf = malloc(count * sizeof *buf);
  if (!buf) return 1;
  for (size_t i = 0; i < count; i++) buf[i] = (float)(i % 7);
  const char *ready = getenv("FC_TEST_READY"), *limit_s = getenv("FC_TEST_LOOP_S");
  double limit = hx_now() + (limit_s ? atof(limit_s) : 120.0);
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  long calls = 0;
  while (res == FLEXCOLL_SUCCESS && hx_now() < limit) {
    res = flexcoll_allreduce(buf, buf, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL);
    if (res == FLEXCOLL_SUCCESS && ++calls == 20 && ready) {
      FILE *f = fopen(ready, "w");
      if (f) fclose(f);
    }
  }
  free(buf);
  if (res == FLEXCOLL_SUCCESS) {
    printf("rank %d: no error within the limit (%ld calls)\n", rank, calls);
    return 1;
  }
  printf("rank %d: error %d (%s) after %ld calls at %.3f: %s\n", rank, (int)res, flexcoll_get_error_string(res), calls,
         realtime_s(), flexcoll_get_last_error(comm));
  return res == FLEXCOLL_REMOTE_ERROR || res == FLEXCOLL_TIMEOUT ? 0 : 1;
}

static int launcher_sent_per_call(flexcoll_comm_t comm, int rank, int nranks) {
  /* The allgather's block: its receive buffer is 4 MiB; the reduce_scatter's is twice that. */
  const size_t c = ((size_t)4 << 20) / sizeof(float) / (size_t)(nranks > 0 ? nranks : 1);
  const size_t recv_count = (size_t)(nranks > 2 ? nranks : 2) * c;
  float *send = malloc((size_t)nranks * 2 * c * sizeof *send), *recv = malloc(recv_count * sizeof *recv);
  unsigned long long sent[64];
  int rc = !send || !recv;
  for (int k = 0; k < 2 && !rc; k++) {
    const int rs = k == 1;
    const char *name = rs ? "reduce_scatter" : "allgather";
    char why[256];
    rc = hx_small_ints_call(comm, rank, nranks, rs, rs ? 2 * c : c, send, recv, sent, why, sizeof why);
    if (rc) printf("rank %d: %s\n", rank, why);
    else
      for (int q = 0; q < nranks; q++) printf("rank %d: %s peer %d bytes %llu\n", rank, name, q, sent[q]);
  }
  free(send);
  free(recv);
  return rc;
}

/* Every rank must hold the same bits after an allreduce, whatever the schedule (flat, host by
 * host, two-dimensional): float32 sums whose rounding depends on the order of the fold, at a
 * tree size, a ring size and a large one, in place; each rank's digest all-gathered and compared. */
static int launcher_same_bits(hx_rank_t *r) {
  static const size_t counts[] = {8195, 65543, 1000003};
  if (r->nranks > 64) return 0;
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    const size_t count = counts[k];
    float *buf = malloc(count * sizeof *buf);
    uint64_t dig[64] = {0};
    if (!buf) return hx_fail(r, "out of memory");
    hx_data_t d = {FLEXCOLL_FLOAT32, HX_GEN_SUM, r->seed, 1000000 + k, r->nranks};
    hx_fill(&d, r->rank, buf, 0, count);
    snprintf(r->what, sizeof r->what, "same bits: allreduce float32 sum count %zu in place", count);
    flexcoll_result_t res = flexcoll_allreduce(buf, buf, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r->comm, NULL);
    if (hx_ok(r, res, r->comm, "flexcoll_allreduce")) hx_check_reduced(r, "same bits", &d, FLEXCOLL_SUM, buf, 0, count);
    dig[r->rank] = hx_digest(buf, count * sizeof *buf);
    free(buf);
    if (res != FLEXCOLL_SUCCESS) return 1;
    res = flexcoll_allgather(&dig[r->rank], dig, 1, FLEXCOLL_UINT64, r->comm, NULL);
    if (!hx_ok(r, res, r->comm, "flexcoll_allgather")) return 1;
    for (int q = 0; q < r->nranks; q++)
      if (dig[q] != dig[r->rank]) hx_fail(r, "rank %d's result differs bitwise from this rank's", q);
  }
  return r->errors != 0;
}

static int launcher_main(const char *mode) {
  if (strcmp(mode, "matrix") && strcmp(mode, "init") && strcmp(mode, "until-error") && strcmp(mode, "sent-per-call")) {
    fprintf(stderr, "test_coll --launcher %s: the mode is matrix, init, until-error or sent-per-call\n", mode);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  flexcoll_comm_t comm = NULL;
  double t0 = hx_now();
  flexcoll_result_t res = flexcoll_comm_init_from_env(&comm, NULL);
  if (!strcmp(mode, "init") || res != FLEXCOLL_SUCCESS) {
    printf("init: %d %s: %s (%.1f s)\n", (int)res, flexcoll_get_error_string(res), flexcoll_get_last_error(comm),
           hx_now() - t0);
    if (comm) flexcoll_comm_destroy(comm);
    return res == FLEXCOLL_SUCCESS ? 0 : 3;
  }
  int rank = 0, nranks = 0;
  flexcoll_comm_user_rank(comm, &rank);
  flexcoll_comm_count(comm, &nranks);
  int rc;
  if (!strcmp(mode, "until-error")) {
    rc = launcher_until_error(comm, rank);
    flexcoll_comm_abort(comm);
  } else if (!strcmp(mode, "sent-per-call")) {
    rc = launcher_sent_per_call(comm, rank, nranks);
  } else {
    hx_opts_t o = {.label = "launcher", .algo = getenv("FLEXCOLL_ALGO")};
    hx_rank_t r;
    hx_rank_init(&r, &o, rank, nranks, (void *)&full_matrix);
    r.comm = r.comms[0] = comm;
    r.ncomms = 1;
    rc = matrix_rank(&r) != 0 || r.errors != 0;
    if (!rc) rc = launcher_same_bits(&r);
    flexcoll_link_stats_t st[64];
    int n = 0;
    if (flexcoll_comm_get_link_stats(comm, st, 64, &n) == FLEXCOLL_SUCCESS)
      for (int i = 0; i < n && i < 64; i++)
        printf("rank %d: link %s peer %d bytes %llu\n", rank, st[i].name, st[i].peer, st[i].bytes);
    printf("rank %d: matrix %s in %.1f s\n", rank, rc ? "FAILED" : "passed", hx_now() - t0);
  }
  flexcoll_comm_destroy(comm);
  return rc;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--launcher")) return launcher_main(argv[2]);
  if (argc != 1) {
    fprintf(stderr, "usage: test_coll [--launcher matrix|init|until-error|sent-per-call]\n");
    return 2;
  }
  uint64_t seed = hx_seed(); /* chosen and printed once; the forked tests inherit it */
  double t0 = hx_now();
  snprintf(g_dir, sizeof g_dir, "/tmp/fc-test-coll-XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return EXIT_FAILURE;
  }
  SRunner *sr = srunner_create(coll_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (!failed && system(cmd) != 0) fprintf(stderr, "[test_coll] could not remove %s\n", g_dir);
  fprintf(stderr, "[test_coll] %s in %.1f s; FC_TEST_SEED=0x%016" PRIx64 " reproduces the data\n",
          failed ? "FAILED" : "passed", hx_now() - t0, seed);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
