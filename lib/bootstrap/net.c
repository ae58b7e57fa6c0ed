/* net.c — the bootstrap's shared plumbing: addresses as text, the unique id, the choice of
 * interface, listeners, and the table of connections that have not yet sent their hello.  What
 * parses bytes from the network is in wire.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "net.h"

#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "param.h"

/* ---- addresses ------------------------------------------------------------------------------ */

const char *fc_bs_addr_str(const struct sockaddr_storage *ss, socklen_t len, char *buf, size_t n) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo((const struct sockaddr *)ss, len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    snprintf(buf, n, "<unprintable address>");
  else
    snprintf(buf, n, ss->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
  return buf;
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
  if (fc_bs_addr_pack(p + 12, addr, len) != 0)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "bootstrap id encode: address (family %d, length %u) is not an IPv4/IPv6 address with a port",
                    (int)addr->sa_family, (unsigned)len);
  put32(p + ID_CHECKED_BYTES, (uint32_t)fnv1a64(FNV64_INIT, p, ID_CHECKED_BYTES));
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_bootstrap_id_decode(const flexcoll_unique_id_t *id, uint64_t *magic,
                                         struct sockaddr_storage *addr, socklen_t *len) {
  if (!id || !magic || !addr || !len) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap id decode: NULL argument");
  const char *why = fc_bs_id_parse((const unsigned char *)id->internal, magic, addr, len);
  if (why)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "unique id is not well formed (%s); it must come from flexcoll_get_unique_id, unchanged", why);
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

fc_result_t fc_bs_pick_interface(struct sockaddr_storage *addr, socklen_t *len) {
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
  FC_INFO(FC_SUB_BOOT, "bootstrap: interface %s, address %s", name, fc_bs_addr_str(addr, *len, buf, sizeof buf));
  return FLEXCOLL_SUCCESS;
}

/* Bind a nonblocking listener to *addr (port 0: any free port) and report the bound address. */
fc_result_t fc_bs_listen_on(struct sockaddr_storage *addr, socklen_t *len, int reuse, int *fd_out, const char *what) {
  char buf[96];
  int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "%s: socket: %s", what, strerror(errno));
  int one = 1, zero = 0;
  /* A restarted job reuses MASTER_PORT while the last job's connections sit in TIME_WAIT. */
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  /* On the IPv6 wildcard, also take IPv4 clients, whose resolver may have preferred IPv4. */
  if (addr->ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  fc_bs_addr_str(addr, *len, buf, sizeof buf);
  socklen_t bound = sizeof *addr;
  if (bind(fd, (struct sockaddr *)addr, *len) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, (struct sockaddr *)addr, &bound) != 0) {
    int e = errno;
    close(fd);
    fc_result_t res = fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "%s: cannot listen on %s: %s", what, buf, strerror(e));
    errno = e; /* for callers that try elsewhere */
    return res;
  }
  *len = bound;
  *fd_out = fd;
  return FLEXCOLL_SUCCESS;
}

/* Where a new connection goes in a full table: see fc_bs_pend_accept.  Each silent candidate is
 * read once more first, since a real peer's message may have come in since it was accepted. */
static int pend_victim(pend_table_t *t, int *silent) {
  int partial = -1;
  for (int i = 0; i < t->n; i++) {
    pend_t *p = &t->v[i];
    int st = p->got < t->want ? fc_bs_pend_read(p, t->want) : 1;
    *silent = st < 0 ? 2 : p->got == 0; /* 2: it has closed, so dropping it loses nothing */
    if (*silent) return i;
    if (st == 0 && partial < 0) partial = i;
  }
  return partial;
}

static void pend_evict(pend_table_t *t, int i, int silent) {
  if (silent == 2)
    t->closed++;
  else if (t->evicted++ == 0)
    FC_WARN("%s: more than %d connections have not sent a whole hello; dropping the oldest %s ones "
            "(is something flooding this port?)", t->who, t->cap, silent ? "silent" : "slowest");
  else
    FC_TRACE(FC_SUB_BOOT, "%s: dropped a connection to make room (%lu so far)", t->who, t->evicted);
  close(t->v[i].fd);
  memmove(t->v + i, t->v + i + 1, (size_t)(t->n - i - 1) * sizeof *t->v);
  t->n--;
}

void fc_bs_pend_accept(int lfd, pend_table_t *t) {
  for (int batch = 0; batch < 2 * t->cap; batch++) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      /* Out of descriptors or memory: the connection stays queued and poll would spin on it. */
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        FC_INFO(FC_SUB_BOOT, "%s: accept: %s; pausing", t->who, strerror(errno));
        t->pause_until = now_ms() + 100;
      }
      return;
    }
    pend_t p = {.fd = fd, .deadline = t->hello_ms > 0 ? now_ms() + t->hello_ms : INT64_MAX};
    if (fc_bs_pend_read(&p, t->want) < 0) { /* connect-and-close: nothing to keep */
      t->closed++;
      close(fd);
      continue;
    }
    int silent = 0, i = t->n < t->cap ? -1 : pend_victim(t, &silent);
    if (t->n == t->cap && i < 0) { /* every entry has a whole message for the caller: no room */
      FC_INFO(FC_SUB_BOOT, "%s: no room for another connection; closed it", t->who);
      close(fd);
      return;
    }
    if (i >= 0) pend_evict(t, i, silent);
    t->v[t->n++] = p;
  }
}

/* 1: `want` bytes are in; 0: more to come; -1: closed or failed before a whole hello. */
int fc_bs_pend_read(pend_t *p, size_t want) {
  while (p->got < want) {
    ssize_t k = recv(p->fd, p->buf + p->got, want - p->got, MSG_DONTWAIT);
    if (k > 0) p->got += (size_t)k;
    else if (k == 0 || !again(errno)) return -1;
    else if (errno != EINTR) return 0;
  }
  return 1;
}

int fc_bs_pend_compact(pend_t *v, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (v[i].fd >= 0) v[k++] = v[i];
  return k;
}
