/* comm.h — the communicator: everything a collective needs hangs off it (no hidden globals
 * beyond parameters and the log). */
#ifndef FC_COMM_H
#define FC_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "flexcoll.h"
#include "algos/algos.h"

#define FC_ERROR_MSG_LEN 512
#define FC_COMM_MAGIC 0x666c6578636f6c6cULL /* "flexcoll" */

typedef enum {
  FC_COMM_PENDING, /* created inside a group, initialised at its end; or initialising in the background */
  FC_COMM_READY,
  FC_COMM_FAILED,  /* initialisation failed; only destroy is allowed */
  FC_COMM_ABORTED
} fc_comm_state_t;

struct fc_bootstrap;
struct fc_bootstrap_root;
struct fc_links;
struct fc_gpu;
struct fc_shm;
struct flexcoll_window;

struct flexcoll_comm {
  uint64_t magic;
  int rank, nranks;
  int cuda_device;    /* -1: host memory only */
  int timeout_ms;     /* longest wait on a peer */
  _Atomic int state;  /* fc_comm_state_t */
  atomic_int abort_flag;   /* set by flexcoll_comm_abort: every wait loop returns */
  atomic_int async_error;  /* first asynchronous failure, FLEXCOLL_SUCCESS if none */
  pthread_mutex_t error_lock;
  char last_error[FC_ERROR_MSG_LEN];
  /* One thread at a time drives a communicator (flexcoll(7)): the name of the public call inside
   * it now, NULL if none (fc_comm_enter/leave).  A second thread's call used to run anyway and
   * corrupt the first one's state (wrong results, UCX assertions); it is refused instead. */
  _Atomic(const char *) in_call;
  /* Calls allowed from any thread at any time (abort, get_async_error) that are inside now:
   * destroy waits for them rather than free what they are reading. */
  atomic_int pins;

  struct fc_bootstrap *bootstrap;
  struct fc_bootstrap_root *root; /* the rendezvous this rank serves (launcher mode, rank 0), until init ends */
  struct fc_links *links; /* every usable link and its cost model (lib/sched/links.c) */
  struct fc_gpu *gpu;   /* device-memory state, NULL on host-only communicators */
  struct fc_shm *shm;   /* the shared-memory segment of ranks on one host (lib/host/shm.c), or NULL */
  struct flexcoll_window *host_windows; /* windows on host memory (lib/host/window.c) */
  unsigned host_windows_registered;

  uint32_t coll_seq;    /* collectives issued, the same sequence on every rank */
  uint32_t *p2p_sent, *p2p_received; /* per peer: point-to-point messages so far (host transport) */
  fc_schedule_t schedule; /* reused between calls */
  void *scratch;        /* host scratch for schedules, grown on demand */
  size_t scratch_bytes;
  void *landing;        /* where received slices wait to be reduced, grown on demand */
  size_t landing_bytes;
  void *dev_scratch;    /* the same two in device memory, for schedules run on device buffers */
  size_t dev_scratch_bytes; /* (fc_host_run_device); freed after the links that registered them */
  void *dev_landing;
  size_t dev_landing_bytes;

  /* Deferred initialisation (inside a group). */
  flexcoll_unique_id_t init_id;
  flexcoll_config_t init_config;
  /* Non-blocking initialisation (config.blocking = 0): the thread running it, which holds the
   * communicator (in_call) until it is done; joined when the communicator is freed. */
  pthread_t init_thread;
  int init_thread_started;
};

/* Whether comm is a live handle (created and not destroyed). */
int fc_comm_is_live(flexcoll_comm_t comm);
/* Check that comm is a live, initialised communicator; records the error otherwise. */
flexcoll_result_t fc_comm_check(flexcoll_comm_t comm, const char *fn);
/* The same for a communicator the calling thread holds (fc_comm_enter, a group's end): live by
 * that (destroy refuses a held one), so only its state is checked, without the registry's lock
 * and search (a small collective made three of them). */
flexcoll_result_t fc_comm_check_held(flexcoll_comm_t comm, const char *fn);
/* Mark comm as driven by the calling thread for the public call fn (a group's end counts as one
 * call for all its communicators): FLEXCOLL_INVALID_USAGE, naming the call in progress, when
 * another thread is inside a call on comm; also refuses NULL and dead handles as fc_comm_check
 * does.  Every success is paired with fc_comm_leave, the caller's last access to comm. */
flexcoll_result_t fc_comm_enter(flexcoll_comm_t comm, const char *fn);
void fc_comm_leave(flexcoll_comm_t comm);
/* Fail a communicator whose queued initialisation will not run (state FAILED, async error res,
 * the thread's last error kept on it), so that it does not stay pending for ever. */
void fc_comm_fail_init(flexcoll_comm_t comm, flexcoll_result_t res);
/* Run the initialisation of a communicator allocated (state PENDING) by fc_comm_alloc. */
flexcoll_result_t fc_comm_init(flexcoll_comm_t comm);
/* The same in a thread of its own (non-blocking mode): FLEXCOLL_IN_PROGRESS once it started
 * (flexcoll_comm_get_async_error says when it is done), else the error of starting it. */
flexcoll_result_t fc_comm_init_in_background(flexcoll_comm_t comm);
flexcoll_result_t fc_comm_alloc(flexcoll_comm_t *out, int nranks, int rank, const flexcoll_unique_id_t *id,
                                const flexcoll_config_t *config);
/* flexcoll_comm_init_rank, plus root (may be NULL): a root listener this rank started, which the
 * communicator stops when its initialisation ends, so that a failed one leaves no listener behind. */
flexcoll_result_t fc_comm_init_rank(flexcoll_comm_t *comm, int nranks, flexcoll_unique_id_t id, int rank,
                                    const flexcoll_config_t *config, struct fc_bootstrap_root *root);
/* Validate a user's config (NULL is fine); fn names the caller in the message. */
flexcoll_result_t fc_check_config(const flexcoll_config_t *config, const char *fn);
/* The first error recorded asynchronously wins; returns the stored one. */
flexcoll_result_t fc_comm_set_async_error(flexcoll_comm_t comm, flexcoll_result_t err);

#endif
