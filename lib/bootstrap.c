/* bootstrap.c — the TCP rendezvous of a communicator's ranks (root listener, ring, all-gather).
 *
 * Wire formats are fixed-size and big-endian, written byte by byte, so that ids and messages mean
 * the same on every host whatever its compiler's struct layout.  Every socket is nonblocking and
 * every wait goes through poll, so that a timeout or an abort is never stuck behind a read. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bootstrap.h"

#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "param.h"

FC_PARAM_INT(bootstrap_timeout, "BOOTSTRAP_TIMEOUT", 120)

enum {
  ID_VERSION = 1,
  PROTO_VERSION = 1,
  ADDR_BYTES = 24,       /* family, 0, port, 16 address bytes, IPv6 scope id */
  ID_CHECKED_BYTES = 36, /* version, "fcb", magic, address; the checksum follows */
  ID_USED_BYTES = 40,
  HELLO_BYTES = 24 + ADDR_BYTES, /* tag, version, magic, rank, nranks, listen address */
  REPLY_BYTES = 12 + ADDR_BYTES, /* tag, status, nranks, address of rank+1 */
  RING_BYTES = 16,               /* tag, magic, rank */
  AG_HDR_BYTES = 16,             /* tag, call number, bytes */
  ROOT_MAX_PENDING = 128,
  RING_MAX_PENDING = 8,
  HELLO_TIMEOUT_MS = 10000,
  SLICE_MS = 50,
};
#define TAG_HELLO 0x46434248u /* "FCBH" */
#define TAG_REPLY 0x46434252u /* "FCBR" */
#define TAG_RING 0x4643424cu  /* "FCBL" */
#define TAG_AG 0x46434241u    /* "FCBA" */
#define FNV64_INIT 0xcbf29ce484222325ULL

enum { ST_OK, ST_MAGIC, ST_NRANKS, ST_BADRANK, ST_DUP };

struct fc_bootstrap {
  int rank, nranks, timeout_ms;
  atomic_int *abort_flag;
  uint64_t magic;
  int next_fd, prev_fd; /* ring sockets; -1 when nranks == 1 */
  uint32_t seq;         /* all-gathers so far, compared between neighbours to catch a desync */
};

/* A connection that has not yet proven what it is: read side by side with the others. */
typedef struct {
  int fd;
  size_t got;
  int64_t deadline;
  unsigned char buf[HELLO_BYTES];
} pend_t;

/* ---- small helpers ---------------------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v) { for (int i = 3; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v; }
static void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }
static uint32_t get32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

static uint64_t fnv1a64(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static int64_t deadline_in(int ms) { return ms > 0 ? now_ms() + ms : INT64_MAX; }
static int again(int e) { return e == EINTR || e == EAGAIN || e == EWOULDBLOCK; }

static void set_port(struct sockaddr_storage *ss, uint16_t port_be) {
  if (ss->ss_family == AF_INET) ((struct sockaddr_in *)ss)->sin_port = port_be;
  else ((struct sockaddr_in6 *)ss)->sin6_port = port_be;
}

static void sock_close(int *fd) {
  /* No retry on EINTR: Linux has released the descriptor anyway, and it may already be reused. */
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static const char *addr_str(const struct sockaddr_storage *ss, socklen_t len, char *buf, size_t n) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo((const struct sockaddr *)ss, len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    snprintf(buf, n, "<unprintable address>");
  else
    snprintf(buf, n, ss->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
  return buf;
}

static int addr_pack(unsigned char *p, const struct sockaddr *sa, socklen_t len) {
  const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
  const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
  memset(p, 0, ADDR_BYTES);
  if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof *in) {
    p[0] = 4;
    memcpy(p + 2, &in->sin_port, 2);
    memcpy(p + 4, &in->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof *in6) {
    p[0] = 6;
    memcpy(p + 2, &in6->sin6_port, 2);
    memcpy(p + 4, &in6->sin6_addr, 16);
    put32(p + 20, in6->sin6_scope_id);
  }
  return p[0] && (p[2] | p[3]) ? 0 : -1; /* port 0 cannot be connected to */
}

static int addr_unpack(const unsigned char *p, struct sockaddr_storage *ss, socklen_t *len) {
  struct sockaddr_in *in = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
  memset(ss, 0, sizeof *ss);
  if (p[1] != 0 || (p[2] | p[3]) == 0 || (p[0] != 4 && p[0] != 6)) return -1;
  for (int i = 8; p[0] == 4 && i < ADDR_BYTES; i++)
    if (p[i]) return -1;
  if (p[0] == 4) {
    in->sin_family = AF_INET;
    memcpy(&in->sin_port, p + 2, 2);
    memcpy(&in->sin_addr, p + 4, 4);
    *len = sizeof *in;
  } else {
    in6->sin6_family = AF_INET6;
    memcpy(&in6->sin6_port, p + 2, 2);
    memcpy(&in6->sin6_addr, p + 4, 16);
    in6->sin6_scope_id = get32(p + 20);
    *len = sizeof *in6;
  }
  return 0;
}

/* ---- unique id -------------------------------------------------------------------------- */

flexcoll_result_t fc_bootstrap_id_encode(flexcoll_unique_id_t *id, uint64_t magic, const struct sockaddr *addr,
                                         socklen_t len) {
  if (!id || !addr) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap id encode: NULL %s", id ? "address" : "id");
  unsigned char *p = (unsigned char *)id->internal;
  memset(id, 0, sizeof *id);
  p[0] = ID_VERSION;
  memcpy(p + 1, "fcb", 3);
  put64(p + 4, magic);
  if (addr_pack(p + 12, addr, len) != 0)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "bootstrap id encode: address (family %d, length %u) is not an IPv4/IPv6 address with a port",
                    (int)addr->sa_family, (unsigned)len);
  put32(p + ID_CHECKED_BYTES, (uint32_t)fnv1a64(FNV64_INIT, p, ID_CHECKED_BYTES));
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_bootstrap_id_decode(const flexcoll_unique_id_t *id, uint64_t *magic,
                                         struct sockaddr_storage *addr, socklen_t *len) {
  if (!id || !magic || !addr || !len) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap id decode: NULL argument");
  const unsigned char *p = (const unsigned char *)id->internal;
  const char *why = NULL;
  if (p[0] != ID_VERSION || memcmp(p + 1, "fcb", 3) != 0) why = "unknown version or marker";
  else if (get32(p + ID_CHECKED_BYTES) != (uint32_t)fnv1a64(FNV64_INIT, p, ID_CHECKED_BYTES)) why = "bad checksum";
  else if (addr_unpack(p + 12, addr, len) != 0) why = "bad address";
  for (int i = ID_USED_BYTES; !why && i < FLEXCOLL_UNIQUE_ID_BYTES; i++)
    if (p[i]) why = "nonzero padding";
  if (why)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "unique id is not well formed (%s); it must come from flexcoll_get_unique_id, unchanged", why);
  *magic = get64(p + 4);
  return FLEXCOLL_SUCCESS;
}

