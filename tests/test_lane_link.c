/* test_lane_link.c — the ring kernels' second lane over a host link (lib/gpu/lane_link.c), on host
 * memory: the proxy's half of the protocol against the kernels' half played by the test.
 *
 * Ranks are threads of one process (hx_run_threads), each with a host communicator whose only
 * link is the one under test (tcp, shm, and rdma on the fake provider where the build has it).
 * Every rank plays its ring kernel for LL_BLOCKS blocks, as lib/kernels/ring.cu does on a
 * copy-engine lane: message n of a block goes into outbox slot n % LL_SLOTS once the next rank
 * has consumed message n - LL_SLOTS, its descriptor (offset, bytes, ready value) at n %
 * FC_PCIE_DESCS, then the published count; a message is consumed once the rank's ready counter
 * says so, checked byte for byte, and acknowledged in the previous rank's counter.  Messages are
 * of every size from 0 to the slot (a seeded draw; every seventh empty).  The mover
 * (fc_lane_link_turn) runs in the same thread between those steps.  Each block's ready counter
 * must only grow, never past what was published, and end at the message count; every byte of
 * every message must land where its descriptor says.
 *
 * Each case runs twice: with the ranks' areas shared (the previous rank's descriptors read from
 * its area, acknowledgements stored into it), and in band, as between hosts (lane_link.h): the
 * mover sees no other rank's area, the "kernel" acknowledges into its own stand-in, and a rank
 * ends, as the ring kernel does, once the next rank has acknowledged everything it sent; then
 * the mover drains its own last acknowledgements.  And the movers of a ring by hops (4 ranks on two
 * "hosts", only the edges between them through the movers: lane_case_t.hops). */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "comm.h"
#include "flexcoll.h"
#include "gpu/lane_link.h"
#include "harness.h"
#include "sched/sched.h"

#define LL_MAX_RANKS 4
#define LL_BLOCKS 3
#define LL_SLOTS 4 /* messages in flight per block, as the ring's sub-slots (<= FC_PCIE_DESCS) */
#define LL_ROOM 9000
#define LL_MSGS 300
#define LL_BOX (LL_SLOTS * LL_BLOCKS * LL_ROOM)

/* A rank's host area as the kernels and its neighbours see it (threads share the process). */
typedef struct {
  uint64_t sent[FC_MAX_BLOCKS];
  fc_pcie_desc_t desc[FC_MAX_BLOCKS * FC_PCIE_DESCS];
  uint64_t ready[FC_MAX_BLOCKS]; /* raised by this rank's mover */
  uint64_t ack[FC_MAX_BLOCKS];   /* raised by the next rank's "kernel" (in band: by this rank's mover) */
  uint64_t ack_out[FC_MAX_BLOCKS]; /* in band: this rank's "kernel" acknowledges here */
  char outbox[LL_BOX], inbox[LL_BOX];
} area_t;
static area_t g_area[LL_MAX_RANKS];

static size_t msg_bytes(uint64_t seed, int rank, unsigned b, uint64_t n) {
  if (n % 7 == 3) return 0;
  return (size_t)(hx_mix64(seed ^ ((uint64_t)rank << 40) ^ ((uint64_t)b << 32) ^ n) % (LL_ROOM + 1));
}

static unsigned char msg_byte(int rank, unsigned b, uint64_t n, size_t i) {
  return (unsigned char)hx_mix64(((uint64_t)rank << 56) ^ ((uint64_t)b << 48) ^ (n << 24) ^ i);
}

static size_t slot_off(unsigned b, uint64_t n) { return ((size_t)(n % LL_SLOTS) * LL_BLOCKS + b) * LL_ROOM; }

typedef struct {
  hx_rank_t *r;
  area_t *a;
  int prev;
  uint64_t raised[FC_MAX_BLOCKS];
} ready_ctx_t;

/* The mover's raise_ready: the counter only grows and never passes what the previous rank
 * published. */
static int raise_ready(void *arg, unsigned b, uint64_t value, uint64_t bytes) {
  ready_ctx_t *c = arg;
  (void)bytes;
  const uint64_t published = __atomic_load_n(&g_area[c->prev].sent[b], __ATOMIC_ACQUIRE);
  if (value <= c->raised[b] || value > published)
    return hx_fail(c->r, "block %u: ready %llu after %llu, the previous rank published %llu", b, (unsigned long long)value,
                   (unsigned long long)c->raised[b], (unsigned long long)published);
  c->raised[b] = value;
  __atomic_store_n(&c->a->ready[b], value, __ATOMIC_RELEASE);
  return 0;
}

static fc_link_t *find_link(struct flexcoll_comm *comm, const char *name) {
  fc_links_t *l = comm->links;
  for (int i = 0; l && i < l->n; i++)
    if (!strcmp(l->link[i].ops->name, name) && l->link[i].rail == 0) return &l->link[i];
  return NULL;
}

