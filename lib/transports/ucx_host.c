/* ucx_host.c — the host links over UCX tagged messages: `shm` (UCX shared memory) and `tcp`.
 * One UCP context and worker per link and communicator, restricted to the link's transports:
 * communicators and links never share progress or tags, and ranks that are threads of one
 * process use the same code as processes. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include "bootstrap.h"
#include "clock.h"
#include "comm.h"
#include "error.h"
#include "gpu/gpu.h"
#include "param.h"
#include "progress_thread.h"
#include "topo.h"
#include "transports.h"

FC_PARAM_INT(ucx_peer_failure, "UCX_PEER_FAILURE", 1)

int fc_ucx_peer_failure(void) { return fc_param_ucx_peer_failure() != 0; }

FC_PARAM_INT(tcp_progress_thread, "TCP_PROGRESS_THREAD", 1)
FC_PARAM_INT(ucx_cuda, "UCX_CUDA", 1)

/* The tcp link's progress thread (FLEXCOLL_TCP_PROGRESS_THREAD, progress_thread.h): UCX completes
 * a short send once the message is in its own buffer and keeps there what the socket did not
 * take; only this rank's progress moves it on, so a peer waiting for it would wait for this
 * rank's next call (measured: a receiver waited the whole time its sender spent away).  While
 * the thread runs, every entry point holds lock (the worker is single-threaded).  Shared memory
 * needs none: a send there is complete once it is in the peer's FIFO. */
typedef struct {
  ucp_context_h context;
  ucp_worker_h worker;
  ucp_ep_h *eps;
  int nranks;
  pthread_mutex_t lock;
  fc_progress_thread_t progress;
  int cuda;        /* the context supports CUDA memory (UCX's CUDA transports joined its list) */
  int want_thread; /* tcp with FLEXCOLL_TCP_PROGRESS_THREAD: started by the first send or receive */
  int efd;         /* the worker's wakeup descriptor (tcp), -1 without one: the thread never parks */
} fc_ucx_t;

/* The lock, where the progress thread runs (it starts in a call, before that call's first use
 * of the worker, and stops in close, so the answer never changes under a use). */
static void ucx_lock(fc_ucx_t *u) {
  if (!u->progress.on) return;
  fc_progress_thread_used(&u->progress);
  pthread_mutex_lock(&u->lock);
}
static void ucx_unlock(fc_ucx_t *u) {
  if (u->progress.on) pthread_mutex_unlock(&u->lock);
}

static int progress_worker(void *arg) { return (int)ucp_worker_progress(((fc_ucx_t *)arg)->worker); }

/* An idle thread parks on the worker's descriptor: UCX signals it once armed (a message came, a
 * socket that held our bytes back takes them). */
static int arm_worker(void *arg) {
  fc_ucx_t *u = arg;
  return ucp_worker_arm(u->worker) == UCS_OK ? u->efd : -1;
}

/* The thread, once the link carries something: a link that never does costs no thread.  The
 * calibration at creation sends over every link, so that holds only where the models come from
 * the cache (tcp beside shared memory within one host, which the balancer leaves idle). */
static void start_thread_once(const struct flexcoll_comm *comm, fc_ucx_t *u) {
  if (u->progress.on || !u->want_thread) return;
  u->want_thread = 0;
  const int e = fc_progress_thread_start(&u->progress, "flexcoll-tcp", &u->lock, progress_worker,
                                         u->efd >= 0 ? arm_worker : NULL, u);
  if (e) FC_INFO(FC_SUB_NET, "rank %d: tcp progress thread not started (%s): progress in calls only", comm->rank, strerror(e));
}

/* Each link's UCX transports: they replace UCX_TLS for the link's context (FLEXCOLL_LINKS chooses
 * links).  On a communicator with a GPU, where this UCX has its CUDA modules, the CUDA transports
 * join them: cuda_copy (device memory to and from host memory, on copy engines: UCX pipelines a
 * device buffer through host staging over any transport) and, within a host, cuda_ipc (copies
 * between two GPUs' memory over NVLink or PCIe through CUDA IPC), so that the link takes device
 * buffers as they are. */
typedef struct {
  const char *name;
  const char *tls;
  int ipc; /* cuda_ipc too (shared memory: the ranks of one host) */
} ucx_link_kind_t;
static const ucx_link_kind_t kind_shm = {"shm", "sm,self", 1}, kind_tcp = {"tcp", "tcp,self", 0};

/* Which CUDA components this UCX has (asked of UCT, once: naming an absent transport in UCX_TLS
 * makes UCX print a warning, and Debian's UCX has none). */
