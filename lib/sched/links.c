/* links.c — a communicator's links and their shared cost models.
 *
 * Hosts: the ranks' host names are all-gathered first; ranks with the same name share a host.
 * Open: every link FLEXCOLL_LINKS names is opened on every rank (collective), toward the peers it
 * can reach (shm: the ranks of this host; tcp and rdma: every rank), and kept only where it works
 * on all ranks (rdma, pairwise: between the ranks where it works, if two or more); every pair of
 * ranks must then have a link.  Transfers between two ranks use the
 * links of that pair only (fc_links_split).  Stage 1: with two links or more, the models come
 * from the calibration cache when every rank has it, else from a short calibration (a ring
 * exchange per link and size, around the ranks the link joins), averaged over the ranks that
 * measured them so that all ranks hold the same numbers.  Stage 2: the executors
 * record per-link part times; every FC_STAGE2_EVERY large collectives the ranks exchange them over
 * the bootstrap and apply the same update, so the split follows a link that slows down and comes
 * back when it recovers, on every rank alike. */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "clock.h"
#include "comm.h"
#include "error.h"
#include "log.h"
#include "param.h"
#include "sched.h"
#include "topo.h"

/* Host collectives from this size (bytes per rank) feed stage 2 (its rule and constants:
 * stage2.c, sched.h). */
#define FC_STAGE2_MIN_BYTES (1u << 20)

/* rdma last: where no device exists it is left out and the others are as before. */
static const fc_link_ops_t *const registry[] = {&fc_link_shm, &fc_link_tcp, &fc_link_rdma};
#define FC_NREGISTRY ((int)(sizeof registry / sizeof registry[0]))
/* Device links take the table as the engine moves onto it; they may be named already. */
static const char *const device_links[] = {"nvlink", "pcie"};

int fc_link_name_known(const char *name) {
  for (int i = 0; i < FC_NREGISTRY; i++)
    if (!strcmp(registry[i]->name, name)) return 1;
  for (size_t i = 0; i < sizeof device_links / sizeof device_links[0]; i++)
    if (!strcmp(device_links[i], name)) return 1;
  return 0;
}

int fc_links_names(const char *name) {
  const char *s = fc_param_str("FLEXCOLL_LINKS", NULL);
  if (!s || !*s) return 1;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save))
    if (!strcmp(tok, name)) return 1;
  return 0;
}

/* FLEXCOLL_LINKS as a mask over the registry; an unknown name is refused. */
static flexcoll_result_t wanted_links(struct flexcoll_comm *comm, int *mask) {
  const char *s = fc_param_str("FLEXCOLL_LINKS", NULL);
  *mask = 0;
  if (!s) {
    *mask = (1 << FC_NREGISTRY) - 1;
    return FLEXCOLL_SUCCESS;
  }
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    if (!fc_link_name_known(tok))
      return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                      "FLEXCOLL_LINKS=%s: \"%s\" is not a link (nvlink, pcie, rdma, shm, tcp)", s, tok);
    for (int i = 0; i < FC_NREGISTRY; i++)
      if (!strcmp(registry[i]->name, tok)) *mask |= 1 << i;
  }
  return FLEXCOLL_SUCCESS;
}

/* FLEXCOLL_LINK_SHARES=name:fraction,...: fixed shares instead of the balancer (tests, studies). */
static flexcoll_result_t fixed_shares(struct flexcoll_comm *comm, fc_links_t *l) {
  const char *s = fc_param_str("FLEXCOLL_LINK_SHARES", NULL);
  if (!s) return FLEXCOLL_SUCCESS;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  double sum = 0;
  int fixes_host = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    char *colon = strchr(tok, ':'), *end = NULL;
    double f = colon ? strtod(colon + 1, &end) : NAN;
    if (!colon || end == colon + 1 || *end || !(f >= 0 && f <= 1))
      return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_LINK_SHARES=%s: \"%s\" is not name:fraction in [0, 1]", s,
                      tok);
    *colon = 0;
    /* The device links' fractions are the ring kernels' (lib/gpu/pcie.c), on a communicator
     * that may have a GPU; elsewhere they name a link that is not open. */
    if ((!strcmp(tok, "nvlink") || !strcmp(tok, "pcie")) && comm->init_config.cuda_device != -1 && fc_gpu_count() > 0)
      continue;
    int found = 0;
    for (int i = 0; i < l->n; i++)
      if (!strcmp(l->link[i].ops->name, tok)) { l->fixed[i] = f; found = 1; }
    if (!found)
      return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_LINK_SHARES=%s: \"%s\" is not an open link here", s, tok);
    sum += f;
    fixes_host = 1;
  }
  if (sum == 0 && !fixes_host) return FLEXCOLL_SUCCESS; /* device links only */
  if (!(sum > 0)) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_LINK_SHARES=%s: the fractions sum to 0", s);
  for (int i = 0; i < l->n; i++) l->fixed[i] /= sum;
  l->fixed_set = 1;
  return FLEXCOLL_SUCCESS;
}

/* ---- hosts ------------------------------------------------------------------------------------ */

/* All-gather the host names; number the hosts by their lowest rank; the ranks host by host. */
static flexcoll_result_t find_hosts(struct flexcoll_comm *comm, fc_links_t *l) {
  const int n = comm->nranks;
  char(*names)[FC_HOST_NAME_LEN] = calloc((size_t)n, sizeof *names);
  l->host = calloc(3 * (size_t)n, sizeof *l->host);
  if (!names || !l->host) {
    free(names);
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  }
  l->order = l->host + n;
  l->pos = l->order + n;
  fc_topo_host_name(names[comm->rank], FC_HOST_NAME_LEN);
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, names, FC_HOST_NAME_LEN);
  if (res != FLEXCOLL_SUCCESS) {
    free(names);
    return res;
  }
  l->nhosts = 0;
  for (int q = 0; q < n; q++) {
    names[q][FC_HOST_NAME_LEN - 1] = 0; /* a peer's bytes: terminated here whatever it sent */
    l->host[q] = -1;
    for (int p = 0; p < q && l->host[q] < 0; p++)
      if (!strcmp(names[p], names[q])) l->host[q] = l->host[p];
    if (l->host[q] < 0) l->host[q] = l->nhosts++;
  }
  l->host_name = calloc((size_t)l->nhosts, sizeof *l->host_name);
  if (!l->host_name) {
    free(names);
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  }
  int k = 0;
  for (int h = 0; h < l->nhosts; h++)
    for (int q = 0; q < n; q++)
      if (l->host[q] == h) {
        if (k == 0 || l->host[l->order[k - 1]] != h) memcpy(l->host_name[h], names[q], FC_HOST_NAME_LEN);
        l->order[k] = q;
        l->pos[q] = k++;
      }
  free(names);
  return FLEXCOLL_SUCCESS;
}

