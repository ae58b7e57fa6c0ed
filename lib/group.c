/* group.c — flexcoll_group_start/end: a thread-local depth and queue. */
#define _GNU_SOURCE
#include "group.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm.h"
#include "error.h"

typedef struct {
  int is_init;
  fc_call_t call; /* call.comm is the communicator of an init too */
} fc_group_op_t;

static _Thread_local int group_depth;
static _Thread_local fc_group_op_t *group_ops;
static _Thread_local size_t group_len, group_cap;

int fc_group_active(void) { return group_depth > 0; }

static flexcoll_result_t enqueue(const fc_group_op_t *op) {
  if (group_len == group_cap) {
    size_t cap = group_cap ? group_cap * 2 : 16;
    fc_group_op_t *q = realloc(group_ops, cap * sizeof *q);
    if (!q) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "out of memory queueing a group call");
    group_ops = q;
    group_cap = cap;
  }
  group_ops[group_len++] = *op;
  return FLEXCOLL_SUCCESS;
}

/* The sends and receives of comm at the end of this thread's group, in a row. */
static int p2p_run(flexcoll_comm_t comm) {
  int run = 0;
  for (size_t i = group_len; i-- > 0;) {
    const fc_group_op_t *o = &group_ops[i];
    if (o->is_init || o->call.comm != comm) continue;
    if (!fc_call_is_p2p(o->call.kind)) break;
    run++;
  }
  return run;
}

int fc_group_p2p_room(flexcoll_comm_t comm) { return FC_P2P_MAX_OPS - p2p_run(comm); }

flexcoll_result_t fc_group_enqueue_call(const fc_call_t *call) {
  if (fc_call_is_p2p(call->kind)) {
    /* Neighbouring sends and receives of a communicator run as one batch (see run_comm_work);
     * a batch holds at most FC_P2P_MAX_OPS.  Cutting a longer run into several batches could
     * deadlock (sends in the first batch waiting for receives in the second), so refuse it. */
    if (fc_group_p2p_room(call->comm) <= 0)
      return fc_error(call->comm, FLEXCOLL_INVALID_USAGE,
                      "more than %d sends and receives of one communicator in a row inside a group; end the group "
                      "and start another", FC_P2P_MAX_OPS);
  }
  fc_group_op_t op = {.is_init = 0, .call = *call};
  return enqueue(&op);
}

flexcoll_result_t fc_group_enqueue_init(flexcoll_comm_t comm) {
  fc_group_op_t op = {.is_init = 1, .call = {.comm = comm}};
  return enqueue(&op);
}

int fc_group_inits(flexcoll_comm_t comm) {
  for (size_t i = 0; i < group_len; i++)
    if (group_ops[i].is_init && group_ops[i].call.comm == comm) return 1;
  return 0;
}

flexcoll_result_t flexcoll_group_start(void) {
  group_depth++;
  return FLEXCOLL_SUCCESS;
}

/* The work of one communicator in a group: its initialisation, then its calls in order. */
typedef struct {
  flexcoll_comm_t comm;
  fc_group_op_t *ops;
  size_t nops;
  flexcoll_result_t result;
  char error[FC_ERROR_MSG_LEN];
  pthread_t thread;
} fc_comm_work_t;

static void *run_comm_work(void *arg) {
  fc_comm_work_t *w = arg;
  w->result = FLEXCOLL_SUCCESS;
  for (size_t i = 0; i < w->nops && w->result == FLEXCOLL_SUCCESS; i++) {
    fc_group_op_t *op = &w->ops[i];
    if (op->is_init) {
      w->result = fc_comm_init(op->call.comm);
    } else if (op->call.kind == FC_CALL_COLL) {
      w->result = fc_call_run(&op->call);
    } else if (!fc_call_is_p2p(op->call.kind)) {
      w->result = fc_window_call_run(&op->call);
    } else {
      /* Neighbouring sends and receives run together, as one batch: a rank that both sends to
       * and receives from a peer must not wait for one before posting the other. */
      fc_call_t batch[FC_P2P_MAX_OPS];
      int n = 0;
      while (i < w->nops && n < FC_P2P_MAX_OPS && !w->ops[i].is_init && fc_call_is_p2p(w->ops[i].call.kind))
        batch[n++] = w->ops[i++].call;
      i--;
      w->result = fc_p2p_run(batch, n);
    }
  }
  if (w->result != FLEXCOLL_SUCCESS) snprintf(w->error, sizeof w->error, "%s", fc_thread_last_error());
  return NULL;
}

