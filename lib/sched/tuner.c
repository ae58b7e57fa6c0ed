/* tuner.c — algorithm choice by message size and rank count.
 * Trees win when latency dominates (log2(n) steps instead of 2(n-1)); rings when bandwidth does
 * (every rank sends 2(n-1)/n of the data once instead of the whole message per tree level); the
 * exchange (one step, n-1 times the bytes) when only latency counts. */
#define _GNU_SOURCE
#include "sched.h"

#include <math.h>

#include "log.h"
#include "param.h"

FC_PARAM_INT(chunk_size, "CHUNK_SIZE", 1 << 20)
/* 0: never; 1: buffers in symmetric windows; 2: also others, exchanging addresses per call. */
FC_PARAM_INT(direct, "DIRECT", 1)
/* Allreduce and allgather reach it after the one-shot kernel (8 MiB for 2 ranks). */
FC_PARAM_INT(direct_min_bytes, "DIRECT_MIN_BYTES", 1 << 20)
/* Reduce_scatter pulls and reduces like allreduce without the pushes: below this the staged
 * pipeline of the time (since replaced by the ring and pipelined kernels) measured faster (142
 * against 154 GB/s busbw at 16 MB; at 32 MB direct 87.6 µs, staged 93.0, NCCL 91.0; for 2 ranks
 * the one-shot kernel covers up to 16 MB). */
FC_PARAM_INT(direct_rs_min_bytes, "DIRECT_RS_MIN_BYTES", 32 << 20)
/* Host allgather and reduce_scatter over hosts of equally many ranks in two dimensions up to these
 * sizes (the larger buffer), the flat ring above.  Unset (-1): up to the sizes measured on two
 * "hosts" of one machine, whose link is a copy through memory (beyond them the columns' copies
 * cost more than the transfers saved: docs/PERFORMANCE.md, sessions 34 and 35), and beyond them
 * where the calibrated link models predict two dimensions faster by more than a tenth even on
 * pessimistic terms (hosts_2d_predicted): between hosts much slower than a copy, as with hosts
 * joined at 1 Gbit/s, where two dimensions won at every size measured (session 35). */
FC_PARAM_INT(allgather_2d_max_bytes, "ALLGATHER_2D_MAX_BYTES", -1)
FC_PARAM_INT(reduce_scatter_2d_max_bytes, "REDUCE_SCATTER_2D_MAX_BYTES", -1)
#define ALLGATHER_2D_MEASURED_BYTES (1u << 20)
#define REDUCE_SCATTER_2D_MEASURED_BYTES (4u << 20)
/* Host collectives of ranks of one host through the communicator's shared-memory segment. */
FC_PARAM_INT(shm_direct, "SHM_DIRECT", 1)
/* Allreduce from this size splits the reduction over the ranks (reduce-scatter + allgather
 * through the segment, two rounds per slot); below it every rank folds every input (one round
 * per slot).  Unset (-1): earlier where every rank has a core of its own (folding 1/n of the
 * message each pays off sooner), later where ranks outnumber cores (each split round waits for
 * peers that are not running).  docs/PERFORMANCE.md has the measurements behind both. */
FC_PARAM_INT(shm_split_min_bytes, "SHM_SPLIT_MIN_BYTES", -1)
/* Collectives on buffers in host windows from this size take the window mode; below it the
 * exchange's single round of inline data is faster.  Unset (-1), where every rank has a core, the
 * crossovers measured for 2 and 4 ranks (docs/PERFORMANCE.md, session 14): allreduce and
 * reduce_scatter from 1 KiB, broadcast from 4 KiB, allgather from 8 KiB; where ranks outnumber
 * cores, the split's threshold (both modes wait two rounds for peers that may not run). */
FC_PARAM_INT(shm_window_min_bytes, "SHM_WINDOW_MIN_BYTES", -1)
#define SHM_WINDOW_MIN_BYTES_REDUCE (1u << 10)
#define SHM_WINDOW_MIN_BYTES_BROADCAST (4u << 10)
#define SHM_WINDOW_MIN_BYTES_ALLGATHER (8u << 10)
#define SHM_SPLIT_MIN_BYTES_CORES (64u << 10)
#define SHM_SPLIT_MIN_BYTES_CROWDED (1u << 20)

/* Below these sizes (bytes) the tree's fewer steps beat the ring's smaller transfers on host
 * transports (shared memory / TCP latency of a few microseconds per step). */
#define TREE_MAX_BYTES_ALLREDUCE (64 << 10)
/* Host collectives (reduce aside) up to this size and rank count: one round of messages (each
 * rank sends every peer what it needs) beats the ring's and the tree's several; a reduce's root
 * would fold every input alone, where the tree shares the work.  docs/PERFORMANCE.md has the
 * measurements. */
