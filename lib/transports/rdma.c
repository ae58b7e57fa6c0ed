/* rdma.c — the `rdma` link: tagged messages over RC queue pairs of libibverbs, host memory.
 *
 * libibverbs is reached only through the table of verbs.h (dlopen), so a machine without it (or
 * without a device: ibv_get_device_list gives nothing) simply has no rdma link, said in one INFO
 * line.  One RC queue pair per peer, one completion queue per link and communicator.
 *
 * Data path (eager, through bounce slots).  Every rank keeps, for each peer, a receive ring of
 * `nslots` slots registered for remote writes, and a send area of as many slots of its own.  A
 * message is cut into fragments of one slot each (a header: tag, total length, offset, length;
 * then the bytes); the sender copies a fragment into its send slot k and writes it with RDMA WRITE
 * WITH IMMEDIATE into the peer's ring slot k (imm: the slot).  The receiver, polling its CQ, copies
 * the fragment out (into the matching receive, else into the unexpected-message queue) and so
 * frees the slot; every quarter of the ring it returns a credit (a zero-length write with an
 * immediate that carries the count of slots freed).  Slots are used round the ring in order, and
 * an RC queue pair delivers in order, so a count is all a credit needs to say.  A sender sends one
 * message's fragments after another's, per peer, so fragments of a message arrive together.
 *
 * Zero copy (rendezvous), for sends of FLEXCOLL_RDMA_ZCOPY_BYTES or more (0: never).  The sender
 * puts an RTS (tag, length, an id) in the stream instead of the first fragment; the receiver
 * matches it as it would that fragment (in order, or into the unexpected queue until a receive
 * comes), registers the receive buffer for that message and answers with a CTS in a slot (the id,
 * address, rkey, room).  The sender registers its buffer and writes straight from it into the
 * receive buffer (RDMA WRITE, in pieces no longer than the port's largest message), the last piece
 * WITH IMMEDIATE (IMM_ZDONE and the id) which completes the receive; each side gives its
 * registration back as its part ends.  No copy through the slots; registrations come from a cache
 * that keeps them between messages where that is safe (rcache_open(), rdma_rcache.h), else one per
 * message and side.  Where the message is longer than the receive's room or a registration fails, the CTS
 * (or the sender) turns the message into fragments carrying the id, which go to the receive
 * already matched: the copy path, with its length check.  A receive given up before its data
 * came deregisters at once, cached or not (a peer still writing fails, never writes into memory
 * given back); a send given up mid-way tells the receiver (RZCANCEL).
 *
 * Device: one per link, rail `link->rail` of the rank's nearest devices (rdma_dev.h); links.c opens
 * a link per rail (several NICs) and the balancer splits over them.
 *
 * Device buffers are registered through dma-buf, else by address (nvidia-peermem):
 * fc_rdma_reg_device (rdma_dev.c), from reg_device below.
 *
 * The ring kernels' second lane can run over this link (FLEXCOLL_RING_LANE=rdma: lib/gpu/pcie_ce.c
 * sends and receives its messages through this table, device memory to device memory).
 *
 * What this does not do yet (docs/ARCHITECTURE.md): carry a share of the ring kernels' device
 * calls beside the pcie lane (a third lane), where the model's shared port (a NIC under its
 * GPU's root port) would come into force (the balancer can bound a shared port; the device lanes
 * and the host links are balanced apart today); watching unmaps (pinned registrations are cached
 * only on the application's promise, FLEXCOLL_RDMA_RCACHE_PINNED). */
#define _GNU_SOURCE
#include "config.h"
#include "clock.h"

#include "transports.h"

#if HAVE_VERBS_H
#include "verbs.h"
#include "rdma_rcache.h"
#include "rdma_dev.h"
#include "progress_thread.h"
#include "gpu/gpu.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"
#include "error.h"
#include "gpu/gpu.h"
#include "log.h"
#include "param.h"
#include "transports.h"

/* ---- the provider's table ----------------------------------------------------------------- */

#define FC_VERBS_MAX_PROVIDERS 4
static pthread_mutex_t verbs_lock = PTHREAD_MUTEX_INITIALIZER;
static fc_verbs_t verbs_loaded[FC_VERBS_MAX_PROVIDERS];
static char verbs_paths[FC_VERBS_MAX_PROVIDERS][512];
static int verbs_n;

/* The library the environment selects: libibverbs, the test suite's fake, or a path. */
static const char *provider_path(char *why, size_t len) {
  const char *p = fc_param_str("FLEXCOLL_VERBS_PROVIDER", NULL);
  if (!p) return "libibverbs.so.1";
  if (strcmp(p, "fake")) return p;
  const char *lib = fc_param_str("FLEXCOLL_VERBS_FAKE_LIB", NULL);
  if (!lib)
    snprintf(why, len,
             "FLEXCOLL_VERBS_PROVIDER=fake needs FLEXCOLL_VERBS_FAKE_LIB, the test suite's fake provider "
             "(make check sets it)");
  return lib;
}

/* Registered memory and fork(): on kernels before 5.13 a child's copy-on-write of a registered
 * page leaves the parent's NIC on the page the child got, so the parent's later messages are
 * silently lost or stale (frameworks fork data-loader workers after creating communicators).
 * libibverbs prevents it with ibv_fork_init (every registration then MADV_DONTFORK), which must
 * come before the first registration: here, as the provider is loaded.  Newer kernels need
 * nothing (IBV_FORK_UNNEEDED); a libibverbs too old to say is asked to, as UCX does. */
static void fork_safety(const fc_verbs_t *v) {
  if (!v->fork_init) return;
  const enum ibv_fork_status st = v->is_fork_initialized ? v->is_fork_initialized() : IBV_FORK_DISABLED;
  if (st != IBV_FORK_DISABLED) return;
  const int e = v->fork_init();
  if (e) FC_WARN("rdma: ibv_fork_init failed (%s): on this kernel a fork() after communicators are created may lose "
                 "their rdma messages", strerror(e));
  else FC_INFO(FC_SUB_NET, "rdma: fork safety on (ibv_fork_init: this kernel shares registered pages with a forked child)");
}

const fc_verbs_t *fc_verbs_load(char *why, size_t len) {
  const char *path = provider_path(why, len);
  if (!path) return NULL;
  pthread_mutex_lock(&verbs_lock);
  const fc_verbs_t *found = NULL;
  for (int i = 0; i < verbs_n && !found; i++)
    if (!strcmp(verbs_paths[i], path)) found = &verbs_loaded[i];
  if (found || verbs_n == FC_VERBS_MAX_PROVIDERS) {
    if (!found) snprintf(why, len, "more than %d verbs providers in one process", FC_VERBS_MAX_PROVIDERS);
    pthread_mutex_unlock(&verbs_lock);
    return found;
  }
  /* Never closed: contexts of the provider may live as long as the process. */
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(why, len, "cannot load %s: %s", path, dlerror());
    pthread_mutex_unlock(&verbs_lock);
    return NULL;
  }
  fc_verbs_t *v = &verbs_loaded[verbs_n];
  const struct {
    void **slot;
    const char *name;
    int optional;
  } syms[] = {
      {(void **)&v->get_device_list, "ibv_get_device_list", 0}, {(void **)&v->free_device_list, "ibv_free_device_list", 0},
      {(void **)&v->get_device_name, "ibv_get_device_name", 0}, {(void **)&v->open_device, "ibv_open_device", 0},
      {(void **)&v->close_device, "ibv_close_device", 0},       {(void **)&v->query_device, "ibv_query_device", 0},
      {(void **)&v->query_port, "ibv_query_port", 0},           {(void **)&v->query_gid, "ibv_query_gid", 0},
      {(void **)&v->alloc_pd, "ibv_alloc_pd", 0},               {(void **)&v->dealloc_pd, "ibv_dealloc_pd", 0},
      {(void **)&v->reg_mr, "ibv_reg_mr", 0},                   {(void **)&v->dereg_mr, "ibv_dereg_mr", 0},
      {(void **)&v->create_cq, "ibv_create_cq", 0},             {(void **)&v->destroy_cq, "ibv_destroy_cq", 0},
      {(void **)&v->create_qp, "ibv_create_qp", 0},             {(void **)&v->modify_qp, "ibv_modify_qp", 0},
      {(void **)&v->destroy_qp, "ibv_destroy_qp", 0},           {(void **)&v->get_async_event, "ibv_get_async_event", 0},
      {(void **)&v->ack_async_event, "ibv_ack_async_event", 0}, {(void **)&v->wc_status_str, "ibv_wc_status_str", 1},
      {(void **)&v->create_comp_channel, "ibv_create_comp_channel", 1},
      {(void **)&v->destroy_comp_channel, "ibv_destroy_comp_channel", 1},
      {(void **)&v->get_cq_event, "ibv_get_cq_event", 1},       {(void **)&v->ack_cq_events, "ibv_ack_cq_events", 1},
      {(void **)&v->fork_init, "ibv_fork_init", 1},
      {(void **)&v->is_fork_initialized, "ibv_is_fork_initialized", 1},
      {(void **)&v->reg_dmabuf_mr, "ibv_reg_dmabuf_mr", 1},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(h, syms[i].name);
    if (!*syms[i].slot && !syms[i].optional) {
      snprintf(why, len, "%s has no %s", path, syms[i].name);
      dlclose(h);
      memset(v, 0, sizeof *v);
      pthread_mutex_unlock(&verbs_lock);
      return NULL;
    }
  }
  snprintf(verbs_paths[verbs_n], sizeof verbs_paths[0], "%s", path);
  v->path = verbs_paths[verbs_n];
  verbs_n++;
  fork_safety(v);
  pthread_mutex_unlock(&verbs_lock);
  return v;
}

static const char *wc_status(const fc_verbs_t *v, enum ibv_wc_status st) {
  return v->wc_status_str ? v->wc_status_str(st) : "error";
}

/* ---- the link's state ---------------------------------------------------------------------- */

/* A slot: this header, then the fragment's bytes.  kind: FRAG_DATA, a fragment of an eager
 * message; FRAG_RTS, a rendezvous message's announcement (no bytes; id: the sender's number for
 * it); FRAG_RZDATA, a fragment of a rendezvous message sent by copy after all (routed by id, not
 * matched again); FRAG_CTS, the receiver's answer to an RTS (mode: write into addr/rkey, total
 * bytes of room; send by copy; or drop, the receive is gone); FRAG_RZCANCEL, the sender gave up
 * a rendezvous message after its CTS.  Control fragments (CTS, RZCANCEL) stand outside the
 * message stream: they may come between two fragments of one message. */
typedef struct {
  uint64_t tag, total, offset;
  uint32_t len, magic;
  uint32_t kind, rkey;
  uint64_t id, addr;
  uint32_t mode, pad;
} slot_hdr_t;
enum { FRAG_DATA, FRAG_RTS, FRAG_RZDATA, FRAG_CTS, FRAG_RZCANCEL };
enum { CTS_WRITE, CTS_COPY, CTS_DROP };
#define SLOT_MAGIC 0xfc4d5a11u
/* Slot size: big enough that the header and the per-fragment work are small against the copy,
 * small enough that many peers' rings stay a few MiB. */
