/* fake_verbs.c — a verbs provider for the tests: the ibv_* functions the rdma link uses, moving
 * bytes between processes (and threads) of one host through shared memory.
 *
 * Loaded by the rdma link where FLEXCOLL_VERBS_PROVIDER=fake (from FLEXCOLL_VERBS_FAKE_LIB), never
 * by the library otherwise.  Each opened device context is one RoCE-like port: its GID names the
 * process and the context, and its "wire" is an inbox in POSIX shared memory (/fcfv-PID-N) that
 * other contexts append messages to under a process-shared robust mutex.  An RDMA write is a
 * message to the target context; the target applies it when it polls a CQ (checks the rkey and
 * the range, writes the bytes into its registered memory, consumes a posted receive for an
 * immediate, makes the receive completion) and answers with an acknowledgement, which makes the
 * sender's completion — RC semantics: a send completes once the responder took it.
 *
 * Modelled because it bites in real verbs: the QP state machine (RESET, INIT, RTR, RTS, ERR; other
 * transitions and missing attributes are EINVAL; posting in the wrong state is EINVAL), lkey and
 * rkey checks (LOC_PROT_ERR, REM_ACCESS_ERR), queue depths (ENOMEM beyond max_send_wr /
 * max_recv_wr), CQ overrun (an IBV_EVENT_CQ_ERR async event, completions lost), RNR (a write with
 * immediate waits for a posted receive, rnr_retry 7 forever, else RNR_RETRY_EXC_ERR), a target
 * that is gone (RETRY_EXC_ERR), completions of different QPs in varying order, error flushes (WR_FLUSH_ERR for everything outstanding once a QP
 * is in ERR), destroy order (a CQ or PD still in use is EBUSY).
 *
 * FLEXCOLL_VERBS_FAKE_FAULT (comma list, read at the first device list of the process):
 *   post:N   the Nth ibv_post_send of the process fails (EIO)
 *   drop:N   the Nth arrival of data (a write with immediate of one byte or more landing here)
 *            vanishes, which only a timeout finds.  Not any completion: whether the Nth of those
 *            was a send's or a zero-length credit's (whose loss a later one makes good) would
 *            depend on timing
 *   kill:N   at the Nth ibv_post_send the QP goes to ERR (flush) with an IBV_EVENT_QP_FATAL
 *   delay:MS every send work request starts MS milliseconds after it was posted
 *   portdown:N at the Nth ibv_post_send the port goes down: IBV_EVENT_PORT_ERR, and every QP of
 *            the context fails (RETRY_EXC_ERR, then flushes), as when the link drops
 *   nodev    no device at all (ibv_get_device_list gives NULL, ENOSYS)
 *   nodev@R  the same in test rank R's process only (FC_TEST_RANK, which tests/harness.c sets)
 *   fewer@R:M test rank R's process lists only the first M devices (FLEXCOLL_VERBS_FAKE_DEVICES)
 *   NAME@R:N post, drop, kill, delay, portdown or regfail in test rank R's process only
 *   regfail:N every Nth ibv_reg_mr of the process fails (ENOMEM), as when pinned memory runs out
 *   oldkernel a kernel before 5.13: ibv_is_fork_initialized says IBV_FORK_DISABLED until
 *            ibv_fork_init (else IBV_FORK_UNNEEDED); fake_verbs_fork_stats() counts the calls and
 *            the registrations made before one
 *   nodmabuf ibv_reg_dmabuf_mr fails (EOPNOTSUPP), as a NIC driver without dma-buf support
 *   peermem  ibv_reg_mr takes device memory (nvidia-peermem loaded); without it, EFAULT
 *
 * FLEXCOLL_VERBS_FAKE_STALL_MS=N (a debugging aid, off by default): a write that has waited N ms
 * (not yet on the wire, or on it without an answer) or an arrival waiting N ms for a posted
 * receive is told on stderr once, with the queue pair's queues and the target inbox's fill, so
 * that a stall above the fake can be told from one inside it.
 *
 * GPU memory (GPUDirect RDMA): ibv_reg_dmabuf_mr takes a dma-buf descriptor (checked to be one)
 * and iova = the device address, as callers pass it; the "NIC" then reads and writes that MR
 * through the CUDA driver (libcuda, loaded at the first registration that needs it), with the
 * pointer's own context (its device's primary context for memory of no context, a pool's).
 * fake_verbs_dev_stats() counts registrations through dma-buf and by address (peermem).
 *
 * The port's largest message is FV_MAX_MSG (a longer write fails with LOC_LEN_ERR), well under an
 * inbox, so that a rendezvous's long writes are cut as on a NIC and still fit the wire.
 * fake_verbs_mr_stats() says how many memory regions this process has registered in all and how
 * many are registered now (the tests' leak check), and how many plain RDMA WRITEs it posted.
 *
 * Completion channels (ibv_create_comp_channel, ibv_req_notify_cq, ibv_get_cq_event, ibv_ack_cq_events):
 * a channel's descriptor is the read end of a FIFO beside its context's inbox
 * (fcfv-PID-N.wake in the wire, one channel per context); whoever appends to an inbox whose context has
 * an armed CQ writes a byte into it, as a NIC raises a completion event.  This "NIC" moves only
 * when its process polls, so arming a CQ of a context that still has work of its own (arrivals not
 * taken, acknowledgements or writes not yet pushed) raises the event at once.  A CQ with events not
 * acknowledged cannot be destroyed (EBUSY: libibverbs would wait for them for ever).
 *
 * The wire is the directory FLEXCOLL_VERBS_FAKE_WIRE (default /dev/shm): ranks in "hosts" with
 * a private /dev/shm each (tests/test_hosts.sh) share one elsewhere, as hosts share a network.
 *
 * Callers pass a whole struct ibv_port_attr to ibv_query_port (the rdma link does).  Inboxes of
 * processes that died without closing their device are unlinked at the next ibv_open_device. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define FV_EXPORT __attribute__((visibility("default")))
#define FV_BOX_BYTES (8u << 20)
#define FV_BOX_MAGIC 0xfcfe0001u
#define FV_MAX_BOXES 64
#define FV_MAX_EVENTS 64
#define FV_MAX_MSG (1u << 20)
#define FV_MAX_DEVICES 8

/* ---- faults ------------------------------------------------------------------------------------ */

static struct {
  long post_fail, drop, kill, delay_ms, portdown, regfail;
  int nodev, noodp, pinned, oldkernel, nodmabuf, peermem, bad;
  int fewer; /* > 0: this process lists only its first `fewer` devices (fewer@R:M) */
} fault;
static atomic_long posts, completions, mrs_ever, mrs_now, plain_writes, regs_tried, fork_inits, unsafe_regs;
static atomic_long dmabuf_regs, peermem_regs;

/* Registrations of this process: in all, and now; RDMA WRITEs without immediate it posted. */
FV_EXPORT void fake_verbs_mr_stats(long *ever, long *now, long *plain) {
  *ever = atomic_load(&mrs_ever);
  *now = atomic_load(&mrs_now);
  *plain = atomic_load(&plain_writes);
}
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

/* Device memory registered in this process: through dma-buf, and by address (peermem). */
FV_EXPORT void fake_verbs_dev_stats(long *dmabuf, long *peermem) {
  *dmabuf = atomic_load(&dmabuf_regs);
  *peermem = atomic_load(&peermem_regs);
}

/* ---- GPU memory through the CUDA driver (dlopen: the fake builds and runs without CUDA) ------- */

typedef int (*cu_attr_fn)(void *data, int attribute, unsigned long long ptr);
typedef int (*cu_copy_fn)(unsigned long long dst, unsigned long long src, size_t bytes, void *stream);
typedef int (*cu_stream_new_fn)(void **stream, unsigned flags);
typedef int (*cu_stream_sync_fn)(void *stream);
typedef int (*cu_ctx_fn)(void *ctx);
typedef int (*cu_pop_fn)(void **ctx);
typedef int (*cu_primary_fn)(void **ctx, int dev);
typedef int (*cu_device_fn)(int *dev, int ordinal);
typedef int (*cu_host_alloc_fn)(void **p, size_t bytes, unsigned flags);
static struct {
  cu_attr_fn attr;
  cu_copy_fn copy;
  cu_stream_new_fn stream_new;
  cu_stream_sync_fn stream_sync;
  cu_ctx_fn push;
  cu_pop_fn pop;
  cu_primary_fn primary;
  cu_device_fn device;
  cu_host_alloc_fn host_alloc;
} cu;
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;
/* CUDA's values (cuda.h), which this file does not include. */
#define FV_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define FV_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define FV_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define FV_CU_MEMORYTYPE_DEVICE 2
#define FV_CU_STREAM_NON_BLOCKING 1
#define FV_CU_MEMHOSTALLOC_PORTABLE 1

