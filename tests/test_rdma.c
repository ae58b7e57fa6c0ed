/* test_rdma.c — the rdma link (lib/transports/rdma.c) against the fake verbs provider.
 *
 * With FLEXCOLL_VERBS_PROVIDER=fake (tests/fake_verbs.c: RC queue pairs between processes of this
 * host, shared memory as the wire): every host collective and send/recv over `rdma` alone for 2, 3
 * and 4 ranks (processes, and threads of one process), several datatypes, counts 0, 1, 7, odd and
 * large, checked against the reference, with the bytes on links named "rdma"; `shm,rdma` at fixed
 * shares bitwise equal to `shm` alone with both links carrying bytes; every injected fault
 * (FLEXCOLL_VERBS_FAKE_FAULT) ends in an error on every rank within the timeout, never a crash, a
 * hang or a wrong result; no device is no link; no descriptor or shared-memory segment is left.
 * Zero copy (rendezvous): send/recv around FLEXCOLL_RDMA_ZCOPY_BYTES and large allreduce/allgather
 * with it at the default, at an odd value and off, checked, bitwise equal, with registrations
 * counted by the fake (some with it on, none with it off, none left after destroy); faults during
 * rendezvous transfers end in errors, leaving no registration.  The registration cache: hits,
 * least-recently-used eviction and no cache counted in the fake's registrations, and buffers
 * unmapped and mapped again at the same address under the fake's pinned model (right where the
 * cache is safe, wrong in the unsafe mode, which shows the check can see it).
 *
 * FC_TEST_RDMA_REAL=1 runs the collective and bitwise cases with the real provider (libibverbs)
 * instead, for machines with a NIC, and exits 77 where there is no device
 * (tests/test_rdma_real.sh). */
#define _GNU_SOURCE
#include "config.h"
#include <check.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include "dtype.h"
#include "flexcoll.h"
#include "harness.h"
#include "pcall.h"
#include "transports/verbs.h"
#include "transports/rdma_dev.h"

static char g_dir[256]; /* the ranks' result digests */
static int g_real;      /* the real provider instead of the fake */

static const size_t counts[] = {0, 1, 7, 1001, 300007};
#define NCOUNTS (sizeof counts / sizeof counts[0])
static const flexcoll_datatype_t dtypes[] = {FLEXCOLL_FLOAT32, FLEXCOLL_INT32, FLEXCOLL_FLOAT64, FLEXCOLL_UINT8};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])


static const char *provider_env(void) { return g_real ? "FLEXCOLL_VERBS_PROVIDER=" : "FLEXCOLL_VERBS_PROVIDER=fake"; }

/* Bytes this rank sent over links named `name`, and how many (link, peer) entries there are. */
static unsigned long long link_bytes(hx_rank_t *r, flexcoll_comm_t comm, const char *name, int *entries, int *total) {
  flexcoll_link_stats_t st[64];
  int n = 0;
  unsigned long long bytes = 0;
  *entries = 0;
  if (!hx_ok(r, flexcoll_comm_get_link_stats(comm, st, 64, &n), comm, "get_link_stats")) return 0;
  *total = n;
  for (int i = 0; i < n && i < 64; i++)
    if (!strcmp(st[i].name, name)) {
      bytes += st[i].bytes;
      (*entries)++;
    }
  return bytes;
}

/* A ring exchange of send/recv in a group: to the next rank, from the previous one, and a message
 * to itself (received before it is sent). */
static void p2p_ring(hx_rank_t *r, flexcoll_datatype_t dt, size_t count, uint64_t call, FILE *f) {
  size_t es = fc_dtype_size(dt);
  int next = (r->rank + 1) % r->nranks, prev = (r->rank + r->nranks - 1) % r->nranks;
  hx_data_t d = {dt, HX_GEN_BITS, r->seed, call, r->nranks};
  hx_buf_t sb, rb, selfb;
  char *send = hx_buf_new(r, &sb, count * es), *recv = hx_buf_new(r, &rb, count * es);
  char *self = hx_buf_new(r, &selfb, count * es);
  if (!send || !recv || !self) return;
  hx_fill(&d, r->rank, send, 0, count);
  snprintf(r->what, sizeof r->what, "send/recv ring %s count %zu", fc_dtype_name(dt), count);
  flexcoll_group_start();
  flexcoll_result_t a = flexcoll_send(send, count, dt, next, r->comm, NULL);
  flexcoll_result_t b = flexcoll_recv(recv, count, dt, prev, r->comm, NULL);
  flexcoll_result_t c = flexcoll_recv(self, count, dt, r->rank, r->comm, NULL);
  flexcoll_result_t s = flexcoll_send(send, count, dt, r->rank, r->comm, NULL);
  flexcoll_result_t e = flexcoll_group_end();
  if (hx_ok(r, a, r->comm, "send") && hx_ok(r, b, r->comm, "recv") && hx_ok(r, c, r->comm, "recv self") &&
      hx_ok(r, s, r->comm, "send self") && hx_ok(r, e, r->comm, "group_end")) {
    hx_check_input(r, "from prev", &d, prev, recv, 0, count);
    hx_check_input(r, "from self", &d, r->rank, self, 0, count);
  }
  hx_buf_check_guards(r, "recv", &rb);
  hx_buf_check_guards(r, "recv self", &selfb);
  hx_buf_free(&selfb);
  if (f) fprintf(f, "p2p %d %zu %016llx\n", (int)dt, count, (unsigned long long)hx_digest(recv, count * es));
  hx_buf_free(&sb);
  hx_buf_free(&rb);
}

/* Every collective x dtype x count, and send/recv, checked; digests into g_dir/<label>.rank<r>
 * when the run has a label (arg). */
static int matrix_rank(hx_rank_t *r) {
  const char *label = r->arg;
  FILE *f = NULL;
  if (label) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s.rank%d", g_dir, label, r->rank);
    if (!(f = fopen(path, "w"))) return hx_fail(r, "cannot write %s", path);
  }
  uint64_t call = 0;
  for (size_t d = 0; d < NDTYPES; d++)
    for (size_t c = 0; c < NCOUNTS; c++) {
      for (int coll = 0; coll < NCOLLS; coll++, call++) {
        pcall_t p = {.coll = coll, .dtype = dtypes[d], .op = coll_reduces(coll) ? FLEXCOLL_SUM : FLEXCOLL_SUM,
                     .count = counts[c], .root = (int)(call % (uint64_t)r->nranks), .inplace = (int)(call % 3 == 0),
                     .rank = r->rank, .nranks = r->nranks};
        if (dtypes[d] == FLEXCOLL_UINT8 && coll_reduces(coll)) p.op = FLEXCOLL_MAX;
        if (pcall_prepare(r, &p, r->seed, call) != 0) return 1;
        pcall_describe(r->what, sizeof r->what, &p);
        flexcoll_result_t res = pcall_issue(&p, r->comm);
        if (!hx_ok(r, res, r->comm, coll_names[coll])) {
          pcall_free(&p);
          if (f) fclose(f);
          return 1;
        }
        if (f && p.recv) {
          size_t elems = coll == C_ALLGATHER || coll == C_ALLTOALL ? (size_t)r->nranks * p.count : p.count;
          int has = !(coll == C_REDUCE && r->rank != p.root);
          fprintf(f, "%s %zu %zu %016llx\n", coll_names[coll], d, c,
                  has ? (unsigned long long)hx_digest(p.recv, elems * fc_dtype_size(p.dtype)) : 0ull);
        }
        pcall_check(r, &p);
      }
      p2p_ring(r, dtypes[d], counts[c], call++, f);
    }
  if (f) fclose(f);
  int entries = 0, total = 0;
  unsigned long long rdma = link_bytes(r, r->comm, "rdma", &entries, &total);
  unsigned long long shm = 0;
  int shm_entries = 0;
  shm = link_bytes(r, r->comm, "shm", &shm_entries, &total);
  const char *links = getenv("FLEXCOLL_LINKS");
  fprintf(stderr, "[test_rdma] %s rank %d: rdma sent %llu bytes (%d entries), shm %llu\n", label ? label : "-", r->rank,
          rdma, entries, shm);
  /* FC_TEST_RAILS: rdma links (NICs) each rank must have opened, each toward every peer.
   * FC_TEST_RDMA_WITHOUT=R: rank R has no device (the fake's nodev@R): no rdma there, and none
   * toward it from the others, which keep rdma between themselves. */
  const int rails = getenv("FC_TEST_RAILS") ? atoi(getenv("FC_TEST_RAILS")) : 1;
  const int without = getenv("FC_TEST_RDMA_WITHOUT") ? atoi(getenv("FC_TEST_RDMA_WITHOUT")) : -1;
  if (links && strstr(links, "rdma") && without == r->rank) {
    if (entries || rdma) hx_fail(r, "no device here, yet %d rdma link entries (%llu bytes)", entries, rdma);
  } else if (links && strstr(links, "rdma")) {
    const int peers = r->nranks - 1 - (without >= 0);
    const char *shares = getenv("FLEXCOLL_LINK_SHARES");
    const int fixed = shares && *shares; /* under the balancer a link may rightly carry nothing */
    /* FC_TEST_RAILS_PER_RANK=a,b,c...: ranks with different NIC counts; a pair has as many rdma
     * entries as the one of the two with fewer. */
    int per_rank[64], nper = 0, want = rails * peers;
    const char *pr = getenv("FC_TEST_RAILS_PER_RANK");
    for (const char *c = pr; c && *c && nper < 64; c = strchr(c, ',') ? strchr(c, ',') + 1 : "") per_rank[nper++] = atoi(c);
    if (nper == r->nranks) {
      want = 0;
      for (int q = 0; q < r->nranks; q++)
        if (q != r->rank) want += per_rank[q] < per_rank[r->rank] ? per_rank[q] : per_rank[r->rank];
    }
    if (entries != want) hx_fail(r, "%d rdma link entries, expected %d", entries, want);
    flexcoll_link_stats_t st[64];
    int n = 0;
    /* Bytes per rail: a peer's rdma entries come in the rails' order. */
    unsigned long long rail_bytes[8] = {0};
    if ((rails > 1 || without >= 0) && flexcoll_comm_get_link_stats(r->comm, st, 64, &n) == FLEXCOLL_SUCCESS)
      for (int i = 0; i < n && i < 64; i++) {
        if (strcmp(st[i].name, "rdma") || st[i].peer == r->rank) continue;
        if (st[i].peer == without) hx_fail(r, "an rdma entry toward rank %d, which has no device", without);
        int rail = 0;
        for (int j = 0; j < i; j++) rail += !strcmp(st[j].name, "rdma") && st[j].peer == st[i].peer;
        if (rail < 8) rail_bytes[rail] += st[i].bytes;
        if (rails > 1)
          fprintf(stderr, "[test_rdma] %s rank %d: rdma entry %d (rail %d) to rank %d: %llu bytes\n",
                  label ? label : "-", r->rank, i, rail, st[i].peer, st[i].bytes);
        /* At fixed shares every pair's rails carry their part.  Under the balancer, rails under
         * one root port are worth one NIC, so it keeps to the better one and the other carries
         * only probe shares, which a peer that gets only small transfers from this rank (the
         * ring's previous rank) may never see: each rail must carry bytes, not to every peer. */
        if (!st[i].bytes && fixed) hx_fail(r, "rdma (entry %d) carried nothing to rank %d", i, st[i].peer);
      }
    if (rails > 1 && n > 0)
      for (int k = 0; k < rails && k < 8; k++)
        if (!rail_bytes[k]) hx_fail(r, "rdma rail %d carried nothing to any peer", k);
    if (!rdma && (fixed || !strchr(links, ','))) hx_fail(r, "FLEXCOLL_LINKS=%s: rdma carried nothing", links);
    if (strchr(links, ',') && fixed && !shm) hx_fail(r, "FLEXCOLL_LINKS=%s at fixed shares: shm carried nothing", links);
  }
  return 0;
}

/* nranks ranks (processes, or threads) of fn under env.  One label per rank count: it salts the
 * seed, and compared runs must see the same data. */
static int run_ranks(int nranks, int threads, const char *const *env, hx_rank_fn fn, void *arg) {
  char same[32];
  snprintf(same, sizeof same, "rdma-%d", nranks);
  hx_opts_t o = {.label = same, .env = env, .deadline_s = 280};
  return threads ? hx_run_threads(nranks, &o, fn, arg) : hx_run_procs(nranks, &o, fn, arg);
}

static int run(int nranks, int threads, const char *label, const char *links, const char *shares) {
  char e1[64], e2[96];
  snprintf(e1, sizeof e1, "FLEXCOLL_LINKS=%s", links);
  snprintf(e2, sizeof e2, "FLEXCOLL_LINK_SHARES=%s", shares ? shares : "");
  const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", e1, e2, NULL};
  fprintf(stderr, "[test_rdma] %s: %d ranks (%s), FLEXCOLL_LINKS=%s FLEXCOLL_LINK_SHARES=%s\n", label ? label : "-", nranks,
          threads ? "threads" : "processes", links, shares ? shares : "");
  return run_ranks(nranks, threads, env, matrix_rank, (void *)label);
}

START_TEST(test_collectives) {
  int nranks = 2 + _i;
  ck_assert_msg(run(nranks, 0, NULL, "rdma", NULL), "%d ranks over rdma: see stderr", nranks);
}
END_TEST

START_TEST(test_collectives_threads) {
  ck_assert_msg(run(3, 1, NULL, "rdma", NULL), "3 thread ranks over rdma: see stderr");
}
END_TEST

