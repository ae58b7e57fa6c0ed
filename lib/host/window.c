/* window.c — host memory that the processes of one host map into one another (flexcoll_host_alloc)
 * and symmetric windows on it (flexcoll_window_register on host memory; shm.h).
 *
 * An allocation is a memory file (memfd_create: no name in any file system, so nothing is left
 * behind whatever happens to the process) mapped shared; its pages are reserved when it is made
 * (fallocate), so that running out of memory is an error of flexcoll_host_alloc instead of a
 * SIGBUS at first touch.  Registering a window hands the file to every peer in another process
 * over an abstract Unix socket (SCM_RIGHTS: no ptrace rights needed, unlike /proc/PID/fd or
 * pidfd_getfd; the socket too is gone with its process); each peer maps the whole allocation, and
 * the ranks agree that all mappings succeeded before any uses them.  Peers in this process (ranks
 * as threads) use the owner's pointers as they are.
 *
 * The windows keep the mappings until they are deregistered or the communicator is destroyed; an
 * allocation counts the live windows in it, and flexcoll_host_free refuses it while any is left. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"
#include "error.h"
#include "host/shm.h"
#include "log.h"
#include "window.h"

#define HOST_WINDOW_MAGIC 0x686f737477696eULL /* "hostwin" */

/* ---- allocations --------------------------------------------------------------------------- */

typedef struct alloc {
  char *base;
  size_t bytes; /* mapped (whole pages) */
  int fd;
  int windows;  /* live windows in it */
  struct alloc *next;
} alloc_t;

static pthread_mutex_t allocs_lock = PTHREAD_MUTEX_INITIALIZER;
static alloc_t *allocs;

/* The allocation holding ptr; the caller holds allocs_lock. */
static alloc_t *alloc_of(const void *ptr) {
  for (alloc_t *a = allocs; a; a = a->next)
    if ((const char *)ptr >= a->base && (const char *)ptr < a->base + a->bytes) return a;
  return NULL;
}

flexcoll_result_t flexcoll_host_alloc(size_t bytes, void **ptr) {
  const char *fn = "flexcoll_host_alloc";
  if (!ptr) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  *ptr = NULL;
  if (bytes == 0) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: bytes is 0", fn);
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (bytes > SIZE_MAX - page || bytes > (size_t)INT64_MAX / 2)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: bytes %zu is too large", fn, bytes);
  const size_t len = (bytes + page - 1) / page * page;
  alloc_t *a = calloc(1, sizeof *a);
  if (!a) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "%s: out of memory", fn);
  int fd = memfd_create("flexcoll-host", MFD_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    free(a);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "%s: cannot make a memory file (memfd_create: %s)", fn, strerror(e));
  }
  int err = posix_fallocate(fd, 0, (off_t)len);
  if (err) {
    close(fd);
    free(a);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "%s: no memory for %zu bytes (%s)", fn, len, strerror(err));
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    free(a);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "%s: cannot map %zu bytes (%s)", fn, len, strerror(e));
  }
  *a = (alloc_t){.base = p, .bytes = len, .fd = fd};
  pthread_mutex_lock(&allocs_lock);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&allocs_lock);
  *ptr = p;
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t flexcoll_host_free(void *ptr) {
  const char *fn = "flexcoll_host_free";
  if (!ptr) return FLEXCOLL_SUCCESS;
  pthread_mutex_lock(&allocs_lock);
  alloc_t **link = &allocs;
  while (*link && (*link)->base != (char *)ptr) link = &(*link)->next;
  alloc_t *a = *link;
  if (!a) {
    pthread_mutex_unlock(&allocs_lock);
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: ptr %p is not an allocation of flexcoll_host_alloc (or was "
                    "freed already)", fn, ptr);
  }
  if (a->windows) {
    int w = a->windows;
    pthread_mutex_unlock(&allocs_lock);
    return fc_error(NULL, FLEXCOLL_INVALID_USAGE, "%s: ptr %p holds %d registered window%s: deregister %s first "
                    "(flexcoll_window_deregister)", fn, ptr, w, w == 1 ? "" : "s", w == 1 ? "it" : "them");
  }
  *link = a->next;
  pthread_mutex_unlock(&allocs_lock);
  munmap(a->base, a->bytes);
  close(a->fd);
  free(a);
  return FLEXCOLL_SUCCESS;
}

