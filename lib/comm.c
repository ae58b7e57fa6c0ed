/* comm.c — communicator life cycle: creation, initialisation, destruction, abort.
 *
 * Live communicators are kept in a registry so that a call on a destroyed (or never created)
 * handle is reported as FLEXCOLL_INVALID_USAGE instead of touching freed memory. */
#define _GNU_SOURCE
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "error.h"
#include "gpu/gpu.h"
#include "group.h"
#include "param.h"
#include "sched/sched.h"
#include "transports/transports.h"

FC_PARAM_INT(timeout_ms, "TIMEOUT_MS", 300000)

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static flexcoll_comm_t *registry;
static size_t registry_len, registry_cap;

static int registry_add(flexcoll_comm_t c) {
  pthread_mutex_lock(&registry_lock);
  if (registry_len == registry_cap) {
    size_t cap = registry_cap ? registry_cap * 2 : 16;
    flexcoll_comm_t *r = realloc(registry, cap * sizeof *r);
    if (!r) { pthread_mutex_unlock(&registry_lock); return -1; }
    registry = r;
    registry_cap = cap;
  }
  registry[registry_len++] = c;
  pthread_mutex_unlock(&registry_lock);
  return 0;
}

static int registry_remove(flexcoll_comm_t c) {
  int found = 0;
  pthread_mutex_lock(&registry_lock);
  for (size_t i = 0; i < registry_len; i++)
    if (registry[i] == c) { registry[i] = registry[--registry_len]; found = 1; break; }
  pthread_mutex_unlock(&registry_lock);
  return found;
}

int fc_comm_is_live(flexcoll_comm_t c) {
  int found = 0;
  pthread_mutex_lock(&registry_lock);
  for (size_t i = 0; i < registry_len && !found; i++) found = registry[i] == c;
  pthread_mutex_unlock(&registry_lock);
  return found;
}

flexcoll_result_t fc_comm_check(flexcoll_comm_t comm, const char *fn) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  if (!fc_comm_is_live(comm))
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "%s: comm %p is not a live communicator (destroyed or never created)",
                    fn, (void *)comm);
  switch (atomic_load(&comm->state)) {
    case FC_COMM_READY: return FLEXCOLL_SUCCESS;
    case FC_COMM_PENDING:
      return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: comm is still being initialised (its group has not ended)", fn);
    case FC_COMM_ABORTED: return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: comm was aborted; only destroy is allowed", fn);
    default: return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: comm failed to initialise; only destroy is allowed", fn);
  }
}

flexcoll_result_t fc_comm_set_async_error(flexcoll_comm_t comm, flexcoll_result_t err) {
  int expected = FLEXCOLL_SUCCESS;
  atomic_compare_exchange_strong(&comm->async_error, &expected, (int)err);
  return (flexcoll_result_t)atomic_load(&comm->async_error);
}

flexcoll_result_t fc_comm_alloc(flexcoll_comm_t *out, int nranks, int rank, const flexcoll_unique_id_t *id,
                                const flexcoll_config_t *config) {
  flexcoll_comm_t c = calloc(1, sizeof *c);
  if (!c) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "out of memory for a communicator");
  c->magic = FC_COMM_MAGIC;
  c->rank = rank;
  c->nranks = nranks;
  c->init_id = *id;
  flexcoll_config_t dflt = FLEXCOLL_CONFIG_INITIALIZER;
  c->init_config = dflt;
  /* Copy only the part of the struct the caller knew about. */
  if (config) memcpy(&c->init_config, config, config->size < sizeof dflt ? config->size : sizeof dflt);
  c->init_config.size = sizeof dflt;
  /* "The current device" is the caller's: resolve it here, on the calling thread, since the
   * initialisation may run in another thread (groups). */
  if (c->init_config.cuda_device == FLEXCOLL_CONFIG_UNDEF) c->init_config.cuda_device = fc_gpu_current_device();
  c->timeout_ms = c->init_config.timeout_ms != FLEXCOLL_CONFIG_UNDEF ? c->init_config.timeout_ms
                                                                       : (int)fc_param_timeout_ms();
  c->cuda_device = -1;
  atomic_init(&c->state, FC_COMM_PENDING);
  atomic_init(&c->abort_flag, 0);
  atomic_init(&c->async_error, FLEXCOLL_SUCCESS);
  pthread_mutex_init(&c->error_lock, NULL);
  fc_schedule_init(&c->schedule);
  if (registry_add(c)) { free(c); return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "out of memory"); }
  *out = c;
  return FLEXCOLL_SUCCESS;
}