#define SLOT_BYTES (64u << 10)
#define SLOT_DATA (SLOT_BYTES - sizeof(slot_hdr_t))
#define IMM_CREDIT 0x80000000u
/* The last write of a rendezvous message: this bit and its id's low bits (tested after
 * IMM_CREDIT, whose count may set it; a slot's number never does). */
#define IMM_ZDONE 0x40000000u
#define ZID_MASK 0x3fffffffu
/* Send work requests a rendezvous leaves free for slot writes and credits. */
#define ZC_RESERVE 4
/* Most completions taken per poll. */
#define POLL_BATCH 32
/* Unexpected messages larger than this are a broken peer, not an allocation. */
#define MAX_MESSAGE ((uint64_t)1 << 40)

enum { REQ_PENDING, REQ_DONE, REQ_FAILED };

typedef struct rdma_req rdma_req_t;
typedef struct unexp unexp_t;
struct rdma_req {
  int is_recv, peer, state, orphan;
  uint64_t tag;
  char *buf;
  size_t bytes;   /* send: the length; recv: the room */
  size_t total;   /* recv: the length the sender announced */
  size_t posted;  /* send: bytes handed to slots */
  int frags_out;  /* send: fragments posted, not completed */
  int nfrags_posted;
  unexp_t *from;  /* recv: bound to an unexpected message still arriving */
  rdma_req_t *next;
  /* Rendezvous (zero copy): the message's id, the user buffer's registration for this message
   * alone, the receive's buffer (send side), bytes posted as writes, where it stands. */
  int zc, zstate, zkind; /* zkind: what a queued send's fragments are (FRAG_DATA, RTS, RZDATA) */
  uint64_t zid, zraddr;
  uint32_t zrkey;
  size_t zposted;
  struct ibv_mr *mr;
  fc_rc_ent_t *rent; /* mr's entry in the registration cache */
  int dev;           /* buf is device memory: copied with fc_mem_copy, registered through dcache */
  rdma_req_t *znext; /* in the peer's zs (sends) or zq (receives) */
  char why[160];
};

struct unexp {
  int rts;      /* a rendezvous announcement (no data): zid, total */
  uint64_t zid;
  uint64_t tag;
  size_t total, got;
  char *data;
  rdma_req_t *req; /* a receive waiting for the rest */
  unexp_t *next;
};

typedef struct {
  struct ibv_qp *qp;
  uint64_t raddr; /* the peer's ring for this rank */
  uint32_t rkey;
  int broken;
  char why[160];
  /* sending */
  uint64_t sent, credited;      /* fragments written; slots the peer has freed */
  rdma_req_t **slot_req;        /* send slot -> its request while the write is in flight */
  unsigned char *slot_busy;
  rdma_req_t *sq_head, *sq_tail; /* sends with fragments left to post, in order */
  int wr_out;                   /* send WRs in flight (data and credits) */
  /* receiving */
  uint64_t consumed, credit_sent;
  rdma_req_t *rq_head, *rq_tail; /* receives not matched yet */
  unexp_t *uq_head, *uq_tail;   /* messages nobody asked for yet */
  rdma_req_t *cur_req;           /* the message arriving now: its receive, */
  unexp_t *cur_unexp;            /* or its unexpected entry */
  uint64_t cur_tag;
  size_t cur_total, cur_got;
  int cur_open;
  /* rendezvous */
  uint64_t zid_next;             /* ids of this rank's rendezvous sends to the peer */
  rdma_req_t *zs_head;           /* sends announced, waiting for a CTS or writing */
  rdma_req_t *zq_head;           /* receives matched to an RTS, waiting for the data */
  struct ctl *ctl_head, *ctl_tail; /* control fragments to send (CTS, RZCANCEL) */
} peer_t;

typedef struct ctl {
  int kind;
  uint64_t id;
  struct ctl *next;
} ctl_t;

/* Where a rendezvous send stands. */
enum { ZS_NONE, ZS_WAIT_CTS, ZS_WRITE, ZS_COPY, ZS_GONE };

typedef struct {
  const fc_verbs_t *v;
  struct flexcoll_comm *comm;
  int nranks, rank, nslots, max_send_wr, max_recv_wr;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_mr *ring_mr, *send_mr;
  char *ring, *send; /* nranks * nslots slots each (own rank's unused) */
  size_t area;       /* bytes of each */
  int pinned;        /* ring and send pinned with CUDA (rdma_prepare_device) */
  peer_t *peers;
  uint8_t port;
  int gid_index;          /* RoCE: the port's GID entry this rank is addressed by */
  int fatal;
  char fatal_why[160];
  unsigned progress_calls;
  size_t zcopy_bytes; /* FLEXCOLL_RDMA_ZCOPY_BYTES: sends from this size take the rendezvous */
  fc_rcache_t *rcache; /* user buffers' registrations (kept, or per message: rdma_rcache.h) */
  fc_rcache_t *dcache; /* user device buffers' (kept by their allocation's buffer id) */
  int rail, nrails;    /* which of this rank's devices this link is, of how many (rdma_dev.h) */
  unsigned char alone[FC_RDMA_MAX_RAILS]; /* rail k's PCIe root port is none of rails 0..k-1's */
  int odp;             /* the device's registrations can follow the page tables (on-demand paging) */
  unsigned dev_reg_logged; /* bit FC_RDMA_REG_*: how device buffers were registered, said once */
  uint64_t max_msg;   /* the port's largest message: the longest single write */
  /* The progress thread (FLEXCOLL_RDMA_PROGRESS_THREAD): it polls completions and async events
   * between calls too, so a peer's eager fragments are taken into the unexpected queue and their
   * credits returned while this rank computes, and a port that goes down sets the communicator's
   * asynchronous error without a call.  Every entry point of the table holds lock; the thread
   * only takes it when free (a call in progress drives the link itself). */
  pthread_mutex_t lock;
  int lock_made;
  fc_progress_thread_t progress;
  /* Parking: the CQ reports completions through channel once armed; wake_fd (epoll) is readable
   * when the channel or the device's async events have something, so a parked thread sleeps
   * until then.  No channel (the provider has none, or it failed): the thread never parks. */
  struct ibv_comp_channel *channel;
  int wake_fd;
  unsigned cq_events; /* taken from the channel, not yet acknowledged */
} rdma_t;

/* What each rank publishes at open (the bootstrap all-gather), then one queue pair number per rank. */
typedef struct {
  union ibv_gid gid;
  uint64_t ring_addr;
  uint32_t rkey, nslots;
  uint16_t lid;
  uint8_t mtu, global, usable, pad[3];
} conn_hdr_t;

static char *ring_slot(rdma_t *r, int peer, uint64_t k) {
  return r->ring + ((size_t)peer * (size_t)r->nslots + (size_t)(k % (uint64_t)r->nslots)) * SLOT_BYTES;
}
static char *send_slot(rdma_t *r, int peer, uint64_t k) {
  return r->send + ((size_t)peer * (size_t)r->nslots + (size_t)(k % (uint64_t)r->nslots)) * SLOT_BYTES;
}

static void req_fail(rdma_req_t *q, const char *why) {
  if (q->state != REQ_PENDING) return;
  q->state = REQ_FAILED;
  snprintf(q->why, sizeof q->why, "%s", why);
}

static void req_release(rdma_req_t *q) {
  if (q->frags_out == 0) free(q);
  else q->orphan = 1; /* the completions of its fragments free it */
}

/* A peer is unusable from now on: every request that needs it fails with the reason. */
static void peer_break(rdma_t *r, int p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void peer_break(rdma_t *r, int p, const char *fmt, ...) {
  peer_t *e = &r->peers[p];
  if (!e->broken) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->why, sizeof e->why, fmt, ap);
    va_end(ap);
    e->broken = 1;
    FC_INFO(FC_SUB_NET, "rank %d: rdma link to rank %d broken: %s", r->rank, p, e->why);
    /* ERR flushes what is in flight here, and the peer's next write fails at once instead of
     * waiting for a receive that is never posted again. */
    if (e->qp) {
      struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
      r->v->modify_qp(e->qp, &a, IBV_QP_STATE);
    }
  }
  for (rdma_req_t *q = e->sq_head; q; q = q->next) req_fail(q, e->why);
  for (rdma_req_t *q = e->rq_head; q; q = q->next) req_fail(q, e->why);
  for (unexp_t *u = e->uq_head; u; u = u->next)
    if (u->req) req_fail(u->req, e->why);
  if (e->cur_req) req_fail(e->cur_req, e->why);
  for (rdma_req_t *q = e->zs_head; q; q = q->znext) req_fail(q, e->why);
  for (rdma_req_t *q = e->zq_head; q; q = q->znext) req_fail(q, e->why);
  for (int k = 0; k < r->nslots; k++)
    if (e->slot_req[k]) req_fail(e->slot_req[k], e->why);
}

static void link_fatal(rdma_t *r, const char *why) {
  if (!r->fatal) {
    r->fatal = 1;
    snprintf(r->fatal_why, sizeof r->fatal_why, "%s", why);
    /* The whole device is gone for this communicator, not one transfer. */
    fc_comm_set_async_error(r->comm, FLEXCOLL_REMOTE_ERROR);
  }
  for (int p = 0; p < r->nranks; p++)
    if (p != r->rank) peer_break(r, p, "%s", why);
}

/* ---- requests ----------------------------------------------------------------------------------- */

static void list_remove(rdma_req_t **head, rdma_req_t **tail, rdma_req_t *q) {
  rdma_req_t *prev = NULL;
  for (rdma_req_t *x = *head; x; prev = x, x = x->next)
    if (x == q) {
      if (prev) prev->next = x->next;
      else *head = x->next;
      if (*tail == x) *tail = prev;
      x->next = NULL;
      return;
    }
}

static void list_append(rdma_req_t **head, rdma_req_t **tail, rdma_req_t *q) {
  q->next = NULL;
  if (*tail) (*tail)->next = q;
  else *head = q;
  *tail = q;
}

static void unexp_remove(peer_t *e, unexp_t *u) {
  unexp_t *prev = NULL;
  for (unexp_t *x = e->uq_head; x; prev = x, x = x->next)
    if (x == u) {
      if (prev) prev->next = x->next;
      else e->uq_head = x->next;
      if (e->uq_tail == x) e->uq_tail = prev;
      break;
    }
  if (e->cur_unexp == u) e->cur_unexp = NULL; /* the rest of it is dropped as it arrives */
  if (u->req) u->req->from = NULL;
  free(u->data);
  free(u);
}

/* ---- rendezvous bookkeeping ------------------------------------------------------------------ */

static void zlist_remove(rdma_req_t **head, rdma_req_t *q) {
  for (rdma_req_t **pp = head; *pp; pp = &(*pp)->znext)
    if (*pp == q) {
      *pp = q->znext;
      q->znext = NULL;
      return;
    }
}