static int ucx_cuda_copy, ucx_cuda_ipc;
static pthread_once_t ucx_cuda_once = PTHREAD_ONCE_INIT;
static void find_ucx_cuda(void) {
  uct_component_h *components = NULL;
  unsigned n = 0;
  if (uct_query_components(&components, &n) != UCS_OK) return;
  for (unsigned i = 0; i < n; i++) {
    uct_component_attr_t attr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
    if (uct_component_query(components[i], &attr) != UCS_OK) continue;
    if (!strcmp(attr.name, "cuda_cpy") || !strcmp(attr.name, "cuda_copy")) ucx_cuda_copy = 1;
    if (!strcmp(attr.name, "cuda_ipc")) ucx_cuda_ipc = 1;
  }
  uct_release_component_list(components);
}

/* The CUDA transports the link's context adds to kind->tls ("" for none): on a communicator with
 * a GPU (comm.c resolves the device before the links open), those this UCX has. */
static const char *cuda_tls(const struct flexcoll_comm *comm, const ucx_link_kind_t *kind) {
  if (!fc_param_ucx_cuda() || !fc_gpu_comm_wants_device(comm)) return "";
  pthread_once(&ucx_cuda_once, find_ucx_cuda);
  if (!ucx_cuda_copy) return "";
  return kind->ipc && ucx_cuda_ipc ? ",cuda_copy,cuda_ipc" : ",cuda_copy";
}

/* An endpoint broke.  A peer that finished its part and destroyed its communicator looks the
 * same as one that died, so this is no error by itself: a transfer that still needed the peer
 * fails on its own, and a wait for it is bounded by the timeout and the bootstrap ring's watch. */
static void ep_closed_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
  (void)ep;
  struct flexcoll_comm *comm = arg;
  FC_INFO(FC_SUB_NET, "rank %d: a UCX endpoint closed: %s", comm->rank, ucs_status_string(status));
}

static flexcoll_result_t ucx_fail(struct flexcoll_comm *comm, const char *what, ucs_status_t st) {
  return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "UCX %s failed: %s", what, ucs_status_string(st));
}

/* Shared memory with peer-failure handling.  UCX's shared-memory FIFO transports (sysv, posix)
 * offer peer-failure handling only when asked, UCX_MM_ERROR_HANDLING=y (off by default, in 1.13
 * and 1.22 alike): their endpoints then check that the peer process still lives (UCP keepalive,
 * every UCX_KEEPALIVE_INTERVAL) and a dead peer's transfers fail with ENDPOINT_TIMEOUT.  UCP then
 * leaves out cross-memory attach (cma, no peer-failure handling), whose reads from a dead process
 * abort the survivor, so large messages go through the FIFO too (copy in, copy out).  Measured
 * (docs/PERFORMANCE.md): 1.13.1 and 1.22.0 both connect ranks of one host so, and survivors of a
 * rank killed mid-transfer return REMOTE_ERROR or TIMEOUT.  Returns 0 and says why when this UCX
 * cannot be trusted with it. */
static int shm_peer_failure_ok(char *why, size_t len) {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  if (major < 1 || (major == 1 && minor < 13)) {
    snprintf(why, len,
             "UCX %u.%u shared memory cannot report a dead peer (1.13 or later can; FLEXCOLL_UCX_PEER_FAILURE=0 enables "
             "shm without that safety)",
             major, minor);
    return 0;
  }
  const char *user = getenv("UCX_MM_ERROR_HANDLING");
  if (user && (user[0] == 'n' || user[0] == 'N' || user[0] == '0')) {
    snprintf(why, len,
             "UCX_MM_ERROR_HANDLING=%s: UCX shared memory cannot report a dead peer (FLEXCOLL_UCX_PEER_FAILURE=0 "
             "enables shm without that safety)",
             user);
    return 0;
  }
  return 1;
}

/* The keepalive round in peer-failure mode: often enough that a dead peer fails its transfers
 * well within FLEXCOLL_TIMEOUT_MS (UCX's default, 20 s, would leave that to the timeout). */
static void keepalive_interval(const struct flexcoll_comm *comm, char *buf, size_t len) {
  int ms = comm->timeout_ms > 0 && comm->timeout_ms / 4 < 1000 ? comm->timeout_ms / 4 : 1000;
  snprintf(buf, len, "%dms", ms < 50 ? 50 : ms);
}