/* ---- windows ------------------------------------------------------------------------------- */

/* What one rank tells the others when registering a host window. */
typedef struct {
  int32_t error;        /* FLEXCOLL_SUCCESS or why this rank cannot register */
  int32_t pid;
  uint64_t bytes;       /* the window's */
  uint64_t ptr;         /* the window's start in the owner's address space */
  uint64_t offset;      /* from the start of its allocation */
  uint64_t alloc_bytes; /* the allocation's */
  char name[64];        /* the abstract socket that hands out the allocation's file; "" if none */
} host_desc_t;

/* One registration's sockets: this rank's listener and its connections to the peers' (-1: none). */
typedef struct {
  int listener;
  int *to; /* [q] */
} host_socks_t;

/* This rank's part: [buf, buf + bytes) inside one allocation.  *fd gets the allocation's file. */
static flexcoll_result_t describe(struct flexcoll_comm *comm, void *buf, size_t bytes, host_desc_t *d, int *fd) {
  const char *fn = "flexcoll_window_register";
  pthread_mutex_lock(&allocs_lock);
  alloc_t *a = alloc_of(buf);
  size_t room = a ? a->bytes - (size_t)((char *)buf - a->base) : 0;
  if (a) {
    d->offset = (uint64_t)((char *)buf - a->base);
    d->alloc_bytes = a->bytes;
    *fd = a->fd;
  }
  pthread_mutex_unlock(&allocs_lock);
  if (!a)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: buf %p is host memory that flexcoll_host_alloc did not allocate "
                    "(other processes can map only that)", fn, buf);
  if (bytes > room)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: bytes %zu run past the end of buf's allocation (%zu bytes "
                    "from buf)", fn, bytes, room);
  d->bytes = bytes;
  d->ptr = (uint64_t)(uintptr_t)buf;
  d->pid = (int32_t)getpid();
  return FLEXCOLL_SUCCESS;
}

static void abstract_addr(const char name[64], struct sockaddr_un *a, socklen_t *len) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  size_t n = strnlen(name, 63);
  memcpy(a->sun_path + 1, name, n); /* sun_path[0] = 0: abstract, nothing in any file system */
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* The listener that hands this rank's file to its peers in other processes: an abstract socket
 * (gone with the process, whatever happens to it).  d->name stays "" where it cannot be made. */
static int listen_for_peers(int n, host_desc_t *d) {
  static _Atomic unsigned names;
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  char name[sizeof d->name];
  snprintf(name, sizeof name, "flexcoll-win-%d-%u", (int)getpid(), atomic_fetch_add(&names, 1));
  struct sockaddr_un a;
  socklen_t len;
  abstract_addr(name, &a, &len);
  if (bind(s, (struct sockaddr *)&a, len) != 0 || listen(s, n) != 0) {
    FC_INFO(FC_SUB_COLL, "host window: no socket to hand the file to the peers (%s)", strerror(errno));
    close(s);
    return -1;
  }
  memcpy(d->name, name, sizeof name);
  return s;
}

/* Wait (poll) until fd is ready for ev, at most ms; 0 if it is not. */
static int ready(int fd, short ev, int ms) {
  struct pollfd p = {.fd = fd, .events = ev};
  int r;
  while ((r = poll(&p, 1, ms)) < 0 && errno == EINTR) {}
  return r > 0;
}