static void zlist_push(rdma_req_t **head, rdma_req_t *q) {
  q->znext = *head;
  *head = q;
}

/* The request of rendezvous id (of its low bits where mask says so: an immediate carries those). */
static rdma_req_t *zlist_find(rdma_req_t *head, uint64_t id, uint64_t mask) {
  for (rdma_req_t *q = head; q; q = q->znext)
    if ((q->zid & mask) == (id & mask)) return q;
  return NULL;
}

/* q's device buffer registered with the NIC (GPUDirect RDMA, fc_rdma_reg_device: a dma-buf,
 * else the device address), through the device registration cache (kept by the allocation's
 * buffer id, so a buffer freed and allocated again at the same address is registered anew).
 * NULL where neither works: the message then goes by copy (fc_mem_copy through the slots).  The
 * first outcome of each kind is logged once per link. */
static struct ibv_mr *reg_device(rdma_t *r, rdma_req_t *q, size_t bytes, int access) {
  char why[400] = "";
  int how = FC_RDMA_REG_NONE;
  struct ibv_mr *mr = fc_rcache_get_device(r->dcache, q->buf, bytes, access, &q->rent, &how, why, sizeof why);
  if (!(r->dev_reg_logged & (1u << how))) {
    r->dev_reg_logged |= 1u << how;
    if (how == FC_RDMA_REG_DMABUF)
      FC_INFO(FC_SUB_NET, "rank %d: rdma: device buffers registered through dma-buf (GPUDirect RDMA)", r->rank);
    else if (how == FC_RDMA_REG_ADDRESS)
      FC_INFO(FC_SUB_NET, "rank %d: rdma: device buffers registered by address (nvidia-peermem): %s", r->rank, why);
    else FC_INFO(FC_SUB_NET, "rank %d: rdma: device buffers cannot be registered (%s): they go by copy", r->rank, why);
  }
  return mr;
}

/* n bytes where either side may be device memory (dev: one is); 0, or -1 with the reason. */
static int any_copy(int dev, void *dst, const void *src, size_t n, char *why, size_t len) {
  if (dev) return fc_mem_copy(dst, src, n, why, len);
  memcpy(dst, src, n);
  return 0;
}

/* Bytes into or out of a user buffer that may be device memory (dev) while messages move; a copy
 * that fails breaks the peer, whose requests then fail with the reason. */
static int user_copy(rdma_t *r, int p, int dev, void *dst, const void *src, size_t n) {
  char why[160];
  if (any_copy(dev, dst, src, n, why, sizeof why) == 0) return 0;
  peer_break(r, p, "%s", why);
  return -1;
}

/* q's buffer registered for its message, through the registration cache (rdma_rcache.h: kept
 * between messages where that is safe, see rcache_open; else for this message alone). */
static struct ibv_mr *zreg(rdma_t *r, rdma_req_t *q, size_t bytes, int access) {
  if (q->dev) return q->mr = reg_device(r, q, bytes, access);
  q->mr = fc_rcache_get(r->rcache, q->buf, bytes, access, &q->rent);
  if (!q->mr)
    FC_INFO(FC_SUB_NET, "rank %d: rdma: ibv_reg_mr of a %zu-byte user buffer failed (%s): that message goes by copy",
            r->rank, bytes, strerror(errno ? errno : ENOMEM));
  return q->mr;
}

/* invalidate: the message did not end as planned (a receive given up or cancelled), so a peer
 * may still write into the buffer: its registration goes now, not back into the cache. */
static void zdereg(rdma_t *r, rdma_req_t *q, int invalidate) {
  if (q->rent) fc_rcache_put(q->dev ? r->dcache : r->rcache, q->rent, invalidate);
  q->rent = NULL;
  q->mr = NULL;
}

/* A control fragment for peer p, sent by pump() ahead of data (a peer's transfer waits on it). */
static void ctl_queue(rdma_t *r, int p, int kind, uint64_t id) {
  peer_t *e = &r->peers[p];
  ctl_t *c = calloc(1, sizeof *c);
  if (!c) {
    peer_break(r, p, "out of memory for a rendezvous control message");
    return;
  }
  c->kind = kind;
  c->id = id;
  if (e->ctl_tail) e->ctl_tail->next = c;
  else e->ctl_head = c;
  e->ctl_tail = c;
}

/* A receive matched to an RTS (id, total): registers the message's part of its buffer when the
 * message fits and asks for the data (CTS); a message larger than the room, or a registration
 * that fails, gets a CTS asking for copies instead, so that the receive ends as an eager one does
 * (truncated, the length mismatch reported by test). */
