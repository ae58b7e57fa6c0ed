/* exec.c — runs an algorithm schedule on host buffers.
 *
 * Each round posts all its transfers at once.  A transfer is split over the communicator's links
 * by the shares the scheduler computes from the shared cost models (lib/sched: the sender and the
 * receiver compute the same split from the same byte count), and each link's part is cut into
 * slices (FLEXCOLL_SLICE_SIZE) so that the reduction of one slice overlaps the arrival of the
 * next; the round ends when every slice is done.  Which link carried an element never changes
 * how it is reduced: results are bitwise the same whatever the split.  Messages are matched by
 * tag (see make_tag) within each link, so matching never depends on arrival order. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "bootstrap.h"
#include "clock.h"
#include "comm.h"
#include "dtype.h"
#include "error.h"
#include "host.h"
#include "host/shm.h"
#include "log.h"
#include "gpu/gpu.h"
#include "param.h"
#include "sched/sched.h"
#include "transports/transports.h"

FC_PARAM_INT(slice_size, "SLICE_SIZE", 1 << 20)
/* Ranks on several hosts: schedules by the hosts (1) or in rank order (0: as before hosts were
 * known; for comparisons). */
FC_PARAM_INT(hierarchy, "HIERARCHY", 1)

#define FC_MAX_SLICES 0xffff
/* Link shares are whole multiples of this (a multiple of every element size). */
#define FC_SHARE_ALIGN 4096

typedef struct {
  fc_link_req_t req;
  const fc_step_t *step; /* RECV_REDUCE slices reduce when they land */
  char *tmp;             /* where a RECV_REDUCE slice lands */
  size_t first, count;   /* elements of the step this slice covers */
  int pending;
  int is_recv;
  int link;              /* index into comm->links */
  size_t part;           /* index into fc_exec_t.parts */
} fc_slice_t;

/* One link's part of one transfer: timed from post to its last slice (stage 2, statistics). */
typedef struct {
  int link, peer, is_send;
  size_t bytes, left;
  double t_post;
} fc_part_t;