START_TEST(test_bitwise_with_shm) {
  int nranks = 2 + _i;
  char shm[32], half[32], most[32];
  snprintf(shm, sizeof shm, "shm-%d", nranks);
  snprintf(half, sizeof half, "half-%d", nranks);
  snprintf(most, sizeof most, "most-%d", nranks);
  ck_assert_msg(run(nranks, 0, shm, "shm", NULL), "%d ranks over shm: see stderr", nranks);
  ck_assert_msg(run(nranks, 0, half, "shm,rdma", "shm:0.5,rdma:0.5"), "%d ranks, shm:0.5,rdma:0.5: see stderr", nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, shm, half), "%d ranks: shm,rdma at 0.5 differ from shm alone",
                nranks);
  ck_assert_msg(run(nranks, 0, most, "shm,rdma", "shm:0.01,rdma:0.99"), "%d ranks, rdma:0.99: see stderr", nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, shm, most), "%d ranks: shm,rdma at 0.99 differ from shm alone",
                nranks);
}
END_TEST

/* ---- zero copy (rendezvous) -------------------------------------------------------------------- */

#define ZC_T (256 << 10) /* the default FLEXCOLL_RDMA_ZCOPY_BYTES */

/* The fake's registrations in this process, in all and now, and its plain RDMA WRITEs
 * (tests/fake_verbs.c). */
/* A function the fake exports, from the copy the rdma link loaded in this process (NULL when
 * it is not loaded: the closed handle's library stays, the link holds it). */
static void *fake_fn(const char *name) {
  const char *lib = getenv("FLEXCOLL_VERBS_FAKE_LIB");
  void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
  void *f = h ? dlsym(h, name) : NULL;
  if (h) dlclose(h);
  return f;
}
static void fake_stats(long *ever, long *now, long *plain) {
  *ever = *now = *plain = -1;
  void (*f)(long *, long *, long *) = (void (*)(long *, long *, long *))fake_fn("fake_verbs_mr_stats");
  if (f) f(ever, now, plain);
}
static void fake_mrs(long *ever, long *now) {
  long plain;
  fake_stats(ever, now, &plain);
}

/* Sizes around the threshold, none a multiple of anything. */
static const size_t zc_bytes[] = {ZC_T - 1, ZC_T, ZC_T + 1, 3 * ZC_T + 7, 1000003, 2500009};
#define NZC (sizeof zc_bytes / sizeof zc_bytes[0])

/* Send/recv rings of every size (each message whole on rdma: one message per send), then
 * allreduce and allgather of large odd counts, on a communicator split off and destroyed: every
 * result checked against the reference, digests into g_dir/<label>.rank<r>, and no registration
 * left once the communicator is gone.  arg: "label,expect" where expect is 1 when rendezvous
 * registrations must have happened, 2 when plain writes (rendezvous messages of several writes)
 * too, 0 when no registration may have happened. */
static int zc_rank(hx_rank_t *r) {
  char label[64];
  int expect = 0;
  if (sscanf((const char *)r->arg, "%63[^,],%d", label, &expect) != 2) return hx_fail(r, "bad arg");
  char path[400];
  snprintf(path, sizeof path, "%s/%s.rank%d", g_dir, label, r->rank);
  FILE *f = fopen(path, "w");
  if (!f) return hx_fail(r, "cannot write %s", path);
  long ever0, now0, ever1, now1, plain0, plain1;
  fake_stats(&ever0, &now0, &plain0);
  if (now0 < 0) {
    fclose(f);
    return hx_fail(r, "the fake does not report its registrations");
  }
  flexcoll_comm_t sub = NULL;
  if (!hx_ok(r, flexcoll_comm_split(r->comm, 0, r->rank, &sub, NULL), r->comm, "split")) return fclose(f), 1;
  flexcoll_comm_t keep = r->comm;
  r->comm = sub;
  uint64_t call = 0;
  for (size_t i = 0; i < NZC; i++, call++) p2p_ring(r, FLEXCOLL_UINT8, zc_bytes[i], call, f);
  static const size_t coll_counts[] = {ZC_T / 4 - 1, 250007, 700001};
  for (size_t i = 0; i < sizeof coll_counts / sizeof coll_counts[0]; i++)
    for (int k = 0; k < 2; k++, call++) {
      int coll = k ? C_ALLGATHER : C_ALLREDUCE;
      pcall_t p = {.coll = coll, .dtype = FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM, .count = coll_counts[i],
                   .inplace = (int)(call % 2), .rank = r->rank, .nranks = r->nranks};
      if (pcall_prepare(r, &p, r->seed, call) != 0) break;
      pcall_describe(r->what, sizeof r->what, &p);
      if (hx_ok(r, pcall_issue(&p, sub), sub, coll_names[coll])) {
        size_t elems = coll == C_ALLGATHER ? (size_t)r->nranks * p.count : p.count;
        fprintf(f, "%s %zu %016llx\n", coll_names[coll], p.count, (unsigned long long)hx_digest(p.recv, elems * 4));
        pcall_check(r, &p);
      }
      pcall_free(&p);
    }
  fclose(f);
  int entries = 0, total = 0;
  if (!link_bytes(r, sub, "rdma", &entries, &total)) hx_fail(r, "rdma carried nothing");
  r->comm = keep;
  hx_ok(r, flexcoll_comm_destroy(sub), NULL, "destroy");
  fake_stats(&ever1, &now1, &plain1);
  fprintf(stderr, "[test_rdma] %s rank %d: %ld registrations of user buffers, %ld left, %ld plain writes\n", label,
          r->rank, ever1 - ever0 - 2, now1 - now0, plain1 - plain0);
  if (expect == 2 && plain1 == plain0) hx_fail(r, "no rendezvous message took several writes");
  /* The split communicator's own two (ring and send area) and, with zero copy, one per message. */
  if (now1 != now0) hx_fail(r, "%ld memory regions left registered after destroy", now1 - now0);
  if (expect && ever1 - ever0 <= 2) hx_fail(r, "zero copy on, yet no user buffer was registered");
  if (!expect && ever1 - ever0 != 2) hx_fail(r, "zero copy off, yet %ld user buffers were registered", ever1 - ever0 - 2);
  return 0;
}

/* slice: FLEXCOLL_SLICE_SIZE, NULL for the default; a slice above the fake's largest message
 * (1 MiB) makes rendezvous messages that take several writes, plain ones before the last. */
static int zc_run(int nranks, const char *label, const char *zcopy, const char *slice, const char *fault, int expect,
                  const char *extra) {
  char e1[64], e2[64], e3[64], arg[80];
  snprintf(e1, sizeof e1, "FLEXCOLL_RDMA_ZCOPY_BYTES=%s", zcopy ? zcopy : "");
  snprintf(e2, sizeof e2, "FLEXCOLL_SLICE_SIZE=%s", slice ? slice : "");
  snprintf(e3, sizeof e3, "FLEXCOLL_VERBS_FAKE_FAULT=%s", fault ? fault : "");
  snprintf(arg, sizeof arg, "%s,%d", label, expect);
  const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=rdma", e1, e2, e3, extra, NULL};
  char same[32];
  snprintf(same, sizeof same, "rdma-zc-%d", nranks);
  hx_opts_t o = {.label = same, .env = env, .deadline_s = 280};
  fprintf(stderr, "[test_rdma] %s: %d ranks, FLEXCOLL_RDMA_ZCOPY_BYTES=%s FLEXCOLL_SLICE_SIZE=%s fault %s %s\n", label,
          nranks, zcopy ? zcopy : "(default)", slice ? slice : "(default)", fault ? fault : "none", extra ? extra : "");
  return hx_run_procs(nranks, &o, zc_rank, arg);
}

/* Zero copy at the default threshold (registrations cached), without the cache, at an odd
 * threshold with slices of several writes, with every fifth registration failing (those messages
 * fall back to copies, on whichever side failed), and off: every result right, all bitwise equal,
 * no registration left. */
START_TEST(test_zcopy) {
  int nranks = 2 + _i;
  char on[32], odd[32], rf[32], off[32], nc[32];
  snprintf(on, sizeof on, "zc-on-%d", nranks);
  snprintf(nc, sizeof nc, "zc-nocache-%d", nranks);
  snprintf(odd, sizeof odd, "zc-odd-%d", nranks);
  snprintf(rf, sizeof rf, "zc-regfail-%d", nranks);
  snprintf(off, sizeof off, "zc-off-%d", nranks);
  ck_assert_msg(zc_run(nranks, on, NULL, NULL, NULL, 1, NULL), "%d ranks, zero copy on: see stderr", nranks);
  ck_assert_msg(zc_run(nranks, nc, NULL, NULL, NULL, 1, "FLEXCOLL_RDMA_RCACHE_BYTES=0"),
                "%d ranks, zero copy without the registration cache: see stderr", nranks);
  ck_assert_msg(zc_run(nranks, odd, "100003", "3000017", NULL, 2, NULL),
                "%d ranks, zero copy from 100003 bytes: see stderr", nranks);
  ck_assert_msg(zc_run(nranks, rf, NULL, NULL, "regfail:5", 1, NULL), "%d ranks, failed registrations: see stderr",
                nranks);
  ck_assert_msg(zc_run(nranks, off, "0", NULL, NULL, 0, NULL), "%d ranks, zero copy off: see stderr", nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, nc, off), "%d ranks: zero copy without the cache and off differ",
                nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, on, off), "%d ranks: zero copy on and off differ", nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, odd, off), "%d ranks: zero copy at 100003 and off differ",
                nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, rf, off),
                "%d ranks: zero copy with failed registrations and off differ", nranks);
}
END_TEST

/* A fault during rendezvous transfers: every rank ends in an error within the timeout, on a
 * communicator split off, whose destroy then leaves no registration behind. */
static int zc_fault_rank(hx_rank_t *r) {
  long ever0, now0, ever1, now1;
  fake_mrs(&ever0, &now0);
  flexcoll_comm_t sub = NULL;
  if (!hx_ok(r, flexcoll_comm_split(r->comm, 0, r->rank, &sub, NULL), r->comm, "split")) return 1;
  size_t count = 600001; /* 2.4 MB: several 1 MiB slices, each a rendezvous */
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  uint64_t call;
  for (call = 0; call < 40 && res == FLEXCOLL_SUCCESS; call++) {
    pcall_t p = {.coll = call % 2 ? C_ALLGATHER : C_ALLREDUCE, .dtype = FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM,
                 .count = count, .rank = r->rank, .nranks = r->nranks};
    if (pcall_prepare(r, &p, r->seed, call) != 0) return 1;
    pcall_describe(r->what, sizeof r->what, &p);
    res = pcall_issue(&p, sub);
    if (res == FLEXCOLL_SUCCESS) pcall_check(r, &p);
    else fprintf(stderr, "[test_rdma] rank %d: zero-copy call %llu ended in %s: %s\n", r->rank, (unsigned long long)call,
                 flexcoll_get_error_string(res), flexcoll_get_last_error(sub));
    pcall_free(&p);
  }
  if (res == FLEXCOLL_SUCCESS) hx_fail(r, "every call succeeded despite FLEXCOLL_VERBS_FAKE_FAULT=%s", getenv("FLEXCOLL_VERBS_FAKE_FAULT"));
  else if (res != FLEXCOLL_REMOTE_ERROR && res != FLEXCOLL_TIMEOUT && res != FLEXCOLL_SYSTEM_ERROR)
    hx_fail(r, "returned %d (%s), not an error of the link", res, flexcoll_get_error_string(res));
  flexcoll_comm_destroy(sub);
  fake_mrs(&ever1, &now1);
  if (ever1 - ever0 <= 2) hx_fail(r, "no user buffer was registered: the fault did not meet a rendezvous");
  if (now1 != now0) hx_fail(r, "%ld memory regions left registered after destroy", now1 - now0);
  return 0;
}

static const char *zc_faults[] = {"drop:30", "drop:8", "kill:40", "portdown:25", "post:33"};

START_TEST(test_zcopy_fault) {
  char f[96];
  snprintf(f, sizeof f, "FLEXCOLL_VERBS_FAKE_FAULT=%s", zc_faults[_i]);
  const char *env[] = {"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", f, NULL};
  hx_opts_t o = {.label = zc_faults[_i], .env = env, .timeout_ms = 2000, .deadline_s = 60, .exit_barrier = 1};
  double t0 = hx_now();
  ck_assert_msg(hx_run_procs(3, &o, zc_fault_rank, NULL), "zero copy, fault %s: see stderr", zc_faults[_i]);
  fprintf(stderr, "[test_rdma] zero copy, fault %s: every rank done in %.1f s\n", zc_faults[_i], hx_now() - t0);
}
END_TEST

/* ---- several NICs (rails) ---------------------------------------------------------------------- */

/* Contexts of fake device dev this process has open (tests/fake_verbs.c). */
static long fake_open(int dev) {
  long (*f)(int) = (long (*)(int))fake_fn("fake_verbs_device_open");
  return f ? f(dev) : -1;
}

/* The matrix, then which fake devices this rank has open: arg "label,mask,split", bit k of mask
 * set where device k must be open (its communicators' rails), clear where it must not; split 1:
 * two rails each with a port of its own, so the balancer gives each a fair part toward every peer
 * (the smaller at least an eighth of the larger, far above stage 2's probes).  (Two rails under
 * one root port share a port in the model: that changes whether a split pays, not its
 * proportions, so nothing here tells.) */