static void rz_match(rdma_t *r, int p, rdma_req_t *q, uint64_t id, size_t total) {
  peer_t *e = &r->peers[p];
  q->zc = 1;
  q->zid = id;
  q->total = total;
  if (total <= q->bytes && total > 0) zreg(r, q, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  zlist_push(&e->zq_head, q);
  ctl_queue(r, p, FRAG_CTS, id);
}

/* A rendezvous receive leaves the peer's list; its registration goes back (invalidated where
 * the data did not all come: see zdereg). */
static void rz_recv_end(rdma_t *r, peer_t *e, rdma_req_t *q) {
  zlist_remove(&e->zq_head, q);
  zdereg(r, q, q->state != REQ_DONE);
}

/* Nothing of the link refers to q any more, except send slots whose writes are in flight. */
static void req_detach(rdma_t *r, rdma_req_t *q) {
  peer_t *e = &r->peers[q->peer];
  if (q->is_recv) list_remove(&e->rq_head, &e->rq_tail, q);
  else list_remove(&e->sq_head, &e->sq_tail, q);
  if (e->cur_req == q) e->cur_req = NULL;
  /* A receive's registration goes now: a peer still writing into it fails (remote access error,
   * that peer's link breaks) rather than writing into a buffer its owner has taken back. */
  if (q->is_recv && q->zc) rz_recv_end(r, e, q);
  if (!q->is_recv && q->zc) {
    /* The receiver waits for data that will not come: tell it (a CTS still to come for a send
     * announced but not started is answered the same way, by id). */
    if (q->zstate == ZS_WRITE && q->zposted < q->bytes && !e->broken) ctl_queue(r, q->peer, FRAG_RZCANCEL, q->zid);
    q->zstate = ZS_GONE;
    /* Writes in flight read the buffer: its registration stays until they complete. */
    if (q->frags_out == 0) {
      zlist_remove(&e->zs_head, q);
      zdereg(r, q, 0);
    }
  }
  if (q->from) {
    q->from->req = NULL;
    q->from = NULL;
  }
}

/* ---- posting --------------------------------------------------------------------------------- */

#define RECV_ID (1ull << 63)

static int post_recv_wr(rdma_t *r, int p) {
  struct ibv_recv_wr wr = {.wr_id = RECV_ID | (uint64_t)p, .sg_list = NULL, .num_sge = 0}, *bad = NULL;
  int rc = ibv_post_recv(r->peers[p].qp, &wr, &bad);
  if (rc) peer_break(r, p, "ibv_post_recv failed: %s", strerror(rc));
  return rc;
}

/* wr_id of a send: peer, kind (data or credit) and slot. */
static uint64_t send_id(int p, int credit, uint64_t slot) {
  return ((uint64_t)(uint32_t)p << 32) | ((uint64_t)(credit != 0) << 31) | (slot & 0x7fffffff);
}
/* ... or a rendezvous write: peer, bit 30, the message id's low bits. */
#define ZWR_BIT (1ull << 30)
static uint64_t zsend_id(int p, uint64_t zid) { return ((uint64_t)(uint32_t)p << 32) | ZWR_BIT | (zid & ZID_MASK); }

/* One RDMA WRITE WITH IMMEDIATE to peer p: send slot k's first `bytes` into its ring slot k (a
 * credit carries no bytes). */
static int post_write(rdma_t *r, int p, int credit, uint64_t k, uint32_t imm, size_t bytes) {
  peer_t *e = &r->peers[p];
  uint64_t slot = k % (uint64_t)r->nslots;
  struct ibv_sge sge = {.addr = (uintptr_t)send_slot(r, p, k), .length = (uint32_t)bytes, .lkey = r->send_mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = send_id(p, credit, slot);
  wr.sg_list = bytes ? &sge : NULL;
  wr.num_sge = bytes ? 1 : 0;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = e->raddr + (credit ? 0 : slot * SLOT_BYTES);
  wr.wr.rdma.rkey = e->rkey;
  int rc = ibv_post_send(e->qp, &wr, &bad);
  if (rc) {
    peer_break(r, p, "ibv_post_send failed: %s", strerror(rc));
    return rc;
  }
  e->wr_out++;
  return 0;
}

/* Whether the next send slot to peer p may be written now. */
static int slot_ready(rdma_t *r, peer_t *e) {
  uint64_t k = e->sent;
  return k - e->credited < (uint64_t)r->nslots && !e->slot_busy[k % (uint64_t)r->nslots] && e->wr_out < r->max_send_wr;
}

/* The control fragments queued for peer p (a CTS is filled in now, from its receive if that is
 * still there). */
static void pump_ctl(rdma_t *r, int p) {
  peer_t *e = &r->peers[p];
  while (!e->broken && e->ctl_head && slot_ready(r, e)) {
    ctl_t *c = e->ctl_head;
    uint64_t k = e->sent;
    unsigned slot = (unsigned)(k % (uint64_t)r->nslots);
    slot_hdr_t h = {.magic = SLOT_MAGIC, .kind = (uint32_t)c->kind, .id = c->id};
    if (c->kind == FRAG_CTS) {
      rdma_req_t *q = zlist_find(e->zq_head, c->id, ~0ull);
      h.mode = !q ? CTS_DROP : q->mr ? CTS_WRITE : CTS_COPY;
      if (q && q->mr) {
        h.addr = (uint64_t)(uintptr_t)q->buf;
        h.rkey = q->mr->rkey;
        h.total = q->total; /* what is registered: the announced length */
      }
    }
    memcpy(send_slot(r, p, k), &h, sizeof h);
    if (post_write(r, p, 0, k, slot, sizeof h)) return;
    e->slot_busy[slot] = 1;
    e->slot_req[slot] = NULL;
    e->sent++;
    e->ctl_head = c->next;
    if (!e->ctl_head) e->ctl_tail = NULL;
    free(c);
  }
}

/* The writes of rendezvous sends that have their CTS: straight from the user's buffer into the
 * receive's, in pieces no longer than the port's largest message, the last one with the
 * immediate that completes the receive (an RC queue pair delivers in order, so the data before
 * it is in place when the receiver sees it).  Some send work requests stay free for slots and
 * credits. */
static void pump_zcopy(rdma_t *r, int p) {
  peer_t *e = &r->peers[p];
  for (rdma_req_t *q = e->zs_head; q && !e->broken; q = q->znext)
    while (q->zstate == ZS_WRITE && q->zposted < q->bytes && e->wr_out < r->max_send_wr - ZC_RESERVE) {
      size_t n = q->bytes - q->zposted < r->max_msg ? q->bytes - q->zposted : (size_t)r->max_msg;
      int last = q->zposted + n == q->bytes;
      struct ibv_sge sge = {.addr = (uintptr_t)(q->buf + q->zposted), .length = (uint32_t)n, .lkey = q->mr->lkey};
      struct ibv_send_wr wr, *bad = NULL;
      memset(&wr, 0, sizeof wr);
      wr.wr_id = zsend_id(p, q->zid);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.imm_data = htonl(IMM_ZDONE | (uint32_t)(q->zid & ZID_MASK));
      wr.wr.rdma.remote_addr = q->zraddr + q->zposted;
      wr.wr.rdma.rkey = q->zrkey;
      int rc = ibv_post_send(e->qp, &wr, &bad);
      if (rc) {
        peer_break(r, p, "ibv_post_send (rendezvous write) failed: %s", strerror(rc));
        return;
      }
      e->wr_out++;
      q->frags_out++;
      q->zposted += n;
    }
}

/* Post what peer p's queued sends can: one fragment per free slot, message after message. */
static void pump(rdma_t *r, int p) {
  peer_t *e = &r->peers[p];
  pump_ctl(r, p);
  pump_zcopy(r, p);
  while (!e->broken && e->sq_head) {
    rdma_req_t *q = e->sq_head;
    uint64_t k = e->sent;
    unsigned slot = (unsigned)(k % (uint64_t)r->nslots);
    if (!slot_ready(r, e)) return;
    int rts = q->zkind == FRAG_RTS;
    size_t len = rts ? 0 : q->bytes - q->posted < SLOT_DATA ? q->bytes - q->posted : SLOT_DATA;
    slot_hdr_t h = {.tag = q->tag, .total = q->bytes, .offset = q->posted, .len = (uint32_t)len, .magic = SLOT_MAGIC,
                    .kind = (uint32_t)q->zkind, .id = q->zid};
    char *s = send_slot(r, p, k);
    memcpy(s, &h, sizeof h);
    if (len && user_copy(r, p, q->dev, s + sizeof h, q->buf + q->posted, len)) return;
    if (post_write(r, p, 0, k, slot, sizeof h + len)) return;
    e->slot_busy[slot] = 1;
    e->sent++;
    if (rts) {
      /* Announced: it waits for the receiver's CTS (the RTS's own completion is nobody's). */
      e->slot_req[slot] = NULL;
      list_remove(&e->sq_head, &e->sq_tail, q);
      q->zstate = ZS_WAIT_CTS;
      zlist_push(&e->zs_head, q);
      continue;
    }
    e->slot_req[slot] = q;
    q->frags_out++;
    q->nfrags_posted++;
    q->posted += len;
    if (q->posted == q->bytes) list_remove(&e->sq_head, &e->sq_tail, q);
  }
}

/* Tell peer p which slots of its ring here are free again: every quarter of the ring (a sender
 * stalls only with the whole ring in use, so a quarter is always reached). */
static void send_credit(rdma_t *r, int p) {
  peer_t *e = &r->peers[p];
  uint64_t owed = e->consumed - e->credit_sent, every = r->nslots >= 4 ? (uint64_t)r->nslots / 4 : 1;
  if (e->broken || owed < every || e->wr_out >= r->max_send_wr) return;
  if (post_write(r, p, 1, 0, IMM_CREDIT | (uint32_t)(e->consumed & 0x7fffffff), 0) == 0) e->credit_sent = e->consumed;
}

/* ---- arrivals ------------------------------------------------------------------------------------ */

static void finish_recv(rdma_req_t *q, size_t total) {
  q->total = total;
  if (q->state == REQ_PENDING) q->state = REQ_DONE;
}

/* The fragment in ring slot `consumed` of peer p: into its receive, or the unexpected queue. */
static void land(rdma_t *r, int p, uint32_t byte_len) {
  peer_t *e = &r->peers[p];
  const char *s = ring_slot(r, p, e->consumed);
  slot_hdr_t h;
  memcpy(&h, s, sizeof h);
  if (h.magic != SLOT_MAGIC || h.len > SLOT_DATA || byte_len != sizeof h + h.len || h.total > MAX_MESSAGE ||
      h.offset + h.len > h.total || h.kind > FRAG_RZCANCEL || (h.kind != FRAG_DATA && h.kind != FRAG_RZDATA && h.len)) {
    peer_break(r, p, "malformed fragment from rank %d (magic %08x, %u bytes)", p, h.magic, byte_len);
    return;
  }
  if (h.kind == FRAG_CTS) {
    /* This rank's rendezvous send h.id: write, send by copy, or done (the receive is gone). */
    rdma_req_t *q = zlist_find(e->zs_head, h.id, ~0ull);
    if (!q || q->zstate != ZS_WAIT_CTS) {
      if (h.mode != CTS_DROP) ctl_queue(r, p, FRAG_RZCANCEL, h.id); /* given up here meanwhile */
      return;
    }
    if (h.mode == CTS_DROP) {
      zlist_remove(&e->zs_head, q);
      q->zstate = ZS_NONE;
      if (q->state == REQ_PENDING) q->state = REQ_DONE; /* as an eager message to a cancelled receive */
      return;
    }
    if (h.mode == CTS_WRITE && h.total == q->bytes) {
      /* Source only (local read needs no access flag): a read-only buffer registers too. */
      if (zreg(r, q, q->bytes, 0)) {
        q->zraddr = h.addr;
        q->zrkey = h.rkey;
        q->zstate = ZS_WRITE;
        return; /* pump() posts the writes */
      }
    }
    /* By copy: fragments with the id, which the receive (already matched) takes whole. */
    zlist_remove(&e->zs_head, q);
    q->zstate = ZS_COPY;
    q->zkind = FRAG_RZDATA;
    q->posted = 0;
    list_append(&e->sq_head, &e->sq_tail, q);
    return;
  }
  if (h.kind == FRAG_RZCANCEL) {
    rdma_req_t *q = zlist_find(e->zq_head, h.id, ~0ull);
    if (q) {
      req_fail(q, "the sender cancelled the message");
      rz_recv_end(r, e, q);
    }
    return;
  }
  if (h.offset == 0) {
    if (e->cur_open) {
      /* A new message before the last one ended: the sender gave up on that one (cancelled). */
      if (e->cur_req) req_fail(e->cur_req, "the sender cancelled the message");
      if (e->cur_unexp) {
        if (e->cur_unexp->req) req_fail(e->cur_unexp->req, "the sender cancelled the message");
        unexp_remove(e, e->cur_unexp);
      }
      e->cur_req = NULL;
    }
    e->cur_open = 0;
    e->cur_req = NULL;
    e->cur_unexp = NULL;
    if (h.kind == FRAG_RTS) {
      /* Matched as an eager message's first fragment is, in the same order; the data follows
       * once the receive is known. */
      for (rdma_req_t *q = e->rq_head; q; q = q->next)
        if (q->tag == h.tag) {
          list_remove(&e->rq_head, &e->rq_tail, q);
          rz_match(r, p, q, h.id, h.total);
          return;
        }
      unexp_t *u = calloc(1, sizeof *u);
      if (!u) {
        peer_break(r, p, "out of memory for an unexpected message");
        return;
      }
      u->rts = 1;
      u->zid = h.id;
      u->tag = h.tag;
      u->total = u->got = h.total;
      if (e->uq_tail) e->uq_tail->next = u;
      else e->uq_head = u;
      e->uq_tail = u;
      return;
    }
    e->cur_open = 1;
    e->cur_tag = h.tag;
    e->cur_total = h.total;
    e->cur_got = 0;
    if (h.kind == FRAG_RZDATA) {
      /* Its receive was matched at the RTS; none (cancelled here): the bytes are dropped. */
      rdma_req_t *q = zlist_find(e->zq_head, h.id, ~0ull);
      if (q && q->state == REQ_PENDING) e->cur_req = q;
    } else {
      for (rdma_req_t *q = e->rq_head; q; q = q->next)
        if (q->tag == h.tag) {
          list_remove(&e->rq_head, &e->rq_tail, q);
          e->cur_req = q;
          q->total = h.total;
          break;
        }
    }
    if (!e->cur_req && h.kind == FRAG_DATA) {
      unexp_t *u = calloc(1, sizeof *u);
      char *data = u ? malloc(h.total ? h.total : 1) : NULL;
      if (!data) {
        free(u);
        peer_break(r, p, "out of memory for an unexpected message of %llu bytes", (unsigned long long)h.total);
        return;
      }
      u->tag = h.tag;
      u->total = h.total;
      u->data = data;
      if (e->uq_tail) e->uq_tail->next = u;
      else e->uq_head = u;
      e->uq_tail = u;
      e->cur_unexp = u;
    }
  } else if (!e->cur_open || h.tag != e->cur_tag || h.offset != e->cur_got || h.total != e->cur_total) {
    peer_break(r, p, "fragment out of order from rank %d (tag %llx offset %llu)", p, (unsigned long long)h.tag,
               (unsigned long long)h.offset);
    return;
  }
  const char *data = s + sizeof h;
  rdma_req_t *q = e->cur_req;
  if (q && h.offset < q->bytes && h.len) {
    size_t n = q->bytes - h.offset < h.len ? q->bytes - h.offset : h.len;
    if (user_copy(r, p, q->dev, q->buf + h.offset, data, n)) return;
  }
  unexp_t *u = e->cur_unexp;
  if (u && h.len) memcpy(u->data + h.offset, data, h.len);
  e->cur_got += h.len;
  if (u) u->got = e->cur_got;
  if (e->cur_got < e->cur_total) return;
  e->cur_open = 0;
  if (q) finish_recv(q, e->cur_total);
  if (q && q->zc) rz_recv_end(r, e, q);
  e->cur_req = NULL;
  if (u && u->req) {
    rdma_req_t *w = u->req;
    if (u->total && w->bytes && user_copy(r, p, w->dev, w->buf, u->data, u->total < w->bytes ? u->total : w->bytes))
      return;
    w->from = NULL;
    finish_recv(w, u->total);
    unexp_remove(e, u);
  }
  e->cur_unexp = NULL;
}

static int peer_of_qp(rdma_t *r, const struct ibv_qp *qp) {
  for (int p = 0; p < r->nranks; p++)
    if (r->peers[p].qp == qp) return p;
  return -1;
}

static void on_completion(rdma_t *r, const struct ibv_wc *wc) {
  if (wc->wr_id & RECV_ID) {
    int p = (int)(wc->wr_id & 0xffffffff);
    if (p < 0 || p >= r->nranks || p == r->rank) return;
    peer_t *e = &r->peers[p];
    if (wc->status != IBV_WC_SUCCESS) {
      peer_break(r, p, "receive completion: %s", wc_status(r->v, wc->status));
      return;
    }
    if (e->broken) return;
    post_recv_wr(r, p);
    uint32_t imm = ntohl(wc->imm_data);
    if (imm & IMM_CREDIT) {
      e->credited += ((imm & 0x7fffffff) - (uint32_t)(e->credited & 0x7fffffff)) & 0x7fffffff;
      return;
    }
    if (imm & IMM_ZDONE) {
      /* A rendezvous receive's data is all in its buffer.  None: it was cancelled here (its
       * registration went with it, so nothing of this message landed after that). */
      rdma_req_t *q = zlist_find(e->zq_head, imm & ZID_MASK, ZID_MASK);
      if (!q) return;
      if (!q->mr) {
        peer_break(r, p, "rank %d wrote a message this rank asked to receive by copy", p);
        return;
      }
      finish_recv(q, q->total);
      rz_recv_end(r, e, q);
      return;
    }
    if (imm != (uint32_t)(e->consumed % (uint64_t)r->nslots)) {
      peer_break(r, p, "rank %d wrote slot %u where slot %u was next", p, imm,
                 (unsigned)(e->consumed % (uint64_t)r->nslots));
      return;
    }
    land(r, p, wc->byte_len);
    if (!e->broken) e->consumed++;
    return;
  }
  int p = (int)(wc->wr_id >> 32), credit = (int)((wc->wr_id >> 31) & 1);
  unsigned slot = (unsigned)(wc->wr_id & 0x7fffffff);
  if (p < 0 || p >= r->nranks || p == r->rank) return;
  peer_t *e = &r->peers[p];
  e->wr_out--;
  if (!credit && (wc->wr_id & ZWR_BIT)) {
    /* A rendezvous write: once its last one completed, the send is done and deregistered. */
    if (wc->status != IBV_WC_SUCCESS)
      peer_break(r, p, "rendezvous write completion: %s (vendor error %u)", wc_status(r->v, wc->status),
                 wc->vendor_err);
    rdma_req_t *q = zlist_find(e->zs_head, wc->wr_id & ZID_MASK, ZID_MASK);
    if (!q) return;
    q->frags_out--;
    if (wc->status != IBV_WC_SUCCESS) req_fail(q, "rendezvous write failed");
    if (q->frags_out > 0 || (q->zposted < q->bytes && q->state == REQ_PENDING && q->zstate == ZS_WRITE)) return;
    zlist_remove(&e->zs_head, q);
    zdereg(r, q, 0);
    if (q->orphan) free(q);
    else if (q->state == REQ_PENDING) q->state = REQ_DONE;
    return;
  }
  /* The peer's reason first, so that its requests fail with it. */
  if (wc->status != IBV_WC_SUCCESS)
    peer_break(r, p, "%s completion: %s (vendor error %u)", credit ? "credit" : "write", wc_status(r->v, wc->status),
               wc->vendor_err);
  if (!credit && slot < (unsigned)r->nslots) {
    rdma_req_t *q = e->slot_req[slot];
    e->slot_busy[slot] = 0;
    e->slot_req[slot] = NULL;
    if (q) {
      q->frags_out--;
      if (wc->status != IBV_WC_SUCCESS) req_fail(q, "write failed");
      if (q->orphan && q->frags_out == 0) free(q);
      else if (q->frags_out == 0 && q->posted == q->bytes && q->nfrags_posted && q->state == REQ_PENDING)
        q->state = REQ_DONE;
    }
  }
}

static void poll_async(rdma_t *r) {
  struct ibv_async_event ev;
  for (int n = 0; n < 64 && r->v->get_async_event(r->ctx, &ev) == 0; n++) {
    char why[120];
    int p;
    switch (ev.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
        p = peer_of_qp(r, ev.element.qp);
        if (p >= 0) peer_break(r, p, "queue pair error (async event %d)", (int)ev.event_type);
        break;
      case IBV_EVENT_CQ_ERR:
      case IBV_EVENT_PORT_ERR:
      case IBV_EVENT_DEVICE_FATAL:
        snprintf(why, sizeof why, "%s",
                 ev.event_type == IBV_EVENT_CQ_ERR    ? "completion queue overrun"
                 : ev.event_type == IBV_EVENT_PORT_ERR ? "port went down"
                                                       : "device fatal error");
        link_fatal(r, why);
        break;
      default: FC_INFO(FC_SUB_NET, "rank %d: rdma async event %d", r->rank, (int)ev.event_type);
    }
    r->v->ack_async_event(&ev);
  }
}

static int progress_locked(rdma_t *r) {
  int events = 0;
  /* Async events are rare and cost a system call each look: every 128th call. */
  if ((++r->progress_calls & 127) == 0) poll_async(r);
  struct ibv_wc wc[POLL_BATCH];
  for (int round = 0; round < 8; round++) {
    int n = ibv_poll_cq(r->cq, POLL_BATCH, wc);
    if (n < 0) {
      link_fatal(r, "ibv_poll_cq failed");
      break;
    }
    for (int i = 0; i < n; i++) on_completion(r, &wc[i]);
    events += n;
    if (n < POLL_BATCH) break;
  }
  for (int p = 0; p < r->nranks; p++)
    if (p != r->rank && r->peers[p].qp) {
      pump(r, p);
      send_credit(r, p);
    }
  return events > 0;
}

static int rdma_progress(fc_link_t *link) {
  rdma_t *r = link->state;
  fc_progress_thread_used(&r->progress);
  pthread_mutex_lock(&r->lock);
  const int events = progress_locked(r);
  pthread_mutex_unlock(&r->lock);
  return events;
}

static int progress_of(void *arg) { return progress_locked(arg); }

/* Events taken from the channel are acknowledged in one call (libibverbs' destroy_cq waits for
 * every one it handed out). */
static void drain_cq_events(rdma_t *r) {
  struct ibv_cq *cq;
  void *ctx;
  while (r->v->get_cq_event(r->channel, &cq, &ctx) == 0) r->cq_events++;
  if (r->cq_events) r->v->ack_cq_events(r->cq, r->cq_events);
  r->cq_events = 0;
}

/* The parked thread's arm (progress_thread.h): the CQ asks for an event at its next completion,
 * then one more look catches what came before the request; -1 when that look moved something. */
static int arm_of(void *arg) {
  rdma_t *r = arg;
  drain_cq_events(r);
  if (ibv_req_notify_cq(r->cq, 0)) return -1;
  poll_async(r);
  return progress_locked(r) ? -1 : r->wake_fd;
}

/* A completion channel for the CQ and the descriptor a parked thread sleeps on; on any failure
 * none (the thread then naps instead of parking), never an error of the link. */
static void open_channel(rdma_t *r) {
  const fc_verbs_t *v = r->v;
  if (!v->create_comp_channel || !v->destroy_comp_channel || !v->get_cq_event || !v->ack_cq_events) return;
  r->channel = v->create_comp_channel(r->ctx);
  int ok = r->channel != NULL;
  if (ok) {
    const int fl = fcntl(r->channel->fd, F_GETFL);
    ok = fl >= 0 && fcntl(r->channel->fd, F_SETFL, fl | O_NONBLOCK) == 0;
  }
  if (ok) ok = (r->wake_fd = epoll_create1(EPOLL_CLOEXEC)) >= 0;
  struct epoll_event ev = {.events = EPOLLIN};
  if (ok) ok = epoll_ctl(r->wake_fd, EPOLL_CTL_ADD, r->channel->fd, &ev) == 0 &&
               epoll_ctl(r->wake_fd, EPOLL_CTL_ADD, r->ctx->async_fd, &ev) == 0;
  if (ok) return;
  FC_INFO(FC_SUB_NET, "rank %d: rdma rail %d: no completion channel (%s): its progress thread naps instead of parking",
          r->rank, r->rail, strerror(errno));
  if (r->wake_fd >= 0) close(r->wake_fd);
  r->wake_fd = -1;
  if (r->channel) v->destroy_comp_channel(r->channel);
  r->channel = NULL;
}

/* ---- open and close -------------------------------------------------------------------------- */

FC_PARAM_INT(rdma_zcopy_bytes, "RDMA_ZCOPY_BYTES", 256 << 10)
FC_PARAM_INT(rdma_progress_thread, "RDMA_PROGRESS_THREAD", 1)
FC_PARAM_INT(rdma_rcache_bytes, "RDMA_RCACHE_BYTES", 1 << 30)
FC_PARAM_INT(rdma_rcache_pinned, "RDMA_RCACHE_PINNED", 0)


/* Whether the device's registrations can follow the process's page tables for what the rendezvous
 * does with them (on-demand paging for RC: the requester reading a source, the responder taking a
 * write).  Asked through the extended context (ibv_query_device_ex is inline over it, calling an
 * export of libibverbs' this link never links); a provider without one has no such registrations. */
static int device_odp(struct ibv_context *ctx) {
  struct verbs_context *vc = verbs_get_ctx_op(ctx, query_device_ex);
  if (!vc) return 0;
  struct ibv_device_attr_ex ax;
  memset(&ax, 0, sizeof ax);
  if (vc->query_device_ex(ctx, NULL, &ax, sizeof ax)) return 0;
  const uint32_t need = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE;
  return (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) && (ax.odp_caps.per_transport_caps.rc_odp_caps & need) == need;
}

/* The registration cache of user buffers.  A kept registration is only right while the address
 * still maps the pages it was made on: a pinned one outlives a buffer the user unmaps (free of a
 * large block, a shrinking heap, madvise) and maps again at the same address, and would then
 * read or take a peer's write into the old pages, silently.  Watching every unmap needs hooks in
 * the allocator and the system calls (UCX patches them) that a library loaded into any process
 * should not install.  So the cache keeps registrations made with on-demand paging, which the
 * kernel keeps in step with the page tables (a freed and reallocated buffer is served with its new
 * pages), and pinned ones only where FLEXCOLL_RDMA_RCACHE_PINNED=1 says the application never
 * unmaps a buffer it gave flexcoll while the communicator lives (Open MPI's leave_pinned
 * contract).  Otherwise every registration is for its message alone, as before the cache. */
static int rcache_open(rdma_t *r, char *why, size_t len) {
  const size_t bound = (size_t)fc_param_rdma_rcache_bytes();
  const int pinned = fc_param_rdma_rcache_pinned() == 1;
  r->odp = device_odp(r->ctx);
  const size_t keep = r->odp || pinned ? bound : 0;
  /* On-demand paging only where registrations are kept: one made for a single message would make
   * the NIC fault every page in anew, where pinning does it once at registration. */
  r->rcache = fc_rcache_new(r->v, r->pd, keep, r->odp && keep ? IBV_ACCESS_ON_DEMAND : 0);
  /* Device buffers are kept whatever the device pins: their entries know their allocation. */
  r->dcache = fc_rcache_new_device(r->v, r->pd, bound);
  if (!r->rcache || !r->dcache) return snprintf(why, len, "out of memory"), -1;
  FC_INFO(FC_SUB_NET, "rank %d: rdma registration cache %s%zu bytes (%s); device buffers' up to %zu bytes", r->rank,
          keep ? "up to " : "off, ", keep,
          !bound    ? "FLEXCOLL_RDMA_RCACHE_BYTES=0"
          : r->odp  ? "on-demand paging"
          : pinned ? "pinned: FLEXCOLL_RDMA_RCACHE_PINNED=1"
                   : "the device pins registrations and FLEXCOLL_RDMA_RCACHE_PINNED is 0",
          bound);
  return 0;
}

/* This link's device: rail r->rail of the rank's rails (rdma_dev.h: the nearest devices, or those
 * FLEXCOLL_IB_HCA names); opens r->ctx.  0, or -1 with why. */
static int choose_port(rdma_t *r, struct ibv_port_attr *pa, char *why, size_t len) {
  int n = 0;
  errno = 0;
  struct ibv_device **list = r->v->get_device_list(&n);
  if (!list || n <= 0) {
    snprintf(why, len, "no RDMA device (%s: %s)", r->v->path,
             !list && errno ? strerror(errno) : "the device list is empty");
    if (list) r->v->free_device_list(list);
    return -1;
  }
  fc_rdma_cand_t rails[FC_RDMA_MAX_RAILS];
  r->nrails = fc_rdma_rails(r->v, list, n, r->comm->cuda_device, rails, FC_RDMA_MAX_RAILS, why, len);
  for (int k = 0; k < r->nrails; k++) {
    r->alone[k] = rails[k].root[0] != 0;
    for (int j = 0; j < k; j++) r->alone[k] &= strcmp(rails[j].root, rails[k].root) != 0;
  }
  if (r->rail < r->nrails) {
    const fc_rdma_cand_t *c = &rails[r->rail];
    r->ctx = r->v->open_device(list[c->dev]);
    if (!r->ctx) snprintf(why, len, "cannot open RDMA device %s: %s", c->name, strerror(errno));
    else if (r->v->query_port(r->ctx, (uint8_t)c->port, pa) || pa->state != IBV_PORT_ACTIVE) {
      snprintf(why, len, "RDMA device %s port %d is no longer active", c->name, c->port);
      r->v->close_device(r->ctx);
      r->ctx = NULL;
    } else {
      r->port = (uint8_t)c->port;
      const int gpu = r->comm->cuda_device >= 0;
      FC_INFO(FC_SUB_NET, "rank %d: rdma rail %d of %d on %s port %d (%s, MTU %s, %.0f Gb/s; %s %d%s)", r->rank, r->rail,
              r->nrails, c->name, c->port, pa->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
              fc_rdma_mtu_name(pa->active_mtu), fc_rdma_port_gbps(pa), gpu ? "PCI hops from its GPU" : "NUMA node",
              gpu ? c->dist : c->numa, fc_param_str("FLEXCOLL_IB_HCA", NULL) ? ", named by FLEXCOLL_IB_HCA" : "");
    }
  } else if (r->nrails) {
    snprintf(why, len, "rail %d: this rank has %d RDMA device(s) at its nearest", r->rail, r->nrails);
  }
  r->v->free_device_list(list);
  return r->ctx ? 0 : -1;
}

/* This rank's side: device, memory, completion queue, queue pairs in INIT with receives posted. */
static int setup_local(rdma_t *r, conn_hdr_t *me, uint32_t *qpn, char *why, size_t len) {
  r->v = fc_verbs_load(why, len);
  if (!r->v) return -1;
  struct ibv_port_attr pa;
  if (choose_port(r, &pa, why, len)) return -1;
  /* Async events are read in progress(), never waited for. */
  int fl = fcntl(r->ctx->async_fd, F_GETFL);
  if (fl < 0 || fcntl(r->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return snprintf(why, len, "async events: fcntl: %s", strerror(errno)), -1;
  me->lid = pa.lid;
  me->mtu = (uint8_t)pa.active_mtu;
  /* An sge's length is 32 bits; 1 GiB pieces cost nothing against a message's time. */
  r->max_msg = pa.max_msg_sz && pa.max_msg_sz < (1u << 30) ? pa.max_msg_sz : (1u << 30);
  me->global = pa.link_layer == IBV_LINK_LAYER_ETHERNET || pa.lid == 0;
  if (me->global) {
    int type = 0;
    char text[64];
    r->gid_index = fc_rdma_port_gid(r->v, r->ctx, r->ctx->device->ibdev_path, r->port, &pa,
                                    fc_rdma_gid_index_wanted(), &me->gid, &type, why, len);
    if (r->gid_index < 0) return -1;
    fc_rdma_gid_text(&me->gid, text, sizeof text);
    FC_INFO(FC_SUB_NET, "rank %d: rdma rail %d addressed by GID index %d (%s, %s)", r->rank, r->rail, r->gid_index,
            fc_rdma_gid_type_name(type), text);
  }
  struct ibv_device_attr da;
  if (r->v->query_device(r->ctx, &da)) return snprintf(why, len, "ibv_query_device: %s", strerror(errno)), -1;
  int peers = r->nranks - 1;
  /* One rank alone has no queue pair (its messages to itself never reach the NIC): a CQ of one. */
  long cqe = peers ? (long)peers * (r->max_send_wr + r->max_recv_wr) : 1;
  if (cqe > da.max_cqe || peers > da.max_qp || r->max_send_wr > da.max_qp_wr)
    return snprintf(why, len, "the device is too small for %d ranks (%ld CQ entries, %d queue pairs)", r->nranks, cqe,
                    peers), -1;
  r->pd = r->v->alloc_pd(r->ctx);
  if (!r->pd) return snprintf(why, len, "ibv_alloc_pd: %s", strerror(errno)), -1;
  if (rcache_open(r, why, len)) return -1;
  if (fc_param_rdma_progress_thread()) open_channel(r);
  r->cq = r->v->create_cq(r->ctx, (int)cqe, NULL, r->channel, 0);
  if (!r->cq) return snprintf(why, len, "ibv_create_cq(%ld): %s", cqe, strerror(errno)), -1;
  const size_t area = r->area = (size_t)r->nranks * (size_t)r->nslots * SLOT_BYTES;
  if (posix_memalign((void **)&r->ring, 4096, area) || posix_memalign((void **)&r->send, 4096, area)) {
    return snprintf(why, len, "out of memory for %zu bytes of rdma slots", 2 * area), -1;
  }
  memset(r->ring, 0, area);
  r->ring_mr = r->v->reg_mr(r->pd, r->ring, area, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  r->send_mr = r->ring_mr ? r->v->reg_mr(r->pd, r->send, area, IBV_ACCESS_LOCAL_WRITE) : NULL;
  if (!r->send_mr) return snprintf(why, len, "ibv_reg_mr(%zu bytes): %s", area, strerror(errno)), -1;
  me->ring_addr = (uint64_t)(uintptr_t)r->ring;
  me->rkey = r->ring_mr->rkey;
  me->nslots = (uint32_t)r->nslots;
  for (int p = 0; p < r->nranks; p++) {
    if (p == r->rank) continue;
    peer_t *e = &r->peers[p];
    e->slot_req = calloc((size_t)r->nslots, sizeof *e->slot_req);
    e->slot_busy = calloc((size_t)r->nslots, 1);
    if (!e->slot_req || !e->slot_busy) return snprintf(why, len, "out of memory"), -1;
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = r->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = (uint32_t)r->max_send_wr;
    ia.cap.max_recv_wr = (uint32_t)r->max_recv_wr;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    e->qp = r->v->create_qp(r->pd, &ia);
    if (!e->qp) return snprintf(why, len, "ibv_create_qp: %s", strerror(errno)), -1;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = r->port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    int rc = r->v->modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc) return snprintf(why, len, "queue pair to INIT: %s", strerror(rc)), -1;
    /* Receives first: a peer may write as soon as both ends are ready to send. */
    for (int k = 0; k < r->max_recv_wr; k++)
      if (post_recv_wr(r, p)) return snprintf(why, len, "%s", e->why), -1;
    qpn[p] = e->qp->qp_num;
  }
  return 0;
}

/* INIT -> RTR -> RTS toward peer p, whose side is c (its queue pair for this rank: qpn). */
static int connect_peer(rdma_t *r, int p, const conn_hdr_t *me, const conn_hdr_t *c, uint32_t qpn, char *why,
                        size_t len) {
  peer_t *e = &r->peers[p];
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)(c->mtu < me->mtu ? c->mtu : me->mtu);
  a.dest_qp_num = qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = c->lid;
  a.ah_attr.port_num = r->port;
  if (me->global) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = c->gid;
    a.ah_attr.grh.sgid_index = (uint8_t)r->gid_index;
    /* RoCE v2 is routed: a hop limit of 1 would stop it at the first router. */
    a.ah_attr.grh.hop_limit = 255;
  }
  int rc = r->v->modify_qp(e->qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc) return snprintf(why, len, "queue pair to rank %d, RTR: %s", p, strerror(rc)), -1;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;   /* 4.096 us * 2^14: 67 ms per try */
  a.retry_cnt = 7;
  a.rnr_retry = 7;  /* a receiver without a posted receive is waited for: they are reposted at every poll */
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  rc = r->v->modify_qp(e->qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc) return snprintf(why, len, "queue pair to rank %d, RTS: %s", p, strerror(rc)), -1;
  e->raddr = c->ring_addr + (uint64_t)r->rank * (uint64_t)r->nslots * SLOT_BYTES;
  e->rkey = c->rkey;
  return 0;
}

static void rdma_free(rdma_t *r) {
  if (r->peers)
    for (int p = 0; p < r->nranks; p++) {
      peer_t *e = &r->peers[p];
      if (e->qp) r->v->destroy_qp(e->qp);
      /* Requests whose owner let go while their writes were in flight. */
      for (int k = 0; e->slot_req && k < r->nslots; k++) {
        rdma_req_t *q = e->slot_req[k];
        if (!q) continue;
        for (int j = k; j < r->nslots; j++)
          if (e->slot_req[j] == q) e->slot_req[j] = NULL;
        if (q->orphan) free(q);
      }
      /* Rendezvous registrations, now that no queue pair reads or writes them; sends whose owner
       * let go while their writes were in flight. */
      for (rdma_req_t *q = e->zs_head, *n; q; q = n) {
        n = q->znext;
        q->znext = NULL;
        zdereg(r, q, 1);
        if (q->orphan) free(q);
      }
      for (rdma_req_t *q = e->zq_head, *n; q; q = n) {
        n = q->znext;
        q->znext = NULL;
        zdereg(r, q, 1);
      }
      e->zs_head = e->zq_head = NULL;
      while (e->ctl_head) {
        ctl_t *c = e->ctl_head;
        e->ctl_head = c->next;
        free(c);
      }
      while (e->uq_head) unexp_remove(e, e->uq_head);
      free(e->slot_req);
      free(e->slot_busy);
    }
  /* Deregistered only once no queue pair can write into it. */
  if (r->rcache) {
    fc_rcache_stats_t st;
    fc_rcache_stats(r->rcache, &st);
    FC_INFO(FC_SUB_NET, "rank %d: rdma registration cache: %llu hits, %llu misses, %llu evictions", r->rank, st.hits,
            st.misses, st.evictions);
  }
  if (r->dcache) {
    fc_rcache_stats_t st;
    fc_rcache_stats(r->dcache, &st);
    if (st.hits || st.misses)
      FC_INFO(FC_SUB_NET,
              "rank %d: rdma device registration cache: %llu hits, %llu misses, %llu evictions, %llu of freed memory",
              r->rank, st.hits, st.misses, st.evictions, st.stale);
  }
  fc_rcache_free(r->rcache);
  fc_rcache_free(r->dcache);
  if (r->ring_mr) r->v->dereg_mr(r->ring_mr);
  if (r->send_mr) r->v->dereg_mr(r->send_mr);
  if (r->cq && r->channel) drain_cq_events(r);
  if (r->cq) r->v->destroy_cq(r->cq);
  if (r->channel) r->v->destroy_comp_channel(r->channel);
  if (r->wake_fd >= 0) close(r->wake_fd);
  if (r->pd) r->v->dealloc_pd(r->pd);
  if (r->ctx) r->v->close_device(r->ctx);
  if (r->pinned) {
    fc_mem_unpin(r->ring);
    fc_mem_unpin(r->send);
  }
  free(r->ring);
  free(r->send);
  free(r->peers);
  if (r->lock_made) pthread_mutex_destroy(&r->lock);
  free(r);
}

static flexcoll_result_t rdma_open(struct flexcoll_comm *comm, fc_link_t *link, int *usable, char *why, size_t len) {
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_RDMA_RCACHE_BYTES"));
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_RDMA_RCACHE_PINNED"));
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_RDMA_ZCOPY_BYTES"));
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_IB_GID_INDEX"));
  FC_CHECK(fc_param_check(comm, "FLEXCOLL_RDMA_PROGRESS_THREAD"));
  rdma_t *r = calloc(1, sizeof *r);
  if (!r) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  link->state = r;
  /* Device buffers are registered with the NIC (dma-buf, else by address) or copied through the
   * slots on the GPU, wherever flexcoll has CUDA, on a communicator with a GPU (on one without,
   * the flag would keep the pairs' host transfers off the links that cannot take device memory:
   * fc_links_split).  Local: fc_links_open ANDs it over the ranks. */
  link->device_memory = fc_gpu_comm_wants_device(comm);
  r->wake_fd = -1;
  r->lock_made = pthread_mutex_init(&r->lock, NULL) == 0;
  if (!r->lock_made) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "rdma: pthread_mutex_init failed");
  r->comm = comm;
  r->nranks = comm->nranks;
  r->rank = comm->rank;
  r->rail = link->rail;
  /* 16 slots (1 MiB) per peer keep a 1 MiB slice streaming; beyond 16 peers the rings would
   * grow past 16 MiB per rank, so fewer. */
  r->nslots = comm->nranks <= 17 ? 16 : 4;
  /* Data writes in flight are at most nslots (credits); credits at most one per quarter of the
   * ring, four or five in flight; a margin on top. */
  r->max_send_wr = r->max_recv_wr = r->nslots + 8;
  r->zcopy_bytes = (size_t)fc_param_rdma_zcopy_bytes();
  r->peers = calloc((size_t)comm->nranks, sizeof *r->peers);
  /* Each rank's record rounded up to 8 bytes: every header in the gathered array stays aligned. */
  size_t per = (sizeof(conn_hdr_t) + sizeof(uint32_t) * (size_t)comm->nranks + 7) & ~(size_t)7;
  char *all = calloc((size_t)comm->nranks, per);
  if (!r->peers || !all) {
    free(all);
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  }
  conn_hdr_t *me = (conn_hdr_t *)(all + (size_t)comm->rank * per);
  *usable = 0;
  /* Every rank takes part in the exchange, with or without a device. */
  int ok = setup_local(r, me, (uint32_t *)(me + 1), why, len) == 0;
  me->usable = (uint8_t)ok;
  conn_hdr_t mine = *me;
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, all, per);
  /* A rank without a device leaves only its own pairs (pairwise: lib/sched/links.c keeps the
   * link between the others); one that sizes its rings otherwise cannot talk to anyone. */
  for (int q = 0; q < comm->nranks && res == FLEXCOLL_SUCCESS && ok; q++) {
    const conn_hdr_t *c = (const conn_hdr_t *)(all + (size_t)q * per);
    if (!c->usable && q != comm->rank) link->reach[q] = 0;
    if (c->usable && c->nslots != mine.nslots) {
      ok = 0;
      snprintf(why, len, "rank %d sizes its rings otherwise", q);
    }
  }
  for (int q = 0; q < comm->nranks && res == FLEXCOLL_SUCCESS && ok; q++) {
    if (q == comm->rank || !link->reach[q]) continue;
    const conn_hdr_t *c = (const conn_hdr_t *)(all + (size_t)q * per);
    if (connect_peer(r, q, &mine, c, ((const uint32_t *)(c + 1))[comm->rank], why, len)) ok = 0;
  }
  /* The queue pairs toward ranks without a device never leave INIT: gone now, so that nothing
   * (credits, progress) ever looks at them. */
  for (int q = 0; q < comm->nranks && ok; q++)
    if (q != comm->rank && !link->reach[q] && r->peers[q].qp) {
      r->v->destroy_qp(r->peers[q].qp);
      r->peers[q].qp = NULL;
    }
  free(all);
  /* Nobody writes into a queue pair before its peer's is ready to receive. */
  if (res == FLEXCOLL_SUCCESS) res = fc_bootstrap_barrier(comm->bootstrap);
  *usable = ok && res == FLEXCOLL_SUCCESS;
  if (*usable && fc_param_rdma_progress_thread()) {
    const int e = fc_progress_thread_start(&r->progress, "flexcoll-rdma", &r->lock, progress_of,
                                           r->channel ? arm_of : NULL, r);
    if (e) FC_INFO(FC_SUB_NET, "rank %d: rdma progress thread not started (%s): progress in calls only", r->rank, strerror(e));
  }
  return res;
}

