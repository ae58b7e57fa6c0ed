/* sched.h — what runs a collective: the algorithm chosen for (collective, bytes, ranks, memory).
 * Link cost models and the split of a collective across links live here too (GPU path). */
#ifndef FC_SCHED_H
#define FC_SCHED_H

#include <stddef.h>
#include "algos/algos.h"
#include "gpu/gpu.h"
#include "transports/transports.h"

/* The algorithm for coll moving `bytes` (the largest buffer of the call) among nranks ranks.
 * FLEXCOLL_ALGO=ring|tree|exchange forces it where the collective has that algorithm (the exchange:
 * every collective, host memory only). */
fc_algo_t fc_tuner_pick(fc_coll_t coll, size_t bytes, int nranks, fc_mem_t mem);
/* Whether a device collective of `bytes` (the largest buffer) goes direct (lib/gpu/direct.c):
 * allreduce, allgather and broadcast from FLEXCOLL_DIRECT_MIN_BYTES up (what the one-shot path
 * leaves them), reduce_scatter from FLEXCOLL_DIRECT_RS_MIN_BYTES, unless
 * FLEXCOLL_DIRECT=0 or FLEXCOLL_ALGO forces an algorithm. */
int fc_tuner_direct(fc_coll_t coll, size_t bytes, int nranks);
/* Whether direct mode may exchange buffer addresses at a call (FLEXCOLL_DIRECT=2) for buffers
 * outside symmetric windows; otherwise the other device paths run them. */
int fc_tuner_direct_exchange(void);
/* Whether a host allgather or reduce_scatter of `bytes` (its larger buffer: the whole message)
 * among nranks ranks on l's hosts, equally many on each, runs in two dimensions rather than the
 * flat ring: up to FLEXCOLL_ALLGATHER_2D_MAX_BYTES and FLEXCOLL_REDUCE_SCATTER_2D_MAX_BYTES where
 * they are set, else up to the limits measured on one machine and beyond them where l's
 * calibrated link models predict it faster (the same answer on every rank, which holds the same
 * models).
 * 0 for other collectives and hosts of unequal size. */
struct fc_links;
int fc_tuner_hosts_2d(fc_coll_t coll, size_t bytes, const struct fc_links *l, int nranks);
/* The largest power-of-two size up to which the calibrated link models predict two dimensions faster
 * for coll (at most FC_TUNER_HOSTS_2D_SCAN_MAX: every size), 0 where they predict it at no size
 * from 1 KiB: for the log. */
#define FC_TUNER_HOSTS_2D_SCAN_MAX ((size_t)1 << 40)
size_t fc_tuner_hosts_2d_predicted_limit(fc_coll_t coll, const struct fc_links *l, int nranks);
/* Whether device calls above the one-shot limit may take the collective kernels (ring,
 * alltoall): not when FLEXCOLL_ALGO forces an algorithm, whose schedule then runs (lib/gpu). */
int fc_tuner_kernels(void);
/* Host collectives through the communicator's shared-memory segment (lib/host/shm.c): not at
 * all (FC_SHM_OFF: FLEXCOLL_SHM_DIRECT=0, FLEXCOLL_ALGO forcing an algorithm), in exchange rounds
 * (every collective; every rank reads all the inputs), or split (allreduce from
 * FLEXCOLL_SHM_SPLIT_MIN_BYTES: reduce-scatter then allgather through the slots, two rounds per
 * slot's worth), or in the window mode (allreduce, reduce_scatter, allgather, broadcast on
 * buffers in host windows from FLEXCOLL_SHM_WINDOW_MIN_BYTES: straight between the ranks'
 * buffers, two rounds per call). */
typedef enum { FC_SHM_OFF, FC_SHM_EXCHANGE, FC_SHM_SPLIT, FC_SHM_WINDOW } fc_shm_mode_t;
/* Whether communicators map a segment at all (FLEXCOLL_SHM_DIRECT, no forced algorithm). */
int fc_tuner_shm_enabled(void);
/* crowded: the ranks outnumber the host's cores (the split's threshold is higher then);
 * windowed: the buffers the peers touch lie in host windows (fc_host_windows_find). */