static int rails_rank(hx_rank_t *r) {
  char label[64];
  int mask = 0, split = 0;
  if (sscanf((const char *)r->arg, "%63[^,],%d,%d", label, &mask, &split) != 3) return hx_fail(r, "bad arg");
  r->arg = label;
  matrix_rank(r);
  for (int k = 0; k < 3; k++) {
    long n = fake_open(k);
    if (n < 0) hx_fail(r, "the fake does not report its devices");
    else if ((n > 0) != ((mask >> k) & 1))
      hx_fail(r, "fake device %d: %ld contexts open, expected %s", k, n, (mask >> k) & 1 ? "some" : "none");
  }
  flexcoll_link_stats_t st[64];
  int n = 0;
  if (split && flexcoll_comm_get_link_stats(r->comm, st, 64, &n) == FLEXCOLL_SUCCESS)
    for (int q = 0; q < r->nranks; q++) {
      /* the rails' entries toward q, in the rails' order */
      unsigned long long b[2] = {0, 0};
      int k = 0;
      for (int i = 0; i < n && i < 64 && k < 2; i++)
        if (!strcmp(st[i].name, "rdma") && st[i].peer == q && q != r->rank) b[k++] = st[i].bytes;
      if (k < 2) continue;
      const double lo = (double)(b[0] < b[1] ? b[0] : b[1]), hi = (double)(b[0] < b[1] ? b[1] : b[0]);
      fprintf(stderr, "[test_rdma] %s rank %d: rails to rank %d carried %llu and %llu bytes\n", label, r->rank, q, b[0],
              b[1]);
      if (split == 1 && lo < hi / 8) hx_fail(r, "rails of their own ports to rank %d: %.0f and %.0f bytes", q, lo, hi);
    }
  return 0;
}

/* This process's NUMA node, and the process bound to its CPUs (ranks inherit it), so that the
 * ranks' nearest fake devices are the ones the test says. */
static int bind_to_my_node(void) {
  unsigned cpu = 0, node = 0;
  if (getcpu(&cpu, &node)) return 0;
  char path[96], list[1024];
  snprintf(path, sizeof path, "/sys/devices/system/node/node%u/cpulist", node);
  FILE *f = fopen(path, "r");
  if (!f) return (int)node;
  if (!fgets(list, sizeof list, f)) list[0] = 0;
  fclose(f);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (char *save = NULL, *t = strtok_r(list, ",\n", &save); t; t = strtok_r(NULL, ",\n", &save)) {
    unsigned a = 0, b = 0;
    int k = sscanf(t, "%u-%u", &a, &b);
    if (k == 1) b = a;
    for (unsigned c = a; k >= 1 && c <= b && c < CPU_SETSIZE; c++) CPU_SET(c, &set);
  }
  if (CPU_COUNT(&set)) sched_setaffinity(0, sizeof set, &set);
  return (int)node;
}

/* places: FLEXCOLL_VERBS_FAKE_PLACES, one device per item. */
static int rails_run(int nranks, const char *label, const char *places, const char *hca, int rails, int mask,
                     int split) {
  char e1[64], e2[300], e3[64], e4[32], e5[48], e6[400], arg[96];
  int ndev = 1;
  for (const char *c = places; *c; c++) ndev += *c == ',';
  snprintf(e5, sizeof e5, "FLEXCOLL_VERBS_FAKE_DEVICES=%d", ndev);
  snprintf(e1, sizeof e1, "FLEXCOLL_VERBS_FAKE_PLACES=%s", places);
  snprintf(e2, sizeof e2, "FLEXCOLL_VERBS_FAKE_SYSFS=%s/sysfs", g_dir);
  snprintf(e3, sizeof e3, "FLEXCOLL_IB_HCA=%s", hca ? hca : "");
  snprintf(e4, sizeof e4, "FC_TEST_RAILS=%d", rails);
  snprintf(arg, sizeof arg, "%s,%d,%d", label, mask, split);
  /* The rails' models calibrated by this run, not taken from an earlier one's cache: a calibration
   * made under load (make -j check on two CPUs) once rated one fake rail 4x the other, and every
   * later run on the machine reused it and failed the fair-split check. */
  snprintf(e6, sizeof e6, "FLEXCOLL_CACHE_DIR=%s/cache-%s", g_dir, label);
  const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_LINK_SHARES=",
                       e1, e2, e3, e4, e5, e6, NULL};
  fprintf(stderr, "[test_rdma] %s: %d ranks, fake devices at %s, FLEXCOLL_IB_HCA=%s: %d rail(s)\n", label, nranks, places,
          hca ? hca : "", rails);
  return run_ranks(nranks, 0, env, rails_rank, arg);
}

/* The matrix with rank 1's process listing the first of the devices only (the fake's fewer@1:1),
 * every other rank two near ones (places: near, far, near): link entries per pair as the rank
 * of the two with fewer rails has. */
static int rails_fewer_run(int nranks, const char *label, const char *places) {
  char e1[96], e2[300], e3[64];
  snprintf(e1, sizeof e1, "FLEXCOLL_VERBS_FAKE_PLACES=%s", places);
  snprintf(e2, sizeof e2, "FLEXCOLL_VERBS_FAKE_SYSFS=%s/sysfs", g_dir);
  snprintf(e3, sizeof e3, "FC_TEST_RAILS_PER_RANK=%s", nranks == 2 ? "2,1" : "2,1,2");
  const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_LINK_SHARES=",
                       "FLEXCOLL_VERBS_FAKE_DEVICES=3", "FLEXCOLL_VERBS_FAKE_FAULT=fewer@1:1", "FLEXCOLL_IB_HCA=",
                       e1, e2, e3, NULL};
  fprintf(stderr, "[test_rdma] %s: %d ranks, fake devices at %s, rank 1 lists one\n", label, nranks, places);
  return run_ranks(nranks, 0, env, matrix_rank, (void *)label);
}

/* Fake devices on this NUMA node (near) and another (far): one near device is one rail; two near
 * ones under different root ports are two, both carrying a fair part to every peer under the
 * balancer, the far one never opened; two near ones under one root port are two rails too;
 * FLEXCOLL_IB_HCA naming two takes exactly those, near or far.  Every result checked, and bitwise
 * the same as with one NIC. */
START_TEST(test_rails) {
  int nranks = 2 + _i;
  int me = bind_to_my_node(), far = me + 1;
  char one[32], two[32], named[32], shared[32], dev2[32], dev3[48], dev3s[48];
  snprintf(one, sizeof one, "rail1-%d", nranks);
  snprintf(two, sizeof two, "rail2-%d", nranks);
  snprintf(named, sizeof named, "railhca-%d", nranks);
  snprintf(dev2, sizeof dev2, "%d,%d", me, far);
  snprintf(dev3, sizeof dev3, "%d,%d,%d", me, far, me);
  snprintf(dev3s, sizeof dev3s, "%d,%d,%d:1", me, far, me);
  snprintf(shared, sizeof shared, "railshared-%d", nranks);
  ck_assert_msg(rails_run(nranks, one, dev2, NULL, 1, 1, 0), "%d ranks, one near NIC: see stderr", nranks);
  ck_assert_msg(rails_run(nranks, two, dev3, NULL, 2, 5, 1), "%d ranks, two near NICs: see stderr", nranks);
  ck_assert_msg(rails_run(nranks, shared, dev3s, NULL, 2, 5, 0), "%d ranks, two NICs under one port: see stderr",
                nranks);
  ck_assert_msg(rails_run(nranks, named, dev3, "fakeverbs1,fakeverbs0", 2, 3, 0),
                "%d ranks, FLEXCOLL_IB_HCA: see stderr", nranks);
  /* Rank 1 sees one of the two near NICs only: rail 0 between all, rail 1 between the others
   * (3 ranks), or rail 1 nowhere (2 ranks: one rank alone has it). */
  char fewer[32];
  snprintf(fewer, sizeof fewer, "railfewer-%d", nranks);
  ck_assert_msg(rails_fewer_run(nranks, fewer, dev3), "%d ranks, rank 1 with one NIC: see stderr", nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, one, fewer), "%d ranks: uneven rails differ from one",
                nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, one, two), "%d ranks: two rails differ from one", nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, one, named), "%d ranks: the named rails differ from one",
                nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, one, shared),
                "%d ranks: rails under one port differ from one", nranks);
}
END_TEST

/* ---- a rank without a device ------------------------------------------------------------------ */

/* One rank has no RDMA device (nodev@R): the others keep rdma between themselves, every pair with
 * that rank goes over shm alone, at fixed shares (both links carry where both join) and under the
 * balancer; results bitwise those over shm alone. */
START_TEST(test_rank_without_nic) {
  const int nranks = 3 + _i, without = nranks - 2;
  char e1[48], e2[48], shm[32], part[32], bal[32];
  snprintf(e1, sizeof e1, "FLEXCOLL_VERBS_FAKE_FAULT=nodev@%d", without);
  snprintf(e2, sizeof e2, "FC_TEST_RDMA_WITHOUT=%d", without);
  snprintf(shm, sizeof shm, "shm-%d", nranks);
  snprintf(part, sizeof part, "partial-%d", nranks);
  snprintf(bal, sizeof bal, "partialbal-%d", nranks);
  for (int balanced = 0; balanced < 2; balanced++) {
    const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=shm,rdma",
                         balanced ? "FLEXCOLL_LINK_SHARES=" : "FLEXCOLL_LINK_SHARES=shm:0.5,rdma:0.5", e1, e2, NULL};
    fprintf(stderr, "[test_rdma] %d ranks, rank %d without a device, %s\n", nranks, without,
            balanced ? "balanced" : "shm:0.5,rdma:0.5");
    ck_assert_msg(run_ranks(nranks, 0, env, matrix_rank, balanced ? bal : part),
                  "%d ranks, rank %d without a device: see stderr", nranks, without);
  }
  ck_assert_msg(run(nranks, 0, shm, "shm", NULL), "%d ranks over shm: see stderr", nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, shm, part), "%d ranks: a rank without a device changed the bits",
                nranks);
  ck_assert_msg(hx_same_digests("test_rdma", g_dir, nranks, shm, bal), "%d ranks: balanced, the bits differ", nranks);
}
END_TEST

/* ---- progress between calls --------------------------------------------------------------------- */

/* Rank 0 sends 4 MiB eagerly (64 KiB slots, credits back from the receiver) while rank 1 is away
 * from the library for AWAY_S (the ranks then wait for each other before destroying: rank 0 must
 * not leave while rank 1's receive is still to come); arg "1": the send must end long before rank 1 comes back (its
 * progress thread took the fragments in and returned the credits), "0" (no thread): the send can
 * only end after it; "parked": as "1", but rank 0 sends only once rank 1's thread has been idle
 * long enough to park (it must wake for the fragments).  The bytes are checked either way. */
#define AWAY_S 0.6
#define PARKED_S 1.8 /* idle before the send: threads park after about a second */
static int away_rank(hx_rank_t *r) {
  const int parked = !strcmp((const char *)r->arg, "parked"), thread = parked || !strcmp((const char *)r->arg, "1");
  const double away = parked ? PARKED_S + AWAY_S : AWAY_S;
  const size_t bytes = (size_t)4 << 20;
  unsigned char *buf = malloc(bytes);
  if (!buf) return hx_fail(r, "out of memory");
  if (r->rank == 0) {
    for (size_t i = 0; i < bytes; i++) buf[i] = (unsigned char)(i * 7 + 3);
    if (parked) nanosleep(&(struct timespec){(time_t)PARKED_S, (long)((PARKED_S - (time_t)PARKED_S) * 1e9)}, NULL);
    const double t0 = hx_now();
    hx_ok(r, flexcoll_send(buf, bytes, FLEXCOLL_UINT8, 1, r->comm, NULL), r->comm, "send");
    const double dt = hx_now() - t0;
    fprintf(stderr, "[test_rdma] progress thread %s: the 4 MiB send took %.3f s, the receiver away %.1f s\n",
            parked ? "parked" : thread ? "on" : "off", dt, away);
    if (thread && dt > AWAY_S / 2) hx_fail(r, "the send waited %.3f s for a receiver away from the library", dt);
    if (!thread && dt < AWAY_S * 0.75) hx_fail(r, "the send ended in %.3f s without the receiver's progress", dt);
  } else if (r->rank == 1) {
    nanosleep(&(struct timespec){(time_t)away, (long)((away - (time_t)away) * 1e9)}, NULL);
    memset(buf, 0, bytes);
    hx_ok(r, flexcoll_recv(buf, bytes, FLEXCOLL_UINT8, 0, r->comm, NULL), r->comm, "recv");
    for (size_t i = 0; i < bytes; i++)
      if (buf[i] != (unsigned char)(i * 7 + 3)) {
        hx_fail(r, "byte %zu: %u", i, buf[i]);
        break;
      }
  }
  free(buf);
  return 0;
}

START_TEST(test_progress_thread) {
  static const char *const modes[] = {"1", "0", "parked"};
  for (int k = 0; k < 3; k++) {
    const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_RDMA_ZCOPY_BYTES=0",
                         strcmp(modes[k], "0") ? "FLEXCOLL_RDMA_PROGRESS_THREAD=1" : "FLEXCOLL_RDMA_PROGRESS_THREAD=0", NULL};
    hx_opts_t o = {.label = "progress", .env = env, .deadline_s = 60, .exit_barrier = 1};
    ck_assert_msg(hx_run_procs(2, &o, away_rank, (void *)modes[k]), "progress thread mode %s: see stderr", modes[k]);
  }
}
END_TEST

/* Fork safety: on a kernel before 5.13 (the fake's oldkernel) the link calls ibv_fork_init once
 * per process, before its first registration (none is made unsafe); on newer ones (the default:
 * ibv_is_fork_initialized says IBV_FORK_UNNEEDED) never.  A 1 MiB message (rendezvous: the user
 * buffers registered too) checks the link. */
