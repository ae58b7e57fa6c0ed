/* shm.h — host collectives straight through shared memory, for ranks of one host.
 *
 * One POSIX shared-memory segment per communicator (all its ranks on one host): per rank two
 * control lines (the last round it posted, the last round it finished reading) and a ring of
 * slots.  A collective is a sequence of rounds; in round s every rank copies what its peers need
 * into its slot s % FC_SHM_SLOTS, posts s (release), waits for the posts it needs (acquire),
 * reads the peers' slots and marks s done; a slot is written again only once every rank is done
 * with the round that used it last.  No UCX, no messages: one copy in, one copy (or fold) out.
 *
 * Results are bitwise those of the exchange algorithm (lib/algos/exchange.c): every reduction
 * folds the n inputs in rank order.  Waits are bounded like the host executor's (abort, the
 * timeout, the bootstrap ring's watch) and by the segment's broken word, which a rank whose wait
 * failed sets so that every rank on the host stops at once.  The segment is unlinked as soon as
 * every rank mapped it: a dead rank's pages stay mapped for the survivors (no SIGBUS) and nothing
 * is left in /dev/shm once the last rank unmaps. */
#ifndef FC_HOST_SHM_H
#define FC_HOST_SHM_H

#include <stddef.h>

#include "flexcoll.h"
#include "algos/algos.h"
#include "sched/sched.h"

struct flexcoll_comm;

/* Most ranks of one segment (a fold keeps one operand pointer per rank on the stack). */
#define FC_SHM_MAX_RANKS 64

/* Collective, at communicator creation (after the bootstrap and the settings check): map the
 * communicator's segment where FLEXCOLL_SHM_DIRECT allows it and every rank shares this host;
 * comm->shm stays NULL where any rank cannot use it (one INFO line says why).  Fails only when
 * the bootstrap does; then nothing is left in /dev/shm. */
flexcoll_result_t fc_shm_open(struct flexcoll_comm *comm);
/* Whether the segment's ranks outnumber the host's cores (rank 0's count: the same on every
 * rank); 0 without a segment. */
int fc_shm_crowded(const struct flexcoll_comm *comm);
/* Unmap (local; the segment was unlinked at creation).  NULL comm->shm is fine. */
void fc_shm_close(struct flexcoll_comm *comm);

/* Run a host collective through the segment in the given mode (fc_tuner_shm's pick, not
 * FC_SHM_OFF); the buffers were checked by the API (count > 0, in-place forms only). */
flexcoll_result_t fc_shm_run(struct flexcoll_comm *comm, fc_shm_mode_t mode, const fc_algo_args_t *args,
                             const void *sendbuf, void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op);

#endif