/* Asked again until the process has loaded CUDA: before that no pointer is device memory. */
static void cu_load(void) {
  pthread_mutex_lock(&cu_lock);
  void *h = cu.attr ? NULL : dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (h) {
    cu.copy = (cu_copy_fn)dlsym(h, "cuMemcpyAsync");
    cu.stream_new = (cu_stream_new_fn)dlsym(h, "cuStreamCreate");
    cu.stream_sync = (cu_stream_sync_fn)dlsym(h, "cuStreamSynchronize");
    cu.push = (cu_ctx_fn)dlsym(h, "cuCtxPushCurrent_v2");
    cu.pop = (cu_pop_fn)dlsym(h, "cuCtxPopCurrent_v2");
    cu.primary = (cu_primary_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
    cu.device = (cu_device_fn)dlsym(h, "cuDeviceGet");
    cu.attr = (cu_attr_fn)dlsym(h, "cuPointerGetAttribute");
    cu.host_alloc = (cu_host_alloc_fn)dlsym(h, "cuMemHostAlloc");
    if (!cu.attr || !cu.copy || !cu.push || !cu.pop || !cu.primary || !cu.device || !cu.stream_new ||
        !cu.stream_sync)
      memset(&cu, 0, sizeof cu);
  }
  pthread_mutex_unlock(&cu_lock);
}

/* Whether addr is GPU memory (a context to copy it in, never NULL, in *ctx).  Memory that
 * belongs to no context (a pool's, cudaMallocAsync; the virtual memory API's) has a NULL context
 * attribute: its device's primary context copies it (a NIC reaches it all the same). */
static int is_gpu(const void *addr, void **ctx) {
  if (!cu.attr) cu_load();
  unsigned type = 0;
  const unsigned long long p = (unsigned long long)(uintptr_t)addr;
  if (!cu.attr || cu.attr(&type, FV_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != 0 || type != FV_CU_MEMORYTYPE_DEVICE)
    return 0;
  *ctx = NULL;
  if (cu.attr(ctx, FV_CU_POINTER_ATTRIBUTE_CONTEXT, p) == 0 && *ctx) return 1;
  int ordinal = -1, dev = -1;
  /* The retained context is kept for the process, as the CUDA runtime keeps its own. */
  return cu.attr(&ordinal, FV_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == 0 && cu.device(&dev, ordinal) == 0 &&
         cu.primary(ctx, dev) == 0 && *ctx;
}

/* A non-blocking stream of ctx (current) for the "NIC's" copies, made once per context. */
static void *copy_stream(void *ctx) {
  static struct {
    void *ctx, *stream;
  } made[16];
  void *st = NULL;
  pthread_mutex_lock(&cu_lock);
  int i = 0;
  while (i < 16 && made[i].ctx && made[i].ctx != ctx) i++;
  if (i < 16 && made[i].ctx == ctx) st = made[i].stream;
  else if (i < 16 && cu.stream_new(&st, FV_CU_STREAM_NON_BLOCKING) == 0) made[i].ctx = ctx, made[i].stream = st;
  pthread_mutex_unlock(&cu_lock);
  return st;
}

/* The "NIC's" pinned bounce buffer (FV_MAX_MSG bytes, under bounce_lock): its copies never take
 * the driver's path for pageable memory, whose staging the process's streams share, so that a
 * "DMA" never waits behind an application's pageable copy queued behind a kernel that waits for
 * this very write (a NIC touches no CUDA stream at all).  Made at ibv_open_device where the
 * process has CUDA up (before a communicator's kernels run: allocating pinned memory may wait
 * for the device), else at the first copy. */
static pthread_mutex_t bounce_lock = PTHREAD_MUTEX_INITIALIZER;
static char *gpu_bounce;

/* The bounce buffer, made if it is not yet (bounce_lock held, a context current); NULL without
 * cuMemHostAlloc or pinned memory. */
static char *bounce_locked(void) {
  void *p = NULL;
  if (!gpu_bounce && cu.host_alloc && cu.host_alloc(&p, FV_MAX_MSG, FV_CU_MEMHOSTALLOC_PORTABLE) == 0) gpu_bounce = p;
  return gpu_bounce;
}

/* The "NIC's" DMA into or out of GPU memory (gpu: the side that is, dst or src): a copy in the
 * memory's own context, through the pinned bounce buffer, landed when this returns, as a NIC's
 * completion says the data is in memory.  0 on success.  Memory freed since its registration
 * fails the access (-1): the driver would take an address it no longer knows for host memory
 * and copy through it, where a NIC's access to a registration whose memory went away faults
 * instead. */
static int gpu_copy(void *ctx, void *dst, const void *src, size_t n, const void *gpu) {
  void *old = NULL, *now = NULL;
  if (!n) return 0;
  if (!is_gpu(gpu, &now) || !is_gpu((const char *)gpu + n - 1, &now)) return -1;
  if (cu.push(ctx)) return -1;
  void *st = copy_stream(ctx);
  const int to_gpu = gpu == dst;
  int rc = !st;
  pthread_mutex_lock(&bounce_lock);
  /* Without a bounce buffer (no cuMemHostAlloc): straight, through the driver's staging. */
  char *b = bounce_locked();
  for (size_t at = 0; !rc && at < n; at += FV_MAX_MSG) {
    const size_t k = n - at < FV_MAX_MSG ? n - at : FV_MAX_MSG;
    if (b && to_gpu) memcpy(b, (const char *)src + at, k);
    const void *from = b && to_gpu ? b : (const char *)src + at;
    void *into = b && !to_gpu ? b : (char *)dst + at;
    rc = cu.copy((unsigned long long)(uintptr_t)into, (unsigned long long)(uintptr_t)from, k, st) || cu.stream_sync(st);
    if (!rc && b && !to_gpu) memcpy((char *)dst + at, b, k);
  }
  pthread_mutex_unlock(&bounce_lock);
  cu.pop(&old);
  return rc ? -1 : 0;
}

static int parse_devices(void);

/* Whether this process is test rank r (FC_TEST_RANK, which tests/harness.c sets). */
static int this_test_rank(int r) {
  const char *me = getenv("FC_TEST_RANK");
  return me && *me && atoi(me) == r;
}

/* Fork safety (oldkernel): ibv_fork_init calls, and registrations made on the "old kernel"
 * before it, which a fork() would leave unsafe. */
FV_EXPORT void fake_verbs_fork_stats(long *inits, long *unsafe) {
  *inits = atomic_load(&fork_inits);
  *unsafe = atomic_load(&unsafe_regs);
}

static void parse_faults(void) {
  const char *s = getenv("FLEXCOLL_VERBS_FAKE_FAULT");
  if (!s || !*s) s = "";
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(t, ':'), *end = NULL;
    long v = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!strcmp(t, "nodev")) { fault.nodev = 1; continue; }
    if (!strncmp(t, "nodev@", 6)) { /* nodev@R: only in test rank R's process */
      int rank = -1, used = 0;
      if (sscanf(t + 6, "%d%n", &rank, &used) != 1 || t[6 + used]) fault.bad = 1;
      else if (this_test_rank(rank)) fault.nodev = 1;
      continue;
    }
    if (!strncmp(t, "fewer@", 6)) { /* fewer@R:M: test rank R's process lists M devices */
      int rank = -1, m = 0;
      if (sscanf(t + 6, "%d:%d", &rank, &m) != 2 || m < 1) fault.bad = 1;
      else if (this_test_rank(rank)) fault.fewer = m;
      continue;
    }
    if (!strcmp(t, "noodp")) { fault.noodp = 1; continue; }
    if (!strcmp(t, "pinned")) { fault.pinned = 1; continue; }
    if (!strcmp(t, "oldkernel")) { fault.oldkernel = 1; continue; }
    if (!strcmp(t, "nodmabuf")) { fault.nodmabuf = 1; continue; }
    if (!strcmp(t, "peermem")) { fault.peermem = 1; continue; }
    if (!colon || end == colon + 1 || *end || v <= 0) { fault.bad = 1; continue; }
    *colon = 0;
    char *at = strchr(t, '@'); /* NAME@R:N: in test rank R's process only */
    if (at) {
      int rank = -1, used = 0;
      if (sscanf(at + 1, "%d%n", &rank, &used) != 1 || at[1 + used]) { fault.bad = 1; continue; }
      if (!this_test_rank(rank)) continue;
      *at = 0;
    }
    if (!strcmp(t, "post")) fault.post_fail = v;
    else if (!strcmp(t, "drop")) fault.drop = v;
    else if (!strcmp(t, "kill")) fault.kill = v;
    else if (!strcmp(t, "delay")) fault.delay_ms = v;
    else if (!strcmp(t, "portdown")) fault.portdown = v;
    else if (!strcmp(t, "regfail")) fault.regfail = v;
    else fault.bad = 1;
  }
  if (parse_devices()) {
    fault.bad = 1;
    fprintf(stderr,
            "fake verbs: FLEXCOLL_VERBS_FAKE_DEVICES=%s FLEXCOLL_VERBS_FAKE_PLACES=%s: not 1 to %d devices, each place "
            "node[:root port]\n",
            getenv("FLEXCOLL_VERBS_FAKE_DEVICES"), getenv("FLEXCOLL_VERBS_FAKE_PLACES"), FV_MAX_DEVICES);
  }
  if (fault.bad) fprintf(stderr, "fake verbs: FLEXCOLL_VERBS_FAKE_FAULT=%s: not post:N, drop:N, kill:N, delay:MS, portdown:N, regfail:N (each also NAME@R:N), nodev, nodev@R, fewer@R:M, noodp, pinned, oldkernel, nodmabuf, peermem\n", s);
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ---- the wire: one inbox per context ------------------------------------------------------------ */

typedef struct {
  pthread_mutex_t lock;
  uint32_t magic;
  atomic_int closed;
  atomic_int armed;    /* a CQ of the owner is armed: the next push writes a byte to wake_path */
  char wake_path[256];  /* the owner's completion channel (a FIFO), or empty */
  pid_t pid;
  uint64_t head, tail, cap;
  char data[];
} fv_box_t;

enum { FV_WRITE = 1, FV_ACK = 2 };

typedef struct {
  uint32_t bytes; /* header and payload, rounded up to 8 */
  uint32_t kind;
  uint32_t dst_qpn, src_qpn;
  union ibv_gid src_gid;
  uint64_t seq, raddr;
  uint32_t rkey, imm, has_imm, status, len;
  uint32_t rnr_retry; /* the requester's: how long the responder may keep it waiting */
} fv_msg_t;

/* 0 with the lock held; -1 where the lock cannot be had any more (ENOTRECOVERABLE).
 * A process that died holding the lock leaves it to the next one, consistent (the ring's head
 * and tail move only after a whole message is copied). The kernel's wake for a dead owner can
 * be lost (a survivor slept forever in one CI run, and woke as soon as a debugger attached), so
 * the wait is a series of short timed waits, each of which looks at the lock word again. */
static int box_lock(fv_box_t *b) {
  for (;;) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 20L * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec += 1;
      until.tv_nsec -= 1000000000L;
    }
    const int rc = pthread_mutex_timedlock(&b->lock, &until);
    if (rc == 0) return 0;
    if (rc == EOWNERDEAD) return pthread_mutex_consistent(&b->lock) == 0 ? 0 : -1;
    if (rc != ETIMEDOUT) return -1;
  }
}

