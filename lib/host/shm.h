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
 * is left in /dev/shm once the last rank unmaps.
 *
 * Windows on host memory (window.c): memory from flexcoll_host_alloc is a shared file that the
 * peers map when it is registered as a window; an allreduce whose buffers lie in windows then
 * needs no slot at all: each rank folds its part of every rank's input straight into every rank's
 * output (the window mode), the segment's rounds only say when inputs are ready and outputs done. */
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

/* Where a collective's shared buffers lie in host windows: each at its offset from its window's
 * start; NULL for a buffer the peers do not touch. */
typedef struct {
  const struct flexcoll_window *send, *recv;
  size_t send_off, recv_off;
} fc_shm_windows_t;

/* Run a host collective through the segment in the given mode (fc_tuner_shm's pick, not
 * FC_SHM_OFF); the buffers were checked by the API (count > 0, in-place forms only).  bytes: the
 * larger buffer's (the tuner's size); win: where the buffers lie for FC_SHM_WINDOW
 * (fc_host_windows_find), else NULL. */
flexcoll_result_t fc_shm_run(struct flexcoll_comm *comm, fc_shm_mode_t mode, const fc_algo_args_t *args,
                             const void *sendbuf, void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op,
                             size_t bytes, const fc_shm_windows_t *win);

/* ---- windows on host memory (window.c) ---- */
/* Collective (flexcoll_window_register on host memory; arguments checked by api.c): buf must lie
 * in one allocation of flexcoll_host_alloc.  Peers in other processes map it where the ranks
 * share a segment; elsewhere the window is kept unmapped (its calls take the other paths). */
flexcoll_result_t fc_host_window_register(struct flexcoll_comm *comm, void *buf, size_t bytes,
                                          struct flexcoll_window **out);
/* Collective: unmaps the peers' allocations; the allocation may be freed afterwards. */
flexcoll_result_t fc_host_window_deregister(struct flexcoll_comm *comm, struct flexcoll_window *w);
/* Whether w is a live host window of comm. */
int fc_host_window_valid(struct flexcoll_comm *comm, const struct flexcoll_window *w);
/* At destroy: unmap every window of comm (local). */
void fc_host_windows_release(struct flexcoll_comm *comm);
/* Whether the buffers of coll that the peers touch (allreduce: both; reduce_scatter, broadcast:
 * sendbuf; allgather: recvbuf) lie in comm's host windows, mapped into the peers (ranks sharing
 * a segment): *out says where. */
int fc_host_windows_find(const struct flexcoll_comm *comm, fc_coll_t coll, const void *sendbuf, size_t send_bytes,
                         const void *recvbuf, size_t recv_bytes, fc_shm_windows_t *out);

#endif