/* Settings that shape the messages between ranks: if two ranks disagree, one sends slices or
 * chunks the other does not expect, or runs another algorithm, and both hang or fail later.
 * Every rank compares its environment with rank 0's at creation instead. */
static const char *const shared_settings[] = {"FLEXCOLL_ALGO",           "FLEXCOLL_CHUNK_SIZE",  "FLEXCOLL_SLICE_SIZE",
                                              "FLEXCOLL_GPU_SLICE_SIZE", "FLEXCOLL_GPU_SLOTS",   "FLEXCOLL_ONESHOT_MAX_BYTES",
                                              "FLEXCOLL_DIRECT",         "FLEXCOLL_DIRECT_MIN_BYTES",
                                              "FLEXCOLL_DIRECT_RS_MIN_BYTES", "FLEXCOLL_LL_MAX_BYTES",
                                              "FLEXCOLL_ONESHOT_BLOCKS", "FLEXCOLL_PIPELINE",
                                              "FLEXCOLL_PIPELINE_BLOCKS", "FLEXCOLL_PIPELINE_SUBSLOTS",
                                              "FLEXCOLL_LINKS",          "FLEXCOLL_LINK_SHARES"};
#define FC_NSETTINGS (sizeof shared_settings / sizeof shared_settings[0])
#define FC_SETTING_LEN 48