/* Per-communicator lists of the initialisations (inits 1) or the calls (inits 0), in queue order. */
static fc_comm_work_t *split_by_comm(int inits, size_t *nwork, fc_group_op_t **sorted) {
  fc_comm_work_t *work = calloc(group_len, sizeof *work);
  *sorted = malloc(group_len * sizeof **sorted);
  if (!work || !*sorted) { free(work); free(*sorted); return NULL; }
  size_t n = 0, pos = 0;
  for (size_t i = 0; i < group_len; i++) {
    if (group_ops[i].is_init != inits) continue;
    flexcoll_comm_t c = group_ops[i].call.comm;
    size_t w = 0;
    while (w < n && work[w].comm != c) w++;
    if (w < n) continue;
    work[n].comm = c;
    work[n].ops = *sorted + pos;
    for (size_t j = i; j < group_len; j++)
      if (group_ops[j].call.comm == c && group_ops[j].is_init == inits) (*sorted)[pos++] = group_ops[j];
    work[n].nops = (size_t)(*sorted + pos - work[n].ops);
    n++;
  }
  *nwork = n;
  return work;
}

/* Each communicator's list in its own thread (one list: inline); the first failure is returned. */
static flexcoll_result_t run_in_threads(fc_comm_work_t *work, size_t nwork) {
  if (nwork == 1) {
    run_comm_work(&work[0]);
  } else {
    for (size_t i = 0; i < nwork; i++)
      if (pthread_create(&work[i].thread, NULL, run_comm_work, &work[i])) {
        work[i].result = fc_error(work[i].comm, FLEXCOLL_SYSTEM_ERROR, "cannot start a thread for a group");
        work[i].thread = 0;
        snprintf(work[i].error, sizeof work[i].error, "%s", fc_thread_last_error());
      }
    for (size_t i = 0; i < nwork; i++)
      if (work[i].thread) pthread_join(work[i].thread, NULL);
  }
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  for (size_t i = 0; i < nwork && res == FLEXCOLL_SUCCESS; i++)
    if (work[i].result != FLEXCOLL_SUCCESS) res = fc_error(NULL, work[i].result, "%s", work[i].error);
  return res;
}

static flexcoll_result_t run_phase(int inits) {
  size_t nwork;
  fc_group_op_t *sorted;
  fc_comm_work_t *work = split_by_comm(inits, &nwork, &sorted);
  if (!work) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "out of memory running a group");
  flexcoll_result_t res = nwork ? run_in_threads(work, nwork) : FLEXCOLL_SUCCESS;
  free(work);
  free(sorted);
  return res;
}

/* Initialisations first (they wait on one another: in parallel), then the calls, each
 * communicator's in its own thread.  Enqueuing device calls of several communicators inline in
 * queue order (so that every GPU sees them in the same order) hung on the GPU node and was taken
 * back; see docs/ARCHITECTURE.md. */
static flexcoll_result_t run_phases(void) {
  FC_CHECK(run_phase(1));
  return run_phase(0);
}

/* The distinct communicators of the queue, NULL if out of memory. */
static flexcoll_comm_t *queued_comms(size_t *n) {
  flexcoll_comm_t *comms = malloc(group_len * sizeof *comms);
  *n = 0;
  for (size_t i = 0; comms && i < group_len; i++) {
    size_t j = 0;
    while (j < *n && comms[j] != group_ops[i].call.comm) j++;
    if (j == *n) comms[(*n)++] = group_ops[i].call.comm;
  }
  return comms;
}

/* The end of a group is one call on each of its communicators, held from this thread while
 * their work runs in the group's own threads (that is no misuse), so another thread's call on
 * one of them is refused meanwhile.  If one cannot be held, nothing runs: the communicators
 * whose initialisation was queued fail (else they would stay pending for ever). */
static flexcoll_result_t run_group(void) {
  size_t n, held = 0;
  flexcoll_comm_t *comms = queued_comms(&n);
  if (!comms) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "out of memory running a group");
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  while (held < n && res == FLEXCOLL_SUCCESS)
    if ((res = fc_comm_enter(comms[held], "flexcoll_group_end")) == FLEXCOLL_SUCCESS) held++;
  if (res == FLEXCOLL_SUCCESS) {
    res = run_phases();
  } else {
    for (size_t i = 0; i < held; i++)
      if (fc_group_inits(comms[i])) fc_comm_fail_init(comms[i], res);
  }
  for (size_t i = 0; i < held; i++) fc_comm_leave(comms[i]);
  free(comms);
  return res;
}

flexcoll_result_t flexcoll_group_end(void) {
  if (group_depth == 0)
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "flexcoll_group_end without a matching flexcoll_group_start");
  if (--group_depth > 0) return FLEXCOLL_SUCCESS;
  flexcoll_result_t res = group_len ? run_group() : FLEXCOLL_SUCCESS;
  free(group_ops);
  group_ops = NULL;
  group_len = group_cap = 0;
  return res;
}