static int fork_rank(hx_rank_t *r) {
  const long want_inits = atoi((const char *)r->arg);
  const size_t bytes = (size_t)1 << 20;
  unsigned char *buf = malloc(bytes);
  if (!buf) return hx_fail(r, "out of memory");
  for (size_t i = 0; i < bytes; i++) buf[i] = r->rank == 0 ? (unsigned char)(i * 5 + 1) : 0;
  if (r->rank == 0) hx_ok(r, flexcoll_send(buf, bytes, FLEXCOLL_UINT8, 1, r->comm, NULL), r->comm, "send");
  else hx_ok(r, flexcoll_recv(buf, bytes, FLEXCOLL_UINT8, 0, r->comm, NULL), r->comm, "recv");
  for (size_t i = 0; r->rank == 1 && i < bytes; i++)
    if (buf[i] != (unsigned char)(i * 5 + 1)) {
      hx_fail(r, "byte %zu: %u", i, buf[i]);
      break;
    }
  free(buf);
  long inits = -1, unsafe = -1, ever, now, plain;
  void (*f)(long *, long *) = (void (*)(long *, long *))fake_fn("fake_verbs_fork_stats");
  if (f) f(&inits, &unsafe);
  fake_stats(&ever, &now, &plain);
  fprintf(stderr, "[test_rdma] fork safety (%s): rank %d: %ld ibv_fork_init, %ld of %ld registrations before it\n",
          getenv("FLEXCOLL_VERBS_FAKE_FAULT"), r->rank, inits, want_inits ? unsafe : 0, ever);
  if (inits != want_inits) hx_fail(r, "%ld calls of ibv_fork_init, expected %ld", inits, want_inits);
  if (unsafe != 0) hx_fail(r, "%ld registrations made before ibv_fork_init on an old kernel", unsafe);
  if (ever < 1) hx_fail(r, "no registration at all: the check saw nothing");
  return 0;
}

START_TEST(test_fork_safety) {
  static const char *const faults[] = {"FLEXCOLL_VERBS_FAKE_FAULT=oldkernel", "FLEXCOLL_VERBS_FAKE_FAULT="};
  const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=rdma", faults[_i], NULL};
  hx_opts_t o = {.label = faults[_i], .env = env, .deadline_s = 60};
  ck_assert_msg(hx_run_procs(2, &o, fork_rank, (void *)(_i ? "0" : "1")), "%s: see stderr", faults[_i]);
}
END_TEST

/* An idle link's progress thread parks (the CQ's completion channel and the device's async events
 * wake it): two ranks as threads, the wake-ups of their two threads in their quietest second (a
 * thread that naps a millisecond at a time makes about a thousand), and the link still works. */
START_TEST(test_thread_parks) {
  hx_apply_env(&(hx_opts_t){.env = (const char *[]){provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0",
                                                      "FLEXCOLL_LINKS=rdma", NULL}});
  ck_assert_msg(hx_threads_park("flexcoll-rdma", 100), "idle rdma progress threads: see stderr");
}
END_TEST

/* Messages that arrived whole are delivered even once the link to their sender has broken: rank 0
 * sends 4 eager messages (a quarter of its 16 slots: no credit is needed) and leaves; rank 1's
 * progress thread takes them in and returns their credit, and that first post of its process kills
 * its queue pair (FLEXCOLL_VERBS_FAKE_FAULT=kill@1:1), which breaks its link to rank 0 while no
 * call is running.  Only then does rank 1 post its receives: each must bring its bytes, not an
 * error. */
#define LEAVE_MSGS 4
static int sender_leaves_rank(hx_rank_t *r) {
  enum { BYTES = 3000 };
  unsigned char buf[BYTES];
  if (r->rank == 0) {
    for (int m = 0; m < LEAVE_MSGS; m++) {
      for (size_t i = 0; i < BYTES; i++) buf[i] = (unsigned char)(i * 5 + (size_t)m);
      if (!hx_ok(r, flexcoll_send(buf, BYTES, FLEXCOLL_UINT8, 1, r->comm, NULL), r->comm, "send")) break;
    }
    return 0; /* the harness destroys rank 0's communicator now */
  }
  nanosleep(&(struct timespec){0, 300 * 1000000L}, NULL);
  for (int m = 0; m < LEAVE_MSGS; m++) {
    memset(buf, 0, BYTES);
    snprintf(r->what, sizeof r->what, "receive %d of %d after the link broke", m, LEAVE_MSGS);
    if (!hx_ok(r, flexcoll_recv(buf, BYTES, FLEXCOLL_UINT8, 0, r->comm, NULL), r->comm, "recv")) break;
    for (size_t i = 0; i < BYTES; i++)
      if (buf[i] != (unsigned char)(i * 5 + (size_t)m)) return hx_fail(r, "message %d byte %zu: %u", m, i, buf[i]);
  }
  return 0;
}

START_TEST(test_sender_leaves) {
  const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=rdma",
                       "FLEXCOLL_VERBS_FAKE_FAULT=kill@1:1", NULL};
  hx_opts_t o = {.label = "sender leaves", .env = env, .timeout_ms = 5000, .deadline_s = 60};
  ck_assert_msg(hx_run_procs(2, &o, sender_leaves_rank, NULL), "see stderr");
}
END_TEST

/* ---- GID entries (RoCE) ------------------------------------------------------------------------ */

static union ibv_gid gid_of(const char *kind, int host) {
  union ibv_gid g;
  memset(&g, 0, sizeof g);
  if (!strcmp(kind, "ll")) g.raw[0] = 0xfe, g.raw[1] = 0x80, g.raw[15] = (uint8_t)host;
  if (!strcmp(kind, "v6")) g.raw[0] = 0xfd, g.raw[15] = (uint8_t)host;
  if (!strcmp(kind, "v4")) g.raw[10] = g.raw[11] = 0xff, g.raw[12] = 10, g.raw[15] = (uint8_t)host;
  return g; /* "empty": all zero */
}

/* fc_rdma_pick_gid on tables as mlx5 ports lay them out, and the odd ones. */
START_TEST(test_gid_pick) {
  struct {
    const char *kinds[6];
    int types[6];
    int want, expect;
  } cases[] = {
      {{"ll", "ll", "v4", "v4"}, {1, 2, 1, 2}, -1, 3},             /* the usual RoCE port: v2 IPv4-mapped */
      {{"ll", "ll", "v6", "v6", "v4", "v4"}, {1, 2, 1, 2, 1, 2}, -1, 5}, /* IPv4-mapped before IPv6 */
      {{"ll", "ll", "v6", "v6"}, {1, 2, 1, 2}, -1, 3},             /* a global IPv6 v2 before link-local */
      {{"ll", "ll"}, {1, 2}, -1, 1},                                /* link-local v2 before v1 */
      {{"ll", "ll", "v4"}, {1, 2, 1}, -1, 1},                       /* any v2 before an IPv4 v1 */
      {{"ll", "ll", "v4", "v4"}, {0, 0, 0, 0}, -1, 0},              /* types unknown: entry 0, as before */
      {{"empty", "ll", "v4"}, {0, 1, 1}, -1, 1},                    /* no v2, entry 0 empty: the first there is */
      {{"empty", "empty"}, {2, 2}, -1, -1},                         /* nothing */
      {{"ll", "ll", "v4", "v4"}, {1, 2, 1, 2}, 1, 1},               /* named */
      {{"ll", "ll", "empty", "v4"}, {1, 2, 1, 2}, 2, -1},           /* named, empty */
      {{"ll", "ll"}, {1, 2}, 7, -1},                                /* named, beyond the table */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    union ibv_gid gids[6];
    int n = 0;
    for (; n < 6 && cases[c].kinds[n]; n++) gids[n] = gid_of(cases[c].kinds[n], 1);
    ck_assert_msg(fc_rdma_pick_gid(gids, cases[c].types, n, cases[c].want) == cases[c].expect,
                  "case %zu: entry %d, expected %d", c, fc_rdma_pick_gid(gids, cases[c].types, n, cases[c].want),
                  cases[c].expect);
  }
  ck_assert_int_eq(fc_rdma_pick_gid(NULL, NULL, 0, -1), -1);
  char text[64];
  union ibv_gid g = gid_of("v4", 7);
  fc_rdma_gid_text(&g, text, sizeof text);
  ck_assert_str_eq(text, "::ffff:10.0.0.7");
  g = gid_of("ll", 7);
  fc_rdma_gid_text(&g, text, sizeof text);
  ck_assert_str_eq(text, "fe80:0:0:0:0:0:0:7");
}
END_TEST

/* The source GID index the fake saw at this process's last RTR (tests/fake_verbs.c). */
static int fake_last_sgid(void) {
  int (*f)(void) = (int (*)(void))fake_fn("fake_verbs_last_sgid_index");
  return f ? f() : -2;
}

/* The matrix over rdma, then the GID entry the queue pairs were addressed from (arg: "label,N"). */
static int gid_rank(hx_rank_t *r) {
  char label[64];
  int expect = 0;
  if (sscanf((const char *)r->arg, "%63[^,],%d", label, &expect) != 2) return hx_fail(r, "bad arg");
  r->arg = label;
  matrix_rank(r);
  const int got = fake_last_sgid();
  if (got != expect) hx_fail(r, "%s: queue pairs addressed from GID entry %d, expected %d", label, got, expect);
  return 0;
}

static int gid_run(const char *label, int ngids, int sysfs, const char *index, int expect) {
  char e1[48], e2[300], e3[48], arg[96];
  snprintf(e1, sizeof e1, "FLEXCOLL_VERBS_FAKE_GIDS=%d", ngids);
  snprintf(e2, sizeof e2, "FLEXCOLL_VERBS_FAKE_SYSFS=%s", sysfs ? g_dir : "");
  if (sysfs) strncat(e2, "/sysfs", sizeof e2 - strlen(e2) - 1);
  snprintf(e3, sizeof e3, "FLEXCOLL_IB_GID_INDEX=%s", index ? index : "");
  snprintf(arg, sizeof arg, "%s,%d", label, expect);
  const char *env[] = {provider_env(), "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_LINK_SHARES=",
                       e1, e2, e3, NULL};
  fprintf(stderr, "[test_rdma] %s: %d GID entries, types %s, FLEXCOLL_IB_GID_INDEX=%s: entry %d expected\n", label,
          ngids, sysfs ? "in sysfs" : "unknown", index ? index : "", expect);
  return run_ranks(2, 0, env, gid_rank, arg);
}

/* A RoCE port of four GID entries (v1 and v2, link-local and global): the v2 global one; the one
 * FLEXCOLL_IB_GID_INDEX names; entry 0 where the types cannot be read; the link-local v2 one of a
 * two-entry table.  Every collective checked each time. */
START_TEST(test_gid) {
  ck_assert_msg(gid_run("gid-auto", 4, 1, NULL, 3), "four GIDs: see stderr");
  ck_assert_msg(gid_run("gid-named", 4, 1, "1", 1), "FLEXCOLL_IB_GID_INDEX=1: see stderr");
  ck_assert_msg(gid_run("gid-untyped", 4, 0, NULL, 0), "four GIDs without types: see stderr");
  ck_assert_msg(gid_run("gid-two", 2, 1, NULL, 1), "two GIDs: see stderr");
}
END_TEST

/* PCI distances and root ports on sysfs-like paths (rdma_dev.c). */
START_TEST(test_pci_places) {
  const char *nic = "/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:19:00.0";
  const char *gpu_same_switch = "/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:04.0/0000:1a:00.0";
  const char *gpu_other_port = "/sys/devices/pci0000:16/0000:16:02.0/0000:20:00.0";
  const char *gpu_other_socket = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
  const char *sibling = "/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:19:00.1";
  ck_assert_int_eq(fc_pci_hops(nic, nic), 0);
  ck_assert_int_eq(fc_pci_hops(nic, sibling), 2);
  ck_assert_int_eq(fc_pci_hops(nic, gpu_same_switch), 4);
  ck_assert_int_eq(fc_pci_hops(nic, gpu_other_port), 6);
  ck_assert_int_eq(fc_pci_hops(nic, gpu_other_socket), 8);
  ck_assert_int_eq(fc_pci_hops(gpu_same_switch, nic), 4);
  ck_assert_int_eq(fc_pci_hops(nic, ""), FC_RDMA_FAR);
  ck_assert_int_eq(fc_pci_hops(NULL, nic), FC_RDMA_FAR);
  /* a component that merely starts like another is another */
  ck_assert_int_eq(fc_pci_hops("/sys/devices/pci0000:00/0000:00:01.0", "/sys/devices/pci0000:00/0000:00:01.00"), 2);
  char rp[256];
  fc_pci_root_port(nic, rp, sizeof rp);
  ck_assert_str_eq(rp, "/sys/devices/pci0000:16/0000:16:01.0");
  fc_pci_root_port(gpu_other_port, rp, sizeof rp);
  ck_assert_str_eq(rp, "/sys/devices/pci0000:16/0000:16:02.0");
  fc_pci_root_port("/sys/devices/pci0000:16", rp, sizeof rp);
  ck_assert_str_eq(rp, "");
  fc_pci_root_port("", rp, sizeof rp);
  ck_assert_str_eq(rp, "");
}
END_TEST

/* flexcoll-info on three fake devices, two near (the second under the first's root port) and one
 * far: places, NUMA nodes, speed, and which are a rank's rails here.  GPUs hidden: with one, the
 * rails are those nearest to it, and the fake devices are near none. */
