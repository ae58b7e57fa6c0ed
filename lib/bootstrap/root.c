/* root.c — the root listener: a thread that collects one hello per rank, then tells every rank
 * where rank+1 listens (fc_bootstrap_create_root: detached; fc_bootstrap_start_root: stopped and
 * joined by fc_bootstrap_stop_root); and the ids of launcher jobs, computed from
 * MASTER_ADDR:MASTER_PORT and a secret (fc_bootstrap_id_from_address). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "log.h"
#include "param.h"

FC_PARAM_INT(bootstrap_timeout, "BOOTSTRAP_TIMEOUT", 120)

/* ---- the root ----------------------------------------------------------------------------- */

struct fc_bootstrap_root {
  int lfd;
  int wake[2]; /* fc_bootstrap_stop_root writes to wake[1]; the thread polls wake[0] */
  int detached; /* nobody will stop or join it: it frees itself */
  int stopped;
  pthread_t thread;
  sem_t *started; /* root_spawn's, posted once the thread runs root_main (then NULL) */
  uint64_t magic;
  int nranks;  /* 0 until the first hello with the right magic */
  int joined;
  int poison;  /* nonzero: the conflicting rank count seen; the rendezvous can no longer complete */
  int told;    /* ranks told of the failure */
  int polled_slots;
  int *fds;    /* one block: per rank its connection (-1 until it joins), then... */
  unsigned char (*addrs)[ADDR_BYTES]; /* ...per rank its listen address */
  pend_t pend[ROOT_MAX_PENDING];
  pend_table_t pt;
  int64_t end; /* FLEXCOLL_BOOTSTRAP_TIMEOUT after the start */
  int64_t note_at; /* launcher jobs: when to say on stderr that the root still waits (0: never) */
  int64_t start;
  struct pollfd *pfds; /* listener, wake, pending connections, rank slots */
};
typedef fc_bootstrap_root_t root_t;

/* fork() safety.  UCX (libucm) hooks mmap/munmap and holds its own lock inside them; a process
 * forked while this thread is in such a call (malloc growing or trimming an arena) inherits the
 * lock held by nobody, and its ucp_init waits forever.  This is exactly what launchers and tests
 * do: create the id, then fork the ranks while the root serves them.  So the root thread's
 * allocations happen under a lock that fork() takes first (pthread_atfork).  Before those, the
 * thread's start itself allocates in runtimes the lock cannot cover (ASan's allocator takes its own
 * locks in its thread set-up), so root_spawn returns only once the thread runs root_main: a fork
 * right after flexcoll_get_unique_id cannot land in the middle of it. */
static pthread_mutex_t root_alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t root_atfork_once = PTHREAD_ONCE_INIT;
static void root_alloc_enter(void) { pthread_mutex_lock(&root_alloc_lock); }
static void root_alloc_leave(void) { pthread_mutex_unlock(&root_alloc_lock); }
static void root_install_atfork(void) { pthread_atfork(root_alloc_enter, root_alloc_leave, root_alloc_leave); }

/* Close every socket; the memory stays until root_free (the stopping thread may still look). */
static void root_close(root_t *r) {
  sock_close(&r->lfd);
  for (int i = 0; i < r->pt.n; i++) sock_close(&r->pend[i].fd);
  r->pt.n = 0;
  for (int i = 0; r->fds && i < r->nranks; i++) sock_close(&r->fds[i]);
}

static void root_free(root_t *r) {
  root_close(r);
  sock_close(&r->wake[0]);
  sock_close(&r->wake[1]);
  root_alloc_enter();
  free(r->fds);
  free(r->pfds);
  free(r);
  root_alloc_leave();
}

/* Best effort: a 48-byte reply fits in any fresh socket's send buffer, so a failure means the
 * client is gone, and blocking here would let one dead client stall everyone. */