/* ---- interfaces and listeners ------------------------------------------------------------ */

/* NCCL_SOCKET_IFNAME syntax: optional '^' (exclude), optional '=' (exact names), comma list. */
static int ifname_selected(const char *spec, const char *name) {
  int exclude = (*spec == '^');
  spec += exclude;
  int exact = (*spec == '=');
  spec += exact;
  for (const char *t = spec; *t;) {
    size_t n = strcspn(t, ",");
    if (n > 0 && strncmp(name, t, n) == 0 && (!exact || name[n] == '\0')) return !exclude;
    t += n + (t[n] == ',');
  }
  return exclude;
}

/* Preference of an interface address, lower is better; -1: not usable. */
static int if_score(const struct ifaddrs *ifa, const char *spec) {
  if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) return -1;
  int family = ifa->ifa_addr->sa_family;
  if (family != AF_INET && family != AF_INET6) return -1;
  int v6 = (family == AF_INET6);
  if (spec) {
    int linklocal = v6 && IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr);
    return ifname_selected(spec, ifa->ifa_name) ? v6 + linklocal : -1;
  }
  if (ifa->ifa_flags & IFF_LOOPBACK) return v6 ? -1 : 2;
  if (v6 || !(ifa->ifa_flags & IFF_RUNNING)) return -1;
  /* Container and VM bridges are up on many hosts but rarely reach other hosts: last resort. */
  static const char *const virt[] = {"docker", "veth", "virbr", "br-"};
  for (size_t i = 0; i < sizeof virt / sizeof virt[0]; i++)
    if (strncmp(ifa->ifa_name, virt[i], strlen(virt[i])) == 0) return 1;
  return 0;
}

static fc_result_t pick_interface(struct sockaddr_storage *addr, socklen_t *len) {
  const char *spec = fc_param_str("FLEXCOLL_SOCKET_IFNAME", NULL);
  struct ifaddrs *list;
  if (getifaddrs(&list) != 0)
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap: getifaddrs: %s", strerror(errno));
  int best = INT_MAX;
  char name[IF_NAMESIZE + 1] = "";
  for (struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
    int score = if_score(ifa, spec);
    if (score < 0 || score >= best) continue;
    best = score;
    *len = ifa->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    memset(addr, 0, sizeof *addr);
    memcpy(addr, ifa->ifa_addr, *len);
    snprintf(name, sizeof name, "%s", ifa->ifa_name);
  }
  freeifaddrs(list);
  if (best == INT_MAX)
    return spec ? fc_error(NULL, FLEXCOLL_INVALID_USAGE,
                           "FLEXCOLL_SOCKET_IFNAME=%s matches no interface that is up and has an IP address", spec)
                : fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap: no network interface is up, not even loopback");
  set_port(addr, 0);
  char buf[96];
  FC_INFO(FC_SUB_BOOT, "bootstrap: interface %s, address %s", name, addr_str(addr, *len, buf, sizeof buf));
  return FLEXCOLL_SUCCESS;
}

