/* split.c — flexcoll_comm_split: new communicators from the ranks of one, by color and key, with
 * ncclCommSplit's semantics.
 *
 * Over the parent's bootstrap ring (collective, every rank of the parent calls it):
 *   1. an all-gather of (color, key, status): every rank learns every rank's color and key, and
 *      whether some rank refused its own arguments; then all ranks fail together instead of the
 *      others waiting on that one until their timeout;
 *   2. the lowest parent rank of each color creates a unique id (flexcoll_get_unique_id: its
 *      process serves that rendezvous), BEFORE
 *   3. a second all-gather, which hands every rank the id of its color's leader;
 *   4. every member initialises its rank of the new communicator with flexcoll_comm_init_rank,
 *      which blocks until all members of the color have arrived.
 * Each rank's split runs in its caller's thread, so ranks living as threads of one process each
 * call it from their own thread.  One thread driving several ranks cannot (each call blocks in
 * step 1 until the others arrive), and inside a group the split is refused: a group defers only
 * initialisations and collectives, and the exchange must happen before the new rank exists.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "error.h"
#include "group.h"

#define SPLIT_FN "flexcoll_comm_split"

/* What each rank tells the others in the first all-gather. */
typedef struct {
  int32_t color, key;
  int32_t status; /* FLEXCOLL_SUCCESS, or the code this rank refused its own arguments with */
} split_entry_t;

/* What each rank tells the others in the second all-gather: a color leader's new id. */
typedef struct {
  int32_t status; /* FLEXCOLL_SUCCESS when id is valid (leaders only) */
  flexcoll_unique_id_t id;
} split_id_t;

/* The new communicator's settings: the parent's, overridden by config's defined fields; the
 * parent's CUDA device unless config names one. */
static flexcoll_config_t split_config(flexcoll_comm_t comm, const flexcoll_config_t *config) {
  flexcoll_config_t cfg = comm->init_config;
  cfg.cuda_device = comm->cuda_device;
  if (!config) return cfg;
  size_t known = config->size < sizeof cfg ? config->size : sizeof cfg;
#define SPLIT_FIELD(f)                                                                                  \
  if (known >= offsetof(flexcoll_config_t, f) + sizeof config->f && config->f != FLEXCOLL_CONFIG_UNDEF) \
    cfg.f = config->f;
  SPLIT_FIELD(cuda_device)
  SPLIT_FIELD(timeout_ms)
  SPLIT_FIELD(blocking)
#undef SPLIT_FIELD
  return cfg;
}

/* Record the thread's last error (set by a call split made) on comm too, prefixed by the call's name. */
static flexcoll_result_t keep_on_comm(flexcoll_comm_t comm, flexcoll_result_t code) {
  char msg[FC_ERROR_MSG_LEN];
  snprintf(msg, sizeof msg, "%s", fc_thread_last_error()); /* fc_error overwrites the thread's message */
  if (strncmp(msg, SPLIT_FN, strlen(SPLIT_FN)) == 0) return fc_error(comm, code, "%s", msg);
  return fc_error(comm, code, "%s: %s", SPLIT_FN, msg);
}

/* The checks of this rank's own arguments, which do not stop it from taking part in the exchange. */
static flexcoll_result_t check_local(flexcoll_comm_t comm, int color, flexcoll_comm_t *newcomm,
                                     const flexcoll_config_t *config) {
  if (!newcomm) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: newcomm is NULL", SPLIT_FN);
  if (color < 0 && color != FLEXCOLL_SPLIT_NOCOLOR)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                    "%s: color %d is negative but not FLEXCOLL_SPLIT_NOCOLOR (-1)", SPLIT_FN, color);
  flexcoll_result_t res = fc_check_config(config, SPLIT_FN);
  /* fc_check_config records on the thread only: keep the message on comm too. */
  return res == FLEXCOLL_SUCCESS ? res : keep_on_comm(comm, res);
}