static void ring_copy_in(fv_box_t *b, uint64_t at, const void *src, size_t n) {
  size_t off = (size_t)(at % b->cap), first = b->cap - off < n ? b->cap - off : n;
  memcpy(b->data + off, src, first);
  memcpy(b->data, (const char *)src + first, n - first);
}

static void ring_copy_out(fv_box_t *b, uint64_t at, void *dst, size_t n) {
  size_t off = (size_t)(at % b->cap), first = b->cap - off < n ? b->cap - off : n;
  memcpy(dst, b->data + off, first);
  memcpy((char *)dst + first, b->data, n - first);
}

/* The owner of b armed a CQ: one byte into its channel says something came. */
static void box_wake(fv_box_t *b) {
  if (!atomic_exchange(&b->armed, 0)) return;
  const int fd = open(b->wake_path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return; /* its channel is gone: nobody waits */
  if (write(fd, "", 1) < 0) { /* full: it has bytes to read already */ }
  close(fd);
}

/* 0, or -1 when the inbox has no room now (the caller retries later, as a NIC would). */
static int box_push(fv_box_t *b, fv_msg_t *m, const void *payload) {
  m->bytes = (uint32_t)((sizeof *m + m->len + 7) & ~(size_t)7);
  if (box_lock(b) != 0) return -1;
  int ok = b->cap - (b->head - b->tail) >= m->bytes;
  if (ok) {
    ring_copy_in(b, b->head, m, sizeof *m);
    if (m->len) ring_copy_in(b, b->head + sizeof *m, payload, m->len);
    b->head += m->bytes;
  }
  pthread_mutex_unlock(&b->lock);
  if (ok) box_wake(b);
  return ok ? 0 : -1;
}

/* The next message, payload in *payload (malloc'ed); 0 when there is none. */
static int box_pop(fv_box_t *b, fv_msg_t *m, char **payload) {
  *payload = NULL;
  if (box_lock(b) != 0) return 0;
  int have = b->head != b->tail;
  if (have) {
    ring_copy_out(b, b->tail, m, sizeof *m);
    *payload = malloc(m->len ? m->len : 1);
    if (*payload && m->len) ring_copy_out(b, b->tail + sizeof *m, *payload, m->len);
    if (*payload) b->tail += m->bytes;
    else have = 0;
  }
  pthread_mutex_unlock(&b->lock);
  return have;
}

static const char *wire_dir(void) {
  const char *d = getenv("FLEXCOLL_VERBS_FAKE_WIRE");
  return d && *d ? d : "/dev/shm";
}

/* The path of the inbox of the context whose GID is g: the wire's fcfv-PID-N. */
static void box_name(char *buf, size_t n, const union ibv_gid *g) {
  uint32_t pid, serial;
  memcpy(&pid, g->raw + 8, 4);
  memcpy(&serial, g->raw + 12, 4);
  snprintf(buf, n, "%s/fcfv-%u-%u", wire_dir(), ntohl(pid), ntohl(serial));
}

/* ---- objects ------------------------------------------------------------------------------------- */

typedef struct fv_ctx fv_ctx_t;

typedef struct {
  uint64_t wr_id, seq, raddr;
  double start;
  uint32_t imm, rkey, len, lkey;
  uint64_t laddr;
  int signaled, has_imm, pushed;
  double pushed_at; /* when it went onto the wire (FLEXCOLL_VERBS_FAKE_STALL_MS) */
} fv_swr_t;

typedef struct fv_in {
  fv_msg_t m;
  double arrived;
  char *data;
  struct fv_in *next;
} fv_in_t;

typedef struct fv_qp {
  struct ibv_qp qp;
  fv_ctx_t *ctx;
  int max_send, max_recv, access, rnr_retry;
  fv_swr_t *sq;
  int sq_head, sq_n;
  uint64_t *rq;
  int rq_head, rq_n;
  uint64_t next_seq;
  union ibv_gid dgid;
  uint32_t dqpn;
  fv_box_t *rbox;
  int rbox_failed;
  double rnr_since, next_alive_check, gone_since;
  fv_in_t *in_head, *in_tail;
  uint64_t stall_told; /* 1 + the seq of the last write told stalled; arrivals: the same, their seq */
  uint64_t stall_in_told;
  struct fv_qp *next;
} fv_qp_t;

/* The pinned model's "physical pages": a memfd that the registered range is remapped onto, and the
 * fake's own mapping of it, through which the fake reads and writes that MR's memory. */
typedef struct fv_frame {
  uintptr_t lo, hi;
  char *view;
  int refs;
  struct fv_frame *next;
} fv_frame_t;

typedef struct fv_mr {
  struct ibv_mr mr;
  int access;
  fv_frame_t *frame; /* pinned model: the pages it holds (NULL: it follows the address space) */
  void *gpu_ctx;     /* GPU memory (dma-buf or peermem): a CUDA context to copy it in (is_gpu); NULL: host */
  char *view;        /* the frame's bytes at mr.addr */
  struct fv_mr *next;
} fv_mr_t;

/* Where the "NIC" reads or writes addr of m: the pages it pinned, or the address itself (a
 * registration with on-demand paging follows the page tables, as the kernel keeps it). */
static char *mr_at(const fv_mr_t *m, uint64_t addr) {
  if (!m->view) return (char *)(uintptr_t)addr;
  return m->view + (addr - (uint64_t)(uintptr_t)m->mr.addr);
}

typedef struct {
  struct ibv_cq cq;
  struct ibv_wc *ring;
  int cap, head, n, overrun;
  int armed;                    /* ibv_req_notify_cq since its last event */
  unsigned long events, acked;  /* events handed out by ibv_get_cq_event, acknowledged */
} fv_cq_t;

#define FV_CHANNEL_CQS 8
typedef struct {
  struct ibv_comp_channel ch;
  fv_cq_t *cqs[FV_CHANNEL_CQS];
  int ncqs;
  char path[256];
} fv_channel_t;

typedef struct fv_ack {
  fv_msg_t m;
  fv_box_t *to;
  struct fv_ack *next;
} fv_ack_t;

struct fv_ctx {
  /* Extended, as libibverbs' contexts are: ibv_query_device_ex (the ODP capabilities) goes
   * through it.  Its ibv_context is its last member. */
  struct verbs_context vctx;
  int devno;
  union ibv_gid gid;
  char name[224]; /* the inbox: its path in the wire */
  fv_box_t *box;
  fv_qp_t *qps;
  fv_mr_t *mrs;
  int npds, ncqs;
  uint32_t next_qpn, next_key;
  struct {
    union ibv_gid gid;
    fv_box_t *box;
  } boxes[FV_MAX_BOXES];
  int nboxes;
  fv_ack_t *acks_head, *acks_tail;
  double acks_since; /* the first acknowledgement queued has waited since (or the last delivered) */
  int acks_told;
  struct ibv_async_event events[FV_MAX_EVENTS];
  int nevents;
  int port_down;
  unsigned rounds;
  fv_channel_t *channel;
};

/* FLEXCOLL_VERBS_FAKE_GIDS=N (1..4, default 1): each port's GID table, as an mlx5 RoCE port lays
 * it out: entry 0 fe80::/64 RoCE v1, 1 the same as RoCE v2, 2 fd00::/64 (a global address) v1, 3
 * the same as v2; each entry carries the context's identity in its low 64 bits, so any of them
 * reaches the context.  The types appear in the sysfs-like tree (FLEXCOLL_VERBS_FAKE_SYSFS) as
 * ports/1/gid_attrs/types/I. */
#define FV_MAX_GIDS 4
static int fv_ngids = 1;
static atomic_int fv_last_sgid = -1;

/* The source GID index of the last queue pair this process moved to RTR (tests). */
FV_EXPORT int fake_verbs_last_sgid_index(void) { return atomic_load(&fv_last_sgid); }

/* ---- devices (FLEXCOLL_VERBS_FAKE_DEVICES, _PLACES, _SYSFS) ----------------------------------------
 * FLEXCOLL_VERBS_FAKE_DEVICES=N devices (default 1), placed by FLEXCOLL_VERBS_FAKE_PLACES: a comma
 * list, device by device, of a NUMA node and optionally ":S", the PCIe root port it sits under
 * (devices it does not cover: node 0; by default each device a root port of its own).
 * With FLEXCOLL_VERBS_FAKE_SYSFS=DIR each device's ibdev_path is DIR/class/infiniband/NAME, whose
 * `device` links to its PCI function DIR/devices/pciDDDD:NN/0000:NN:SS.0/0000:BB:00.0 holding
 * `numa_node`, as in sysfs: the rdma link reads a real device's place the same way.  All devices
 * reach each other (one wire: shared memory). */
static struct ibv_device fv_devices[FV_MAX_DEVICES];
static int fv_ndevices = 1, fv_numa[FV_MAX_DEVICES], fv_root[FV_MAX_DEVICES];
static atomic_long fv_open_now[FV_MAX_DEVICES];

/* Contexts of device dev open in this process now (tests: which devices a rank took). */
FV_EXPORT long fake_verbs_device_open(int dev) {
  return dev >= 0 && dev < FV_MAX_DEVICES ? atomic_load(&fv_open_now[dev]) : -1;
}

static int parse_devices(void) {
  const char *s = getenv("FLEXCOLL_VERBS_FAKE_DEVICES"), *places = getenv("FLEXCOLL_VERBS_FAKE_PLACES");
  const char *gids = getenv("FLEXCOLL_VERBS_FAKE_GIDS");
  if (gids && *gids) {
    char *end = NULL;
    long n = strtol(gids, &end, 10);
    if (end == gids || *end || n < 1 || n > FV_MAX_GIDS) return -1;
    fv_ngids = (int)n;
  }
  for (int k = 0; k < FV_MAX_DEVICES; k++) fv_root[k] = k + 1;
  if (s && *s) {
    char *end = NULL;
    long n = strtol(s, &end, 10);
    if (end == s || *end || n < 1 || n > FV_MAX_DEVICES) return -1;
    fv_ndevices = (int)n;
  }
  if (!places || !*places) return 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", places);
  int k = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save), k++) {
    char *end = NULL;
    long node = strtol(t, &end, 10), root = k + 1;
    if (end == t || node < 0 || node > 255 || k == fv_ndevices) return -1;
    if (*end == ':') {
      char *e2 = NULL;
      root = strtol(end + 1, &e2, 10);
      if (e2 == end + 1 || *e2 || root < 0 || root > 31) return -1;
    } else if (*end) {
      return -1;
    }
    fv_numa[k] = (int)node;
    fv_root[k] = (int)root;
  }
  return 0;
}