static void root_reply(int fd, int status, int nranks, const unsigned char *next_addr) {
  unsigned char m[FRAME_BYTES + REPLY_BYTES] = {0};
  frame_put(m, TAG_REPLY, 0, REPLY_BYTES);
  put32(m + FRAME_BYTES, (uint32_t)status);
  put32(m + FRAME_BYTES + 4, (uint32_t)nranks);
  if (next_addr) memcpy(m + FRAME_BYTES + 8, next_addr, ADDR_BYTES);
  ssize_t k;
  do k = send(fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (k < 0 && errno == EINTR);
  if (k != (ssize_t)sizeof m) FC_INFO(FC_SUB_BOOT, "bootstrap root: could not answer a client (status %d)", status);
}

static void root_reject(pend_t *p, int status, int nranks, const char *why) {
  FC_INFO(FC_SUB_BOOT, "bootstrap root: rejected a hello: %s", why);
  root_reply(p->fd, status, nranks, NULL);
  sock_close(&p->fd);
}

static int root_size(root_t *r, int nranks) {
  root_alloc_enter();
  struct pollfd *pfds = realloc(r->pfds, (size_t)(2 + ROOT_MAX_PENDING + nranks) * sizeof *pfds);
  if (pfds) r->pfds = pfds;
  if (pfds) r->fds = malloc((size_t)nranks * (sizeof *r->fds + ADDR_BYTES));
  root_alloc_leave();
  if (!pfds || !r->fds) return -1;
  r->addrs = (unsigned char (*)[ADDR_BYTES])(r->fds + nranks);
  for (int i = 0; i < nranks; i++) r->fds[i] = -1;
  r->nranks = nranks;
  return 0;
}

/* Mismatched rank counts are a bug in the job: fail every rank now instead of letting them wait. */
static void root_poison(root_t *r, int other) {
  FC_WARN("bootstrap root: ranks disagree on the number of ranks (%d and %d); failing the rendezvous", r->nranks, other);
  r->poison = other;
  for (int i = 0; i < r->nranks; i++) {
    if (r->fds[i] < 0) continue;
    root_reply(r->fds[i], ST_NRANKS, other, NULL);
    sock_close(&r->fds[i]);
    r->told++;
  }
  r->joined = 0;
}

/* A whole first message is in p.  Only a hello with this job's magic is answered: to anything else
 * the root says nothing at all, so that a stranger learns nothing about the job. */
static void root_hello(root_t *r, pend_t *p) {
  fc_bs_hello_t h;
  int kind = fc_bs_hello_parse(p->buf, p->got, r->magic, &h);
  if (kind == FC_BS_HELLO_FOREIGN) {
    FC_INFO(FC_SUB_BOOT, "bootstrap root: dropped a connection that is not a flexcoll bootstrap client of this version");
    sock_close(&p->fd);
    return;
  }
  if (kind == FC_BS_HELLO_OTHER_JOB) {
    FC_INFO(FC_SUB_BOOT, "bootstrap root: dropped a hello with another communicator's magic (answering nothing)");
    sock_close(&p->fd);
    return;
  }
  int status = ST_OK, other = r->nranks;
  const char *why = NULL;
  if (r->poison) {
    status = ST_NRANKS, why = "the rendezvous failed earlier";
    if (kind == FC_BS_HELLO_OK && h.nranks == r->nranks) other = r->poison;
  } else if (kind != FC_BS_HELLO_OK) {
    status = ST_BADRANK, why = "bad rank, rank count or address";
  } else if (r->nranks == 0 && root_size(r, h.nranks) != 0) {
    status = ST_BADRANK, why = "out of memory";
  } else if (h.nranks != r->nranks) {
    root_poison(r, h.nranks);
    status = ST_NRANKS, why = "rank count mismatch";
  } else if (r->fds[h.rank] >= 0) {
    status = ST_DUP, why = "duplicate rank";
  }
  if (status != ST_OK) {
    r->told += (status == ST_NRANKS);
    root_reject(p, status, other, why);
    return;
  }
  r->fds[h.rank] = p->fd;
  p->fd = -1;
  memcpy(r->addrs[h.rank], h.addr, ADDR_BYTES);
  r->joined++;
  FC_TRACE(FC_SUB_BOOT, "bootstrap root: rank %d joined (%d of %d)", h.rank, r->joined, r->nranks);
}

/* Handle what the last poll reported (pfds: see root_t).  Hellos already in are read before new
 * connections are accepted, and every new one is read at once, so that a flood of connections
 * that say nothing cannot push a real rank's hello out unread. */
static void root_service(root_t *r) {
  int np = r->pt.n;
  int64_t now = now_ms();
  if (r->pfds[1].revents) r->stopped = 1;
  /* Slots first: a rank that died frees its slot before a restarted one could look like a duplicate. */
  for (int k = 0; k < r->polled_slots; k++) {
    if (r->fds[k] < 0 || !r->pfds[2 + np + k].revents) continue;
    /* A joined rank only waits for its reply; data or a hangup means it is gone or not ours. */
    FC_INFO(FC_SUB_BOOT, "bootstrap root: rank %d left before the rendezvous completed", k);
    sock_close(&r->fds[k]);
    r->joined--;
  }
  for (int i = 0; i < np; i++)
    if (r->pfds[2 + i].revents && fc_bs_pend_read(&r->pend[i], r->pt.want) < 0) sock_close(&r->pend[i].fd);
  r->pt.n = fc_bs_pend_compact(r->pend, r->pt.n);
  if (r->pfds[0].revents) fc_bs_pend_accept(r->lfd, &r->pt);
  for (int i = 0; i < r->pt.n; i++) {
    pend_t *p = &r->pend[i];
    if (p->fd < 0) continue;
    if (p->got == r->pt.want) root_hello(r, p);
    else if (now >= p->deadline) {
      FC_INFO(FC_SUB_BOOT, "bootstrap root: dropped a connection that sent no hello within %d ms", HELLO_TIMEOUT_MS);
      sock_close(&p->fd);
    }
  }
  r->pt.n = fc_bs_pend_compact(r->pend, r->pt.n);
}

static int root_poll(root_t *r, int64_t end) {
  int64_t now = now_ms(), wake = end < now + 1000 ? end : now + 1000;
  int n = 0;
  r->pfds[n++] = (struct pollfd){now >= r->pt.pause_until ? r->lfd : -1, POLLIN, 0};
  r->pfds[n++] = (struct pollfd){r->wake[0], POLLIN, 0};
  if (now < r->pt.pause_until && r->pt.pause_until < wake) wake = r->pt.pause_until;
  for (int i = 0; i < r->pt.n; i++) {
    r->pfds[n++] = (struct pollfd){r->pend[i].fd, POLLIN, 0};
    if (r->pend[i].deadline < wake) wake = r->pend[i].deadline;
  }
  for (int k = 0; k < r->nranks; k++) r->pfds[n++] = (struct pollfd){r->fds[k], POLLIN, 0};
  r->polled_slots = r->nranks;
  int rc = poll(r->pfds, (nfds_t)n, wake > now ? (int)(wake - now) : 0);
  if (rc < 0 && errno != EINTR) {
    FC_WARN("bootstrap root: poll: %s", strerror(errno));
    return -1;
  }
  if (rc < 0)
    for (int i = 0; i < n; i++) r->pfds[i].revents = 0;
  return 0;
}

static int root_done(const root_t *r) {
  /* A failed rendezvous stays to tell late ranks why, until as many as the larger count were told. */
  if (r->poison) return r->told >= (r->poison > r->nranks ? r->poison : r->nranks);
  return r->stopped || (r->nranks > 0 && r->joined == r->nranks);
}

/* The end of the rendezvous: every joined rank learns how it ended, so that none waits out its
 * own timeout for a root that has gone. */
static void root_finish(root_t *r) {
  if (!r->poison && r->nranks > 0 && r->joined == r->nranks && !r->stopped) {
    for (int k = 0; k < r->nranks; k++) root_reply(r->fds[k], ST_OK, r->nranks, r->addrs[(k + 1) % r->nranks]);
    FC_INFO(FC_SUB_BOOT, "bootstrap root: all %d ranks joined", r->nranks);
  } else if (!r->poison) {
    for (int k = 0; k < r->nranks; k++)
      if (r->fds[k] >= 0) root_reply(r->fds[k], ST_GAVEUP, r->joined, NULL);
    if (r->stopped)
      FC_INFO(FC_SUB_BOOT, "bootstrap root: stopped with %d of %d ranks joined", r->joined, r->nranks);
    else
      FC_WARN("bootstrap root: giving up (FLEXCOLL_BOOTSTRAP_TIMEOUT) with %d of %d ranks joined", r->joined,
              r->nranks);
  }
  if (r->pt.evicted || r->pt.closed)
    FC_INFO(FC_SUB_BOOT, "bootstrap root: %lu connections dropped for room, %lu closed before sending anything",
            r->pt.evicted, r->pt.closed);
  root_close(r);
}

/* A rank started alone under a launcher waits silently for minutes otherwise: say so, without
 * FLEXCOLL_DEBUG, first after 2 s and then every 30 s, with how many ranks have joined. */
static void root_note_waiting(root_t *r) {
  int64_t now = now_ms();
  if (!r->note_at || now < r->note_at || root_done(r)) return;
  r->note_at = now + 30000;
  char left[64] = "no limit";
  if (r->end != INT64_MAX) snprintf(left, sizeof left, "giving up in %lld s", (long long)((r->end - now + 999) / 1000));
  if (r->nranks)
    fprintf(stderr, "flexcoll: bootstrap root: waiting for the other ranks: %d of %d joined after %lld s (%s; "
            "FLEXCOLL_BOOTSTRAP_TIMEOUT)\n", r->joined, r->nranks, (long long)((now - r->start) / 1000), left);
  else
    fprintf(stderr, "flexcoll: bootstrap root: waiting for the ranks: none joined after %lld s (%s; "
            "FLEXCOLL_BOOTSTRAP_TIMEOUT)\n", (long long)((now - r->start) / 1000), left);
}

static void *root_main(void *arg) {
  root_t *r = arg;
  /* This thread's first allocation creates its malloc arena (an mmap): do it under the lock. */
  root_alloc_enter();
  free(malloc(64));
  root_alloc_leave();
  sem_t *started = r->started;
  r->started = NULL;
  sem_post(started);
  while (!root_done(r) && now_ms() < r->end) {
    if (root_poll(r, r->end) != 0) break;
    root_service(r);
    root_note_waiting(r);
  }
  root_finish(r);
  if (r->detached) root_free(r);
  return NULL;
}

/* Takes lfd: it is closed on failure.  handle NULL: a detached thread that frees itself.
 * note: say on stderr when the ranks are slow to come (launcher jobs, where each rank is started
 * by hand or by a launcher that may have lost some). */
static fc_result_t root_spawn(int lfd, uint64_t magic, root_t **handle, int note) {
  /* The parameter is read here, not in the thread, so that its first read is ordered before it. */
  int64_t limit_s = fc_param_bootstrap_timeout();
  pthread_once(&root_atfork_once, root_install_atfork);
  root_t *r = calloc(1, sizeof *r);
  if (r) {
    *r = (root_t){.lfd = lfd, .wake = {-1, -1}, .detached = !handle, .magic = magic,
                  .end = limit_s > 0 ? now_ms() + limit_s * 1000 : INT64_MAX, .start = now_ms(),
                  .note_at = note ? now_ms() + 2000 : 0,
                  .pfds = malloc((2 + ROOT_MAX_PENDING) * sizeof(struct pollfd))};
    r->pt = (pend_table_t){.v = r->pend, .cap = ROOT_MAX_PENDING, .want = PEND_BYTES, .hello_ms = HELLO_TIMEOUT_MS,
                           .who = "bootstrap root"};
  }
  if (!r || !r->pfds || pipe2(r->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    if (r) root_free(r);
    else close(lfd);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap root: out of memory or descriptors");
  }
  sem_t started;
  sem_init(&started, 0, 0);
  r->started = &started;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, handle ? PTHREAD_CREATE_JOINABLE : PTHREAD_CREATE_DETACHED);
  /* The thread inherits the mask: keep the application's signals (SIGINT...) for its own threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&r->thread, &attr, root_main, r);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    sem_destroy(&started);
    root_free(r);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap root: cannot start its thread: %s", strerror(rc));
  }
  /* Not before the thread has started (see root_alloc_lock).  The semaphore is this frame's: a
   * detached thread may free r at any time from now on. */
  while (sem_wait(&started) != 0 && errno == EINTR) {}
  sem_destroy(&started);
  if (handle) *handle = r;
  return FLEXCOLL_SUCCESS;
}

void fc_bootstrap_stop_root(fc_bootstrap_root_t *r) {
  if (!r) return;
  ssize_t k;
  do k = write(r->wake[1], "x", 1);
  while (k < 0 && errno == EINTR);
  pthread_join(r->thread, NULL);
  root_free(r);
}

flexcoll_result_t fc_bootstrap_create_root(flexcoll_unique_id_t *id) {
  if (!id) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap create root: NULL id");
  uint64_t magic;
  for (size_t got = 0; got < sizeof magic;) {
    ssize_t k = getrandom((char *)&magic + got, sizeof magic - got, 0);
    if (k > 0) got += (size_t)k;
    else if (errno != EINTR) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap: getrandom: %s", strerror(errno));
  }
  struct sockaddr_storage addr;
  socklen_t len;
  int fd;
  FC_CHECK(fc_bs_pick_interface(&addr, &len));
  FC_CHECK(fc_bs_listen_on(&addr, &len, 0, &fd, "bootstrap root"));
  fc_result_t res = fc_bootstrap_id_encode(id, magic, (struct sockaddr *)&addr, len);
  if (res != FLEXCOLL_SUCCESS) {
    close(fd);
    return res;
  }
  return root_spawn(fd, magic, NULL, 0);
}

/* "host:port" or "[v6addr]:port"; a bare IPv6 address splits at its last colon. */
static int split_hostport(const char *s, char *host, size_t hostlen, char *port, size_t portlen) {
  const char *h = s, *colon;
  size_t hl;
  if (*s == '[') {
    const char *rb = strchr(s, ']');
    if (!rb || rb[1] != ':') return -1;
    h = s + 1;
    hl = (size_t)(rb - h);
    colon = rb + 1;
  } else {
    if (!(colon = strrchr(s, ':'))) return -1;
    hl = (size_t)(colon - s);
  }
  const char *p = colon + 1;
  size_t pl = strlen(p);
  if (hl == 0 || hl >= hostlen || pl == 0 || pl > 5 || strspn(p, "0123456789") != pl) return -1;
  long v = strtol(p, NULL, 10);
  if (v < 1 || v > 65535) return -1;
  memcpy(host, h, hl);
  host[hl] = '\0';
  snprintf(port, portlen, "%ld", v);
  return 0;
}

flexcoll_result_t fc_bootstrap_id_from_address(flexcoll_unique_id_t *id, const char *hostport, int nranks,
                                               const char *secret) {
  char host[NI_MAXHOST], port[8];
  if (!id || !hostport) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap id from address: NULL argument");
  if (nranks < 1) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap id from address: %d ranks", nranks);
  if (split_hostport(hostport, host, sizeof host, port, sizeof port) != 0)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "bootstrap address \"%s\" is not host:port ([address]:port for IPv6, port 1-65535)", hostport);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *pick;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc != 0)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap address \"%s\": cannot resolve %s: %s", hostport, host,
                    gai_strerror(rc));
  /* Prefer IPv4 so that hosts whose resolvers order the families differently still agree. */
  for (pick = res; pick && pick->ai_family != AF_INET; pick = pick->ai_next) {}
  if (!pick) pick = res;
  unsigned char n[4];
  put32(n, (uint32_t)nranks);
  uint64_t magic = fnv1a64(fnv1a64(fnv1a64(FNV64_INIT, "flexcoll", 8), hostport, strlen(hostport)), n, 4);
  /* Without a secret everything above is public: whoever can reach the port could join. */
  if (secret && *secret) magic = fnv1a64(fnv1a64(magic, "secret", 6), secret, strlen(secret));
  fc_result_t r = fc_bootstrap_id_encode(id, magic, pick->ai_addr, pick->ai_addrlen);
  freeaddrinfo(res);
  return r;
}