/* Never waits on a peer for long: what is in flight gets a bounded time to complete (a peer that
 * has left fails it at once), then the queue pairs go to the error state (flushing the rest) and
 * are destroyed before their memory is deregistered. */
static void rdma_close(struct flexcoll_comm *comm, fc_link_t *link, int force) {
  rdma_t *r = link->state;
  if (!r) return;
  fc_progress_thread_stop(&r->progress);
  if (!force && r->cq && !r->fatal) {
    double bound = comm->timeout_ms > 0 && comm->timeout_ms < 2000 ? comm->timeout_ms : 2000, t0 = fc_now_ms();
    for (;;) {
      int busy = 0;
      for (int p = 0; p < r->nranks; p++) busy |= r->peers[p].qp && !r->peers[p].broken && r->peers[p].wr_out > 0;
      if (!busy || fc_now_ms() - t0 > bound) break;
      if (!rdma_progress(link)) sched_yield();
    }
  }
  for (int p = 0; p < r->nranks && r->peers; p++)
    if (r->peers[p].qp) {
      struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
      r->v->modify_qp(r->peers[p].qp, &a, IBV_QP_STATE);
    }
  rdma_free(r);
  link->state = NULL;
}

/* ---- the table's requests --------------------------------------------------------------------- */

static flexcoll_result_t peer_ok(struct flexcoll_comm *comm, rdma_t *r, int peer, const char *what) {
  if (peer == r->rank) return FLEXCOLL_SUCCESS; /* messages to self never touch the NIC */
  if (peer < 0 || peer >= r->nranks || !r->peers[peer].qp)
    return fc_error(comm, FLEXCOLL_INTERNAL_ERROR, "rdma %s rank %d: no queue pair", what, peer);
  if (r->peers[peer].broken)
    return fc_error(comm, FLEXCOLL_REMOTE_ERROR, "rdma %s rank %d: %s", what, peer, r->peers[peer].why);
  return FLEXCOLL_SUCCESS;
}