static int mkdirs(char *path) {
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      int rc = mkdir(path, 0755);
      *p = '/';
      if (rc && errno != EEXIST) return -1;
    }
  return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

/* Device k's sysfs-like entries under dir (idempotent: processes of one test share them, so the
 * link is replaced atomically where it differs). */
static void lay_out_sysfs(const char *dir, int k) {
  char fn[512], cls[512], link[600], tmp[640], cur[512];
  int node = fv_numa[k];
  snprintf(fn, sizeof fn, "%s/devices/pci0000:%02x/0000:%02x:%02x.0/0000:%02x:00.0", dir, node, node, fv_root[k],
           0x10 + k);
  snprintf(cls, sizeof cls, "%s/class/infiniband/%s", dir, fv_devices[k].name);
  if (mkdirs(fn) || mkdirs(cls)) return;
  /* Written whole under another name and renamed: a rank reading it while another process of the
   * test lays it out must never see it empty. */
  snprintf(link, sizeof link, "%s/numa_node", fn);
  int have = -1;
  FILE *f = fopen(link, "r");
  if (f) {
    if (fscanf(f, "%d", &have) != 1) have = -1;
    fclose(f);
  }
  if (have != node) {
    snprintf(tmp, sizeof tmp, "%s.%d", link, (int)getpid());
    f = fopen(tmp, "w");
    if (f) {
      fprintf(f, "%d\n", node);
      if (fclose(f) || rename(tmp, link)) unlink(tmp);
    }
  }
  /* The GID types, one file per entry, written whole like numa_node. */
  for (int i = 0; i < fv_ngids; i++) {
    char dir[560], tf[580];
    snprintf(dir, sizeof dir, "%s/ports/1/gid_attrs/types", cls);
    snprintf(tf, sizeof tf, "%s/%d", dir, i);
    if (mkdirs(dir) || access(tf, F_OK) == 0) continue;
    snprintf(tmp, sizeof tmp, "%s.%d", tf, (int)getpid());
    f = fopen(tmp, "w");
    if (f) {
      fprintf(f, "%s\n", i % 2 ? "RoCE v2" : "IB/RoCE v1");
      if (fclose(f) || rename(tmp, tf)) unlink(tmp);
    }
  }
  snprintf(link, sizeof link, "%s/device", cls);
  ssize_t n = readlink(link, cur, sizeof cur - 1);
  if (n >= 0) cur[n] = 0;
  if (n >= 0 && !strcmp(cur, fn)) return;
  snprintf(tmp, sizeof tmp, "%s.%d", link, (int)getpid());
  unlink(tmp);
  if (symlink(fn, tmp) == 0 && rename(tmp, link)) unlink(tmp);
}
static atomic_uint serials;

static fv_ctx_t *ctx_of(struct ibv_context *c) {
  return (fv_ctx_t *)(void *)((char *)c - offsetof(fv_ctx_t, vctx.context));
}

static void raise_event(fv_ctx_t *c, enum ibv_event_type type, void *element) {
  if (c->nevents == FV_MAX_EVENTS) return;
  struct ibv_async_event *e = &c->events[c->nevents++];
  memset(e, 0, sizeof *e);
  e->event_type = type;
  if (type == IBV_EVENT_CQ_ERR) e->element.cq = element;
  else if (type == IBV_EVENT_PORT_ERR) e->element.port_num = 1;
  else e->element.qp = element;
  uint64_t one = 1;
  if (write(c->vctx.context.async_fd, &one, sizeof one) < 0) { /* the queue above is what counts */ }
}

static void push_cqe(struct ibv_cq *cq_, const struct ibv_wc *wc) {
  fv_cq_t *cq = (fv_cq_t *)cq_;
  if (fault.drop && wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc->byte_len > 0 &&
      atomic_fetch_add(&completions, 1) + 1 == fault.drop)
    return;
  if (cq->n == cq->cap) {
    if (!cq->overrun) raise_event(ctx_of(cq->cq.context), IBV_EVENT_CQ_ERR, cq_);
    cq->overrun = 1;
    return;
  }
  cq->ring[(cq->head + cq->n) % cq->cap] = *wc;
  cq->n++;
}

static void send_cqe(fv_qp_t *q, const fv_swr_t *w, enum ibv_wc_status st) {
  if (st == IBV_WC_SUCCESS && !w->signaled) return;
  struct ibv_wc wc;
  memset(&wc, 0, sizeof wc);
  wc.wr_id = w->wr_id;
  wc.status = st;
  wc.opcode = IBV_WC_RDMA_WRITE;
  wc.qp_num = q->qp.qp_num;
  push_cqe(q->qp.send_cq, &wc);
}

static void recv_cqe(fv_qp_t *q, uint64_t wr_id, enum ibv_wc_status st, const fv_msg_t *m) {
  struct ibv_wc wc;
  memset(&wc, 0, sizeof wc);
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
  wc.qp_num = q->qp.qp_num;
  if (m) {
    wc.byte_len = m->len;
    wc.imm_data = m->imm;
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.src_qp = m->src_qpn;
  }
  push_cqe(q->qp.recv_cq, &wc);
}

/* ERR: everything outstanding completes with WR_FLUSH_ERR (the first send with `first`). */
static void qp_to_err(fv_qp_t *q, enum ibv_wc_status first) {
  q->qp.state = IBV_QPS_ERR;
  while (q->sq_n) {
    send_cqe(q, &q->sq[q->sq_head], first);
    first = IBV_WC_WR_FLUSH_ERR;
    q->sq_head = (q->sq_head + 1) % q->max_send;
    q->sq_n--;
  }
  while (q->rq_n) {
    recv_cqe(q, q->rq[q->rq_head], IBV_WC_WR_FLUSH_ERR, NULL);
    q->rq_head = (q->rq_head + 1) % q->max_recv;
    q->rq_n--;
  }
  while (q->in_head) {
    fv_in_t *i = q->in_head;
    q->in_head = i->next;
    free(i->data);
    free(i);
  }
  q->in_tail = NULL;
}

