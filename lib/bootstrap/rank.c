/* rank.c — the rank side of the bootstrap: waits that honour timeouts and aborts, the rendezvous
 * with the root, the TCP ring, and the all-gathers and barriers that run over it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "net.h"

#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "param.h"

struct fc_bootstrap {
  int rank, nranks, timeout_ms;
  atomic_int *abort_flag;
  uint64_t magic;
  int next_fd, prev_fd; /* ring sockets; -1 when nranks == 1 */
  uint32_t seq;         /* all-gathers so far, compared between neighbours to catch a desync */
  int (*progress)(void *); /* fc_bootstrap_set_progress */
  void *progress_arg;
};

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
  /* With a progress function: a nonblocking poll, then the caller's transports, and where they
   * had nothing to do a millisecond's nap that the sockets cut short. */
  int k;
  if (!b->progress) k = poll(p, (nfds_t)n, (int)(left < SLICE_MS ? left : SLICE_MS));
  else if ((k = poll(p, (nfds_t)n, 0)) == 0 && !b->progress(b->progress_arg)) k = poll(p, (nfds_t)n, 1);
  if (k < 0) {
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
 * different times), so retry with backoff until the deadline; unless !patient, when a refusal is
 * final: the peer listened before, so it has gone. */
static fc_result_t connect_retry(const fc_bootstrap_t *b, const struct sockaddr_storage *addr, socklen_t len,
                                 const char *what, int64_t deadline, int patient, int *fd_out) {
  int64_t backoff = 10, note_at = now_ms() + 2000;
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
    if (!patient && err == ECONNREFUSED)
      return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s no longer listens (it gave up or its "
                      "process exited)", b->rank, b->nranks, what);
    if (!connect_retryable(err))
      return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap rank %d of %d: %s: connect: %s", b->rank, b->nranks,
                      what, strerror(err));
    int64_t left = deadline - now_ms();
    if (left <= 0)
      return fc_error(NULL, FLEXCOLL_TIMEOUT, "bootstrap rank %d of %d: %s: nobody accepted within %d ms (%s)%s",
                      b->rank, b->nranks, what, b->timeout_ms, strerror(err),
                      err == ECONNREFUSED ? "; the root is served by rank 0: is it running?" : "");
    /* Said without FLEXCOLL_DEBUG: a rank started before (or without) rank 0 otherwise waits
     * out its whole timeout in silence. */
    if (patient && note_at && now_ms() >= note_at) {
      fprintf(stderr, "flexcoll: bootstrap rank %d of %d: waiting for %s to listen (rank 0 serves it; giving up in %lld s)\n",
              b->rank, b->nranks, what, (long long)((left + 999) / 1000));
      note_at = 0;
    }
    if (nap(b, backoff < left ? backoff : left) != 0) return abort_error(b, what);
    backoff = backoff < 100 ? backoff * 2 : 100;
  }
}

/* The frame header h from rank `from` must announce `type` with call number seq and len payload
 * bytes.  Checked before any payload is read, so that a length from the wire never sizes
 * anything and a goodbye is never taken for data. */
static fc_result_t check_frame(const fc_bootstrap_t *b, const unsigned char *h, uint32_t type, uint32_t seq,
                               uint64_t len, int from, const char *what) {
  fc_bs_frame_t f = fc_bs_frame_parse(h);
  uint32_t t = f.type, s = f.seq;
  uint64_t l = f.len;
  if (t == type && s == seq && l == len) return FLEXCOLL_SUCCESS;
  if (t == TAG_BYE)
    return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s: rank %d left the communicator (it "
                    "closed its bootstrap: its initialisation failed, or it was destroyed)", b->rank, b->nranks, what,
                    from);
  if (t == TAG_AG && type == TAG_AG)
    return fc_error(NULL, FLEXCOLL_INTERNAL_ERROR,
                    "bootstrap rank %d of %d: allgather #%u of %llu bytes, but rank %d is in allgather #%u of %llu bytes",
                    b->rank, b->nranks, seq, (unsigned long long)len, from, s, (unsigned long long)l);
  return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s: a message of type 0x%08x and %llu bytes "
                  "where type 0x%08x and %llu bytes belong: not a flexcoll bootstrap peer of this version", b->rank,
                  b->nranks, what, t, (unsigned long long)l, type, (unsigned long long)len);
}