/* Bind a nonblocking listener to *addr (port 0: any free port) and report the bound address. */
static fc_result_t listen_on(struct sockaddr_storage *addr, socklen_t *len, int reuse, int *fd_out, const char *what) {
  char buf[96];
  int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "%s: socket: %s", what, strerror(errno));
  int one = 1, zero = 0;
  /* A restarted job reuses MASTER_PORT while the last job's connections sit in TIME_WAIT. */
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  /* On the IPv6 wildcard, also take IPv4 clients, whose resolver may have preferred IPv4. */
  if (addr->ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  addr_str(addr, *len, buf, sizeof buf);
  socklen_t bound = sizeof *addr;
  if (bind(fd, (struct sockaddr *)addr, *len) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, (struct sockaddr *)addr, &bound) != 0) {
    int e = errno;
    close(fd);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "%s: cannot listen on %s: %s", what, buf, strerror(e));
  }
  *len = bound;
  *fd_out = fd;
  return FLEXCOLL_SUCCESS;
}

/* Take every queued connection.  When the table is full the oldest entry goes, so that a flood
 * of idle connections cannot keep a real peer out. */
static void pend_accept(int lfd, pend_t *v, int *n, int cap, int hello_ms, int64_t *pause_until) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      /* Out of descriptors or memory: the connection stays queued and poll would spin on it. */
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        FC_INFO(FC_SUB_BOOT, "bootstrap: accept: %s; pausing", strerror(errno));
        *pause_until = now_ms() + 100;
      }
      return;
    }
    if (*n == cap) {
      close(v[0].fd);
      memmove(v, v + 1, (size_t)(cap - 1) * sizeof *v);
      (*n)--;
    }
    v[(*n)++] = (pend_t){.fd = fd, .deadline = hello_ms > 0 ? now_ms() + hello_ms : INT64_MAX};
  }
}

/* 1: `want` bytes are in; 0: more to come; -1: closed or failed before a whole hello. */
static int pend_read(pend_t *p, size_t want) {
  while (p->got < want) {
    ssize_t k = recv(p->fd, p->buf + p->got, want - p->got, MSG_DONTWAIT);
    if (k > 0) p->got += (size_t)k;
    else if (k == 0 || !again(errno)) return -1;
    else if (errno != EINTR) return 0;
  }
  return 1;
}

static int pend_compact(pend_t *v, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (v[i].fd >= 0) v[k++] = v[i];
  return k;
}

/* ---- the root ----------------------------------------------------------------------------- */

typedef struct {
  int lfd;
  uint64_t magic;
  int nranks;  /* 0 until the first hello with the right magic */
  int joined;
  int poison;  /* nonzero: the conflicting rank count seen; the rendezvous can no longer complete */
  int told;    /* ranks told of the failure */
  int polled_slots;
  int *fds;    /* one block: per rank its connection (-1 until it joins), then... */
  unsigned char (*addrs)[ADDR_BYTES]; /* ...per rank its listen address */
  pend_t pend[ROOT_MAX_PENDING];
  int npend;
  int64_t pause_until;
  int64_t end; /* FLEXCOLL_BOOTSTRAP_TIMEOUT after the start */
  struct pollfd *pfds;
} root_t;

static void root_free(root_t *r) {
  sock_close(&r->lfd);
  for (int i = 0; i < r->npend; i++) sock_close(&r->pend[i].fd);
  for (int i = 0; r->fds && i < r->nranks; i++) sock_close(&r->fds[i]);
  free(r->fds);
  free(r->pfds);
  free(r);
}

/* Best effort: a 36-byte reply fits in any fresh socket's send buffer, so a failure means the
 * client is gone, and blocking here would let one dead client stall everyone. */