fc_shm_mode_t fc_tuner_shm(fc_coll_t coll, size_t bytes, int nranks, int crowded, int windowed);
/* Pipeline chunk in elements for a message of count elements of esize bytes. */
size_t fc_tuner_chunk_count(size_t count, size_t esize);

/* ---- link cost model (cost.c) -------------------------------------------------------------------
 * One model per link and direction: moving b bytes takes t(b) = alpha_us + b / beta (beta in bytes
 * per microsecond).  Stage 1 fits it from a short calibration at communicator creation (cached on
 * disk, keyed by the topology); stage 2 folds the finish times measured in large collectives into
 * beta, smoothed, so that shares follow a link that slows down and come back when it recovers.
 * Pure C, no I/O except the cache functions: every rank that feeds the same numbers gets the same
 * model bit for bit (the balancer's shares must agree across ranks). */
#define FC_MAX_LINKS 8

typedef struct {
  double alpha_us;     /* fixed cost of one transfer (latency, launch, proxy hop) */
  double beta;         /* bytes per microsecond (= MB/s); <= 0: the link carries nothing */
  double min_bytes;    /* smallest share worth its alpha (a share below it goes elsewhere) */
  int port;            /* links with the same port >= 0 share one bandwidth (a NIC and host staging
                          behind the same PCIe switch); -1: independent */
  double port_beta;    /* what that port carries, bytes per microsecond, when known (a PCIe x16 root
                          port: more than host staging or the NIC alone, less than both); 0: the
                          largest beta among its links.  From the topology, like port: not cached */
} fc_link_model_t;

/* Predicted microseconds for bytes on m (alpha + bytes/beta; infinity when beta <= 0). */
double fc_cost_predict(const fc_link_model_t *m, double bytes);
/* Least-squares fit of alpha and beta from n >= 2 samples (bytes[i], us[i]); alpha is clamped at 0
 * and beta must come out positive, else FLEXCOLL_INVALID_ARGUMENT and m untouched. */
flexcoll_result_t fc_cost_fit(fc_link_model_t *m, const double *bytes, const double *us, int n);
/* Stage 1 from two sizes (bytes, microseconds each): the fit through both where the large size
 * spent at least half its time moving bytes (fit beta <= 2 * big_bytes / big_us), else alpha = the
 * smaller time and beta = the large size's plain rate, a lower bound.  Never fails on positive
 * finite samples with big_bytes > small_bytes (else FLEXCOLL_INVALID_ARGUMENT, m untouched);
 * min_bytes and port are not its to change. */
flexcoll_result_t fc_cost_from_two(fc_link_model_t *m, double small_bytes, double small_us, double big_bytes,
                                   double big_us);
/* Stage 2: fold one measured transfer (bytes in us) into m with weight w in (0, 1]: beta moves
 * toward bytes / max(us - alpha, us / 2) by w (alpha is kept; a measurement at or under alpha, a
 * weight outside (0, 1] or a number that is not finite is ignored). */
void fc_cost_update(fc_link_model_t *m, double bytes, double us, double w);

/* The calibration cache: one text file per key (the topology: hosts, devices, links) under dir,
 * <dir>/<key with other than [A-Za-z0-9._-] as '_'>.links; the key itself (at most ~2000 bytes) is
 * checked on load.  Save creates dir (mode 0700) and replaces the file atomically (temporary file and
 * rename); it refuses with FLEXCOLL_INVALID_ARGUMENT models that load would refuse (alpha, beta or
 * min_bytes negative or not finite, port < -1).  Load gives back the saved models bit for bit, or
 * fails with FLEXCOLL_SYSTEM_ERROR (missing: an INFO line only, as on a first run; malformed, or for
 * another key or number of links: a warning) leaving models untouched, never partial. */
