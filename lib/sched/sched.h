/* sched.h — what runs a collective: the algorithm chosen for (collective, bytes, ranks, memory).
 * Link cost models and the split of a collective across links live here too (GPU path). */
#ifndef FC_SCHED_H
#define FC_SCHED_H

#include <stddef.h>
#include "algos/algos.h"
#include "gpu/gpu.h"

/* The algorithm for coll moving `bytes` (the largest buffer of the call) among nranks ranks.
 * FLEXCOLL_ALGO=ring|tree forces it where the collective has that algorithm. */
fc_algo_t fc_tuner_pick(fc_coll_t coll, size_t bytes, int nranks, fc_mem_t mem);
/* Whether a device collective of `bytes` (the largest buffer) goes direct (lib/gpu/direct.c):
 * allreduce, allgather and broadcast from FLEXCOLL_DIRECT_MIN_BYTES up (what the one-shot path
 * leaves them), reduce_scatter from FLEXCOLL_DIRECT_RS_MIN_BYTES, unless
 * FLEXCOLL_DIRECT=0 or FLEXCOLL_ALGO forces an algorithm. */
int fc_tuner_direct(fc_coll_t coll, size_t bytes, int nranks);
/* Whether direct mode may exchange buffer addresses at a call (FLEXCOLL_DIRECT=2) for buffers
 * outside symmetric windows; otherwise those run the staged schedule. */
int fc_tuner_direct_exchange(void);
/* Pipeline chunk in elements for a message of count elements of esize bytes. */
size_t fc_tuner_chunk_count(size_t count, size_t esize);

#endif