static flexcoll_result_t create_worker(struct flexcoll_comm *comm, fc_ucx_t *u, const ucx_link_kind_t *kind) {
  ucp_config_t *config;
  ucs_status_t st = ucp_config_read(NULL, NULL, &config);
  if (st != UCS_OK) return ucx_fail(comm, "ucp_config_read", st);
  char ka[32], tls[64];
  keepalive_interval(comm, ka, sizeof ka);
  const char *cuda = cuda_tls(comm, kind);
  snprintf(tls, sizeof tls, "%s%s", kind->tls, cuda);
  int safe = fc_param_ucx_peer_failure() != 0;
  /* Each setting applies only where the user left the UCX variable unset. */
  const struct {
    const char *name, *value;
    int when;
  } settings[] = {
      {"TLS", tls, 1},
      /* With peer-failure handling (see connect_peers), UCX 1.13's TCP transport may complete a
       * zero-copy send twice when its peer dies during it, and the survivor aborts on an assertion
       * (`uct_iface.h:884 comp->count > 0` in uct_tcp_iface_progress): tests/test_failure's rank
       * killed mid-transfer, 4 in 57 runs.  Without zero-copy sends: 0 in 75, at about half the
       * host bandwidth from 1 MB (docs/PERFORMANCE.md). */
      {"ZCOPY_THRESH", "inf", safe},
      {"MM_ERROR_HANDLING", "y", safe && kind == &kind_shm},
      {"KEEPALIVE_INTERVAL", ka, safe},
  };
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
    char env[64];
    snprintf(env, sizeof env, "UCX_%s", settings[i].name);
    if (!settings[i].when || (i > 0 && getenv(env))) continue;
    st = ucp_config_modify(config, settings[i].name, settings[i].value);
    if (st != UCS_OK) {
      ucp_config_release(config);
      char what[64];
      snprintf(what, sizeof what, "ucp_config_modify(%s)", settings[i].name);
      return ucx_fail(comm, what, st);
    }
  }
  ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                         .features = UCP_FEATURE_TAG | (kind == &kind_tcp ? UCP_FEATURE_WAKEUP : 0),
                         .mt_workers_shared = 0};
  st = ucp_init(&params, config, &u->context);
  ucp_config_release(config);
  if (st != UCS_OK) return ucx_fail(comm, "ucp_init", st);
  ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
  u->cuda = *cuda && ucp_context_query(u->context, &attr) == UCS_OK &&
            (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
  /* SERIALIZED: the thread that initialises and the threads that later drive the communicator
   * (group_end runs each communicator in its own thread) may differ, never concurrently.
   * IGNORE_REQUEST_LEAK: a send that a failed collective left behind can be neither cancelled
   * (UCX cancels receives only) nor completed by closing its endpoint where the endpoint has no
   * peer-failure handling (toward a thread of this process: a forced close is refused there), so
   * it is still out when the worker goes.  UCX's leak check then describes each such request,
   * reading its endpoint, which the worker destroyed just before: a crash in
   * ucp_worker_destroy (test_onegpu env l, the hang case after an abort).  The requests' memory
   * goes with the worker's pool either way. */
  ucp_worker_params_t wparams = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_FLAGS,
                                 .thread_mode = UCS_THREAD_MODE_SERIALIZED,
                                 .flags = UCP_WORKER_FLAG_IGNORE_REQUEST_LEAK};
  st = ucp_worker_create(u->context, &wparams, &u->worker);
  if (st != UCS_OK) return ucx_fail(comm, "ucp_worker_create", st);
  /* Without a descriptor the tcp thread keeps its millisecond naps: correct, only busier. */
  if (kind == &kind_tcp && ucp_worker_get_efd(u->worker, &u->efd) != UCS_OK) u->efd = -1;
  return FLEXCOLL_SUCCESS;
}

/* Worker addresses differ in length: all-gather the lengths, then the padded addresses.  A rank
 * without a worker (the link does not exist there) sends length 0, and *missing tells every rank
 * the lowest such rank (-1: none). */
static flexcoll_result_t exchange_addresses(struct flexcoll_comm *comm, fc_ucx_t *u, char **all, size_t *stride,
                                            int *missing) {
  ucp_address_t *addr = NULL;
  size_t len = 0;
  if (u->worker) {
    ucs_status_t st = ucp_worker_get_address(u->worker, &addr, &len);
    if (st != UCS_OK) return ucx_fail(comm, "ucp_worker_get_address", st);
  }
  uint64_t *lens = calloc((size_t)comm->nranks, sizeof *lens);
  flexcoll_result_t res = FLEXCOLL_SYSTEM_ERROR;
  if (!lens) goto out;
  lens[comm->rank] = len;
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, lens, sizeof *lens), res, out);
  size_t max = 0;
  *missing = -1;
  for (int r = comm->nranks - 1; r >= 0; r--) {
    max = lens[r] > max ? lens[r] : max;
    if (lens[r] == 0) *missing = r;
  }
  if (*missing >= 0) { res = FLEXCOLL_SUCCESS; goto out; }
  *stride = max;
  *all = calloc((size_t)comm->nranks, max);
  if (!*all) { res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory for UCX addresses"); goto out; }
  memcpy(*all + (size_t)comm->rank * max, addr, len);
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, *all, max), res, out);
out:
  free(lens);
  if (addr) ucp_worker_release_address(u->worker, addr);
  return res;
}