flexcoll_result_t fc_cost_cache_save(const char *dir, const char *key, const fc_link_model_t *models, int nlinks);
flexcoll_result_t fc_cost_cache_load(const char *dir, const char *key, fc_link_model_t *models, int nlinks);
/* The default cache directory: FLEXCOLL_CACHE_DIR, else $XDG_CACHE_HOME/flexcoll (when absolute),
 * else $HOME/.cache/flexcoll; NULL when none can be named.  Read once per process, thread-safe. */
const char *fc_cost_cache_dir(void);

/* ---- balancer (balance.c) ----------------------------------------------------------------------
 * Split `bytes` over n <= FC_MAX_LINKS links so that their predicted finish times are equal: find T
 * with sum_i max(0, T - alpha_i) * beta_i = bytes, drop the link furthest under max(min_bytes,
 * align) (or at or past T), and repeat.  Links sharing a port share its bandwidth: among the links
 * that carry a share, their betas are scaled down (in proportion) so that their sum is at most the
 * port's bandwidth, the largest port_beta or beta of them (a port that carries more than the sum
 * takes them at their own betas).  Shares
 * are multiples of `align` bytes (the element size or more; 0 counts as 1) except that the
 * remainder goes to the carrying link with the largest (scaled) beta, lowest index on ties; they sum
 * to bytes exactly, and are a pure function of the inputs (every rank computes the same split).
 * The whole message goes to the one link that alone finishes first (lowest index on ties; its
 * min_bytes does not matter) when bytes < align, when one link is left, or when the split would not
 * finish before it (links that share a port and nothing else, for one).  A link with
 * enabled[i] == 0 or beta <= 0 (or alpha or beta not finite) gets 0 (enabled may be NULL: all);
 * when no link is usable, FLEXCOLL_INVALID_ARGUMENT.  bytes 0 gives all-zero shares and success.
 * The predicted finish time (the latest carrying link's, with scaled betas) goes to *finish_us when
 * not NULL. */
flexcoll_result_t fc_balance(const fc_link_model_t *models, const int *enabled, int n, size_t bytes, size_t align,
                             size_t *shares, double *finish_us);

/* ---- chunker (balance.c) -----------------------------------------------------------------------
 * A link's share cut into pipelined slices: slices of `slice` bytes (a multiple of align), the last
 * one shorter; slice 0 means one slice, share 0 none.  fc_chunk_count returns how many; fc_chunk_get
 * the offset and length of slice k (k past the last: offset share, length 0). */
size_t fc_chunk_count(size_t share, size_t slice);
void fc_chunk_get(size_t share, size_t slice, size_t k, size_t *off, size_t *len);

/* ---- stage 2 (stage2.c) --------------------------------------------------------------------------
 * The one update rule for every set of links whose models stage 2 keeps: the host links
 * (links.c: every rank applies it to everyone's measurements, summed in rank order by
 * fc_stage2_sum) and the ring kernels' device lanes (lib/gpu/pcie.c: rank 0 applies it to its own
 * and every rank takes the result), so that every rank holds the same models and splits alike.
 * Measurements come as, per link, parts (transfers, or timed calls), their bytes and their
 * microseconds.  Pure: no I/O, no clocks. */
/* Operations between two exchanges of measurements (counted alike on every rank). */
#define FC_STAGE2_EVERY 4
/* Weight of one exchange's measurements in a link's model. */
#define FC_STAGE2_WEIGHT 0.5
/* A link left without a share for this many exchanges gets a small probe share (1/FC_PROBE_PART
 * of each transfer) for the next window, so that it is measured again: a calibration that
 * underrated it, or a slow spell that has passed, cannot keep it idle for good, and a link that
 * is still slow costs little. */
#define FC_STAGE2_PROBE_AFTER 4
#define FC_PROBE_PART 256
#define FC_PROBE_MAX_PART 16

