/* wire.c — the bootstrap's messages as bytes: every function that reads what came from the
 * network (frames, the root's hello, its reply, the ring hello, addresses, the unique id) is here,
 * pure: no sockets, no allocation, no logging, no global state.  Their callers (root.c, rank.c,
 * net.c) decide what to do and say; tests/fuzz/fuzz_bootstrap.c feeds them arbitrary bytes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "net.h"

#include <string.h>

/* ---- addresses --------------------------------------------------------------------------- */

int fc_bs_addr_pack(unsigned char *p, const struct sockaddr *sa, socklen_t len) {
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

int fc_bs_addr_unpack(const unsigned char *p, struct sockaddr_storage *ss, socklen_t *len) {
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

/* ---- the unique id ------------------------------------------------------------------------ */

const char *fc_bs_id_parse(const unsigned char *p, uint64_t *magic, struct sockaddr_storage *addr, socklen_t *len) {
  const char *why = NULL;
  if (p[0] != ID_VERSION || memcmp(p + 1, "fcb", 3) != 0) why = "unknown version or marker";
  else if (get32(p + ID_CHECKED_BYTES) != (uint32_t)fnv1a64(FNV64_INIT, p, ID_CHECKED_BYTES)) why = "bad checksum";
  else if (fc_bs_addr_unpack(p + 12, addr, len) != 0) why = "bad address";
  for (int i = ID_USED_BYTES; !why && i < FLEXCOLL_UNIQUE_ID_BYTES; i++)
    if (p[i]) why = "nonzero padding";
  if (!why) *magic = get64(p + 4);
  return why;
}

/* ---- frames and messages ------------------------------------------------------------------ */

fc_bs_frame_t fc_bs_frame_parse(const unsigned char *h) {
  return (fc_bs_frame_t){.type = get32(h), .seq = get32(h + 4), .len = get64(h + 8)};
}

int fc_bs_hello_parse(const unsigned char *m, size_t n, uint64_t magic, fc_bs_hello_t *out) {
  const unsigned char *h = m + FRAME_BYTES;
  struct sockaddr_storage ss;
  socklen_t len;
  if (n != FRAME_BYTES + HELLO_BYTES) return FC_BS_HELLO_FOREIGN;
  fc_bs_frame_t f = fc_bs_frame_parse(m);
  if (f.type != TAG_HELLO || f.seq != 0 || f.len != HELLO_BYTES || get32(h) != PROTO_VERSION) return FC_BS_HELLO_FOREIGN;
  if (get64(h + 4) != magic) return FC_BS_HELLO_OTHER_JOB;
  uint32_t rank = get32(h + 12), nranks = get32(h + 16);
  if (nranks < 1 || nranks > FC_BS_MAX_RANKS || rank >= nranks || fc_bs_addr_unpack(h + 20, &ss, &len) != 0)
    return FC_BS_HELLO_BAD;
  out->rank = (int)rank;
  out->nranks = (int)nranks;
  memcpy(out->addr, h + 20, ADDR_BYTES);
  return FC_BS_HELLO_OK;
}

int fc_bs_reply_parse(const unsigned char *m, size_t n, fc_bs_reply_t *out) {
  if (n != FRAME_BYTES + REPLY_BYTES) return -1;
  fc_bs_frame_t f = fc_bs_frame_parse(m);
  if (f.type != TAG_REPLY || f.seq != 0 || f.len != REPLY_BYTES) return -1;
  m += FRAME_BYTES;
  out->status = get32(m);
  out->nranks = get32(m + 4);
  out->next_len = 0;
  out->next_ok = fc_bs_addr_unpack(m + 8, &out->next, &out->next_len) == 0;
  return 0;
}

int fc_bs_ring_hello_ok(const unsigned char *m, size_t n, uint64_t magic, int rank) {
  if (n != FRAME_BYTES + RING_BYTES) return 0;
  fc_bs_frame_t f = fc_bs_frame_parse(m);
  return f.type == TAG_RING && f.seq == 0 && f.len == RING_BYTES && get64(m + FRAME_BYTES) == magic &&
         get32(m + FRAME_BYTES + 8) == (uint32_t)rank;
}
