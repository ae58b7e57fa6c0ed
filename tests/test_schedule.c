/* test_schedule.c — checks the algorithm schedules (lib/algos) by simulating all ranks in memory.
 *
 * Every rank's buffers live in one int64 array per rank, laid out as the user would pass them:
 * separate regions out of place, overlapping regions in place, with guard cells around them.
 * The simulator posts a rank's round (its SENDs copy their data into per-pair FIFO queues, its
 * receives count as posted) and completes it once every receive has its message and, in
 * rendezvous mode, every send has a posted receive: the strictest executor.  A round's steps are
 * checked not to touch memory another step of the round writes, since executors run them at once.
 * After the run, recv must hold the reference result and every other cell (guards, the user's send
 * buffer, a non-root's recv in reduce) must be untouched; only scratch may change.
 * Point-to-point batches (fc_algo_build_p2p) run on the same simulator, with each op's buffer
 * FC_BUF_EXT + i a separate region of the rank's array.  test_hierarchy_sweep runs every algorithm
 * again with the ranks on several hosts (fc_algo_args_t.order: rings and trees host by host).
 */
#include <check.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "algos/build.h"

#define MAXN 16
#define GUARD 3
#define MAX_ROUND_STEPS 256 /* >= FC_P2P_MAX_OPS: a p2p batch is one round */
#define NBUF (FC_BUF_EXT + FC_P2P_MAX_OPS)

enum { OP_SUM, OP_MAX, OP_HASH }; /* HASH: neither commutative nor associative */

typedef struct {
  size_t off, count; /* data in the arena */
} msg_t;

typedef struct {
  msg_t *v;
  size_t n, cap;
} msgq_t;

typedef struct {
  fc_schedule_t s;
  int64_t *mem, *init; /* the rank's memory and its state before the run */
  size_t memlen, memcap;
  size_t base[NBUF], len[NBUF]; /* by fc_buf_t: where each buffer starts in mem, and its size */
  int cur;                /* the posted round, not yet completed */
  size_t *ord;            /* per step: its index among the messages of its (sender, receiver) pair */
  size_t ordcap;
  size_t nrecv_from[MAXN];
} srank_t;

typedef struct {
  fc_algo_args_t a; /* rank is ignored */
  int inplace, op, rendezvous;
  int p2p;                              /* the schedules are p2p batches: ops/nops, not a */
  fc_p2p_op_t ops[MAXN][FC_P2P_MAX_OPS]; /* p2p: each rank's batch */
  int nops[MAXN];
  srank_t rk[MAXN];
  msgq_t q[MAXN][MAXN];           /* q[a][b]: messages a posted for b, in order */
  size_t recv_posted[MAXN][MAXN]; /* [b][a]: receives from a that b has posted */
  int64_t *arena;
  size_t arena_n, arena_cap;
  char err[512];
} sim_t;

static sim_t S; /* reused between configurations so its buffers are allocated once */

static int sim_fail(sim_t *sim, const char *fmt, ...) {
  if (sim->err[0]) return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sim->err, sizeof sim->err, fmt, ap);
  va_end(ap);
  return -1;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return p;
  size_t ncap = *cap ? *cap : 64;
  while (ncap < need) ncap *= 2;
  p = realloc(p, ncap * elem);
  ck_assert_ptr_nonnull(p);
  *cap = ncap;
  return p;
}

static uint64_t rng_state;
static uint64_t rng(void) { /* xorshift64*: deterministic inputs per configuration */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ULL;
}

static int64_t apply_op(int op, int64_t a, int64_t b) {
  if (op == OP_SUM) return (int64_t)((uint64_t)a + (uint64_t)b); /* no UB if garbage gets summed */
  if (op == OP_MAX) return a > b ? a : b;
  uint64_t x = (uint64_t)a * 0x9E3779B97F4A7C15ULL + (uint64_t)b; /* order-sensitive mix */
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  return (int64_t)(x ^ (x >> 29));
}

static int is_root(const sim_t *sim, int r) { return r == sim->a.root; }
static int recv_writable(const sim_t *sim, int r) { return sim->a.coll != FC_COLL_REDUCE || is_root(sim, r); }
static int send_readable(const sim_t *sim, int r) { return sim->a.coll != FC_COLL_BROADCAST || is_root(sim, r); }
static int reduces(fc_coll_t c) {
  return c == FC_COLL_ALLREDUCE || c == FC_COLL_REDUCE_SCATTER || c == FC_COLL_REDUCE;
}

/* Build every rank's schedule; returns the first failure's code. */
static flexcoll_result_t sim_build(sim_t *sim, const fc_algo_args_t *a) {
  sim->a = *a;
  sim->p2p = 0;
  sim->err[0] = 0;
  for (int r = 0; r < a->nranks; r++) {
    fc_algo_args_t ar = *a;
    ar.rank = r;
    flexcoll_result_t res = fc_algo_build(&sim->rk[r].s, &ar);
    if (res != FLEXCOLL_SUCCESS) return res;
  }
  return FLEXCOLL_SUCCESS;
}

/* Place send, recv and scratch in the rank's array the way the user aliased them, fill everything
 * with garbage and the send buffer with small inputs, and remember the initial state. */
static void layout_rank(sim_t *sim, int r) {
  srank_t *k = &sim->rk[r];
  size_t n = (size_t)sim->a.nranks, c = sim->a.count;
  size_t ls = fc_coll_send_count(sim->a.coll, c, (int)n), lr = fc_coll_recv_count(sim->a.coll, c, (int)n);
  k->len[FC_BUF_SEND] = ls;
  k->len[FC_BUF_RECV] = lr;
  k->len[FC_BUF_SCRATCH] = k->s.scratch_count;
  size_t at = GUARD;
  if (!sim->inplace) {
    k->base[FC_BUF_SEND] = at;
    k->base[FC_BUF_RECV] = at + ls + GUARD;
    at += ls + GUARD + lr + GUARD;
  } else {
    k->base[FC_BUF_SEND] = at + (sim->a.coll == FC_COLL_ALLGATHER ? (size_t)r * c : 0);
    k->base[FC_BUF_RECV] = at + (sim->a.coll == FC_COLL_REDUCE_SCATTER ? (size_t)r * c : 0);
    at += (ls > lr ? ls : lr) + GUARD;
  }
  k->base[FC_BUF_SCRATCH] = at;
  k->memlen = at + k->s.scratch_count + GUARD;
  if (k->memlen > k->memcap) { /* mem and init share one capacity */
    k->memcap = k->memlen;
    k->mem = realloc(k->mem, k->memcap * sizeof(int64_t));
    k->init = realloc(k->init, k->memcap * sizeof(int64_t));
    ck_assert(k->mem && k->init);
  }
  for (size_t i = 0; i < k->memlen; i++) k->mem[i] = (int64_t)(rng() | 1ULL << 62); /* garbage: large */
  for (size_t i = 0; i < ls; i++) k->mem[k->base[FC_BUF_SEND] + i] = (int64_t)(rng() % 2001) - 1000;
  memcpy(k->init, k->mem, k->memlen * sizeof(int64_t));
}

/* p2p: every op's buffer a region of its own between guards; send ops' buffers hold inputs. */
static void layout_rank_p2p(sim_t *sim, int r) {
  srank_t *k = &sim->rk[r];
  size_t at = GUARD;
  for (int b = 0; b < NBUF; b++) k->base[b] = k->len[b] = 0;
  for (int i = 0; i < sim->nops[r]; i++) {
    k->base[FC_BUF_EXT + i] = at;
    k->len[FC_BUF_EXT + i] = sim->ops[r][i].count;
    at += sim->ops[r][i].count + GUARD;
  }
  k->base[FC_BUF_SCRATCH] = at; /* no scratch: len 0 */
  k->memlen = at;
  if (k->memlen > k->memcap) {
    k->memcap = k->memlen;
    k->mem = realloc(k->mem, k->memcap * sizeof(int64_t));
    k->init = realloc(k->init, k->memcap * sizeof(int64_t));
    ck_assert(k->mem && k->init);
  }
  for (size_t i = 0; i < k->memlen; i++) k->mem[i] = (int64_t)(rng() | 1ULL << 62);
  for (int i = 0; i < sim->nops[r]; i++)
    if (sim->ops[r][i].is_send)
      for (size_t e = 0; e < sim->ops[r][i].count; e++)
        k->mem[k->base[FC_BUF_EXT + i] + e] = (int64_t)(rng() % 2001) - 1000;
  memcpy(k->init, k->mem, k->memlen * sizeof(int64_t));
}