/* Which ranks are threads of this process (1 for itself): all-gathered (host, pid), collective. */
static flexcoll_result_t find_own_process(struct flexcoll_comm *comm, unsigned char *own) {
  typedef struct {
    uint64_t host;
    int64_t pid;
  } proc_id_t;
  proc_id_t *all = calloc((size_t)comm->nranks, sizeof *all);
  if (!all) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  all[comm->rank] = (proc_id_t){fc_topo_host_hash(), (int64_t)getpid()};
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, all, sizeof *all);
  for (int r = 0; r < comm->nranks && res == FLEXCOLL_SUCCESS; r++)
    own[r] = all[r].host == all[comm->rank].host && all[r].pid == all[comm->rank].pid;
  free(all);
  return res;
}

/* Whether some peer this rank reaches over the link is another process. */
static int other_process(const struct flexcoll_comm *comm, const unsigned char *reach, const unsigned char *own) {
  for (int r = 0; r < comm->nranks; r++)
    if (r != comm->rank && reach[r] && !own[r]) return 1;
  return 0;
}

/* Endpoints to every peer; *usable = 0 (why filled) when UCX finds no transport of this link to
 * some peer, e.g. shared memory with peer-failure handling where UCX_MM_ERROR_HANDLING=n.
 * own[r]: rank r is a thread of this process. */
static flexcoll_result_t connect_peers(struct flexcoll_comm *comm, fc_ucx_t *u, const unsigned char *reach,
                                       const unsigned char *own, const char *addrs, size_t stride, int *usable,
                                       char *why, size_t len) {
  /* With peer-failure handling, a peer that dies makes transfers fail instead of aborting this
   * process (UCX's cross-memory attach, CMA, treats a vanished peer as fatal otherwise); UCX then
   * keeps to transports that can report it: TCP, and shared memory's FIFOs when create_worker
   * asked for their error handling.  FLEXCOLL_UCX_PEER_FAILURE=0 trades that safety for CMA's
   * zero-copy speed on large messages. */
  int safe = fc_param_ucx_peer_failure() != 0;
  for (int r = 0; r < comm->nranks; r++) {
    /* Peers on other hosts, for shared memory: no endpoint (UCX would find no transport). */
    if (!reach[r]) continue;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                          .address = (const ucp_address_t *)(addrs + (size_t)r * stride)};
    /* Not toward a thread of this process: it cannot die alone, and with the mode UCX moves
     * device memory between two threads by eager fragments, each its own blocking copy (UCX
     * 1.22: tens of times slower than its rendezvous pipeline, docs/PERFORMANCE.md). */
    if (safe && !own[r]) {
      ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler = (ucp_err_handler_t){.cb = ep_closed_cb, .arg = comm};
    }
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &u->eps[r]);
    if (st == UCS_ERR_UNREACHABLE) {
      u->eps[r] = NULL;
      *usable = 0;
      snprintf(why, len, "UCX reaches rank %d through none of its transports%s", r,
               safe ? " that can report a dead peer (FLEXCOLL_UCX_PEER_FAILURE=0 lifts that)" : "");
      return FLEXCOLL_SUCCESS;
    }
    if (st != UCS_OK) return ucx_fail(comm, "ucp_ep_create", st);
  }
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t post_result(struct flexcoll_comm *comm, ucs_status_ptr_t p, fc_link_req_t *req,
                                     const char *what) {
  if (p == NULL) { *req = NULL; return FLEXCOLL_SUCCESS; }
  if (UCS_PTR_IS_ERR(p)) {
    ucs_status_t st = UCS_PTR_STATUS(p);
    if (st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT || st == UCS_ERR_UNREACHABLE)
      return fc_error(comm, FLEXCOLL_REMOTE_ERROR, "UCX %s: peer unreachable (%s)", what, ucs_status_string(st));
    return ucx_fail(comm, what, st);
  }
  *req = p;
  return FLEXCOLL_SUCCESS;
}

/* Tag of the wire-up exchange: the highest point-to-point number and slice, which no collective,
 * point-to-point or calibration message uses (make_tag in lib/host/exec.c, ring_exchange in
 * lib/sched/links.c); its messages are all matched before open returns anyway. */