static void root_reply(int fd, int status, int nranks, const unsigned char *next_addr) {
  unsigned char m[REPLY_BYTES] = {0};
  put32(m, TAG_REPLY);
  put32(m + 4, (uint32_t)status);
  put32(m + 8, (uint32_t)nranks);
  if (next_addr) memcpy(m + 12, next_addr, ADDR_BYTES);
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
  struct pollfd *pfds = realloc(r->pfds, (size_t)(1 + ROOT_MAX_PENDING + nranks) * sizeof *pfds);
  if (pfds) r->pfds = pfds;
  if (!pfds || !(r->fds = malloc((size_t)nranks * (sizeof *r->fds + ADDR_BYTES)))) return -1;
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

static void root_hello(root_t *r, pend_t *p) {
  const unsigned char *b = p->buf;
  struct sockaddr_storage ss;
  socklen_t len;
  if (get32(b) != TAG_HELLO || get32(b + 4) != PROTO_VERSION) {
    FC_INFO(FC_SUB_BOOT, "bootstrap root: dropped a connection that is not a flexcoll bootstrap client");
    sock_close(&p->fd);
    return;
  }
  int rank = (int)get32(b + 16), nranks = (int)get32(b + 20), status = ST_OK, other = r->nranks;
  const char *why = NULL;
  if (get64(b + 8) != r->magic) {
    status = ST_MAGIC, why = "wrong magic";
  } else if (r->poison) {
    status = ST_NRANKS, why = "the rendezvous failed earlier";
    if (nranks == r->nranks) other = r->poison;
  } else if (nranks < 1 || rank < 0 || rank >= nranks || addr_unpack(b + 24, &ss, &len) != 0) {
    status = ST_BADRANK, why = "bad rank, rank count or address";
  } else if (r->nranks == 0 && root_size(r, nranks) != 0) {
    status = ST_BADRANK, why = "out of memory";
  } else if (nranks != r->nranks) {
    root_poison(r, nranks);
    status = ST_NRANKS, why = "rank count mismatch";
  } else if (r->fds[rank] >= 0) {
    status = ST_DUP, why = "duplicate rank";
  }
  if (status != ST_OK) {
    r->told += (status == ST_NRANKS);
    root_reject(p, status, other, why);
    return;
  }
  r->fds[rank] = p->fd;
  p->fd = -1;
  memcpy(r->addrs[rank], b + 24, ADDR_BYTES);
  r->joined++;
  FC_TRACE(FC_SUB_BOOT, "bootstrap root: rank %d joined (%d of %d)", rank, r->joined, r->nranks);
}

/* Handle what the last poll reported: pfds[0] the listener, then the pending connections, then
 * one entry per rank slot. */
static void root_service(root_t *r) {
  int np = r->npend;
  int64_t now = now_ms();
  /* Slots first: a rank that died frees its slot before a restarted one could look like a duplicate. */
  for (int k = 0; k < r->polled_slots; k++) {
    if (r->fds[k] < 0 || !r->pfds[1 + np + k].revents) continue;
    /* A joined rank only waits for its reply; data or a hangup means it is gone or not ours. */
    FC_INFO(FC_SUB_BOOT, "bootstrap root: rank %d left before the rendezvous completed", k);
    sock_close(&r->fds[k]);
    r->joined--;
  }
  for (int i = 0; i < np; i++) {
    pend_t *p = &r->pend[i];
    int st = r->pfds[1 + i].revents ? pend_read(p, HELLO_BYTES) : 0;
    if (st > 0) root_hello(r, p);
    else if (st < 0) sock_close(&p->fd);
    else if (now >= p->deadline) {
      FC_INFO(FC_SUB_BOOT, "bootstrap root: dropped a connection that sent no hello within %d ms", HELLO_TIMEOUT_MS);
      sock_close(&p->fd);
    }
  }
  r->npend = pend_compact(r->pend, r->npend);
  if (r->pfds[0].revents) pend_accept(r->lfd, r->pend, &r->npend, ROOT_MAX_PENDING, HELLO_TIMEOUT_MS, &r->pause_until);
}

static int root_poll(root_t *r, int64_t end) {
  int64_t now = now_ms(), wake = end < now + 1000 ? end : now + 1000;
  int n = 0;
  r->pfds[n++] = (struct pollfd){now >= r->pause_until ? r->lfd : -1, POLLIN, 0};
  if (now < r->pause_until && r->pause_until < wake) wake = r->pause_until;
  for (int i = 0; i < r->npend; i++) {
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

static void *root_main(void *arg) {
  root_t *r = arg;
  /* A failed rendezvous stays to tell late ranks why, until as many as the larger count were told. */
  while (r->poison ? r->told < (r->poison > r->nranks ? r->poison : r->nranks) : r->nranks == 0 || r->joined < r->nranks) {
    if (now_ms() >= r->end) {
      if (!r->poison)
        FC_WARN("bootstrap root: giving up (FLEXCOLL_BOOTSTRAP_TIMEOUT) with %d of %d ranks joined", r->joined,
                r->nranks);
      break;
    }
    if (root_poll(r, r->end) != 0) break;
    root_service(r);
  }
  if (!r->poison && r->nranks > 0 && r->joined == r->nranks) {
    for (int k = 0; k < r->nranks; k++) root_reply(r->fds[k], ST_OK, r->nranks, r->addrs[(k + 1) % r->nranks]);
    FC_INFO(FC_SUB_BOOT, "bootstrap root: all %d ranks joined", r->nranks);
  }
  root_free(r);
  return NULL;
}

/* Takes lfd: it is closed on failure. */
static fc_result_t root_spawn(int lfd, uint64_t magic) {
  /* The parameter is read here, not in the thread, so that its first read is ordered before it. */
  int64_t limit_s = fc_param_bootstrap_timeout();
  root_t *r = calloc(1, sizeof *r);
  if (r)
    *r = (root_t){.lfd = lfd, .magic = magic, .end = limit_s > 0 ? now_ms() + limit_s * 1000 : INT64_MAX,
                  .pfds = malloc((1 + ROOT_MAX_PENDING) * sizeof(struct pollfd))};
  if (!r || !r->pfds) {
    free(r);
    close(lfd);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap root: out of memory");
  }
  pthread_attr_t attr;
  pthread_t thread;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  /* The thread inherits the mask: keep the application's signals (SIGINT...) for its own threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&thread, &attr, root_main, r);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    root_free(r);
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap root: cannot start its thread: %s", strerror(rc));
  }
  return FLEXCOLL_SUCCESS;
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
  FC_CHECK(pick_interface(&addr, &len));
  FC_CHECK(listen_on(&addr, &len, 0, &fd, "bootstrap root"));
  fc_result_t res = fc_bootstrap_id_encode(id, magic, (struct sockaddr *)&addr, len);
  if (res != FLEXCOLL_SUCCESS) {
    close(fd);
    return res;
  }
  return root_spawn(fd, magic);
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

flexcoll_result_t fc_bootstrap_id_from_address(flexcoll_unique_id_t *id, const char *hostport, int nranks) {
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
  fc_result_t r = fc_bootstrap_id_encode(id, magic, pick->ai_addr, pick->ai_addrlen);
  freeaddrinfo(res);
  return r;
}

flexcoll_result_t fc_bootstrap_start_root(const flexcoll_unique_id_t *id) {
  uint64_t magic;
  struct sockaddr_storage addr, any = {0};
  socklen_t len;
  int fd;
  FC_CHECK(fc_bootstrap_id_decode(id, &magic, &addr, &len));
  /* The wildcard: MASTER_ADDR is this host as the others see it (a name, an alias, a NAT address),
   * not necessarily an address bound here. */
  any.ss_family = addr.ss_family;
  set_port(&any, addr.ss_family == AF_INET ? ((struct sockaddr_in *)&addr)->sin_port
                                           : ((struct sockaddr_in6 *)&addr)->sin6_port);
  FC_CHECK(listen_on(&any, &len, 1, &fd, "bootstrap root (is another job using this port?)"));
  return root_spawn(fd, magic);
}

/* ---- rank side: waits ------------------------------------------------------------------ */

static int aborted(const fc_bootstrap_t *b) { return b->abort_flag && atomic_load(b->abort_flag); }

static fc_result_t abort_error(const fc_bootstrap_t *b, const char *what) {
  return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s: aborted", b->rank, b->nranks, what);
}

/* One poll slice (so that an abort is seen within SLICE_MS); returning with no event is normal,
 * callers loop. */
static fc_result_t wait_fds(const fc_bootstrap_t *b, struct pollfd *p, int n, int64_t deadline, const char *what) {
  if (aborted(b)) return abort_error(b, what);
  int64_t left = deadline - now_ms();
  if (left <= 0)
    return fc_error(NULL, FLEXCOLL_TIMEOUT, "bootstrap rank %d of %d: %s: no progress for %d ms", b->rank, b->nranks,
                    what, b->timeout_ms);
  if (poll(p, (nfds_t)n, (int)(left < SLICE_MS ? left : SLICE_MS)) < 0) {
    if (errno != EINTR) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap: poll: %s", strerror(errno));
    for (int i = 0; i < n; i++) p[i].revents = 0;
  }
  return FLEXCOLL_SUCCESS;
}

/* Send slen bytes on sfd while receiving rlen on rfd, both at once: two neighbours sending each
 * other more than a socket buffer would otherwise deadlock.  The timeout counts from the last
 * progress, so a long exchange that keeps moving is never cut. */
static fc_result_t xfer(const fc_bootstrap_t *b, int sfd, const void *sbuf, size_t slen, int rfd, void *rbuf,
                        size_t rlen, const char *what) {
  size_t sent = 0, got = 0;
  int64_t deadline = deadline_in(b->timeout_ms);
  while (sent < slen || got < rlen) {
    struct pollfd p[2];
    int n = 0, si = -1, ri = -1;
    if (sent < slen) p[si = n++] = (struct pollfd){sfd, POLLOUT, 0};
    if (got < rlen) p[ri = n++] = (struct pollfd){rfd, POLLIN, 0};
    FC_CHECK(wait_fds(b, p, n, deadline, what));
    ssize_t ks = 0, kr = 0;
    if (si >= 0 && p[si].revents && (ks = send(sfd, (const char *)sbuf + sent, slen - sent, MSG_NOSIGNAL | MSG_DONTWAIT)) < 0 &&
        !again(errno))
      return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s: send: %s", b->rank, b->nranks, what,
                      strerror(errno));
    if (ri >= 0 && p[ri].revents && (kr = recv(rfd, (char *)rbuf + got, rlen - got, MSG_DONTWAIT)) <= 0 &&
        (kr == 0 || !again(errno)))
      return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s: %s", b->rank, b->nranks, what,
                      kr == 0 ? "the peer closed the connection (it exited, failed or gave up)" : strerror(errno));
    if (ks > 0 || kr > 0) deadline = deadline_in(b->timeout_ms);
    sent += ks > 0 ? (size_t)ks : 0;
    got += kr > 0 ? (size_t)kr : 0;
  }
  return FLEXCOLL_SUCCESS;
}

static int nap(const fc_bootstrap_t *b, int64_t ms) {
  for (int64_t end = now_ms() + ms, left; (left = end - now_ms()) > 0;) {
    if (aborted(b)) return -1;
    poll(NULL, 0, (int)(left < SLICE_MS ? left : SLICE_MS));
  }
  return aborted(b) ? -1 : 0;
}

static int connect_retryable(int e) {
  return e == ECONNREFUSED || e == ETIMEDOUT || e == ECONNRESET || e == ECONNABORTED || e == EHOSTUNREACH ||
         e == ENETUNREACH || e == ENETDOWN || e == EAGAIN || e == EADDRNOTAVAIL;
}

/* Refused or unreachable usually means the peer is not listening yet (processes start at
 * different times), so retry with backoff until the deadline. */
static fc_result_t connect_retry(const fc_bootstrap_t *b, const struct sockaddr_storage *addr, socklen_t len,
                                 const char *what, int *fd_out) {
  int64_t deadline = deadline_in(b->timeout_ms), backoff = 10;
  for (;;) {
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), err = 0;
    if (fd < 0) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap: socket: %s", strerror(errno));
    if (connect(fd, (const struct sockaddr *)addr, len) != 0) err = errno;
    if (err == EINPROGRESS || err == EINTR) {
      struct pollfd p = {fd, POLLOUT, 0};
      fc_result_t res;
      do res = wait_fds(b, &p, 1, deadline, what);
      while (res == FLEXCOLL_SUCCESS && !p.revents);
      if (res != FLEXCOLL_SUCCESS) {
        close(fd);
        return res;
      }
      socklen_t el = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    }
    if (err == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      *fd_out = fd;
      return FLEXCOLL_SUCCESS;
    }
    close(fd);
    if (!connect_retryable(err))
      return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap rank %d of %d: %s: connect: %s", b->rank, b->nranks,
                      what, strerror(err));
    int64_t left = deadline - now_ms();
    if (left <= 0)
      return fc_error(NULL, FLEXCOLL_TIMEOUT, "bootstrap rank %d of %d: %s: nobody accepted within %d ms (%s)",
                      b->rank, b->nranks, what, b->timeout_ms, strerror(err));
    if (nap(b, backoff < left ? backoff : left) != 0) return abort_error(b, what);
    backoff = backoff < 100 ? backoff * 2 : 100;
  }
}