static fv_box_t *open_box(fv_ctx_t *c, const union ibv_gid *gid) {
  /* Any entry of a context's table names it: looked up by its first (fe80::) entry. */
  union ibv_gid canon = *gid;
  canon.raw[0] = 0xfe;
  canon.raw[1] = 0x80;
  const union ibv_gid *g = &canon;
  for (int i = 0; i < c->nboxes; i++)
    if (!memcmp(&c->boxes[i].gid, g, sizeof *g)) return c->boxes[i].box;
  if (!memcmp(&c->gid, g, sizeof *g)) return c->box;
  if (c->nboxes == FV_MAX_BOXES) return NULL;
  char name[PATH_MAX];
  box_name(name, sizeof name, g);
  int fd = open(name, O_RDWR | O_CLOEXEC);
  if (fd < 0) return NULL;
  void *p = mmap(NULL, sizeof(fv_box_t) + FV_BOX_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return NULL;
  fv_box_t *b = p;
  if (b->magic != FV_BOX_MAGIC) {
    munmap(p, sizeof(fv_box_t) + FV_BOX_BYTES);
    return NULL;
  }
  c->boxes[c->nboxes].gid = *g;
  c->boxes[c->nboxes++].box = b;
  return b;
}

static fv_mr_t *find_mr(fv_ctx_t *c, int by_rkey, uint32_t key, uint64_t addr, uint32_t len, int need) {
  /* (a NULL result is a key or range error) */
  for (fv_mr_t *m = c->mrs; m; m = m->next) {
    if ((by_rkey ? m->mr.rkey : m->mr.lkey) != key) continue;
    uint64_t lo = (uint64_t)(uintptr_t)m->mr.addr;
    if (addr < lo || addr + len > lo + m->mr.length || (m->access & need) != need) return NULL;
    return m;
  }
  return NULL;
}

static fv_qp_t *find_qp(fv_ctx_t *c, uint32_t qpn) {
  for (fv_qp_t *q = c->qps; q; q = q->next)
    if (q->qp.qp_num == qpn) return q;
  return NULL;
}

static void send_ack(fv_ctx_t *c, const fv_msg_t *w, enum ibv_wc_status st) {
  fv_ack_t *a = calloc(1, sizeof *a);
  if (!a) return;
  a->m.kind = FV_ACK;
  a->m.dst_qpn = w->src_qpn;
  a->m.src_qpn = w->dst_qpn;
  a->m.src_gid = c->gid;
  a->m.seq = w->seq;
  a->m.status = (uint32_t)st;
  a->to = open_box(c, &w->src_gid);
  if (!a->to) {
    free(a);
    return;
  }
  if (c->acks_tail) c->acks_tail->next = a;
  else c->acks_head = a, c->acks_since = now_ms(), c->acks_told = 0;
  c->acks_tail = a;
}

static int flush_acks(fv_ctx_t *c) {
  while (c->acks_head) {
    fv_ack_t *a = c->acks_head;
    if (box_push(a->to, &a->m, NULL)) return -1;
    c->acks_since = now_ms();
    c->acks_head = a->next;
    if (!c->acks_head) c->acks_tail = NULL;
    free(a);
  }
  return 0;
}

/* The responder: apply q's arrivals in order while it can. */
static void respond(fv_qp_t *q) {
  fv_ctx_t *c = q->ctx;
  while (q->in_head) {
    fv_in_t *i = q->in_head;
    fv_msg_t *m = &i->m;
    enum ibv_wc_status st = IBV_WC_SUCCESS;
    fv_mr_t *target = m->len ? find_mr(c, 1, m->rkey, m->raddr, m->len, IBV_ACCESS_REMOTE_WRITE) : NULL;
    if (m->len && !target) st = IBV_WC_REM_ACCESS_ERR;
    if (st == IBV_WC_SUCCESS && m->has_imm && q->rq_n == 0) {
      /* Receiver not ready: the requester retries (rnr_retry 7: forever). */
      if (!q->rnr_since) q->rnr_since = now_ms();
      if (m->rnr_retry == 7 || now_ms() - q->rnr_since < 10.0 * (m->rnr_retry + 1)) return;
      st = IBV_WC_RNR_RETRY_EXC_ERR;
    }
    q->rnr_since = 0;
    if (st == IBV_WC_SUCCESS) {
      if (m->len && target->gpu_ctx) {
        void *dst = (void *)(uintptr_t)m->raddr;
        if (gpu_copy(target->gpu_ctx, dst, i->data, m->len, dst)) st = IBV_WC_REM_ACCESS_ERR;
      } else if (m->len) memcpy(mr_at(target, m->raddr), i->data, m->len);
    }
    if (st == IBV_WC_SUCCESS) {
      if (m->has_imm) {
        uint64_t id = q->rq[q->rq_head];
        q->rq_head = (q->rq_head + 1) % q->max_recv;
        q->rq_n--;
        recv_cqe(q, id, IBV_WC_SUCCESS, m);
      }
    }
    send_ack(c, m, st);
    q->in_head = i->next;
    if (!q->in_head) q->in_tail = NULL;
    free(i->data);
    free(i);
  }
}

/* The requester: an acknowledgement for the oldest write in flight. */
static void on_ack(fv_qp_t *q, const fv_msg_t *m) {
  if (!q->sq_n || !q->sq[q->sq_head].pushed || q->sq[q->sq_head].seq != m->seq) return; /* stale (after ERR) */
  fv_swr_t w = q->sq[q->sq_head];
  q->sq_head = (q->sq_head + 1) % q->max_send;
  q->sq_n--;
  if (m->status == IBV_WC_SUCCESS) send_cqe(q, &w, IBV_WC_SUCCESS);
  else {
    send_cqe(q, &w, (enum ibv_wc_status)m->status);
    qp_to_err(q, IBV_WC_WR_FLUSH_ERR);
  }
}

/* The requester: hand the queued writes whose time has come to the wire. */
static void push_sends(fv_qp_t *q) {
  if (q->qp.state != IBV_QPS_RTS) return;
  fv_ctx_t *c = q->ctx;
  if (!q->rbox && !q->rbox_failed) {
    q->rbox = open_box(c, &q->dgid);
    q->rbox_failed = !q->rbox;
  }
  for (int k = 0; k < q->sq_n; k++) {
    fv_swr_t *w = &q->sq[(q->sq_head + k) % q->max_send];
    if (w->pushed) continue;
    if (now_ms() < w->start) return;
    if (q->rbox_failed) {
      qp_to_err(q, IBV_WC_RETRY_EXC_ERR);
      return;
    }
    if (w->len > FV_MAX_MSG) {
      qp_to_err(q, k == 0 ? IBV_WC_LOC_LEN_ERR : IBV_WC_WR_FLUSH_ERR);
      return;
    }
    fv_mr_t *src = w->len ? find_mr(c, 0, w->lkey, w->laddr, w->len, 0) : NULL;
    if (w->len && !src) {
      /* Earlier writes still wait for their acknowledgements; a real NIC fails this one in order. */
      qp_to_err(q, k == 0 ? IBV_WC_LOC_PROT_ERR : IBV_WC_WR_FLUSH_ERR);
      return;
    }
    fv_msg_t m;
    memset(&m, 0, sizeof m);
    m.kind = FV_WRITE;
    m.dst_qpn = q->dqpn;
    m.src_qpn = q->qp.qp_num;
    m.src_gid = c->gid;
    m.seq = w->seq;
    m.raddr = w->raddr;
    m.rkey = w->rkey;
    m.imm = w->imm;
    m.has_imm = (uint32_t)w->has_imm;
    m.len = w->len;
    m.rnr_retry = (uint32_t)q->rnr_retry;
    if (src && src->gpu_ctx) {
      /* GPU memory: read through the driver into a bounce buffer, then onto the wire. */
      char *bounce = malloc(w->len);
      const void *from = (const void *)(uintptr_t)w->laddr;
      const int bad = !bounce || gpu_copy(src->gpu_ctx, bounce, from, w->len, from);
      const int full = bad ? 0 : box_push(q->rbox, &m, bounce);
      free(bounce);
      if (bad) {
        qp_to_err(q, k == 0 ? IBV_WC_LOC_PROT_ERR : IBV_WC_WR_FLUSH_ERR);
        return;
      }
      if (full) return;
    } else if (box_push(q->rbox, &m, src ? mr_at(src, w->laddr) : NULL)) {
      return;
    }
    w->pushed = 1;
    w->pushed_at = now_ms();
  }
  /* Writes in flight to a target that is gone never get an answer: retries exhausted. */
  if (q->sq_n && q->sq[q->sq_head].pushed && now_ms() >= q->next_alive_check) {
    q->next_alive_check = now_ms() + 100;
    const int gone = atomic_load(&q->rbox->closed) || (kill(q->rbox->pid, 0) && errno == ESRCH);
    /* The answer a target sent before it went may still sit in our inbox (the engine takes a
     * bounded number of messages per round): the writes fail only if none came for a while. */
    if (!gone) q->gone_since = 0;
    else if (!q->gone_since) q->gone_since = now_ms();
    else if (now_ms() - q->gone_since >= 300) qp_to_err(q, IBV_WC_RETRY_EXC_ERR);
  }
}

static double stall_ms(void) {
  static double ms = -1;
  if (ms < 0) {
    const char *e = getenv("FLEXCOLL_VERBS_FAKE_STALL_MS");
    ms = e && atof(e) > 0 ? atof(e) : 0;
  }
  return ms;
}

static uint64_t box_used(fv_box_t *b) {
  if (!b || box_lock(b) != 0) return 0;
  const uint64_t used = b->head - b->tail;
  pthread_mutex_unlock(&b->lock);
  return used;
}

/* FLEXCOLL_VERBS_FAKE_STALL_MS: tell the oldest write and the oldest arrival of q that waited
 * that long, once each. */
static void tell_stalls(fv_qp_t *q) {
  const double limit = stall_ms(), now = now_ms();
  if (q->sq_n) {
    const fv_swr_t *w = &q->sq[q->sq_head];
    const double since = w->pushed ? w->pushed_at : w->start;
    if (now - since >= limit && q->stall_told != w->seq + 1) {
      q->stall_told = w->seq + 1;
      fprintf(stderr,
              "fake verbs: qp %u (pid %d): write seq %llu (%u bytes%s) %s %.0f ms ago; %d writes queued, %d receives "
              "posted, %s; the target's inbox holds %llu of %llu bytes, ours %llu\n",
              q->qp.qp_num, (int)getpid(), (unsigned long long)w->seq, w->len, w->has_imm ? ", immediate" : "",
              w->pushed ? "went onto the wire, no answer since" : "waits to go onto the wire, queued", now - since, q->sq_n,
              q->rq_n, q->qp.state == IBV_QPS_RTS ? "RTS" : "not RTS", (unsigned long long)box_used(q->rbox),
              (unsigned long long)FV_BOX_BYTES, (unsigned long long)box_used(q->ctx->box));
    }
  }
  if (q->in_head && now - q->in_head->arrived >= limit && q->stall_in_told != q->in_head->m.seq + 1) {
    q->stall_in_told = q->in_head->m.seq + 1;
    fprintf(stderr, "fake verbs: qp %u (pid %d): an arrival (seq %llu, %u bytes%s) waits %.0f ms: %d receives posted\n",
            q->qp.qp_num, (int)getpid(), (unsigned long long)q->in_head->m.seq, q->in_head->m.len,
            q->in_head->m.has_imm ? ", immediate" : "", now - q->in_head->arrived, q->rq_n);
  }
}

/* What a NIC does by itself: take the wire's messages, answer them, send what is queued. */
static void engine(fv_ctx_t *c) {
  fv_msg_t m;
  char *data;
  int budget = 256;
  flush_acks(c);
  while (budget-- > 0 && !c->acks_head && box_pop(c->box, &m, &data)) {
    fv_qp_t *q = find_qp(c, m.dst_qpn);
    if (m.kind == FV_ACK) {
      if (q) on_ack(q, &m);
      free(data);
      continue;
    }
    if (!q || (q->qp.state != IBV_QPS_RTR && q->qp.state != IBV_QPS_RTS)) {
      /* No such queue pair, or not receiving: the requester's retries run out. */
      send_ack(c, &m, IBV_WC_RETRY_EXC_ERR);
      free(data);
      flush_acks(c);
      continue;
    }
    fv_in_t *i = malloc(sizeof *i);
    if (!i) {
      free(data);
      continue;
    }
    i->m = m;
    i->data = data;
    i->arrived = now_ms();
    i->next = NULL;
    if (q->in_tail) q->in_tail->next = i;
    else q->in_head = i;
    q->in_tail = i;
    respond(q);
    flush_acks(c);
  }
  /* Each round starts at another queue pair, so completions of different queue pairs come in
   * varying orders, as on a NIC (only those of one queue pair are ordered). */
  int nqps = 0;
  for (fv_qp_t *q = c->qps; q; q = q->next) nqps++;
  int first = nqps ? (int)(c->rounds++ % (unsigned)nqps) : 0;
  fv_qp_t *start = c->qps;
  for (int j = 0; j < first; j++) start = start->next;
  for (int pass = 0; pass < 2 && nqps; pass++) {
    fv_qp_t *q = start;
    for (int k = 0; k < nqps; k++, q = q->next ? q->next : c->qps) {
      if (pass == 0) respond(q);
      else push_sends(q);
    }
  }
  flush_acks(c);
  if (stall_ms() > 0)
    for (fv_qp_t *q = c->qps; q; q = q->next) tell_stalls(q);
  if (stall_ms() > 0 && c->acks_head && now_ms() - c->acks_since >= stall_ms() && !c->acks_told) {
    c->acks_told = 1;
    fprintf(stderr, "fake verbs: pid %d: acknowledgements wait %.0f ms for room in a requester's inbox (ours holds %llu bytes)\n",
            (int)getpid(), now_ms() - c->acks_since, (unsigned long long)box_used(c->box));
  }
}

/* ---- the context's ops (ibv_post_send, ibv_post_recv, ibv_poll_cq are inline over them) ---------- */

static int fv_poll_cq(struct ibv_cq *cq_, int n, struct ibv_wc *wc) {
  fv_cq_t *cq = (fv_cq_t *)cq_;
  engine(ctx_of(cq_->context));
  int got = 0;
  while (got < n && cq->n) {
    wc[got++] = cq->ring[cq->head];
    cq->head = (cq->head + 1) % cq->cap;
    cq->n--;
  }
  return got;
}

static int fv_post_send(struct ibv_qp *qp_, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  fv_qp_t *q = (fv_qp_t *)qp_;
  for (; wr; wr = wr->next) {
    long n = atomic_fetch_add(&posts, 1) + 1;
    if (fault.post_fail && n == fault.post_fail) return *bad = wr, EIO;
    if (fault.kill && n == fault.kill && q->qp.state == IBV_QPS_RTS) {
      qp_to_err(q, IBV_WC_WR_FLUSH_ERR);
      raise_event(q->ctx, IBV_EVENT_QP_FATAL, qp_);
    }
    if (fault.portdown && n == fault.portdown && !q->ctx->port_down) {
      q->ctx->port_down = 1;
      raise_event(q->ctx, IBV_EVENT_PORT_ERR, NULL);
      for (fv_qp_t *x = q->ctx->qps; x; x = x->next)
        if (x->qp.state == IBV_QPS_RTS || x->qp.state == IBV_QPS_RTR) qp_to_err(x, IBV_WC_RETRY_EXC_ERR);
    }
    if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR) return *bad = wr, EINVAL;
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) return *bad = wr, EINVAL;
    if (wr->num_sge > 1 || wr->num_sge < 0) return *bad = wr, EINVAL;
    if (q->sq_n == q->max_send) return *bad = wr, ENOMEM;
    fv_swr_t *w = &q->sq[(q->sq_head + q->sq_n) % q->max_send];
    memset(w, 0, sizeof *w);
    w->wr_id = wr->wr_id;
    w->seq = q->next_seq++;
    w->signaled = (wr->send_flags & IBV_SEND_SIGNALED) || q->qp.qp_type != IBV_QPT_RC;
    w->has_imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (!w->has_imm) atomic_fetch_add(&plain_writes, 1);
    w->imm = wr->imm_data;
    w->raddr = wr->wr.rdma.remote_addr;
    w->rkey = wr->wr.rdma.rkey;
    if (wr->num_sge == 1) {
      w->laddr = wr->sg_list[0].addr;
      w->len = wr->sg_list[0].length;
      w->lkey = wr->sg_list[0].lkey;
    }
    w->start = now_ms() + (double)fault.delay_ms;
    q->sq_n++;
    if (q->qp.state == IBV_QPS_ERR) qp_to_err(q, IBV_WC_WR_FLUSH_ERR);
  }
  push_sends(q);
  return 0;
}