static uint64_t wireup_tag(int sender) {
  return ((uint64_t)(uint16_t)sender << 48) | (1ull << 47) | (0x7fffffffull << 16) | 0xffffull;
}

/* Why a wait of finish_wireup must stop: abort, a ring neighbour gone (its process died or gave
 * up), or timeout_ms without a completion. */
static flexcoll_result_t wireup_stuck(struct flexcoll_comm *comm, const char *name, double last, double *next_check) {
  if (atomic_load(&comm->abort_flag))
    return fc_error(comm, FLEXCOLL_REMOTE_ERROR, "link %s: UCX wire-up interrupted: communicator aborted", name);
  double t = fc_now_ms();
  if (t >= *next_check) {
    *next_check = t + 50;
    if (comm->bootstrap && fc_bootstrap_peer_lost(comm->bootstrap))
      return fc_error(comm, FLEXCOLL_REMOTE_ERROR, "link %s: a neighbouring rank exited during UCX wire-up", name);
  }
  if (comm->timeout_ms > 0 && t - last > comm->timeout_ms)
    return fc_error(comm, FLEXCOLL_TIMEOUT, "link %s: UCX wire-up with the peers did not finish within %d ms", name,
                    comm->timeout_ms);
  return FLEXCOLL_SUCCESS;
}

/* A request of finish_wireup: 1 once done (released, *req = NULL); an error when it failed. */
static flexcoll_result_t wireup_done(struct flexcoll_comm *comm, const char *name, void **req, int *done) {
  *done = 1;
  if (*req == NULL) return FLEXCOLL_SUCCESS;
  ucs_status_t st = ucp_request_check_status(*req);
  if (st == UCS_INPROGRESS) { *done = 0; return FLEXCOLL_SUCCESS; }
  ucp_request_free(*req);
  *req = NULL;
  if (st == UCS_OK) return FLEXCOLL_SUCCESS;
  return fc_error(comm, FLEXCOLL_REMOTE_ERROR, "link %s: UCX wire-up failed: %s", name, ucs_status_string(st));
}

/* Finish every endpoint's UCX wire-up now, while every rank is in open and progresses its worker.
 * UCX connects an endpoint lazily, by messages that need both workers' progress; left to later,
 * a link that carries nothing for a while (the collectives' waits progress only the links they
 * wait on, and idle ones rarely: exec.c) finishes it only in destroy's flush, which then waits
 * for a peer that nobody progresses (test_api destroy_sequential).  A worker flush completes once
 * this rank's endpoints are connected; its peers' may still need this worker, so each rank then
 * tells every peer the link reaches that it is done and keeps progressing until every peer has said so.  Collective,
 * on every rank of a link usable everywhere; bounded like every other wait. */
static flexcoll_result_t finish_wireup(struct flexcoll_comm *comm, fc_ucx_t *u, const unsigned char *reach,
                                       const char *name) {
  const int n = comm->nranks, me = comm->rank;
  if (n < 2) return FLEXCOLL_SUCCESS;
  /* Static: a send still pending when an error returns may read it later. */
  static const unsigned char hello = 1;
  void **reqs = calloc(2 * (size_t)n, sizeof *reqs); /* receives [0, n), sends [n, 2n) */
  unsigned char *in = calloc((size_t)n, 1);
  void *flush = NULL;
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (!reqs || !in) { res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory"); goto out; }
  /* Receives first: a peer done before this rank's flush finds them posted. */
  ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = ucp_dt_make_contig(1)};
  for (int r = 0; r < n && res == FLEXCOLL_SUCCESS; r++)
    if (r != me && reach[r])
      res = post_result(comm, ucp_tag_recv_nbx(u->worker, &in[r], 1, wireup_tag(r), UINT64_MAX, &rp), &reqs[r],
                        "wire-up recv");
  if (res != FLEXCOLL_SUCCESS) goto out;
  ucp_request_param_t fp = {.op_attr_mask = 0};
  flush = ucp_worker_flush_nbx(u->worker, &fp);
  if (UCS_PTR_IS_ERR(flush)) {
    res = ucx_fail(comm, "ucp_worker_flush_nbx", UCS_PTR_STATUS(flush));
    flush = NULL;
    goto out;
  }
  double last = fc_now_ms(), next_check = last + 50;
  unsigned spins = 0;
  for (int done = 0; !done;) {
    /* Ranks may outnumber cores (threads of one process): let the peers we wait for run. */
    if (!ucp_worker_progress(u->worker) && ++spins > 64) sched_yield();
    FC_CHECK_GOTO(wireup_done(comm, name, &flush, &done), res, out);
    if (!done) FC_CHECK_GOTO(wireup_stuck(comm, name, last, &next_check), res, out);
  }
  ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = ucp_dt_make_contig(1)};
  for (int r = 0; r < n && res == FLEXCOLL_SUCCESS; r++)
    if (r != me && reach[r])
      res = post_result(comm, ucp_tag_send_nbx(u->eps[r], &hello, 1, wireup_tag(me), &sp), &reqs[n + r],
                        "wire-up send");
  if (res != FLEXCOLL_SUCCESS) goto out;
  last = fc_now_ms();
  for (int left = 1; left;) {
    if (!ucp_worker_progress(u->worker) && ++spins > 64) sched_yield();
    left = 0;
    for (int i = 0; i < 2 * n; i++) {
      if (!reqs[i]) continue;
      int done;
      FC_CHECK_GOTO(wireup_done(comm, name, &reqs[i], &done), res, out);
      if (done) last = fc_now_ms();
      else left = 1;
    }
    if (left) FC_CHECK_GOTO(wireup_stuck(comm, name, last, &next_check), res, out);
  }