/* Per-pair message ordinals: the k-th SEND a->b matches the k-th receive on b from a. */
static void number_messages(sim_t *sim, int r) {
  srank_t *k = &sim->rk[r];
  size_t nsend[MAXN] = {0};
  k->ord = grow(k->ord, &k->ordcap, (size_t)k->s.nsteps + 1, sizeof(size_t));
  memset(k->nrecv_from, 0, sizeof k->nrecv_from);
  for (int i = 0; i < k->s.nsteps; i++) {
    const fc_step_t *st = &k->s.steps[i];
    if (st->peer < 0 || st->peer >= sim->a.nranks) continue; /* reported by check_static */
    if (st->kind == FC_STEP_SEND) k->ord[i] = nsend[st->peer]++;
    if (st->kind == FC_STEP_RECV || st->kind == FC_STEP_RECV_REDUCE) k->ord[i] = k->nrecv_from[st->peer]++;
  }
}

static void sim_layout(sim_t *sim, int inplace, int op, int rendezvous, uint64_t seed) {
  sim->inplace = inplace;
  sim->op = op;
  sim->rendezvous = rendezvous;
  rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
  sim->arena_n = 0;
  memset(sim->recv_posted, 0, sizeof sim->recv_posted);
  for (int r = 0; r < sim->a.nranks; r++) {
    if (sim->p2p)
      layout_rank_p2p(sim, r);
    else
      layout_rank(sim, r);
    number_messages(sim, r);
    sim->rk[r].cur = 0;
    for (int p = 0; p < sim->a.nranks; p++) sim->q[r][p].n = 0;
  }
}

static int check_buf_ref(sim_t *sim, int r, int i, int buf, size_t off, size_t count) {
  const srank_t *k = &sim->rk[r];
  int valid = sim->p2p ? buf >= FC_BUF_EXT && buf < FC_BUF_EXT + sim->nops[r]
                       : buf == FC_BUF_SEND || buf == FC_BUF_RECV || buf == FC_BUF_SCRATCH;
  if (!valid) return sim_fail(sim, "rank %d step %d: bad buffer %d", r, i, buf);
  if (off > k->len[buf] || count > k->len[buf] - off)
    return sim_fail(sim, "rank %d step %d: [%zu,+%zu) outside buffer %d of %zu", r, i, off, count, buf,
                    k->len[buf]);
  if (buf == FC_BUF_RECV && !recv_writable(sim, r))
    return sim_fail(sim, "rank %d step %d: non-root of reduce references recv", r, i);
  if (buf == FC_BUF_SEND && !send_readable(sim, r))
    return sim_fail(sim, "rank %d step %d: non-root of broadcast references send", r, i);
  return 0;
}

static int check_step(sim_t *sim, int r, int i) {
  const fc_step_t *st = &sim->rk[r].s.steps[i];
  const int local = st->kind == FC_STEP_COPY || st->kind == FC_STEP_REDUCE;
  int comm = !local, has_src = st->kind == FC_STEP_RECV_REDUCE || local;
  if (st->kind > FC_STEP_REDUCE) return sim_fail(sim, "rank %d step %d: bad kind %d", r, i, st->kind);
  if (st->count == 0) return sim_fail(sim, "rank %d step %d: empty step", r, i);
  if (comm && (st->peer < 0 || st->peer >= sim->a.nranks || (st->peer == r && !sim->p2p)))
    return sim_fail(sim, "rank %d step %d: bad peer %d", r, i, st->peer);
  if (!comm && st->peer != -1) return sim_fail(sim, "rank %d step %d: local step with peer %d", r, i, st->peer);
  if (st->kind == FC_STEP_REDUCE && !reduces(sim->a.coll))
    return sim_fail(sim, "rank %d step %d: REDUCE in a collective that reduces nothing", r, i);
  if (!has_src && st->src_buf != FC_BUF_NONE) return sim_fail(sim, "rank %d step %d: stray src_buf", r, i);
  int input_buf = st->buf == FC_BUF_SEND ||
                  (sim->p2p && st->buf >= FC_BUF_EXT && st->buf < FC_BUF_EXT + sim->nops[r] &&
                   sim->ops[r][st->buf - FC_BUF_EXT].is_send);
  if (st->kind != FC_STEP_SEND && input_buf)
    return sim_fail(sim, "rank %d step %d: writes the user's send buffer", r, i);
  if (check_buf_ref(sim, r, i, st->buf, st->off, st->count)) return -1;
  if (has_src && check_buf_ref(sim, r, i, st->src_buf, st->src_off, st->count)) return -1;
  if (local && st->buf == st->src_buf && st->off == st->src_off)
    return sim_fail(sim, "rank %d step %d: a local step onto itself whatever the aliasing", r, i);
  return 0;
}

/* At most one message per peer and direction in a round: executors may tag messages by round. */
static int check_round_peers(sim_t *sim, int r, int round) {
  const fc_schedule_t *s = &sim->rk[r].s;
  for (int i = s->round_start[round]; i < s->round_start[round + 1]; i++)
    for (int j = i + 1; j < s->round_start[round + 1]; j++) {
      const fc_step_t *x = &s->steps[i], *y = &s->steps[j];
      if (x->peer < 0 || y->peer < 0 || x->peer != y->peer) continue; /* local steps */
      if ((x->kind == FC_STEP_SEND) == (y->kind == FC_STEP_SEND))
        return sim_fail(sim, "rank %d round %d: two messages with rank %d in one direction", r, round, x->peer);
    }
  return 0;
}

/* Structure, buffer use and result region of one rank's schedule. */
static int check_static(sim_t *sim, int r) {
  const fc_schedule_t *s = &sim->rk[r].s;
  if (s->nrounds > 0 && s->round_start[0] != 0) return sim_fail(sim, "rank %d: round 0 not at step 0", r);
  if ((s->nrounds ? s->round_start[s->nrounds] : 0) != s->nsteps)
    return sim_fail(sim, "rank %d: rounds do not cover the steps", r);
  for (int j = 0; j < s->nrounds; j++)
    if (s->round_start[j + 1] <= s->round_start[j]) return sim_fail(sim, "rank %d: round %d empty", r, j);
  for (int i = 0; i < s->nsteps; i++)
    if (check_step(sim, r, i)) return -1;
  for (int j = 0; j < s->nrounds && !sim->p2p; j++) /* a p2p batch is one round of any messages */
    if (check_round_peers(sim, r, j)) return -1;
  int has_result = !sim->p2p && reduces(sim->a.coll) && recv_writable(sim, r) && sim->a.count > 0;
  if (has_result && (s->result_buf != FC_BUF_RECV || s->result_off != 0 || s->result_count != sim->a.count))
    return sim_fail(sim, "rank %d: result region %d [%zu,+%zu)", r, s->result_buf, s->result_off, s->result_count);
  if (!has_result && s->result_count != 0) return sim_fail(sim, "rank %d: unexpected result region", r);
  return 0;
}

typedef struct {
  size_t lo, hi;
  int write, step;
} span_t;

static size_t addr(const srank_t *k, int buf, size_t off) { return k->base[buf] + off; }

static int overlap(size_t a, size_t b, size_t n) { return a < b + n && b < a + n; }

/* The memory each step of a round reads and writes (COPYs that the aliasing makes no-ops
 * excluded); returns the number of spans or -1. */
static int round_spans(sim_t *sim, int r, int round, span_t *sp) {
  const srank_t *k = &sim->rk[r];
  int ns = 0;
  for (int i = k->s.round_start[round]; i < k->s.round_start[round + 1]; i++) {
    const fc_step_t *st = &k->s.steps[i];
    size_t d = addr(k, st->buf, st->off), src = st->src_buf != FC_BUF_NONE ? addr(k, st->src_buf, st->src_off) : 0;
    if (st->src_buf != FC_BUF_NONE && d != src && overlap(d, src, st->count))
      return sim_fail(sim, "rank %d step %d: source and destination partly overlap", r, i);
    if (st->kind == FC_STEP_COPY && d == src) {
      if (!sim->inplace) return sim_fail(sim, "rank %d step %d: identity COPY out of place", r, i);
      continue; /* the executor skips it */
    }
    sp[ns++] = (span_t){d, d + st->count, st->kind != FC_STEP_SEND, i};
    if (st->src_buf != FC_BUF_NONE) sp[ns++] = (span_t){src, src + st->count, 0, i};
  }
  return ns;
}

