/* net.h — private to lib/bootstrap/: the wire constants, the table of pending connections and the
 * socket helpers that net.c, root.c and rank.c share.  The interface is lib/bootstrap.h.
 *
 * Wire formats are fixed-size and big-endian, written byte by byte, so that ids and messages mean
 * the same on every host whatever its compiler's struct layout.  Every socket is nonblocking and
 * every wait goes through poll, so that a timeout or an abort is never stuck behind a read.
 *
 * The .c files define _GNU_SOURCE before any header (accept4, POLLRDHUP, NI_MAXHOST). */
#ifndef FC_BOOTSTRAP_NET_H
#define FC_BOOTSTRAP_NET_H

#include "bootstrap.h"

#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "error.h"

enum {
  ID_VERSION = 1,
  PROTO_VERSION = 2,     /* 2: every message framed */
  ADDR_BYTES = 24,       /* family, 0, port, 16 address bytes, IPv6 scope id */
  ID_CHECKED_BYTES = 36, /* version, "fcb", magic, address; the checksum follows */
  ID_USED_BYTES = 40,
  FRAME_BYTES = 16,                       /* type, call number (0 outside all-gathers), payload bytes */
  HELLO_BYTES = 20 + ADDR_BYTES,          /* version, magic, rank, nranks, listen address */
  REPLY_BYTES = 8 + ADDR_BYTES,           /* status, nranks (or ranks joined), address of rank+1 */
  RING_BYTES = 12,                        /* magic, rank */
  PEND_BYTES = FRAME_BYTES + HELLO_BYTES, /* the longest first message: a root hello */
  ROOT_MAX_PENDING = 128,
  RING_MAX_PENDING = 8,
  HELLO_TIMEOUT_MS = 10000,
  SLICE_MS = 50,
};
/* Frame types.  A goodbye is a frame like any other, so that a rank reading data can tell it apart. */
#define TAG_HELLO 0x46434248u /* "FCBH" */
#define TAG_REPLY 0x46434252u /* "FCBR" */
#define TAG_RING 0x4643424cu  /* "FCBL" */
#define TAG_AG 0x46434241u    /* "FCBA" */
#define TAG_BYE 0x46434258u   /* "FCBX" */
#define FNV64_INIT 0xcbf29ce484222325ULL

/* ST_GAVEUP: the root timed out or was stopped; nranks then carries how many had joined.
 * ST_UNUSED: was "wrong magic", which is now answered by nothing at all. */
enum { ST_OK, ST_UNUSED, ST_NRANKS, ST_BADRANK, ST_DUP, ST_GAVEUP };

/* A connection that has not yet proven what it is: read side by side with the others. */
typedef struct {
  int fd;
  size_t got;
  int64_t deadline;
  unsigned char buf[PEND_BYTES];
} pend_t;

/* The connections a listener has accepted but not yet identified, oldest first. */
typedef struct {
  pend_t *v;
  int n, cap;
  size_t want;          /* bytes of a whole first message */
  int hello_ms;         /* how long one may stay silent; <= 0: no limit */
  int64_t pause_until;  /* after a resource error, when to accept again */
  unsigned long evicted, closed; /* pushed out for room; closed before sending anything */
  const char *who;      /* names the listener in the log */
} pend_table_t;

/* ---- small helpers ---------------------------------------------------------------------- */

static inline void put32(unsigned char *p, uint32_t v) { for (int i = 3; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v; }
static inline void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }
static inline uint32_t get32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static inline uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