START_TEST(test_info_rails) {
  int me = bind_to_my_node(), far = me + 1;
  char cmd[1200], line[512];
  snprintf(cmd, sizeof cmd,
           "FLEXCOLL_VERBS_PROVIDER=fake FLEXCOLL_VERBS_FAKE_DEVICES=3 FLEXCOLL_VERBS_FAKE_PLACES=%d,%d,%d:1 "
           "FLEXCOLL_VERBS_FAKE_SYSFS=%s/sysfs-info "
           "FLEXCOLL_IB_HCA= CUDA_VISIBLE_DEVICES= %s 2>&1",
           me, far, me, g_dir, FC_INFO_BIN);
  FILE *p = popen(cmd, "r");
  ck_assert(p != NULL);
  char want[7][160];
  snprintf(want[0], sizeof want[0], "fakeverbs0: PCI 0000:10:00.0 (root port 0000:%02x:01.0), NUMA node %d (this process's)",
           me, me);
  snprintf(want[1], sizeof want[1], "fakeverbs1: PCI 0000:11:00.0 (root port 0000:%02x:02.0), NUMA node %d,", far, far);
  snprintf(want[2], sizeof want[2], "fakeverbs2: PCI 0000:12:00.0 (root port 0000:%02x:01.0), NUMA node %d (this process's)",
           me, me);
  snprintf(want[3], sizeof want[3], "port 1: active, RoCE, MTU 4096, 100 Gb/s (rail 0 of a rank on this NUMA node here)");
  snprintf(want[4], sizeof want[4], "port 1: active, RoCE, MTU 4096, 100 Gb/s (rail 1 of a rank on this NUMA node here)");
  snprintf(want[5], sizeof want[5], "RDMA devices (");
  /* Whether device buffers would reach the NIC: with the GPUs hidden, "no GPU here" (or "not in
   * this build" without CUDA). */
  snprintf(want[6], sizeof want[6], "GPUDirect RDMA: %s", HAVE_CUDA ? "no GPU here" : "not in this build");
  int seen[7] = {0}, dev = -1, rails_of[3] = {-1, -1, -1};
  while (fgets(line, sizeof line, p)) {
    for (int i = 0; i < 7; i++)
      if (strstr(line, want[i])) seen[i] = 1;
    if (strstr(line, "  fakeverbs")) dev = atoi(strstr(line, "fakeverbs") + 9);
    if (dev >= 0 && dev < 3 && strstr(line, "(rail 0 ")) rails_of[dev] = 0;
    if (dev >= 0 && dev < 3 && strstr(line, "(rail 1 ")) rails_of[dev] = 1;
  }
  pclose(p);
  for (int i = 0; i < 7; i++) ck_assert_msg(seen[i], "flexcoll-info did not print \"%s\"", want[i]);
  ck_assert_msg(rails_of[0] == 0 && rails_of[1] == -1 && rails_of[2] == 1, "rails of the devices: %d %d %d", rails_of[0],
                rails_of[1], rails_of[2]);
}
END_TEST

/* ---- the registration cache --------------------------------------------------------------------- */

#define RC_BYTES (1 << 20) /* a rendezvous message (above the threshold), one slice, whole pages */

/* 1 MiB of anonymous pages; at `at` exactly when given (MAP_FIXED: the same address again). */
static unsigned char *rc_map(void *at) {
  void *p = mmap(at, RC_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED : 0), -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void rc_fill(unsigned char *b, uint64_t salt) {
  for (size_t i = 0; i < RC_BYTES; i++) b[i] = (unsigned char)((i * 131 + salt * 7919 + (i >> 12)) & 0xff);
}

/* Bytes of b that are not rc_fill(salt)'s. */
static size_t rc_wrong(const unsigned char *b, uint64_t salt) {
  size_t bad = 0;
  for (size_t i = 0; i < RC_BYTES; i++) bad += b[i] != (unsigned char)((i * 131 + salt * 7919 + (i >> 12)) & 0xff);
  return bad;
}

/* One message of RC_BYTES from rank 0 (from s) to rank 1 (into d), on comm. */
static int rc_message(hx_rank_t *r, flexcoll_comm_t comm, unsigned char *s, unsigned char *d) {
  flexcoll_result_t res = r->rank == 0 ? flexcoll_send(s, RC_BYTES, FLEXCOLL_UINT8, 1, comm, NULL)
                                       : flexcoll_recv(d, RC_BYTES, FLEXCOLL_UINT8, 0, comm, NULL);
  return hx_ok(r, res, comm, r->rank == 0 ? "send" : "recv");
}

/* Rank 1 receives into its buffers A B A C B (rank 0 sends from one buffer), every message with
 * other bytes, each checked whole.  arg "regs0,regs1,kept0,kept1": the user-buffer registrations
 * each rank must have made (the fake counts ibv_reg_mr), and the ones still registered before the
 * communicator goes (the cache's entries); none may be left after.  With room for two 1 MiB
 * entries, least-recently-used eviction misses 4 times on that sequence (first-in-first-out would
 * miss 3), with room for all 3, and with none, 5. */
static int rc_lru_rank(hx_rank_t *r) {
  int want_regs[2], want_kept[2];
  if (sscanf((const char *)r->arg, "%d,%d,%d,%d", &want_regs[0], &want_regs[1], &want_kept[0], &want_kept[1]) != 4)
    return hx_fail(r, "bad arg");
  long ever0, now0, ever1, now1, ever2, now2;
  fake_mrs(&ever0, &now0);
  flexcoll_comm_t sub = NULL;
  if (!hx_ok(r, flexcoll_comm_split(r->comm, 0, r->rank, &sub, NULL), r->comm, "split")) return 1;
  unsigned char *s = rc_map(NULL), *buf[3] = {rc_map(NULL), rc_map(NULL), rc_map(NULL)};
  if (!s || !buf[0] || !buf[1] || !buf[2]) return hx_fail(r, "mmap: %s", strerror(errno));
  static const int order[] = {0, 1, 0, 2, 1};
  for (uint64_t k = 0; k < sizeof order / sizeof order[0]; k++) {
    unsigned char *d = buf[order[k]];
    snprintf(r->what, sizeof r->what, "message %llu into buffer %c", (unsigned long long)k, 'A' + order[k]);
    if (r->rank == 0) rc_fill(s, k + 1);
    else memset(d, 0, RC_BYTES);
    if (!rc_message(r, sub, s, d)) break;
    size_t bad = r->rank == 1 ? rc_wrong(d, k + 1) : 0;
    if (bad) hx_fail(r, "%s: %zu bytes wrong", r->what, bad);
  }
  fake_mrs(&ever1, &now1);
  hx_ok(r, flexcoll_comm_destroy(sub), NULL, "destroy");
  fake_mrs(&ever2, &now2);
  /* The split communicator's own two registrations (its ring and send area) aside. */
  long regs = ever1 - ever0 - 2, kept = now1 - now0 - 2;
  fprintf(stderr, "[test_rdma] rcache %s rank %d: %ld registrations of user buffers, %ld kept, %ld left after destroy\n",
          getenv("FLEXCOLL_RDMA_RCACHE_BYTES"), r->rank, regs, kept, now2 - now0);
  if (regs != want_regs[r->rank]) hx_fail(r, "%ld registrations of user buffers, expected %d", regs, want_regs[r->rank]);
  if (kept != want_kept[r->rank]) hx_fail(r, "%ld registrations kept, expected %d", kept, want_kept[r->rank]);
  if (now2 != now0) hx_fail(r, "%ld memory regions left registered after destroy", now2 - now0);
  munmap(s, RC_BYTES);
  for (int i = 0; i < 3; i++) munmap(buf[i], RC_BYTES);
  return 0;
}

/* One case of a registration-cache test: extra settings and the rank function's argument. */
typedef struct {
  const char *env[3], *arg;
} rc_case_t;

/* Runs case c with fn on 2 processes over the fake rdma link; false when a rank failed. */
static int rc_run(const char *what, const rc_case_t *c, hx_rank_fn fn) {
  const char *env[8] = {"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_UCX_PEER_FAILURE=0", "FLEXCOLL_LINKS=rdma",
                        "FLEXCOLL_SLICE_SIZE=4M"};
  int n = 4;
  for (int i = 0; c->env[i] && n < 7; i++) env[n++] = c->env[i];
  env[n] = NULL;
  char label[160];
  snprintf(label, sizeof label, "rcache %s %s %s", what, c->env[0], c->env[1] ? c->env[1] : "");
  hx_opts_t o = {.label = label, .env = env, .deadline_s = 120};
  fprintf(stderr, "[test_rdma] %s\n", label);
  return hx_run_procs(2, &o, fn, (void *)c->arg);
}

START_TEST(test_rcache_lru) {
  static const rc_case_t cases[] = {
      /* the default bound holds all: each buffer registered once, all kept */
      {{"FLEXCOLL_VERBS_FAKE_FAULT=", NULL}, "1,3,1,3"},
      /* room for two entries: LRU evicts */
      {{"FLEXCOLL_RDMA_RCACHE_BYTES=2M", NULL}, "1,4,1,2"},
      /* no cache: a registration per message and side, none kept */
      {{"FLEXCOLL_RDMA_RCACHE_BYTES=0", NULL}, "5,5,0,0"},
      /* a device without on-demand paging: pinned registrations are not kept... */
      {{"FLEXCOLL_VERBS_FAKE_FAULT=noodp", NULL}, "5,5,0,0"},
      /* ...unless the application promises never to unmap its buffers */
      {{"FLEXCOLL_VERBS_FAKE_FAULT=noodp", "FLEXCOLL_RDMA_RCACHE_PINNED=1", NULL}, "1,3,1,3"},
  };
  ck_assert_msg(rc_run("lru", &cases[_i], rc_lru_rank), "rcache lru case %d: see stderr", _i);
}
END_TEST

/* The classic hazard: both ranks unmap their buffer after a message and map new pages at the
 * same address, the sender with new bytes.  arg "regs,stale": the registrations each rank must
 * make, and whether the second message must arrive wrong (the unsafe mode, where the fake's
 * pinned model shows what a NIC does with a stale registration: this test sees it). */
static int rc_remap_rank(hx_rank_t *r) {
  int want_regs, stale;
  if (sscanf((const char *)r->arg, "%d,%d", &want_regs, &stale) != 2) return hx_fail(r, "bad arg");
  long ever0, now0, ever1, now1;
  fake_mrs(&ever0, &now0);
  flexcoll_comm_t sub = NULL;
  if (!hx_ok(r, flexcoll_comm_split(r->comm, 0, r->rank, &sub, NULL), r->comm, "split")) return 1;
  unsigned char *b = rc_map(NULL);
  if (!b) return hx_fail(r, "mmap: %s", strerror(errno));
  size_t wrong[2] = {0, 0};
  for (uint64_t k = 0; k < 2; k++) {
    if (k && (munmap(b, RC_BYTES) || rc_map(b) != b)) return hx_fail(r, "no new pages at %p: %s", (void *)b, strerror(errno));
    if (r->rank == 0) rc_fill(b, k + 11);
    snprintf(r->what, sizeof r->what, "message %llu (%s pages)", (unsigned long long)k, k ? "new" : "first");
    if (!rc_message(r, sub, b, b)) break;
    wrong[k] = r->rank == 1 ? rc_wrong(b, k + 11) : 0;
  }
  hx_ok(r, flexcoll_comm_destroy(sub), NULL, "destroy");
  fake_mrs(&ever1, &now1);
  long regs = ever1 - ever0 - 2;
  fprintf(stderr, "[test_rdma] remap %s rank %d: %ld registrations, %zu and %zu bytes wrong\n",
          getenv("FLEXCOLL_VERBS_FAKE_FAULT"), r->rank, regs, wrong[0], wrong[1]);
  if (regs != want_regs) hx_fail(r, "%ld registrations of user buffers, expected %d", regs, want_regs);
  if (wrong[0]) hx_fail(r, "the first message: %zu bytes wrong", wrong[0]);
  if (r->rank == 1 && !stale && wrong[1]) hx_fail(r, "the message into new pages: %zu bytes wrong", wrong[1]);
  if (r->rank == 1 && stale && !wrong[1])
    hx_fail(r, "a stale pinned registration delivered right: the fake's pinned model is not in force");
  if (now1 != now0) hx_fail(r, "%ld memory regions left registered after destroy", now1 - now0);
  munmap(b, RC_BYTES);
  return 0;
}

START_TEST(test_rcache_remap) {
  static const rc_case_t cases[] = {
      /* on-demand paging: the cached registration follows the new pages (one registration) */
      {{"FLEXCOLL_VERBS_FAKE_FAULT=pinned", NULL}, "1,0"},
      /* pinned registrations: not cached, so each message registers the pages it has */
      {{"FLEXCOLL_VERBS_FAKE_FAULT=pinned,noodp", NULL}, "2,0"},
      /* the promise broken: a kept pinned registration reads and writes the old pages */
      {{"FLEXCOLL_VERBS_FAKE_FAULT=pinned,noodp", "FLEXCOLL_RDMA_RCACHE_PINNED=1", NULL}, "1,1"},
  };
  ck_assert_msg(rc_run("remap", &cases[_i], rc_remap_rank), "rcache remap case %d: see stderr", _i);
}
END_TEST

/* ---- faults ------------------------------------------------------------------------------------ */

/* Allreduces until one fails; every one that succeeds must be right.  The fault must end the
 * run in an error: all calls succeeding is a failure (unless the case expects success). */
static int fault_calls(hx_rank_t *r, flexcoll_comm_t comm, int expect_ok) {
  size_t count = 100003;
  for (uint64_t call = 0; call < 40; call++) {
    pcall_t p = {.coll = call % 2 ? C_ALLGATHER : C_ALLREDUCE, .dtype = FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM,
                 .count = count, .rank = r->rank, .nranks = r->nranks};
    if (pcall_prepare(r, &p, r->seed, call) != 0) return 1;
    pcall_describe(r->what, sizeof r->what, &p);
    flexcoll_result_t res = pcall_issue(&p, comm);
    if (res != FLEXCOLL_SUCCESS) {
      pcall_free(&p);
      if (expect_ok) return hx_fail(r, "call %llu failed: %d %s", (unsigned long long)call, res, flexcoll_get_last_error(comm));
      if (res != FLEXCOLL_REMOTE_ERROR && res != FLEXCOLL_TIMEOUT && res != FLEXCOLL_SYSTEM_ERROR)
        return hx_fail(r, "call %llu returned %d (%s), not an error of the link", (unsigned long long)call, res,
                       flexcoll_get_last_error(comm));
      fprintf(stderr, "[test_rdma] rank %d: call %llu ended in %s: %s\n", r->rank, (unsigned long long)call,
              flexcoll_get_error_string(res), flexcoll_get_last_error(comm));
      return 0;
    }
    pcall_check(r, &p);
  }
  if (!expect_ok) return hx_fail(r, "every call succeeded despite FLEXCOLL_VERBS_FAKE_FAULT=%s", getenv("FLEXCOLL_VERBS_FAKE_FAULT"));
  return 0;
}

/* The calls on a communicator split off for them (opening a link posts no send, so the fault's
 * count lands in the calls), then destroyed: whatever the fault broke, every descriptor, fake
 * device segment and registration it held is given back. */
static int fault_rank(hx_rank_t *r) {
  char mine[64];
  snprintf(mine, sizeof mine, "fcfv-%d-", (int)getpid());
  long ever, now0, now1;
  fake_mrs(&ever, &now0);
  const int fds0 = hx_count_entries("/proc/self/fd", ""), shm0 = hx_count_entries("/dev/shm", mine);
  flexcoll_comm_t sub = NULL;
  if (!hx_ok(r, flexcoll_comm_split(r->comm, 0, r->rank, &sub, NULL), r->comm, "split")) return 1;
  const int rc = fault_calls(r, sub, *(const int *)r->arg);
  hx_ok(r, flexcoll_comm_destroy(sub), NULL, "destroy after the fault");
  /* A descriptor of the split's bootstrap may close a moment after destroy returns; one of the
   * parent communicator's (its bootstrap root's, on rank 0) may close meanwhile: fewer is no leak. */
  int fds1 = 0, shm1 = 0;
  for (int k = 0; k < 100; k++) {
    fake_mrs(&ever, &now1);
    fds1 = hx_count_entries("/proc/self/fd", ""), shm1 = hx_count_entries("/dev/shm", mine);
    if (fds1 <= fds0 && shm1 <= shm0 && now1 <= now0) break;
    nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
  }
  if (fds1 > fds0) hx_fail(r, "%d open descriptors before the faulty communicator, %d after its destroy", fds0, fds1);
  if (shm1 > shm0) hx_fail(r, "%d fake device segments before the faulty communicator, %d after", shm0, shm1);
  if (now1 > now0) hx_fail(r, "%ld memory regions registered before the faulty communicator, %ld after", now0, now1);
  return rc;
}

static const struct {
  const char *fault;
  int ok; /* the calls must all succeed (a delay within the timeout) */
} faults[] = {
    {"post:30", 0}, {"post:1", 0}, {"drop:45", 0}, {"kill:25", 0}, {"portdown:20", 0}, {"delay:4000", 0}, {"delay:3", 1},
};

START_TEST(test_fault) {
  char f[96];
  snprintf(f, sizeof f, "FLEXCOLL_VERBS_FAKE_FAULT=%s", faults[_i].fault);
  const char *env[] = {"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", f, NULL};
  int ok = faults[_i].ok;
  /* A short timeout: a dropped completion or a long delay is only ever found by it. */
  hx_opts_t o = {.label = faults[_i].fault, .env = env, .timeout_ms = 2000, .deadline_s = 60, .expect_fail = 0};
  double t0 = hx_now();
  ck_assert_msg(hx_run_procs(3, &o, fault_rank, &ok), "fault %s: see stderr", faults[_i].fault);
  fprintf(stderr, "[test_rdma] fault %s: every rank done in %.1f s\n", faults[_i].fault, hx_now() - t0);
}
END_TEST

/* ---- ranks that disagree on the count ------------------------------------------------------------- */

static const struct {
  int coll;
  size_t count[2];
  int must_fail[2];
} mismatches[] = {
    {C_ALLREDUCE, {4, 8}, {1, 1}},
    {C_ALLREDUCE, {100003, 100000}, {1, 1}}, /* several fragments; the larger one cut short */
    {C_BROADCAST, {4, 8}, {0, 1}},           /* rank 1 expects 8 elements from root 0, which sends 4 */
    {C_BROADCAST, {300000, 299999}, {0, 1}}, /* more than rank 1 has room for: nothing past its buffer */
    {C_ALLGATHER, {4, 8}, {1, 1}},
};

/* A rank that receives another length than it expects never reports success, never writes past
 * its buffer, and ends within the timeout. */
static int mismatch_rank(hx_rank_t *r) {
  int i = *(const int *)r->arg;
  pcall_t p = {.coll = mismatches[i].coll, .dtype = FLEXCOLL_INT32, .op = FLEXCOLL_SUM, .count = mismatches[i].count[r->rank],
               .root = 0, .rank = r->rank, .nranks = r->nranks};
  if (pcall_prepare(r, &p, r->seed, 0) != 0) return 1;
  pcall_describe(r->what, sizeof r->what, &p);
  double t0 = hx_now();
  flexcoll_result_t res = pcall_issue(&p, r->comm);
  double took = hx_now() - t0;
  fprintf(stderr, "[test_rdma] %s, rank %d: %s in %.0f ms (%s)\n", r->what, r->rank, flexcoll_get_error_string(res),
          took * 1e3, res ? flexcoll_get_last_error(r->comm) : "");
  if (mismatches[i].must_fail[r->rank] && res == FLEXCOLL_SUCCESS) hx_fail(r, "succeeded with mismatched counts");
  if (res != FLEXCOLL_SUCCESS && res != FLEXCOLL_INVALID_USAGE && res != FLEXCOLL_TIMEOUT && res != FLEXCOLL_REMOTE_ERROR)
    hx_fail(r, "returned %d (%s)", res, flexcoll_get_error_string(res));
  if (took > 4.5) hx_fail(r, "took %.1f s (timeout 1.5 s)", took);
  if (p.recv) hx_buf_check_guards(r, "recv", &p.rb);
  pcall_free(&p);
  return 0;
}

START_TEST(test_count_mismatch) {
  const char *env[] = {"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", NULL};
  int i = _i;
  hx_opts_t o = {.label = "count mismatch", .env = env, .timeout_ms = 1500, .deadline_s = 60};
  ck_assert_msg(hx_run_procs(2, &o, mismatch_rank, &i), "%s counts %zu/%zu: see stderr", coll_names[mismatches[i].coll],
                mismatches[i].count[0], mismatches[i].count[1]);
}
END_TEST

/* ---- a rank killed ------------------------------------------------------------------------------- */

#define KILL_RANKS 3
#define KILL_TIMEOUT_MS 3000
typedef struct {
  int victim_pid;
  int res[KILL_RANKS];
  double took_ms[KILL_RANKS];
} kill_report_t;
static kill_report_t *g_kill;

static void *killer(void *arg) {
  usleep((useconds_t)(intptr_t)arg * 1000);
  raise(SIGKILL);
  return NULL;
}

/* Rank 1 dies (between collectives, or from a thread while a large allreduce moves data); the
 * others' next allreduce must fail with REMOTE_ERROR or TIMEOUT within the timeout. */
static int kill_rank(hx_rank_t *r) {
  int mid = *(const int *)r->arg;
  size_t count = 1 << 20;
  float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b);
  if (!a || !b) return hx_fail(r, "out of memory");
  for (size_t i = 0; i < count; i++) a[i] = (float)(i % 17);
  for (int k = 0; k < 3; k++) {
    snprintf(r->what, sizeof r->what, "good allreduce %d", k);
    if (!hx_ok(r, flexcoll_allreduce(a, b, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r->comm, NULL), r->comm, "allreduce")) return 1;
  }
  if (r->rank == 1) {
    g_kill->victim_pid = (int)getpid();
    if (!mid) {
      usleep(200 * 1000);
      raise(SIGKILL);
    }
    pthread_t t;
    pthread_create(&t, NULL, killer, (void *)(intptr_t)200);
    for (;;) flexcoll_allreduce(a, b, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r->comm, NULL);
  }
  flexcoll_result_t res;
  double t0;
  int calls = 0;
  do {
    t0 = hx_now();
    res = flexcoll_allreduce(a, b, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r->comm, NULL);
    calls++;
  } while (mid && res == FLEXCOLL_SUCCESS && calls < 10000);
  g_kill->res[r->rank] = res;
  g_kill->took_ms[r->rank] = (hx_now() - t0) * 1e3;
  fprintf(stderr, "[test_rdma] rank %d: allreduce #%d after the kill: %s in %.0f ms (%s)\n", r->rank, calls,
          flexcoll_get_error_string(res), g_kill->took_ms[r->rank], flexcoll_get_last_error(r->comm));
  free(a);
  free(b);
  return 0;
}