static int fv_post_recv(struct ibv_qp *qp_, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  fv_qp_t *q = (fv_qp_t *)qp_;
  for (; wr; wr = wr->next) {
    if (q->qp.state == IBV_QPS_RESET) return *bad = wr, EINVAL;
    if (wr->num_sge > 1 || wr->num_sge < 0) return *bad = wr, EINVAL;
    if (q->rq_n == q->max_recv) return *bad = wr, ENOMEM;
    q->rq[(q->rq_head + q->rq_n) % q->max_recv] = wr->wr_id;
    q->rq_n++;
    if (q->qp.state == IBV_QPS_ERR) qp_to_err(q, IBV_WC_WR_FLUSH_ERR);
  }
  return 0;
}

/* Work this context's "NIC" still has to do, which only a poll moves: arrivals not taken,
 * acknowledgements not delivered, writes not yet pushed (delayed, or their target's inbox full). */
static int has_own_work(fv_ctx_t *c) {
  if (box_lock(c->box) != 0) return 0;
  const int arrivals = c->box->head != c->box->tail;
  pthread_mutex_unlock(&c->box->lock);
  if (arrivals || c->acks_head) return 1;
  for (fv_qp_t *q = c->qps; q; q = q->next)
    for (int i = 0; i < q->sq_n; i++)
      if (!q->sq[(q->sq_head + i) % q->max_send].pushed) return 1;
  return 0;
}

static int fv_req_notify_cq(struct ibv_cq *cq_, int solicited_only) {
  (void)solicited_only;
  fv_cq_t *cq = (fv_cq_t *)cq_;
  fv_ctx_t *c = ctx_of(cq_->context);
  if (!cq_->channel) return EINVAL;
  cq->armed = 1;
  atomic_store(&c->box->armed, 1); /* before looking: a push after it wakes, one before it is seen */
  if (has_own_work(c)) box_wake(c->box);
  return 0;
}

/* ---- the exported functions ----------------------------------------------------------------------- */

static int fv_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
                              struct ibv_device_attr_ex *attr, size_t size);
static void fill_device_attr(struct ibv_device_attr *attr);

FV_EXPORT struct ibv_device **ibv_get_device_list(int *num) {
  pthread_once(&fault_once, parse_faults);
  if (num) *num = 0;
  if (fault.nodev || fault.bad) {
    errno = fault.bad ? EINVAL : ENOSYS;
    return NULL;
  }
  const int ndev = fault.fewer > 0 && fault.fewer < fv_ndevices ? fault.fewer : fv_ndevices;
  struct ibv_device **list = calloc((size_t)ndev + 1, sizeof *list);
  if (!list) return NULL;
  const char *sysfs = getenv("FLEXCOLL_VERBS_FAKE_SYSFS");
  for (int k = 0; k < ndev; k++) {
    struct ibv_device *d = &fv_devices[k];
    snprintf(d->name, sizeof d->name, "fakeverbs%d", k);
    snprintf(d->dev_name, sizeof d->dev_name, "uverbs-fake%d", k);
    d->node_type = IBV_NODE_CA;
    d->transport_type = IBV_TRANSPORT_IB;
    d->ibdev_path[0] = 0;
    if (sysfs && *sysfs) {
      lay_out_sysfs(sysfs, k);
      snprintf(d->ibdev_path, sizeof d->ibdev_path, "%s/class/infiniband/%s", sysfs, d->name);
    }
    list[k] = d;
  }
  if (num) *num = ndev;
  return list;
}

FV_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

FV_EXPORT const char *ibv_get_device_name(struct ibv_device *dev) { return dev->name; }

/* A process that died (SIGKILL, _exit without closing its device) cannot unlink its inboxes; a
 * kernel driver reclaims a dead process's resources, so the fake does it here for them. */
static void reclaim_dead_inboxes(void) {
  DIR *d = opendir(wire_dir());
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    int pid = 0;
    unsigned serial = 0;
    char name[PATH_MAX];
    if (sscanf(e->d_name, "fcfv-%d-%u", &pid, &serial) != 2 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    snprintf(name, sizeof name, "%s/%s", wire_dir(), e->d_name);
    unlink(name);
  }
  closedir(d);
}

FV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *dev) {
  const int k = (int)(dev - fv_devices);
  if (k < 0 || k >= fv_ndevices) return errno = ENODEV, NULL;
  reclaim_dead_inboxes();
  fv_ctx_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  uint32_t serial = atomic_fetch_add(&serials, 1), pid = (uint32_t)getpid();
  c->gid.raw[0] = 0xfe;
  c->gid.raw[1] = 0x80;
  uint32_t be = htonl(pid);
  memcpy(c->gid.raw + 8, &be, 4);
  be = htonl(serial);
  memcpy(c->gid.raw + 12, &be, 4);
  box_name(c->name, sizeof c->name, &c->gid);
  int fd = open(c->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return free(c), NULL;
  size_t size = sizeof(fv_box_t) + FV_BOX_BYTES;
  void *p = ftruncate(fd, (off_t)size) ? MAP_FAILED : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    unlink(c->name);
    free(c);
    return NULL;
  }
  c->box = p;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&c->box->lock, &a);
  pthread_mutexattr_destroy(&a);
  c->box->cap = FV_BOX_BYTES;
  c->box->pid = (pid_t)pid;
  c->box->magic = FV_BOX_MAGIC;
  c->devno = k;
  c->vctx.sz = sizeof c->vctx;
  c->vctx.query_device_ex = fv_query_device_ex;
  c->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
  c->vctx.context.device = dev;
  c->vctx.context.cmd_fd = -1;
  c->vctx.context.async_fd = eventfd(0, EFD_CLOEXEC);
  c->vctx.context.num_comp_vectors = 1;
  c->vctx.context.ops.poll_cq = fv_poll_cq;
  c->vctx.context.ops.post_send = fv_post_send;
  c->vctx.context.ops.post_recv = fv_post_recv;
  c->vctx.context.ops.req_notify_cq = fv_req_notify_cq;
  c->next_qpn = 0x100;
  c->next_key = 0x1000 + serial * 0x10000;
  pthread_mutex_init(&c->vctx.context.mutex, NULL);
  if (c->vctx.context.async_fd < 0) {
    munmap(p, size);
    unlink(c->name);
    free(c);
    return NULL;
  }
  atomic_fetch_add(&fv_open_now[k], 1);
  /* The bounce buffer now, while this process's kernels wait for nothing of ours (where CUDA is
   * up: any device's primary context will do, the memory is portable). */
  if (!cu.attr) cu_load();
  void *primary = NULL, *was = NULL;
  int dev0 = -1;
  if (cu.attr && cu.device(&dev0, 0) == 0 && cu.primary(&primary, dev0) == 0 && primary && cu.push(primary) == 0) {
    pthread_mutex_lock(&bounce_lock);
    bounce_locked();
    pthread_mutex_unlock(&bounce_lock);
    cu.pop(&was);
  }
  return &c->vctx.context;
}