static int is_loopback(const struct sockaddr_storage *a) {
  if (a->ss_family == AF_INET) return ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24 == 127;
  return a->ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

/* A host name (not an address, not "localhost") that this host resolves to loopback, as
 * /etc/hosts often maps the host's own name: other hosts reach this one under another address. */
static int name_on_loopback(const struct sockaddr_storage *a, const char *hostport) {
  char host[NI_MAXHOST], port[8];
  unsigned char bin[16];
  if (!hostport || !is_loopback(a) || split_hostport(hostport, host, sizeof host, port, sizeof port) != 0) return 0;
  return hostport[0] != '[' && inet_pton(AF_INET, host, bin) != 1 && strcmp(host, "localhost") != 0;
}

/* Where a launcher job's root listens: on the id's own address, which the other ranks connect
 * to, so that a root given 127.0.0.1 cannot be reached from the network.  Where this host cannot
 * bind that address (a NAT or proxy address, or a name that maps to loopback here but not on the
 * other hosts), on FLEXCOLL_SOCKET_IFNAME's address, else on every address, with a log line. */
static fc_result_t root_bind(const struct sockaddr_storage *idaddr, socklen_t idlen, const char *hostport, int *fd) {
  const char *what = "bootstrap root (is another job using this port?)";
  uint16_t port = idaddr->ss_family == AF_INET ? ((const struct sockaddr_in *)idaddr)->sin_port
                                               : ((const struct sockaddr_in6 *)idaddr)->sin6_port;
  struct sockaddr_storage a = *idaddr;
  socklen_t len = idlen;
  char buf[96];
  fc_bs_addr_str(idaddr, idlen, buf, sizeof buf);
  if (!name_on_loopback(idaddr, hostport)) {
    fc_result_t res = fc_bs_listen_on(&a, &len, 1, fd, what);
    if (res == FLEXCOLL_SUCCESS || errno != EADDRNOTAVAIL) return res;
  }
  if (fc_param_str("FLEXCOLL_SOCKET_IFNAME", NULL)) {
    FC_CHECK(fc_bs_pick_interface(&a, &len));
    set_port(&a, port);
    return fc_bs_listen_on(&a, &len, 1, fd, what);
  }
  if (name_on_loopback(idaddr, hostport))
    FC_INFO(FC_SUB_BOOT, "bootstrap root: %s is %s on this host, but other hosts reach it elsewhere; listening on every "
            "address (FLEXCOLL_SOCKET_IFNAME or an address in FLEXCOLL_ROOT restricts it)", hostport, buf);
  else
    FC_WARN("bootstrap root: %s is not an address of this host (NAT? proxy?); listening on every address "
            "(FLEXCOLL_SOCKET_IFNAME restricts it)", buf);
  memset(&a, 0, sizeof a);
  a.ss_family = idaddr->ss_family;
  set_port(&a, port);
  len = idlen;
  return fc_bs_listen_on(&a, &len, 1, fd, what);
}

flexcoll_result_t fc_bootstrap_start_root(const flexcoll_unique_id_t *id, const char *hostport,
                                          fc_bootstrap_root_t **root) {
  uint64_t magic;
  struct sockaddr_storage addr;
  socklen_t len;
  int fd;
  if (!root) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap start root: NULL root");
  *root = NULL;
  FC_CHECK(fc_bootstrap_id_decode(id, &magic, &addr, &len));
  FC_CHECK(root_bind(&addr, len, hostport, &fd));
  return root_spawn(fd, magic, root, 1);
}