int fc_links_pair_kind(const fc_links_t *l, int p, int q) {
  return l->host && p >= 0 && q >= 0 && l->host[p] != l->host[q] ? FC_PAIRS_BETWEEN_HOSTS : FC_PAIRS_WITHIN_HOST;
}

int fc_links_joins(const fc_links_t *l, int i, int p, int q) {
  /* Every link joins a rank to itself (send/recv to self, as before links were per pair), where
   * the rank has it. */
  const unsigned char *on = l->link[i].on;
  return (!l->link[i].ops->same_host || l->host[p] == l->host[q]) && (!on || (on[p] && on[q]));
}

int fc_links_device_memory(const fc_links_t *l, int p, int q) {
  for (int i = 0; i < l->n; i++)
    if (!l->link[i].off && l->link[i].device_memory && fc_links_joins(l, i, p, q)) return 1;
  return 0;
}

/* "0 3 5" (the ranks of host h, ascending), cut short with "..." where buf is too small. */
static void host_ranks(const fc_links_t *l, int nranks, int h, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (int q = 0; q < nranks; q++) {
    if (l->host[q] != h) continue;
    int w = snprintf(buf + used, len - used, "%s%d", used ? " " : "", q);
    if (w < 0 || (size_t)w >= len - used) {
      snprintf(buf + (len > 4 ? len - 4 : 0), len > 4 ? 4 : len, "...");
      return;
    }
    used += (size_t)w;
  }
}

/* One INFO line per pair of hosts that involves this rank's host: which links join them. */
static void log_hosts(struct flexcoll_comm *comm, const fc_links_t *l) {
  const int n = comm->nranks, mine = l->host[comm->rank];
  for (int a = 0; a < l->nhosts; a++)
    for (int b = a; b < l->nhosts; b++) {
      if (a != mine && b != mine) continue;
      /* Two ranks standing for the hosts (two of host a's when a == b). */
      int p = -1, q = -1;
      for (int r = 0; r < n; r++) {
        if (p < 0 && l->host[r] == a) p = r;
        else if (q < 0 && l->host[r] == b) q = r;
      }
      if (p < 0 || q < 0) continue; /* a host of one rank has nothing within it */
      char over[96] = "", ra[128], rb[128];
      for (int i = 0; i < l->n; i++)
        if (fc_links_joins(l, i, p, q)) {
          size_t used = strlen(over);
          snprintf(over + used, sizeof over - used, "%s%s", used ? ", " : "", l->link[i].ops->name);
        }
      host_ranks(l, n, a, ra, sizeof ra);
      host_ranks(l, n, b, rb, sizeof rb);
      if (a == b)
        FC_INFO(FC_SUB_SCHED, "links within host %s (ranks %s) over %s", l->host_name[a], ra, over);
      else
        FC_INFO(FC_SUB_SCHED, "links between hosts %s (ranks %s) and %s (ranks %s) over %s", l->host_name[a], ra,
                l->host_name[b], rb, over);
    }
}

unsigned fc_links_device_mask(const fc_links_t *l) {
  unsigned mask = 0;
  for (int i = 0; i < l->n; i++)
    if (!l->link[i].off && l->link[i].device_memory) mask |= 1u << i;
  return mask;
}

void fc_links_agree_device_memory(fc_links_t *l, int nranks, const unsigned *masks) {
  for (int i = 0; i < l->n; i++) {
    const unsigned char *on = l->link[i].on;
    int all = !l->link[i].off;
    for (int q = 0; q < nranks; q++)
      if ((!on || on[q]) && !(masks[q] >> i & 1)) all = 0;
    l->link[i].device_memory = all;
  }
}

/* Each link's device_memory, ANDed over the ranks that have the link: fc_links_split and the
 * device paths decide by it on both ends of a pair, so it must be the same everywhere, whatever
 * a transport's open found on its own rank (rdma's is local: a rank without a GPU has none). */
static flexcoll_result_t agree_device_memory(struct flexcoll_comm *comm, fc_links_t *l) {
  unsigned *masks = calloc((size_t)comm->nranks, sizeof *masks);
  if (!masks) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  masks[comm->rank] = fc_links_device_mask(l);
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, masks, sizeof *masks);
  if (res == FLEXCOLL_SUCCESS) fc_links_agree_device_memory(l, comm->nranks, masks);
  free(masks);
  return res;
}

/* Every pair of ranks has a link (the same check on every rank: hosts and links are agreed). */
static flexcoll_result_t check_pairs(struct flexcoll_comm *comm, const fc_links_t *l, const char *dropped) {
  for (int p = 0; p < comm->nranks; p++)
    for (int q = p + 1; q < comm->nranks; q++) {
      int joined = 0;
      for (int i = 0; i < l->n && !joined; i++) joined = fc_links_joins(l, i, p, q);
      if (joined) continue;
      const char *set = fc_param_str("FLEXCOLL_LINKS", NULL);
      char open[64] = "";
      for (int i = 0; i < l->n; i++) {
        size_t used = strlen(open);
        snprintf(open + used, sizeof open - used, "%s%s", used ? "," : "", l->link[i].ops->name);
      }
      /* Named by the user: a setting that cannot work here; by default: links that failed. */
      return fc_error(comm, set ? FLEXCOLL_INVALID_ARGUMENT : FLEXCOLL_SYSTEM_ERROR,
                      "no link of FLEXCOLL_LINKS=%s joins rank %d (host %s) and rank %d (host %s): open are %s, and shm "
                      "joins the ranks of one host only%s%s",
                      set ? set : "shm,tcp,rdma", p, l->host_name[l->host[p]], q, l->host_name[l->host[q]], open,
                      *dropped ? "; left out: " : "", dropped);
    }
  return FLEXCOLL_SUCCESS;
}

