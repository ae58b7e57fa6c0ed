/* moe.h — MoE dispatch and combine (flexcoll_moe_*), one-sided over the peers' mappings: the
 * kernels' arguments and C interface (lib/kernels/moe.cu), shared with lib/moe/moe.c.
 *
 * Every rank owns one shared area, registered as a window at create so that every peer maps it
 * once (layout below, identical on all ranks: the configuration is checked equal at create),
 * and a local state block that no peer touches.  Shared area, in order:
 *   dflag[src][block]  u64  dispatch: (epoch low 32 bits << 32) | rows block `block` of rank src
 *                           wrote here this call (posted by every sender block, every call)
 *   rel[src][block]    u64  the last dispatch epoch rank src's block `block` has entered: src is
 *                           done with everything of the calls before it (its receive rows read,
 *                           reset to the sentinel, its combine area consumed)
 *   cflag[src][block]  u64  combine, FENCE mode: the epoch whose rows block `block` of rank src
 *                           has pushed into our combine area
 *   meta[src][max_tokens]  u64  per received row: (epoch low 32 bits << 32) | the user's meta word
 *   recv[src][max_tokens][row_bytes]  the dispatched rows (what flexcoll_moe_dispatch returns)
 *   comb[src][max_tokens][row_bytes]  combine: rank src's expert outputs for our tokens, at the
 *                           rows our dispatch gave them on src (float payloads only)
 * SENTINEL mode: recv and comb rows hold the all-ones bit pattern (a NaN in every float type)
 * wherever no row is due; a sender turns that one pattern into the type's canonical quiet NaN, so
 * a receiver sees an element is there once it differs from all-ones, and resets the rows it
 * consumed (recv at its next dispatch, comb at the end of its combine). */
#ifndef FC_MOE_H
#define FC_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "flexcoll.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ranks of a moe communicator (the blocks' shared counters are sized for it). */
#define FC_MOE_MAX_RANKS 64
/* Most blocks of a moe grid, and threads per block (the one-shot kernels' 512, so the same
 * shared-GPU cap on the grid keeps every rank's blocks resident at once). */
#define FC_MOE_MAX_BLOCKS 32
#define FC_MOE_THREADS 512
/* Meta word of a received row: token index in the low 16 bits, top_k mask above (flexcoll.h). */
#define FC_MOE_MAX_TOKENS 65536
#define FC_MOE_MAX_TOP_K 15

typedef struct {
  int rank, nranks;
  int max_tokens, top_k, num_experts, experts_per_rank;
  int dtype;             /* flexcoll_datatype_t of the payload */
  int sentinel;          /* 1: SENTINEL mode, 0: FENCE */
  unsigned blocks;       /* the grid of both kernels, the same on every rank */
  size_t row_bytes;      /* hidden * element size, a multiple of 16 */
  /* Offsets in every shared area (the layout above). */
  size_t off_dflag, off_rel, off_cflag, off_meta, off_recv, off_comb;
  char *const *peer;     /* device array [nranks]: rank q's shared area as mapped here ([rank]: ours) */
  char *shared;          /* ours */
  /* Local state (device memory, zeroed at create). */
  unsigned long long *epoch; /* dispatches so far: a dispatch takes *epoch + 1, its last block stores it */
  unsigned *done;        /* blocks of the running dispatch that have read the epoch */
  int *ctr;              /* [2][nranks]: rows taken per destination, parity epoch & 1 (the other is zeroed) */
  int *recv_counts;      /* [nranks] */
  int *recv_meta;        /* [nranks][max_tokens] */
  int *route;            /* [max_tokens][top_k]: dest * max_tokens + row of the token's k-th expert, -1: none */
  uint64_t timeout_ns;
  int *error;            /* the communicator's host-mapped error word (FC_DEV_ERROR_*) */
} fc_moe_kargs_t;

/* Dispatch T tokens (tokens: T rows of row_bytes, 16-byte aligned; ids: T x top_k). */
int fc_moe_kernel_dispatch(const fc_moe_kargs_t *a, const void *tokens, const int *ids, int T, flexcoll_stream_t stream);
/* Combine the last dispatch's T tokens: out[t] = sum over k of weights[t][k] * row, fp32, k order. */
int fc_moe_kernel_combine(const fc_moe_kargs_t *a, const void *expert_out, const float *weights, void *out, int T,
                          flexcoll_stream_t stream);
/* Load both kernels now (CUDA's lazy loading would wait for queued work at the first launch). */
int fc_moe_kernels_preload(void);

#ifdef __cplusplus
}
#endif
#endif
