/* comm.c — communicator life cycle: creation, initialisation, destruction, abort.
 *
 * Live communicators are kept in a registry so that a call on a destroyed (or never created)
 * handle is reported as FLEXCOLL_INVALID_USAGE instead of touching freed memory. */
#define _GNU_SOURCE
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bootstrap.h"
#include "clock.h"
#include "config.h"
#include "error.h"
#include "gpu/gpu.h"
#include "group.h"
#include "host/shm.h"
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

/* Index of c in the registry, registry_len if absent; registry_lock held. */
static size_t registry_find(flexcoll_comm_t c) {
  size_t i = 0;
  while (i < registry_len && registry[i] != c) i++;
  return i;
}

int fc_comm_is_live(flexcoll_comm_t c) {
  pthread_mutex_lock(&registry_lock);
  int found = registry_find(c) < registry_len;
  pthread_mutex_unlock(&registry_lock);
  return found;
}

/* Liveness and the in-call mark are decided under the registry lock, as destroy's are: a call
 * racing a destroy either finds comm gone or holds it, and then destroy refuses. */
flexcoll_result_t fc_comm_enter(flexcoll_comm_t comm, const char *fn) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  const char *busy = NULL;
  pthread_mutex_lock(&registry_lock);
  int live = registry_find(comm) < registry_len;
  if (live) atomic_compare_exchange_strong(&comm->in_call, &busy, fn);
  pthread_mutex_unlock(&registry_lock);
  if (!live)
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "%s: comm %p is not a live communicator (destroyed or never created)",
                    fn, (void *)comm);
  if (busy)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "%s: communicator is already in use by another thread (inside %s); one thread at a time may drive a "
                    "communicator", fn, busy);
  return FLEXCOLL_SUCCESS;
}

void fc_comm_leave(flexcoll_comm_t comm) { atomic_store(&comm->in_call, NULL); }

/* For the calls allowed alongside another thread's (abort, get_async_error): 0 if c is not live. */
static int registry_pin(flexcoll_comm_t c) {
  pthread_mutex_lock(&registry_lock);
  int live = registry_find(c) < registry_len;
  if (live) atomic_fetch_add(&c->pins, 1);
  pthread_mutex_unlock(&registry_lock);
  return live;
}

static void unpin(flexcoll_comm_t c) { atomic_fetch_sub(&c->pins, 1); }

typedef enum { TAKE_GONE, TAKE_DONE, TAKE_BUSY } take_t;

/* Take c out of the registry for destroy, unless a call is inside it: then *busy names the call
 * (NULL: only pinned ones) and *waitable says whether it will end soon by itself (pinned calls
 * do; a call in progress does once c is aborted, since abort makes its waits return). */
static take_t registry_take(flexcoll_comm_t c, const char **busy, int *waitable, int *timeout_ms) {
  take_t t = TAKE_GONE;
  *busy = NULL;
  pthread_mutex_lock(&registry_lock);
  size_t i = registry_find(c);
  if (i < registry_len) {
    if (atomic_load(&c->pins) == 0 && atomic_compare_exchange_strong(&c->in_call, busy, "flexcoll_comm_destroy")) {
      registry[i] = registry[--registry_len];
      t = TAKE_DONE;
    } else {
      t = TAKE_BUSY;
      *waitable = !*busy || atomic_load(&c->state) == FC_COMM_ABORTED;
      *timeout_ms = c->timeout_ms;
    }
  }
  pthread_mutex_unlock(&registry_lock);
  return t;
}

flexcoll_result_t fc_comm_check(flexcoll_comm_t comm, const char *fn) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  if (!fc_comm_is_live(comm))
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "%s: comm %p is not a live communicator (destroyed or never created)",
                    fn, (void *)comm);
  return fc_comm_check_held(comm, fn);
}

flexcoll_result_t fc_comm_check_held(flexcoll_comm_t comm, const char *fn) {
  switch (atomic_load(&comm->state)) {
    case FC_COMM_READY: return FLEXCOLL_SUCCESS;
    case FC_COMM_PENDING:
      return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                      "%s: comm is still being initialised (its group has not ended, or its non-blocking initialisation "
                      "is in progress: flexcoll_comm_get_async_error says when it is done)", fn);
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
  atomic_init(&c->in_call, NULL);
  atomic_init(&c->pins, 0);
  pthread_mutex_init(&c->error_lock, NULL);
  fc_schedule_init(&c->schedule);
  if (registry_add(c)) { free(c); return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "out of memory"); }
  *out = c;
  return FLEXCOLL_SUCCESS;
}

/* Settings that shape the messages between ranks: if two ranks disagree, one sends slices or
 * chunks the other does not expect, or runs another algorithm, and both hang or fail later.
 * Every rank compares its environment with rank 0's at creation instead; which settings those
 * are, the registry says (shared, lib/param.c). */