/* A pairwise link that some ranks lack (on): kept for the pairs of ranks that both have it.  A
 * rank without it closes its side now and keeps the entry off (links are numbered alike on
 * every rank); the others stop reaching those ranks over it. */
static void keep_where_on(struct flexcoll_comm *comm, fc_links_t *l, fc_link_t *link, unsigned char *on, int usable,
                          const char *why) {
  char without[128] = "";
  for (int q = 0, used = 0; q < comm->nranks; q++)
    if (!on[q] && used < (int)sizeof without - 8)
      used += snprintf(without + used, sizeof without - (size_t)used, "%s%d", used ? " " : "", q);
  link->on = on;
  if (!usable) {
    link->ops->close(comm, link, 1);
    link->state = NULL;
    link->off = 1;
    memset(link->reach, 0, (size_t)comm->nranks);
    FC_INFO(FC_SUB_SCHED, "link %s not on this rank (%s): ranks %s and the others use other links", link->ops->name,
            why[0] ? why : "unusable here", without);
  } else {
    for (int q = 0; q < comm->nranks; q++) link->reach[q] &= (unsigned char)fc_links_joins(l, l->n, comm->rank, q);
    FC_INFO(FC_SUB_SCHED, "link %s kept between the ranks that have it: not on rank(s) %s, whose pairs use other links",
            link->ops->name, without);
  }
}

/* Open rail `rail` of registry entry r; keep it when every rank could (*kept), or, for a
 * pairwise link, where two ranks or more could.  Collective. */
static flexcoll_result_t open_rail(struct flexcoll_comm *comm, fc_links_t *l, int r, int rail, char *dropped,
                                   size_t dlen, int *kept) {
  fc_link_t *link = &l->link[l->n];
  *kept = 0;
  memset(link, 0, sizeof *link);
  link->ops = registry[r];
  link->rail = rail;
  /* A host link where every rank has a host of its own joins nobody: not opened (every rank
   * decides alike from the hosts). */
  if (link->ops->same_host && l->nhosts == comm->nranks && comm->nranks > 1) {
    FC_INFO(FC_SUB_SCHED, "link %s left out: every rank is on a host of its own", registry[r]->name);
    size_t used = strlen(dropped);
    snprintf(dropped + used, dlen - used, "%s%s: every rank is on a host of its own", used ? "; " : "", registry[r]->name);
    return FLEXCOLL_SUCCESS;
  }
  link->reach = calloc((size_t)comm->nranks, 1);
  if (!link->reach) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  for (int q = 0; q < comm->nranks; q++) link->reach[q] = (unsigned char)fc_links_joins(l, l->n, comm->rank, q);
  int usable = 0;
  char why[200] = "";
  flexcoll_result_t res = link->ops->open(comm, link, &usable, why, sizeof why);
  if (res != FLEXCOLL_SUCCESS) {
    link->ops->close(comm, link, 1);
    free(link->reach);
    link->reach = NULL;
    return res;
  }
  int first_not = -1, have = 0;
  unsigned char *on = NULL;
  if (link->ops->pairwise) {
    /* Which ranks have it: kept between those where two or more do. */
    on = calloc((size_t)comm->nranks, 1);
    if (!on) res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
    else on[comm->rank] = (unsigned char)(usable != 0), res = fc_bootstrap_allgather(comm->bootstrap, on, 1);
    for (int q = 0; q < comm->nranks && res == FLEXCOLL_SUCCESS; q++) {
      have += on[q];
      if (!on[q] && first_not < 0) first_not = q;
    }
  } else {
    res = fc_bootstrap_agree(comm->bootstrap, usable, &first_not);
  }
  const int everywhere = first_not < 0, somewhere = on && have >= 2 && !everywhere;
  if (!everywhere && usable) snprintf(why, sizeof why, "unusable on rank %d", first_not);
  if (res == FLEXCOLL_SUCCESS && (everywhere || somewhere))
    link->stats = calloc((size_t)comm->nranks, sizeof *link->stats);
  if (res == FLEXCOLL_SUCCESS && somewhere && link->stats) {
    keep_where_on(comm, l, link, on, usable, why);
    l->n++;
    *kept = 1;
    return FLEXCOLL_SUCCESS;
  }
  free(on);
  if (res != FLEXCOLL_SUCCESS || !everywhere || !link->stats) {
    link->ops->close(comm, link, 1);
    free(link->stats);
    free(link->reach);
    link->stats = NULL;
    link->reach = NULL;
    if (res == FLEXCOLL_SUCCESS && everywhere) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
    if (res == FLEXCOLL_SUCCESS) {
      FC_INFO(FC_SUB_SCHED, "link %s left out: %s", registry[r]->name, why);
      size_t used = strlen(dropped);
      snprintf(dropped + used, dlen - used, "%s%s: %s", used ? "; " : "", registry[r]->name, why);
    }
    return res;
  }
  l->n++;
  *kept = 1;
  return FLEXCOLL_SUCCESS;
}

/* Registry entry r, and its further rails (several NICs) as links of their own: as many as every
 * rank has, each its own port in the model where on every rank its device shares no PCIe port with
 * an earlier rail's.  Collective. */
static flexcoll_result_t open_one(struct flexcoll_comm *comm, fc_links_t *l, int r, char *dropped, size_t dlen) {
  int kept = 0;
  FC_CHECK(open_rail(comm, l, r, 0, dropped, dlen, &kept));
  if (!kept || !registry[r]->rails) return FLEXCOLL_SUCCESS;
  const int n = comm->nranks, first = l->n - 1;
  unsigned char *all = calloc((size_t)n, FC_MAX_LINKS + 1);
  if (!all) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  unsigned char *mine = all + (size_t)comm->rank * (FC_MAX_LINKS + 1);
  /* As many rails as the rank with the most: a pairwise transport keeps rail k between the
   * ranks that have it (rails of their own ports only where every one of those has its own);
   * another, between all or none, as many as the rank with the fewest. */
  if (!l->link[first].off) mine[0] = (unsigned char)registry[r]->rails(&l->link[first], mine + 1, FC_MAX_LINKS);
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, all, FC_MAX_LINKS + 1);
  int most = 0, least = FC_MAX_LINKS;
  for (int q = 0; q < n && res == FLEXCOLL_SUCCESS; q++) {
    const int theirs = all[(size_t)q * (FC_MAX_LINKS + 1)];
    most = theirs > most ? theirs : most;
    if (!l->link[first].on || l->link[first].on[q]) least = theirs < least ? theirs : least;
  }
  int rails = registry[r]->pairwise ? most : least;
  if (rails > FC_MAX_LINKS - first) rails = FC_MAX_LINKS - first;
  if (res == FLEXCOLL_SUCCESS && rails > 1)
    FC_INFO(FC_SUB_SCHED, "link %s: %d rails (devices) on %s", registry[r]->name, rails,
            least == most ? "every rank" : "the ranks with the most");
  for (int k = 1; k < rails && res == FLEXCOLL_SUCCESS; k++) {
    res = open_rail(comm, l, r, k, dropped, dlen, &kept);
    if (res != FLEXCOLL_SUCCESS || !kept) break;
    fc_link_t *rail = &l->link[l->n - 1];
    int own = 1;
    for (int q = 0; q < n; q++)
      if (!rail->on || rail->on[q]) own &= all[(size_t)q * (FC_MAX_LINKS + 1) + 1 + (size_t)k];
    rail->own_port = own;
  }
  free(all);
  return res;
}