#define EXCHANGE_MAX_BYTES (16 << 10)
#define EXCHANGE_MAX_RANKS 8
#define TREE_MAX_BYTES_ALLGATHER (16 << 10)

static int forced_algo(void) {
  static int cached = -2;
  int v = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
  if (v != -2) return v;
  const char *s = fc_param_str("FLEXCOLL_ALGO", NULL);
  v = s ? fc_algo_from_name(s) : -1;
  if (s && v < 0) FC_WARN("FLEXCOLL_ALGO=%s is not ring, tree or exchange; choosing by size", s);
  __atomic_store_n(&cached, v, __ATOMIC_RELEASE);
  return v;
}

fc_algo_t fc_tuner_pick(fc_coll_t coll, size_t bytes, int nranks, fc_mem_t mem) {
  int forced = forced_algo();
  /* The exchange is for host memory: device memory has its own small-message kernels.  (Its
   * schedule through the point-to-point kernel gave a wrong first call now and then on the one-GPU
   * node, not yet explained: docs/PERFORMANCE.md, session 12.) */
  if (forced >= 0 && fc_algo_supports(coll, (fc_algo_t)forced) && !(forced == FC_ALGO_EXCHANGE && mem == FC_MEM_DEVICE))
    return (fc_algo_t)forced;
  if (mem != FC_MEM_DEVICE && coll != FC_COLL_REDUCE && nranks <= EXCHANGE_MAX_RANKS && bytes <= EXCHANGE_MAX_BYTES)
    return FC_ALGO_EXCHANGE;
  switch (coll) {
    case FC_COLL_ALLREDUCE:
      return (nranks > 2 && bytes <= TREE_MAX_BYTES_ALLREDUCE) ? FC_ALGO_TREE : FC_ALGO_RING;
    case FC_COLL_ALLGATHER:
      return (nranks > 2 && bytes <= TREE_MAX_BYTES_ALLGATHER) ? FC_ALGO_TREE : FC_ALGO_RING;
    case FC_COLL_BROADCAST:
    case FC_COLL_REDUCE:
      /* A pipelined chain moves each byte once per rank like the tree, with one hop per step. */
      return nranks > 4 && bytes <= (4u << 20) ? FC_ALGO_TREE : FC_ALGO_RING;
    default:
      return FC_ALGO_RING;
  }
}

int fc_tuner_shm_enabled(void) { return fc_param_shm_direct() && forced_algo() < 0; }

fc_shm_mode_t fc_tuner_shm(fc_coll_t coll, size_t bytes, int nranks, int crowded, int windowed) {
  if (!fc_tuner_shm_enabled() || nranks < 2) return FC_SHM_OFF;
  const int64_t set = fc_param_shm_split_min_bytes();
  const size_t split = set >= 0 ? (size_t)set : crowded ? SHM_SPLIT_MIN_BYTES_CROWDED : SHM_SPLIT_MIN_BYTES_CORES;
  if (windowed) {
    const int64_t wset = fc_param_shm_window_min_bytes();
    const size_t window = wset >= 0                   ? (size_t)wset
                          : crowded                   ? split
                          : coll == FC_COLL_BROADCAST ? SHM_WINDOW_MIN_BYTES_BROADCAST
                          : coll == FC_COLL_ALLGATHER ? SHM_WINDOW_MIN_BYTES_ALLGATHER
                                                      : SHM_WINDOW_MIN_BYTES_REDUCE;
    if (bytes >= window) return FC_SHM_WINDOW;
  }
  if (coll == FC_COLL_ALLREDUCE && bytes >= split) return FC_SHM_SPLIT;
  return FC_SHM_EXCHANGE;
}

int fc_tuner_direct(fc_coll_t coll, size_t bytes, int nranks) {
  if (!fc_param_direct() || forced_algo() >= 0 || nranks < 2 || bytes < (size_t)fc_param_direct_min_bytes()) return 0;
  /* Broadcast: the root's pushes beat the chain's schedule from 1 MB (137 against 84 GB/s at 4 MB,
   * 253 against 95 at 16 MB). */
  if (coll == FC_COLL_ALLREDUCE || coll == FC_COLL_ALLGATHER || coll == FC_COLL_BROADCAST) return 1;
  if (coll == FC_COLL_REDUCE_SCATTER) return bytes >= (size_t)fc_param_direct_rs_min_bytes();
  return 0;
}

int fc_tuner_direct_exchange(void) { return fc_param_direct() >= 2; }

/* Two dimensions beyond the measured limits only where the models predict them at most this part of
 * the flat ring's time: the rule below errs by more than the calibration's noise near the ratio of
 * the hosts' link to shm's where the two cross (docs/PERFORMANCE.md, session 36: calibrations a
 * run apart on one machine fell on either side), and the measured limits are the safer side. */