/* A link's recent mean parts (one point per exchange that measured it), as exponentially weighted
 * sums for a least-squares line: sizes in MiB, times in microseconds.  Zeroed: none yet. */
typedef struct {
  double w, x, y, xx, xy;
} fc_stage2_history_t;

/* Fold one exchange's sums into the n models.  A measured link's mean part joins its history
 * (hist[i]; older points weigh 1 - FC_STAGE2_WEIGHT less per new one, and a part more than twice
 * as slow or fast as the model predicts starts the history afresh: the link changed).  Where the
 * history's sizes spread enough to tell a fixed cost from a rate and its line is a cost model (no
 * negative fixed cost, the mean part at least half transfer), alpha and beta move toward it
 * (weight FC_STAGE2_WEIGHT); otherwise beta alone moves toward what the part showed
 * (fc_cost_update, same weight; a part that took less than alpha halves alpha to it).  A link
 * without parts for FC_STAGE2_PROBE_AFTER exchanges in a row gets probe[i] = 1 for the next window
 * (every other link 0).  min_bytes becomes alpha * beta, never under floor[i] (floor may be NULL:
 * no floor).  hist may be NULL: beta alone, always. */
void fc_stage2_update(fc_link_model_t *model, int *idle, int *probe, fc_stage2_history_t *hist, const double *floor,
                      int n, const double *parts, const double *bytes, const double *us);
/* How large a probe share is (fc_stage2_split). */
typedef enum {
  FC_PROBE_FRACTION,  /* bytes / FC_PROBE_PART */
  FC_PROBE_FIXED_COST /* that, or the link's min_bytes where that is more, up to bytes / FC_PROBE_MAX_PART */
} fc_probe_size_t;

/* fc_balance over the enabled models (enabled may be NULL: all), then every enabled link with
 * probe[i] and no share takes a probe share (sized by how, in align multiples) out of the largest
 * share, where that leaves it at least as much again.  A probe under min_bytes takes little more
 * than the fixed cost, which tells nothing of the rate: the device lanes' probes are worth their
 * fixed cost.  The host links' stay a fraction: beside processes that share cores, their larger
 * probes made test_links' adaptive case miss its recovery now and then (1 run in 12 beside two
 * busy loops, 0 in 16 with the fraction).  probe may be NULL.  A pure function of its arguments,
 * like fc_balance. */
flexcoll_result_t fc_stage2_split(const fc_link_model_t *model, const int *enabled, const int *probe,
                                  fc_probe_size_t how, int n, size_t bytes, size_t align, size_t *shares);
/* The ring kernels' lanes (lib/gpu/pcie.c): the bytes of a ring chunk each of nside side lanes
 * carries.  Lane 0 is NVLink (nvlink 0: there is none), lane k + 1 side lane k; fixed fractions
 * per lane (fixed[L], NULL: none) or else fc_stage2_split over the models with probe, 16-byte
 * aligned.  The models are per call, a lane's bytes the msgs chunk messages it pushes in one (0
 * counts as 1), so the split balances msgs chunks and each lane's part is its share of them over
 * msgs: a lane's fixed cost is paid once per call, not once per chunk.  Side lane k's part begins
 * where side lane k - 1's ends and is a multiple of 16 unless it reaches the chunk's end (NVLink
 * takes what they leave); without NVLink the last side lane takes the rest (all of it where it is
 * the only one, or no model is usable).  A pure function: every rank splits alike. */
void fc_lanes_split(const fc_link_model_t *model, const int *probe, const double *fixed, int nvlink, int nside,
                    size_t chunk, unsigned msgs, size_t *side);
/* all: nranks rows of 3n doubles (per link: parts, bytes, us), row q rank q's; their sums per link,
 * added in rank order (the same bits on every rank that holds the same rows). */
void fc_stage2_sum(const double *all, int nranks, int n, double *parts, double *bytes, double *us);