FV_EXPORT int ibv_close_device(struct ibv_context *ctx) {
  fv_ctx_t *c = ctx_of(ctx);
  /* A NIC acknowledges a write as it lands, whatever its process does next: answers still queued
   * (a requester's inbox was full) go out before the device does, or the requester of a write
   * this process already consumed would see its target gone (bounded: a requester that is gone
   * reads nothing). */
  for (int i = 0; i < 1000 && c->acks_head && flush_acks(c); i++) usleep(1000);
  atomic_store(&c->box->closed, 1);
  while (c->acks_head) {
    fv_ack_t *a = c->acks_head;
    c->acks_head = a->next;
    free(a);
  }
  for (int i = 0; i < c->nboxes; i++) munmap(c->boxes[i].box, sizeof(fv_box_t) + FV_BOX_BYTES);
  munmap(c->box, sizeof(fv_box_t) + FV_BOX_BYTES);
  unlink(c->name);
  if (c->channel) unlink(c->channel->path); /* a channel left open: its FIFO goes with the device */
  atomic_fetch_sub(&fv_open_now[c->devno], 1);
  close(ctx->async_fd);
  pthread_mutex_destroy(&ctx->mutex);
  free(c);
  return 0;
}

FV_EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr) {
  (void)ctx;
  fill_device_attr(attr);
  return 0;
}

/* (Called by name inside the fake, ibv_query_device would resolve to libibverbs' where a process
 * has it loaded.) */
static void fill_device_attr(struct ibv_device_attr *attr) {
  memset(attr, 0, sizeof *attr);
  snprintf(attr->fw_ver, sizeof attr->fw_ver, "fake");
  attr->max_mr_size = (uint64_t)1 << 40;
  attr->max_qp = 1024;
  attr->max_qp_wr = 4096;
  attr->max_sge = 1;
  attr->max_cq = 1024;
  attr->max_cqe = 65536;
  attr->max_mr = 4096;
  attr->max_pd = 64;
  attr->phys_port_cnt = 1;
}

/* The extended query: on-demand paging for RC unless the device is told it has none (noodp). */
static int fv_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
                              struct ibv_device_attr_ex *attr, size_t size) {
  (void)input;
  if (size < sizeof *attr) return EINVAL;
  memset(attr, 0, size);
  fill_device_attr(&attr->orig_attr);
  if (!fault.noodp) {
    attr->odp_caps.general_caps = IBV_ODP_SUPPORT;
    attr->odp_caps.per_transport_caps.rc_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
  }
  return 0;
}

FV_EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr_) {
  struct ibv_port_attr *attr = (struct ibv_port_attr *)attr_;
  if (port != 1) return EINVAL;
  memset(attr, 0, sizeof *attr);
  attr->state = ctx_of(ctx)->port_down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  attr->max_mtu = attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = fv_ngids;
  attr->max_msg_sz = FV_MAX_MSG;
  attr->pkey_tbl_len = 1;
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  attr->active_width = 2; /* 4x */
  attr->active_speed = 32; /* 25 Gb/s per lane */
  attr->phys_state = 5;
  return 0;
}

static void fv_gid(const fv_ctx_t *c, int idx, union ibv_gid *g) {
  *g = c->gid; /* fe80::, the context's identity below */
  if (idx >= 2) {
    g->raw[0] = 0xfd;
    g->raw[1] = 0x00;
  }
}

/* Whether g is an entry of some context of this fake (fe80::/64 or fd00::/64; the identity in the
 * low half names the context). */
static int fv_gid_ours(const union ibv_gid *g) {
  for (int i = 2; i < 8; i++)
    if (g->raw[i]) return 0;
  return (g->raw[0] == 0xfe && g->raw[1] == 0x80) || (g->raw[0] == 0xfd && g->raw[1] == 0x00);
}

FV_EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
  if (port != 1 || index < 0 || index >= fv_ngids) return errno = EINVAL, -1;
  fv_gid(ctx_of(ctx), index, gid);
  return 0;
}

FV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx) {
  struct ibv_pd *pd = calloc(1, sizeof *pd);
  if (!pd) return NULL;
  pd->context = ctx;
  ctx_of(ctx)->npds++;
  return pd;
}

FV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
  fv_ctx_t *c = ctx_of(pd->context);
  for (fv_mr_t *m = c->mrs; m; m = m->next)
    if (m->mr.pd == pd) return EBUSY;
  for (fv_qp_t *q = c->qps; q; q = q->next)
    if (q->qp.pd == pd) return EBUSY;
  c->npds--;
  free(pd);
  return 0;
}

/* ---- the pinned model (FLEXCOLL_VERBS_FAKE_FAULT=pinned) ------------------------------------------
 * A real registration without on-demand paging pins the pages the range maps now; a buffer the
 * user then unmaps and maps again at the same address gets new pages, and the NIC keeps reading
 * and writing the old ones.  The fake models it for page-aligned ranges: the range's bytes move
 * into a memfd (the "pages"), mapped shared over the range and a second time for the fake, which
 * then reads and writes through its own mapping.  So after an munmap and mmap at the same address
 * the application sees nothing the fake writes, as on a NIC.  A range inside one already pinned
 * shares its pages; one that overlaps another only in part, or is not page-aligned, follows the
 * address space (not modelled).  For tests whose ranks are processes: the move is not atomic
 * against other threads writing into those pages. */
static pthread_mutex_t frames_lock = PTHREAD_MUTEX_INITIALIZER;
static fv_frame_t *frames;

static char *pin_pages(void *addr, size_t len, fv_frame_t **out) {
  const uintptr_t lo = (uintptr_t)addr, hi = lo + len, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  *out = NULL;
  if (!len || lo % pg || hi % pg) return NULL;
  pthread_mutex_lock(&frames_lock);
  for (fv_frame_t *f = frames; f; f = f->next) {
    if (f->lo <= lo && hi <= f->hi) {
      f->refs++;
      *out = f;
      pthread_mutex_unlock(&frames_lock);
      return f->view + (lo - f->lo);
    }
    if (lo < f->hi && f->lo < hi) {
      pthread_mutex_unlock(&frames_lock);
      return NULL;
    }
  }
  fv_frame_t *f = calloc(1, sizeof *f);
  int fd = f ? memfd_create("fcfv-pages", MFD_CLOEXEC) : -1;
  char *view = fd >= 0 && ftruncate(fd, (off_t)len) == 0
                   ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  if (view != MAP_FAILED) {
    memcpy(view, addr, len);
    if (mmap(addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      munmap(view, len);
      view = MAP_FAILED;
    }
  }
  if (fd >= 0) close(fd);
  if (view == MAP_FAILED) {
    free(f);
    pthread_mutex_unlock(&frames_lock);
    return NULL;
  }
  *f = (fv_frame_t){.lo = lo, .hi = hi, .view = view, .refs = 1, .next = frames};
  frames = f;
  *out = f;
  pthread_mutex_unlock(&frames_lock);
  return view;
}

/* The fake lets go of the pages; the application's mapping (if any) keeps them. */
static void unpin_pages(fv_frame_t *f) {
  if (!f) return;
  pthread_mutex_lock(&frames_lock);
  if (--f->refs == 0) {
    for (fv_frame_t **p = &frames; *p; p = &(*p)->next)
      if (*p == f) {
        *p = f->next;
        break;
      }
    munmap(f->view, f->hi - f->lo);
    free(f);
  }
  pthread_mutex_unlock(&frames_lock);
}

FV_EXPORT int ibv_fork_init(void) {
  pthread_once(&fault_once, parse_faults);
  atomic_fetch_add(&fork_inits, 1);
  return 0;
}

FV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) {
  pthread_once(&fault_once, parse_faults);
  if (!fault.oldkernel) return IBV_FORK_UNNEEDED;
  return atomic_load(&fork_inits) ? IBV_FORK_ENABLED : IBV_FORK_DISABLED;
}

/* A memory region of c (gpu_ctx: GPU memory's CUDA context; NULL: host memory). */
static fv_mr_t *new_mr(fv_ctx_t *c, struct ibv_pd *pd, void *addr, size_t length, int access, void *gpu_ctx) {
  fv_mr_t *m = calloc(1, sizeof *m);
  if (!m) return errno = ENOMEM, NULL;
  m->gpu_ctx = gpu_ctx;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.lkey = c->next_key++;
  m->mr.rkey = c->next_key++ ^ 0x5a5a0000u;
  m->access = access | IBV_ACCESS_LOCAL_WRITE;
  m->next = c->mrs;
  c->mrs = m;
  atomic_fetch_add(&mrs_ever, 1);
  atomic_fetch_add(&mrs_now, 1);
  return m;
}

/* GPUDirect RDMA through dma-buf: fd must be a dma-buf (as the kernel checks), iova the device
 * address of offset (callers pass the address, as NCCL does), inside GPU memory. */
FV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                           int access) {
  pthread_once(&fault_once, parse_faults);
  if (!pd || !length || ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)))
    return errno = EINVAL, NULL;
  if (fault.nodmabuf) return errno = EOPNOTSUPP, NULL;
  char link[64], target[256] = "";
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0 || !strstr(target, "dmabuf")) return errno = EINVAL, NULL;
  void *gpu_ctx = NULL, *addr = (void *)(uintptr_t)iova;
  if (!is_gpu(addr, &gpu_ctx) || !is_gpu((char *)addr + length - 1, &gpu_ctx)) return errno = EFAULT, NULL;
  (void)offset;
  fv_mr_t *m = new_mr(ctx_of(pd->context), pd, addr, length, access, gpu_ctx);
  if (m) atomic_fetch_add(&dmabuf_regs, 1);
  return m ? &m->mr : NULL;
}