out:
  if (flush) ucp_request_free(flush);
  for (int i = 0; reqs && i < 2 * n; i++)
    if (reqs[i]) {
      /* Receives leave the matching queue now (their buffer is freed below); sends complete or
       * fail when close destroys the endpoints. */
      if (i < n && ucp_request_check_status(reqs[i]) == UCS_INPROGRESS) ucp_request_cancel(u->worker, reqs[i]);
      ucp_request_free(reqs[i]);
    }
  free(reqs);
  free(in);
  return res;
}

/* Collective even where this rank has no worker: the address exchange and the agreement are the
 * other ranks' too. */
static flexcoll_result_t ucx_open(struct flexcoll_comm *comm, fc_link_t *link, const ucx_link_kind_t *kind, int *usable,
                                  char *why, size_t len) {
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_UCX_CUDA"));
  if (kind == &kind_tcp) FC_CHECK(fc_param_check(comm, "FLEXCOLL_TCP_PROGRESS_THREAD"));
  fc_ucx_t *u = calloc(1, sizeof *u);
  if (!u) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  u->efd = -1;
  if (pthread_mutex_init(&u->lock, NULL) != 0) {
    free(u);
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "pthread_mutex_init failed");
  }
  link->state = u;
  u->nranks = comm->nranks;
  u->eps = calloc((size_t)comm->nranks, sizeof *u->eps);
  if (!u->eps) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  /* Without a worker this rank still takes part in the exchange (address length 0). */
  *usable = 0;
  if (kind == &kind_shm && fc_param_ucx_peer_failure() != 0 && !shm_peer_failure_ok(why, len)) {
    /* left out: why says so */
  } else if (create_worker(comm, u, kind) != FLEXCOLL_SUCCESS)
    snprintf(why, len, "%s", fc_thread_last_error());
  else
    *usable = 1;
  char *addrs = NULL;
  size_t stride = 0;
  int missing = -1;
  unsigned char *own = calloc((size_t)comm->nranks, 1);
  if (!own) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  flexcoll_result_t res = exchange_addresses(comm, u, &addrs, &stride, &missing);
  if (res == FLEXCOLL_SUCCESS) res = find_own_process(comm, own);
  if (res == FLEXCOLL_SUCCESS && missing >= 0 && *usable) {
    *usable = 0;
    snprintf(why, len, "not available on rank %d", missing);
  }
  if (res == FLEXCOLL_SUCCESS && *usable)
    res = connect_peers(comm, u, link->reach, own, addrs, stride, usable, why, len);
  /* Device buffers over tcp toward another process: with peer-failure handling on the endpoint,
   * UCX (1.22) sends them as eager fragments, each a blocking copy out of device memory, and
   * neither its rendezvous nor its zero-copy thresholds change that; measured tens of times
   * slower than flexcoll's own host copies (docs/PERFORMANCE.md, session 24).  The link then
   * takes host memory only; shm (cuda_ipc) and threads of one process are not slowed so. */
  const int slow_device = kind == &kind_tcp && fc_param_ucx_peer_failure() != 0 && other_process(comm, link->reach, own);
  free(addrs);
  free(own);
  /* Every rank's endpoints exist before any wires them up; where some rank has none, the link
   * is closed everywhere (by the caller) without wire-up. */
  int first_not = -1;
  if (res == FLEXCOLL_SUCCESS) res = fc_bootstrap_agree(comm->bootstrap, *usable, &first_not);
  if (res == FLEXCOLL_SUCCESS && first_not < 0) res = finish_wireup(comm, u, link->reach, kind->name);
  /* Device buffers only where every rank's context takes them: every rank must stage alike. */
  if (res == FLEXCOLL_SUCCESS && first_not < 0) {
    int first_host_only = -1;
    res = fc_bootstrap_agree(comm->bootstrap, u->cuda, &first_host_only);
    int first_slow = -1;
    if (res == FLEXCOLL_SUCCESS && first_host_only < 0)
      res = fc_bootstrap_agree(comm->bootstrap, !slow_device, &first_slow);
    link->device_memory = res == FLEXCOLL_SUCCESS && first_host_only < 0 && first_slow < 0;
    if (*cuda_tls(comm, kind))
      FC_INFO(FC_SUB_NET, "rank %d: link %s %s", comm->rank, kind->name,
              link->device_memory ? "takes device buffers (UCX CUDA transports)"
              : first_host_only >= 0
                  ? "takes host memory only (UCX's CUDA transports are missing on some rank)"
                  : "takes host memory only (between processes with peer-failure handling UCX moves device memory "
                    "by eager fragments; FLEXCOLL_UCX_PEER_FAILURE=0 lifts that)");
  }
  u->want_thread = kind == &kind_tcp && fc_param_tcp_progress_thread() != 0;
  return res;
}