static int check_round_conflicts(sim_t *sim, int r, int round) {
  const fc_schedule_t *s = &sim->rk[r].s;
  span_t sp[2 * MAX_ROUND_STEPS];
  if (s->round_start[round + 1] - s->round_start[round] > MAX_ROUND_STEPS)
    return sim_fail(sim, "rank %d round %d: too many steps for the checker", r, round);
  int ns = round_spans(sim, r, round, sp);
  for (int i = 0; i < ns; i++)
    for (int j = i + 1; j < ns; j++)
      if (sp[i].step != sp[j].step && (sp[i].write || sp[j].write) && sp[i].lo < sp[j].hi && sp[j].lo < sp[i].hi)
        return sim_fail(sim, "rank %d round %d: steps %d and %d touch the same memory (one writes)", r, round,
                        sp[i].step, sp[j].step);
  return ns < 0 ? -1 : 0;
}

/* Enter the rank's current round: sends take their data now (no step of the round writes it). */
static int post_round(sim_t *sim, int r) {
  srank_t *k = &sim->rk[r];
  if (check_round_conflicts(sim, r, k->cur)) return -1;
  for (int i = k->s.round_start[k->cur]; i < k->s.round_start[k->cur + 1]; i++) {
    const fc_step_t *st = &k->s.steps[i];
    if (st->kind != FC_STEP_SEND) {
      if (st->kind != FC_STEP_COPY && st->kind != FC_STEP_REDUCE) sim->recv_posted[r][st->peer]++;
      continue;
    }
    msgq_t *q = &sim->q[r][st->peer];
    q->v = grow(q->v, &q->cap, q->n + 1, sizeof(msg_t));
    q->v[q->n++] = (msg_t){sim->arena_n, st->count};
    sim->arena = grow(sim->arena, &sim->arena_cap, sim->arena_n + st->count, sizeof(int64_t));
    memcpy(sim->arena + sim->arena_n, k->mem + addr(k, st->buf, st->off), st->count * sizeof(int64_t));
    sim->arena_n += st->count;
  }
  return 0;
}

static int can_complete(const sim_t *sim, int r) {
  const srank_t *k = &sim->rk[r];
  for (int i = k->s.round_start[k->cur]; i < k->s.round_start[k->cur + 1]; i++) {
    const fc_step_t *st = &k->s.steps[i];
    if (st->kind == FC_STEP_SEND && sim->rendezvous && sim->recv_posted[st->peer][r] <= k->ord[i]) return 0;
    if ((st->kind == FC_STEP_RECV || st->kind == FC_STEP_RECV_REDUCE) && sim->q[st->peer][r].n <= k->ord[i])
      return 0;
  }
  return 1;
}

static int complete_round(sim_t *sim, int r) {
  srank_t *k = &sim->rk[r];
  for (int i = k->s.round_start[k->cur]; i < k->s.round_start[k->cur + 1]; i++) {
    const fc_step_t *st = &k->s.steps[i];
    int64_t *dst = k->mem + addr(k, st->buf, st->off);
    if (st->kind == FC_STEP_COPY) {
      memmove(dst, k->mem + addr(k, st->src_buf, st->src_off), st->count * sizeof(int64_t));
    } else if (st->kind == FC_STEP_REDUCE) {
      const int64_t *src = k->mem + addr(k, st->src_buf, st->src_off);
      for (size_t e = 0; e < st->count; e++) dst[e] = apply_op(sim->op, dst[e], src[e]);
    } else if (st->kind != FC_STEP_SEND) {
      const msg_t *m = &sim->q[st->peer][r].v[k->ord[i]];
      if (m->count != st->count)
        return sim_fail(sim, "rank %d step %d: receives %zu elements, rank %d sent %zu", r, i, st->count, st->peer,
                        m->count);
      const int64_t *in = sim->arena + m->off;
      if (st->kind == FC_STEP_RECV) {
        memcpy(dst, in, st->count * sizeof(int64_t));
      } else {
        const int64_t *src = k->mem + addr(k, st->src_buf, st->src_off); /* may be dst: element-wise */
        for (size_t e = 0; e < st->count; e++) dst[e] = apply_op(sim->op, src[e], in[e]);
      }
    }
  }
  k->cur++;
  return k->cur < k->s.nrounds ? post_round(sim, r) : 0;
}

/* Run all ranks to completion; deadlock = no rank can complete its round while some are left. */
static int sim_run(sim_t *sim) {
  int n = sim->a.nranks, progress = 1;
  for (int r = 0; r < n; r++)
    if (sim->rk[r].s.nrounds > 0 && post_round(sim, r)) return -1;
  while (progress) {
    progress = 0;
    for (int r = 0; r < n; r++)
      while (sim->rk[r].cur < sim->rk[r].s.nrounds && can_complete(sim, r)) {
        if (complete_round(sim, r)) return -1;
        progress = 1;
      }
  }
  for (int r = 0; r < n; r++)
    if (sim->rk[r].cur < sim->rk[r].s.nrounds)
      return sim_fail(sim, "deadlock: rank %d stuck in round %d of %d", r, sim->rk[r].cur, sim->rk[r].s.nrounds);
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++)
      if (sim->q[a][b].n != sim->rk[b].nrecv_from[a])
        return sim_fail(sim, "rank %d sent %zu messages to rank %d, which receives %zu", a, sim->q[a][b].n, b,
                        sim->rk[b].nrecv_from[a]);
  return 0;
}

static int64_t input(const sim_t *sim, int r, size_t i) {
  const srank_t *k = &sim->rk[r];
  return k->init[k->base[FC_BUF_SEND] + i];
}

static int64_t fold(const sim_t *sim, size_t i) {
  int64_t v = input(sim, 0, i);
  for (int q = 1; q < sim->a.nranks; q++) v = apply_op(sim->op, v, input(sim, q, i));
  return v;
}

/* What recv[i] of rank r must hold. */
static int64_t reference(const sim_t *sim, int r, size_t i) {
  size_t c = sim->a.count;
  switch (sim->a.coll) {
    case FC_COLL_ALLGATHER: return input(sim, (int)(i / c), i % c);
    case FC_COLL_REDUCE_SCATTER: return fold(sim, (size_t)r * c + i);
    case FC_COLL_BROADCAST: return input(sim, sim->a.root, i);
    case FC_COLL_ALLTOALL: return input(sim, (int)(i / c), (size_t)r * c + i % c);
    default: return fold(sim, i);
  }
}

/* recv holds the reference (HASH: the same bits as rank 0's, for allreduce); everything else
 * but scratch is as before the run. */
static int sim_verify(sim_t *sim) {
  for (int r = 0; r < sim->a.nranks; r++) {
    const srank_t *k = &sim->rk[r];
    size_t rb = k->base[FC_BUF_RECV], rl = recv_writable(sim, r) ? k->len[FC_BUF_RECV] : 0;
    for (size_t i = 0; i < k->base[FC_BUF_SCRATCH]; i++) {
      int in_recv = i >= rb && i < rb + rl;
      int64_t want = !in_recv ? k->init[i]
                     : sim->op == OP_HASH ? sim->rk[0].mem[sim->rk[0].base[FC_BUF_RECV] + i - rb]
                                          : reference(sim, r, i - rb);
      if (k->mem[i] != want)
        return sim_fail(sim, "rank %d: %s cell %zu is %lld, want %lld", r, in_recv ? "recv" : "non-recv",
                        in_recv ? i - rb : i, (long long)k->mem[i], (long long)want);
    }
    for (size_t i = k->base[FC_BUF_SCRATCH] + k->len[FC_BUF_SCRATCH]; i < k->memlen; i++)
      if (k->mem[i] != k->init[i]) return sim_fail(sim, "rank %d: guard after scratch overwritten", r);
  }
  return 0;
}