#define HOSTS_2D_PREDICTED_MAX 0.9

/* Whether two dimensions are predicted to finish within HOSTS_2D_PREDICTED_MAX of the flat ring's
 * time, for coll of `bytes` among H hosts of L ranks, on terms that favour the flat ring.  With
 * blocks of c = bytes / (H L) and w(x), b(x) the predicted times of x bytes within a host and
 * between hosts (fc_links_predict_us: the calibrated models):
 *   flat: H L - 1 rounds, each as long as its slowest pair: (H L - 1) max(w(c), b(c));
 *   two dimensions: H - 1 rounds between hosts, as if a host's L ranks, sending at once, shared
 *     one NIC: b(L c) each; L - 1 rounds of a column (H c) within the host: w(H c) each; and the
 *     copies of the columns (the allgather unpacks H L - 1 blocks, the reduce_scatter packs H L)
 *     at the within-host link's rate, where a local copy is faster.
 * Both reduce H L - 1 blocks a rank in a reduce_scatter, so the reductions cancel out.  The
 * representative pairs are the same on every rank: the first two ranks of the first host, and its
 * first rank with the second host's. */
static int hosts_2d_predicted(fc_coll_t coll, size_t bytes, const fc_links_t *l, int H, int L) {
  const int n = H * L, p = l->order[0], near = l->order[1], far = l->order[L];
  const size_t c = bytes / (size_t)n;
  const double w = fc_links_predict_us(l, p, near, c), b = fc_links_predict_us(l, p, far, c);
  const size_t copied = (coll == FC_COLL_REDUCE_SCATTER ? (size_t)n : (size_t)n - 1) * c;
  const double flat = (n - 1) * fmax(w, b);
  const double two = (H - 1) * fc_links_predict_us(l, p, far, (size_t)L * c) +
                     (L - 1) * fc_links_predict_us(l, p, near, (size_t)H * c) + fc_links_predict_us(l, p, near, copied);
  return two <= HOSTS_2D_PREDICTED_MAX * flat;
}

/* Whether coll has two dimensions (allgather, reduce_scatter) and nranks ranks lie on l's hosts
 * equally, at least 2 on each: then H and L.  l->order lists the ranks host by host, so the hosts
 * are equal when its k-th rank is on host k / L. */
static int hosts_2d_shape(fc_coll_t coll, const fc_links_t *l, int nranks, int *H, int *L) {
  if (coll != FC_COLL_ALLGATHER && coll != FC_COLL_REDUCE_SCATTER) return 0;
  if (!l || !l->order || l->nhosts < 2 || nranks % l->nhosts || nranks / l->nhosts < 2) return 0;
  *H = l->nhosts;
  *L = nranks / l->nhosts;
  for (int k = 0; k < nranks; k++)
    if (l->host[l->order[k]] != k / *L) return 0;
  return 1;
}

int fc_tuner_hosts_2d(fc_coll_t coll, size_t bytes, const fc_links_t *l, int nranks) {
  int H, L;
  if (!hosts_2d_shape(coll, l, nranks, &H, &L)) return 0;
  const int allgather = coll == FC_COLL_ALLGATHER;
  const int64_t limit = allgather ? fc_param_allgather_2d_max_bytes() : fc_param_reduce_scatter_2d_max_bytes();
  if (limit >= 0) return bytes <= (size_t)limit;
  const size_t measured = allgather ? ALLGATHER_2D_MEASURED_BYTES : REDUCE_SCATTER_2D_MEASURED_BYTES;
  return bytes <= measured || hosts_2d_predicted(coll, bytes, l, H, L);
}

size_t fc_tuner_hosts_2d_predicted_limit(fc_coll_t coll, const fc_links_t *l, int nranks) {
  int H, L;
  if (!hosts_2d_shape(coll, l, nranks, &H, &L)) return 0;
  size_t last = 0;
  for (size_t bytes = 1 << 10; bytes <= FC_TUNER_HOSTS_2D_SCAN_MAX && hosts_2d_predicted(coll, bytes, l, H, L); bytes *= 2)
    last = bytes;
  return last;
}

int fc_tuner_kernels(void) { return forced_algo() < 0; }

size_t fc_tuner_chunk_count(size_t count, size_t esize) {
  size_t chunk = (size_t)fc_param_chunk_size() / esize;
  if (chunk == 0) chunk = 1;
  /* Bound the number of chunks (messages between a pair are numbered in 16 bits). */
  const size_t max_chunks = 4096;
  if (count / chunk >= max_chunks) chunk = count / max_chunks + 1;
  return chunk;
}