/* ---- rank side: rendezvous and ring --------------------------------------------------------- */

static fc_result_t rank_listen(const fc_bootstrap_t *b, int root_fd, int *lfd, unsigned char *packed) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  /* Without FLEXCOLL_SOCKET_IFNAME, listen where this host reached the root from: that address is
   * routable from the root's network, which a guess from the interface list (docker0?) may not be. */
  if (fc_param_str("FLEXCOLL_SOCKET_IFNAME", NULL)) {
    FC_CHECK(pick_interface(&a, &len));
  } else if (getsockname(root_fd, (struct sockaddr *)&a, &len) != 0) {
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap: getsockname: %s", strerror(errno));
  }
  set_port(&a, 0);
  char what[64];
  snprintf(what, sizeof what, "bootstrap rank %d of %d listener", b->rank, b->nranks);
  FC_CHECK(listen_on(&a, &len, 0, lfd, what));
  addr_pack(packed, (struct sockaddr *)&a, len);
  return FLEXCOLL_SUCCESS;
}

static fc_result_t check_reply(const fc_bootstrap_t *b, const unsigned char *m, const char *what,
                               struct sockaddr_storage *next, socklen_t *nlen) {
  int status = (int)get32(m + 4), other = (int)get32(m + 8);
  if (get32(m) != TAG_REPLY)
    return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s sent something that is not a flexcoll reply",
                    b->rank, b->nranks, what);
  switch (status) {
  case ST_OK:
    if (other == b->nranks && addr_unpack(m + 12, next, nlen) == 0) return FLEXCOLL_SUCCESS;
    return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s sent a malformed reply", b->rank,
                    b->nranks, what);
  case ST_MAGIC:
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "unique id does not match the root's: %s serves another communicator%s (this rank has %d ranks)",
                    what, other > 0 ? (other == b->nranks ? " of as many ranks" : " of another rank count") : "",
                    b->nranks);
  case ST_NRANKS:
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "ranks disagree on the number of ranks: rank %d was given %d, another rank %d (%s)", b->rank,
                    b->nranks, other, what);
  case ST_DUP:
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "rank %d of %d joined twice: another process or thread already joined %s as rank %d", b->rank,
                    b->nranks, what, b->rank);
  default:
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s rejected rank %d of %d", what, b->rank, b->nranks);
  }
}