/* One full check of a configuration; NULL on success, else what went wrong. */
static const char *run_config(const fc_algo_args_t *a, int inplace, int op, int rendezvous) {
  sim_t *sim = &S;
  flexcoll_result_t res = sim_build(sim, a);
  if (res != FLEXCOLL_SUCCESS) {
    snprintf(sim->err, sizeof sim->err, "fc_algo_build failed: %d", (int)res);
    return sim->err;
  }
  sim_layout(sim, inplace, op, rendezvous, (uint64_t)a->count * 131 + (uint64_t)a->nranks * 7 + (uint64_t)a->root);
  for (int r = 0; r < a->nranks; r++)
    if (check_static(sim, r)) return sim->err;
  if (sim_run(sim) || sim_verify(sim)) return sim->err;
  return NULL;
}

#define CFG_FMT "%s/%s n=%d root=%d count=%zu chunk=%zu inplace=%d op=%d rdv=%d: %s"
#define CFG_ARGS(a, ip, op, rdv, e)                                                                         \
  fc_coll_name((a).coll), fc_algo_name((a).algo), (a).nranks, (a).root, (a).count, (a).chunk_count, ip, op, rdv, e

static void sweep_one(fc_algo_args_t a, int cfg) {
  static const size_t chunks[] = {0, 1, 3, 1000};
  for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
    a.chunk_count = chunks[ci];
    for (int inplace = 0; inplace < 2; inplace++) {
      /* A schedule never sees an in-place alltoall: the executors run it from a copy. */
      if (inplace && a.coll == FC_COLL_ALLTOALL) continue;
      int op = (cfg + (int)ci + inplace) % 2 ? OP_MAX : OP_SUM, rdv = 1;
      const char *e = run_config(&a, inplace, op, rdv);
      ck_assert_msg(e == NULL, CFG_FMT, CFG_ARGS(a, inplace, op, rdv, e));
      /* Bitwise agreement of allreduce results under an order-sensitive op; eager sends now and then. */
      if (a.coll == FC_COLL_ALLREDUCE && ci % 2 == (size_t)inplace) op = OP_HASH;
      else if ((cfg + (int)ci) % 5 == 0) rdv = 0;
      else continue;
      e = run_config(&a, inplace, op, rdv);
      ck_assert_msg(e == NULL, CFG_FMT, CFG_ARGS(a, inplace, op, rdv, e));
    }
  }
}

/* _i = coll * FC_NUM_ALGOS + algo. */
START_TEST(test_sweep) {
  fc_algo_args_t a = {0};
  a.coll = (fc_coll_t)(_i / FC_NUM_ALGOS);
  a.algo = (fc_algo_t)(_i % FC_NUM_ALGOS);
  int rooted = a.coll == FC_COLL_BROADCAST || a.coll == FC_COLL_REDUCE, cfg = 0;
  if (!fc_algo_supports(a.coll, a.algo)) {
    fc_schedule_t s;
    fc_schedule_init(&s);
    a.nranks = 4;
    ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_INVALID_ARGUMENT);
    fc_schedule_free(&s);
    return;
  }
  for (int n = 1; n <= MAXN; n++) {
    int roots[MAXN], nroots = 0;
    for (int r = 0; r < n; r++)
      if (r == 0 || (rooted && (n <= 5 || r == 1 || r == n / 2 || r == n - 1))) roots[nroots++] = r;
    size_t counts[] = {0, 1, 7, (size_t)n - 1, (size_t)n + 1, 1000, 12345};
    for (int ri = 0; ri < nroots; ri++)
      for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int dup = 0;
        for (size_t j = 0; j < k; j++) dup |= counts[j] == counts[k];
        if (dup) continue;
        a.nranks = n;
        a.root = roots[ri];
        a.count = counts[k];
        sweep_one(a, cfg++);
      }
  }
}
END_TEST

/* Ranks on several hosts: the hierarchy lib/sched/links.c hands the algorithms (hosts numbered by
 * their lowest rank, order host by host, pos its inverse), from a raw host per rank. */
static int h_host[MAXN], h_order[MAXN], h_pos[MAXN];

static void make_hierarchy(int n, const int *raw) {
  int id[MAXN], nh = 0;
  for (int r = 0; r < n; r++) {
    h_host[r] = -1;
    for (int q = 0; q < r && h_host[r] < 0; q++)
      if (raw[q] == raw[r]) h_host[r] = h_host[q];
    if (h_host[r] < 0) h_host[r] = nh++;
    id[r] = h_host[r];
  }
  int k = 0;
  for (int h = 0; h < nh; h++)
    for (int r = 0; r < n; r++)
      if (id[r] == h) { h_order[k] = r; h_pos[r] = k++; }
}

/* Every collective and algorithm with the ranks spread over hosts: round the hosts (2 and 3),
 * in uneven blocks, and scattered; results checked as in test_sweep (bitwise agreement of
 * allreduce under an order-sensitive op included).  _i = coll * FC_NUM_ALGOS + algo. */
START_TEST(test_hierarchy_sweep) {
  fc_algo_args_t a = {0};
  a.coll = (fc_coll_t)(_i / FC_NUM_ALGOS);
  a.algo = (fc_algo_t)(_i % FC_NUM_ALGOS);
  if (!fc_algo_supports(a.coll, a.algo)) return;
  int rooted = a.coll == FC_COLL_BROADCAST || a.coll == FC_COLL_REDUCE, cfg = 0;
  static const int sizes[] = {2, 3, 4, 5, 6, 7, 8, 11, 16};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    int n = sizes[si];
    for (int layout = 0; layout < 5; layout++) {
      int raw[MAXN];
      /* Layouts 0, 1 and 4 give equal hosts where n divides (the two-dimensional schedules). */
      for (int r = 0; r < n; r++)
        raw[r] = layout == 0   ? r % 2
                 : layout == 1 ? r % 3
                 : layout == 2 ? (r >= n / 3)
                 : layout == 3 ? (r * 7 + 3) % 5 % 3
                               : r % 4;
      make_hierarchy(n, raw);
      a.order = h_order;
      a.pos = h_pos;
      a.host = h_host;
      int roots[3] = {0, n - 1, n / 2}, nroots = rooted ? 3 : 1;
      size_t counts[] = {0, 1, 7, (size_t)n + 1, 1000};
      for (int ri = 0; ri < nroots; ri++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
          a.nranks = n;
          a.root = roots[ri];
          a.count = counts[k];
          sweep_one(a, cfg++);
        }
    }
  }
}
END_TEST

/* Ring allreduce over hosts of unequal sizes takes two dimensions (ring.c): every rank then sends
 * to other hosts about 2(H-1)/H of its own block, where the flat ring sends the whole message
 * (2(n-1)/n of it) over one pair per host boundary; checked on the schedules' steps, for counts
 * that leave empty blocks too.  (Their results: test_hierarchy_sweep, layouts 2 and 3.) */
/* Rank r's schedule of a: the elements it sends to ranks of other hosts (returned) and of its own
 * (*within, may be NULL), and its rounds (*rounds, may be NULL). */
static size_t sends_between_hosts(fc_algo_args_t a, int r, size_t *within, int *rounds) {
  fc_schedule_t sch;
  fc_schedule_init(&sch);
  a.rank = r;
  ck_assert_int_eq(fc_algo_build(&sch, &a), FLEXCOLL_SUCCESS);
  size_t cross = 0, same = 0;
  for (int i = 0; i < sch.nsteps; i++) {
    if (sch.steps[i].kind != FC_STEP_SEND) continue;
    if (h_host[sch.steps[i].peer] != h_host[r]) cross += sch.steps[i].count;
    else same += sch.steps[i].count;
  }
  if (within) *within = same;
  if (rounds) *rounds = sch.nrounds;
  fc_schedule_free(&sch);
  return cross;
}