/* Destroy is local (like NCCL's): peers may be destroyed later by the same thread, so nothing
 * here may wait for a peer to make progress.  Flushing the worker only needs our own transports
 * to hand over what they still hold; endpoints are then closed without a handshake. */
static void flush_worker(fc_ucx_t *u, int timeout_ms) {
  ucp_request_param_t p = {.op_attr_mask = 0};
  void *req = ucp_worker_flush_nbx(u->worker, &p);
  if (!UCS_PTR_IS_PTR(req)) return;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  while (ucp_request_check_status(req) == UCS_INPROGRESS) {
    ucp_worker_progress(u->worker);
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 > timeout_ms) {
      /* Not the normal case (open finished the wire-up, nothing is in flight): say so. */
      FC_INFO(FC_SUB_NET, "UCX worker flush at close did not finish within %d ms", timeout_ms);
      break;
    }
  }
  ucp_request_free(req);
}

/* Endpoints without peer-failure handling (toward threads of this process) refuse a forced
 * close (UCS_ERR_INVALID_PARAM); ucp_worker_destroy purges and disconnects those itself. */
static void close_endpoints(fc_ucx_t *u) {
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
  for (int r = 0; r < u->nranks; r++) {
    if (!u->eps[r]) continue;
    void *req = ucp_ep_close_nbx(u->eps[r], &p);
    if (UCS_PTR_IS_PTR(req)) {
      /* A forced close completes locally; bound it anyway: destroy never waits on anyone. */
      struct timespec start, now;
      clock_gettime(CLOCK_MONOTONIC, &start);
      do {
        ucp_worker_progress(u->worker);
        clock_gettime(CLOCK_MONOTONIC, &now);
      } while (ucp_request_check_status(req) == UCS_INPROGRESS &&
               (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < 1000);
      ucp_request_free(req);
    }
    u->eps[r] = NULL;
  }
}

static void ucx_free(fc_ucx_t *u) {
  pthread_mutex_destroy(&u->lock);
  free(u->eps);
  if (u->worker) ucp_worker_destroy(u->worker);
  if (u->context) ucp_cleanup(u->context);
  free(u);
}

static void ucx_close(struct flexcoll_comm *comm, fc_link_t *link, int force) {
  fc_ucx_t *u = link->state;
  if (!u) return;
  fc_progress_thread_stop(&u->progress); /* the flush below progresses the worker itself */
  if (u->eps && u->worker) {
    /* At most 5 s, less with a shorter timeout (<= 0: none, so 5 s). */
    if (!force) flush_worker(u, comm->timeout_ms > 0 && comm->timeout_ms < 5000 ? comm->timeout_ms : 5000);
    close_endpoints(u);
  }
  ucx_free(u);
  link->state = NULL;
}

static flexcoll_result_t ucx_isend(struct flexcoll_comm *comm, fc_link_t *link, int peer, const void *buf, size_t bytes,
                                   uint64_t tag, fc_link_req_t *req) {
  fc_ucx_t *u = link->state;
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE, .datatype = ucp_dt_make_contig(1)};
  start_thread_once(comm, u);
  ucx_lock(u);
  flexcoll_result_t res = post_result(comm, ucp_tag_send_nbx(u->eps[peer], buf, bytes, tag, &p), req, "send");
  ucx_unlock(u);
  return res;
}