/* ---- the links of a communicator (links.c) ---------------------------------------------------
 * Every usable link of FLEXCOLL_LINKS with its cost model.  The models are the same on every rank
 * (calibrated together, averaged, and updated only from numbers all ranks exchanged), so that the
 * sender and the receiver of a transfer cut it the same way without a message. */
struct flexcoll_comm;

#define FC_HOST_NAME_LEN 72 /* HOST_NAME_MAX (64) and its NUL, rounded up */

/* The kinds of pairs of ranks a link's models tell apart. */
enum { FC_PAIRS_WITHIN_HOST, FC_PAIRS_BETWEEN_HOSTS, FC_PAIR_KINDS };

/* A communicator's models of its links for one kind of pair, and stage 2's state for them. */
typedef struct {
  int used;
  fc_link_model_t model[FC_MAX_LINKS]; /* in force, identical on every rank */
  /* As stage 1 seeded them (cache or calibration), identical on every rank: each link measured
   * alone, where stage 2 measures transfers inside running collectives, in which a ring's fast
   * pairs wait on its slowest and look as slow as it (fine for sharing one transfer among links,
   * wrong for comparing pair kinds). */
  fc_link_model_t calibrated[FC_MAX_LINKS];
  /* Stage 2: what this rank measured since the last exchange, per link: parts received, their
   * bytes and microseconds from post to completion. */
  double meas_parts[FC_MAX_LINKS], meas_bytes[FC_MAX_LINKS], meas_us[FC_MAX_LINKS];
  /* The same for the operation under way, kept (added to meas_*) only when it was large: a small
   * one's parts cost their latency, not their bytes, and would drag a link's bandwidth down. */
  double op_parts[FC_MAX_LINKS], op_bytes[FC_MAX_LINKS], op_us[FC_MAX_LINKS];
  int idle[FC_MAX_LINKS];                 /* exchanges in a row without a share */
  int probe[FC_MAX_LINKS];                /* this window gives the link a small probe share */
} fc_pair_models_t;

typedef struct fc_links {
  /* The ranks' hosts (ranks whose host names are equal share one; lib/topo.c's hash compares
   * the same names): host[q] indexes host_name, hosts numbered in the order of their lowest rank.
   * order lists the ranks host by host (ranks ascending within a host) and pos is its inverse:
   * the host algorithms' rings and trees follow it, so that a host's ranks are neighbours
   * whatever their numbering (lib/algos, fc_algo_args_t.order). */
  int nhosts;
  int *host, *order, *pos;
  char (*host_name)[FC_HOST_NAME_LEN];
  int me; /* this rank */
  int n;
  fc_link_t link[FC_MAX_LINKS];
  /* A link's models and stage 2 per kind of pair (fc_links_pair_kind): tcp between two processes
   * of a host is a copy through memory, between hosts a network; one model for both was an average
   * of the two, right for neither.  used: the communicator has pairs of that kind. */
  fc_pair_models_t pairs[FC_PAIR_KINDS];
  double fixed[FC_MAX_LINKS];               /* FLEXCOLL_LINK_SHARES fractions; used when fixed_set */
  int fixed_set;
  double throttle[FC_MAX_LINKS]; /* tests: measured times are multiplied by it (0: 1) */
  uint32_t large_calls;   /* large host collectives so far: the same count on every rank */
  unsigned long long *call_bytes; /* [link * nranks + peer]: bytes of the current collective */
  /* Rounds of the host wait loop so far, over all its waits: idle links are progressed every
   * so many (lib/host/exec.c), also when each collective waits fewer rounds than that. */
  unsigned wait_rounds;
} fc_links_t;

/* Whether FLEXCOLL_LINKS (unset or empty: every link) names the link `name`. */
int fc_links_names(const char *name);
/* Learn the ranks' hosts, open every link FLEXCOLL_LINKS names (default: every host link) that
 * works on every rank, each toward the peers it can reach (shm: the ranks of this host), and seed
 * the models (from the calibration cache, else a short calibration; only with 2 links or more).
 * Fails when no link is left, naming why each was dropped, or when two ranks have no link
 * between them (FLEXCOLL_INVALID_ARGUMENT where FLEXCOLL_LINKS left it out). */
