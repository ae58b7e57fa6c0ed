/* schedule.c — the schedule container, the step/round builder helpers, fc_algo_build's
 * argument checks and dispatch to ring.c / tree.c, and point-to-point batches
 * (fc_algo_build_p2p).  Pure C, no I/O. */
#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "build.h"

void fc_schedule_init(fc_schedule_t *s) {
  memset(s, 0, sizeof *s);
  s->result_buf = FC_BUF_NONE;
}

/* Keeps the arrays: the communicator reuses one schedule for every call. */
void fc_schedule_reset(fc_schedule_t *s) {
  s->nsteps = 0;
  s->nrounds = 0;
  if (s->round_start) s->round_start[0] = 0;
  s->scratch_count = 0;
  s->result_buf = FC_BUF_NONE;
  s->result_off = 0;
  s->result_count = 0;
}

void fc_schedule_free(fc_schedule_t *s) {
  free(s->steps);
  free(s->round_start);
  fc_schedule_init(s);
}

/* Grow *arr (elements of size elem, capacity *cap) to hold need elements; doubles so that
 * building is linear.  Capacities are ints (the schedule's type): refuse past INT_MAX. */
static flexcoll_result_t grow(void **arr, int *cap, long long need, size_t elem) {
  if (need <= *cap) return FLEXCOLL_SUCCESS;
  if (need > INT_MAX) return FLEXCOLL_INVALID_ARGUMENT; /* chunk_count too small for the message */
  long long ncap = *cap < 16 ? 16 : (long long)*cap * 2;
  if (ncap < need) ncap = need;
  if (ncap > INT_MAX) ncap = INT_MAX;
  if ((size_t)ncap > SIZE_MAX / elem) return FLEXCOLL_SYSTEM_ERROR;
  void *p = realloc(*arr, (size_t)ncap * elem);
  if (!p) return FLEXCOLL_SYSTEM_ERROR;
  *arr = p;
  *cap = (int)ncap;
  return FLEXCOLL_SUCCESS;
}

/* round_start holds nrounds+1 entries; cap_rounds counts allocated entries. */
void fc_build_round(fc_build_t *b) {
  fc_schedule_t *s = b->s;
  if (b->err != FLEXCOLL_SUCCESS) return;
  if (s->nrounds > 0 && s->round_start[s->nrounds - 1] == s->nsteps) return; /* still empty */
  flexcoll_result_t r = grow((void **)&s->round_start, &s->cap_rounds, (long long)s->nrounds + 2, sizeof(int));
  if (r != FLEXCOLL_SUCCESS) {
    b->err = r;
    return;
  }
  if (s->nrounds == 0) s->round_start[0] = s->nsteps;
  s->nrounds++;
  s->round_start[s->nrounds] = s->nsteps;
}

void fc_build_step(fc_build_t *b, fc_step_kind_t kind, int peer, fc_buf_t buf, size_t off, fc_buf_t src_buf,
                   size_t src_off, size_t count) {
  fc_schedule_t *s = b->s;
  if (b->err != FLEXCOLL_SUCCESS || count == 0) return;
  if (s->nrounds == 0) {
    fc_build_round(b);
    if (b->err != FLEXCOLL_SUCCESS) return;
  }
  flexcoll_result_t r = grow((void **)&s->steps, &s->cap_steps, (long long)s->nsteps + 1, sizeof(fc_step_t));
  if (r != FLEXCOLL_SUCCESS) {
    b->err = r;
    return;
  }
  fc_step_t *st = &s->steps[s->nsteps++];
  st->kind = (uint8_t)kind;
  st->buf = (uint8_t)buf;
  st->src_buf = (uint8_t)src_buf;
  st->peer = peer;
  st->off = off;
  st->src_off = src_off;
  st->count = count;
  s->round_start[s->nrounds] = s->nsteps;
}

int fc_algo_supports(fc_coll_t coll, fc_algo_t algo) {
  if ((unsigned)coll >= FC_NUM_COLLS) return 0;
  switch (algo) {
    case FC_ALGO_RING: return 1;
    case FC_ALGO_TREE: return coll != FC_COLL_REDUCE_SCATTER && coll != FC_COLL_ALLTOALL; /* no natural scatter */
    case FC_ALGO_EXCHANGE: return 1;
    default: return 0;
  }
}

static const char *const algo_names[FC_NUM_ALGOS] = {"ring", "tree", "exchange"};
static const char *const coll_names[FC_NUM_COLLS] = {"allreduce", "allgather", "reduce_scatter", "broadcast",
                                                      "reduce", "alltoall"};

const char *fc_algo_name(fc_algo_t algo) {
  return (unsigned)algo < FC_NUM_ALGOS ? algo_names[algo] : "unknown";
}

const char *fc_coll_name(fc_coll_t coll) {
  return (unsigned)coll < FC_NUM_COLLS ? coll_names[coll] : "unknown";
}

/* strcasecmp is POSIX, not C11: compare by hand. */
static int same_name(const char *a, const char *b) {
  for (; *a && *b; a++, b++)
    if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
  return *a == *b;
}

int fc_algo_from_name(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < FC_NUM_ALGOS; i++)
    if (same_name(name, algo_names[i])) return i;
  return -1;
}

/* nranks*count saturates at SIZE_MAX; fc_algo_build refuses such calls. */
static size_t times_ranks(size_t count, int nranks) {
  if (nranks > 0 && count > SIZE_MAX / (size_t)nranks) return SIZE_MAX;
  return count * (size_t)(nranks > 0 ? nranks : 0);
}

size_t fc_coll_send_count(fc_coll_t coll, size_t count, int nranks) {
  return coll == FC_COLL_REDUCE_SCATTER || coll == FC_COLL_ALLTOALL ? times_ranks(count, nranks) : count;
}