/* ---- stage 1: calibration --------------------------------------------------------------------- */

/* Link i's calibration ring: the ranks it joins with this one (its host's only where within), in
 * l->order, and this rank's neighbours there.  0 when it joins nobody (a host of one rank). */
static int cal_ring(const fc_links_t *l, int i, int within, int me, int n, int *next, int *prev) {
  *next = *prev = -1;
  for (int s = 1; s < n && *next < 0; s++) {
    const int q = l->order[(l->pos[me] + s) % n];
    if (fc_links_joins(l, i, me, q) && (!within || l->host[q] == l->host[me])) *next = q;
  }
  for (int s = 1; s < n && *prev < 0; s++) {
    const int q = l->order[(l->pos[me] - s + n) % n];
    if (fc_links_joins(l, i, me, q) && (!within || l->host[q] == l->host[me])) *prev = q;
  }
  return *next >= 0 && *prev >= 0;
}

static const size_t cal_sizes[] = {8 << 10, 2 << 20};
enum { CAL_SIZES = sizeof cal_sizes / sizeof cal_sizes[0], CAL_TRIES = 5 };

/* Microseconds of one ring exchange of `bytes` on link i: send to next, receive from prev.  Tags
 * above every collective's and point-to-point message number. */
static flexcoll_result_t ring_exchange(struct flexcoll_comm *comm, fc_link_t *link, int next, int prev, char *sbuf,
                                       char *rbuf, size_t bytes, int k, double *us) {
  uint64_t tag_out = ((uint64_t)(uint16_t)comm->rank << 48) | (1ull << 47) | (0x7fffffffull << 16) | (uint64_t)k;
  uint64_t tag_in = ((uint64_t)(uint16_t)prev << 48) | (1ull << 47) | (0x7fffffffull << 16) | (uint64_t)k;
  fc_link_req_t sreq = NULL, rreq = NULL;
  double t0 = fc_now_us();
  FC_CHECK(link->ops->irecv(comm, link, prev, rbuf, bytes, tag_in, &rreq));
  FC_CHECK(link->ops->isend(comm, link, next, sbuf, bytes, tag_out, &sreq));
  int sdone = 0, rdone = 0;
  for (unsigned spins = 0; !sdone || !rdone; spins++) {
    /* Ranks may outnumber cores: give the peer we wait for a chance to run. */
    if (!link->ops->progress(link) && spins > 64) sched_yield();
    if (!sdone) FC_CHECK(link->ops->test(comm, link, &sreq, SIZE_MAX, &sdone));
    if (!rdone) FC_CHECK(link->ops->test(comm, link, &rreq, bytes, &rdone));
    if (fc_now_us() - t0 > (double)comm->timeout_ms * 1e3) {
      link->ops->cancel(link, &sreq);
      link->ops->cancel(link, &rreq);
      return fc_error(comm, FLEXCOLL_TIMEOUT, "link %s calibration: no answer from rank %d", link->ops->name, prev);
    }
  }
  *us = fc_now_us() - t0;
  return FLEXCOLL_SUCCESS;
}

/* Fit link i's model from ring exchanges of a few sizes (best of a few tries each) with next and
 * prev, tags from *k on. */
static flexcoll_result_t measure_ring(struct flexcoll_comm *comm, fc_link_t *link, int next, int prev, char *sbuf,
                                      char *rbuf, int *k, fc_link_model_t *m) {
  /* Two sizes, the best of a few tries each: the fixed cost is the small one's time, the bandwidth
   * the large one's rate.  Conservative (the fixed cost counts twice at large sizes) but never
   * absurd: on a busy host a fit through the two points turned one slow small exchange into a
   * bandwidth of 81 GB/s for TCP.  Stage 2 refines both from real transfers. */
  double y[CAL_SIZES], warm;
  /* The first message of a link sets up its connection: not part of the model. */
  FC_CHECK(ring_exchange(comm, link, next, prev, sbuf, rbuf, 1, (*k)++, &warm));
  for (int s = 0; s < CAL_SIZES; s++) {
    y[s] = INFINITY;
    for (int t = 0; t < CAL_TRIES; t++) {
      double us = INFINITY;
      FC_CHECK(ring_exchange(comm, link, next, prev, sbuf, rbuf, cal_sizes[s], (*k)++, &us));
      if (us < y[s]) y[s] = us;
    }
  }
  *m = (fc_link_model_t){.alpha_us = y[0], .beta = (double)cal_sizes[CAL_SIZES - 1] / y[CAL_SIZES - 1], .port = -1};
  return FLEXCOLL_SUCCESS;
}

/* Every link's models from ring exchanges into cal[kind][i], has[kind][i] where this rank measured
 * that kind of pair (0: it has nothing to add to that average).  On one host one ring per link
 * (pairs within a host); on several, a ring of each host's ranks (within) and, for links between
 * hosts, a ring of all ranks host by host, which measures pairs between hosts at the ranks whose
 * ring neighbour is on another host (that pair's time dominates their exchange). */