static flexcoll_result_t check_settings_agree(flexcoll_comm_t c) {
  size_t per_rank = FC_NSETTINGS * FC_SETTING_LEN;
  char *all = calloc((size_t)c->nranks, per_rank);
  if (!all) return fc_error(c, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  char *mine = all + (size_t)c->rank * per_rank;
  for (size_t i = 0; i < FC_NSETTINGS; i++) {
    const char *v = getenv(shared_settings[i]);
    snprintf(mine + i * FC_SETTING_LEN, FC_SETTING_LEN, "%s", v ? v : "");
  }
  flexcoll_result_t res = fc_bootstrap_allgather(c->bootstrap, all, per_rank);
  for (int r = 1; r < c->nranks && res == FLEXCOLL_SUCCESS; r++)
    for (size_t i = 0; i < FC_NSETTINGS && res == FLEXCOLL_SUCCESS; i++) {
      const char *a = all + i * FC_SETTING_LEN, *b = all + (size_t)r * per_rank + i * FC_SETTING_LEN;
      if (strcmp(a, b))
        res = fc_error(c, FLEXCOLL_INVALID_USAGE, "%s differs between ranks: rank 0 has \"%s\", rank %d has \"%s\"",
                       shared_settings[i], a, r, b);
    }
  free(all);
  return res;
}

flexcoll_result_t fc_comm_init(flexcoll_comm_t c) {
  fc_log_set_rank(c->rank);
  flexcoll_result_t res;
  res = fc_bootstrap_init(&c->bootstrap, &c->init_id, c->rank, c->nranks, c->timeout_ms, &c->abort_flag);
  /* Done with the rendezvous either way: after a success the root has answered everyone and this
   * only joins it; after a failure the port must be free for a retry when this returns. */
  fc_bootstrap_stop_root(c->root);
  c->root = NULL;
  if (res != FLEXCOLL_SUCCESS) goto fail;
  FC_CHECK_GOTO(check_settings_agree(c), res, fail);
  c->p2p_sent = calloc((size_t)c->nranks * 2, sizeof *c->p2p_sent);
  if (!c->p2p_sent) { res = fc_error(c, FLEXCOLL_SYSTEM_ERROR, "out of memory"); goto fail; }
  c->p2p_received = c->p2p_sent + c->nranks;
  FC_CHECK_GOTO(fc_links_open(c), res, fail);
  FC_CHECK_GOTO(fc_gpu_comm_init(c), res, fail);
  atomic_store(&c->state, FC_COMM_READY);
  FC_INFO(FC_SUB_INIT, "comm %p rank %d/%d ready (cuda device %d, timeout %d ms)", (void *)c, c->rank, c->nranks,
          c->cuda_device, c->timeout_ms);
  return FLEXCOLL_SUCCESS;
fail:
  /* Keep the message of the failure on the communicator for flexcoll_get_last_error(comm). */
  pthread_mutex_lock(&c->error_lock);
  snprintf(c->last_error, sizeof c->last_error, "%s", fc_thread_last_error());
  pthread_mutex_unlock(&c->error_lock);
  fc_comm_set_async_error(c, res);
  /* Leave the bootstrap ring now: ranks still initialising with us see it closed at once
   * instead of waiting out their timeout. */
  if (c->bootstrap) { fc_bootstrap_close(c->bootstrap); c->bootstrap = NULL; }
  atomic_store(&c->state, FC_COMM_FAILED);
  return res;
}

static void comm_free(flexcoll_comm_t c, int force) {
  fc_gpu_comm_fini(c);
  fc_links_close(c, force);
  fc_bootstrap_stop_root(c->root);
  if (c->bootstrap) fc_bootstrap_close(c->bootstrap);
  fc_schedule_free(&c->schedule);
  free(c->scratch);
  free(c->landing);
  free(c->p2p_sent);
  pthread_mutex_destroy(&c->error_lock);
  c->magic = 0;
  free(c);
}

flexcoll_result_t flexcoll_comm_destroy(flexcoll_comm_t comm) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_comm_destroy: comm is NULL");
  if (fc_comm_is_live(comm) && atomic_load(&comm->state) == FC_COMM_PENDING && fc_group_inits(comm))
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "flexcoll_comm_destroy: comm is queued for initialisation in this thread's group; end the group first");
  if (!registry_remove(comm))
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "flexcoll_comm_destroy: comm %p is not a live communicator (destroyed twice?)",
                    (void *)comm);
  int state = atomic_load(&comm->state);
  /* A communicator that failed or was aborted may have peers gone: do not wait for them. */
  comm_free(comm, state != FC_COMM_READY || atomic_load(&comm->async_error) != FLEXCOLL_SUCCESS);
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t flexcoll_comm_abort(flexcoll_comm_t comm) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_comm_abort: comm is NULL");
  if (!fc_comm_is_live(comm))
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "flexcoll_comm_abort: comm %p is not a live communicator", (void *)comm);
  /* Another thread may be inside a collective on comm: the flag makes its waits return. */
  atomic_store(&comm->abort_flag, 1);
  atomic_store(&comm->state, FC_COMM_ABORTED);
  fc_gpu_comm_abort(comm);
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t flexcoll_comm_get_async_error(flexcoll_comm_t comm, flexcoll_result_t *async_error) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_comm_get_async_error: comm is NULL");
  if (!fc_comm_is_live(comm))
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "flexcoll_comm_get_async_error: comm %p is not a live communicator",
                    (void *)comm);
  if (!async_error) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_comm_get_async_error: async_error is NULL");
  if (atomic_load(&comm->state) == FC_COMM_PENDING) { *async_error = FLEXCOLL_IN_PROGRESS; return FLEXCOLL_SUCCESS; }
  fc_gpu_poll_async_error(comm);
  *async_error = (flexcoll_result_t)atomic_load(&comm->async_error);
  return FLEXCOLL_SUCCESS;
}

const char *flexcoll_get_last_error(flexcoll_comm_t comm) {
  if (comm && fc_comm_is_live(comm)) return comm->last_error;
  return fc_thread_last_error();
}

#define FC_COMM_GETTER(fn, type, expr)                                                         \
  flexcoll_result_t fn(flexcoll_comm_t comm, type *out) {                                      \
    FC_CHECK(fc_comm_check(comm, #fn));                                                        \
    if (!out) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, #fn ": output pointer is NULL"); \
    *out = (expr);                                                                             \
    return FLEXCOLL_SUCCESS;                                                                   \
  }
FC_COMM_GETTER(flexcoll_comm_count, int, comm->nranks)
FC_COMM_GETTER(flexcoll_comm_user_rank, int, comm->rank)
FC_COMM_GETTER(flexcoll_comm_cu_device, int, comm->cuda_device)
