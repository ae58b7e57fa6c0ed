/* tuner.c — algorithm choice by message size and rank count.
 * Trees win when latency dominates (log2(n) steps instead of 2(n-1)); rings when bandwidth does
 * (every rank sends 2(n-1)/n of the data once instead of the whole message per tree level); the
 * exchange (one step, n-1 times the bytes) when only latency counts. */
#define _GNU_SOURCE
#include "sched.h"

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
/* Host allgather over hosts of equally many ranks in two dimensions up to this size (the larger
 * buffer): beyond it, on 4 processes as two hosts of one machine, the packed columns' copies cost
 * more than the fewer rounds and transfers between hosts gain (docs/PERFORMANCE.md, session 34);
 * with the hosts' link limited to 1 Gbit/s two dimensions won at every size measured, at 10 Gbit/s
 * up to about 4 MiB (session 35). */
FC_PARAM_INT(allgather_2d_max_bytes, "ALLGATHER_2D_MAX_BYTES", 1 << 20)
/* The same for reduce_scatter (its send buffer), whose round 0 packs the whole input by columns:
 * measured alike, it gained up to 4 MiB and lost at 16 MiB (docs/PERFORMANCE.md, session 35). */
FC_PARAM_INT(reduce_scatter_2d_max_bytes, "REDUCE_SCATTER_2D_MAX_BYTES", 4 << 20)
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

int fc_tuner_hosts_2d(fc_coll_t coll, size_t bytes) {
  if (coll == FC_COLL_ALLGATHER) return bytes <= (size_t)fc_param_allgather_2d_max_bytes();
  if (coll == FC_COLL_REDUCE_SCATTER) return bytes <= (size_t)fc_param_reduce_scatter_2d_max_bytes();
  return 0;
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