static flexcoll_result_t calibrate(struct flexcoll_comm *comm, fc_links_t *l, fc_link_model_t cal[][FC_MAX_LINKS],
                                   int has[][FC_MAX_LINKS]) {
  char *sbuf = malloc(cal_sizes[CAL_SIZES - 1]), *rbuf = malloc(cal_sizes[CAL_SIZES - 1]);
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  if (!sbuf || !rbuf) res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory for link calibration");
  else memset(sbuf, 0x5a, cal_sizes[CAL_SIZES - 1]);
  const int me = comm->rank, n = comm->nranks;
  for (int i = 0; i < l->n && res == FLEXCOLL_SUCCESS; i++)
    for (int ring = 0; ring < 2 && res == FLEXCOLL_SUCCESS; ring++) {
      /* Each link and ring its own tag numbers: ranks that skip one stay in step with those that do not. */
      int k = (2 * i + ring) * (1 + CAL_SIZES * CAL_TRIES), next, prev;
      const int within = l->nhosts > 1 && ring == 0;
      if (ring == 1 && (l->nhosts == 1 || l->link[i].ops->same_host)) continue;
      if (!cal_ring(l, i, within, me, n, &next, &prev)) continue;
      fc_link_model_t m;
      res = measure_ring(comm, &l->link[i], next, prev, sbuf, rbuf, &k, &m);
      const int kind = ring == 0 ? FC_PAIRS_WITHIN_HOST
                       : fc_links_pair_kind(l, me, next) == FC_PAIRS_BETWEEN_HOSTS ||
                               fc_links_pair_kind(l, prev, me) == FC_PAIRS_BETWEEN_HOSTS
                           ? FC_PAIRS_BETWEEN_HOSTS
                           : -1;
      if (res == FLEXCOLL_SUCCESS && kind >= 0) cal[kind][i] = m, has[kind][i] = 1;
    }
  free(sbuf);
  free(rbuf);
  return res;
}

/* The cache key of the models of one kind of pair: the ranks' hosts, the rank count, the links and
 * FLEXCOLL_UCX_PEER_FAILURE, the same on every rank.  On one host host-n<ranks>-<hash>-<links>;
 * on several hosts-... for pairs within a host and between-... for pairs between hosts (keys
 * before the models told the kinds apart held one average of both: not taken for either). */
static flexcoll_result_t cache_key(struct flexcoll_comm *comm, const fc_links_t *l, int kind, char *key, size_t len) {
  uint64_t *h = calloc((size_t)comm->nranks, sizeof *h);
  if (!h) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  h[comm->rank] = fc_topo_host_hash();
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, h, sizeof *h);
  uint64_t all = 1469598103934665603ULL;
  for (int q = 0; q < comm->nranks; q++) all = (all ^ h[q]) * 1099511628211ULL;
  free(h);
  const char *prefix = l->nhosts == 1 ? "host" : kind == FC_PAIRS_WITHIN_HOST ? "hosts" : "between";
  int used = snprintf(key, len, "%s-n%d-%016llx", prefix, comm->nranks, (unsigned long long)all);
  for (int i = 0; i < l->n && used > 0 && (size_t)used < len; i++)
    used += snprintf(key + used, len - (size_t)used, "-%s", l->link[i].ops->name);
  /* With peer-failure handling shm copies through UCX's FIFOs (no cross-memory attach): other
   * models than FLEXCOLL_UCX_PEER_FAILURE=0's shm, whose key (without "-pf") older caches hold. */
  if (fc_ucx_peer_failure() && used > 0 && (size_t)used < len)
    snprintf(key + used, len - (size_t)used, "-pf");
  return res;
}

/* out[i]: the mean of mine[i] over the ranks where has[i] (bitwise the same everywhere); got[i]:
 * whether any rank had it. */
static flexcoll_result_t average_models(struct flexcoll_comm *comm, const fc_links_t *l, const fc_link_model_t *mine,
                                        const int *has, fc_link_model_t *out, int *got) {
  size_t per = (size_t)l->n * 3;
  double *all = calloc((size_t)comm->nranks * per, sizeof *all);
  if (!all) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  for (int i = 0; i < l->n; i++) {
    all[(size_t)comm->rank * per + 3 * (size_t)i] = has[i] ? mine[i].alpha_us : 0;
    all[(size_t)comm->rank * per + 3 * (size_t)i + 1] = has[i] ? mine[i].beta : 0;
    all[(size_t)comm->rank * per + 3 * (size_t)i + 2] = has[i] != 0;
  }
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, all, per * sizeof *all);
  for (int i = 0; i < l->n && res == FLEXCOLL_SUCCESS; i++) {
    double a = 0, b = 0, cnt = 0;
    for (int q = 0; q < comm->nranks; q++) {
      if (all[(size_t)q * per + 3 * (size_t)i + 2] == 0) continue;
      a += all[(size_t)q * per + 3 * (size_t)i];
      b += all[(size_t)q * per + 3 * (size_t)i + 1];
      cnt += 1;
    }
    got[i] = cnt > 0;
    out[i] = (fc_link_model_t){.alpha_us = cnt > 0 ? a / cnt : 0, .beta = cnt > 0 ? b / cnt : 1, .port = -1};
    /* A share is worth sending when it takes at least its fixed cost again. */
    out[i].min_bytes = out[i].alpha_us * out[i].beta;
  }
  free(all);
  return res;
}

static const char *const kind_name[FC_PAIR_KINDS] = {"pairs within a host", "pairs between hosts"};

/* Every used kind's models: from the cache where every rank has them, else calibrated, the
 * measurements of each kind averaged over the ranks that made them (a link that no rank measured
 * on pairs of a kind, shm between hosts for one, takes the other kind's where there is one); an
 * unused kind copies the used one. */