/* A message to this rank itself (a batch of send/recv may hold one): copied into the matching
 * receive, or kept as an unexpected message; the send is done either way. */
static flexcoll_result_t send_self(struct flexcoll_comm *comm, rdma_t *r, rdma_req_t *q) {
  peer_t *e = &r->peers[r->rank];
  char why[160];
  q->state = REQ_DONE;
  for (rdma_req_t *w = e->rq_head; w; w = w->next)
    if (w->tag == q->tag) {
      list_remove(&e->rq_head, &e->rq_tail, w);
      if (q->bytes && w->bytes &&
          any_copy(q->dev || w->dev, w->buf, q->buf, q->bytes < w->bytes ? q->bytes : w->bytes, why, sizeof why)) {
        req_fail(w, why);
        return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "rdma: a message to self: %s", why);
      }
      finish_recv(w, q->bytes);
      return FLEXCOLL_SUCCESS;
    }
  unexp_t *u = calloc(1, sizeof *u);
  char *data = u ? malloc(q->bytes ? q->bytes : 1) : NULL;
  if (!data) {
    free(u);
    q->state = REQ_FAILED;
    snprintf(q->why, sizeof q->why, "out of memory for a message to self");
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "rdma: out of memory for a message of %zu bytes to self", q->bytes);
  }
  if (q->bytes && any_copy(q->dev, data, q->buf, q->bytes, why, sizeof why)) {
    free(data);
    free(u);
    q->state = REQ_FAILED;
    snprintf(q->why, sizeof q->why, "%s", why);
    return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "rdma: a message to self: %s", why);
  }
  u->tag = q->tag;
  u->total = u->got = q->bytes;
  u->data = data;
  if (e->uq_tail) e->uq_tail->next = u;
  else e->uq_head = u;
  e->uq_tail = u;
  return FLEXCOLL_SUCCESS;
}