START_TEST(test_uneven_hosts_two_dimensions) {
  static const int layouts[][12] = {
      {0, 0, 1, 1, 1, -1},                      /* 2 + 3 */
      {0, 0, 0, 1, 1, 1, 1, 1, 2, -1},          /* 3 + 5 + 1 */
      {0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, -1},    /* 1 + 3 + 7 */
      {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, -1},    /* 7 + 4 */
  };
  for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
    int n = 0, nh = 0;
    while (layouts[li][n] >= 0) nh = layouts[li][n] + 1 > nh ? layouts[li][n] + 1 : nh, n++;
    make_hierarchy(n, layouts[li]);
    int most = 0, least = n;
    for (int h = 0; h < nh; h++) {
      int l = 0;
      for (int r = 0; r < n; r++) l += h_host[r] == h;
      most = l > most ? l : most, least = l < least ? l : least;
    }
    static const size_t counts[] = {1, 5, 1000, 100003};
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
      const size_t c = counts[ci];
      fc_algo_args_t a = {FC_COLL_ALLREDUCE, FC_ALGO_RING, 0, n, 0, c, 0, h_order, h_pos, h_host, 0};
      size_t max_cross = 0;
      int senders = 0;
      for (int r = 0; r < n; r++) {
        const size_t cross = sends_between_hosts(a, r, NULL, NULL);
        max_cross = cross > max_cross ? cross : max_cross;
        senders += cross > 0;
      }
      /* a rank's block is at most ceil(c / least) of the message; 2(H-1)/H of it crosses, plus
       * the rounding of its sub-blocks */
      const double bound = 2.0 * (nh - 1) / nh * (double)((c + (size_t)least - 1) / (size_t)least) + 2.0 * nh;
      ck_assert_msg((double)max_cross <= bound, "layout %zu, count %zu: a rank sends %zu elements to other hosts (at most %.0f)",
                    li, c, max_cross, bound);
      if (c >= 1000) {
        ck_assert_msg(senders > nh, "layout %zu, count %zu: %d ranks send between hosts, as the flat ring's %d", li, c,
                      senders, nh);
        ck_assert_msg((double)max_cross < 2.0 * (n - 1) / n * (double)c * 0.9,
                      "layout %zu, count %zu: %zu elements between hosts, no less than the flat ring", li, c, max_cross);
      }
    }
  }
}
END_TEST

/* Allgather and reduce_scatter over hosts of equally many ranks run in two dimensions (ring.c):
 * every rank sends exactly H-1 blocks to other hosts (its position's ring), where the flat ring
 * has one rank per host boundary send n-1 blocks; and in H + L - 1 rounds instead of n-1 (the
 * allgather's last round unpacks, the reduce_scatter's first one packs).  Checked on the
 * schedules' steps for 2 x 2, 2 x 4, 3 x 2 and 4 x 3, ranks round the hosts and in blocks; and
 * flat_ring (the tuner's choice for large sizes) keeps the flat ring.  (Their results:
 * test_hierarchy_sweep.) */
START_TEST(test_equal_hosts_two_dimensions) {
  static const int shapes[][2] = {{2, 2}, {2, 4}, {3, 2}, {4, 3}};
  static const fc_coll_t colls[] = {FC_COLL_ALLGATHER, FC_COLL_REDUCE_SCATTER};
  for (size_t ki = 0; ki < 2; ki++)
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
      for (int blocks = 0; blocks <= 1; blocks++) {
        const int H = shapes[si][0], L = shapes[si][1], n = H * L;
        const char *name = ki ? "reduce_scatter" : "allgather";
        int raw[MAXN];
        for (int r = 0; r < n; r++) raw[r] = blocks ? r / L : r % H;
        make_hierarchy(n, raw);
        const size_t c = 1000;
        fc_algo_args_t a = {colls[ki], FC_ALGO_RING, 0, n, 0, c, 0, h_order, h_pos, h_host, 0};
        for (int r = 0; r < n; r++) {
          size_t within;
          int rounds;
          const size_t cross = sends_between_hosts(a, r, &within, &rounds);
          ck_assert_msg(cross == (size_t)(H - 1) * c, "%s %d x %d: rank %d sends %zu elements to other hosts, not %zu",
                        name, H, L, r, cross, (size_t)(H - 1) * c);
          ck_assert_msg(within == (size_t)(L - 1) * (size_t)H * c, "%s %d x %d: rank %d sends %zu within its host", name,
                        H, L, r, within);
          ck_assert_msg(rounds == H + L - 1, "%s %d x %d: rank %d has %d rounds, not %d", name, H, L, r, rounds,
                        H + L - 1);
        }
        a.flat_ring = 1;
        size_t most_cross = 0;
        for (int r = 0; r < n; r++) {
          int rounds;
          const size_t cross = sends_between_hosts(a, r, NULL, &rounds);
          most_cross = cross > most_cross ? cross : most_cross;
          ck_assert_int_eq(rounds, n - 1);
        }
        ck_assert_msg(most_cross == (size_t)(n - 1) * c, "%s %d x %d flat: the boundary rank sends %zu to the next host",
                      name, H, L, most_cross);
      }
}
END_TEST

/* The simulator itself must catch the faults it is there to catch. */
static void hand_schedule(int r, const fc_step_t *steps, const int *round_of, int nsteps) {
  fc_build_t b = {&S.rk[r].s, FLEXCOLL_SUCCESS};
  fc_schedule_reset(b.s);
  for (int i = 0; i < nsteps; i++) {
    if (i > 0 && round_of[i] != round_of[i - 1]) fc_build_round(&b);
    const fc_step_t *st = &steps[i];
    fc_build_step(&b, (fc_step_kind_t)st->kind, st->peer, (fc_buf_t)st->buf, st->off, (fc_buf_t)st->src_buf,
                  st->src_off, st->count);
  }
  ck_assert_int_eq(b.err, FLEXCOLL_SUCCESS);
}

static const char *run_hand(const fc_step_t *s0, const int *r0, int n0, const fc_step_t *s1, const int *r1, int n1,
                            int rendezvous) {
  fc_algo_args_t a = {FC_COLL_ALLREDUCE, FC_ALGO_RING, 0, 2, 0, 8, 0, NULL, NULL, NULL, 0};
  ck_assert_int_eq(sim_build(&S, &a), FLEXCOLL_SUCCESS);
  hand_schedule(0, s0, r0, n0);
  hand_schedule(1, s1, r1, n1);
  sim_layout(&S, 0, OP_SUM, rendezvous, 1);
  return sim_run(&S) ? S.err : NULL;
}

#define SEND_(peer, buf, off, n) {FC_STEP_SEND, buf, FC_BUF_NONE, peer, off, 0, n}
#define RECV_(peer, buf, off, n) {FC_STEP_RECV, buf, FC_BUF_NONE, peer, off, 0, n}

START_TEST(test_simulator_catches_faults) {
  const int seq[] = {0, 1}, same[] = {0, 0};
  /* Both receive first: deadlock even with buffered sends. */
  fc_step_t rs0[] = {RECV_(1, FC_BUF_RECV, 0, 4), SEND_(1, FC_BUF_SEND, 0, 4)};
  fc_step_t rs1[] = {RECV_(0, FC_BUF_RECV, 0, 4), SEND_(0, FC_BUF_SEND, 0, 4)};
  const char *e = run_hand(rs0, seq, 2, rs1, seq, 2, 0);
  ck_assert_ptr_nonnull(e);
  ck_assert_ptr_nonnull(strstr(e, "deadlock"));
  /* Both send first, then receive: fine when buffered, a deadlock with rendezvous sends. */
  fc_step_t sr0[] = {SEND_(1, FC_BUF_SEND, 0, 4), RECV_(1, FC_BUF_RECV, 0, 4)};
  fc_step_t sr1[] = {SEND_(0, FC_BUF_SEND, 0, 4), RECV_(0, FC_BUF_RECV, 0, 4)};
  ck_assert_ptr_null(run_hand(sr0, seq, 2, sr1, seq, 2, 0));
  e = run_hand(sr0, seq, 2, sr1, seq, 2, 1);
  ck_assert_ptr_nonnull(e);
  ck_assert_ptr_nonnull(strstr(e, "deadlock"));
  /* One round sending recv[0,4) while receiving into recv[2,6): a race. */
  fc_step_t c0[] = {SEND_(1, FC_BUF_RECV, 0, 4), RECV_(1, FC_BUF_RECV, 2, 4)};
  fc_step_t c1[] = {SEND_(0, FC_BUF_SEND, 0, 4), RECV_(0, FC_BUF_RECV, 0, 4)};
  e = run_hand(c0, same, 2, c1, same, 2, 1);
  ck_assert_ptr_nonnull(e);
  ck_assert_ptr_nonnull(strstr(e, "same memory"));
  /* Counts that do not match. */
  fc_step_t m0[] = {SEND_(1, FC_BUF_SEND, 0, 3)};
  fc_step_t m1[] = {RECV_(0, FC_BUF_RECV, 0, 4)};
  e = run_hand(m0, same, 1, m1, same, 1, 1);
  ck_assert_ptr_nonnull(e);
  ck_assert_ptr_nonnull(strstr(e, "receives 4"));
  /* A message nobody receives. */
  e = run_hand(m0, same, 1, m1, same, 0, 0);
  ck_assert_ptr_nonnull(e);
  ck_assert_ptr_nonnull(strstr(e, "sent 1 messages"));
}
END_TEST