static int send_fd(int s, int fd) {
  char byte = 0, ctl[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = &byte, .iov_len = 1};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  memset(ctl, 0, sizeof ctl);
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(s, &msg, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

static int recv_fd(int s) {
  char byte, ctl[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {.iov_base = &byte, .iov_len = 1};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  if (recvmsg(s, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int))) return -1;
  int fd;
  memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

/* Map rank q's allocation (described by d), whose file came on socket s: *at gets its start. */
static flexcoll_result_t map_peer(struct flexcoll_comm *comm, int q, const host_desc_t *d, int s, int wait_ms,
                                  char **at) {
  int fd = ready(s, POLLIN, wait_ms) ? recv_fd(s) : -1;
  if (fd < 0)
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "flexcoll_window_register: rank %d's window file did not come (%s)", q,
                    errno ? strerror(errno) : "timeout");
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < d->alloc_bytes) {
    close(fd);
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "flexcoll_window_register: rank %d's window file is not the allocation "
                    "it described", q);
  }
  /* Populated now: the first collective on the window pays no page faults. */
  void *p = mmap(NULL, d->alloc_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "flexcoll_window_register: cannot map rank %d's window (%zu bytes: "
                    "%s)", q, (size_t)d->alloc_bytes, strerror(e));
  *at = p;
  return FLEXCOLL_SUCCESS;
}

/* Every rank maps every peer of another process: connect to each peer's listener (its backlog
 * holds them all, so no connect waits), hand our file to each peer that connects to us, then
 * take each peer's file from our connections.  No step waits for a later one of another rank, so
 * ranks cannot wait on one another in a cycle; a peer that never connects (it failed before)
 * costs at most wait_ms. */
static flexcoll_result_t map_peers(struct flexcoll_comm *comm, const host_desc_t *all, int fd, host_socks_t *k,
                                   struct flexcoll_window *w) {
  const int me = comm->rank, n = comm->nranks;
  const int32_t pid = (int32_t)getpid();
  const int wait_ms = comm->timeout_ms > 0 && comm->timeout_ms < 10000 ? comm->timeout_ms : 10000;
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  int callers = 0;
  for (int q = 0; q < n; q++) {
    if (q == me || all[q].pid == pid) continue;
    if (all[me].name[0]) callers++;
    if (!all[q].name[0]) {
      if (res == FLEXCOLL_SUCCESS)
        res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "flexcoll_window_register: rank %d cannot hand out its window", q);
      continue;
    }
    struct sockaddr_un a;
    socklen_t len;
    abstract_addr(all[q].name, &a, &len);
    k->to[q] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (k->to[q] < 0 || connect(k->to[q], (struct sockaddr *)&a, len) != 0) {
      if (res == FLEXCOLL_SUCCESS)
        res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "flexcoll_window_register: cannot reach rank %d's window (%s)", q,
                       strerror(errno));
      if (k->to[q] >= 0) close(k->to[q]);
      k->to[q] = -1;
    }
  }
  for (int i = 0; i < callers && k->listener >= 0; i++) {
    int c = ready(k->listener, POLLIN, wait_ms) ? accept4(k->listener, NULL, NULL, SOCK_CLOEXEC) : -1;
    if (c < 0) break; /* a peer that did not connect fails on its side */
    if (send_fd(c, fd) != 0 && res == FLEXCOLL_SUCCESS)
      res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "flexcoll_window_register: cannot hand the window to a peer (%s)",
                     strerror(errno));
    close(c);
  }
  for (int q = 0; q < n && res == FLEXCOLL_SUCCESS; q++) {
    if (q == me) continue;
    if (all[q].pid == pid) {
      w->peer[q] = (char *)(uintptr_t)all[q].ptr; /* this process: the owner's pointer as it is */
      continue;
    }
    res = map_peer(comm, q, &all[q], k->to[q], wait_ms, &w->mapping[q]);
    if (res == FLEXCOLL_SUCCESS) {
      w->mapped[q] = all[q].alloc_bytes;
      w->peer[q] = w->mapping[q] + all[q].offset;
    }
  }
  return res;
}

static void close_socks(host_socks_t *k, int n) {
  if (k->listener >= 0) close(k->listener);
  k->listener = -1;
  for (int q = 0; k->to && q < n; q++)
    if (k->to[q] >= 0) close(k->to[q]);
  free(k->to);
  k->to = NULL;
}