typedef struct {
  struct flexcoll_comm *comm;
  char *bufs[3];     /* send, recv, scratch, indexed by fc_buf_t */
  void *const *ext;  /* FC_BUF_EXT + i: buffers of a point-to-point batch */
  int p2p;           /* messages are numbered per pair across calls, not per collective */
  int device;        /* every buffer is device memory (fc_host_run_device): copies and reductions there */
  size_t esize;
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  uint32_t seq;
  int *send_msgs, *recv_msgs; /* per peer: messages so far in this collective */
  fc_slice_t *slices;
  size_t nslices, cap_slices;
  fc_part_t *parts;
  size_t nparts, cap_parts;
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

/* Room for n more elements of `size` bytes in the array *p of *cap, of which `used` are taken. */
static flexcoll_result_t reserve(fc_exec_t *x, void **p, size_t *cap, size_t used, size_t n, size_t size, const char *what) {
  if (used + n <= *cap) return FLEXCOLL_SUCCESS;
  size_t want = (used + n) * 2;
  void *q = realloc(*p, want * size);
  if (!q) return fc_error(x->comm, FLEXCOLL_SYSTEM_ERROR, "out of memory for transfer %s", what);
  *p = q;
  *cap = want;
  return FLEXCOLL_SUCCESS;
}
static flexcoll_result_t reserve_slices(fc_exec_t *x, size_t n) {
  return reserve(x, (void **)&x->slices, &x->cap_slices, x->nslices, n, sizeof *x->slices, "slices");
}
static flexcoll_result_t reserve_parts(fc_exec_t *x, size_t n) {
  return reserve(x, (void **)&x->parts, &x->cap_parts, x->nparts, n, sizeof *x->parts, "parts");
}

/* Post the slices of link's part [first, first + count) of a transfer step (elements). */
static flexcoll_result_t post_part(fc_exec_t *x, const fc_step_t *st, int link, size_t first, size_t count,
                                   uint32_t number, size_t *tmp_off) {
  int peer = st->peer, is_send = st->kind == FC_STEP_SEND;
  fc_link_t *l = &x->comm->links->link[link];
  size_t per = slice_elems(x, count);
  size_t n = count ? (count + per - 1) / per : 1; /* an empty message still matches its peer */
  FC_CHECK(reserve_slices(x, n));
  FC_CHECK(reserve_parts(x, 1));
  fc_part_t *part = &x->parts[x->nparts];
  *part = (fc_part_t){.link = link, .peer = peer, .is_send = is_send, .bytes = count * x->esize, .left = n,
                      .t_post = fc_now_us()};
  for (size_t i = 0; i < n; i++) {
    fc_slice_t *s = &x->slices[x->nslices++];
    memset(s, 0, sizeof *s);
    s->first = first + i * per;
    s->count = count - i * per < per ? count - i * per : per;
    s->pending = 1;
    s->is_recv = !is_send;
    s->link = link;
    s->part = x->nparts;
    uint64_t tag = make_tag(is_send ? x->comm->rank : peer, x->p2p, number, i);
    char *base = ref(x, st->buf, st->off + s->first);
    size_t bytes = s->count * x->esize;
    if (is_send) {
      FC_CHECK(l->ops->isend(x->comm, l, peer, base, bytes, tag, &s->req));
    } else if (st->kind == FC_STEP_RECV) {
      FC_CHECK(l->ops->irecv(x->comm, l, peer, base, bytes, tag, &s->req));
    } else {
      s->step = st;
      s->tmp = (char *)(x->device ? x->comm->dev_landing : x->comm->landing) + *tmp_off;
      *tmp_off += bytes;
      FC_CHECK(l->ops->irecv(x->comm, l, peer, s->tmp, bytes, tag, &s->req));
    }
  }
  x->nparts++;
  return FLEXCOLL_SUCCESS;
}

/* The elements of st that each link carries (the balancer's split of its bytes over the links
 * of this pair); posted[i] says whether link i gets a message: one with a share, and for an
 * empty step the first link that reaches the peer (it still matches its peer). */
static flexcoll_result_t split_step(fc_exec_t *x, const fc_step_t *st, size_t *counts, int *posted) {
  const fc_links_t *links = x->comm->links;
  size_t shares[FC_MAX_LINKS];
  flexcoll_result_t res = fc_links_split(links, st->peer, st->count * x->esize, FC_SHARE_ALIGN, shares);
  if (res != FLEXCOLL_SUCCESS)
    return fc_error(x->comm, res, "no link joins rank %d and rank %d", x->comm->rank, st->peer);
  int first = 1;
  for (int i = 0; i < links->n; i++) {
    counts[i] = shares[i] / x->esize;
    int reaches = links->n == 1 || links->link[i].reach[st->peer];
    posted[i] = counts[i] || (first && reaches && st->count == 0);
    if (reaches) first = 0;
  }
  return FLEXCOLL_SUCCESS;
}

/* Post one transfer step: its bytes split over the links, each link's part in slices;
 * RECV_REDUCE slices land in the landing area at *tmp_off. */
static flexcoll_result_t post_step(fc_exec_t *x, const fc_step_t *st, size_t *tmp_off) {
  int peer = st->peer;
  int is_send = st->kind == FC_STEP_SEND;
  uint32_t number;
  if (x->p2p) {
    number = is_send ? x->comm->p2p_sent[peer]++ : x->comm->p2p_received[peer]++;
  } else {
    int msg = is_send ? x->send_msgs[peer]++ : x->recv_msgs[peer]++;
    number = ((x->seq & 0x7fff) << 16) | ((uint32_t)msg & 0xffff);
  }
  size_t counts[FC_MAX_LINKS], first = 0;
  int posted[FC_MAX_LINKS];
  FC_CHECK(split_step(x, st, counts, posted));
  for (int i = 0; i < x->comm->links->n; i++) {
    if (posted[i]) FC_CHECK(post_part(x, st, i, first, counts[i], number, tmp_off));
    first += counts[i];
  }
  return FLEXCOLL_SUCCESS;
}

/* dst = a op b (count elements): on the host, or on the device for device buffers. */
static flexcoll_result_t reduce(fc_exec_t *x, void *dst, const void *a, const void *b, size_t count) {
  if (!x->device) {
    fc_host_reduce(dst, a, b, count, x->dtype, x->op);
    return FLEXCOLL_SUCCESS;
  }
  char why[200];
  if (fc_mem_reduce(dst, a, b, count, x->dtype, x->op, why, sizeof why))
    return fc_error(x->comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s", why);
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t finish_slice(fc_exec_t *x, fc_slice_t *s) {
  s->pending = 0;
  fc_part_t *p = &x->parts[s->part];
  if (--p->left == 0)
    fc_links_record(x->comm->links, x->comm->nranks, p->link, p->peer, p->bytes, fc_now_us() - p->t_post, p->is_send);
  if (!s->step) return FLEXCOLL_SUCCESS;
  const fc_step_t *st = s->step;
  return reduce(x, ref(x, st->buf, st->off + s->first), ref(x, st->src_buf, st->src_off + s->first), s->tmp, s->count);
}

flexcoll_result_t fc_host_check_stuck(struct flexcoll_comm *c, uint32_t seq, double last_progress, double *next_peer_check) {
  if (atomic_load(&c->abort_flag)) return fc_error(c, FLEXCOLL_REMOTE_ERROR, "collective interrupted: communicator aborted");
  int async = atomic_load(&c->async_error);
  if (async != FLEXCOLL_SUCCESS) return fc_error(c, (flexcoll_result_t)async, "a peer failed during the collective");
  double t = fc_now_ms();
  if (t >= *next_peer_check) {
    *next_peer_check = t + 50;
    if (c->bootstrap && fc_bootstrap_peer_lost(c->bootstrap)) {
      fc_comm_set_async_error(c, FLEXCOLL_REMOTE_ERROR);
      return fc_error(c, FLEXCOLL_REMOTE_ERROR, "a neighbouring rank exited during a collective (seq %u)", seq);
    }
  }
  if (c->timeout_ms > 0 && t - last_progress > c->timeout_ms) {
    fc_comm_set_async_error(c, FLEXCOLL_TIMEOUT);
    return fc_error(c, FLEXCOLL_TIMEOUT, "no progress from peers for %d ms (collective seq %u)", c->timeout_ms, seq);
  }
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t check_stuck(fc_exec_t *x, double last_progress, double *next_peer_check) {
  return fc_host_check_stuck(x->comm, x->seq, last_progress, next_peer_check);
}

/* How often the waits progress the links they do not wait on (those whose ops allow it), in
 * rounds of the loop counted over all waits of the communicator; a power of two. */
#define IDLE_LINK_ROUNDS 256u

static flexcoll_result_t wait_slices(fc_exec_t *x) {
  double last = fc_now_ms(), next_peer_check = last + 50;
  size_t left = x->nslices;
  unsigned idle = 0;
  fc_links_t *links = x->comm->links;
  /* The links with a pending slice, as of the last round's tests. */
  unsigned busy = 0;
  for (size_t i = 0; i < x->nslices; i++)
    if (x->slices[i].pending) busy |= 1u << x->slices[i].link;
  while (left) {
    /* Ranks often outnumber cores (threads of one process, CI machines): after a short spin, give
     * the core to the peer we are waiting for. */
    if (++idle > 64) sched_yield();
    int polled = 0, completed = 0;
    /* The links this collective waits on, every round; the others only every IDLE_LINK_ROUNDS,
     * for late traffic (UCX keepalives, what a peer's collective still needs from them).  An idle
     * TCP worker's progress is a system call: polled every round, it made small collectives on
     * shared memory several times slower (docs/PERFORMANCE.md).  Safe because the UCX links finish
     * their wire-up when they open; before, it finished here, and skipping idle links left it to
     * destroy's flush, which then waited for peers. */
    const int all = (++links->wait_rounds & (IDLE_LINK_ROUNDS - 1)) == 0;
    for (int i = 0; i < links->n; i++)
      if (!links->link[i].off && (all || (busy >> i & 1) || !links->link[i].ops->idle_progress_rarely))
        polled |= links->link[i].ops->progress(&links->link[i]);
    busy = 0;
    for (size_t i = 0; i < x->nslices; i++) {
      fc_slice_t *s = &x->slices[i];
      if (!s->pending) continue;
      int done;
      fc_link_t *l = &links->link[s->link];
      FC_CHECK(l->ops->test(x->comm, l, &s->req, s->is_recv ? s->count * x->esize : SIZE_MAX, &done));
      if (done) {
        FC_CHECK(finish_slice(x, s));
        left--;
        completed = 1;
      }
      else busy |= 1u << s->link;
    }
    if (polled || completed) idle = 0;
    /* Only a finished slice of this collective is progress: UCX's own traffic (keepalives)
     * also makes the worker report activity, and would hold off the timeout forever. */
    if (completed) last = fc_now_ms();
    else FC_CHECK(check_stuck(x, last, &next_peer_check));
  }
  return FLEXCOLL_SUCCESS;
}

static void cancel_slices(fc_exec_t *x) {
  for (size_t i = 0; i < x->nslices; i++)
    if (x->slices[i].pending) {
      fc_link_t *l = &x->comm->links->link[x->slices[i].link];
      l->ops->cancel(l, &x->slices[i].req);
    }
  x->nslices = 0;
  x->nparts = 0;
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

/* The same in device memory (fc_host_run_device), on the communicator's device. */
static flexcoll_result_t grow_device(struct flexcoll_comm *comm, void **p, size_t *have, size_t need, const char *what) {
  if (need <= *have) return FLEXCOLL_SUCCESS;
  fc_mem_free_device(*p);
  *have = 0;
  char why[200];
  *p = fc_mem_alloc_device(comm->cuda_device, need, why, sizeof why);
  if (!*p)
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR,
                    "out of device memory for %zu bytes of %s (%s); nothing was sent and the communicator stays usable",
                    need, what, why);
  *have = need;
  return FLEXCOLL_SUCCESS;
}

/* Everything the schedule needs from the heap is taken before its first message: a failure then
 * leaves no peer waiting on a half-sent collective, so the call fails alone and the communicator
 * stays usable (docs/ARCHITECTURE.md, "Out of memory").  Growing per round instead failed with
 * messages of earlier rounds already out, leaving the ranks out of step for good. */
/* Slices and parts that post_step will make of st (the same split and slicing). */
static flexcoll_result_t count_step(fc_exec_t *x, const fc_step_t *st, size_t *slices, size_t *parts) {
  size_t counts[FC_MAX_LINKS];
  int posted[FC_MAX_LINKS];
  FC_CHECK(split_step(x, st, counts, posted));
  for (int i = 0; i < x->comm->links->n; i++) {
    if (!posted[i]) continue;
    size_t per = slice_elems(x, counts[i]);
    *slices += counts[i] ? (counts[i] + per - 1) / per : 1;
    *parts += 1;
  }
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t prepare(fc_exec_t *x, const fc_schedule_t *s) {
  struct flexcoll_comm *c = x->comm;
  size_t landing = 0, slices = 0, parts = 0;
  for (int r = 0; r < s->nrounds; r++) {
    size_t tmp = 0, n = 0, np = 0;
    for (int i = s->round_start[r]; i < s->round_start[r + 1]; i++) {
      const fc_step_t *st = &s->steps[i];
      if (st->kind == FC_STEP_COPY || st->kind == FC_STEP_REDUCE) continue;
      /* Saturate: several steps of a huge count would wrap round to a small block. */
      size_t bytes = st->count * x->esize;
      if (st->kind == FC_STEP_RECV_REDUCE) tmp = bytes > SIZE_MAX - tmp ? SIZE_MAX : tmp + bytes;
      FC_CHECK(count_step(x, st, &n, &np));
    }
    if (tmp > landing) landing = tmp;
    if (n > slices) slices = n;
    if (np > parts) parts = np;
  }
  if (x->device) {
    FC_CHECK(grow_device(c, &c->dev_scratch, &c->dev_scratch_bytes, s->scratch_count * x->esize, "scratch"));
    FC_CHECK(grow_device(c, &c->dev_landing, &c->dev_landing_bytes, landing, "landing space for received data"));
  } else {
    FC_CHECK(grow(c, &c->scratch, &c->scratch_bytes, s->scratch_count * x->esize, "scratch"));
    FC_CHECK(grow(c, &c->landing, &c->landing_bytes, landing, "landing space for received data"));
  }
  FC_CHECK(reserve_slices(x, slices));
  FC_CHECK(reserve_parts(x, parts));
  x->send_msgs = calloc((size_t)c->nranks * 2, sizeof(int));
  if (!x->send_msgs) return fc_error(c, FLEXCOLL_SYSTEM_ERROR, "out of memory for message counters");
  x->recv_msgs = x->send_msgs + c->nranks;
  return FLEXCOLL_SUCCESS;
}

/* A copy step where either side may be device memory (fc_host_run_device).  Overlapping ranges
 * go through host memory: a device copy between them is undefined. */
static flexcoll_result_t device_copy(fc_exec_t *x, char *dst, const char *src, size_t bytes) {
  char why[200];
  const int overlap = dst < src + bytes && src < dst + bytes;
  char *bounce = overlap ? malloc(bytes) : NULL;
  if (overlap && !bounce) return fc_error(x->comm, FLEXCOLL_SYSTEM_ERROR, "out of memory for a %zu-byte copy", bytes);
  const int bad = overlap ? fc_mem_copy(bounce, src, bytes, why, sizeof why) || fc_mem_copy(dst, bounce, bytes, why, sizeof why)
                          : fc_mem_copy(dst, src, bytes, why, sizeof why);
  free(bounce);
  return bad ? fc_error(x->comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s", why) : FLEXCOLL_SUCCESS;
}

static flexcoll_result_t run_round(fc_exec_t *x, const fc_schedule_t *s, int r) {
  size_t tmp_off = 0;
  x->nslices = 0;
  x->nparts = 0;
  for (int i = s->round_start[r]; i < s->round_start[r + 1]; i++) {
    const fc_step_t *st = &s->steps[i];
    if (st->kind == FC_STEP_COPY) {
      char *dst = ref(x, st->buf, st->off), *src = ref(x, st->src_buf, st->src_off);
      if (dst == src || !st->count) continue;
      if (!x->device) {
        memmove(dst, src, st->count * x->esize);
        continue;
      }
      flexcoll_result_t res = device_copy(x, dst, src, st->count * x->esize);
      if (res != FLEXCOLL_SUCCESS) { cancel_slices(x); return res; }
      continue;
    }
    if (st->kind == FC_STEP_REDUCE) {
      char *dst = ref(x, st->buf, st->off);
      flexcoll_result_t res = reduce(x, dst, dst, ref(x, st->src_buf, st->src_off), st->count);
      if (res != FLEXCOLL_SUCCESS) { cancel_slices(x); return res; }
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
    free(x->parts);
    return res;
  }
  x->bufs[FC_BUF_SCRATCH] = x->device ? comm->dev_scratch : comm->scratch;
  for (int r = 0; r < s->nrounds && res == FLEXCOLL_SUCCESS; r++) res = run_round(x, s, r);
  /* A collective that failed half-way leaves this rank's message numbering, and its peers, out
   * of step: the communicator is unusable (get_async_error says so; later calls are refused). */
  if (res != FLEXCOLL_SUCCESS) fc_comm_set_async_error(comm, res);
  if (res == FLEXCOLL_SUCCESS && x->op == FLEXCOLL_AVG && s->result_count) {
    void *result = ref(x, s->result_buf, s->result_off);
    char why[200];
    if (!x->device) fc_host_divide(result, s->result_count, x->dtype, comm->nranks);
    else if (fc_mem_divide(result, s->result_count, x->dtype, comm->nranks, why, sizeof why))
      res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s", why);
  }
  free(x->send_msgs);
  free(x->slices);
  free(x->parts);
  return res;
}

static flexcoll_result_t host_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                                  void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op, int device) {
  /* The sequence number is taken even if the call fails here: every rank that makes the call
   * moves on, so a rank whose peers did not fail alike never matches their stale messages. */
  uint32_t seq = comm->coll_seq++;
  const size_t esize = fc_dtype_size(dtype);
  size_t bytes = fc_coll_send_count(args->coll, args->count, comm->nranks) * esize;
  size_t recv_bytes = fc_coll_recv_count(args->coll, args->count, comm->nranks) * esize;
  /* Ranks of one host: straight through the communicator's segment where the tuner says it is
   * faster (every rank decides alike: the same shared settings and sizes). */
  fc_shm_windows_t win;
  const int windowed = !device && fc_host_windows_find(comm, args->coll, sendbuf, bytes, recvbuf, recv_bytes, &win);
  const size_t larger = bytes > recv_bytes ? bytes : recv_bytes;
  fc_shm_mode_t shm = comm->shm && !device
                          ? fc_tuner_shm(args->coll, larger, comm->nranks, fc_shm_crowded(comm), windowed)
                          : FC_SHM_OFF;
  if (shm != FC_SHM_OFF && args->count)
    return fc_shm_run(comm, shm, args, sendbuf, recvbuf, dtype, op, larger, shm == FC_SHM_WINDOW ? &win : NULL);
  /* In-place alltoall (NCCL allows it, and nccl-tests runs it): a round receives into blocks that
   * a later round still sends from, so the input is sent from a copy.  On device buffers lib/gpu
   * makes that copy first (alltoall_through_copy); every rank makes the same call, so all refuse
   * one that comes here alike. */
  char *copy = NULL;
  const int in_place_alltoall = args->coll == FC_COLL_ALLTOALL && sendbuf == recvbuf && recv_bytes && comm->nranks > 1;
  if (in_place_alltoall && device)
    return fc_error(comm, FLEXCOLL_INTERNAL_ERROR, "alltoall on device buffers through the links: in place");
  if (in_place_alltoall) {
    copy = malloc(recv_bytes);
    if (!copy)
      return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "flexcoll_alltoall: out of memory for the copy of the in-place "
                      "buffer (%zu bytes)", recv_bytes);
    memcpy(copy, recvbuf, recv_bytes);
    sendbuf = copy;
  }
  /* Ranks on several hosts: rings and trees follow the hosts, allreduce goes within hosts first
   * (fc_algo_args_t.order).  One host keeps rank order, the schedules measured before hosts were
   * known; FLEXCOLL_HIERARCHY=0 too. */
  fc_algo_args_t a = *args;
  if (comm->links && comm->links->nhosts > 1 && fc_param_hierarchy()) {
    a.order = comm->links->order;
    a.pos = comm->links->pos;
    a.host = comm->links->host;
    a.flat_ring = !fc_tuner_hosts_2d(args->coll, larger, comm->links, comm->nranks);
    if (a.algo == FC_ALGO_RING && (a.coll == FC_COLL_ALLGATHER || a.coll == FC_COLL_REDUCE_SCATTER))
      FC_TRACE(FC_SUB_COLL, "%s of %zu bytes over %d hosts: %s", fc_coll_name(a.coll), larger, comm->links->nhosts,
               a.flat_ring ? "the flat ring" : "two dimensions");
  }
  flexcoll_result_t res = fc_algo_build(&comm->schedule, &a);
  if (res != FLEXCOLL_SUCCESS) {
    free(copy);
    return fc_error(comm, res, "cannot build the schedule of this collective (%s)", flexcoll_get_error_string(res));
  }
  fc_exec_t x = {.comm = comm, .esize = esize, .dtype = dtype, .op = op, .seq = seq, .device = device};
  x.bufs[FC_BUF_SEND] = (char *)sendbuf;
  x.bufs[FC_BUF_RECV] = recvbuf;
  res = execute(&x, &comm->schedule);
  free(copy);
  FC_CHECK(res);
  return fc_links_after_collective(comm, larger);
}

flexcoll_result_t fc_host_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                              void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op) {
  return host_run(comm, args, sendbuf, recvbuf, dtype, op, 0);
}

flexcoll_result_t fc_host_run_device(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                                     void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op) {
  return host_run(comm, args, sendbuf, recvbuf, dtype, op, 1);
}

flexcoll_result_t fc_host_run_p2p(struct flexcoll_comm *comm, const fc_p2p_op_t *ops, int nops, void *const *bufs) {
  FC_CHECK(fc_algo_build_p2p(&comm->schedule, ops, nops));
  fc_exec_t x = {.comm = comm, .esize = 1, .dtype = FLEXCOLL_UINT8, .op = FLEXCOLL_SUM, .ext = bufs, .p2p = 1};
  FC_CHECK(execute(&x, &comm->schedule));
  size_t largest = 0;
  for (int i = 0; i < nops; i++)
    if (ops[i].count > largest) largest = ops[i].count;
  fc_links_after_p2p(comm, largest);
  return FLEXCOLL_SUCCESS;
}