/* Whether a user buffer is device memory (asked of CUDA once per buffer and call, or remembered
 * host pages: fc_mem_type). */
static int is_device(const void *buf, size_t bytes) {
  int device;
  return bytes && fc_mem_type(buf, &device) == FC_MEM_DEVICE;
}

static flexcoll_result_t rdma_isend_locked(struct flexcoll_comm *comm, fc_link_t *link, int peer, const void *buf, size_t bytes,
                                   uint64_t tag, fc_link_req_t *req) {
  rdma_t *r = link->state;
  FC_CHECK(peer_ok(comm, r, peer, "send to"));
  rdma_req_t *q = calloc(1, sizeof *q);
  if (!q) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  q->peer = peer;
  q->tag = tag;
  q->buf = (char *)buf;
  q->bytes = bytes;
  q->dev = is_device(buf, bytes);
  *req = q;
  if (peer == r->rank) {
    flexcoll_result_t res = send_self(comm, r, q);
    if (res != FLEXCOLL_SUCCESS) {
      free(q);
      *req = NULL;
    }
    return res;
  }
  /* The sender alone decides which path a message takes and says so in its first fragment (an
   * RTS instead of data): the receiver need not know the threshold, so ranks whose settings
   * differ still agree, and the RTS travels in the ordered stream of first fragments, so matching
   * (tags in order, the unexpected queue, the length check) is the eager path's.  A receiver that
   * announced its buffer first would save half a round trip, but its announcement would have to
   * be matched against sends on the sender, and one that matched nothing (lengths differ, the
   * receive cancelled) would leave a peer holding the address of a buffer no longer its. */
  if (r->zcopy_bytes && bytes >= r->zcopy_bytes) {
    q->zc = 1;
    q->zkind = FRAG_RTS;
    q->zid = ++r->peers[peer].zid_next;
  }
  list_append(&r->peers[peer].sq_head, &r->peers[peer].sq_tail, q);
  pump(r, peer);
  *req = q;
  return FLEXCOLL_SUCCESS;
}