static void window_free(struct flexcoll_window *w, int n) {
  if (!w) return;
  for (int q = 0; w->mapping && q < n; q++)
    if (w->mapping[q]) munmap(w->mapping[q], w->mapped[q]);
  pthread_mutex_lock(&allocs_lock);
  alloc_t *a = w->base ? alloc_of(w->base) : NULL;
  if (a && w->magic == HOST_WINDOW_MAGIC) a->windows--;
  pthread_mutex_unlock(&allocs_lock);
  w->magic = 0;
  free(w->peer);
  free(w->mapping);
  free(w->mapped);
  free(w);
}

flexcoll_result_t fc_host_window_register(struct flexcoll_comm *comm, void *buf, size_t bytes,
                                          struct flexcoll_window **out) {
  const int me = comm->rank, n = comm->nranks;
  /* Only ranks that share a segment read one another's windows (shm.c's window mode); on other
   * communicators the window is kept unmapped, so that its calls and its deregistration work. */
  const int shared = comm->shm != NULL;
  host_desc_t *all = calloc((size_t)n, sizeof *all);
  struct flexcoll_window *w = calloc(1, sizeof *w);
  int *mapped_ok = calloc((size_t)n, sizeof *mapped_ok), fd = -1;
  host_socks_t k = {.listener = -1, .to = calloc((size_t)n, sizeof(int))};
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (!all || !w || !mapped_ok || !k.to || !(w->peer = calloc((size_t)n, sizeof *w->peer)) ||
      !(w->mapping = calloc((size_t)n, sizeof *w->mapping)) || !(w->mapped = calloc((size_t)n, sizeof *w->mapped))) {
    res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "flexcoll_window_register: out of memory");
    /* The peers wait in the exchange below: take part, with the error. */
    if (all) all[me].error = res;
    else goto fail;
  }
  for (int q = 0; k.to && q < n; q++) k.to[q] = -1;
  /* A rank that cannot register still takes part in the exchanges, so that every rank returns an
   * error instead of waiting for it. */
  if (res == FLEXCOLL_SUCCESS) all[me].error = describe(comm, buf, bytes, &all[me], &fd);
  if (all[me].error == FLEXCOLL_SUCCESS && shared && n > 1) k.listener = listen_for_peers(n, &all[me]);
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, all, sizeof *all), res, fail);
  if (all[me].error != FLEXCOLL_SUCCESS) {
    res = all[me].error;
    goto fail;
  }
  for (int q = 0; q < n; q++) {
    if (all[q].error != FLEXCOLL_SUCCESS) {
      res = fc_error(comm, FLEXCOLL_INVALID_USAGE, "flexcoll_window_register: rank %d could not register its buffer", q);
      goto fail;
    }
    if (all[q].bytes != bytes) {
      res = fc_error(comm, FLEXCOLL_INVALID_USAGE, "flexcoll_window_register: rank %d registers %llu bytes, this rank %zu "
                     "(windows must be equal)", q, (unsigned long long)all[q].bytes, bytes);
      goto fail;
    }
  }
  w->peer[me] = buf;
  flexcoll_result_t mine = shared ? map_peers(comm, all, fd, &k, w) : FLEXCOLL_SUCCESS;
  close_socks(&k, n);
  /* Every rank's mappings succeeded, or no rank keeps any: the window is then registered unmapped
   * on every rank (windows are a speed-up, never a requirement) and its calls take the other paths. */
  mapped_ok[me] = mine == FLEXCOLL_SUCCESS;
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, mapped_ok, sizeof *mapped_ok), res, fail);
  int everywhere = shared;
  for (int q = 0; q < n; q++) everywhere &= mapped_ok[q];
  if (shared && !everywhere) {
    FC_INFO(FC_SUB_COLL, "rank %d: host window not mapped into the peers (%s): its calls take the other paths", me,
            mine != FLEXCOLL_SUCCESS ? flexcoll_get_last_error(comm) : "a peer could not map it");
    for (int q = 0; q < n; q++) {
      if (w->mapping[q]) munmap(w->mapping[q], w->mapped[q]);
      w->mapping[q] = NULL;
      w->peer[q] = q == me ? buf : NULL;
    }
  }
  pthread_mutex_lock(&allocs_lock);
  alloc_t *a = alloc_of(buf);
  if (a) a->windows++;
  pthread_mutex_unlock(&allocs_lock);
  w->magic = HOST_WINDOW_MAGIC;
  w->comm = comm;
  w->base = buf;
  w->bytes = bytes;
  w->mapped_all = everywhere;
  w->id = comm->host_windows_registered++;
  w->next = comm->host_windows;
  comm->host_windows = w;
  FC_INFO(FC_SUB_COLL, "rank %d: host window %u registered: %zu bytes at %p%s", me, w->id, bytes, buf,
          everywhere ? "" : " (not mapped into the peers)");
  free(all);
  free(mapped_ok);
  *out = w;
  return FLEXCOLL_SUCCESS;