START_TEST(test_verify_catches_wrong_data) {
  /* A correct schedule whose reduction is then dropped on one rank must fail verification. */
  fc_algo_args_t a = {FC_COLL_ALLREDUCE, FC_ALGO_RING, 0, 3, 0, 10, 0, NULL, NULL, NULL, 0};
  ck_assert_int_eq(sim_build(&S, &a), FLEXCOLL_SUCCESS);
  fc_step_t *st = &S.rk[1].s.steps[1];
  ck_assert_int_eq(st->kind, FC_STEP_RECV_REDUCE);
  st->kind = FC_STEP_RECV;
  st->src_buf = FC_BUF_NONE;
  sim_layout(&S, 0, OP_SUM, 1, 5);
  ck_assert_int_eq(sim_run(&S), 0);
  ck_assert_int_ne(sim_verify(&S), 0);
  ck_assert_ptr_nonnull(strstr(S.err, "recv cell"));
}
END_TEST

START_TEST(test_names) {
  ck_assert_str_eq(fc_algo_name(FC_ALGO_RING), "ring");
  ck_assert_str_eq(fc_algo_name(FC_ALGO_TREE), "tree");
  ck_assert_str_eq(fc_algo_name(FC_ALGO_EXCHANGE), "exchange");
  ck_assert_str_eq(fc_algo_name((fc_algo_t)99), "unknown");
  ck_assert_str_eq(fc_coll_name(FC_COLL_REDUCE_SCATTER), "reduce_scatter");
  ck_assert_str_eq(fc_coll_name(FC_COLL_ALLTOALL), "alltoall");
  for (int c = 0; c < FC_NUM_COLLS; c++) ck_assert_str_ne(fc_coll_name((fc_coll_t)c), "unknown");
  ck_assert_str_eq(fc_coll_name((fc_coll_t)-1), "unknown");
  ck_assert_int_eq(fc_algo_from_name("RiNg"), FC_ALGO_RING);
  ck_assert_int_eq(fc_algo_from_name("tree"), FC_ALGO_TREE);
  ck_assert_int_eq(fc_algo_from_name("Exchange"), FC_ALGO_EXCHANGE);
  ck_assert_int_eq(fc_algo_from_name("tre"), -1);
  ck_assert_int_eq(fc_algo_from_name("trees"), -1);
  ck_assert_int_eq(fc_algo_from_name(""), -1);
  ck_assert_int_eq(fc_algo_from_name(NULL), -1);
}
END_TEST

START_TEST(test_counts_and_support) {
  ck_assert_uint_eq(fc_coll_send_count(FC_COLL_ALLREDUCE, 5, 4), 5);
  ck_assert_uint_eq(fc_coll_recv_count(FC_COLL_ALLGATHER, 5, 4), 20);
  ck_assert_uint_eq(fc_coll_send_count(FC_COLL_ALLGATHER, 5, 4), 5);
  ck_assert_uint_eq(fc_coll_send_count(FC_COLL_REDUCE_SCATTER, 5, 4), 20);
  ck_assert_uint_eq(fc_coll_recv_count(FC_COLL_REDUCE_SCATTER, 5, 4), 5);
  ck_assert_uint_eq(fc_coll_recv_count(FC_COLL_BROADCAST, 5, 4), 5);
  ck_assert_uint_eq(fc_coll_recv_count(FC_COLL_REDUCE, 5, 4), 5);
  ck_assert_uint_eq(fc_coll_recv_count(FC_COLL_ALLGATHER, SIZE_MAX / 2, 4), SIZE_MAX);
  ck_assert_uint_eq(fc_coll_send_count(FC_COLL_ALLTOALL, 5, 4), 20);
  ck_assert_uint_eq(fc_coll_recv_count(FC_COLL_ALLTOALL, 5, 4), 20);
  ck_assert_uint_eq(fc_coll_send_count(FC_COLL_ALLTOALL, 5, 1), 5);
  ck_assert_uint_eq(fc_coll_send_count(FC_COLL_ALLTOALL, SIZE_MAX / 2, 4), SIZE_MAX);
  for (int c = 0; c < FC_NUM_COLLS; c++) {
    ck_assert_int_eq(fc_algo_supports((fc_coll_t)c, FC_ALGO_RING), 1);
    ck_assert_int_eq(fc_algo_supports((fc_coll_t)c, FC_ALGO_TREE),
                     c != FC_COLL_REDUCE_SCATTER && c != FC_COLL_ALLTOALL);
    ck_assert_int_eq(fc_algo_supports((fc_coll_t)c, FC_ALGO_EXCHANGE), 1);
  }
  ck_assert_int_eq(fc_algo_supports(FC_NUM_COLLS, FC_ALGO_RING), 0);
  ck_assert_int_eq(fc_algo_supports(FC_COLL_ALLREDUCE, FC_NUM_ALGOS), 0);
}
END_TEST

/* What a rank reads and writes of the caller's buffers (fc_coll_io), out of place and in place as
 * NCCL lays in-place buffers out (allgather: send at its block of recv; reduce_scatter: recv at
 * its block of send; the rest: the same pointer), for every collective, rank and root. */
START_TEST(test_coll_io) {
  static char arena[1 << 16];
  const size_t es = 4, counts[] = {1, 5, 7};
  for (int c = 0; c < FC_NUM_COLLS; c++)
    for (int n = 1; n <= 4; n++)
      for (int rank = 0; rank < n; rank++)
        for (int root = 0; root < n; root += n > 1 ? n - 1 : 1)
          for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
            for (int in_place = 0; in_place < 2; in_place++) {
              const size_t count = counts[k], block = (size_t)rank * count * es;
              fc_algo_args_t a = {.coll = (fc_coll_t)c, .rank = rank, .nranks = n, .root = root, .count = count};
              char *send = arena, *recv = arena + (1 << 15);
              if (in_place && c == FC_COLL_ALLGATHER) send = recv + block;
              else if (in_place && c == FC_COLL_REDUCE_SCATTER) recv = send + block;
              else if (in_place) send = recv;
              const fc_coll_io_t io = fc_coll_io(&a, send, recv, es);
              /* Recv inside send (reduce_scatter, rank 0 included) and alltoall are never "inside". */
              const int inside = in_place && c != FC_COLL_ALLTOALL && (c != FC_COLL_REDUCE_SCATTER || n == 1);
              ck_assert_msg(io.send_in_recv == inside && io.send_off == (inside && c == FC_COLL_ALLGATHER ? block : 0),
                            "%s n %d rank %d count %zu %s: send_in_recv %d at %zu", fc_coll_name((fc_coll_t)c), n,
                            rank, count, in_place ? "in place" : "out of place", io.send_in_recv, io.send_off);
              ck_assert_int_eq(io.send_read, !(c == FC_COLL_BROADCAST && rank != root));
              ck_assert_int_eq(io.recv_written, !(c == FC_COLL_REDUCE && rank != root));
            }
  /* No buffer, nothing to read or write; a send that starts inside recv but runs past its end is
   * not inside. */
  fc_algo_args_t a = {.coll = FC_COLL_BROADCAST, .rank = 1, .nranks = 2, .root = 0, .count = 8};
  fc_coll_io_t io = fc_coll_io(&a, NULL, arena, 4);
  ck_assert(!io.send_read && !io.send_in_recv && io.recv_written);
  a.coll = FC_COLL_ALLREDUCE;
  io = fc_coll_io(&a, arena + 4, arena, 4);
  ck_assert(io.send_read && !io.send_in_recv && io.recv_written);
  io = fc_coll_io(&a, arena, NULL, 4);
  ck_assert(io.send_read && !io.send_in_recv && !io.recv_written);
}
END_TEST