START_TEST(test_rank_killed) {
  int mid = _i;
  g_kill = mmap(NULL, sizeof *g_kill, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(g_kill, MAP_FAILED);
  memset(g_kill, 0, sizeof *g_kill);
  for (int q = 0; q < KILL_RANKS; q++) g_kill->res[q] = -1;
  const char *env[] = {"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", NULL};
  hx_opts_t o = {.label = mid ? "killed mid-transfer" : "killed", .env = env, .timeout_ms = KILL_TIMEOUT_MS,
                 .deadline_s = 60, .expect_fail = 1};
  double t0 = hx_now();
  /* The victim never exits 0: the run "fails"; what counts is how the others ended. */
  (void)hx_run_procs(KILL_RANKS, &o, kill_rank, &mid);
  double took = hx_now() - t0;
  for (int q = 0; q < KILL_RANKS; q++) {
    if (q == 1) continue;
    ck_assert_msg(g_kill->res[q] == FLEXCOLL_REMOTE_ERROR || g_kill->res[q] == FLEXCOLL_TIMEOUT,
                  "rank %d: the allreduce after the kill returned %d (-1: never returned)", q, g_kill->res[q]);
    ck_assert_msg(g_kill->took_ms[q] < 3.0 * KILL_TIMEOUT_MS, "rank %d: the failed allreduce took %.0f ms", q,
                  g_kill->took_ms[q]);
  }
  ck_assert_msg(took < 45, "the ranks took %.1f s", took);
  /* A SIGKILLed process cannot unlink its segments: the fake's next device open does (as a
   * driver reclaims a dead process's resources). */
  if (g_kill->victim_pid > 0) {
    char why[300], mine[64];
    setenv("FLEXCOLL_VERBS_PROVIDER", "fake", 1);
    const fc_verbs_t *v = fc_verbs_load(why, sizeof why);
    ck_assert_msg(v != NULL, "%s", why);
    int n = 0;
    struct ibv_device **list = v->get_device_list(&n);
    ck_assert_msg(list && n == 1, "the fake lists no device");
    struct ibv_context *ctx = v->open_device(list[0]);
    ck_assert_ptr_nonnull(ctx);
    snprintf(mine, sizeof mine, "fcfv-%d-", g_kill->victim_pid);
    ck_assert_msg(hx_count_entries("/dev/shm", mine) == 0, "the killed rank's segments are still there after a device open");
    v->close_device(ctx);
    v->free_device_list(list);
  }
  munmap(g_kill, sizeof *g_kill);
}
END_TEST

/* ---- no device, bad settings --------------------------------------------------------------------- */

typedef struct {
  const char *env[4];
  flexcoll_result_t code;
  const char *needle; /* in the last error; NULL: creation succeeds, with one link */
  int want_rdma;      /* that link is rdma (else another) */
} nodev_t;

static int nodev_proc(void *arg) {
  const nodev_t *b = arg;
  flexcoll_comm_t comms[2];
  flexcoll_result_t res = flexcoll_comm_init_all(comms, 2, NULL);
  const char *msg = flexcoll_get_last_error(NULL);
  if (res != b->code || (b->needle && !strstr(msg, b->needle))) {
    fprintf(stderr, "[test_rdma] %s: init returned %d \"%s\", expected %d naming \"%s\"\n", b->env[0], res, msg, b->code,
            b->needle ? b->needle : "");
    return 1;
  }
  if (res != FLEXCOLL_SUCCESS) return 0;
  flexcoll_link_stats_t st[8];
  int n = 0, bad = 0;
  if (flexcoll_comm_get_link_stats(comms[0], st, 8, &n) != FLEXCOLL_SUCCESS) bad = 1;
  for (int i = 0; i < n && i < 8; i++)
    if ((strcmp(st[i].name, "rdma") == 0) != b->want_rdma) bad = 1;
  if (bad || n != 1)
    fprintf(stderr, "[test_rdma] %s %s: %d links, %s\n", b->env[0], b->env[2] ? b->env[2] : "", n,
            b->want_rdma ? "expected the rdma link alone" : "an rdma link where there is no device");
  if (!hx_destroy_concurrently(comms, 2)) bad = 1;
  return bad || n != 1;
}

START_TEST(test_no_device) {
  static const nodev_t cases[] = {
      /* No device: the link is absent (one INFO line), the others work as before. */
      {{"FLEXCOLL_VERBS_FAKE_FAULT=nodev", "FLEXCOLL_LINKS=shm,rdma", "FLEXCOLL_VERBS_PROVIDER=fake", NULL}, FLEXCOLL_SUCCESS, NULL, 0},
      /* rdma alone without a device: creation fails and says why. */
      {{"FLEXCOLL_VERBS_FAKE_FAULT=nodev", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_VERBS_PROVIDER=fake", NULL}, FLEXCOLL_SYSTEM_ERROR,
       "no RDMA device", 0},
      {{"FLEXCOLL_VERBS_PROVIDER=/nonexistent/libibverbs.so", "FLEXCOLL_LINKS=rdma", NULL, NULL}, FLEXCOLL_SYSTEM_ERROR,
       "cannot load /nonexistent/libibverbs.so", 0},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_VERBS_FAKE_LIB=", NULL}, FLEXCOLL_SYSTEM_ERROR,
       "FLEXCOLL_VERBS_FAKE_LIB", 0},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_IB_HCA=mlx5_7", NULL}, FLEXCOLL_SYSTEM_ERROR,
       "FLEXCOLL_IB_HCA", 0},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_VERBS_FAKE_FAULT=bogus:1", NULL}, FLEXCOLL_SYSTEM_ERROR,
       "no RDMA device", 0},
      /* FLEXCOLL_IB_HCA naming the device, with and without its port; a port it does not have. */
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_IB_HCA=fakeverbs0", NULL}, FLEXCOLL_SUCCESS, NULL, 1},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_IB_HCA=fakeverbs0:1", NULL}, FLEXCOLL_SUCCESS, NULL, 1},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_IB_HCA=fakeverbs0:2", NULL}, FLEXCOLL_SYSTEM_ERROR,
       "FLEXCOLL_IB_HCA", 0},
      /* The fake told to present more devices than it can: it presents none. */
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_VERBS_FAKE_DEVICES=9", NULL}, FLEXCOLL_SYSTEM_ERROR,
       "no RDMA device", 0},
      /* Settings of the registration cache that are not numbers in range: refused, named. */
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=shm,rdma", "FLEXCOLL_RDMA_RCACHE_BYTES=-1", NULL},
       FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RDMA_RCACHE_BYTES", 0},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=shm,rdma", "FLEXCOLL_RDMA_RCACHE_BYTES=lots", NULL},
       FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RDMA_RCACHE_BYTES", 0},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=shm,rdma", "FLEXCOLL_RDMA_RCACHE_PINNED=2", NULL},
       FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RDMA_RCACHE_PINNED", 0},
      /* A GID entry the port does not have (the fake's table has one): the link fails and says
       * why; settings that are not entries at all are refused. */
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", "FLEXCOLL_IB_GID_INDEX=3", NULL}, FLEXCOLL_SYSTEM_ERROR,
       "FLEXCOLL_IB_GID_INDEX=3", 0},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=shm,rdma", "FLEXCOLL_IB_GID_INDEX=-2", NULL},
       FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_IB_GID_INDEX", 0},
      {{"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=shm,rdma", "FLEXCOLL_IB_GID_INDEX=v2", NULL},
       FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_IB_GID_INDEX", 0},
  };
  const nodev_t *b = &cases[_i];
  const char *env[] = {b->env[0], b->env[1], b->env[2], "CUDA_VISIBLE_DEVICES=", NULL};
  if (!b->env[2]) env[2] = "CUDA_VISIBLE_DEVICES=";
  hx_opts_t o = {.label = b->env[0], .env = env};
  ck_assert_msg(hx_run_process(&o, nodev_proc, (void *)b), "%s %s: see stderr", b->env[0], b->env[1]);
}
END_TEST