typedef struct {
  const char *link;
  int inband;
  /* The ring by hops (lib/gpu/pcie.c): 4 ranks on two "hosts" {0, 2} and {1, 3}, the ring host by
   * host (0 2 1 3); the edges within a host are played as NVLink (the sender stores into the next
   * rank's inbox and raises its ready counter, the receiver acknowledges into the sender's area),
   * only 2 -> 1 and 3 -> 0 go through the movers, in band.  Every mover still keeps its
   * descriptor and acknowledgement receives posted toward both neighbours, which on the edges
   * within a host never complete: it must neither stall nor fail, and end cleanly. */
  int hops;
} lane_case_t;

static const int hops_order[4] = {0, 2, 1, 3};
static int hops_place(int rank) { return rank == 0 ? 0 : rank == 2 ? 1 : rank == 1 ? 2 : 3; }

static int sends_retired(const fc_lane_link_t *m) {
  for (unsigned b = 0; b < m->blocks; b++)
    if (m->sends_done[b] < m->out_done[b]) return 0;
  return 1;
}

static int lane_rank(hx_rank_t *r) {
  const lane_case_t *c = r->arg;
  const char *name = c->link;
  const int me = r->rank, n = r->nranks;
  const int next = c->hops ? hops_order[(hops_place(me) + 1) % n] : (me + 1) % n;
  const int prev = c->hops ? hops_order[(hops_place(me) + n - 1) % n] : (me + n - 1) % n;
  /* By hops: which of our edges the mover carries (the others are "NVLink": same host). */
  const int in_link = !c->hops || prev % 2 != me % 2, out_link = !c->hops || next % 2 != me % 2;
  area_t *a = &g_area[me], *pa = &g_area[prev], *na = &g_area[next];
  struct flexcoll_comm *comm = (struct flexcoll_comm *)r->comm;
  fc_link_t *link = find_link(comm, name);
  if (!link) return hx_fail(r, "no %s link on this communicator", name);
  fc_lane_link_t *m = calloc(1, sizeof *m);
  ready_ctx_t ctx = {.r = r, .a = a, .prev = prev};
  if (!m) return hx_fail(r, "out of memory");
  *m = (fc_lane_link_t){.comm = comm, .link = link, .rank = me, .next = next, .prev = prev, .blocks = LL_BLOCKS,
                        .sent = a->sent, .desc = a->desc, .outbox = a->outbox, .inbox = a->inbox, .box_bytes = LL_BOX,
                        .raise_ready = raise_ready, .arg = &ctx};
  if (c->inband) {
    m->inband = 1;
    m->ack_out = a->ack_out;
    m->ack_in = a->ack;
  } else {
    m->prev_sent = pa->sent;
    m->prev_desc = pa->desc;
  }
  uint64_t *ack_to_prev = c->inband && in_link ? a->ack_out : pa->ack;
  uint64_t pushed[LL_BLOCKS] = {0}, consumed[LL_BLOCKS] = {0};
  const double deadline = hx_now() + 60;
  int done = 0;
  while (!done && !r->errors) {
    done = 1;
    for (unsigned b = 0; b < LL_BLOCKS; b++) {
      /* Push: message n once the next rank consumed n - LL_SLOTS (its slot is free again). */
      const uint64_t acked = __atomic_load_n(&a->ack[b], __ATOMIC_ACQUIRE);
      if (pushed[b] < LL_MSGS && (pushed[b] < LL_SLOTS || acked >= pushed[b] - LL_SLOTS + 1)) {
        const uint64_t k = pushed[b];
        const size_t off = slot_off(b, k), bytes = msg_bytes(r->seed, me, b, k);
        char *to = out_link ? a->outbox : na->inbox; /* "NVLink": straight into the next rank's */
        for (size_t i = 0; i < bytes; i++) to[off + i] = (char)msg_byte(me, b, k, i);
        if (out_link) {
          a->desc[b * FC_PCIE_DESCS + k % FC_PCIE_DESCS] = (fc_pcie_desc_t){.off = off, .bytes = bytes, .ready = k + 1};
          __atomic_store_n(&a->sent[b], k + 1, __ATOMIC_RELEASE);
        } else {
          __atomic_store_n(&na->ready[b], k + 1, __ATOMIC_RELEASE);
        }
        pushed[b]++;
      }
      /* Consume: message n once our ready counter says it landed; acknowledge it. */
      if (consumed[b] < LL_MSGS && __atomic_load_n(&a->ready[b], __ATOMIC_ACQUIRE) >= consumed[b] + 1) {
        const uint64_t k = consumed[b];
        const size_t off = slot_off(b, k), bytes = msg_bytes(r->seed, prev, b, k);
        size_t bad = 0;
        for (size_t i = 0; i < bytes; i++) bad += (unsigned char)a->inbox[off + i] != msg_byte(prev, b, k, i);
        if (bad) hx_fail(r, "block %u message %llu (%zu bytes from rank %d): %zu bytes wrong", b, (unsigned long long)k, bytes,
                         prev, bad);
        __atomic_store_n(&ack_to_prev[b], k + 1, __ATOMIC_RELEASE);
        consumed[b]++;
      }
      done &= pushed[b] == LL_MSGS && consumed[b] == LL_MSGS;
      /* As the ring kernel's last wait: everything sent has been consumed. */
      done &= __atomic_load_n(&a->ack[b], __ATOMIC_ACQUIRE) == LL_MSGS;
    }
    const int moved = fc_lane_link_turn(m);
    if (moved < 0) hx_fail(r, "fc_lane_link_turn over %s: %s", name, flexcoll_get_last_error(r->comm));
    done &= c->inband ? sends_retired(m) : !fc_lane_link_busy(m);
    if (!done && hx_now() > deadline) {
      hx_fail(r, "stuck over %s: block 0 pushed %llu consumed %llu, mover sent %llu (%llu done) received %llu (%llu done)",
              name, (unsigned long long)pushed[0], (unsigned long long)consumed[0], (unsigned long long)m->out_done[0],
              (unsigned long long)m->sends_done[0], (unsigned long long)m->in_done[0], (unsigned long long)m->recvs_done[0]);
      char line[600];
      fc_lane_link_slowest(m, line, sizeof line);
      fprintf(stderr, "[test_lane_link] rank %d: %s\n", me, line);
      if (link->ops->describe) {
        link->ops->describe(link, next, line, sizeof line);
        fprintf(stderr, "[test_lane_link] rank %d: %s\n", me, line);
      }
      break;
    }
  }
  /* The stall report's "longest step" names a step the mover took. */
  if (!r->errors && (!m->slowest_what || !(m->slowest_us >= 0)))
    hx_fail(r, "the mover kept no longest step (%s, %.1f us)", m->slowest_what ? m->slowest_what : "none", m->slowest_us);
  for (unsigned b = 0; b < LL_BLOCKS && !r->errors; b++)
    if (in_link && ctx.raised[b] != LL_MSGS) hx_fail(r, "block %u: ready ended at %llu", b, (unsigned long long)ctx.raised[b]);
    else if (!in_link && ctx.raised[b]) hx_fail(r, "block %u: the mover raised ready on an edge within the host", b);
  /* The previous rank waits for our last acknowledgements (its "kernel" has not ended yet). */
  if (!r->errors && fc_lane_link_drain(m, fc_now_us() + 30e6))
    hx_fail(r, "the last acknowledgements over %s did not go out: %s", name, flexcoll_get_last_error(r->comm));
  fc_lane_link_cancel(m);
  free(m);
  return r->errors != 0;
}