START_TEST(test_invalid_args_and_reuse) {
  fc_schedule_t s;
  fc_schedule_init(&s);
  fc_algo_args_t ok = {FC_COLL_BROADCAST, FC_ALGO_TREE, 2, 5, 4, 100, 7, NULL, NULL, NULL, 0}, a;
  ck_assert_int_eq(fc_algo_build(NULL, &ok), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_algo_build(&s, NULL), FLEXCOLL_INVALID_ARGUMENT);
  a = ok, a.nranks = 0, a.rank = 0, a.root = 0;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_INVALID_ARGUMENT);
  a = ok, a.rank = 5;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_INVALID_ARGUMENT);
  a = ok, a.root = -1;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_INVALID_ARGUMENT);
  a = ok, a.coll = FC_NUM_COLLS;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_INVALID_ARGUMENT);
  a = ok, a.algo = FC_NUM_ALGOS;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_INVALID_ARGUMENT);
  a = ok, a.coll = FC_COLL_ALLGATHER, a.count = SIZE_MAX / 4;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(s.nsteps, 0);
  ck_assert_int_eq(s.nrounds, 0);
  /* Root is ignored where the collective has none. */
  a = ok, a.coll = FC_COLL_ALLREDUCE, a.root = 99;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_SUCCESS);
  /* Rebuilding into a used schedule gives the same steps as a fresh one. */
  fc_schedule_t fresh;
  fc_schedule_init(&fresh);
  ck_assert_int_eq(fc_algo_build(&s, &ok), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_algo_build(&fresh, &ok), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(s.nsteps, fresh.nsteps);
  ck_assert_int_eq(s.nrounds, fresh.nrounds);
  ck_assert_int_eq(memcmp(s.steps, fresh.steps, (size_t)s.nsteps * sizeof(fc_step_t)), 0);
  ck_assert_int_eq(memcmp(s.round_start, fresh.round_start, (size_t)(s.nrounds + 1) * sizeof(int)), 0);
  /* An empty collective is an empty schedule that still has round_start[0]. */
  a = ok, a.count = 0;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(s.nrounds, 0);
  ck_assert_ptr_nonnull(s.round_start);
  ck_assert_int_eq(s.round_start[0], 0);
  fc_schedule_free(&s);
  fc_schedule_free(&fresh);
  fc_schedule_free(&s); /* free after free is harmless: free re-initialises */
}
END_TEST

/* Alltoall's shape: the own-block COPY beside round 1, then one SEND to r+k and one RECV from r-k
 * per round k; empty for count 0, one COPY for one rank.  (The sweep checks its data.) */
START_TEST(test_alltoall_shape) {
  fc_schedule_t s;
  fc_schedule_init(&s);
  fc_algo_args_t a = {FC_COLL_ALLTOALL, FC_ALGO_RING, 0, 1, 0, 6, 0, NULL, NULL, NULL, 0};
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(s.nrounds, 1);
  ck_assert_int_eq(s.nsteps, 1);
  ck_assert_int_eq(s.steps[0].kind, FC_STEP_COPY);
  ck_assert_uint_eq(s.steps[0].count, 6);
  for (int n = 2; n <= 9; n++)
    for (int r = 0; r < n; r++) {
      a.nranks = n, a.rank = r, a.count = 3;
      ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_SUCCESS);
      ck_assert_int_eq(s.nrounds, n - 1);
      ck_assert_int_eq(s.nsteps, 2 * (n - 1) + 1);
      ck_assert_uint_eq(s.scratch_count, 0);
      ck_assert_uint_eq(s.result_count, 0);
      ck_assert_int_eq(s.steps[0].kind, FC_STEP_COPY);
      ck_assert_uint_eq(s.steps[0].off, (size_t)r * 3);
      ck_assert_uint_eq(s.steps[0].src_off, (size_t)r * 3);
      for (int k = 1; k < n; k++) {
        const fc_step_t *x = &s.steps[s.round_start[k - 1] + (k == 1)], *y = x + 1;
        ck_assert_int_eq(s.round_start[k] - s.round_start[k - 1], k == 1 ? 3 : 2);
        ck_assert_int_eq(x->kind, FC_STEP_SEND);
        ck_assert_int_eq(x->peer, (r + k) % n);
        ck_assert_uint_eq(x->off, (size_t)((r + k) % n) * 3);
        ck_assert_int_eq(y->kind, FC_STEP_RECV);
        ck_assert_int_eq(y->peer, (r - k + n) % n);
        ck_assert_uint_eq(y->off, (size_t)((r - k + n) % n) * 3);
      }
      a.count = 0;
      ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_SUCCESS);
      ck_assert_int_eq(s.nrounds, 0);
      ck_assert_int_eq(s.nsteps, 0);
    }
  a.algo = FC_ALGO_TREE, a.count = 3;
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_INVALID_ARGUMENT);
  fc_schedule_free(&s);
}
END_TEST

/* Point-to-point batches.  mper[a][b] messages go from a to b (a == b included); each gets a
 * random count, 0 now and then.  Every rank's ops are its sends and receives in a random
 * interleaving that keeps each (direction, peer) sequence in order, as the API's matching needs. */
static size_t pair_counts[MAXN][MAXN][FC_P2P_MAX_OPS];

static void gen_batch(sim_t *sim, int n, int mper[MAXN][MAXN]) {
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++)
      for (int m = 0; m < mper[a][b]; m++) pair_counts[a][b][m] = rng() % 5 == 0 ? 0 : rng() % 40 + 1;
  for (int r = 0; r < n; r++) {
    fc_p2p_op_t *ops = sim->ops[r];
    int no = 0, used[2][MAXN] = {{0}};
    for (int p = 0; p < n; p++) {
      for (int m = 0; m < mper[r][p]; m++) ops[no++] = (fc_p2p_op_t){1, p, 0};
      for (int m = 0; m < mper[p][r]; m++) ops[no++] = (fc_p2p_op_t){0, p, 0};
    }
    ck_assert_int_le(no, FC_P2P_MAX_OPS);
    for (int i = no - 1; i > 0; i--) { /* Fisher-Yates, then the counts in per-pair order */
      int j = (int)(rng() % (uint64_t)(i + 1));
      fc_p2p_op_t tmp = ops[i];
      ops[i] = ops[j];
      ops[j] = tmp;
    }
    for (int i = 0; i < no; i++) {
      int p = ops[i].peer, m = used[ops[i].is_send][p]++;
      ops[i].count = ops[i].is_send ? pair_counts[r][p][m] : pair_counts[p][r][m];
    }
    sim->nops[r] = no;
  }
}

/* Receive op i of rank r must hold the matching send's data: the j-th receive from a is the j-th
 * send of a to r.  Every other cell (send buffers, guards) is as before. */
static int p2p_verify(sim_t *sim) {
  static int64_t *want;
  static size_t wantcap;
  for (int r = 0; r < sim->a.nranks; r++) {
    const srank_t *k = &sim->rk[r];
    const fc_p2p_op_t *ops = sim->ops[r];
    int nrecv[MAXN] = {0};
    want = grow(want, &wantcap, k->memlen + 1, sizeof(int64_t));
    memcpy(want, k->init, k->memlen * sizeof(int64_t));
    for (int i = 0; i < sim->nops[r]; i++) {
      if (ops[i].is_send) continue;
      int a = ops[i].peer, j = nrecv[a]++, si = -1;
      for (int i2 = 0; i2 < sim->nops[a] && si < 0; i2++)
        if (sim->ops[a][i2].is_send && sim->ops[a][i2].peer == r && j-- == 0) si = i2;
      if (si < 0 || sim->ops[a][si].count != ops[i].count)
        return sim_fail(sim, "rank %d op %d: test bug: no matching send", r, i);
      memcpy(want + k->base[FC_BUF_EXT + i], sim->rk[a].init + sim->rk[a].base[FC_BUF_EXT + si],
             ops[i].count * sizeof(int64_t));
    }
    for (size_t c = 0; c < k->memlen; c++)
      if (k->mem[c] != want[c])
        return sim_fail(sim, "rank %d: cell %zu is %lld, want %lld", r, c, (long long)k->mem[c], (long long)want[c]);
  }
  return 0;
}

