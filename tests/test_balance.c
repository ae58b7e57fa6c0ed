/* test_balance.c — the link cost model, the balancer and the chunker (lib/sched/cost.c, balance.c).
 * What the device path relies on: shares make every carrying link finish together, a link that
 * cannot pay for itself carries nothing, the shares add up to the message exactly and every rank
 * computes the same ones, the slices cover each share once; the model follows a link that slows
 * down and comes back, and a cached model comes back bit for bit or not at all. */
#define _GNU_SOURCE
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm.h"
#include "sched/sched.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* xorshift64*: the same numbers on every run and machine (rand() is the C library's choice). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(double lo, double hi) {
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  const uint64_t r = rng_state * 2685821657736338717ull;
  return lo + (hi - lo) * (double)(r >> 11) / 9007199254740992.0;
}

static fc_link_model_t model(double alpha, double beta, double min_bytes, int port) {
  return (fc_link_model_t){.alpha_us = alpha, .beta = beta, .min_bytes = min_bytes, .port = port};
}

/* Bit for bit, field by field (memcmp on the structs would also compare their padding). */
static int same_models(const fc_link_model_t *a, const fc_link_model_t *b, int n) {
  for (int i = 0; i < n; i++)
    if (memcmp(&a[i].alpha_us, &b[i].alpha_us, sizeof(double)) || memcmp(&a[i].beta, &b[i].beta, sizeof(double)) ||
        memcmp(&a[i].min_bytes, &b[i].min_bytes, sizeof(double)) || a[i].port != b[i].port)
      return 0;
  return 1;
}

/* The betas the balancer works with: a port's links share what the port carries (its port_beta,
 * else what its best link carries), never more than their own.  Written here from the definition
 * rather than taken from balance.c. */
static void port_betas(const fc_link_model_t *m, const size_t *shares, int n, double *eff) {
  for (int i = 0; i < n; i++) {
    double cap = 0, sum = 0;
    for (int j = 0; j < n; j++)
      if (j == i || (m[i].port >= 0 && m[j].port == m[i].port && shares[j]))
        sum += m[j].beta, cap = fmax(cap, fmax(m[j].beta, m[i].port >= 0 ? m[j].port_beta : 0));
    eff[i] = m[i].beta * fmin(1, cap / sum);
  }
}

/* Every property of a split that holds whatever the models: exact sum, align multiples except
 * the remainder's link, equal finish times among carrying links (within the rounding: each link
 * loses under one align unit, the remainder's link gains under n), and no idle link that could
 * have finished an align unit before the others.  Returns the common finish time. */
static double check_split(const fc_link_model_t *m, int n, size_t bytes, size_t align, const size_t *shares) {
  double eff[FC_MAX_LINKS], tmin = INFINITY, tmax = 0, unit = 0;
  port_betas(m, shares, n, eff);
  size_t sum = 0;
  int odd = 0;
  for (int i = 0; i < n; i++) {
    sum += shares[i];
    odd += shares[i] % align != 0;
    if (!shares[i]) continue;
    const double t = m[i].alpha_us + (double)shares[i] / eff[i];
    tmin = fmin(tmin, t), tmax = fmax(tmax, t);
    unit = fmax(unit, (double)align / eff[i]);
  }
  ck_assert_uint_eq(sum, bytes);
  ck_assert_int_le(odd, 1);
  const double tol = (n + 1) * unit + 1e-9 * tmax;
  ck_assert_msg(tmax - tmin <= tol, "finish times %.6f..%.6f us differ by more than %.6f", tmin, tmax, tol);
  for (int i = 0; i < n; i++)
    if (!shares[i] && m[i].beta > 0)
      ck_assert_msg(m[i].alpha_us + (double)align / m[i].beta >= tmin - tol, "link %d idles but would help", i);
  return tmax;
}

START_TEST(test_random_links_finish_together) {
  const size_t aligns[] = {1, 4, 16, 256, 4096};
  for (int n = 2; n <= FC_MAX_LINKS; n++)
    for (int trial = 0; trial < 200; trial++) {
      fc_link_model_t m[FC_MAX_LINKS];
      for (int i = 0; i < n; i++) m[i] = model(uniform(0, 30), uniform(1000, 400000), 0, -1);
      const size_t bytes = (size_t)uniform(1 << 20, 1 << 30), align = aligns[trial % 5];
      size_t shares[FC_MAX_LINKS];
      double finish;
      ck_assert_int_eq(fc_balance(m, NULL, n, bytes, align, shares, &finish), FLEXCOLL_SUCCESS);
      const double t = check_split(m, n, bytes, align, shares);
      ck_assert_double_eq_tol(finish, t, 1e-9 * t);
      /* the remainder goes to the largest beta among the carrying links */
      for (int i = 0; i < n; i++)
        if (shares[i] % align)
          for (int j = 0; j < n; j++) ck_assert(!shares[j] || m[j].beta <= m[i].beta);
    }
}
END_TEST