/* Steps 1-4 above, comm entered by the caller. */
static flexcoll_result_t split(flexcoll_comm_t comm, int color, int key, flexcoll_comm_t *newcomm,
                               const flexcoll_config_t *config) {
  const int me = comm->rank, n = comm->nranks;
  flexcoll_result_t mine = check_local(comm, color, newcomm, config);

  split_entry_t *all = calloc((size_t)n, sizeof *all);
  split_id_t *ids = calloc((size_t)n, sizeof *ids);
  /* Out of memory here leaves the others waiting in the all-gather: as any collective would. */
  if (!all || !ids) {
    free(all);
    free(ids);
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "%s: out of memory for %d ranks", SPLIT_FN, n);
  }
  flexcoll_result_t res;
  all[me] = (split_entry_t){.color = color, .key = key, .status = (int32_t)mine};
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, all, sizeof *all), res, out);

  if (mine != FLEXCOLL_SUCCESS) { res = mine; goto out; } /* message recorded by check_local */
  for (int r = 0; r < n; r++)
    if (all[r].status != FLEXCOLL_SUCCESS) {
      res = fc_error(comm, (flexcoll_result_t)all[r].status,
                     "%s: rank %d of the parent communicator passed invalid arguments (%s); no rank split",
                     SPLIT_FN, r, flexcoll_get_error_string((flexcoll_result_t)all[r].status));
      goto out;
    }

  /* This rank's place in its color: members ordered by key, then parent rank; the leader is the
   * member of lowest parent rank. */
  int newrank = 0, nnew = 0, leader = -1;
  if (color != FLEXCOLL_SPLIT_NOCOLOR)
    for (int r = 0; r < n; r++) {
      if (all[r].color != color) continue;
      if (leader < 0) leader = r;
      nnew++;
      if (all[r].key < key || (all[r].key == key && r < me)) newrank++;
    }

  /* The leader's id exists (and its root listens) before the all-gather that hands it out. */
  if (leader == me) {
    ids[me].status = (int32_t)flexcoll_get_unique_id(&ids[me].id);
    if (ids[me].status != FLEXCOLL_SUCCESS) keep_on_comm(comm, (flexcoll_result_t)ids[me].status);
  }
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, ids, sizeof *ids), res, out);
  if (color == FLEXCOLL_SPLIT_NOCOLOR) { res = FLEXCOLL_SUCCESS; goto out; }
  if (ids[leader].status != FLEXCOLL_SUCCESS) {
    res = leader == me ? (flexcoll_result_t)ids[me].status
                       : fc_error(comm, (flexcoll_result_t)ids[leader].status,
                                  "%s: rank %d, the leader of color %d, could not create its unique id (%s)", SPLIT_FN,
                                  leader, color, flexcoll_get_error_string((flexcoll_result_t)ids[leader].status));
    goto out;
  }

  flexcoll_config_t cfg = split_config(comm, config);
  FC_INFO(FC_SUB_INIT, "%s: rank %d color %d key %d -> rank %d of %d (leader %d)", SPLIT_FN, me, color, key, newrank,
          nnew, leader);
  res = flexcoll_comm_init_rank(newcomm, nnew, ids[leader].id, newrank, &cfg);
  /* IN_PROGRESS: a non-blocking config; the new communicator initialises in the background. */
  if (res != FLEXCOLL_SUCCESS && res != FLEXCOLL_IN_PROGRESS) keep_on_comm(comm, res);
out:
  free(all);
  free(ids);
  return res;
}

flexcoll_result_t flexcoll_comm_split(flexcoll_comm_t comm, int color, int key, flexcoll_comm_t *newcomm,
                                      const flexcoll_config_t *config) {
  if (newcomm) *newcomm = NULL;
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: comm is NULL", SPLIT_FN);
  /* Held for the whole call, as a collective holds it: no other thread may drive or destroy the
   * parent while its bootstrap ring carries the exchange. */
  FC_CHECK(fc_comm_enter(comm, SPLIT_FN));
  flexcoll_result_t res = fc_comm_check(comm, SPLIT_FN);
  if (res == FLEXCOLL_SUCCESS && fc_group_active())
    res = fc_error(comm, FLEXCOLL_INVALID_USAGE,
                   "%s: not allowed between flexcoll_group_start and flexcoll_group_end; split outside the group, "
                   "each rank from its own thread", SPLIT_FN);
  if (res == FLEXCOLL_SUCCESS && atomic_load(&comm->async_error) != FLEXCOLL_SUCCESS) {
    flexcoll_result_t err = (flexcoll_result_t)atomic_load(&comm->async_error);
    res = fc_error(comm, err, "%s: the communicator failed earlier (%s); abort and destroy it", SPLIT_FN,
                   flexcoll_get_error_string(err));
  }
  if (res == FLEXCOLL_SUCCESS) res = split(comm, color, key, newcomm, config);
  fc_comm_leave(comm);
  return res;
}