/* The first unexpected message of tag not yet matched: whole (every fragment in), or NULL. */
static const unexp_t *whole_unexpected(const peer_t *e, uint64_t tag) {
  for (const unexp_t *u = e->uq_head; u; u = u->next)
    if (u->tag == tag && !u->req) return !u->rts && u->got == u->total && u != e->cur_unexp ? u : NULL;
  return NULL;
}

static flexcoll_result_t rdma_irecv_locked(struct flexcoll_comm *comm, fc_link_t *link, int peer, void *buf, size_t bytes,
                                    uint64_t tag, fc_link_req_t *req) {
  rdma_t *r = link->state;
  /* A message that arrived whole before its sender left (or its queue pair broke) is delivered:
   * the sender's send completed, so its data must not be lost; anything else needs the peer. */
  const int left_whole = peer >= 0 && peer < r->nranks && r->peers[peer].qp && r->peers[peer].broken &&
                         whole_unexpected(&r->peers[peer], tag);
  if (!left_whole) FC_CHECK(peer_ok(comm, r, peer, "receive from"));
  peer_t *e = &r->peers[peer];
  rdma_req_t *q = calloc(1, sizeof *q);
  if (!q) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  q->is_recv = 1;
  q->peer = peer;
  q->tag = tag;
  q->buf = buf;
  q->bytes = bytes;
  q->dev = is_device(buf, bytes);
  *req = q;
  for (unexp_t *u = e->uq_head; u; u = u->next) {
    if (u->tag != tag || u->req) continue;
    if (u->rts) {
      rz_match(r, peer, q, u->zid, u->total);
      unexp_remove(e, u);
      pump(r, peer);
    } else if (u->got == u->total && u != e->cur_unexp) {
      char why[160];
      if (u->total && bytes && any_copy(q->dev, buf, u->data, u->total < bytes ? u->total : bytes, why, sizeof why)) {
        *req = NULL;
        free(q);
        return fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "rdma: a receive from rank %d: %s", peer, why);
      }
      finish_recv(q, u->total);
      unexp_remove(e, u);
    } else {
      u->req = q;
      q->from = u;
    }
    return FLEXCOLL_SUCCESS;
  }
  list_append(&e->rq_head, &e->rq_tail, q);
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t rdma_test_locked(struct flexcoll_comm *comm, fc_link_t *link, fc_link_req_t *req, size_t expect,
                                   int *done) {
  rdma_t *r = link->state;
  rdma_req_t *q = *req;
  *done = 1;
  if (!q) return FLEXCOLL_SUCCESS;
  if (q->state == REQ_PENDING) {
    *done = 0;
    return FLEXCOLL_SUCCESS;
  }
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (q->state == REQ_FAILED)
    res = fc_error(comm, FLEXCOLL_REMOTE_ERROR, "rdma %s %s rank %d failed: %s", q->is_recv ? "receive" : "send",
                   q->is_recv ? "from" : "to", q->peer, q->why);
  else if (q->is_recv && expect != SIZE_MAX && q->total != expect)
    res = fc_error(comm, FLEXCOLL_INVALID_USAGE,
                   "a peer sent %zu bytes where this rank expects %zu: the ranks called different collectives or counts",
                   q->total, expect);
  req_detach(r, q);
  req_release(q);
  *req = NULL;
  return res;
}

static void rdma_cancel_locked(fc_link_t *link, fc_link_req_t *req) {
  rdma_t *r = link->state;
  rdma_req_t *q = *req;
  if (!q) return;
  req_detach(r, q);
  req_release(q);
  *req = NULL;
}

/* The table's entry points: each under the link's lock (the progress thread shares the state). */
static flexcoll_result_t rdma_isend(struct flexcoll_comm *comm, fc_link_t *link, int peer, const void *buf, size_t bytes,
                                   uint64_t tag, fc_link_req_t *req) {
  rdma_t *r = link->state;
  fc_progress_thread_used(&r->progress);
  pthread_mutex_lock(&r->lock);
  flexcoll_result_t res = rdma_isend_locked(comm, link, peer, buf, bytes, tag, req);
  pthread_mutex_unlock(&r->lock);
  return res;
}

static flexcoll_result_t rdma_irecv(struct flexcoll_comm *comm, fc_link_t *link, int peer, void *buf, size_t bytes,
                                    uint64_t tag, fc_link_req_t *req) {
  rdma_t *r = link->state;
  fc_progress_thread_used(&r->progress);
  pthread_mutex_lock(&r->lock);
  flexcoll_result_t res = rdma_irecv_locked(comm, link, peer, buf, bytes, tag, req);
  pthread_mutex_unlock(&r->lock);
  return res;
}

static flexcoll_result_t rdma_test(struct flexcoll_comm *comm, fc_link_t *link, fc_link_req_t *req, size_t expect,
                                   int *done) {
  rdma_t *r = link->state;
  fc_progress_thread_used(&r->progress);
  pthread_mutex_lock(&r->lock);
  flexcoll_result_t res = rdma_test_locked(comm, link, req, expect, done);
  pthread_mutex_unlock(&r->lock);
  return res;
}

static void rdma_cancel(fc_link_t *link, fc_link_req_t *req) {
  rdma_t *r = link->state;
  fc_progress_thread_used(&r->progress);
  pthread_mutex_lock(&r->lock);
  rdma_cancel_locked(link, req);
  pthread_mutex_unlock(&r->lock);
}

static int rdma_rails(fc_link_t *link, unsigned char *alone, int max) {
  rdma_t *r = link->state;
  int n = r->nrails < max ? r->nrails : max;
  for (int k = 0; k < n; k++) alone[k] = r->alone[k];
  return n;
}

static int count_reqs(const rdma_req_t *q, int zlist) {
  int n = 0;
  for (; q; q = zlist ? q->znext : q->next) n++;
  return n;
}

/* Device bytes meet the slots on every eager message and every message the NIC cannot take
 * from device memory: pinned, each such copy is one DMA instead of a copy through fc_mem_copy's
 * bounce buffer and a memcpy.  device: unused (pinned memory serves every device). */
static int rdma_prepare_device(fc_link_t *link, int device, char *why, size_t len) {
  (void)device;
  rdma_t *r = link->state;
  if (!r) return snprintf(why, len, "the link is off on this rank"), -1;
  pthread_mutex_lock(&r->lock);
  int rc = 0;
  if (!r->pinned) {
    rc = fc_mem_pin(r->ring, r->area, why, len);
    if (!rc && fc_mem_pin(r->send, r->area, why, len)) {
      fc_mem_unpin(r->ring);
      rc = -1;
    }
    r->pinned = !rc;
    if (!rc)
      FC_INFO(FC_SUB_NET, "rank %d: rdma: slots pinned for device copies (2 x %zu bytes)", r->rank, r->area);
  }
  pthread_mutex_unlock(&r->lock);
  return rc;
}

/* Sends and receives queued, fragments and credits in flight, the message arriving now and the
 * unexpected ones: where a stalled message stands on this side. */
static void rdma_describe(fc_link_t *link, int peer, char *buf, size_t len) {
  rdma_t *r = link->state;
  if (!r || peer < 0 || peer >= r->nranks || peer == r->rank) {
    snprintf(buf, len, "no such peer");
    return;
  }
  pthread_mutex_lock(&r->lock);
  const peer_t *e = &r->peers[peer];
  int unexp = 0, unexp_whole = 0;
  for (const unexp_t *u = e->uq_head; u; u = u->next) unexp++, unexp_whole += !u->rts && u->got == u->total;
  int busy = 0;
  for (int k = 0; k < r->nslots; k++) busy += e->slot_busy ? e->slot_busy[k] : 0;
  const rdma_req_t *s = e->sq_head;
  snprintf(buf, len,
           "rdma to rank %d: %s; fragments written %llu, credited %llu, slots busy %d, work requests out %d "
           "of %d; sends queued %d (first: tag %#llx, %zu of %zu bytes posted, %s); rendezvous sends %d, "
           "receives %d, controls %s; receives posted %d; consumed %llu (credit told %llu); arriving %s "
           "(tag %#llx, %zu of %zu); unexpected %d (%d whole); progress calls %llu",
           peer, e->broken ? e->why : "connected", (unsigned long long)e->sent,
           (unsigned long long)e->credited, busy, e->wr_out, r->max_send_wr, count_reqs(e->sq_head, 0),
           s ? (unsigned long long)s->tag : 0ull, s ? s->posted : 0, s ? s->bytes : 0,
           !s ? "-" : s->zc ? "rendezvous" : "eager", count_reqs(e->zs_head, 1), count_reqs(e->zq_head, 1),
           e->ctl_head ? "queued" : "none", count_reqs(e->rq_head, 0), (unsigned long long)e->consumed,
           (unsigned long long)e->credit_sent, !e->cur_open ? "nothing" : e->cur_req ? "into a receive" : "unexpected",
           (unsigned long long)e->cur_tag, e->cur_got, e->cur_total, unexp, unexp_whole,
           (unsigned long long)r->progress_calls);
  pthread_mutex_unlock(&r->lock);
}

/* Between hosts as within one (a NIC reaches any port of the fabric). */
const fc_link_ops_t fc_link_rdma = {"rdma",      rdma_open,   rdma_close, rdma_isend, rdma_irecv, rdma_progress,
                                    rdma_test,   rdma_cancel, 0,          0,          rdma_rails,
                                    1,           rdma_describe, rdma_prepare_device};

#else /* !HAVE_VERBS_H */

/* Built without <infiniband/verbs.h>: the link exists by name and is absent everywhere. */
static const char *no_header = "built without infiniband/verbs.h (install libibverbs-dev and reconfigure)";

void fc_rdma_report(FILE *out) { fprintf(out, "RDMA devices: none (%s)\n", no_header); }

static flexcoll_result_t rdma_open(struct flexcoll_comm *comm, fc_link_t *link, int *usable, char *why, size_t len) {
  (void)comm;
  link->state = NULL;
  *usable = 0;
  snprintf(why, len, "%s", no_header);
  return FLEXCOLL_SUCCESS;
}
static void rdma_close(struct flexcoll_comm *comm, fc_link_t *link, int force) { (void)comm, (void)link, (void)force; }

const fc_link_ops_t fc_link_rdma = {"rdma", rdma_open, rdma_close, NULL, NULL, NULL, NULL, NULL, 0, 0, NULL, 0, NULL, NULL};

#endif