static flexcoll_result_t ucx_irecv(struct flexcoll_comm *comm, fc_link_t *link, int peer, void *buf, size_t bytes,
                                   uint64_t tag, fc_link_req_t *req) {
  (void)peer; /* the tag names the sender */
  fc_ucx_t *u = link->state;
  /* Always a request, so that fc_ucx_test_recv can check the length that arrived. */
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                           .datatype = ucp_dt_make_contig(1)};
  start_thread_once(comm, u);
  ucx_lock(u);
  flexcoll_result_t res = post_result(comm, ucp_tag_recv_nbx(u->worker, buf, bytes, tag, UINT64_MAX, &p), req, "recv");
  ucx_unlock(u);
  return res;
}

static int ucx_progress(fc_link_t *link) {
  fc_ucx_t *u = link->state;
  ucx_lock(u);
  const int moved = progress_worker(u);
  ucx_unlock(u);
  return moved;
}

static flexcoll_result_t test_done(struct flexcoll_comm *comm, fc_link_req_t *req, int *done) {
  *done = 1;
  if (*req == NULL) return FLEXCOLL_SUCCESS;
  ucs_status_t st = ucp_request_check_status(*req);
  if (st == UCS_INPROGRESS) { *done = 0; return FLEXCOLL_SUCCESS; }
  ucp_request_free(*req);
  *req = NULL;
  if (st == UCS_OK) return FLEXCOLL_SUCCESS;
  if (st == UCS_ERR_MESSAGE_TRUNCATED)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "a peer sent more data than this rank expects: the ranks called different collectives or counts");
  if (st == UCS_ERR_CANCELED) return fc_error(comm, FLEXCOLL_REMOTE_ERROR, "transfer cancelled (communicator aborted)");
  return fc_error(comm, FLEXCOLL_REMOTE_ERROR, "transfer failed: %s", ucs_status_string(st));
}

static flexcoll_result_t test_locked(struct flexcoll_comm *comm, fc_link_req_t *req, size_t expect, int *done) {
  *done = 1;
  if (*req == NULL) return FLEXCOLL_SUCCESS;
  if (expect == SIZE_MAX) return test_done(comm, req, done);
  ucp_tag_recv_info_t info;
  ucs_status_t st = ucp_tag_recv_request_test(*req, &info);
  if (st == UCS_INPROGRESS) { *done = 0; return FLEXCOLL_SUCCESS; }
  if (st == UCS_OK && info.length != expect) {
    ucp_request_free(*req);
    *req = NULL;
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "a peer sent %zu bytes where this rank expects %zu: the ranks called different collectives or counts",
                    info.length, expect);
  }
  return test_done(comm, req, done);
}

static flexcoll_result_t ucx_test(struct flexcoll_comm *comm, fc_link_t *link, fc_link_req_t *req, size_t expect,
                                  int *done) {
  fc_ucx_t *u = link->state;
  ucx_lock(u);
  flexcoll_result_t res = test_locked(comm, req, expect, done);
  ucx_unlock(u);
  return res;
}

static void ucx_cancel(fc_link_t *link, fc_link_req_t *req) {
  if (*req == NULL) return;
  fc_ucx_t *u = link->state;
  ucx_lock(u);
  if (ucp_request_check_status(*req) == UCS_INPROGRESS) ucp_request_cancel(u->worker, *req);
  ucp_request_free(*req);
  ucx_unlock(u);
  *req = NULL;
}

static flexcoll_result_t shm_open(struct flexcoll_comm *comm, fc_link_t *link, int *usable, char *why, size_t len) {
  return ucx_open(comm, link, &kind_shm, usable, why, len);
}
static flexcoll_result_t tcp_open(struct flexcoll_comm *comm, fc_link_t *link, int *usable, char *why, size_t len) {
  return ucx_open(comm, link, &kind_tcp, usable, why, len);
}

/* Idle progress may be rare: open finishes the wire-up (finish_wireup), and UCX's own traffic
 * after it (keepalives) waits in the transport until the next progress. */
/* Shared memory joins the ranks of one host (host name: lib/sched/links.c), TCP any two.  Device
 * buffers where UCX has its CUDA transports (ucx_link_kind_t); Debian's UCX has none, and device
 * buffers are then staged by the caller. */
const fc_link_ops_t fc_link_shm = {"shm", shm_open, ucx_close, ucx_isend, ucx_irecv, ucx_progress, ucx_test, ucx_cancel, 1, 1, NULL, 0, NULL, NULL};
const fc_link_ops_t fc_link_tcp = {"tcp", tcp_open, ucx_close, ucx_isend, ucx_irecv, ucx_progress, ucx_test, ucx_cancel, 1, 0, NULL, 0, NULL, NULL};