START_TEST(test_unusable_links_get_nothing) {
  fc_link_model_t m[5] = {model(5, 0, 0, -1), model(5, 100000, 0, -1), model(5, -3, 0, -1), model(5, NAN, 0, -1),
                          model(5, 200000, 0, -1)};
  size_t shares[5];
  ck_assert_int_eq(fc_balance(m, NULL, 5, 64 * MiB, 16, shares, NULL), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(shares[0] + shares[2] + shares[3], 0);
  ck_assert_uint_gt(shares[1], 0);
  ck_assert_uint_gt(shares[4], shares[1]);
  const int enabled[5] = {1, 1, 1, 1, 0};
  ck_assert_int_eq(fc_balance(m, enabled, 5, 64 * MiB, 16, shares, NULL), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(shares[1], 64 * MiB);
  const int none[5] = {1, 0, 1, 1, 0};
  memset(shares, 0xff, sizeof shares);
  ck_assert_int_eq(fc_balance(m, none, 5, 64 * MiB, 16, shares, NULL), FLEXCOLL_INVALID_ARGUMENT);
  /* nothing to move: zeros, even with no link able to move it */
  double finish = -1;
  ck_assert_int_eq(fc_balance(m, none, 5, 0, 16, shares, &finish), FLEXCOLL_SUCCESS);
  for (int i = 0; i < 5; i++) ck_assert_uint_eq(shares[i], 0);
  ck_assert(finish == 0);
  ck_assert_int_eq(fc_balance(m, NULL, FC_MAX_LINKS + 1, MiB, 16, shares, NULL), FLEXCOLL_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_small_messages_take_the_fastest_link) {
  /* NVLink-like (slow start, fast) and a NIC-like link with less latency */
  fc_link_model_t m[3] = {model(5, 360000, 256 * KiB, -1), model(2, 45000, 256 * KiB, -1), model(9, 45000, 0, -1)};
  size_t shares[3];
  double finish;
  ck_assert_int_eq(fc_balance(m, NULL, 3, 1000, 16, shares, &finish), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(shares[1], 1000); /* 2.02 us against 5.003 */
  ck_assert_double_eq_tol(finish, 2 + 1000.0 / 45000, 1e-12);
  /* 1 MiB: the NIC-like links would get less than their min_bytes (or less than nothing: alpha 9
   * is past the common finish time); NVLink alone, which now beats the NIC */
  ck_assert_int_eq(fc_balance(m, NULL, 3, MiB, 16, shares, &finish), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(shares[0], MiB);
  ck_assert_double_eq_tol(finish, fc_cost_predict(&m[0], MiB), 1e-12);
  /* under one align unit: one link whatever min_bytes says */
  fc_link_model_t same[2] = {model(1, 1000, 0, -1), model(1, 1000, 0, -1)};
  ck_assert_int_eq(fc_balance(same, NULL, 2, 15, 16, shares, NULL), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(shares[0], 15); /* ties: the lowest index */
  ck_assert_uint_eq(shares[1], 0);
  /* large enough: both */
  ck_assert_int_eq(fc_balance(m, NULL, 3, 512 * MiB, 16, shares, NULL), FLEXCOLL_SUCCESS);
  ck_assert(shares[0] && shares[1] && shares[2]);
}
END_TEST

START_TEST(test_huge_messages) {
  fc_link_model_t m[4] = {model(5, 360000, 0, -1), model(15, 45000, 0, 3), model(10, 45000, 0, 3),
                          model(3, 12000, 0, -1)};
  const size_t sizes[] = {(size_t)1 << 32, ((size_t)1 << 40) - 1, (size_t)1 << 40, ((size_t)1 << 40) + 3,
                          (size_t)1 << 50};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t shares[4];
    ck_assert_int_eq(fc_balance(m, NULL, 4, sizes[k], 64, shares, NULL), FLEXCOLL_SUCCESS);
    check_split(m, 4, sizes[k], 64, shares);
  }
  /* past 2^53 the doubles are not exact: the sum still is, and no share exceeds the message */
  size_t shares[4], sum = 0;
  ck_assert_int_eq(fc_balance(m, NULL, 4, SIZE_MAX, 64, shares, NULL), FLEXCOLL_SUCCESS);
  for (int i = 0; i < 4; i++) {
    ck_assert_uint_le(shares[i], SIZE_MAX - sum);
    sum += shares[i];
  }
  ck_assert_uint_eq(sum, SIZE_MAX);
}
END_TEST

START_TEST(test_same_inputs_same_split) {
  for (int trial = 0; trial < 500; trial++) {
    const int n = 1 + trial % FC_MAX_LINKS;
    fc_link_model_t m[FC_MAX_LINKS], copy[FC_MAX_LINKS];
    int enabled[FC_MAX_LINKS];
    for (int i = 0; i < n; i++) {
      m[i] = model(uniform(0, 20), uniform(0, 1) < 0.1 ? 0 : uniform(100, 400000), uniform(0, 1 << 20),
                  (int)floor(uniform(-1, 3)));
      enabled[i] = uniform(0, 1) < 0.9;
    }
    enabled[0] = 1, m[0].beta = 1000;
    memcpy(copy, m, sizeof m);
    const size_t bytes = (size_t)uniform(0, 1ull << 34), align = (size_t)1 << (int)uniform(0, 8);
    size_t a[FC_MAX_LINKS], b[FC_MAX_LINKS];
    double fa, fb;
    ck_assert_int_eq(fc_balance(m, enabled, n, bytes, align, a, &fa), FLEXCOLL_SUCCESS);
    ck_assert_int_eq(fc_balance(copy, enabled, n, bytes, align, b, &fb), FLEXCOLL_SUCCESS);
    ck_assert_mem_eq(a, b, n * sizeof *a);
    ck_assert_mem_eq(&fa, &fb, sizeof fa);
    size_t sum = 0;
    for (int i = 0; i < n; i++) sum += a[i];
    ck_assert_uint_eq(sum, bytes);
  }
}
END_TEST

/* The slices of one share walked in order: 0 when they tile it (no gap, no overlap, full slices
 * but the last), else the index of the first bad one plus 1.  Plain tests, not ck_assert: Check
 * reports every assertion to its parent, too slow for millions of slices. */
static size_t walk_slices(size_t share, size_t slice, size_t count) {
  size_t end = 0, off, len;
  for (size_t k = 0; k < count; k++) {
    fc_chunk_get(share, slice, k, &off, &len);
    const int full = slice == 0 || len == slice || (k + 1 == count && len < slice);
    if (off != end || len == 0 || !full) return k + 1;
    end = off + len;
  }
  if (end != share) return count + 1;
  fc_chunk_get(share, slice, count, &off, &len); /* past the end: empty, at the end */
  return off == share && len == 0 ? 0 : count + 2;
}

START_TEST(test_chunks_cover_each_share_once) {
  const size_t shares[] = {0, 1, 15, 16, 17, 4095, 4096, 4097, MiB - 16, MiB, 3 * MiB + 48, ((size_t)1 << 40) + 16};
  const size_t slices[] = {0, 1, 16, 48, 4096, MiB, 2 * MiB, ((size_t)1 << 40) - 16};
  for (size_t s = 0; s < sizeof shares / sizeof *shares; s++)
    for (size_t c = 0; c < sizeof slices / sizeof *slices; c++) {
      const size_t share = shares[s], slice = slices[c], count = fc_chunk_count(share, slice);
      ck_assert_uint_eq(count, share == 0 ? 0 : slice == 0 ? 1 : (share + slice - 1) / slice);
      if (count > ((size_t)1 << 24)) continue; /* 2^40 in 16-byte slices: too long to walk */
      ck_assert_msg(walk_slices(share, slice, count) == 0, "share %zu in slices of %zu: slice %zu is wrong", share,
                    slice, walk_slices(share, slice, count) - 1);
    }
  ck_assert_uint_eq(fc_chunk_count(100, 48), 3);
  size_t off, len;
  fc_chunk_get(100, 48, 2, &off, &len);
  ck_assert(off == 96 && len == 4);
  ck_assert_uint_eq(fc_chunk_count(SIZE_MAX, (size_t)1 << 20), ((size_t)1 << 44));
}
END_TEST

START_TEST(test_links_on_one_port_are_worth_one_port) {
  /* B and C behind one port, against D: one independent link like the port, and against B and C
   * independent of each other */
  const fc_link_model_t shared[3] = {model(5, 100000, 0, -1), model(10, 50000, 0, 0), model(10, 50000, 0, 0)};
  const fc_link_model_t single[2] = {model(5, 100000, 0, -1), model(10, 50000, 0, -1)};
  const fc_link_model_t apart[3] = {model(5, 100000, 0, -1), model(10, 50000, 0, -1), model(10, 50000, 0, 1)};
  size_t s[3], d[2], a[3];
  double ts, td, ta;
  ck_assert_int_eq(fc_balance(shared, NULL, 3, 256 * MiB, 16, s, &ts), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_balance(single, NULL, 2, 256 * MiB, 16, d, &td), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_balance(apart, NULL, 3, 256 * MiB, 16, a, &ta), FLEXCOLL_SUCCESS);
  check_split(shared, 3, 256 * MiB, 16, s);
  ck_assert_uint_gt(s[1], 0);
  ck_assert_uint_gt(s[2], 0);
  ck_assert_uint_le(s[1] > s[2] ? s[1] - s[2] : s[2] - s[1], 16 * 3);
  ck_assert_uint_le(s[1] + s[2] > d[1] ? s[1] + s[2] - d[1] : d[1] - s[1] - s[2], 16 * 4);
  ck_assert_double_eq_tol(ts, td, 0.01);
  /* independent, the two links would be credited with twice the port */
  ck_assert_uint_gt(a[1] + a[2], (s[1] + s[2]) * 7 / 5);
  ck_assert_double_lt(ta, ts);
  /* a port's links of different speeds: the sum of their betas is the faster one's */
  const fc_link_model_t mixed[3] = {model(0, 60000, 0, -1), model(0, 30000, 0, 7), model(0, 10000, 0, 7)};
  ck_assert_int_eq(fc_balance(mixed, NULL, 3, 300 * MiB, 1, s, &ts), FLEXCOLL_SUCCESS);
  ck_assert_double_eq_tol(ts, 300.0 * MiB / 90000, 1e-6);
  ck_assert_double_eq_tol((double)s[1] / (double)s[2], 3, 1e-6);
  /* the port alone: splitting it gains nothing, so the message stays on its faster link */
  ck_assert_int_eq(fc_balance(mixed + 1, NULL, 2, 300 * MiB, 1, s, &ts), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(s[0], 300 * MiB);
}
END_TEST

/* One rank's links to its next hop in a ring of 8 H200-like GPUs: NVLink, PCIe host staging and
 * the NIC, the last two behind the GPU's PCIe switch (one port per switch, two GPUs per switch). */
static void ring_links(int rank, fc_link_model_t *m) {
  m[0] = model(5, 360000 * (1 + 0.01 * rank), 256 * KiB, -1);
  m[1] = model(15, 45000 * (1 - 0.005 * rank), 256 * KiB, rank / 2);
  m[2] = model(10, 45000, 256 * KiB, rank / 2);
}

START_TEST(test_ring_of_8_gpus) {
  const size_t bytes = 512 * MiB;
  for (int rank = 0; rank < 8; rank++) {
    fc_link_model_t m[3], apart[3];
    size_t s[3], again[3], a[3];
    double finish;
    ring_links(rank, m);
    ck_assert_int_eq(fc_balance(m, NULL, 3, bytes, 16, s, &finish), FLEXCOLL_SUCCESS);
    const double t = check_split(m, 3, bytes, 16, s);
    ck_assert(s[0] && s[1] && s[2]);
    /* the pair carries what one port does: (T - mean alpha) * the port's beta, about 11% */
    const double port = 45000, eff1 = m[1].beta * port / (m[1].beta + port), eff2 = port * port / (m[1].beta + port);
    const double expect = (t - m[1].alpha_us) * eff1 + (t - m[2].alpha_us) * eff2;
    ck_assert_double_le(fabs((double)(s[1] + s[2]) - expect), 16 * 4);
    const double frac = (double)(s[1] + s[2]) / (double)bytes;
    ck_assert_msg(frac > 0.09 && frac < 0.12, "rank %d: the port carries %.4f of the bytes", rank, frac);
    /* against the NVLink alone: the split is faster by about the port's share */
    ck_assert_double_lt(finish, fc_cost_predict(&m[0], (double)bytes) * 0.92);
    /* if the NIC had a port of its own, the pair would take about twice as much */
    ring_links(rank, apart);
    apart[2].port = -1;
    ck_assert_int_eq(fc_balance(apart, NULL, 3, bytes, 16, a, NULL), FLEXCOLL_SUCCESS);
    ck_assert_double_gt((double)(a[1] + a[2]), 1.7 * (double)(s[1] + s[2]));
    /* the receiving rank computes the sender's split from the same models: the same split */
    ring_links(rank, m);
    ck_assert_int_eq(fc_balance(m, NULL, 3, bytes, 16, again, NULL), FLEXCOLL_SUCCESS);
    ck_assert_mem_eq(s, again, sizeof s);
  }
}
END_TEST

/* A simulated 8-GPU server: four PCIe switches, each with two GPUs and one NIC under one root
 * port (x16, 52 GB/s a direction).  Each rank's links toward its ring neighbour: NVLink, host
 * staging through its switch (about 40 GB/s) and the NIC (25 GB/s, 200 Gb/s), the last two
 * sharing the root port.  The balancer must credit the pair with the port's bandwidth: more than
 * either alone (so both carry), less than the sum (which would over-fill the port); a port wider
 * than the pair costs nothing, and without a known width the pair is worth its faster link. */
static void shared_port_links(int rank, double port_beta, fc_link_model_t *m) {
  m[0] = model(5, 360000 * (1 + 0.01 * rank), 256 * KiB, -1);
  m[1] = model(15, 40000 * (1 - 0.005 * rank), 256 * KiB, rank / 2);
  m[2] = model(10, 25000, 256 * KiB, rank / 2);
  m[1].port_beta = m[2].port_beta = port_beta;
}

START_TEST(test_8_gpus_nic_shares_the_gpu_port) {
  const size_t bytes = 1024 * MiB;
  for (int rank = 0; rank < 8; rank++) {
    fc_link_model_t m[3], wide[3], unknown[3], apart[3];
    size_t s[3], w[3], u[3], a[3], again[3];
    double finish;
    shared_port_links(rank, 52000, m);
    ck_assert_int_eq(fc_balance(m, NULL, 3, bytes, 16, s, &finish), FLEXCOLL_SUCCESS);
    const double t = check_split(m, 3, bytes, 16, s);
    ck_assert(s[0] && s[1] && s[2]);
    /* the pair moves what the port does in the common time, shared in proportion to their betas */
    const double pair = m[1].beta + m[2].beta, e1 = m[1].beta * 52000 / pair, e2 = m[2].beta * 52000 / pair;
    const double expect = (t - m[1].alpha_us) * e1 + (t - m[2].alpha_us) * e2;
    ck_assert_double_le(fabs((double)(s[1] + s[2]) - expect), 16 * 4);
    ck_assert_double_eq_tol((double)s[1] / (double)s[2], m[1].beta / m[2].beta, 0.01);
    /* the port's bytes per microsecond of the common time: at most its width */
    ck_assert_double_le((double)(s[1] + s[2]) / (t - fmin(m[1].alpha_us, m[2].alpha_us)), 52000 * 1.0001);
    /* a port wider than the pair: both at their own betas, as if apart */
    shared_port_links(rank, 100000, wide);
    memcpy(apart, wide, sizeof apart);
    apart[1].port = apart[2].port = -1;
    ck_assert_int_eq(fc_balance(wide, NULL, 3, bytes, 16, w, NULL), FLEXCOLL_SUCCESS);
    ck_assert_int_eq(fc_balance(apart, NULL, 3, bytes, 16, a, NULL), FLEXCOLL_SUCCESS);
    ck_assert_mem_eq(w, a, sizeof w);
    ck_assert_uint_gt(a[1] + a[2], s[1] + s[2]);
    /* the width unknown: the pair is worth its faster link, less than with the width known */
    shared_port_links(rank, 0, unknown);
    ck_assert_int_eq(fc_balance(unknown, NULL, 3, bytes, 16, u, NULL), FLEXCOLL_SUCCESS);
    check_split(unknown, 3, bytes, 16, u);
    ck_assert_uint_lt(u[1] + u[2], s[1] + s[2]);
    /* a width under the faster link's beta cannot make a link alone slower than its model */
    shared_port_links(rank, 1000, unknown);
    ck_assert_int_eq(fc_balance(unknown, NULL, 3, bytes, 16, again, NULL), FLEXCOLL_SUCCESS);
    ck_assert_mem_eq(u, again, sizeof u);
    /* every rank of the pair computes the same split */
    shared_port_links(rank, 52000, m);
    ck_assert_int_eq(fc_balance(m, NULL, 3, bytes, 16, again, NULL), FLEXCOLL_SUCCESS);
    ck_assert_mem_eq(s, again, sizeof s);
  }
}
END_TEST

START_TEST(test_fit_recovers_the_model) {
  double b[12], us[12];
  for (int i = 0; i < 12; i++) b[i] = (double)((size_t)1024 << (2 * i)) / 4, us[i] = 7.5 + b[i] / 25000;
  fc_link_model_t m = model(-1, -1, 4096, 2);
  ck_assert_int_eq(fc_cost_fit(&m, b, us, 12), FLEXCOLL_SUCCESS);
  ck_assert_double_eq_tol(m.alpha_us, 7.5, 1e-6);
  ck_assert_double_eq_tol(m.beta, 25000, 25000 * 1e-9);
  ck_assert(m.min_bytes == 4096 && m.port == 2); /* not the fit's to change */
  /* a few tenths of a microsecond of timer noise */
  for (int i = 0; i < 12; i++) us[i] = 7.5 + b[i] / 25000 + uniform(-0.3, 0.3);
  ck_assert_int_eq(fc_cost_fit(&m, b, us, 12), FLEXCOLL_SUCCESS);
  ck_assert_double_eq_tol(m.alpha_us, 7.5, 0.5);
  ck_assert_double_eq_tol(m.beta, 25000, 25000 * 1e-3);
  /* a latency too small to see comes out 0, not negative */
  for (int i = 0; i < 12; i++) us[i] = b[i] / 25000 - 2;
  ck_assert_int_eq(fc_cost_fit(&m, b, us, 12), FLEXCOLL_SUCCESS);
  ck_assert(m.alpha_us == 0);
  /* refused, m untouched */
  const fc_link_model_t before = m;
  const double flat_b[3] = {4096, 4096, 4096}, down[3] = {30, 20, 10}, flat_us[3] = {5, 5, 5};
  const double nan_us[3] = {1, NAN, 3}, up_b[3] = {1, 2, 3};
  ck_assert_int_eq(fc_cost_fit(&m, b, us, 1), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_fit(&m, flat_b, down, 3), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_fit(&m, up_b, down, 3), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_fit(&m, up_b, flat_us, 3), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_fit(&m, up_b, nan_us, 3), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert(same_models(&m, &before, 1));
  ck_assert(isinf(fc_cost_predict(&(fc_link_model_t){.beta = 0}, 1)));
}
END_TEST

/* Calibration from two sizes: the fit where the large size is mostly transfer, a plain lower
 * bound where both sizes took about the fixed cost (the case that turned the pcie link off on
 * the node: no positive slope, or a slope of timer noise). */
START_TEST(test_two_sizes_never_absurd) {
  fc_link_model_t m = model(-1, -1, 4096, 2);
  /* clean: the fit (alpha 20 us, 12000 B/us) */
  ck_assert_int_eq(fc_cost_from_two(&m, 262144, 20 + 262144 / 12000.0, 4194304, 20 + 4194304 / 12000.0), FLEXCOLL_SUCCESS);
  ck_assert_double_eq_tol(m.alpha_us, 20, 1e-6);
  ck_assert_double_eq_tol(m.beta, 12000, 1e-6);
  ck_assert(m.min_bytes == 4096 && m.port == 2);
  /* the large size faster than the small one: no slope; the large one's rate, the smaller time */
  ck_assert_int_eq(fc_cost_from_two(&m, 262144, 18.0, 4194304, 17.5), FLEXCOLL_SUCCESS);
  ck_assert_double_eq_tol(m.alpha_us, 17.5, 1e-9);
  ck_assert_double_eq_tol(m.beta, 4194304 / 17.5, 1e-6);
  /* a slope of noise (0.1 us over 3.9 MB: 39 TB/s) is not believed either */
  ck_assert_int_eq(fc_cost_from_two(&m, 262144, 17.5, 4194304, 17.6), FLEXCOLL_SUCCESS);
  ck_assert_double_eq_tol(m.alpha_us, 17.5, 1e-9);
  ck_assert_double_eq_tol(m.beta, 4194304 / 17.6, 1e-6);
  /* just over half the large size's time is transfer: the fit stands */
  ck_assert_int_eq(fc_cost_from_two(&m, 1, 10.0, 10001, 21.0), FLEXCOLL_SUCCESS);
  ck_assert_double_eq_tol(m.beta, 10000 / 11.0, 1e-6);
  /* refused, m untouched */
  const fc_link_model_t before = m;
  ck_assert_int_eq(fc_cost_from_two(&m, 4096, 5, 4096, 6), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_from_two(&m, 0, 5, 4096, 6), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_from_two(&m, 1024, 0, 4096, 6), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_from_two(&m, 1024, 5, 4096, NAN), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_from_two(&m, 1024, 5, INFINITY, 6), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_cost_from_two(NULL, 1024, 5, 4096, 6), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert(same_models(&m, &before, 1));
}
END_TEST

/* A part that took little more than alpha (a probe share) moves beta at most toward twice its
 * plain rate: one such part cannot make a slow link look faster than anything else. */
START_TEST(test_update_near_alpha_is_bounded) {
  fc_link_model_t m = model(21.6, 342, 0, -1);
  const double probe = 65536, us = 21.7; /* 0.1 us over alpha: 655 GB/s if believed */
  fc_cost_update(&m, probe, us, 0.5);
  ck_assert_double_eq_tol(m.beta, 0.5 * 342 + 0.5 * 2 * probe / us, 1e-6);
  /* repeated, it still climbs (geometrically toward the bound), so a recovered link is found */
  double prev = m.beta;
  for (int k = 0; k < 8; k++) {
    fc_cost_update(&m, probe, us, 0.5);
    ck_assert_double_gt(m.beta, prev);
    ck_assert_double_le(m.beta, 2 * probe / us);
    prev = m.beta;
  }
  /* a part well above alpha counts whole, as before */
  m = model(10, 45000, 0, -1);
  fc_cost_update(&m, 64.0 * MiB, 10 + 64.0 * MiB / 30000, 1);
  ck_assert_double_eq_tol(m.beta, 30000, 1e-6);
}
END_TEST

START_TEST(test_update_follows_a_slow_link_and_its_recovery) {
  fc_link_model_t m[2] = {model(5, 360000, 0, -1), model(10, 45000, 0, -1)};
  const double bytes = 64.0 * MiB;
  size_t before[2], slow[2], after[2];
  ck_assert_int_eq(fc_balance(m, NULL, 2, 512 * MiB, 16, before, NULL), FLEXCOLL_SUCCESS);
  /* another process copies over PCIe: the link runs at 20000 B/us */
  double prev = m[1].beta;
  for (int k = 0; k < 50; k++) {
    fc_cost_update(&m[1], bytes, 10 + bytes / 20000, 0.2);
    ck_assert_double_lt(m[1].beta, prev);
    prev = m[1].beta;
  }
  ck_assert_double_eq_tol(m[1].beta, 20000, 20000 * 0.01);
  ck_assert_int_eq(fc_balance(m, NULL, 2, 512 * MiB, 16, slow, NULL), FLEXCOLL_SUCCESS);
  ck_assert_uint_lt(slow[1], before[1] / 2 + before[1] / 10);
  /* it stops: back to 45000 */
  for (int k = 0; k < 50; k++) {
    fc_cost_update(&m[1], bytes, 10 + bytes / 45000, 0.2);
    ck_assert_double_gt(m[1].beta, prev);
    prev = m[1].beta;
  }
  ck_assert_double_eq_tol(m[1].beta, 45000, 45000 * 0.01);
  ck_assert_int_eq(fc_balance(m, NULL, 2, 512 * MiB, 16, after, NULL), FLEXCOLL_SUCCESS);
  ck_assert_uint_le(after[1] > before[1] ? after[1] - before[1] : before[1] - after[1], before[1] / 100);
  /* ignored: a time at or under alpha, a weight outside (0, 1], numbers that are not */
  const fc_link_model_t keep = m[1];
  fc_cost_update(&m[1], bytes, 10, 0.5);
  fc_cost_update(&m[1], bytes, 3, 0.5);
  fc_cost_update(&m[1], bytes, 2000, 0);
  fc_cost_update(&m[1], bytes, 2000, 1.5);
  fc_cost_update(&m[1], bytes, 2000, NAN);
  fc_cost_update(&m[1], NAN, 2000, 0.5);
  fc_cost_update(&m[1], bytes, NAN, 0.5);
  ck_assert(same_models(&m[1], &keep, 1));
  fc_cost_update(&m[1], bytes, 10 + bytes / 30000, 1); /* weight 1: the measurement itself */
  ck_assert_double_eq_tol(m[1].beta, 30000, 1e-6);
}
END_TEST

/* A fresh directory under /tmp for one test (Check forks each test: no clean-up is shared). */
static void temp_dir(char *dir, size_t size) {
  snprintf(dir, size, "/tmp/flexcoll-test-balance.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_tree(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static const fc_link_model_t odd_models[6] = {
    {.alpha_us = 1.0 / 3, .beta = 360000.12345678901, .min_bytes = 262144, .port = -1},
    {.alpha_us = 0, .beta = 0, .min_bytes = 0, .port = 0},
    {.alpha_us = 4.9406564584124654e-324, .beta = 1e300, .min_bytes = 1e-300, .port = 12},
    {.alpha_us = -0.0, .beta = 2.2250738585072014e-308, .min_bytes = 0.1, .port = 2147483647},
    {.alpha_us = 15.000000000000002, .beta = 44999.999999999993, .min_bytes = 65536, .port = 3},
    {.alpha_us = 1e-7, .beta = 0.5, .min_bytes = 1, .port = 3},
};

START_TEST(test_cache_round_trip) {
  char root[64], dir[128];
  temp_dir(root, sizeof root);
  snprintf(dir, sizeof dir, "%s/a/b/c", root); /* created on save, mkdir -p */
  const char *key = "host-0:8xH200 nvlink/pcie,rdma port=3 100%";
  ck_assert_int_eq(fc_cost_cache_save(dir, key, odd_models, 6), FLEXCOLL_SUCCESS);
  struct stat st;
  ck_assert_int_eq(stat(dir, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0700);
  fc_link_model_t back[6];
  memset(back, 0x5a, sizeof back);
  ck_assert_int_eq(fc_cost_cache_load(dir, key, back, 6), FLEXCOLL_SUCCESS);
  ck_assert(same_models(back, odd_models, 6)); /* the bits, -0.0 and subnormals included */
  /* saved again over the first (the rename replaces it); nothing else is left in the directory */
  ck_assert_int_eq(fc_cost_cache_save(dir, key, odd_models + 1, 5), FLEXCOLL_SUCCESS);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(fc_cost_cache_load(dir, key, back, 5), FLEXCOLL_SUCCESS);
  ck_assert(same_models(back, odd_models + 1, 5));
  /* another key, another count: refused, not someone else's models */
  memcpy(back, odd_models, sizeof back);
  ck_assert_int_eq(fc_cost_cache_load(dir, "host-0:8xH200 nvlink/pcie,rdma port=3 100_", back, 5),
                   FLEXCOLL_SYSTEM_ERROR);
  ck_assert_int_eq(fc_cost_cache_load(dir, key, back, 6), FLEXCOLL_SYSTEM_ERROR);
  ck_assert_int_eq(fc_cost_cache_load(dir, "never-saved", back, 5), FLEXCOLL_SYSTEM_ERROR);
  ck_assert(same_models(back, odd_models, 6));
  /* what load would refuse is not saved */
  fc_link_model_t bad[2] = {odd_models[0], model(NAN, 1, 0, -1)};
  ck_assert_int_eq(fc_cost_cache_save(dir, "bad", bad, 2), FLEXCOLL_INVALID_ARGUMENT);
  bad[1] = model(1, -1, 0, -1);
  ck_assert_int_eq(fc_cost_cache_save(dir, "bad", bad, 2), FLEXCOLL_INVALID_ARGUMENT);
  /* a long key: a file name within the limit, still its own */
  char longkey[1200];
  memset(longkey, 'k', sizeof longkey - 1), longkey[sizeof longkey - 1] = '\0';
  ck_assert_int_eq(fc_cost_cache_save(dir, longkey, odd_models, 2), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_cost_cache_load(dir, longkey, back, 2), FLEXCOLL_SUCCESS);
  longkey[5] = 'x';
  ck_assert_int_eq(fc_cost_cache_load(dir, longkey, back, 2), FLEXCOLL_SYSTEM_ERROR);
  remove_tree(root);
}
END_TEST

static void write_file(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_cache_refuses_bad_files) {
  char dir[64], path[128];
  temp_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/topo1.links", dir);
  ck_assert_int_eq(fc_cost_cache_save(dir, "topo1", odd_models, 3), FLEXCOLL_SUCCESS);
  char good[1024];
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  const size_t len = fread(good, 1, sizeof good, f);
  fclose(f);
  fc_link_model_t out[3], sentinel[3];
  memset(sentinel, 0xa5, sizeof sentinel);
  /* every truncation of a good file */
  for (size_t cut = 0; cut < len; cut++) {
    write_file(path, good, cut);
    memcpy(out, sentinel, sizeof out);
    ck_assert_int_eq(fc_cost_cache_load(dir, "topo1", out, 3), FLEXCOLL_SYSTEM_ERROR);
    ck_assert_mem_eq(out, sentinel, sizeof out);
  }
  const char *bad[] = {
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 2 3 -1\nend\n",                        /* a line short */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 2 3 -1\n1 2 3 -1\n",                   /* no end */
      "flexcoll-links 2 3 topo1\n1 2 3 -1\n1 2 3 -1\n1 2 3 -1\nend\n",              /* version */
      "flexcoll-links 1 3 topo2\n1 2 3 -1\n1 2 3 -1\n1 2 3 -1\nend\n",              /* key */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\nnan 2 3 -1\n1 2 3 -1\nend\n",            /* NaN */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 inf 3 -1\n1 2 3 -1\nend\n",            /* inf */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 -2 3 -1\n1 2 3 -1\nend\n",             /* negative beta */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 2 3 -1 9\n1 2 3 -1\nend\n",            /* extra field */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 2 3 x\n1 2 3 -1\nend\n",               /* not a port */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 2 3 -7\n1 2 3 -1\nend\n",              /* port < -1 */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 2 3 -1\n1 2 3 -1\nend\nmore\n",        /* trailing */
      "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 2 3 -1\n1 2 3 99999999999\nend\n",     /* port range */
      "flexcoll-links 1 3 topo1 x\n1 2 3 -1\n1 2 3 -1\n1 2 3 -1\nend\n",           /* header junk */
      "something else entirely\n",
  };
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    write_file(path, bad[k], strlen(bad[k]));
    memcpy(out, sentinel, sizeof out);
    ck_assert_msg(fc_cost_cache_load(dir, "topo1", out, 3) == FLEXCOLL_SYSTEM_ERROR, "bad file %zu loaded", k);
    ck_assert_mem_eq(out, sentinel, sizeof out);
  }
  /* and the same layout, well formed, loads: the refusals above are for the faults alone */
  const char *ok = "flexcoll-links 1 3 topo1\n1 2 3 -1\n1 2 3 -1\n1 2 3 -1\nend\n";
  write_file(path, ok, strlen(ok));
  ck_assert_int_eq(fc_cost_cache_load(dir, "topo1", out, 3), FLEXCOLL_SUCCESS);
  ck_assert(out[2].alpha_us == 1 && out[2].beta == 2 && out[2].min_bytes == 3 && out[2].port == -1);
  remove_tree(dir);
}
END_TEST

/* fc_cost_cache_dir() in a child with this environment (NULL: unset): 0 when it gives expect. */
static int dir_in_child(const char *flexcoll, const char *xdg, const char *home, const char *expect) {
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    const char *names[3] = {"FLEXCOLL_CACHE_DIR", "XDG_CACHE_HOME", "HOME"}, *values[3] = {flexcoll, xdg, home};
    for (int i = 0; i < 3; i++) values[i] ? setenv(names[i], values[i], 1) : unsetenv(names[i]);
    const char *dir = fc_cost_cache_dir();
    const int same = expect ? dir && !strcmp(dir, expect) : !dir;
    setenv("FLEXCOLL_CACHE_DIR", "/changed", 1); /* read once: a later change is not seen */
    _exit(same && fc_cost_cache_dir() == dir ? 0 : 1);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

START_TEST(test_cache_dir) {
  ck_assert_int_eq(dir_in_child("/scratch/fc", "/xdg", "/home/u", "/scratch/fc"), 0);
  ck_assert_int_eq(dir_in_child(NULL, "/xdg", "/home/u", "/xdg/flexcoll"), 0);
  ck_assert_int_eq(dir_in_child("", "/xdg", "/home/u", "/xdg/flexcoll"), 0);
  ck_assert_int_eq(dir_in_child(NULL, NULL, "/home/u", "/home/u/.cache/flexcoll"), 0);
  ck_assert_int_eq(dir_in_child(NULL, "relative", "/home/u", "/home/u/.cache/flexcoll"), 0);
  ck_assert_int_eq(dir_in_child(NULL, NULL, NULL, NULL), 0);
}
END_TEST

/* Stage 2 learns only from large operations: a small collective's or batch's deliveries cost
 * their latency, not their bytes, and would drag a link's bandwidth down in the next exchange. */
START_TEST(test_stage2_keeps_large_operations_only) {
  struct flexcoll_comm comm;
  fc_links_t l;
  unsigned long long call_bytes[4] = {0};
  memset(&comm, 0, sizeof comm);
  memset(&l, 0, sizeof l);
  l.n = 2;
  l.call_bytes = call_bytes;
  comm.nranks = 2;
  comm.links = &l;
  fc_links_record(&l, 2, 0, 1, 4096, 40.0, 0); /* a delivery of a small collective */
  ck_assert_int_eq(fc_links_after_collective(&comm, 4096), FLEXCOLL_SUCCESS);
  ck_assert(l.pairs[0].meas_parts[0] == 0 && l.pairs[0].meas_bytes[0] == 0 && l.pairs[0].meas_us[0] == 0);
  fc_links_record(&l, 2, 1, 1, 1 << 20, 300.0, 0); /* one of a large collective (no exchange yet) */
  ck_assert_int_eq(fc_links_after_collective(&comm, 4u << 20), FLEXCOLL_SUCCESS);
  ck_assert(l.pairs[0].meas_parts[1] == 1 && l.pairs[0].meas_bytes[1] == (double)(1 << 20) && l.pairs[0].meas_us[1] == 300.0);
  fc_links_record(&l, 2, 0, 1, 512, 20.0, 0); /* a small batch of sends and receives */
  fc_links_after_p2p(&comm, 512);
  ck_assert(l.pairs[0].meas_parts[0] == 0);
  fc_links_record(&l, 2, 0, 1, 2 << 20, 500.0, 0); /* a large one */
  fc_links_after_p2p(&comm, 2 << 20);
  ck_assert(l.pairs[0].meas_parts[0] == 1 && l.pairs[0].meas_us[0] == 500.0);
  ck_assert(l.pairs[0].op_parts[0] == 0 && l.pairs[0].op_parts[1] == 0);
}
END_TEST

/* Stage 2 of the ring kernels' device lanes (nvlink, then the side lanes: pcie, rdma) as
 * lib/gpu/pcie.c drives the shared rule: every rank times its own calls, but only rank 0's times
 * move the models: every FC_STAGE2_EVERY calls rank 0 folds them into its next models
 * (fc_stage2_update) and posts them, and every rank, rank 0 too, puts that update in force 2
 * updates later (the lag that lets another rank's host run ahead of rank 0's).  Each of 4 ranks
 * keeps its own copy of what is in force and splits every call by it (fc_lanes_split, as the
 * kernels get it): they must split alike, bit for bit; a side lane calibrated far too slow must
 * be found by a probe and settle at its true proportion despite the lag; when it slows 50x it
 * must lose most of its share, and regain it after.  The side lanes share the GPU's PCIe port
 * in the truth too: when both carry bytes, each moves at its bandwidth scaled so that the two
 * together do not exceed the port. */
enum { LANE_RANKS = 4, LANE_LAG = 2 * FC_STAGE2_EVERY, LANE_POSTS = 64, LANES_MAX = 3 };
typedef struct {
  fc_link_model_t model[LANES_MAX]; /* in force */
  int probe[LANES_MAX];
} lane_rank_t;
typedef struct {
  int n;                            /* lanes: nvlink and n - 1 side lanes */
  double port;                      /* what the side lanes' port carries together (0: no limit) */
  lane_rank_t rank[LANE_RANKS];
  fc_link_model_t next[LANES_MAX];  /* rank 0's, as of its last post */
  int next_idle[LANES_MAX], next_probe[LANES_MAX];
  fc_stage2_history_t next_hist[LANES_MAX];
  int fixed_cost_learnt;            /* 0: rank 0 updates beta alone (last NULL), as before two points */
  double noise;                     /* each measured time times 1 + noise * uniform(-1, 1) */
  double meas[3][LANES_MAX];        /* rank 0's since its last post: parts, bytes, us */
  lane_rank_t posted[LANE_POSTS];
  int calls;
} lanes_t;

/* `calls` calls of a `chunk`-byte ring chunk; lane `slowed`'s true bandwidth divided by slow.
 * Returns the lanes' shares of the last call (the same on every rank, checked) in share[]. */
static void lanes_run(lanes_t *s, const fc_link_model_t *truth, int slowed, double slow, size_t chunk, int calls,
                      int *probes, double *share) {
  static const double floor[LANES_MAX] = {0, 64 << 10, 64 << 10};
  const int n = s->n;
  for (int k = 0; k < calls; k++) {
    size_t part[LANE_RANKS][LANES_MAX];
    for (int q = 0; q < LANE_RANKS; q++) {
      lane_rank_t *r = &s->rank[q];
      size_t side[LANES_MAX - 1];
      fc_lanes_split(r->model, r->probe, NULL, 1, n - 1, chunk, 3, side);
      part[q][0] = chunk;
      for (int L = 1; L < n; L++) part[q][L] = side[L - 1], part[q][0] -= side[L - 1];
      ck_assert_uint_le(chunk - part[q][0], chunk);
      for (int L = 0; L < n; L++)
        ck_assert_msg(part[q][L] == part[0][L], "call %d: rank %d puts %zu bytes on lane %d, rank 0 %zu", s->calls, q,
                      part[q][L], L, part[0][L]);
    }
    for (int L = 1; L < n; L++) *probes += s->rank[0].probe[L] && L == slowed;
    double beta[LANES_MAX], side_sum = 0;
    for (int L = 0; L < n; L++) {
      beta[L] = truth[L].beta / (L == slowed ? slow : 1);
      if (L && part[0][L]) side_sum += beta[L];
    }
    for (int L = 1; L < n; L++) /* the port: the side lanes that carry bytes share it */
      if (part[0][L] && s->port > 0 && side_sum > s->port) beta[L] *= s->port / side_sum;
    for (int L = 0; L < n; L++) { /* rank 0 times its lanes (three chunk messages each) */
      if (!part[0][L]) continue;
      const double bytes = 3.0 * (double)part[0][L];
      s->meas[0][L] += 1;
      s->meas[1][L] += bytes;
      s->meas[2][L] += (truth[L].alpha_us + bytes / beta[L]) * (1 + s->noise * uniform(-1, 1));
    }
    for (int L = 0; L < n; L++) share[L] = (double)part[0][L] / (double)chunk;
    const int c = ++s->calls;
    if (c % FC_STAGE2_EVERY == 0) { /* rank 0 posts update c / EVERY */
      fc_stage2_update(s->next, s->next_idle, s->next_probe, s->fixed_cost_learnt ? s->next_hist : NULL, floor, n,
                       s->meas[0], s->meas[1], s->meas[2]);
      for (int L = 1; L < n; L++) ck_assert(s->next[L].min_bytes >= floor[L]);
      lane_rank_t *e = &s->posted[(c / FC_STAGE2_EVERY) % LANE_POSTS];
      memcpy(e->model, s->next, sizeof e->model);
      memcpy(e->probe, s->next_probe, sizeof e->probe);
      memset(s->meas, 0, sizeof s->meas);
    }
    if (c > LANE_LAG && (c - LANE_LAG) % FC_STAGE2_EVERY == 0) /* every rank puts the due one in force */
      for (int q = 0; q < LANE_RANKS; q++) s->rank[q] = s->posted[((c - LANE_LAG) / FC_STAGE2_EVERY) % LANE_POSTS];
  }
}

static void lanes_start(lanes_t *s, int n, double port, const fc_link_model_t *calibrated) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->port = port;
  s->fixed_cost_learnt = 1;
  memcpy(s->next, calibrated, (size_t)n * sizeof *calibrated);
  for (int q = 0; q < LANE_RANKS; q++) memcpy(s->rank[q].model, s->next, sizeof s->next);
}

START_TEST(test_lanes_stage2) {
  /* Per rank: the model's bytes are what a lane pushed in a call, here three chunk messages. */
  const fc_link_model_t truth[2] = {{.alpha_us = 8, .beta = 400000, .port = -1}, {.alpha_us = 15, .beta = 25000, .port = -1}};
  const fc_link_model_t calibrated[2] = {model(8, 400000, 0, -1), model(15, 25, 64 << 10, -1)}; /* 1000x too low */
  static lanes_t s;
  lanes_start(&s, 2, 0, calibrated);
  const size_t chunk = 64u << 20;
  int probes = 0;
  size_t first[1];
  fc_lanes_split(s.rank[0].model, NULL, NULL, 1, 1, chunk, 3, first);
  ck_assert_uint_eq(first[0], 0);
  const double fair = 25000.0 / 425000.0;
  double share[LANES_MAX];
  lanes_run(&s, truth, 1, 1, chunk, 160, &probes, share);
  ck_assert_msg(probes > 0, "the idle pcie lane never got a probe share");
  ck_assert_msg(share[1] > fair * 0.9 && share[1] < fair * 1.1, "pcie settled at %.4f, its true proportion is %.4f",
                share[1], fair);
  const double settled = share[1];
  lanes_run(&s, truth, 1, 50, chunk, 60, &probes, share);
  ck_assert_msg(share[1] < fair / 10, "pcie 50x slower kept a share of %.4f (was %.4f)", share[1], settled);
  lanes_run(&s, truth, 1, 1, chunk, 160, &probes, share);
  ck_assert_msg(share[1] > fair * 0.9 && share[1] < fair * 1.1, "pcie recovered to %.4f, its true proportion is %.4f",
                share[1], fair);
}
END_TEST

/* Three lanes: nvlink, pcie and rdma, the two side lanes behind one PCIe port narrower than
 * both together.  From a calibration that has each side lane alone at its own bandwidth, the
 * split settles where the side lanes move what the port carries, in proportion; either side
 * lane slowed 50x loses most of its share, the other side lane takes up part of the port, and
 * both come back. */
START_TEST(test_three_lanes_stage2) {
  const double port = 40000;
  const fc_link_model_t truth[3] = {{.alpha_us = 8, .beta = 400000, .port = -1},
                                    {.alpha_us = 15, .beta = 25000, .port = 0},
                                    {.alpha_us = 30, .beta = 20000, .port = 0}};
  fc_link_model_t calibrated[3] = {model(8, 400000, 0, -1), model(15, 25000, 64 << 10, 0), model(30, 20000, 64 << 10, 0)};
  calibrated[1].port_beta = calibrated[2].port_beta = port;
  const size_t chunk = 64u << 20;
  /* Both side lanes together: what the port carries, of nvlink + port. */
  const double fair_sides = port / (400000 + port);
  for (int slowed = 1; slowed <= 2; slowed++) {
    static lanes_t s;
    lanes_start(&s, 3, port, calibrated);
    int probes = 0;
    double share[LANES_MAX];
    lanes_run(&s, truth, slowed, 1, chunk, 160, &probes, share);
    const double sides = share[1] + share[2];
    ck_assert_msg(share[1] > 0 && share[2] > 0, "a side lane idle after settling: pcie %.4f rdma %.4f", share[1], share[2]);
    ck_assert_msg(sides > fair_sides * 0.85 && sides < fair_sides * 1.15, "the side lanes settled at %.4f, the port's "
                  "proportion is %.4f", sides, fair_sides);
    ck_assert_double_eq_tol(share[1] / share[2], 25000.0 / 20000.0, 0.25);
    const double before = share[slowed], other = share[3 - slowed];
    lanes_run(&s, truth, slowed, 50, chunk, 80, &probes, share);
    ck_assert_msg(share[slowed] < before / 10, "lane %d 50x slower kept a share of %.4f (was %.4f)", slowed,
                  share[slowed], before);
    ck_assert_msg(share[3 - slowed] > other, "lane %d slowed, yet the other side lane stayed at %.4f (was %.4f)",
                  slowed, share[3 - slowed], other);
    lanes_run(&s, truth, slowed, 1, chunk, 200, &probes, share);
    ck_assert_msg(share[slowed] > before * 0.8 && share[slowed] < before * 1.25,
                  "lane %d recovered to %.4f, before it was slowed %.4f", slowed, share[slowed], before);
  }
}
END_TEST

/* A side lane whose fixed cost is large against its bytes (the fake verbs provider's rdma lane:
 * hundreds of microseconds a call, a few GB/s) beside NVLink, its fixed cost twice what the
 * calibration found.  Slowed 30x, its share falls to nothing; recovered, its probes and then its
 * small parts take little more than their fixed cost, and their rates must still lift the model
 * back: its share comes back to what it was. */
START_TEST(test_lane_with_large_alpha_recovers) {
  const fc_link_model_t truth[2] = {{.alpha_us = 20, .beta = 70000, .port = -1}, {.alpha_us = 600, .beta = 2900, .port = -1}};
  const fc_link_model_t calibrated[2] = {model(20, 70000, 0, -1), model(300, 2900, 64 << 10, -1)};
  static lanes_t s;
  lanes_start(&s, 2, 0, calibrated);
  const size_t chunk = 64u << 20;
  int probes = 0;
  double share[LANES_MAX];
  lanes_run(&s, truth, 1, 1, chunk, 160, &probes, share);
  const double before = share[1];
  ck_assert_msg(before > 0, "the lane carries nothing while well");
  lanes_run(&s, truth, 1, 30, chunk, 80, &probes, share);
  ck_assert_msg(share[1] < before / 10, "30x slower, the lane kept a share of %.4f (was %.4f)", share[1], before);
  lanes_run(&s, truth, 1, 1, chunk, 200, &probes, share);
  ck_assert_msg(share[1] > before * 0.8 && share[1] < before * 1.25, "recovered to %.4f, before it was slowed %.4f",
                share[1], before);
}
END_TEST

/* The same lane, its fixed cost learnt from its parts of several sizes (fc_stage2_update's
 * history) against beta alone (no history): after the slow spell both come back, the learnt one
 * within RECOVER calls, and only the learnt model has the lane's fixed cost and rate, so that only
 * it splits a chunk of another size (an eighth) as the truth would. */
START_TEST(test_fixed_cost_learnt_from_several_sizes) {
  const fc_link_model_t truth[2] = {{.alpha_us = 20, .beta = 70000, .port = -1}, {.alpha_us = 600, .beta = 2900, .port = -1}};
  const fc_link_model_t calibrated[2] = {model(20, 70000, 0, -1), model(300, 2900, 64 << 10, -1)};
  const size_t chunk = 64u << 20, small = chunk / 2;
  enum { RECOVER = 48 };
  fc_link_model_t best[2] = {truth[0], truth[1]};
  best[1].min_bytes = best[1].alpha_us * best[1].beta;
  size_t want[1];
  fc_lanes_split(best, NULL, NULL, 1, 1, small, 3, want);
  ck_assert_uint_gt(want[0], 0);
  double off[2];
  for (int learnt = 0; learnt <= 1; learnt++) {
    static lanes_t s;
    lanes_start(&s, 2, 0, calibrated);
    s.fixed_cost_learnt = learnt;
    int probes = 0, calls = 0;
    double share[LANES_MAX];
    lanes_run(&s, truth, 1, 1, chunk, 160, &probes, share);
    const double before = share[1];
    lanes_run(&s, truth, 1, 30, chunk, 80, &probes, share);
    while (calls < 400 && !(share[1] > before * 0.8 && share[1] < before * 1.25)) {
      lanes_run(&s, truth, 1, 1, chunk, 1, &probes, share);
      calls++;
    }
    ck_assert_msg(calls < 400, "learnt %d: the lane did not come back (%.4f, before %.4f)", learnt, share[1], before);
    if (learnt) ck_assert_msg(calls <= RECOVER, "with the fixed cost learnt, back after %d calls", calls);
    lanes_run(&s, truth, 1, 1, chunk, 40, &probes, share);
    size_t got[1];
    fc_lanes_split(s.rank[0].model, NULL, NULL, 1, 1, small, 3, got);
    off[learnt] = fabs((double)got[0] - (double)want[0]) / (double)want[0];
    if (learnt)
      ck_assert_msg(off[1] < 0.1, "the learnt model (%.0f us, %.0f MB/s) splits half the chunk %.0f %% off",
                    s.next[1].alpha_us, s.next[1].beta, off[1] * 100);
  }
  ck_assert_msg(off[0] > 0.1, "beta alone splits half the chunk only %.0f %% off: the test shows nothing",
                off[0] * 100);
}
END_TEST

/* Measured times off by up to 10 % either way, every one: the lanes still settle near their
 * true proportion and stay there, also after a slow spell, whose parts of changing sizes feed the
 * fixed cost's fit (noisy points must not throw the model about). */
START_TEST(test_lanes_stage2_noisy) {
  const fc_link_model_t truth[2] = {{.alpha_us = 8, .beta = 400000, .port = -1}, {.alpha_us = 15, .beta = 25000, .port = -1}};
  const fc_link_model_t calibrated[2] = {model(8, 400000, 0, -1), model(15, 25000, 64 << 10, -1)};
  static lanes_t s;
  lanes_start(&s, 2, 0, calibrated);
  s.noise = 0.1;
  const size_t chunk = 64u << 20;
  const double fair = 25000.0 / 425000.0;
  int probes = 0;
  double share[LANES_MAX];
  for (int spell = 0; spell < 2; spell++) {
    if (spell) lanes_run(&s, truth, 1, 30, chunk, 60, &probes, share);
    lanes_run(&s, truth, 1, 1, chunk, 120, &probes, share);
    double lo = 1, hi = 0;
    for (int k = 0; k < 400; k++) {
      lanes_run(&s, truth, 1, 1, chunk, 1, &probes, share);
      lo = share[1] < lo ? share[1] : lo;
      hi = share[1] > hi ? share[1] : hi;
    }
    ck_assert_msg(lo > fair * 0.8 && hi < fair * 1.25, "with 10 %% noise%s the pcie share went from %.4f to %.4f; its "
                  "true proportion is %.4f", spell ? ", after a slow spell," : "", lo, hi, fair);
  }
}
END_TEST

/* A device lane's probe is worth its fixed cost: bytes / FC_PROBE_PART, or the link's min_bytes
 * where that is more, up to bytes / FC_PROBE_MAX_PART; a host link's stays bytes / FC_PROBE_PART;
 * taken from the largest share, in align multiples. */
START_TEST(test_probe_share_size) {
  const size_t bytes = 64u << 20, align = 4096;
  const double mins[] = {0, 1000, (double)(bytes / FC_PROBE_PART) * 3, (double)bytes};
  const size_t want[] = {bytes / FC_PROBE_PART, bytes / FC_PROBE_PART, (size_t)mins[2] / align * align,
                         bytes / FC_PROBE_MAX_PART};
  for (int k = 0; k < 4; k++) {
    /* The second link so slow that the balancer gives it nothing. */
    const fc_link_model_t m[2] = {model(5, 100000, 0, -1), model(5000, 10, mins[k], -1)};
    const int probe[2] = {0, 1};
    size_t shares[2];
    ck_assert_int_eq(fc_stage2_split(m, NULL, probe, FC_PROBE_FIXED_COST, 2, bytes, align, shares), FLEXCOLL_SUCCESS);
    ck_assert_msg(shares[1] == want[k], "min_bytes %.0f: a probe of %zu bytes, wanted %zu", mins[k], shares[1], want[k]);
    ck_assert_uint_eq(shares[0] + shares[1], bytes);
    ck_assert_int_eq(fc_stage2_split(m, NULL, probe, FC_PROBE_FRACTION, 2, bytes, align, shares), FLEXCOLL_SUCCESS);
    ck_assert_uint_eq(shares[1], bytes / FC_PROBE_PART);
  }
}
END_TEST

/* The lanes split a call's worth of chunks (msgs): a lane whose fixed cost is large against its
 * rate gets at least as much of a chunk when a call pushes more chunk messages (its fixed cost is
 * spread over more bytes), and with msgs 1 the split is the chunk's own. */
START_TEST(test_lanes_split_per_call) {
  const fc_link_model_t m[2] = {model(10, 90000, 0, -1), model(400, 3000, 64 << 10, -1)};
  const size_t chunk = 8u << 20;
  size_t prev = 0, one[1], plain[2];
  for (unsigned msgs = 1; msgs <= 14; msgs++) {
    size_t side[1];
    fc_lanes_split(m, NULL, NULL, 1, 1, chunk, msgs, side);
    ck_assert_msg(side[0] >= prev, "%u messages a call: %zu bytes of a chunk on the side lane, %zu with one less",
                  msgs, side[0], prev);
    prev = side[0];
  }
  fc_lanes_split(m, NULL, NULL, 1, 1, chunk, 1, one);
  ck_assert_int_eq(fc_stage2_split(m, NULL, NULL, FC_PROBE_FIXED_COST, 2, chunk, 16, plain), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(one[0], plain[1]);
  ck_assert_msg(prev > one[0], "14 messages a call gave the side lane no more than one (%zu bytes)", prev);
}
END_TEST

/* fc_lanes_split: what the kernels are handed.  For random models, fixed fractions, 1 and 2 side
 * lanes, with and without NVLink and every kind of chunk size: side lanes' parts start where the
 * previous one ends and stay inside the chunk, each a multiple of 16 unless it reaches the chunk's
 * end; without NVLink they cover the chunk; fixed fractions are kept to 16 bytes; a lone side lane
 * without NVLink takes everything, whatever its model. */
START_TEST(test_lanes_split) {
  const size_t sizes[] = {0, 1, 15, 16, 17, 1000, 4096, 65537, 1u << 20, (64u << 20) + 48, (size_t)5 << 30};
  for (int iter = 0; iter < 400; iter++) {
    const int nside = 1 + iter % 2, nvlink = (iter / 2) % 2, use_fixed = (iter / 4) % 2;
    const unsigned msgs = (unsigned)(iter / 8) % 15; /* 0 counts as 1 */
    fc_link_model_t m[3];
    int probe[3];
    double fixed[3], sum = 0;
    for (int L = 0; L < 3; L++) {
      m[L] = model(uniform(0, 40), uniform(1000, 500000), 64 << 10, L ? 0 : -1);
      probe[L] = uniform(0, 1) < 0.2;
      fixed[L] = L || nvlink ? uniform(0, 1) : 0;
      sum += L <= nside ? fixed[L] : 0;
    }
    for (int L = 0; L < 3; L++) fixed[L] /= sum;
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
      const size_t chunk = sizes[z];
      size_t side[2] = {7, 7}, again[2];
      fc_lanes_split(m, probe, use_fixed ? fixed : NULL, nvlink, nside, chunk, msgs, side);
      fc_lanes_split(m, probe, use_fixed ? fixed : NULL, nvlink, nside, chunk, msgs, again);
      ck_assert_mem_eq(side, again, (size_t)nside * sizeof *side);
      size_t at = 0;
      for (int k = 0; k < nside; k++) {
        ck_assert_uint_le(side[k], chunk - at);
        at += side[k];
        ck_assert_msg(side[k] % 16 == 0 || at == chunk, "side lane %d: %zu bytes end at %zu of %zu", k, side[k], at,
                      chunk);
        if (use_fixed && (nvlink || k < nside - 1) && at < chunk)
          ck_assert_double_le(fabs((double)side[k] - fixed[k + 1] * (double)chunk), 16);
      }
      if (!nvlink) ck_assert_uint_eq(at, chunk);
    }
  }
  /* A lone side lane without NVLink: all of it, even without a usable model. */
  const fc_link_model_t none[2] = {model(0, 0, 0, -1), model(0, 0, 0, -1)};
  size_t side[1];
  fc_lanes_split(none, NULL, NULL, 0, 1, 12345, 1, side);
  ck_assert_uint_eq(side[0], 12345);
  /* With NVLink and no usable side model: nothing on the side. */
  const fc_link_model_t nv_only[2] = {model(8, 400000, 0, -1), model(0, 0, 0, -1)};
  fc_lanes_split(nv_only, NULL, NULL, 1, 1, 12345, 2, side);
  ck_assert_uint_eq(side[0], 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("balance");
  TCase *tc = tcase_create("balance");
  tcase_add_test(tc, test_random_links_finish_together);
  tcase_add_test(tc, test_unusable_links_get_nothing);
  tcase_add_test(tc, test_small_messages_take_the_fastest_link);
  tcase_add_test(tc, test_huge_messages);
  tcase_add_test(tc, test_same_inputs_same_split);
  tcase_add_test(tc, test_chunks_cover_each_share_once);
  tcase_add_test(tc, test_links_on_one_port_are_worth_one_port);
  tcase_add_test(tc, test_ring_of_8_gpus);
  tcase_add_test(tc, test_8_gpus_nic_shares_the_gpu_port);
  suite_add_tcase(s, tc);
  TCase *tm = tcase_create("model");
  tcase_add_test(tm, test_fit_recovers_the_model);
  tcase_add_test(tm, test_two_sizes_never_absurd);
  tcase_add_test(tm, test_update_near_alpha_is_bounded);
  tcase_add_test(tm, test_update_follows_a_slow_link_and_its_recovery);
  tcase_add_test(tm, test_cache_round_trip);
  tcase_add_test(tm, test_cache_refuses_bad_files);
  tcase_add_test(tm, test_cache_dir);
  tcase_add_test(tm, test_stage2_keeps_large_operations_only);
  tcase_add_test(tm, test_lanes_stage2);
  tcase_add_test(tm, test_three_lanes_stage2);
  tcase_add_test(tm, test_lane_with_large_alpha_recovers);
  tcase_add_test(tm, test_fixed_cost_learnt_from_several_sizes);
  tcase_add_test(tm, test_lanes_stage2_noisy);
  tcase_add_test(tm, test_lanes_split);
  tcase_add_test(tm, test_probe_share_size);
  tcase_add_test(tm, test_lanes_split_per_call);
  suite_add_tcase(s, tm);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