static flexcoll_result_t seed_models(struct flexcoll_comm *comm, fc_links_t *l) {
  /* One rank: no pair to model; the models stay as open set them. */
  if (!l->pairs[FC_PAIRS_WITHIN_HOST].used && !l->pairs[FC_PAIRS_BETWEEN_HOSTS].used) return FLEXCOLL_SUCCESS;
  char key[FC_PAIR_KINDS][256];
  const char *dir = fc_cost_cache_dir();
  double t0 = fc_now_us();
  int have = 1;
  for (int k = 0; k < FC_PAIR_KINDS; k++) {
    if (!l->pairs[k].used) continue;
    FC_CHECK(cache_key(comm, l, k, key[k], sizeof key[k]));
    have &= dir && fc_cost_cache_load(dir, key[k], l->pairs[k].model, l->n) == FLEXCOLL_SUCCESS;
  }
  int all_have = have;
  int *flags = calloc((size_t)comm->nranks, sizeof *flags);
  if (!flags) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  flags[comm->rank] = have;
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, flags, sizeof *flags);
  for (int q = 0; q < comm->nranks; q++) all_have &= flags[q];
  free(flags);
  if (res != FLEXCOLL_SUCCESS) return res;
  fc_link_model_t cal[FC_PAIR_KINDS][FC_MAX_LINKS], avg[FC_PAIR_KINDS][FC_MAX_LINKS];
  int has[FC_PAIR_KINDS][FC_MAX_LINKS] = {{0}}, got[FC_PAIR_KINDS][FC_MAX_LINKS] = {{0}};
  for (int k = 0; k < FC_PAIR_KINDS; k++)
    for (int i = 0; i < l->n; i++) avg[k][i] = (fc_link_model_t){.beta = 1, .port = -1};
  if (!all_have) FC_CHECK(calibrate(comm, l, cal, has));
  for (int k = 0; k < FC_PAIR_KINDS; k++) {
    if (!l->pairs[k].used) continue;
    if (all_have) /* from the cache: every rank has them */
      for (int i = 0; i < l->n; i++) has[k][i] = 1;
    FC_CHECK(average_models(comm, l, all_have ? l->pairs[k].model : cal[k], has[k], avg[k], got[k]));
  }
  const int only = l->pairs[FC_PAIRS_WITHIN_HOST].used ? FC_PAIRS_WITHIN_HOST : FC_PAIRS_BETWEEN_HOSTS;
  for (int k = 0; k < FC_PAIR_KINDS; k++)
    for (int i = 0; i < l->n; i++) {
      /* A link that joins no pair of either kind (shm where every host has one rank) keeps
       * open's model: no transfer is split over it. */
      const int from = !l->pairs[k].used ? only : got[k][i] || !got[1 - k][i] ? k : 1 - k;
      l->pairs[k].model[i] = avg[from][i];
      /* One port for all: within a host shared memory, TCP and a NIC's loopback are all copies
       * through the same memory system (measured on the GPU node's 16 cores: TCP beside shared
       * memory only slowed it down), and between hosts TCP and RDMA leave through the same NIC
       * on most machines; so the balancer splits only where that beats the better link alone.  A
       * further NIC (rail) behind a PCIe port of its own adds its bandwidth: a port of its own. */
      l->pairs[k].model[i].port = l->link[i].own_port ? 1 + i : 0;
      if (l->pairs[k].used)
        FC_INFO(FC_SUB_SCHED, "link %s, %s: alpha %.2f us, beta %.1f MB/s", l->link[i].ops->name, kind_name[k],
                l->pairs[k].model[i].alpha_us, l->pairs[k].model[i].beta);
    }
  for (int i = 0; i < l->n; i++)
    if (l->link[i].rail) FC_INFO(FC_SUB_SCHED, "link %s rail %d: port %d in the model", l->link[i].ops->name,
                                 l->link[i].rail, l->link[i].own_port ? 1 + i : 0);
  for (int k = 0; k < FC_PAIR_KINDS; k++) {
    if (!l->pairs[k].used) continue;
    FC_INFO(FC_SUB_SCHED, "link models of %s %s in %.1f ms (key %s)", kind_name[k],
            all_have ? "from the cache" : "calibrated", (fc_now_us() - t0) / 1e3, key[k]);
    if (!all_have && dir && fc_cost_cache_save(dir, key[k], l->pairs[k].model, l->n) != FLEXCOLL_SUCCESS)
      FC_INFO(FC_SUB_SCHED, "link models not cached in %s: %s", dir, fc_thread_last_error());
  }
  return FLEXCOLL_SUCCESS;
}

/* Where the calibrated link models take two dimensions over equal hosts beyond the measured limits
 * (fc_tuner_hosts_2d). */
static void log_hosts_2d(struct flexcoll_comm *comm, const fc_links_t *l) {
  static const fc_coll_t colls[] = {FC_COLL_ALLGATHER, FC_COLL_REDUCE_SCATTER};
  static const char *const names[] = {"allgather", "reduce_scatter"};
  if (l->nhosts < 2 || fc_log_level() < FC_LOG_INFO) return;
  for (int k = 0; k < 2; k++) {
    const size_t limit = fc_tuner_hosts_2d_predicted_limit(colls[k], l, comm->nranks);
    if (limit == FC_TUNER_HOSTS_2D_SCAN_MAX)
      FC_INFO(FC_SUB_SCHED, "%s over the hosts: the calibrated link models predict two dimensions faster at every "
              "size (to 1 TiB)", names[k]);
    else if (limit)
      FC_INFO(FC_SUB_SCHED, "%s over the hosts: the calibrated link models predict two dimensions faster up to %zu "
              "bytes", names[k], limit);
    else FC_INFO(FC_SUB_SCHED, "%s over the hosts: the calibrated link models predict the flat ring faster from 1 KiB "
                 "(or the hosts are unequal)", names[k]);
  }
}

/* Every link that is on, progressed once; nonzero when any did something. */
static int progress_links(void *arg) {
  fc_links_t *l = arg;
  int any = 0;
  for (int i = 0; i < l->n; i++)
    if (!l->link[i].off) any |= l->link[i].ops->progress(&l->link[i]);
  return any;
}