/* ---- rank side: rendezvous and ring --------------------------------------------------------- */

static fc_result_t rank_listen(const fc_bootstrap_t *b, int root_fd, int *lfd, unsigned char *packed) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  /* Without FLEXCOLL_SOCKET_IFNAME, listen where this host reached the root from: that address is
   * routable from the root's network, which a guess from the interface list (docker0?) may not be. */
  if (fc_param_str("FLEXCOLL_SOCKET_IFNAME", NULL)) {
    FC_CHECK(fc_bs_pick_interface(&a, &len));
  } else if (getsockname(root_fd, (struct sockaddr *)&a, &len) != 0) {
    return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap: getsockname: %s", strerror(errno));
  }
  set_port(&a, 0);
  char what[64];
  snprintf(what, sizeof what, "bootstrap rank %d of %d listener", b->rank, b->nranks);
  FC_CHECK(fc_bs_listen_on(&a, &len, 0, lfd, what));
  fc_bs_addr_pack(packed, (struct sockaddr *)&a, len);
  return FLEXCOLL_SUCCESS;
}

static fc_result_t check_reply(const fc_bootstrap_t *b, const unsigned char *m, const char *what,
                               struct sockaddr_storage *next, socklen_t *nlen) {
  FC_CHECK(check_frame(b, m, TAG_REPLY, 0, REPLY_BYTES, -1, what));
  fc_bs_reply_t rp;
  if (fc_bs_reply_parse(m, FRAME_BYTES + REPLY_BYTES, &rp) != 0)
    return fc_error(NULL, FLEXCOLL_INTERNAL_ERROR, "bootstrap rank %d of %d: %s: reply frame", b->rank, b->nranks, what);
  int status = (int)rp.status, other = (int)rp.nranks;
  switch (status) {
  case ST_OK:
    if (other == b->nranks && rp.next_ok) {
      *next = rp.next;
      *nlen = rp.next_len;
      return FLEXCOLL_SUCCESS;
    }
    return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s sent a malformed reply", b->rank,
                    b->nranks, what);
  case ST_GAVEUP:
    return fc_error(NULL, FLEXCOLL_REMOTE_ERROR,
                    "bootstrap rank %d of %d: %s gave up the rendezvous with %d of %d ranks joined "
                    "(FLEXCOLL_BOOTSTRAP_TIMEOUT ran out, or its process stopped it when its own rank failed)",
                    b->rank, b->nranks, what, other, b->nranks);
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

/* The root closed the connection without answering, again and again, until the timeout. */
static fc_result_t never_answered(const fc_bootstrap_t *b, const char *what, int times) {
  if (times < 2)
    return fc_error(NULL, FLEXCOLL_REMOTE_ERROR, "bootstrap rank %d of %d: %s closed the connection without answering",
                    b->rank, b->nranks, what);
  return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                  "bootstrap rank %d of %d: %s closed the connection %d times without answering: the unique id does "
                  "not match the root's (another communicator's root, or, in launcher mode, ranks that disagree on "
                  "FLEXCOLL_BOOTSTRAP_SECRET or the launcher's job id), or something floods the root with connections",
                  b->rank, b->nranks, what, times);
}

/* Send the hello and wait for the answer.  *hung_up: the root closed the connection unanswered,
 * which the caller retries, so no error is recorded for it (a flood would fill the log). */
