/* exec.c — runs an algorithm schedule on host buffers.
 *
 * Each round posts all its transfers at once, cut into slices (FLEXCOLL_SLICE_SIZE) so that the
 * reduction of one slice overlaps the arrival of the next; the round ends when every slice is
 * done.  Messages are matched by tag (see make_tag), so matching never depends on arrival order. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "bootstrap.h"
#include "comm.h"
#include "dtype.h"
#include "error.h"
#include "host.h"
#include "param.h"
#include "transports/transports.h"

FC_PARAM_INT(slice_size, "SLICE_SIZE", 1 << 20)

#define FC_MAX_SLICES 0xffff

typedef struct {
  fc_ucx_req_t req;
  const fc_step_t *step; /* RECV_REDUCE slices reduce when they land */
  char *tmp;             /* where a RECV_REDUCE slice lands */
  size_t first, count;   /* elements of the step this slice covers */
  int pending;
  int is_recv;
} fc_slice_t;

typedef struct {
  struct flexcoll_comm *comm;
  char *bufs[3];     /* send, recv, scratch, indexed by fc_buf_t */
  void *const *ext;  /* FC_BUF_EXT + i: buffers of a point-to-point batch */
  int p2p;           /* messages are numbered per pair across calls, not per collective */
  size_t esize;
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  uint32_t seq;
  int *send_msgs, *recv_msgs; /* per peer: messages so far in this collective */
  fc_slice_t *slices;
  size_t nslices, cap_slices;
} fc_exec_t;

/* Tag: sender (16 bits) | kind (1: point-to-point) | number (31 bits) | slice (16 bits).
 * Collectives number messages by (collective sequence, index within it); point-to-point
 * messages by their index between the pair since the communicator began, because ranks that
 * are not involved in a send/recv do not count it and their collective sequences stay aligned. */
static uint64_t make_tag(int sender, int p2p, uint32_t number, size_t slice) {
  return ((uint64_t)(uint16_t)sender << 48) | ((uint64_t)(p2p & 1) << 47) | ((uint64_t)(number & 0x7fffffff) << 16) |
         (uint64_t)(slice & 0xffff);
}

static char *ref(fc_exec_t *x, int buf, size_t off) {
  char *base = buf < FC_BUF_EXT ? x->bufs[buf] : (char *)x->ext[buf - FC_BUF_EXT];
  return base + off * x->esize;
}

static size_t slice_elems(fc_exec_t *x, size_t count) {
  size_t per = (size_t)fc_param_slice_size() / x->esize;
  if (per == 0) per = 1;
  /* Tags hold 16 bits of slice index: grow the slice for huge messages. */
  if ((count + per - 1) / per > FC_MAX_SLICES) per = (count + FC_MAX_SLICES - 1) / FC_MAX_SLICES;
  return per;
}

static flexcoll_result_t reserve_slices(fc_exec_t *x, size_t n) {
  if (x->nslices + n <= x->cap_slices) return FLEXCOLL_SUCCESS;
  size_t cap = (x->nslices + n) * 2;
  fc_slice_t *s = realloc(x->slices, cap * sizeof *s);
  if (!s) return fc_error(x->comm, FLEXCOLL_SYSTEM_ERROR, "out of memory for transfer slices");
  x->slices = s;
  x->cap_slices = cap;
  return FLEXCOLL_SUCCESS;
}

/* Post every slice of one transfer step; RECV_REDUCE slices land in tmp at *tmp_off. */
static flexcoll_result_t post_step(fc_exec_t *x, const fc_step_t *st, size_t *tmp_off) {
  int peer = st->peer;
  int is_send = st->kind == FC_STEP_SEND;
  int sender = is_send ? x->comm->rank : peer;
  uint32_t number;
  if (x->p2p) {
    number = is_send ? x->comm->p2p_sent[peer]++ : x->comm->p2p_received[peer]++;
  } else {
    int msg = is_send ? x->send_msgs[peer]++ : x->recv_msgs[peer]++;
    number = ((x->seq & 0x7fff) << 16) | ((uint32_t)msg & 0xffff);
  }
  size_t per = slice_elems(x, st->count);
  size_t n = st->count ? (st->count + per - 1) / per : 1; /* an empty message still matches its peer */
  FC_CHECK(reserve_slices(x, n));
  for (size_t i = 0; i < n; i++) {
    fc_slice_t *s = &x->slices[x->nslices++];
    memset(s, 0, sizeof *s);
    s->first = i * per;
    s->count = st->count - s->first < per ? st->count - s->first : per;
    s->pending = 1;
    s->is_recv = !is_send;
    uint64_t tag = make_tag(sender, x->p2p, number, i);
    char *base = ref(x, st->buf, st->off + s->first);
    size_t bytes = s->count * x->esize;
    if (is_send) {
      FC_CHECK(fc_ucx_isend(x->comm, peer, base, bytes, tag, &s->req));
    } else if (st->kind == FC_STEP_RECV) {
      FC_CHECK(fc_ucx_irecv(x->comm, peer, base, bytes, tag, &s->req));
    } else {
      s->step = st;
      s->tmp = (char *)x->comm->landing + *tmp_off;
      *tmp_off += bytes;
      FC_CHECK(fc_ucx_irecv(x->comm, peer, s->tmp, bytes, tag, &s->req));
    }
  }
  return FLEXCOLL_SUCCESS;
}

