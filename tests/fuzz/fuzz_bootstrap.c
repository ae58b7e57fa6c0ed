/* fuzz_bootstrap.c — libFuzzer target for the bootstrap's parsers of network bytes
 * (lib/bootstrap/wire.c): what the root makes of a connection's first message (the hello), what a
 * rank makes of the root's reply, of a ring hello, of frame headers, of wire addresses, and of a
 * unique id (which travels between processes as bytes).  Run by tests/fuzz/run.sh (make fuzz).
 *
 * Input: a stream of messages, each one kind byte (its value mod 6 picks the parser) followed by
 * that kind's fixed size of bytes (short at the end of the input: zero-filled, and the parser is
 * also given the true length).  Besides the sanitizers' checks, every result is checked for what
 * its callers rely on: an accepted hello names a rank below its rank count, at most
 * FC_BS_MAX_RANKS, and an address that packs back to the same bytes; an accepted address or id
 * round-trips; a reply's next address is well formed when it says so. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/net.h"

/* The magic of the job the fuzzed root and ranks belong to (the corpus's hellos carry it). */
#define FUZZ_MAGIC 0x0123456789abcdefULL

enum { K_HELLO, K_REPLY, K_RING, K_FRAME, K_ADDR, K_ID, NKINDS };
static const size_t kind_bytes[NKINDS] = {FRAME_BYTES + HELLO_BYTES, FRAME_BYTES + REPLY_BYTES,
                                          FRAME_BYTES + RING_BYTES,  FRAME_BYTES,
                                          ADDR_BYTES,                FLEXCOLL_UNIQUE_ID_BYTES};

#define REQUIRE(c)                                                                             \
  do {                                                                                         \
    if (!(c)) {                                                                                \
      fprintf(stderr, "fuzz_bootstrap: %s:%d: %s does not hold\n", __FILE__, __LINE__, #c);    \
      abort();                                                                                 \
    }                                                                                          \
  } while (0)

/* An address the parser accepted packs back to the bytes it came from. */
static void addr_roundtrip(const unsigned char *p) {
  struct sockaddr_storage ss;
  socklen_t len = 0;
  if (fc_bs_addr_unpack(p, &ss, &len) != 0) return;
  REQUIRE(len == (ss.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)));
  unsigned char back[ADDR_BYTES];
  REQUIRE(fc_bs_addr_pack(back, (struct sockaddr *)&ss, len) == 0);
  REQUIRE(memcmp(back, p, ADDR_BYTES) == 0);
}

static void one(int kind, const unsigned char *m, size_t got) {
  switch (kind) {
    case K_HELLO: {
      fc_bs_hello_t h;
      int k = fc_bs_hello_parse(m, got, FUZZ_MAGIC, &h);
      REQUIRE(k >= FC_BS_HELLO_OK && k <= FC_BS_HELLO_BAD);
      if (k == FC_BS_HELLO_OK) {
        REQUIRE(got == kind_bytes[K_HELLO]);
        REQUIRE(h.nranks >= 1 && h.nranks <= FC_BS_MAX_RANKS && h.rank >= 0 && h.rank < h.nranks);
        addr_roundtrip(h.addr);
        struct sockaddr_storage ss;
        socklen_t len;
        REQUIRE(fc_bs_addr_unpack(h.addr, &ss, &len) == 0);
      }
      /* Another job's root must never accept it. */
      fc_bs_hello_t h2;
      if (k == FC_BS_HELLO_OK) REQUIRE(fc_bs_hello_parse(m, got, ~FUZZ_MAGIC, &h2) == FC_BS_HELLO_OTHER_JOB);
      break;
    }
    case K_REPLY: {
      fc_bs_reply_t r;
      if (fc_bs_reply_parse(m, got, &r) == 0) {
        REQUIRE(got == kind_bytes[K_REPLY]);
        if (r.next_ok) REQUIRE(r.next.ss_family == AF_INET || r.next.ss_family == AF_INET6);
        else REQUIRE(r.next_len == 0);
      }
      break;
    }
    case K_RING:
      for (int rank = 0; rank < 3; rank++)
        if (fc_bs_ring_hello_ok(m, got, FUZZ_MAGIC, rank)) REQUIRE(got == kind_bytes[K_RING]);
      break;
    case K_FRAME: {
      fc_bs_frame_t f = fc_bs_frame_parse(m);
      unsigned char back[FRAME_BYTES];
      frame_put(back, f.type, f.seq, f.len);
      REQUIRE(memcmp(back, m, FRAME_BYTES) == 0);
      break;
    }
    case K_ADDR:
      addr_roundtrip(m);
      break;
    case K_ID: {
      uint64_t magic = 0;
      struct sockaddr_storage ss;
      socklen_t len = 0;
      if (!fc_bs_id_parse(m, &magic, &ss, &len)) {
        REQUIRE(len == sizeof(struct sockaddr_in) || len == sizeof(struct sockaddr_in6));
        addr_roundtrip(m + 12);
      }
      break;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  while (size > 0) {
    int kind = data[0] % NKINDS;
    data++, size--;
    size_t want = kind_bytes[kind], got = size < want ? size : want;
    /* An exact-size copy on the heap: ASan sees any read past what the parser was given. */
    unsigned char *m = malloc(want);
    if (!m) return 0;
    memset(m, 0, want);
    memcpy(m, data, got);
    one(kind, m, want);
    if (got < want && kind != K_FRAME && kind != K_ADDR && kind != K_ID) {
      /* The true length too, in a buffer of exactly that size. */
      unsigned char *s = malloc(got ? got : 1);
      if (s) {
        memcpy(s, data, got);
        one(kind, s, got);
        free(s);
      }
    }
    free(m);
    data += got, size -= got;
  }
  return 0;
}