static const char *const links[] = {"tcp", "shm", "rdma"};

/* Case c over nranks threads, each with a communicator over the case's link alone. */
static void run_lane(const lane_case_t *c, int nranks, const char *label) {
  char e1[64];
  snprintf(e1, sizeof e1, "FLEXCOLL_LINKS=%s", c->link);
  const char *env[] = {e1, "FLEXCOLL_UCX_PEER_FAILURE=0", NULL, NULL, NULL};
  if (!strcmp(c->link, "rdma")) {
#ifdef FC_FAKE_VERBS_LIB
    env[2] = "FLEXCOLL_VERBS_PROVIDER=fake";
    env[3] = "FLEXCOLL_VERBS_FAKE_LIB=" FC_FAKE_VERBS_LIB;
#else
    fprintf(stderr, "[test_lane_link] rdma: this build has no fake verbs provider: skipped\n");
    return;
#endif
  }
  hx_opts_t o = {.label = label, .env = env, .deadline_s = 120, .exit_barrier = 1};
  ck_assert_msg(hx_run_threads(nranks, &o, lane_rank, (void *)c), "%s: %d ranks, the lane over %s%s%s: see stderr", label,
                nranks, c->link, c->inband ? " in band" : "", c->hops ? " by hops" : "");
}

START_TEST(test_lane_over_link) {
  const lane_case_t c = {links[_i / 6], _i % 2, 0};
  const int nranks = 2 + _i / 2 % 3;
  char label[48];
  snprintf(label, sizeof label, "lane-%s-%d%s", c.link, nranks, c.inband ? "-inband" : "");
  run_lane(&c, nranks, label);
}
END_TEST

/* The movers of a ring by hops (lane_case_t.hops), over each link. */
START_TEST(test_lane_by_hops) {
  const lane_case_t c = {links[_i], 1, 1};
  char label[48];
  snprintf(label, sizeof label, "lane-%s-hops", c.link);
  run_lane(&c, 4, label);
}
END_TEST

int main(void) {
  Suite *s = suite_create("lane_link");
  TCase *tc = tcase_create("links");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_lane_over_link, 0, 18);
  tcase_add_loop_test(tc, test_lane_by_hops, 0, 3);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