static void finish_slice(fc_exec_t *x, fc_slice_t *s) {
  s->pending = 0;
  if (!s->step) return;
  const fc_step_t *st = s->step;
  fc_host_reduce(ref(x, st->buf, st->off + s->first), ref(x, st->src_buf, st->src_off + s->first), s->tmp,
                 s->count, x->dtype, x->op);
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Why a wait must stop: abort, an asynchronous error, a lost peer, or no progress for timeout_ms. */
static flexcoll_result_t check_stuck(fc_exec_t *x, double last_progress, double *next_peer_check) {
  struct flexcoll_comm *c = x->comm;
  if (atomic_load(&c->abort_flag)) return fc_error(c, FLEXCOLL_REMOTE_ERROR, "collective interrupted: communicator aborted");
  int async = atomic_load(&c->async_error);
  if (async != FLEXCOLL_SUCCESS) return fc_error(c, (flexcoll_result_t)async, "a peer failed during the collective");
  double t = now_ms();
  if (t >= *next_peer_check) {
    *next_peer_check = t + 50;
    if (c->bootstrap && fc_bootstrap_peer_lost(c->bootstrap)) {
      fc_comm_set_async_error(c, FLEXCOLL_REMOTE_ERROR);
      return fc_error(c, FLEXCOLL_REMOTE_ERROR, "a neighbouring rank exited during a collective (seq %u)", x->seq);
    }
  }
  if (c->timeout_ms > 0 && t - last_progress > c->timeout_ms) {
    fc_comm_set_async_error(c, FLEXCOLL_TIMEOUT);
    return fc_error(c, FLEXCOLL_TIMEOUT, "no progress from peers for %d ms (collective seq %u)", c->timeout_ms, x->seq);
  }
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t wait_slices(fc_exec_t *x) {
  double last = now_ms(), next_peer_check = last + 50;
  size_t left = x->nslices;
  unsigned idle = 0;
  while (left) {
    /* Ranks often outnumber cores (threads of one process, CI machines): after a short spin, give
     * the core to the peer we are waiting for. */
    if (++idle > 64) sched_yield();
    int polled = fc_ucx_progress(x->comm), completed = 0;
    for (size_t i = 0; i < x->nslices; i++) {
      fc_slice_t *s = &x->slices[i];
      if (!s->pending) continue;
      int done;
      if (s->is_recv) FC_CHECK(fc_ucx_test_recv(x->comm, &s->req, s->count * x->esize, &done));
      else FC_CHECK(fc_ucx_test(x->comm, &s->req, &done));
      if (done) { finish_slice(x, s); left--; completed = 1; }
    }
    if (polled || completed) idle = 0;
    /* Only a finished slice of this collective is progress: UCX's own traffic (keepalives)
     * also makes the worker report activity, and would hold off the timeout forever. */
    if (completed) last = now_ms();
    else FC_CHECK(check_stuck(x, last, &next_peer_check));
  }
  return FLEXCOLL_SUCCESS;
}

static void cancel_slices(fc_exec_t *x) {
  for (size_t i = 0; i < x->nslices; i++)
    if (x->slices[i].pending) fc_ucx_cancel(x->comm, &x->slices[i].req);
  x->nslices = 0;
}

/* The old contents are not needed: free and allocate rather than realloc, which would copy them
 * (and, failing, keep the old block as well as fail). */
static flexcoll_result_t grow(struct flexcoll_comm *comm, void **p, size_t *have, size_t need, const char *what) {
  if (need <= *have) return FLEXCOLL_SUCCESS;
  free(*p);
  *have = 0;
  *p = malloc(need);
  if (!*p)
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR,
                    "out of memory for %zu bytes of host %s; nothing was sent and the communicator stays usable", need, what);
  *have = need;
  return FLEXCOLL_SUCCESS;
}

/* Everything the schedule needs from the heap is taken before its first message: a failure then
 * leaves no peer waiting on a half-sent collective, so the call fails alone and the communicator
 * stays usable (docs/ARCHITECTURE.md, "Out of memory").  Growing per round instead failed with
 * messages of earlier rounds already out, leaving the ranks out of step for good. */
static flexcoll_result_t prepare(fc_exec_t *x, const fc_schedule_t *s) {
  struct flexcoll_comm *c = x->comm;
  size_t landing = 0, slices = 0;
  for (int r = 0; r < s->nrounds; r++) {
    size_t tmp = 0, n = 0;
    for (int i = s->round_start[r]; i < s->round_start[r + 1]; i++) {
      const fc_step_t *st = &s->steps[i];
      if (st->kind == FC_STEP_COPY) continue;
      /* Saturate: several steps of a huge count would wrap round to a small block. */
      size_t bytes = st->count * x->esize;
      if (st->kind == FC_STEP_RECV_REDUCE) tmp = bytes > SIZE_MAX - tmp ? SIZE_MAX : tmp + bytes;
      size_t per = slice_elems(x, st->count);
      n += st->count ? (st->count + per - 1) / per : 1;
    }
    if (tmp > landing) landing = tmp;
    if (n > slices) slices = n;
  }
  FC_CHECK(grow(c, &c->scratch, &c->scratch_bytes, s->scratch_count * x->esize, "scratch"));
  FC_CHECK(grow(c, &c->landing, &c->landing_bytes, landing, "landing space for received data"));
  FC_CHECK(reserve_slices(x, slices));
  x->send_msgs = calloc((size_t)c->nranks * 2, sizeof(int));
  if (!x->send_msgs) return fc_error(c, FLEXCOLL_SYSTEM_ERROR, "out of memory for message counters");
  x->recv_msgs = x->send_msgs + c->nranks;
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t run_round(fc_exec_t *x, const fc_schedule_t *s, int r) {
  size_t tmp_off = 0;
  x->nslices = 0;
  for (int i = s->round_start[r]; i < s->round_start[r + 1]; i++) {
    const fc_step_t *st = &s->steps[i];
    if (st->kind == FC_STEP_COPY) {
      char *dst = ref(x, st->buf, st->off), *src = ref(x, st->src_buf, st->src_off);
      if (dst != src && st->count) memmove(dst, src, st->count * x->esize);
      continue;
    }
    flexcoll_result_t res = post_step(x, st, &tmp_off);
    if (res != FLEXCOLL_SUCCESS) { cancel_slices(x); return res; }
  }
  flexcoll_result_t res = wait_slices(x);
  if (res != FLEXCOLL_SUCCESS) cancel_slices(x);
  return res;
}

/* Run schedule s (built for this rank) over x's buffers. */
static flexcoll_result_t execute(fc_exec_t *x, const fc_schedule_t *s) {
  struct flexcoll_comm *comm = x->comm;
  flexcoll_result_t res = prepare(x, s);
  if (res != FLEXCOLL_SUCCESS) {
    free(x->send_msgs);
    free(x->slices);
    return res;
  }
  x->bufs[FC_BUF_SCRATCH] = comm->scratch;
  for (int r = 0; r < s->nrounds && res == FLEXCOLL_SUCCESS; r++) res = run_round(x, s, r);
  /* A collective that failed half-way leaves this rank's message numbering, and its peers, out
   * of step: the communicator is unusable (get_async_error says so; later calls are refused). */
  if (res != FLEXCOLL_SUCCESS) fc_comm_set_async_error(comm, res);
  if (res == FLEXCOLL_SUCCESS && x->op == FLEXCOLL_AVG && s->result_count)
    fc_host_divide(ref(x, s->result_buf, s->result_off), s->result_count, x->dtype, comm->nranks);
  free(x->send_msgs);
  free(x->slices);
  return res;
}

flexcoll_result_t fc_host_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                              void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op) {
  /* The sequence number is taken even if the call fails here: every rank that makes the call
   * moves on, so a rank whose peers did not fail alike never matches their stale messages. */
  uint32_t seq = comm->coll_seq++;
  flexcoll_result_t res = fc_algo_build(&comm->schedule, args);
  if (res != FLEXCOLL_SUCCESS)
    return fc_error(comm, res, "cannot build the schedule of this collective (%s)", flexcoll_get_error_string(res));
  fc_exec_t x = {.comm = comm, .esize = fc_dtype_size(dtype), .dtype = dtype, .op = op, .seq = seq};
  x.bufs[FC_BUF_SEND] = (char *)sendbuf;
  x.bufs[FC_BUF_RECV] = recvbuf;
  return execute(&x, &comm->schedule);
}

flexcoll_result_t fc_host_run_p2p(struct flexcoll_comm *comm, const fc_p2p_op_t *ops, int nops, void *const *bufs) {
  FC_CHECK(fc_algo_build_p2p(&comm->schedule, ops, nops));
  fc_exec_t x = {.comm = comm, .esize = 1, .dtype = FLEXCOLL_UINT8, .op = FLEXCOLL_SUM, .ext = bufs, .p2p = 1};
  return execute(&x, &comm->schedule);
}