/* Connect to the root, send this rank's hello, wait until every rank has joined; on success *lfd
 * is this rank's listener and *next the address of rank+1's. */
static fc_result_t join_root(const fc_bootstrap_t *b, const struct sockaddr_storage *root, socklen_t rlen, int *lfd,
                             struct sockaddr_storage *next, socklen_t *nlen) {
  char as[96], what[128];
  snprintf(what, sizeof what, "the bootstrap root at %s", addr_str(root, rlen, as, sizeof as));
  int fd = -1;
  FC_CHECK(connect_retry(b, root, rlen, what, &fd));
  unsigned char hello[HELLO_BYTES], reply[REPLY_BYTES];
  put32(hello, TAG_HELLO);
  put32(hello + 4, PROTO_VERSION);
  put64(hello + 8, b->magic);
  put32(hello + 16, (uint32_t)b->rank);
  put32(hello + 20, (uint32_t)b->nranks);
  fc_result_t res = rank_listen(b, fd, lfd, hello + 24);
  if (res == FLEXCOLL_SUCCESS) res = xfer(b, fd, hello, sizeof hello, fd, reply, sizeof reply, what);
  close(fd);
  if (res == FLEXCOLL_SUCCESS) res = check_reply(b, reply, what, next, nlen);
  return res;
}

