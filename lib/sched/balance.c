/* balance.c — a collective's bytes split over the links to a peer, and each share cut into slices.
 * Every rank runs this on the same models and must get the same split (the receiver has to expect
 * what the sender puts on each link), so it is plain arithmetic in a fixed order: no clocks, no
 * randomness, no dependence on anything but the arguments. */
#define _GNU_SOURCE
#include "sched.h"

#include <math.h>

#include "error.h"

static int link_usable(const fc_link_model_t *m, const int *enabled, int i) {
  if (enabled && !enabled[i]) return 0;
  return isfinite(m[i].alpha_us) && isfinite(m[i].beta) && m[i].beta > 0;
}

/* Links behind one port share its bandwidth: in the active set, a group's betas are scaled so that
 * they add up to no more than the port carries: its port_beta where known (a NIC and host staging
 * under one PCIe root port together reach more than either, less than both), else the group's
 * largest beta (what the port carries when the best of them drives it); never less than that
 * largest beta, so a link alone is worth its own model. */
static void effective_betas(const fc_link_model_t *m, const int *active, int n, double *eff) {
  for (int i = 0; i < n; i++) {
    eff[i] = 0;
    if (!active[i]) continue;
    if (m[i].port < 0) {
      eff[i] = m[i].beta;
      continue;
    }
    double cap = 0, sum = 0;
    for (int j = 0; j < n; j++)
      if (active[j] && m[j].port == m[i].port) {
        sum += m[j].beta;
        cap = fmax(cap, m[j].beta);
        if (isfinite(m[j].port_beta)) cap = fmax(cap, m[j].port_beta);
      }
    eff[i] = sum > cap ? m[i].beta * (cap / sum) : m[i].beta;
  }
}

/* The usable link that alone finishes first (ties: the lowest index); -1 when none is usable. */
static int fastest_single(const fc_link_model_t *m, const int *enabled, int n, size_t bytes, double *t_out) {
  int best = -1;
  double best_t = INFINITY;
  for (int i = 0; i < n; i++) {
    if (!link_usable(m, enabled, i)) continue;
    const double t = fc_cost_predict(&m[i], (double)bytes);
    if (best < 0 || t < best_t) best = i, best_t = t;
  }
  *t_out = best_t;
  return best;
}

/* Water-filling over the active set: the common finish time T and each link's real-valued share.
 * Returns the index of the link furthest under its threshold (max(min_bytes, align)), or -1 when
 * every active link clears it.  Ties go to the higher index, so that low indices are kept. */
static int water_fill(const fc_link_model_t *m, const int *active, int n, size_t bytes, size_t align, double *eff,
                      double *x, double *T_out) {
  effective_betas(m, active, n, eff);
  double num = (double)bytes, den = 0;
  for (int i = 0; i < n; i++)
    if (active[i]) num += m[i].alpha_us * eff[i], den += eff[i];
  const double T = num / den;
  int worst = -1;
  double worst_key = 0;
  for (int i = 0; i < n; i++) {
    x[i] = 0;
    if (!active[i]) continue;
    x[i] = (T - m[i].alpha_us) * eff[i];
    const double threshold = fmax(m[i].min_bytes, (double)align);
    if (m[i].alpha_us < T && x[i] >= threshold) continue;
    /* Relative to the threshold, so that links with different min_bytes compare fairly; a link at
     * or over T has a share <= 0 and always comes before one that is merely small. */
    const double key = m[i].alpha_us >= T ? -INFINITY : x[i] / threshold;
    if (worst < 0 || key <= worst_key) worst = i, worst_key = key;
  }
  *T_out = T;
  return worst;
}

/* Real-valued shares to align multiples that add up to bytes: each rounded down (clamped to what is
 * left, as doubles are not exact past 2^53), the remainder to the largest effective beta. */
static void round_shares(const int *active, int n, size_t bytes, size_t align, const double *eff, const double *x,
                         size_t *shares) {
  size_t left = bytes;
  int sink = -1;
  for (int i = 0; i < n; i++) {
    shares[i] = 0;
    if (!active[i]) continue;
    if (sink < 0 || eff[i] > eff[sink]) sink = i;
    const double units = floor(x[i] / (double)align);
    const size_t max_units = left / align;
    const size_t u = units <= 0 ? 0 : units >= (double)max_units ? max_units : (size_t)units;
    shares[i] = u * align;
    left -= shares[i];
  }
  shares[sink] += left;
}

flexcoll_result_t fc_balance(const fc_link_model_t *models, const int *enabled, int n, size_t bytes, size_t align,
                             size_t *shares, double *finish_us) {
  if (!models || !shares || n < 0 || n > FC_MAX_LINKS)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "fc_balance: %d links (at most %d) or a NULL array", n,
                    FC_MAX_LINKS);
  for (int i = 0; i < n; i++) shares[i] = 0;
  if (finish_us) *finish_us = 0;
  if (bytes == 0) return FLEXCOLL_SUCCESS;
  if (align == 0) align = 1;

  double single_t;
  const int single = fastest_single(models, enabled, n, bytes, &single_t);
  if (single < 0) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "fc_balance: none of %d links can carry bytes", n);

  int active[FC_MAX_LINKS], count = 0;
  for (int i = 0; i < n; i++) count += active[i] = link_usable(models, enabled, i);
  double eff[FC_MAX_LINKS], x[FC_MAX_LINKS], T = INFINITY;
  while (bytes >= align && count > 1) {
    const int worst = water_fill(models, active, n, bytes, align, eff, x, &T);
    if (worst < 0) break;
    active[worst] = 0, count--;
  }
  /* Links sharing a port (or min_bytes thresholds) can leave a split slower than the best link
   * alone; then the message stays on that one link. */
  if (bytes < align || count <= 1 || !(T < single_t)) {
    shares[single] = bytes;
    if (finish_us) *finish_us = single_t;
    return FLEXCOLL_SUCCESS;
  }
  round_shares(active, n, bytes, align, eff, x, shares);
  if (finish_us) {
    double finish = 0;
    for (int i = 0; i < n; i++)
      if (shares[i]) finish = fmax(finish, models[i].alpha_us + (double)shares[i] / eff[i]);
    *finish_us = finish;
  }
  return FLEXCOLL_SUCCESS;
}

size_t fc_chunk_count(size_t share, size_t slice) {
  if (share == 0) return 0;
  if (slice == 0) return 1;
  return share / slice + (share % slice != 0);
}

void fc_chunk_get(size_t share, size_t slice, size_t k, size_t *off, size_t *len) {
  /* Past the last slice: an empty one at the end, never an offset outside the share. */
  if (k >= fc_chunk_count(share, slice)) {
    *off = share, *len = 0;
    return;
  }
  if (slice == 0) {
    *off = 0, *len = share;
    return;
  }
  *off = k * slice;
  *len = share - *off < slice ? share - *off : slice;
}