FV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
  /* Remote write needs local write, as in every provider. */
  if (!pd || (!addr && length) || ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)))
    return errno = EINVAL, NULL;
  /* A device without on-demand paging refuses it, as providers do. */
  if ((access & IBV_ACCESS_ON_DEMAND) && fault.noodp) return errno = EOPNOTSUPP, NULL;
  if (fault.regfail && (atomic_fetch_add(&regs_tried, 1) + 1) % fault.regfail == 0) return errno = ENOMEM, NULL;
  fv_ctx_t *c = ctx_of(pd->context);
  void *gpu_ctx = NULL;
  if (length && is_gpu(addr, &gpu_ctx)) {
    /* Device memory by address: only nvidia-peermem makes a NIC's driver take it. */
    if (!fault.peermem) return errno = EFAULT, NULL;
    fv_mr_t *m = new_mr(c, pd, addr, length, access, gpu_ctx);
    if (m) atomic_fetch_add(&peermem_regs, 1);
    return m ? &m->mr : NULL;
  }
  fv_mr_t *m = new_mr(c, pd, addr, length, access, NULL);
  if (!m) return NULL;
  if (fault.pinned && !(access & IBV_ACCESS_ON_DEMAND)) m->view = pin_pages(addr, length, &m->frame);
  if (fault.oldkernel && !atomic_load(&fork_inits)) atomic_fetch_add(&unsafe_regs, 1);
  return &m->mr;
}

FV_EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
  fv_ctx_t *c = ctx_of(mr->context);
  for (fv_mr_t **p = &c->mrs; *p; p = &(*p)->next)
    if (&(*p)->mr == mr) {
      fv_mr_t *m = *p;
      *p = m->next;
      unpin_pages(m->frame);
      free(m);
      atomic_fetch_sub(&mrs_now, 1);
      return 0;
    }
  return EINVAL;
}

FV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx) {
  fv_ctx_t *c = ctx_of(ctx);
  if (c->channel) return errno = EBUSY, NULL; /* one per context (the inbox has one FIFO) */
  fv_channel_t *h = calloc(1, sizeof *h);
  if (!h) return errno = ENOMEM, NULL;
  snprintf(h->path, sizeof h->path, "%s.wake", c->name);
  unlink(h->path);
  /* Read and write: the FIFO never reports end of file while no pusher holds it open. */
  if (mkfifo(h->path, 0600) || (h->ch.fd = open(h->path, O_RDWR | O_CLOEXEC)) < 0) {
    const int e = errno;
    unlink(h->path);
    free(h);
    return errno = e, NULL;
  }
  h->ch.context = ctx;
  snprintf(c->box->wake_path, sizeof c->box->wake_path, "%s", h->path);
  c->channel = h;
  return &h->ch;
}

FV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch) {
  fv_channel_t *h = (fv_channel_t *)ch;
  if (h->ncqs) return EBUSY;
  fv_ctx_t *c = ctx_of(ch->context);
  atomic_store(&c->box->armed, 0);
  c->box->wake_path[0] = 0;
  close(ch->fd);
  unlink(h->path);
  c->channel = NULL;
  free(h);
  return 0;
}

/* The next event: a byte from the FIFO names the channel's armed CQ (bytes no armed CQ is left
 * for are dropped, so that no event comes without a request).  EAGAIN where the caller made the
 * descriptor non-blocking and nothing came. */
FV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq_out, void **cq_context) {
  fv_channel_t *h = (fv_channel_t *)ch;
  for (;;) {
    char b;
    if (read(ch->fd, &b, 1) != 1) return -1;
    for (int i = 0; i < h->ncqs; i++)
      if (h->cqs[i]->armed) {
        h->cqs[i]->armed = 0;
        h->cqs[i]->events++;
        *cq_out = &h->cqs[i]->cq;
        *cq_context = h->cqs[i]->cq.cq_context;
        return 0;
      }
  }
}

FV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq_, unsigned int n) { ((fv_cq_t *)cq_)->acked += n; }

FV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch,
                                       int vector) {
  if (cqe < 1 || cqe > 65536 || vector != 0) return errno = EINVAL, NULL;
  fv_channel_t *h = (fv_channel_t *)ch;
  if (h && (ch->context != ctx || h->ncqs == FV_CHANNEL_CQS)) return errno = EINVAL, NULL;
  fv_cq_t *cq = calloc(1, sizeof *cq);
  if (!cq || !(cq->ring = calloc((size_t)cqe, sizeof *cq->ring))) return free(cq), errno = ENOMEM, NULL;
  cq->cap = cqe;
  cq->cq.context = ctx;
  cq->cq.cq_context = cq_context;
  cq->cq.cqe = cqe;
  cq->cq.channel = ch;
  if (h) h->cqs[h->ncqs++] = cq;
  ctx_of(ctx)->ncqs++;
  return &cq->cq;
}

FV_EXPORT int ibv_destroy_cq(struct ibv_cq *cq_) {
  fv_ctx_t *c = ctx_of(cq_->context);
  for (fv_qp_t *q = c->qps; q; q = q->next)
    if (q->qp.send_cq == cq_ || q->qp.recv_cq == cq_) return EBUSY;
  fv_cq_t *cq = (fv_cq_t *)cq_;
  if (cq->events != cq->acked) return EBUSY;
  fv_channel_t *h = (fv_channel_t *)cq_->channel;
  for (int i = 0; h && i < h->ncqs; i++)
    if (h->cqs[i] == cq) h->cqs[i] = h->cqs[--h->ncqs];
  c->ncqs--;
  free(cq->ring);
  free(cq);
  return 0;
}

FV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
  if (!pd || !a || a->qp_type != IBV_QPT_RC || !a->send_cq || !a->recv_cq || a->srq || a->cap.max_send_wr < 1 ||
      a->cap.max_recv_wr < 1 || a->cap.max_send_wr > 4096 || a->cap.max_recv_wr > 4096 || a->cap.max_send_sge > 1 ||
      a->cap.max_recv_sge > 1)
    return errno = EINVAL, NULL;
  fv_ctx_t *c = ctx_of(pd->context);
  fv_qp_t *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->max_send = (int)a->cap.max_send_wr;
  q->max_recv = (int)a->cap.max_recv_wr;
  q->sq = calloc((size_t)q->max_send, sizeof *q->sq);
  q->rq = calloc((size_t)q->max_recv, sizeof *q->rq);
  if (!q->sq || !q->rq) {
    free(q->sq);
    free(q->rq);
    free(q);
    return errno = ENOMEM, NULL;
  }
  q->ctx = c;
  q->qp.context = pd->context;
  q->qp.qp_context = a->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = a->send_cq;
  q->qp.recv_cq = a->recv_cq;
  q->qp.qp_num = c->next_qpn++;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  q->next = c->qps;
  c->qps = q;
  return &q->qp;
}

/* The attributes a transition needs (IB spec, RC). */
static int has(int mask, int need) { return (mask & need) == need; }

FV_EXPORT int ibv_modify_qp(struct ibv_qp *qp_, struct ibv_qp_attr *a, int mask) {
  fv_qp_t *q = (fv_qp_t *)qp_;
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  enum ibv_qp_state from = q->qp.state, to = a->qp_state;
  if (to == IBV_QPS_ERR) {
    qp_to_err(q, IBV_WC_WR_FLUSH_ERR);
    return 0;
  }
  if (to == IBV_QPS_RESET) {
    q->sq_n = q->rq_n = 0;
    q->qp.state = IBV_QPS_RESET;
    return 0;
  }
  if (to == IBV_QPS_INIT && (from == IBV_QPS_RESET || from == IBV_QPS_INIT)) {
    if (from == IBV_QPS_RESET && !has(mask, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return EINVAL;
    if ((mask & IBV_QP_PORT) && a->port_num != 1) return EINVAL;
    if (mask & IBV_QP_ACCESS_FLAGS) q->access = a->qp_access_flags;
  } else if (to == IBV_QPS_RTR && from == IBV_QPS_INIT) {
    if (!has(mask, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                       IBV_QP_MIN_RNR_TIMER))
      return EINVAL;
    /* RoCE: addressed by GID only (fv_gid), from an entry of our own table. */
    if (!a->ah_attr.is_global || !fv_gid_ours(&a->ah_attr.grh.dgid) || a->ah_attr.grh.sgid_index >= fv_ngids ||
        a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096)
      return EINVAL;
    q->dgid = a->ah_attr.grh.dgid;
    atomic_store(&fv_last_sgid, a->ah_attr.grh.sgid_index);
    q->dqpn = a->dest_qp_num;
  } else if (to == IBV_QPS_RTS && from == IBV_QPS_RTR) {
    if (!has(mask, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
      return EINVAL;
    if (a->rnr_retry > 7 || a->retry_cnt > 7) return EINVAL;
    q->rnr_retry = a->rnr_retry;
  } else {
    return EINVAL;
  }
  q->qp.state = to;
  return 0;
}

FV_EXPORT int ibv_destroy_qp(struct ibv_qp *qp_) {
  fv_qp_t *q = (fv_qp_t *)qp_;
  fv_ctx_t *c = q->ctx;
  for (fv_qp_t **p = &c->qps; *p; p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      break;
    }
  q->sq_n = q->rq_n = 0; /* destroyed, not flushed: nothing more is reported */
  while (q->in_head) {
    fv_in_t *i = q->in_head;
    q->in_head = i->next;
    free(i->data);
    free(i);
  }
  free(q->sq);
  free(q->rq);
  free(q);
  return 0;
}

FV_EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event) {
  fv_ctx_t *c = ctx_of(ctx);
  if (!c->nevents) return errno = EAGAIN, -1;
  *event = c->events[0];
  memmove(c->events, c->events + 1, (size_t)--c->nevents * sizeof *c->events);
  if (!c->nevents) {
    uint64_t v;
    if (read(ctx->async_fd, &v, sizeof v) < 0) { /* the queue above is what counts */ }
  }
  return 0;
}

FV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event) { (void)event; }

FV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status st) {
  switch (st) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    default: return "error";
  }
}