/* ---- leaks --------------------------------------------------------------------------------------- */


/* A communicator split off, used over rdma and destroyed: no descriptor and no segment more. */
static int leak_rank(hx_rank_t *r) {
  char mine[64];
  snprintf(mine, sizeof mine, "fcfv-%d-", (int)getpid());
  int fds0 = hx_count_entries("/proc/self/fd", ""), shm0 = hx_count_entries("/dev/shm", mine);
  for (int round = 0; round < 3; round++) {
    flexcoll_comm_t sub = NULL;
    if (!hx_ok(r, flexcoll_comm_split(r->comm, 0, r->rank, &sub, NULL), r->comm, "split")) return 1;
    /* Its device's inbox, and its completion channel's FIFO (the progress thread parks on it). */
    const int held = hx_count_entries("/dev/shm", mine) - shm0;
    if (held != 2) hx_fail(r, "the split communicator holds %d entries of the fake in /dev/shm, not 2", held);
    float a[1000], b[1000];
    for (int i = 0; i < 1000; i++) a[i] = (float)(i + r->rank);
    hx_ok(r, flexcoll_allreduce(a, b, 1000, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, sub, NULL), sub, "allreduce");
    float want = 0;
    for (int q = 0; q < r->nranks; q++) want += (float)(7 + q);
    if (b[7] != want) hx_fail(r, "allreduce on the split communicator: %g, want %g", b[7], want);
    hx_ok(r, flexcoll_comm_destroy(sub), NULL, "destroy");
  }
  int fds1 = hx_count_entries("/proc/self/fd", ""), shm1 = hx_count_entries("/dev/shm", mine);
  if (fds1 != fds0) hx_fail(r, "%d open descriptors before three split communicators, %d after", fds0, fds1);
  if (shm1 != shm0) hx_fail(r, "%d fake device segments before three split communicators, %d after", shm0, shm1);
  return 0;
}

START_TEST(test_no_leaks) {
  const char *env[] = {"FLEXCOLL_VERBS_PROVIDER=fake", "FLEXCOLL_LINKS=rdma", NULL};
  hx_opts_t o = {.label = "leaks", .env = env, .exit_barrier = 1};
  ck_assert_msg(hx_run_procs(3, &o, leak_rank, NULL), "leaks: see stderr");
}
END_TEST

/* ---- the fake itself: what it claims to model ------------------------------------------------ */

typedef struct {
  const fc_verbs_t *v;
  struct ibv_context *ctx[2];
  struct ibv_pd *pd[2];
  struct ibv_cq *cq[2];
  struct ibv_mr *mr[2];
  char buf[2][4096];
} fm_t;

/* Poll every CQ of m (each poll also runs that context's "NIC") until `want` completions of cq
 * `which` arrived or 2 s passed; returns how many, into wc. */
static int fm_poll(fm_t *m, struct ibv_cq *extra, int which, struct ibv_wc *wc, int want) {
  int got = 0;
  struct ibv_cq *cqs[3] = {m->cq[0], m->cq[1], extra};
  struct ibv_cq *target = which < 2 ? m->cq[which] : extra;
  for (double t0 = hx_now(); got < want && hx_now() - t0 < 2;) {
    for (int i = 0; i < 3; i++) {
      if (!cqs[i]) continue;
      if (cqs[i] == target) {
        int n = ibv_poll_cq(cqs[i], want - got, wc + got);
        ck_assert_int_ge(n, 0);
        got += n;
      } else {
        struct ibv_wc none[1];
        /* Other CQs are only driven here: nothing must complete on them. */
        ck_assert_int_eq(ibv_poll_cq(cqs[i], 0, none), 0);
      }
    }
  }
  return got;
}

static struct ibv_qp *fm_qp(fm_t *m, int side, struct ibv_cq *cq, int sends, int recvs) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ia.recv_cq = cq ? cq : m->cq[side];
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = (uint32_t)sends;
  ia.cap.max_recv_wr = (uint32_t)recvs;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  struct ibv_qp *qp = m->v->create_qp(m->pd[side], &ia);
  ck_assert_ptr_nonnull(qp);
  return qp;
}

static int fm_init(fm_t *m, struct ibv_qp *qp) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  return m->v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* INIT -> RTR -> RTS toward `to` (of context `side`); rnr_retry as given. */
static void fm_connect(fm_t *m, struct ibv_qp *qp, struct ibv_qp *to, int side, int rnr_retry) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = to->qp_num;
  a.min_rnr_timer = 1;
  a.max_dest_rd_atomic = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  ck_assert_int_eq(m->v->query_gid(m->ctx[side], 1, 0, &a.ah_attr.grh.dgid), 0);
  ck_assert_int_eq(m->v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
                   0);
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = (uint8_t)rnr_retry;
  a.max_rd_atomic = 1;
  ck_assert_int_eq(m->v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
                   0);
}

/* A used queue pair back through RESET and INIT, then connected again toward `to`. */
static void fm_reconnect(fm_t *m, struct ibv_qp *qp, struct ibv_qp *to, int side, int rnr_retry) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RESET;
  ck_assert_int_eq(m->v->modify_qp(qp, &a, IBV_QP_STATE), 0);
  ck_assert_int_eq(fm_init(m, qp), 0);
  fm_connect(m, qp, to, side, rnr_retry);
}