flexcoll_result_t fc_links_open(struct flexcoll_comm *comm) {
  fc_links_t *l = calloc(1, sizeof *l);
  if (!l) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  comm->links = l;
  int mask;
  FC_CHECK(wanted_links(comm, &mask));
  FC_CHECK(find_hosts(comm, l));
  char dropped[512] = "";
  for (int r = 0; r < FC_NREGISTRY; r++)
    if (mask & (1 << r)) FC_CHECK(open_one(comm, l, r, dropped, sizeof dropped));
  if (l->n == 0)
    return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "no host link works on every rank (FLEXCOLL_LINKS=%s)%s%s",
                    fc_param_str("FLEXCOLL_LINKS", "shm,tcp,rdma"), *dropped ? ": " : "", dropped);
  FC_CHECK(check_pairs(comm, l, dropped));
  FC_CHECK(agree_device_memory(comm, l));
  log_hosts(comm, l);
  l->call_bytes = calloc((size_t)l->n * (size_t)comm->nranks, sizeof *l->call_bytes);
  if (!l->call_bytes) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  l->me = comm->rank;
  l->pairs[FC_PAIRS_WITHIN_HOST].used = l->nhosts < comm->nranks;
  l->pairs[FC_PAIRS_BETWEEN_HOSTS].used = l->nhosts > 1;
  for (int k = 0; k < FC_PAIR_KINDS; k++)
    for (int i = 0; i < l->n; i++) l->pairs[k].model[i] = (fc_link_model_t){.beta = 1, .port = -1};
  if (l->n > 1) FC_CHECK(seed_models(comm, l));
  for (int k = 0; k < FC_PAIR_KINDS; k++) memcpy(l->pairs[k].calibrated, l->pairs[k].model, sizeof l->pairs[k].model);
  FC_CHECK(fixed_shares(comm, l));
  log_hosts_2d(comm, l);
  /* The communicator's exchanges from here on (stage 2, comm_split, window registration) come
   * after collectives: while a rank waits in one, its links must keep moving what a peer still
   * in the collective needs from it (test_hosts.sh matrix3 hung in stage 2's exchange without). */
  fc_bootstrap_set_progress(comm->bootstrap, progress_links, l);
  return FLEXCOLL_SUCCESS;
}

void fc_links_close(struct flexcoll_comm *comm, int force) {
  fc_links_t *l = comm->links;
  if (!l) return;
  fc_bootstrap_set_progress(comm->bootstrap, NULL, NULL);
  for (int i = 0; i < l->n; i++) {
    if (!l->link[i].off) l->link[i].ops->close(comm, &l->link[i], force);
    free(l->link[i].on);
    free(l->link[i].stats);
    free(l->link[i].reach);
  }
  free(l->call_bytes);
  free(l->host);
  free(l->host_name);
  free(l);
  comm->links = NULL;
}

/* ---- the split and stage 2 --------------------------------------------------------------------- */

flexcoll_result_t fc_links_split(const fc_links_t *l, int peer, size_t bytes, size_t align, size_t *shares) {
  if (l->n == 1) {
    shares[0] = bytes;
    return FLEXCOLL_SUCCESS;
  }
  /* The links of this pair: both ends compute the same set (reach is symmetric). */
  int enabled[FC_MAX_LINKS], nen = 0, first = -1, device_pair = 0;
  for (int i = 0; i < l->n; i++) {
    enabled[i] = peer < 0 || (l->link[i].reach && l->link[i].reach[peer]);
    if (peer >= 0 && enabled[i] && l->link[i].device_memory) device_pair = 1;
  }
  /* A pair that some link joins with device buffers keeps to such links (fc_links_device_memory),
   * for host buffers too: both ends must cut alike, whatever memory each end passes. */
  for (int i = 0; i < l->n; i++) {
    if (device_pair && !l->link[i].device_memory) enabled[i] = 0;
    shares[i] = 0;
    if (enabled[i] && nen++ == 0) first = i;
  }
  if (nen == 0) return FLEXCOLL_INVALID_ARGUMENT; /* no link joins the pair: open refused that */
  if (nen == 1) {
    shares[first] = bytes;
    return FLEXCOLL_SUCCESS;
  }
  if (!l->fixed_set) {
    const int kind = peer >= 0                                  ? fc_links_pair_kind(l, l->me, peer)
                     : l->pairs[FC_PAIRS_BETWEEN_HOSTS].used &&
                               !l->pairs[FC_PAIRS_WITHIN_HOST].used ? FC_PAIRS_BETWEEN_HOSTS
                                                                    : FC_PAIRS_WITHIN_HOST;
    return fc_stage2_split(l->pairs[kind].model, enabled, l->pairs[kind].probe, FC_PROBE_FRACTION, l->n, bytes, align,
                           shares);
  }
  /* Fixed fractions of the pair's links (renormalised over them), rounded down to align; what is
   * left goes to the largest fraction's link, all of it to the first link where they sum to 0. */
  double sum = 0;
  for (int i = 0; i < l->n; i++)
    if (enabled[i]) sum += l->fixed[i];
  size_t given = 0;
  int most = first;
  for (int i = 0; i < l->n && sum > 0; i++) {
    if (!enabled[i]) continue;
    shares[i] = (size_t)((double)bytes * (l->fixed[i] / sum)) / align * align;
    given += shares[i];
    if (l->fixed[i] > l->fixed[most]) most = i;
  }
  shares[most] += bytes - given;
  return FLEXCOLL_SUCCESS;
}

double fc_links_predict_us(const fc_links_t *l, int p, int q, size_t bytes) {
  const int device_pair = fc_links_device_memory(l, p, q);
  int enabled[FC_MAX_LINKS];
  for (int i = 0; i < l->n; i++)
    enabled[i] = !l->link[i].off && fc_links_joins(l, i, p, q) && (!device_pair || l->link[i].device_memory);
  size_t shares[FC_MAX_LINKS];
  double finish_us;
  if (fc_balance(l->pairs[fc_links_pair_kind(l, p, q)].calibrated, enabled, l->n, bytes, 1, shares, &finish_us) !=
      FLEXCOLL_SUCCESS)
    return INFINITY;
  return finish_us;
}

void fc_links_set_throttle(struct flexcoll_comm *comm, const char *name, double factor) {
  fc_links_t *l = comm->links;
  for (int i = 0; l && i < l->n; i++)
    if (!strcmp(l->link[i].ops->name, name)) l->throttle[i] = factor;
}

void fc_links_record(fc_links_t *l, int nranks, int i, int peer, size_t bytes, double us, int is_send) {
  if (l->throttle[i] > 0) us *= l->throttle[i];
  if (is_send) {
    fc_link_peer_stats_t *st = &l->link[i].stats[peer];
    st->bytes += bytes;
    st->busy_us += us;
    l->call_bytes[(size_t)i * (size_t)nranks + (size_t)peer] += bytes;
    return;
  }
  /* Stage 2 learns from arrivals: a send may complete as soon as its bytes are buffered (TCP),
   * or only once the receiver pulled them (shared memory), so only the receiver sees when a
   * part was delivered; all parts of a transfer are posted together, so these are finish times. */
  fc_pair_models_t *k = &l->pairs[fc_links_pair_kind(l, l->me, peer)];
  k->op_parts[i] += 1;
  k->op_bytes[i] += (double)bytes;
  k->op_us[i] += us;
}