static void ring_hello(const fc_bootstrap_t *b, unsigned char *m) {
  put32(m, TAG_RING);
  put64(m + 4, b->magic);
  put32(m + 12, (uint32_t)b->rank);
}

static int ring_hello_ok(const fc_bootstrap_t *b, const unsigned char *m, int rank) {
  return get32(m) == TAG_RING && get64(m + 4) == b->magic && get32(m + 12) == (uint32_t)rank;
}

/* Strays (port scanners, an old job's ranks) may connect to the listener too: several
 * connections are read side by side and only a verified hello from rank-1 is kept. */
static fc_result_t accept_prev(fc_bootstrap_t *b, int lfd, int prev) {
  pend_t pend[RING_MAX_PENDING];
  int n = 0;
  int64_t pause_until = 0, deadline = deadline_in(b->timeout_ms);
  char what[64];
  snprintf(what, sizeof what, "waiting for rank %d to connect", prev);
  fc_result_t res = FLEXCOLL_SUCCESS;
  while (b->prev_fd < 0) {
    struct pollfd p[1 + RING_MAX_PENDING];
    p[0] = (struct pollfd){now_ms() >= pause_until ? lfd : -1, POLLIN, 0};
    for (int i = 0; i < n; i++) p[1 + i] = (struct pollfd){pend[i].fd, POLLIN, 0};
    if ((res = wait_fds(b, p, 1 + n, deadline, what)) != FLEXCOLL_SUCCESS) break;
    for (int i = 0; i < n && b->prev_fd < 0; i++) {
      int st = p[1 + i].revents ? pend_read(&pend[i], RING_BYTES) : 0;
      if (st > 0 && ring_hello_ok(b, pend[i].buf, prev)) {
        b->prev_fd = pend[i].fd;
        pend[i].fd = -1;
      } else if (st != 0) {
        FC_INFO(FC_SUB_BOOT, "bootstrap rank %d: dropped a stray connection to its listener", b->rank);
        sock_close(&pend[i].fd);
      }
    }
    n = pend_compact(pend, n);
    if (b->prev_fd < 0 && p[0].revents) pend_accept(lfd, pend, &n, RING_MAX_PENDING, 0, &pause_until);
  }
  for (int i = 0; i < n; i++) close(pend[i].fd);
  return res;
}

