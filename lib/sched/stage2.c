/* stage2.c — stage 2 of the link models: measured transfers fold into the models, smoothed, and
 * the split follows, with a probe share for a link left idle.  One rule for the host links
 * (links.c) and the ring kernels' device lanes (lib/gpu/pcie.c).  Every rank applies it to the
 * same sums of everyone's measurements, so it is plain arithmetic in a fixed order: no clocks,
 * no I/O, nothing but the arguments. */
#define _GNU_SOURCE
#include "sched.h"

#include <math.h>
#include <stdint.h>

/* One exchange's size alone cannot tell a fixed cost from a rate: with a fixed cost above the
 * model's, every part's excess time counts as slow transfer, and a link that carried small parts
 * (a probe, a recovery) is held to them for many exchanges.  Parts of several sizes can: the
 * least-squares line through the history, where the sizes spread by at least MIN_SPREAD of their
 * mean (closer, the timer's noise decides the slope). */
#define MIN_SPREAD 0.2
#define CHANGED 2.0

static void history_add(fc_stage2_history_t *h, const fc_link_model_t *m, double bytes, double us) {
  const double predicted = fc_cost_predict(m, bytes);
  if (us > CHANGED * predicted || us * CHANGED < predicted) *h = (fc_stage2_history_t){0};
  const double keep = 1 - FC_STAGE2_WEIGHT, x = bytes / (1 << 20);
  h->w = keep * h->w + 1;
  h->x = keep * h->x + x;
  h->y = keep * h->y + us;
  h->xx = keep * h->xx + x * x;
  h->xy = keep * h->xy + x * us;
}

static int history_fit(const fc_stage2_history_t *h, fc_link_model_t *fit) {
  if (!(h->w > 1)) return 0;
  const double mx = h->x / h->w, my = h->y / h->w;
  const double sxx = h->xx / h->w - mx * mx, sxy = h->xy / h->w - mx * my;
  if (!(mx > 0) || !(sxx >= MIN_SPREAD * MIN_SPREAD * mx * mx)) return 0;
  const double slope = sxy / sxx, alpha = my - slope * mx;
  if (!(alpha >= 0) || !(slope * mx >= my / 2) || !isfinite(1 / slope)) return 0;
  fit->alpha_us = alpha;
  fit->beta = (1 << 20) / slope;
  return 1;
}

void fc_stage2_update(fc_link_model_t *model, int *idle, int *probe, fc_stage2_history_t *hist, const double *floor,
                      int n, const double *parts, const double *bytes, const double *us) {
  for (int i = 0; i < n; i++) {
    fc_link_model_t *m = &model[i];
    probe[i] = 0;
    if (parts[i] > 0) {
      const double part_bytes = bytes[i] / parts[i], part_us = us[i] / parts[i];
      fc_link_model_t fit;
      if (hist) history_add(&hist[i], m, part_bytes, part_us);
      if (hist && history_fit(&hist[i], &fit)) {
        const double w = FC_STAGE2_WEIGHT;
        m->alpha_us = (1 - w) * m->alpha_us + w * fit.alpha_us;
        m->beta = (1 - w) * m->beta + w * fit.beta;
      } else {
        /* A whole part took less than the fixed cost: the calibration overrated it. */
        if (part_us <= m->alpha_us) m->alpha_us = part_us / 2;
        fc_cost_update(m, part_bytes, part_us, FC_STAGE2_WEIGHT);
      }
      idle[i] = 0;
    } else if (++idle[i] >= FC_STAGE2_PROBE_AFTER) {
      probe[i] = 1;
      idle[i] = 0;
    }
    m->min_bytes = m->alpha_us * m->beta;
    if (floor && m->min_bytes < floor[i]) m->min_bytes = floor[i];
  }
}

flexcoll_result_t fc_stage2_split(const fc_link_model_t *model, const int *enabled, const int *probe,
                                  fc_probe_size_t how, int n, size_t bytes, size_t align, size_t *shares) {
  flexcoll_result_t res = fc_balance(model, enabled, n, bytes, align, shares, NULL);
  if (res != FLEXCOLL_SUCCESS || !probe) return res;
  if (align == 0) align = 1;
  /* Probe shares come out of the largest share. */
  for (int i = 0; i < n; i++) {
    if (!probe[i] || shares[i] || (enabled && !enabled[i])) continue;
    const double least = (double)bytes / FC_PROBE_PART, most_worth = (double)bytes / FC_PROBE_MAX_PART;
    const double want =
        how == FC_PROBE_FIXED_COST && model[i].min_bytes > least ? fmin(model[i].min_bytes, most_worth) : least;
    const size_t give = (size_t)want / align * align;
    if (!give) continue;
    int most = 0;
    for (int j = 1; j < n; j++)
      if (shares[j] > shares[most]) most = j;
    if (shares[most] < 2 * give) continue;
    shares[most] -= give;
    shares[i] = give;
  }
  return FLEXCOLL_SUCCESS;
}

void fc_stage2_sum(const double *all, int nranks, int n, double *parts, double *bytes, double *us) {
  const size_t per = (size_t)n * 3;
  for (int i = 0; i < n; i++) parts[i] = bytes[i] = us[i] = 0;
  for (int q = 0; q < nranks; q++)
    for (int i = 0; i < n; i++) {
      parts[i] += all[(size_t)q * per + 3 * (size_t)i];
      bytes[i] += all[(size_t)q * per + 3 * (size_t)i + 1];
      us[i] += all[(size_t)q * per + 3 * (size_t)i + 2];
    }
}

void fc_lanes_split(const fc_link_model_t *model, const int *probe, const double *fixed, int nvlink, int nside,
                    size_t chunk, unsigned msgs, size_t *side) {
  for (int k = 0; k < nside; k++) side[k] = 0;
  if (nside < 1 || nside > FC_MAX_LINKS - 1 || chunk == 0) return;
  if (msgs == 0 || chunk > SIZE_MAX / msgs / 2) msgs = 1;
  size_t shares[FC_MAX_LINKS] = {0};
  if (fixed) {
    for (int L = 1; L <= nside; L++) shares[L] = fixed[L] > 0 ? (size_t)((double)chunk * fixed[L]) : 0;
  } else if (nvlink || nside > 1) {
    int enabled[FC_MAX_LINKS] = {nvlink != 0};
    for (int L = 1; L <= nside; L++) enabled[L] = 1;
    if (fc_stage2_split(model, enabled, probe, FC_PROBE_FIXED_COST, 1 + nside, chunk * msgs, 16 * (size_t)msgs,
                        shares) != FLEXCOLL_SUCCESS) {
      if (nvlink) return; /* no usable model: NVLink alone */
      shares[1] = chunk;  /* no NVLink lane: the first side lane */
    } else {
      for (int L = 0; L <= nside; L++) shares[L] /= msgs;
    }
  }
  /* Each side lane's part starts where the previous one's ends, so each is a multiple of 16
   * except one that reaches the chunk's end; without an NVLink lane the last one takes the rest. */
  size_t left = chunk;
  for (int k = 0; k < nside; k++) {
    const size_t want = !nvlink && k == nside - 1 ? left : shares[k + 1];
    side[k] = want >= left ? left : want / 16 * 16;
    left -= side[k];
  }
}