static inline uint64_t fnv1a64(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

static inline int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static inline int64_t deadline_in(int ms) { return ms > 0 ? now_ms() + ms : INT64_MAX; }
static inline int again(int e) { return e == EINTR || e == EAGAIN || e == EWOULDBLOCK; }

static inline void set_port(struct sockaddr_storage *ss, uint16_t port_be) {
  if (ss->ss_family == AF_INET) ((struct sockaddr_in *)ss)->sin_port = port_be;
  else ((struct sockaddr_in6 *)ss)->sin6_port = port_be;
}

static inline void sock_close(int *fd) {
  /* No retry on EINTR: Linux has released the descriptor anyway, and it may already be reused. */
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* ---- wire.c: the messages as bytes (pure functions; tests/fuzz feeds them anything) ------------ */

/* The ADDR_BYTES wire form of an address: pack returns -1 for what is not IPv4/IPv6 with a port,
 * unpack -1 for bytes that are not a well-formed address. */
int fc_bs_addr_pack(unsigned char *p, const struct sockaddr *sa, socklen_t len);
int fc_bs_addr_unpack(const unsigned char *p, struct sockaddr_storage *ss, socklen_t *len);

/* The FLEXCOLL_UNIQUE_ID_BYTES of an id: NULL and *magic, *addr, *len set when well formed, else
 * why not (addr may have been written). */
const char *fc_bs_id_parse(const unsigned char *p, uint64_t *magic, struct sockaddr_storage *addr, socklen_t *len);

/* A frame header (FRAME_BYTES at h), as it came. */
typedef struct {
  uint32_t type, seq;
  uint64_t len;
} fc_bs_frame_t;
fc_bs_frame_t fc_bs_frame_parse(const unsigned char *h);

/* The most ranks a hello may announce (flexcoll_comm_init_rank's limit): the root sizes its
 * tables from the first hello with the job's magic. */
#define FC_BS_MAX_RANKS 65535
/* A root's first message from a connection (n bytes at m): FOREIGN, not a hello of this protocol
 * version; OTHER_JOB, a hello with another magic than `magic`; BAD, this job's magic with a rank,
 * rank count or address that cannot be; OK, *out filled. */
enum { FC_BS_HELLO_OK, FC_BS_HELLO_FOREIGN, FC_BS_HELLO_OTHER_JOB, FC_BS_HELLO_BAD };
typedef struct {
  int rank, nranks;
  unsigned char addr[ADDR_BYTES]; /* well formed (fc_bs_addr_unpack accepts it) */
} fc_bs_hello_t;
int fc_bs_hello_parse(const unsigned char *m, size_t n, uint64_t magic, fc_bs_hello_t *out);

/* The root's reply (n bytes at m): 0 and *out, or -1 when it is not a reply frame.  status and
 * nranks are as sent (ST_*); next_ok: next/next_len hold a well-formed address. */
typedef struct {
  uint32_t status, nranks;
  int next_ok;
  struct sockaddr_storage next;
  socklen_t next_len;
} fc_bs_reply_t;
int fc_bs_reply_parse(const unsigned char *m, size_t n, fc_bs_reply_t *out);

/* 1 when the n bytes at m are the ring hello of rank `rank` of the job with `magic`. */
int fc_bs_ring_hello_ok(const unsigned char *m, size_t n, uint64_t magic, int rank);

/* ---- net.c ------------------------------------------------------------------------------- */

/* "host:port" or "[v6addr]:port" of ss into buf (n bytes); returns buf. */
const char *fc_bs_addr_str(const struct sockaddr_storage *ss, socklen_t len, char *buf, size_t n);

/* The address (port 0) of the interface FLEXCOLL_SOCKET_IFNAME picks, or of the default one. */
fc_result_t fc_bs_pick_interface(struct sockaddr_storage *addr, socklen_t *len);
/* Bind a nonblocking listener to *addr (port 0: any free port) and report the bound address;
 * reuse sets SO_REUSEADDR, what names the listener in errors. */
fc_result_t fc_bs_listen_on(struct sockaddr_storage *addr, socklen_t *len, int reuse, int *fd_out, const char *what);

/* Accept queued connections (a bounded batch, so that reading the hellos already in is never
 * starved by a flood) and read what each has sent.  A connection already closed by its peer is
 * dropped at once; when the table is full the oldest silent one goes, else the oldest part-way
 * through its message, never one whose whole message is in.  The caller then handles every entry
 * with got == want. */
void fc_bs_pend_accept(int lfd, pend_table_t *t);
/* 1: `want` bytes are in; 0: more to come; -1: closed or failed before a whole message. */
int fc_bs_pend_read(pend_t *p, size_t want);
/* Drop the entries whose fd is -1; returns how many are left. */
int fc_bs_pend_compact(pend_t *v, int n);

/* Frame header at p: type, seq, then len payload bytes. */
static inline void frame_put(unsigned char *p, uint32_t type, uint32_t seq, uint64_t len) {
  put32(p, type);
  put32(p + 4, seq);
  put64(p + 8, len);
}

#endif