flexcoll_result_t fc_links_open(struct flexcoll_comm *comm);
void fc_links_close(struct flexcoll_comm *comm, int force);
/* Cut a transfer of bytes to or from peer into per-link shares (multiples of align but the fastest
 * link's) over the links that reach peer (a link that does not gets 0), and of those only the
 * ones that take device buffers where one does (fc_links_device_memory), by the models of the
 * pair's kind; peer < 0: over every link, by the models of pairs within a host where there are
 * any, else between hosts (statistics, tests).  The same on both ends of a pair. */
flexcoll_result_t fc_links_split(const fc_links_t *l, int peer, size_t bytes, size_t align, size_t *shares);
/* FC_PAIRS_BETWEEN_HOSTS where ranks p and q are on different hosts, else FC_PAIRS_WITHIN_HOST
 * (also where l knows no hosts). */
int fc_links_pair_kind(const fc_links_t *l, int p, int q);
/* Whether link i of l joins ranks p and q (from the hosts and the link's same_host: the same
 * answer on every rank). */
int fc_links_joins(const fc_links_t *l, int i, int p, int q);
/* Whether some link joining ranks p and q takes device buffers itself (fc_link.device_memory):
 * a transfer between them may then be handed device memory, and fc_links_split gives the pair's
 * transfers to such links only (a link that would stage device memory slowly, or not at all,
 * carries none of them). */
int fc_links_device_memory(const fc_links_t *l, int p, int q);
/* This rank's links that take device memory (bit i: link i, on here), and the agreement from
 * every rank's mask (masks[q]: rank q's): a link takes device memory where every rank that has it
 * (link.on) says so.  fc_links_open all-gathers the masks between the two. */
unsigned fc_links_device_mask(const fc_links_t *l);
void fc_links_agree_device_memory(fc_links_t *l, int nranks, const unsigned *masks);
/* A part of `bytes` to (is_send) or from peer completed on link i us microseconds after it was
 * posted: sends count in the statistics, receives (deliveries) feed stage 2. */
void fc_links_record(fc_links_t *l, int nranks, int i, int peer, size_t bytes, double us, int is_send);
/* Stage 2's update of l's models of one kind of pair from the measurements of all ranks since the
 * last one (per link: parts, their bytes and microseconds, summed): a measured link moves toward
 * what it showed; one that stayed idle a few exchanges gets a probe share in the next window.
 * Pure (no I/O). */
void fc_links_stage2_update(fc_links_t *l, int kind, const double *parts, const double *bytes, const double *us);
/* Predicted microseconds for a transfer of bytes between ranks p and q, by the calibrated models
 * of their kind of pair (fc_pair_models_t.calibrated) over the links that join them (those that
 * take device buffers where one does, as fc_links_split cuts), balanced; INFINITY where no link
 * is usable.  The same on every rank. */
double fc_links_predict_us(const fc_links_t *l, int p, int q, size_t bytes);
/* Tests: make link `name` look `factor` times slower to stage 2 (its measured times are scaled);
 * every rank of comm must do the same. */
void fc_links_set_throttle(struct flexcoll_comm *comm, const char *name, double factor);
/* After a host collective that moved `bytes` per rank (the same on every rank): per-peer shares
 * for the statistics, its measurements kept if it was large, and every few large ones stage 2
 * (an exchange over the bootstrap). */
flexcoll_result_t fc_links_after_collective(struct flexcoll_comm *comm, size_t bytes);
/* After a host batch of sends and receives whose largest transfer was `bytes`: its measurements
 * kept if that was large (no exchange: the ranks of a batch differ). */
void fc_links_after_p2p(struct flexcoll_comm *comm, size_t bytes);

#endif