/* Build every rank's batch, check each schedule against its ops, simulate and verify. */
static const char *run_p2p(sim_t *sim, int n, int rendezvous, uint64_t seed) {
  fc_algo_args_t a = {FC_COLL_ALLTOALL, FC_ALGO_RING, 0, n, 0, 0, 0, NULL, NULL, NULL, 0};
  sim->a = a;
  sim->p2p = 1;
  sim->err[0] = 0;
  for (int r = 0; r < n; r++) {
    fc_schedule_t *s = &sim->rk[r].s;
    const fc_p2p_op_t *ops = sim->ops[r];
    if (fc_algo_build_p2p(s, ops, sim->nops[r]) != FLEXCOLL_SUCCESS) return "fc_algo_build_p2p failed";
    int st = 0;
    for (int i = 0; i < sim->nops[r]; i++) {
      if (ops[i].count == 0) continue;
      if (st >= s->nsteps) return "schedule lacks steps";
      const fc_step_t *x = &s->steps[st++];
      if (x->kind != (ops[i].is_send ? FC_STEP_SEND : FC_STEP_RECV) ||
          x->buf != FC_BUF_EXT + i || x->peer != ops[i].peer || x->off != 0 || x->count != ops[i].count ||
          x->src_buf != FC_BUF_NONE)
        return "schedule does not follow the ops";
    }
    if (st != s->nsteps || s->nrounds != (st > 0) || s->result_count != 0 || s->scratch_count != 0)
      return "schedule has stray steps or rounds";
  }
  sim_layout(sim, 0, OP_SUM, rendezvous, seed);
  for (int r = 0; r < n; r++)
    if (check_static(sim, r)) return sim->err;
  if (sim_run(sim) || p2p_verify(sim)) return sim->err;
  return NULL;
}

START_TEST(test_p2p_batches) {
  static int mper[MAXN][MAXN];
  for (int n = 1; n <= MAXN; n++)
    for (int it = 0; it < 12; it++) {
      uint64_t seed = (uint64_t)n * 1000 + (uint64_t)it;
      rng_state = seed * 0x9E3779B97F4A7C15ULL + 7;
      int density = 1 + it % 4; /* a pair talks with probability density/4 */
      for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) mper[a][b] = rng() % 4 < (uint64_t)density ? (int)(rng() % 4) : 0;
      gen_batch(&S, n, mper);
      int rdv = it % 2;
      const char *e = run_p2p(&S, n, rdv, seed);
      ck_assert_msg(e == NULL, "p2p n=%d it=%d rdv=%d: %s", n, it, rdv, e);
    }
  /* A full batch: 250 ops on rank 0 (the last buffer index is FC_BUF_EXT + 249), self-messages too. */
  memset(mper, 0, sizeof mper);
  mper[0][1] = mper[1][0] = 100;
  mper[0][0] = 25;
  for (int rdv = 0; rdv < 2; rdv++) {
    rng_state = 99 + (uint64_t)rdv;
    gen_batch(&S, 2, mper);
    ck_assert_int_eq(S.nops[0], FC_P2P_MAX_OPS);
    const char *e = run_p2p(&S, 2, rdv, 3);
    ck_assert_msg(e == NULL, "full p2p batch rdv=%d: %s", rdv, e);
  }
  /* The simulator catches a batch whose pair sequences disagree (counts swapped on one side). */
  memset(mper, 0, sizeof mper);
  mper[0][1] = 2;
  rng_state = 5;
  gen_batch(&S, 2, mper);
  S.ops[0][0].count = 3, S.ops[0][1].count = 4;
  S.ops[1][0].count = 4, S.ops[1][1].count = 3;
  const char *e = run_p2p(&S, 2, 1, 3);
  ck_assert_ptr_nonnull(e);
  ck_assert_ptr_nonnull(strstr(e, "receives"));
}
END_TEST

START_TEST(test_p2p_invalid_and_empty) {
  fc_schedule_t s;
  fc_schedule_init(&s);
  fc_p2p_op_t ops[FC_P2P_MAX_OPS + 1];
  for (int i = 0; i <= FC_P2P_MAX_OPS; i++) ops[i] = (fc_p2p_op_t){i % 2, i % 3, 1};
  ck_assert_int_eq(fc_algo_build_p2p(&s, ops, FC_P2P_MAX_OPS), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(s.nrounds, 1);
  ck_assert_int_eq(s.nsteps, FC_P2P_MAX_OPS);
  ck_assert_int_eq(s.steps[FC_P2P_MAX_OPS - 1].buf, FC_BUF_EXT + FC_P2P_MAX_OPS - 1);
  ck_assert_int_eq(fc_algo_build_p2p(NULL, ops, 1), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_algo_build_p2p(&s, ops, FC_P2P_MAX_OPS + 1), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(s.nsteps, 0);
  ck_assert_int_eq(s.nrounds, 0);
  ck_assert_int_eq(fc_algo_build_p2p(&s, ops, -1), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_algo_build_p2p(&s, NULL, 1), FLEXCOLL_INVALID_ARGUMENT);
  ops[3].peer = -1;
  ck_assert_int_eq(fc_algo_build_p2p(&s, ops, 4), FLEXCOLL_INVALID_ARGUMENT);
  ops[3].peer = 0, ops[3].is_send = 2;
  ck_assert_int_eq(fc_algo_build_p2p(&s, ops, 4), FLEXCOLL_INVALID_ARGUMENT);
  ops[3].is_send = -1, ops[3].count = 0; /* checked even when the op is empty */
  ck_assert_int_eq(fc_algo_build_p2p(&s, ops, 4), FLEXCOLL_INVALID_ARGUMENT);
  ops[3].is_send = 1;
  /* Empty: no ops, or only count-0 ops, is no round at all (round_start[0] still there). */
  ck_assert_int_eq(fc_algo_build_p2p(&s, NULL, 0), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(s.nrounds, 0);
  ck_assert_int_eq(s.round_start[0], 0);
  ops[0].count = ops[1].count = 0;
  ck_assert_int_eq(fc_algo_build_p2p(&s, ops, 2), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(s.nrounds, 0);
  ck_assert_int_eq(s.nsteps, 0);
  /* Count-0 ops are skipped but keep their buffer index; a reused schedule loses its old result. */
  fc_algo_args_t a = {FC_COLL_ALLREDUCE, FC_ALGO_RING, 0, 2, 0, 8, 0, NULL, NULL, NULL, 0};
  ck_assert_int_eq(fc_algo_build(&s, &a), FLEXCOLL_SUCCESS);
  ck_assert_uint_ne(s.result_count, 0);
  ck_assert_int_eq(fc_algo_build_p2p(&s, ops, 3), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(s.nrounds, 1);
  ck_assert_int_eq(s.nsteps, 1);
  ck_assert_int_eq(s.steps[0].buf, FC_BUF_EXT + 2);
  ck_assert_int_eq(s.steps[0].kind, FC_STEP_RECV);
  ck_assert_int_eq(s.steps[0].peer, 2);
  ck_assert_uint_eq(s.result_count, 0);
  ck_assert_int_eq(s.result_buf, FC_BUF_NONE);
  ck_assert_uint_eq(s.scratch_count, 0);
  fc_schedule_free(&s);
}
END_TEST

static Suite *schedule_suite(void) {
  Suite *su = suite_create("schedule");
  TCase *tc = tcase_create("api");
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_counts_and_support);
  tcase_add_test(tc, test_coll_io);
  tcase_add_test(tc, test_invalid_args_and_reuse);
  tcase_add_test(tc, test_simulator_catches_faults);
  tcase_add_test(tc, test_verify_catches_wrong_data);
  tcase_add_test(tc, test_alltoall_shape);
  tcase_add_test(tc, test_p2p_invalid_and_empty);
  suite_add_tcase(su, tc);
  tc = tcase_create("simulate");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_sweep, 0, FC_NUM_COLLS * FC_NUM_ALGOS);
  tcase_add_loop_test(tc, test_hierarchy_sweep, 0, FC_NUM_COLLS * FC_NUM_ALGOS);
  tcase_add_test(tc, test_equal_hosts_two_dimensions);
  tcase_add_test(tc, test_uneven_hosts_two_dimensions);
  tcase_add_test(tc, test_p2p_batches);
  suite_add_tcase(su, tc);
  return su;
}

int main(void) {
  for (int r = 0; r < MAXN; r++) fc_schedule_init(&S.rk[r].s);
  SRunner *sr = srunner_create(schedule_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