static fc_result_t hello_exchange(const fc_bootstrap_t *b, int fd, const unsigned char *hello, size_t hlen,
                                  unsigned char *reply, size_t rlen, const char *what, int *hung_up) {
  ssize_t k;
  *hung_up = 0;
  do k = send(fd, hello, hlen, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (k < 0 && errno == EINTR);
  /* A fresh connection's send buffer takes a hello whole: anything less is a connection gone. */
  if (k != (ssize_t)hlen) return *hung_up = 1, FLEXCOLL_REMOTE_ERROR;
  int64_t deadline = deadline_in(b->timeout_ms);
  for (size_t got = 0; got < rlen;) {
    struct pollfd p = {fd, POLLIN, 0};
    FC_CHECK(wait_fds(b, &p, 1, deadline, what));
    if (!p.revents) continue;
    k = recv(fd, reply + got, rlen - got, MSG_DONTWAIT);
    if (k == 0 || (k < 0 && !again(errno))) return *hung_up = 1, FLEXCOLL_REMOTE_ERROR;
    if (k > 0) got += (size_t)k, deadline = deadline_in(b->timeout_ms);
  }
  return FLEXCOLL_SUCCESS;
}

/* Connect to the root, send this rank's hello, wait until every rank has joined; on success *lfd
 * is this rank's listener and *next the address of rank+1's.  A root closes a connection without
 * an answer when a flood made it drop the connection before its hello was read, or when it does
 * not know the magic: connect and hello are retried with backoff until the timeout. */
static fc_result_t join_root(const fc_bootstrap_t *b, const struct sockaddr_storage *root, socklen_t rlen, int *lfd,
                             struct sockaddr_storage *next, socklen_t *nlen) {
  char as[96], what[128];
  snprintf(what, sizeof what, "the bootstrap root at %s", fc_bs_addr_str(root, rlen, as, sizeof as));
  unsigned char hello[FRAME_BYTES + HELLO_BYTES], reply[FRAME_BYTES + REPLY_BYTES];
  frame_put(hello, TAG_HELLO, 0, HELLO_BYTES);
  put32(hello + FRAME_BYTES, PROTO_VERSION);
  put64(hello + FRAME_BYTES + 4, b->magic);
  put32(hello + FRAME_BYTES + 12, (uint32_t)b->rank);
  put32(hello + FRAME_BYTES + 16, (uint32_t)b->nranks);
  int64_t end = deadline_in(b->timeout_ms), backoff = 10;
  for (int closed = 1;; closed++) {
    int fd = -1, hung_up = 0;
    FC_CHECK(connect_retry(b, root, rlen, what, end, closed == 1, &fd));
    fc_result_t res = *lfd < 0 ? rank_listen(b, fd, lfd, hello + FRAME_BYTES + 20) : FLEXCOLL_SUCCESS;
    if (res == FLEXCOLL_SUCCESS) res = hello_exchange(b, fd, hello, sizeof hello, reply, sizeof reply, what, &hung_up);
    close(fd);
    if (res == FLEXCOLL_SUCCESS) return check_reply(b, reply, what, next, nlen);
    if (!hung_up) return res;
    int64_t left = end - now_ms();
    if (left > 0) {
      FC_INFO(FC_SUB_BOOT, "bootstrap rank %d of %d: %s closed the connection before answering; retrying in %d ms",
              b->rank, b->nranks, what, (int)(backoff < left ? backoff : left));
      if (nap(b, backoff < left ? backoff : left) != 0) return abort_error(b, what);
    }
    if (now_ms() >= end) return never_answered(b, what, closed);
    backoff = backoff < 500 ? backoff * 2 : 1000;
  }
}

static void ring_hello(const fc_bootstrap_t *b, unsigned char *m) {
  frame_put(m, TAG_RING, 0, RING_BYTES);
  put64(m + FRAME_BYTES, b->magic);
  put32(m + FRAME_BYTES + 8, (uint32_t)b->rank);
}

static int ring_hello_ok(const fc_bootstrap_t *b, const unsigned char *m, int rank) {
  return fc_bs_ring_hello_ok(m, FRAME_BYTES + RING_BYTES, b->magic, rank);
}

/* Strays (port scanners, an old job's ranks) may connect to the listener too: several
 * connections are read side by side and only a verified hello from rank-1 is kept. */
static fc_result_t accept_prev(fc_bootstrap_t *b, int lfd, int prev) {
  pend_t pend[RING_MAX_PENDING];
  char what[64], who[48];
  snprintf(what, sizeof what, "waiting for rank %d to connect", prev);
  snprintf(who, sizeof who, "bootstrap rank %d listener", b->rank);
  pend_table_t t = {.v = pend, .cap = RING_MAX_PENDING, .want = FRAME_BYTES + RING_BYTES, .who = who};
  int64_t deadline = deadline_in(b->timeout_ms);
  fc_result_t res = FLEXCOLL_SUCCESS;
  while (b->prev_fd < 0) {
    struct pollfd p[1 + RING_MAX_PENDING];
    int np = t.n;
    p[0] = (struct pollfd){now_ms() >= t.pause_until ? lfd : -1, POLLIN, 0};
    for (int i = 0; i < np; i++) p[1 + i] = (struct pollfd){pend[i].fd, POLLIN, 0};
    if ((res = wait_fds(b, p, 1 + np, deadline, what)) != FLEXCOLL_SUCCESS) break;
    for (int i = 0; i < np; i++)
      if (p[1 + i].revents && fc_bs_pend_read(&pend[i], t.want) < 0) sock_close(&pend[i].fd);
    t.n = fc_bs_pend_compact(pend, t.n);
    if (p[0].revents) fc_bs_pend_accept(lfd, &t);
    for (int i = 0; i < t.n && b->prev_fd < 0; i++) {
      if (pend[i].got < t.want) continue;
      if (ring_hello_ok(b, pend[i].buf, prev)) {
        b->prev_fd = pend[i].fd;
        pend[i].fd = -1;
      } else {
        FC_INFO(FC_SUB_BOOT, "bootstrap rank %d: dropped a stray connection to its listener", b->rank);
        sock_close(&pend[i].fd);
      }
    }
    t.n = fc_bs_pend_compact(pend, t.n);
  }
  for (int i = 0; i < t.n; i++) close(pend[i].fd);
  return res;
}

static fc_result_t build_ring(fc_bootstrap_t *b, int lfd, const struct sockaddr_storage *next, socklen_t nlen) {
  int nx = (b->rank + 1) % b->nranks, pv = (b->rank + b->nranks - 1) % b->nranks;
  unsigned char mine[FRAME_BYTES + RING_BYTES], theirs[FRAME_BYTES + RING_BYTES];
  char as[96], what[128], back[64];
  snprintf(what, sizeof what, "ring connection to rank %d at %s", nx, fc_bs_addr_str(next, nlen, as, sizeof as));
  snprintf(back, sizeof back, "ring connection from rank %d", pv);
  ring_hello(b, mine);
  FC_CHECK(connect_retry(b, next, nlen, what, deadline_in(b->timeout_ms), 1, &b->next_fd));
  /* Send, accept, answer, and only then read rank+1's answer: every rank connects first, so
   * waiting for that answer before accepting would deadlock the whole ring. */
  FC_CHECK(xfer(b, b->next_fd, mine, sizeof mine, -1, NULL, 0, what));
  FC_CHECK(accept_prev(b, lfd, pv));
  int one = 1;
  setsockopt(b->prev_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  FC_CHECK(xfer(b, b->prev_fd, mine, sizeof mine, -1, NULL, 0, back));
  FC_CHECK(xfer(b, -1, NULL, 0, b->next_fd, theirs, FRAME_BYTES, what));
  FC_CHECK(check_frame(b, theirs, TAG_RING, 0, RING_BYTES, nx, what));
  FC_CHECK(xfer(b, -1, NULL, 0, b->next_fd, theirs + FRAME_BYTES, RING_BYTES, what));
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
  socklen_t rlen = 0, nlen = 0;
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

/* One ring step: bytes from sbuf to rank+1 while bytes from rank-1 land in rbuf, each behind a
 * frame that is read and checked before the payload.  Small payloads leave with their frame in
 * one write (the per-call exchanges of direct mode: one round trip, not two). */
static fc_result_t ring_step(const fc_bootstrap_t *b, uint32_t seq, const char *sbuf, char *rbuf, size_t bytes,
                             int from, const char *what) {
  enum { INLINE_MAX = 1024 };
  unsigned char out[FRAME_BYTES + INLINE_MAX], in[FRAME_BYTES];
  size_t inl = bytes <= INLINE_MAX ? bytes : 0;
  frame_put(out, TAG_AG, seq, bytes);
  if (inl) memcpy(out + FRAME_BYTES, sbuf, inl);
  FC_CHECK(xfer(b, b->next_fd, out, FRAME_BYTES + inl, b->prev_fd, in, FRAME_BYTES, what));
  FC_CHECK(check_frame(b, in, TAG_AG, seq, bytes, from, what));
  if (!bytes) return FLEXCOLL_SUCCESS;
  return xfer(b, b->next_fd, sbuf + inl, bytes - inl, b->prev_fd, rbuf, bytes, what);
}

flexcoll_result_t fc_bootstrap_allgather(fc_bootstrap_t *b, void *data, size_t bytes) {
  if (!b || (!data && bytes)) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap allgather: NULL argument");
  int n = b->nranks, pv = (b->rank + n - 1) % n;
  if (bytes && (size_t)n > SIZE_MAX / bytes)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap allgather: %d x %zu bytes overflows", n, bytes);
  uint32_t seq = b->seq++;
  if (n == 1) return FLEXCOLL_SUCCESS;
  char what[96];
  char *d = data;
  snprintf(what, sizeof what, "allgather #%u (to rank %d, from rank %d)", seq, (b->rank + 1) % n, pv);
  /* Every step carries call number and size: a rank that skipped a call or passed another size
   * becomes an error instead of silently shifted data.  Zero bytes: one step, the check alone. */
  for (int s = 0; s < (bytes ? n - 1 : 1); s++) {
    size_t send_slot = (size_t)((b->rank - s + n) % n), recv_slot = (size_t)((b->rank - s - 1 + n) % n);
    FC_CHECK(ring_step(b, seq, bytes ? d + send_slot * bytes : NULL, bytes ? d + recv_slot * bytes : NULL, bytes, pv,
                       what));
  }
  return FLEXCOLL_SUCCESS;
}

void fc_bootstrap_set_progress(fc_bootstrap_t *b, int (*progress)(void *), void *arg) {
  if (!b) return;
  b->progress = progress;
  b->progress_arg = arg;
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

flexcoll_result_t fc_bootstrap_agree(fc_bootstrap_t *b, int ok, int *first_not) {
  *first_not = -1;
  if (!b) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "bootstrap agree: NULL bootstrap");
  char *all = calloc((size_t)b->nranks, 1);
  if (!all) return fc_error(NULL, FLEXCOLL_SYSTEM_ERROR, "bootstrap agree: out of memory");
  all[b->rank] = ok != 0;
  fc_result_t res = fc_bootstrap_allgather(b, all, 1);
  for (int q = 0; q < b->nranks && res == FLEXCOLL_SUCCESS && *first_not < 0; q++)
    if (!all[q]) *first_not = q;
  free(all);
  return res;
}

/* Sent on both ring sockets by a rank that destroys its communicator: a neighbour that finished
 * first and left is not a neighbour that died (its peers may still be completing their part).
 * A frame like any other, so that a rank still expecting data reports who left. */
static int said_goodbye(int fd) {
  unsigned char buf[FRAME_BYTES];
  ssize_t k = recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
  return k == (ssize_t)sizeof buf && get32(buf) == TAG_BYE;
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
    unsigned char goodbye[FRAME_BYTES];
    frame_put(goodbye, TAG_BYE, 0, 0);
    for (int i = 0; i < 2; i++) {
      int fd = i ? b->prev_fd : b->next_fd;
      if (fd >= 0) (void)!send(fd, goodbye, sizeof goodbye, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  sock_close(&b->next_fd);
  sock_close(&b->prev_fd);
  free(b);
}