static fc_result_t build_ring(fc_bootstrap_t *b, int lfd, const struct sockaddr_storage *next, socklen_t nlen) {
  int nx = (b->rank + 1) % b->nranks, pv = (b->rank + b->nranks - 1) % b->nranks;
  unsigned char mine[RING_BYTES], theirs[RING_BYTES];
  char as[96], what[128], back[64];
  snprintf(what, sizeof what, "ring connection to rank %d at %s", nx, addr_str(next, nlen, as, sizeof as));
  snprintf(back, sizeof back, "ring connection from rank %d", pv);
  ring_hello(b, mine);
  FC_CHECK(connect_retry(b, next, nlen, what, &b->next_fd));
  /* Send, accept, answer, and only then read rank+1's answer: every rank connects first, so
   * waiting for that answer before accepting would deadlock the whole ring. */
  FC_CHECK(xfer(b, b->next_fd, mine, sizeof mine, -1, NULL, 0, what));
  FC_CHECK(accept_prev(b, lfd, pv));
  int one = 1;
  setsockopt(b->prev_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  FC_CHECK(xfer(b, b->prev_fd, mine, sizeof mine, -1, NULL, 0, back));
  FC_CHECK(xfer(b, -1, NULL, 0, b->next_fd, theirs, sizeof theirs, what));
  if (!ring_hello_ok(b, theirs, nx))
    return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s: the listener is not rank %d of this communicator",
                    b->rank, b->nranks, what, nx);
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_bootstrap_init(fc_bootstrap_t **bs, const flexcoll_unique_id_t *id, int rank, int nranks,
                                    int timeout_ms, atomic_int *abort_flag) {
  if (!bs || !id) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap init: NULL %s", bs ? "id" : "result pointer");
  *bs = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap init: rank %d of %d ranks is out of range", rank, nranks);
  fc_bootstrap_t *b = calloc(1, sizeof *b);
  if (!b) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap init: out of memory");
  *b = (fc_bootstrap_t){.rank = rank, .nranks = nranks, .timeout_ms = timeout_ms, .abort_flag = abort_flag,
                        .next_fd = -1, .prev_fd = -1};
  struct sockaddr_storage root, next;
  socklen_t rlen, nlen;
  int lfd = -1;
  fc_result_t res = fc_bootstrap_id_decode(id, &b->magic, &root, &rlen);
  if (res == FLEXCOLL_SUCCESS) res = join_root(b, &root, rlen, &lfd, &next, &nlen);
  if (res == FLEXCOLL_SUCCESS && nranks > 1) res = build_ring(b, lfd, &next, nlen);
  sock_close(&lfd);
  if (res != FLEXCOLL_SUCCESS) {
    fc_bootstrap_close(b);
    return res;
  }
  FC_INFO(FC_SUB_BOOT, "bootstrap rank %d of %d: ring ready", rank, nranks);
  *bs = b;
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_bootstrap_allgather(fc_bootstrap_t *b, void *data, size_t bytes) {
  if (!b || (!data && bytes)) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap allgather: NULL argument");
  int n = b->nranks, pv = (b->rank + n - 1) % n;
  if (bytes && (size_t)n > SIZE_MAX / bytes)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap allgather: %d x %zu bytes overflows", n, bytes);
  uint32_t seq = b->seq++;
  if (n == 1) return FLEXCOLL_SUCCESS;
  unsigned char mine[AG_HDR_BYTES], theirs[AG_HDR_BYTES];
  char what[96];
  snprintf(what, sizeof what, "allgather #%u (to rank %d, from rank %d)", seq, (b->rank + 1) % n, pv);
  put32(mine, TAG_AG);
  put32(mine + 4, seq);
  put64(mine + 8, bytes);
  /* Compare call number and size before any payload moves: a rank that skipped a call or passed
   * another size becomes an error here instead of silently shifted data. */
  FC_CHECK(xfer(b, b->next_fd, mine, sizeof mine, b->prev_fd, theirs, sizeof theirs, what));
  if (get32(theirs) != TAG_AG || get32(theirs + 4) != seq || get64(theirs + 8) != bytes)
    return fc_error(NULL, FLEXCOLL_INTERNAL_ERROR,
                    "bootstrap rank %d of %d: allgather #%u of %zu bytes, but rank %d is in allgather #%u of %llu bytes",
                    b->rank, n, seq, bytes, pv, get32(theirs + 4), (unsigned long long)get64(theirs + 8));
  char *d = data;
  for (int s = 0; bytes && s < n - 1; s++) {
    size_t send_slot = (size_t)((b->rank - s + n) % n), recv_slot = (size_t)((b->rank - s - 1 + n) % n);
    FC_CHECK(xfer(b, b->next_fd, d + send_slot * bytes, bytes, b->prev_fd, d + recv_slot * bytes, bytes, what));
  }
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_bootstrap_barrier(fc_bootstrap_t *b) {
  if (!b) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap barrier: NULL bootstrap");
  /* A one-byte ring all-gather: a rank finishes only once bytes that every other rank sent after
   * entering have reached it.  (A zero-byte one would only synchronise neighbours.) */
  char *tmp = calloc((size_t)b->nranks, 1);
  if (!tmp) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap barrier: out of memory");
  fc_result_t res = fc_bootstrap_allgather(b, tmp, 1);
  free(tmp);
  return res;
}

/* Sent on both ring sockets by a rank that destroys its communicator: a neighbour that finished
 * first and left is not a neighbour that died (its peers may still be completing their part). */
static const char goodbye[8] = {'f', 'c', '-', 'b', 'y', 'e', '!', '\n'};

static int said_goodbye(int fd) {
  char buf[sizeof goodbye];
  ssize_t k = recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
  return k == (ssize_t)sizeof buf && memcmp(buf, goodbye, sizeof buf) == 0;
}

int fc_bootstrap_peer_lost(fc_bootstrap_t *b) {
  if (!b || b->nranks == 1) return 0;
  struct pollfd p[2] = {{b->next_fd, POLLIN | POLLRDHUP, 0}, {b->prev_fd, POLLIN | POLLRDHUP, 0}};
  if (poll(p, 2, 0) <= 0) return 0;
  for (int i = 0; i < 2; i++) {
    if (p[i].revents && said_goodbye(p[i].fd)) continue;
    /* RDHUP: the peer's FIN arrived, even with its last bytes still queued ahead of it. */
    if (p[i].revents & (POLLERR | POLLHUP | POLLRDHUP)) return 1;
    if (!(p[i].revents & POLLIN)) continue;
    /* Readable is protocol data (not ours to take) or, where RDHUP is not reported, end of file. */
    char c;
    ssize_t k = recv(p[i].fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 1;
  }
  return 0;
}

void fc_bootstrap_close(fc_bootstrap_t *b) {
  if (!b) return;
  if (b->nranks > 1) {
    for (int i = 0; i < 2; i++) {
      int fd = i ? b->prev_fd : b->next_fd;
      if (fd >= 0) (void)!send(fd, goodbye, sizeof goodbye, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  sock_close(&b->next_fd);
  sock_close(&b->prev_fd);
  free(b);
}