size_t fc_coll_recv_count(fc_coll_t coll, size_t count, int nranks) {
  return coll == FC_COLL_ALLGATHER || coll == FC_COLL_ALLTOALL ? times_ranks(count, nranks) : count;
}

fc_coll_io_t fc_coll_io(const fc_algo_args_t *a, const void *send, const void *recv, size_t esize) {
  const size_t sbytes = fc_coll_send_count(a->coll, a->count, a->nranks) * esize;
  const size_t rbytes = fc_coll_recv_count(a->coll, a->count, a->nranks) * esize;
  const char *s = send, *r = recv;
  fc_coll_io_t io = {0};
  io.send_read = s && sbytes && (a->coll != FC_COLL_BROADCAST || a->rank == a->root);
  io.recv_written = r && rbytes && (a->coll != FC_COLL_REDUCE || a->rank == a->root);
  /* An alltoall in place reads blocks that its own receives overwrite: never "inside". */
  io.send_in_recv = s && r && a->coll != FC_COLL_ALLTOALL && s >= r && (size_t)(s - r) <= rbytes &&
                    sbytes <= rbytes - (size_t)(s - r);
  io.send_off = io.send_in_recv ? (size_t)(s - r) : 0;
  return io;
}

static int coll_has_root(fc_coll_t coll) { return coll == FC_COLL_BROADCAST || coll == FC_COLL_REDUCE; }
static int coll_reduces(fc_coll_t coll) {
  return coll == FC_COLL_ALLREDUCE || coll == FC_COLL_REDUCE_SCATTER || coll == FC_COLL_REDUCE;
}

static int args_valid(const fc_algo_args_t *a) {
  if ((unsigned)a->coll >= FC_NUM_COLLS || (unsigned)a->algo >= FC_NUM_ALGOS) return 0;
  if (a->nranks < 1 || a->rank < 0 || a->rank >= a->nranks) return 0;
  if (coll_has_root(a->coll) && (a->root < 0 || a->root >= a->nranks)) return 0;
  if (a->count > SIZE_MAX / (size_t)a->nranks) return 0; /* n*count must be addressable */
  return fc_algo_supports(a->coll, a->algo);
}

/* One rank: every collective (alltoall's 1*count elements too) is recv[0, count) = send[0, count)
 * (a no-op when in place). */
static void build_single(fc_build_t *b, const fc_algo_args_t *a) {
  fc_build_copy(b, FC_BUF_RECV, 0, FC_BUF_SEND, 0, a->count);
  if (coll_reduces(a->coll)) fc_build_result(b, FC_BUF_RECV, 0, a->count);
}

/* round_start[0] must exist even for an empty schedule: executors read [0, nrounds]. */
static flexcoll_result_t build_begin(fc_schedule_t *s) {
  flexcoll_result_t r = grow((void **)&s->round_start, &s->cap_rounds, 1, sizeof(int));
  if (r == FLEXCOLL_SUCCESS) s->round_start[0] = 0;
  return r;
}

static flexcoll_result_t build_end(fc_build_t *b) {
  fc_schedule_t *s = b->s;
  if (b->err != FLEXCOLL_SUCCESS) {
    fc_schedule_reset(s);
    return b->err;
  }
  if (s->nrounds > 0 && s->round_start[s->nrounds - 1] == s->nsteps) s->nrounds--; /* trailing empty round */
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_algo_build(fc_schedule_t *s, const fc_algo_args_t *args) {
  if (!s || !args) return FLEXCOLL_INVALID_ARGUMENT;
  fc_schedule_reset(s);
  if (!args_valid(args)) return FLEXCOLL_INVALID_ARGUMENT;
  fc_build_t b = {s, FLEXCOLL_SUCCESS};
  b.err = build_begin(s);
  if (b.err != FLEXCOLL_SUCCESS) return b.err;
  if (args->nranks == 1)
    build_single(&b, args);
  else if (args->algo == FC_ALGO_RING)
    fc_ring_build(&b, args);
  else if (args->algo == FC_ALGO_TREE)
    fc_tree_build(&b, args);
  else
    fc_exchange_build(&b, args);
  return build_end(&b);
}

/* The ops' steps are all in one round, so several messages of one pair may share a round: they
 * are matched in op order.  A count-0 op is dropped like any empty step; its peer has a count-0
 * op in the same position of that pair's sequence and drops it too, so the order still matches.
 * A peer equal to the caller's own rank stays a SEND/RECV pair for the executor to match. */
flexcoll_result_t fc_algo_build_p2p(fc_schedule_t *s, const fc_p2p_op_t *ops, int nops) {
  if (!s) return FLEXCOLL_INVALID_ARGUMENT;
  fc_schedule_reset(s);
  if (nops < 0 || nops > FC_P2P_MAX_OPS || (nops > 0 && !ops)) return FLEXCOLL_INVALID_ARGUMENT;
  for (int i = 0; i < nops; i++)
    if (ops[i].peer < 0 || (ops[i].is_send != 0 && ops[i].is_send != 1)) return FLEXCOLL_INVALID_ARGUMENT;
  fc_build_t b = {s, FLEXCOLL_SUCCESS};
  b.err = build_begin(s);
  if (b.err != FLEXCOLL_SUCCESS) return b.err;
  for (int i = 0; i < nops; i++) {
    fc_buf_t buf = (fc_buf_t)(FC_BUF_EXT + i);
    if (ops[i].is_send)
      fc_build_send(&b, ops[i].peer, buf, 0, ops[i].count);
    else
      fc_build_recv(&b, ops[i].peer, buf, 0, ops[i].count);
  }
  return build_end(&b);
}