fail:
  close_socks(&k, n);
  free(all);
  free(mapped_ok);
  window_free(w, n);
  return res;
}

int fc_host_window_valid(struct flexcoll_comm *comm, const struct flexcoll_window *w) {
  return fc_window_listed(comm->host_windows, w);
}

flexcoll_result_t fc_host_window_deregister(struct flexcoll_comm *comm, struct flexcoll_window *w) {
  struct flexcoll_window **link = &comm->host_windows;
  while (*link && *link != w) link = &(*link)->next;
  if (!*link)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_window_deregister: window is not registered on this "
                    "communicator");
  /* Host collectives end when every rank is done with every buffer of the call (shm.c's last
   * round): nothing of this communicator touches the window now. */
  *link = w->next;
  FC_INFO(FC_SUB_COLL, "rank %d: host window %u deregistered", comm->rank, w->id);
  window_free(w, comm->nranks);
  /* Collective, like the device windows' (after it no rank holds the window). */
  return fc_bootstrap_barrier(comm->bootstrap);
}

void fc_host_windows_release(struct flexcoll_comm *comm) {
  for (struct flexcoll_window *w = comm->host_windows, *next; w; w = next) {
    next = w->next;
    window_free(w, comm->nranks);
  }
  comm->host_windows = NULL;
}

/* [ptr, ptr + bytes) in one of comm's host windows: the window and ptr's offset in it. */
static const struct flexcoll_window *window_of(const struct flexcoll_comm *comm, const void *ptr, size_t bytes,
                                               size_t *offset) {
  for (const struct flexcoll_window *w = comm->host_windows; w; w = w->next)
    if (w->mapped_all && fc_window_covers(w, ptr, bytes, offset)) return w;
  return NULL;
}

int fc_host_windows_find(const struct flexcoll_comm *comm, fc_coll_t coll, const void *sendbuf, size_t send_bytes,
                         const void *recvbuf, size_t recv_bytes, fc_shm_windows_t *out) {
  if (!comm->host_windows || !comm->shm) return 0;
  /* The buffers the peers touch: allreduce both, reduce_scatter and broadcast the input (every
   * rank's sendbuf, so that every rank decides alike; in place, as frameworks call broadcast, it
   * is the output too), allgather the output. */
  const int send = coll == FC_COLL_ALLREDUCE || coll == FC_COLL_REDUCE_SCATTER || coll == FC_COLL_BROADCAST;
  const int recv = coll == FC_COLL_ALLREDUCE || coll == FC_COLL_ALLGATHER;
  *out = (fc_shm_windows_t){NULL, NULL, 0, 0};
  if (!send && !recv) return 0;
  if (send && !(out->send = window_of(comm, sendbuf, send_bytes, &out->send_off))) return 0;
  if (recv && !(out->recv = window_of(comm, recvbuf, recv_bytes, &out->recv_off))) return 0;
  return 1;
}