/* A write of `len` bytes from side 0's buffer to side 1's at offset off; imm < 0: none. */
static int fm_write(fm_t *m, struct ibv_qp *qp, uint64_t id, size_t off, uint32_t len, long imm, uint32_t lkey,
                    uint32_t rkey) {
  struct ibv_sge sge = {.addr = (uintptr_t)m->buf[0] + off, .length = len, .lkey = lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = imm >= 0 ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl((uint32_t)(imm >= 0 ? imm : 0));
  wr.wr.rdma.remote_addr = (uintptr_t)m->buf[1] + off;
  wr.wr.rdma.rkey = rkey;
  return ibv_post_send(qp, &wr, &bad);
}

static int fm_recv(struct ibv_qp *qp, uint64_t id) {
  struct ibv_recv_wr wr = {.wr_id = id, .sg_list = NULL, .num_sge = 0}, *bad = NULL;
  return ibv_post_recv(qp, &wr, &bad);
}

/* The fake's table, without faults. */
static void fm_load(fm_t *m) {
  char why[300] = "";
  setenv("FLEXCOLL_VERBS_PROVIDER", "fake", 1);
  unsetenv("FLEXCOLL_VERBS_FAKE_FAULT");
  memset(m, 0, sizeof *m);
  m->v = fc_verbs_load(why, sizeof why);
  ck_assert_msg(m->v != NULL, "the fake does not load: %s", why);
}

START_TEST(test_fake_model) {
  char mine[64];
  fm_t m;
  fm_load(&m);
  int n = 0;
  struct ibv_device **list = m.v->get_device_list(&n);
  ck_assert_msg(list && n == 1, "the fake lists %d devices", n);
  for (int s = 0; s < 2; s++) {
    ck_assert_ptr_nonnull(m.ctx[s] = m.v->open_device(list[0]));
    ck_assert_ptr_nonnull(m.pd[s] = m.v->alloc_pd(m.ctx[s]));
    ck_assert_ptr_nonnull(m.cq[s] = m.v->create_cq(m.ctx[s], 64, NULL, NULL, 0));
    ck_assert_ptr_nonnull(m.mr[s] = m.v->reg_mr(m.pd[s], m.buf[s], sizeof m.buf[s], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  }
  m.v->free_device_list(list);
  snprintf(mine, sizeof mine, "fcfv-%d-", (int)getpid());
  ck_assert_int_eq(hx_count_entries("/dev/shm", mine), 2);
  /* Remote write without local write: refused, as by every provider. */
  ck_assert_ptr_null(m.v->reg_mr(m.pd[0], m.buf[0], 64, IBV_ACCESS_REMOTE_WRITE));
  struct ibv_qp *a = fm_qp(&m, 0, NULL, 4, 2), *b = fm_qp(&m, 1, NULL, 4, 2);
  /* The state machine: no skipping INIT, INIT needs its attributes, no posting before. */
  struct ibv_qp_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.qp_state = IBV_QPS_RTR;
  ck_assert_int_eq(m.v->modify_qp(a, &attr, IBV_QP_STATE), EINVAL);
  attr.qp_state = IBV_QPS_INIT;
  ck_assert_int_eq(m.v->modify_qp(a, &attr, IBV_QP_STATE), EINVAL);
  ck_assert_int_eq(fm_recv(a, 1), EINVAL);
  ck_assert_int_eq(fm_write(&m, a, 1, 0, 8, -1, m.mr[0]->lkey, m.mr[1]->rkey), EINVAL);
  ck_assert_int_eq(fm_init(&m, a), 0);
  ck_assert_int_eq(fm_init(&m, b), 0);
  ck_assert_int_eq(fm_write(&m, a, 1, 0, 8, -1, m.mr[0]->lkey, m.mr[1]->rkey), EINVAL); /* INIT: no sends */
  attr.qp_state = IBV_QPS_RTS;
  ck_assert_int_eq(m.v->modify_qp(a, &attr, IBV_QP_STATE), EINVAL); /* INIT -> RTS skips RTR */
  /* Receive queue depth. */
  ck_assert_int_eq(fm_recv(b, 100), 0);
  ck_assert_int_eq(fm_recv(b, 101), 0);
  ck_assert_int_eq(fm_recv(b, 102), ENOMEM);
  fm_connect(&m, a, b, 1, 7);
  fm_connect(&m, b, a, 0, 7);
  /* A write with immediate lands, consumes a receive, completes on both sides. */
  for (int i = 0; i < 64; i++) m.buf[0][i] = (char)(i * 3 + 1);
  ck_assert_int_eq(fm_write(&m, a, 7, 0, 64, 0x1234, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  struct ibv_wc wc[8];
  ck_assert_int_eq(fm_poll(&m, NULL, 1, wc, 1), 1);
  ck_assert_int_eq(wc[0].status, IBV_WC_SUCCESS);
  ck_assert_int_eq(wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  ck_assert_uint_eq(wc[0].wr_id, 100);
  ck_assert_uint_eq(ntohl(wc[0].imm_data), 0x1234);
  ck_assert_uint_eq(wc[0].byte_len, 64);
  ck_assert_int_eq(memcmp(m.buf[0], m.buf[1], 64), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  ck_assert_int_eq(wc[0].status, IBV_WC_SUCCESS);
  ck_assert_uint_eq(wc[0].wr_id, 7);
  /* RNR: the second write with immediate waits for a receive (rnr_retry 7: forever). */
  ck_assert_int_eq(fm_write(&m, a, 8, 64, 8, 1, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  ck_assert_int_eq(fm_write(&m, a, 9, 128, 8, 2, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 1, wc, 2), 1);
  ck_assert_uint_eq(wc[0].wr_id, 101);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 2), 1); /* only the first is acknowledged */
  ck_assert_int_eq(fm_recv(b, 103), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 1, wc, 1), 1);
  ck_assert_uint_eq(wc[0].wr_id, 103);
  ck_assert_uint_eq(ntohl(wc[0].imm_data), 2);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  ck_assert_uint_eq(wc[0].wr_id, 9);
  /* Send queue depth: four in flight, the fifth refused. */
  for (int i = 0; i < 4; i++) ck_assert_int_eq(fm_write(&m, a, 20 + (uint64_t)i, 0, 8, -1, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  ck_assert_int_eq(fm_write(&m, a, 24, 0, 8, -1, m.mr[0]->lkey, m.mr[1]->rkey), ENOMEM);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 4), 4);
  /* A wrong rkey: remote access error, the QP in ERR, what follows flushed. */
  ck_assert_int_eq(fm_write(&m, a, 30, 0, 8, -1, m.mr[0]->lkey, m.mr[1]->rkey + 1), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  ck_assert_int_eq(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  ck_assert_int_eq(fm_write(&m, a, 31, 0, 8, -1, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  ck_assert_int_eq(wc[0].status, IBV_WC_WR_FLUSH_ERR);
  ck_assert_uint_eq(wc[0].wr_id, 31);
  /* Out of range of the remote region: the same error. Back through RESET first. */
  fm_reconnect(&m, a, b, 1, 7);
  {
    /* The local side in range, the remote one past its region's end. */
    struct ibv_sge sge = {.addr = (uintptr_t)m.buf[0], .length = 200, .lkey = m.mr[0]->lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 32;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)m.buf[1] + 4000;
    wr.wr.rdma.rkey = m.mr[1]->rkey;
    ck_assert_int_eq(ibv_post_send(a, &wr, &bad), 0);
  }
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  ck_assert_int_eq(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  /* A wrong lkey: local protection error. */
  fm_reconnect(&m, a, b, 1, 7);
  ck_assert_int_eq(fm_write(&m, a, 33, 0, 8, -1, m.mr[0]->lkey + 7, m.mr[1]->rkey), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  ck_assert_int_eq(wc[0].status, IBV_WC_LOC_PROT_ERR);
  /* RNR with rnr_retry 0: the retries run out. */
  fm_reconnect(&m, a, b, 1, 0);
  ck_assert_int_eq(fm_write(&m, a, 34, 0, 8, 5, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  ck_assert_int_eq(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  /* Moving b to ERR flushes its receives (none left) and refuses nothing: posts are flushed. */
  attr.qp_state = IBV_QPS_ERR;
  ck_assert_int_eq(m.v->modify_qp(b, &attr, IBV_QP_STATE), 0);
  ck_assert_int_eq(fm_recv(b, 104), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 1, wc, 1), 1);
  ck_assert_int_eq(wc[0].status, IBV_WC_WR_FLUSH_ERR);
  ck_assert_uint_eq(wc[0].wr_id, 104);
  /* CQ overrun: a one-entry CQ given two completions raises IBV_EVENT_CQ_ERR. */
  struct ibv_cq *small = m.v->create_cq(m.ctx[0], 1, NULL, NULL, 0);
  ck_assert_ptr_nonnull(small);
  struct ibv_qp *c = fm_qp(&m, 0, small, 4, 1), *d = fm_qp(&m, 1, NULL, 4, 1);
  ck_assert_int_eq(fm_init(&m, c), 0);
  ck_assert_int_eq(fm_init(&m, d), 0);
  fm_connect(&m, c, d, 1, 7);
  fm_connect(&m, d, c, 0, 7);
  ck_assert_int_eq(fm_write(&m, c, 40, 0, 8, -1, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  ck_assert_int_eq(fm_write(&m, c, 41, 0, 8, -1, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  struct ibv_async_event ev;
  int have = 0;
  for (double t0 = hx_now(); !have && hx_now() - t0 < 2;) {
    /* Polling runs each context's "NIC": d's answers, then c's completions. */
    struct ibv_wc none[1];
    ck_assert_int_eq(ibv_poll_cq(m.cq[1], 0, none), 0);
    ck_assert_int_eq(ibv_poll_cq(small, 0, none), 0);
    have = m.v->get_async_event(m.ctx[0], &ev) == 0;
  }
  ck_assert_msg(have, "no async event after a CQ overrun");
  ck_assert_int_eq(ev.event_type, IBV_EVENT_CQ_ERR);
  m.v->ack_async_event(&ev);
  ck_assert_int_eq(m.v->get_async_event(m.ctx[0], &ev), -1);
  /* Destroy order: a CQ or PD still used is busy. */
  ck_assert_int_eq(m.v->destroy_cq(small), EBUSY);
  ck_assert_int_eq(m.v->dealloc_pd(m.pd[0]), EBUSY);
  struct ibv_qp *qps[] = {a, b, c, d};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(m.v->destroy_qp(qps[i]), 0);
  ck_assert_int_eq(m.v->destroy_cq(small), 0);
  for (int s = 0; s < 2; s++) {
    ck_assert_int_eq(m.v->dereg_mr(m.mr[s]), 0);
    ck_assert_int_eq(m.v->destroy_cq(m.cq[s]), 0);
    ck_assert_int_eq(m.v->dealloc_pd(m.pd[s]), 0);
    ck_assert_int_eq(m.v->close_device(m.ctx[s]), 0);
  }
  ck_assert_int_eq(hx_count_entries("/dev/shm", mine), 0);
}
END_TEST

/* The fake's completion channel: an armed CQ's event comes with the next arrival from another
 * context, or at once where the context still has work only a poll moves; one event per request;
 * a CQ with events not acknowledged, or a channel with a CQ, cannot be destroyed; nothing is left
 * in /dev/shm. */
static int readable(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, ms) == 1;
}

START_TEST(test_fake_channel) {
  char mine[64];
  fm_t m;
  fm_load(&m);
  ck_assert_msg(m.v->create_comp_channel && m.v->get_cq_event, "the fake has no completion channels");
  int n = 0, tag = 0;
  struct ibv_device **list = m.v->get_device_list(&n);
  ck_assert_ptr_nonnull(list);
  struct ibv_comp_channel *ch = NULL;
  for (int s = 0; s < 2; s++) {
    ck_assert_ptr_nonnull(m.ctx[s] = m.v->open_device(list[0]));
    ck_assert_ptr_nonnull(m.pd[s] = m.v->alloc_pd(m.ctx[s]));
    if (s == 1) {
      ck_assert_ptr_nonnull(ch = m.v->create_comp_channel(m.ctx[1]));
      ck_assert_ptr_null(m.v->create_comp_channel(m.ctx[1])); /* one per context */
      ck_assert_int_eq(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
    }
    ck_assert_ptr_nonnull(m.cq[s] = m.v->create_cq(m.ctx[s], 64, s ? &tag : NULL, s ? ch : NULL, 0));
    ck_assert_ptr_nonnull(m.mr[s] = m.v->reg_mr(m.pd[s], m.buf[s], sizeof m.buf[s], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  }
  m.v->free_device_list(list);
  snprintf(mine, sizeof mine, "fcfv-%d-", (int)getpid());
  struct ibv_qp *a = fm_qp(&m, 0, NULL, 4, 2), *b = fm_qp(&m, 1, NULL, 4, 4);
  ck_assert_int_eq(fm_init(&m, a), 0);
  ck_assert_int_eq(fm_init(&m, b), 0);
  fm_connect(&m, a, b, 1, 7);
  fm_connect(&m, b, a, 0, 7);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(fm_recv(b, 100 + (uint64_t)i), 0);
  struct ibv_cq *got = NULL;
  void *ctx = NULL;
  struct ibv_wc wc[2];
  /* Nothing requested, nothing came. */
  ck_assert_int_eq(m.v->get_cq_event(ch, &got, &ctx), -1);
  ck_assert_int_eq(ibv_req_notify_cq(m.cq[0], 0), EINVAL); /* no channel */
  /* Armed, idle: no event until a write arrives from the other context. */
  ck_assert_int_eq(ibv_req_notify_cq(m.cq[1], 0), 0);
  ck_assert(!readable(ch->fd, 0));
  ck_assert_int_eq(fm_write(&m, a, 7, 0, 64, 1, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  ck_assert_msg(readable(ch->fd, 2000), "no event for an arrival at an armed CQ");
  ck_assert_int_eq(m.v->get_cq_event(ch, &got, &ctx), 0);
  ck_assert_ptr_eq(got, m.cq[1]);
  ck_assert_ptr_eq(ctx, &tag);
  ck_assert_int_eq(m.v->get_cq_event(ch, &got, &ctx), -1); /* one per request */
  ck_assert_int_eq(fm_poll(&m, NULL, 1, wc, 1), 1);
  ck_assert_uint_eq(wc[0].wr_id, 100);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  /* Not armed: an arrival raises nothing; arming with it still to be taken raises at once. */
  ck_assert_int_eq(fm_write(&m, a, 8, 0, 8, 2, m.mr[0]->lkey, m.mr[1]->rkey), 0);
  ck_assert(!readable(ch->fd, 50));
  ck_assert_int_eq(ibv_req_notify_cq(m.cq[1], 0), 0);
  ck_assert_msg(readable(ch->fd, 0), "arming with an arrival not taken raised no event");
  ck_assert_int_eq(m.v->get_cq_event(ch, &got, &ctx), 0);
  ck_assert_int_eq(fm_poll(&m, NULL, 1, wc, 1), 1);
  ck_assert_uint_eq(wc[0].wr_id, 101);
  ck_assert_int_eq(fm_poll(&m, NULL, 0, wc, 1), 1);
  /* Teardown order: events acknowledged before the CQ goes, the CQ before its channel. */
  ck_assert_int_eq(m.v->destroy_qp(a), 0);
  ck_assert_int_eq(m.v->destroy_qp(b), 0);
  ck_assert_int_eq(m.v->destroy_cq(m.cq[1]), EBUSY);
  m.v->ack_cq_events(m.cq[1], 2);
  ck_assert_int_eq(m.v->destroy_comp_channel(ch), EBUSY);
  for (int s = 0; s < 2; s++) {
    ck_assert_int_eq(m.v->dereg_mr(m.mr[s]), 0);
    ck_assert_int_eq(m.v->destroy_cq(m.cq[s]), 0);
    ck_assert_int_eq(m.v->dealloc_pd(m.pd[s]), 0);
  }
  ck_assert_int_eq(m.v->destroy_comp_channel(ch), 0);
  for (int s = 0; s < 2; s++) ck_assert_int_eq(m.v->close_device(m.ctx[s]), 0);
  ck_assert_int_eq(hx_count_entries("/dev/shm", mine), 0);
}
END_TEST

/* Segments of the fake left by processes that no longer exist: leaks of the runs above. */
static int stale_segments(void) {
  DIR *d = opendir("/dev/shm");
  int n = 0;
  if (!d) return 0;
  for (struct dirent *e; (e = readdir(d));) {
    int pid = 0;
    unsigned serial = 0;
    if (sscanf(e->d_name, "fcfv-%d-%u", &pid, &serial) == 2 && pid > 0 && kill(pid, 0) && errno == ESRCH) {
      fprintf(stderr, "[test_rdma] /dev/shm/%s outlived its process\n", e->d_name);
      n++;
    }
  }
  closedir(d);
  return n;
}

/* The real provider: whether it has a device (else the tests skip). */
static int real_devices(void) {
  char why[300] = "";
  unsetenv("FLEXCOLL_VERBS_PROVIDER");
  const fc_verbs_t *v = fc_verbs_load(why, sizeof why);
  if (!v) {
    fprintf(stderr, "[test_rdma] no real verbs provider: %s\n", why);
    return 0;
  }
  int n = 0;
  struct ibv_device **list = v->get_device_list(&n);
  if (list) v->free_device_list(list);
  if (!list || n == 0) fprintf(stderr, "[test_rdma] no RDMA device (%s)\n", strerror(errno));
  return list && n > 0;
}

int main(void) {
  g_real = getenv("FC_TEST_RDMA_REAL") && *getenv("FC_TEST_RDMA_REAL") == '1';
  if (g_real && !real_devices()) return 77;
#ifdef FC_FAKE_VERBS_LIB
  /* make check's build of the fake; a user's setting wins. */
  setenv("FLEXCOLL_VERBS_FAKE_LIB", FC_FAKE_VERBS_LIB, 0);
#endif
  /* The rdma link carries the host collectives only with the shared-memory path off
   * (lib/host/shm.c would take every collective of these one-host ranks). */
  setenv("FLEXCOLL_SHM_DIRECT", "0", 1);
  snprintf(g_dir, sizeof g_dir, "/tmp/fc-test-rdma-XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  Suite *s = suite_create("rdma");
  TCase *tc = tcase_create("collectives");
  tcase_set_timeout(tc, 900);
  tcase_add_loop_test(tc, test_collectives, 0, 3);
  tcase_add_test(tc, test_collectives_threads);
  tcase_add_loop_test(tc, test_bitwise_with_shm, 0, 3);
  if (!g_real) tcase_add_loop_test(tc, test_zcopy, 0, 3);
  suite_add_tcase(s, tc);
  if (!g_real) {
    tc = tcase_create("rails");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_rails, 0, 2);
    tcase_add_test(tc, test_pci_places);
    tcase_add_test(tc, test_gid_pick);
    tcase_add_test(tc, test_gid);
    tcase_add_loop_test(tc, test_rank_without_nic, 0, 2);
    tcase_add_test(tc, test_progress_thread);
    tcase_add_test(tc, test_thread_parks);
    tcase_add_loop_test(tc, test_fork_safety, 0, 2);
    tcase_add_test(tc, test_sender_leaves);
    tcase_add_test(tc, test_info_rails);
    suite_add_tcase(s, tc);
    tc = tcase_create("rcache");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_rcache_lru, 0, 5);
    tcase_add_loop_test(tc, test_rcache_remap, 0, 3);
    suite_add_tcase(s, tc);
    tc = tcase_create("faults");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_fault, 0, (int)(sizeof faults / sizeof faults[0]));
    tcase_add_loop_test(tc, test_zcopy_fault, 0, (int)(sizeof zc_faults / sizeof zc_faults[0]));
    tcase_add_loop_test(tc, test_no_device, 0, 16);
    tcase_add_test(tc, test_no_leaks);
    tcase_add_test(tc, test_fake_model);
    tcase_add_test(tc, test_fake_channel);
    tcase_add_loop_test(tc, test_rank_killed, 0, 2);
    tcase_add_loop_test(tc, test_count_mismatch, 0, (int)(sizeof mismatches / sizeof mismatches[0]));
    suite_add_tcase(s, tc);
  }
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  int stale = g_real ? 0 : stale_segments();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (!failed && system(cmd) != 0) fprintf(stderr, "[test_rdma] could not remove %s\n", g_dir);
  return failed || stale ? EXIT_FAILURE : EXIT_SUCCESS;
}