/* The operation's measurements into stage 2's (keep) or away. */
static void end_operation(fc_links_t *l, int keep) {
  for (int k = 0; k < FC_PAIR_KINDS; k++)
    for (int i = 0; i < l->n; i++) {
      fc_pair_models_t *m = &l->pairs[k];
      if (keep) {
        m->meas_parts[i] += m->op_parts[i];
        m->meas_bytes[i] += m->op_bytes[i];
        m->meas_us[i] += m->op_us[i];
      }
      m->op_parts[i] = m->op_bytes[i] = m->op_us[i] = 0;
    }
}

void fc_links_after_p2p(struct flexcoll_comm *comm, size_t bytes) {
  if (comm->links) end_operation(comm->links, bytes >= FC_STAGE2_MIN_BYTES);
}

void fc_links_stage2_update(fc_links_t *l, int kind, const double *parts, const double *bytes, const double *us) {
  fc_pair_models_t *m = &l->pairs[kind];
  /* Beta alone (no history of sizes): a host link's part times include the waits of processes
   * that share cores, which a fit takes for a fixed cost; with the fit, test_links' adaptive
   * case failed to recover in 2 of 6 runs beside two busy loops, and in 0 of 8 without it. */
  fc_stage2_update(m->model, m->idle, m->probe, NULL, NULL, l->n, parts, bytes, us);
}

/* Every rank adds up everyone's measurements and applies the same update (the bootstrap's waits
 * progress the links meanwhile: fc_links_open). */
static flexcoll_result_t stage2_exchange(struct flexcoll_comm *comm, fc_links_t *l) {
  /* Per rank a row of every kind's links: (parts, bytes, us) for link i of kind k at k * n + i. */
  const int slots = FC_PAIR_KINDS * l->n;
  const size_t per = (size_t)slots * 3;
  double *all = calloc((size_t)comm->nranks * per, sizeof *all);
  if (!all) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  double *mine = all + (size_t)comm->rank * per;
  for (int k = 0; k < FC_PAIR_KINDS; k++)
    for (int i = 0; i < l->n; i++) {
      fc_pair_models_t *m = &l->pairs[k];
      double *slot = mine + 3 * (size_t)(k * l->n + i);
      slot[0] = m->meas_parts[i];
      slot[1] = m->meas_bytes[i];
      slot[2] = m->meas_us[i];
      m->meas_parts[i] = m->meas_bytes[i] = m->meas_us[i] = 0;
    }
  flexcoll_result_t res = fc_bootstrap_allgather(comm->bootstrap, all, per * sizeof *all);
  if (res == FLEXCOLL_SUCCESS) {
    double parts[FC_PAIR_KINDS * FC_MAX_LINKS], bytes[FC_PAIR_KINDS * FC_MAX_LINKS], us[FC_PAIR_KINDS * FC_MAX_LINKS];
    fc_stage2_sum(all, comm->nranks, slots, parts, bytes, us);
    for (int k = 0; k < FC_PAIR_KINDS; k++) {
      const fc_pair_models_t *m = &l->pairs[k];
      if (!m->used) continue;
      const int at = k * l->n;
      fc_links_stage2_update(l, k, parts + at, bytes + at, us + at);
      int joins[FC_MAX_LINKS]; /* links that join pairs of this kind (shm: none between hosts) */
      for (int i = 0; i < l->n; i++) joins[i] = k == FC_PAIRS_WITHIN_HOST || !l->link[i].ops->same_host;
      size_t shares[FC_MAX_LINKS];
      const size_t ref = 64u << 20; /* a transfer size to show the split at */
      const int have =
          fc_stage2_split(m->model, joins, m->probe, FC_PROBE_FRACTION, l->n, ref, 4096, shares) == FLEXCOLL_SUCCESS;
      for (int i = 0; i < l->n; i++)
        if (joins[i])
          FC_INFO(FC_SUB_SCHED,
                  "link %s, %s: stage 2 over %.0f parts: alpha %.2f us, beta %.1f MB/s, share of 64 MiB %.3f%s",
                  l->link[i].ops->name, kind_name[k], parts[at + i], m->model[i].alpha_us, m->model[i].beta,
                  have ? (double)shares[i] / (double)ref : 0.0, m->probe[i] ? " (probe next)" : "");
    }
  }
  free(all);
  if (res != FLEXCOLL_SUCCESS) {
    /* The bootstrap records its error for this thread only: the communicator must say it too
     * (flexcoll_get_last_error(comm) after a collective that failed here, e.g. a peer died). */
    char why[FC_ERROR_MSG_LEN];
    snprintf(why, sizeof why, "%s", fc_thread_last_error());
    res = fc_error(comm, res, "%s", why);
  }
  return res;
}

flexcoll_result_t fc_links_after_collective(struct flexcoll_comm *comm, size_t bytes) {
  fc_links_t *l = comm->links;
  const size_t n = (size_t)comm->nranks;
  if (bytes >= FC_STAGE2_MIN_BYTES)
    for (size_t q = 0; q < n; q++) {
      unsigned long long total = 0;
      for (int i = 0; i < l->n; i++) total += l->call_bytes[(size_t)i * n + q];
      for (int i = 0; total && i < l->n; i++)
        l->link[i].stats[q].share = (double)l->call_bytes[(size_t)i * n + q] / (double)total;
    }
  memset(l->call_bytes, 0, (size_t)l->n * n * sizeof *l->call_bytes);
  end_operation(l, bytes >= FC_STAGE2_MIN_BYTES);
  if (bytes < FC_STAGE2_MIN_BYTES) return FLEXCOLL_SUCCESS;
  if (l->n < 2 || l->fixed_set) {
    for (int k = 0; k < FC_PAIR_KINDS; k++)
      for (int i = 0; i < l->n; i++) {
        fc_pair_models_t *m = &l->pairs[k];
        m->meas_parts[i] = m->meas_bytes[i] = m->meas_us[i] = 0;
      }
    return FLEXCOLL_SUCCESS;
  }
  if (++l->large_calls % FC_STAGE2_EVERY) return FLEXCOLL_SUCCESS;
  return stage2_exchange(comm, l);
}