#define FC_SETTING_LEN 48

static flexcoll_result_t check_settings_agree(flexcoll_comm_t c) {
  size_t nparams = 0, n = 0;
  const fc_param_def_t *params = fc_param_table(&nparams);
  const char *names[64];
  for (size_t i = 0; i < nparams && n < 64; i++)
    if (params[i].shared) names[n++] = params[i].name;
  size_t per_rank = n * FC_SETTING_LEN;
  char *all = calloc((size_t)c->nranks, per_rank);
  if (!all) return fc_error(c, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  char *mine = all + (size_t)c->rank * per_rank;
  for (size_t i = 0; i < n; i++) {
    const char *v = getenv(names[i]);
    snprintf(mine + i * FC_SETTING_LEN, FC_SETTING_LEN, "%s", v ? v : "");
  }
  flexcoll_result_t res = fc_bootstrap_allgather(c->bootstrap, all, per_rank);
  for (int r = 1; r < c->nranks && res == FLEXCOLL_SUCCESS; r++)
    for (size_t i = 0; i < n && res == FLEXCOLL_SUCCESS; i++) {
      const char *a = all + i * FC_SETTING_LEN, *b = all + (size_t)r * per_rank + i * FC_SETTING_LEN;
      if (strcmp(a, b))
        res = fc_error(c, FLEXCOLL_INVALID_USAGE, "%s differs between ranks: rank 0 has \"%s\", rank %d has \"%s\"",
                       names[i], a, r, b);
    }
  free(all);
  return res;
}

flexcoll_result_t fc_comm_init(flexcoll_comm_t c) {
  fc_log_set_rank(c->rank);
  fc_log_version(PACKAGE_VERSION);
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
  const int caller_device = fc_gpu_enter_device(c);
  res = fc_links_open(c);
  fc_gpu_leave_device(caller_device);
  if (res != FLEXCOLL_SUCCESS) goto fail;
  FC_CHECK_GOTO(fc_shm_open(c), res, fail);
  FC_CHECK_GOTO(fc_gpu_comm_init(c), res, fail);
  /* Unless aborted meanwhile (a non-blocking initialisation): that stays. */
  int pending = FC_COMM_PENDING;
  atomic_compare_exchange_strong(&c->state, &pending, FC_COMM_READY);
  FC_INFO(FC_SUB_INIT, "comm %p rank %d/%d ready (cuda device %d, timeout %d ms)", (void *)c, c->rank, c->nranks,
          c->cuda_device, c->timeout_ms);
  return FLEXCOLL_SUCCESS;
fail:
  fc_comm_fail_init(c, res);
  return res;
}

void fc_comm_fail_init(flexcoll_comm_t c, flexcoll_result_t res) {
  /* Keep the message of the failure on the communicator for flexcoll_get_last_error(comm). */
  pthread_mutex_lock(&c->error_lock);
  snprintf(c->last_error, sizeof c->last_error, "%s", fc_thread_last_error());
  pthread_mutex_unlock(&c->error_lock);
  fc_comm_set_async_error(c, res);
  /* Leave the bootstrap ring now: ranks still initialising with us see it closed at once
   * instead of waiting out their timeout. */
  if (c->bootstrap) { fc_bootstrap_close(c->bootstrap); c->bootstrap = NULL; }
  int pending = FC_COMM_PENDING;
  atomic_compare_exchange_strong(&c->state, &pending, FC_COMM_FAILED);
}

#define FC_INIT_IN_BACKGROUND "flexcoll_comm_init_rank (non-blocking, still initialising)"

static void *init_thread_main(void *arg) {
  flexcoll_comm_t c = arg;
  fc_comm_init(c);
  fc_comm_leave(c); /* the thread's last access to c */
  return NULL;
}

flexcoll_result_t fc_comm_init_in_background(flexcoll_comm_t c) {
  /* Held by the initialising thread: other calls on c are refused naming it, and destroy waits
   * for it once the communicator is aborted. */
  FC_CHECK(fc_comm_enter(c, FC_INIT_IN_BACKGROUND));
  int err = pthread_create(&c->init_thread, NULL, init_thread_main, c);
  if (err) {
    fc_comm_leave(c);
    return fc_error(c, FLEXCOLL_SYSTEM_ERROR, "flexcoll_comm_init_rank: cannot start the initialising thread: %s",
                    strerror(err));
  }
  c->init_thread_started = 1;
  return FLEXCOLL_IN_PROGRESS;
}

static void comm_free(flexcoll_comm_t c, int force) {
  if (c->init_thread_started) pthread_join(c->init_thread, NULL); /* it has left the communicator */
  fc_gpu_comm_fini(c);
  fc_links_close(c, force);
  fc_mem_free_device(c->dev_scratch);
  fc_mem_free_device(c->dev_landing);
  fc_host_windows_release(c);
  fc_shm_close(c);
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

/* Freeing comm under a call in another thread crashed that thread (SIGABRT in UCX): refuse
 * instead, except where the call is about to end anyway (comm aborted, or only abort /
 * get_async_error inside): wait for it then, so that a watchdog may abort and destroy at once,
 * as NCCL's ncclCommAbort does (the NCCL shim relies on it). */
static flexcoll_result_t take_for_destroy(flexcoll_comm_t comm, const char *fn) {
  double deadline = -1;
  for (;;) {
    const char *busy;
    int waitable = 0, timeout_ms = 0;
    take_t t = registry_take(comm, &busy, &waitable, &timeout_ms);
    if (t == TAKE_DONE) return FLEXCOLL_SUCCESS;
    if (t == TAKE_GONE)
      return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "%s: comm %p is not a live communicator (destroyed twice?)", fn,
                      (void *)comm);
    double now = fc_now_ms();
    if (deadline < 0) deadline = now + (timeout_ms > 1000 ? timeout_ms : 1000);
    if (!waitable || now > deadline)
      return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                      "%s: communicator is in use by another thread (inside %s); destroy it after that call returns "
                      "(flexcoll_comm_abort makes it return)", fn, busy ? busy : "flexcoll_comm_abort");
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
}

flexcoll_result_t flexcoll_comm_destroy(flexcoll_comm_t comm) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_comm_destroy: comm is NULL");
  if (fc_comm_is_live(comm) && atomic_load(&comm->state) == FC_COMM_PENDING && fc_group_inits(comm))
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "flexcoll_comm_destroy: comm is queued for initialisation in this thread's group; end the group first");
  FC_CHECK(take_for_destroy(comm, "flexcoll_comm_destroy"));
  int state = atomic_load(&comm->state);
  /* A communicator that failed or was aborted may have peers gone: do not wait for them. */
  comm_free(comm, state != FC_COMM_READY || atomic_load(&comm->async_error) != FLEXCOLL_SUCCESS);
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t flexcoll_comm_abort(flexcoll_comm_t comm) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_comm_abort: comm is NULL");
  /* Pinned, not entered: another thread may be inside a collective on comm (the flag makes its
   * waits return); pinned so that a destroy from a third thread waits for us. */
  if (!registry_pin(comm))
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "flexcoll_comm_abort: comm %p is not a live communicator", (void *)comm);
  atomic_store(&comm->abort_flag, 1);
  /* Still initialising (a group's, or in the background): nothing was enqueued, and the device
   * state may be half built; the flag ends the initialisation's waits. */
  int pending = FC_COMM_PENDING;
  if (!atomic_compare_exchange_strong(&comm->state, &pending, FC_COMM_ABORTED)) {
    atomic_store(&comm->state, FC_COMM_ABORTED);
    fc_gpu_comm_abort(comm);
  }
  unpin(comm);
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t flexcoll_comm_get_async_error(flexcoll_comm_t comm, flexcoll_result_t *async_error) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_comm_get_async_error: comm is NULL");
  if (!registry_pin(comm))
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "flexcoll_comm_get_async_error: comm %p is not a live communicator",
                    (void *)comm);
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (!async_error) {
    res = fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_comm_get_async_error: async_error is NULL");
  } else if (atomic_load(&comm->state) == FC_COMM_PENDING) {
    *async_error = FLEXCOLL_IN_PROGRESS;
  } else {
    fc_gpu_poll_async_error(comm);
    *async_error = (flexcoll_result_t)atomic_load(&comm->async_error);
  }
  unpin(comm);
  return res;
}

const char *flexcoll_get_last_error(flexcoll_comm_t comm) {
  if (comm && fc_comm_is_live(comm)) return comm->last_error;
  return fc_thread_last_error();
}

/* out names the output argument as the header does. */
#define FC_COMM_GETTER(fn, type, out, expr)                                                     \
  flexcoll_result_t fn(flexcoll_comm_t comm, type *out) {                                      \
    FC_CHECK(fc_comm_check(comm, #fn));                                                        \
    if (!out) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, #fn ": " #out " is NULL");       \
    *out = (expr);                                                                             \
    return FLEXCOLL_SUCCESS;                                                                   \
  }
FC_COMM_GETTER(flexcoll_comm_count, int, count, comm->nranks)
FC_COMM_GETTER(flexcoll_comm_user_rank, int, rank, comm->rank)
FC_COMM_GETTER(flexcoll_comm_cu_device, int, device, comm->cuda_device)
