/* bootstrap.h — the TCP bootstrap: how the ranks of a communicator find each other.
 *
 * A root listener (a detached thread, in the process that created the unique id or in rank 0 of a
 * launcher job) collects one hello per rank, then tells every rank where rank+1 listens.  The ranks
 * then connect into a TCP ring, which carries the small all-gathers and barriers of communicator
 * setup and lets a rank notice that a neighbour process died.
 *
 * Environment: FLEXCOLL_SOCKET_IFNAME picks the interface (NCCL_SOCKET_IFNAME syntax: "eth0",
 * prefixes "eth,ib", "^docker,lo" to exclude, "=eth0" for an exact name; default: the first up,
 * non-loopback interface with IPv4, else loopback); FLEXCOLL_BOOTSTRAP_TIMEOUT (seconds, default
 * 120, <= 0: no limit) is how long a root waits for its ranks before giving up.
 *
 * Every message on the wire is a frame: type, call number, payload length, checked before the
 * payload is read (lib/bootstrap/net.h).  The root answers only hellos with its magic.
 *
 * Thread safety: functions on different fc_bootstrap_t objects may run concurrently (many ranks may
 * live as threads of one process).  On one object, fc_bootstrap_peer_lost may run concurrently with
 * allgather/barrier; everything else needs the caller's serialisation.
 *
 * The implementation lives in lib/bootstrap/: net.c (addresses, the unique id, interfaces,
 * listeners), root.c (the root listener) and rank.c (rendezvous, ring, all-gather), sharing the
 * private lib/bootstrap/net.h.
 */
#ifndef FC_BOOTSTRAP_H
#define FC_BOOTSTRAP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "flexcoll.h"

typedef struct fc_bootstrap fc_bootstrap_t;

/* Fill id with a fresh random 64-bit magic and the address of a new root listener: a detached
 * thread of this process that serves one rendezvous (its rank count comes from the first hello),
 * then exits, or exits after FLEXCOLL_BOOTSTRAP_TIMEOUT seconds without completion.  When ranks
 * disagree on the rank count, every rank is failed (FLEXCOLL_INVALID_ARGUMENT) and the root exits
 * once as many ranks as the larger count were told. */
flexcoll_result_t fc_bootstrap_create_root(flexcoll_unique_id_t *id);

/* An id for a root at a known "host:port" ("[v6addr]:port" for IPv6; launchers: MASTER_ADDR:
 * MASTER_PORT).  The magic is a hash of the string, nranks and secret (NULL or "": none), so every
 * rank computes the same id without talking; without a secret, anyone who knows host:port and
 * nranks can compute it too.  A malformed or unresolvable string -> FLEXCOLL_INVALID_ARGUMENT. */
flexcoll_result_t fc_bootstrap_id_from_address(flexcoll_unique_id_t *id, const char *hostport, int nranks,
                                               const char *secret);

/* A root listener that its starter stops (fc_bootstrap_start_root). */
typedef struct fc_bootstrap_root fc_bootstrap_root_t;

/* Start the root listener for an id from fc_bootstrap_id_from_address (rank 0 of a launcher job),
 * with SO_REUSEADDR, on the id's address; where this host cannot bind it (a NAT address, or a host
 * name in hostport that maps to loopback here), on FLEXCOLL_SOCKET_IFNAME's address, else on every
 * address.  hostport (may be NULL) is the string the id came from.  *root must be passed to
 * fc_bootstrap_stop_root once the rendezvous is over or has failed. */
flexcoll_result_t fc_bootstrap_start_root(const flexcoll_unique_id_t *id, const char *hostport,
                                          fc_bootstrap_root_t **root);

/* Release everything the root took: it stops serving (ranks that joined are told the rendezvous
 * failed), closes its listener and its thread is joined, so the port is free on return.  After a
 * complete rendezvous this only joins.  NULL is fine. */
void fc_bootstrap_stop_root(fc_bootstrap_root_t *root);

/* The secret that flexcoll_comm_init_from_env mixes into the magic (lib/launch.c):
 * FLEXCOLL_BOOTSTRAP_SECRET, else the job id of the launcher named (as in its launcher table:
 * "torchrun", "Open MPI", "PMI", "Slurm"); NULL if none.  *source names the variable used. */
const char *fc_launch_secret(const char *launcher, const char **source);

/* The 128-byte id: version, marker, magic, IPv4 or IPv6 socket address, checksum, zeros.
 * decode returns FLEXCOLL_INVALID_ARGUMENT for an id that is not well formed. */
flexcoll_result_t fc_bootstrap_id_encode(flexcoll_unique_id_t *id, uint64_t magic, const struct sockaddr *addr,
                                         socklen_t len);
flexcoll_result_t fc_bootstrap_id_decode(const flexcoll_unique_id_t *id, uint64_t *magic,
                                         struct sockaddr_storage *addr, socklen_t *len);

/* Rendezvous of rank `rank` of `nranks` (collective): connect to the root and send this rank's
 * listen address (both retried with backoff until the timeout: the root may not listen yet, or
 * may close a connection unanswered, under a flood or for a wrong magic), then build the ring
 * (connect to rank+1, accept from rank-1, both checked by magic and rank).  timeout_ms bounds every wait (time without progress);
 * timeout_ms <= 0 waits forever.  abort_flag (may be NULL) turning nonzero makes any wait return
 * FLEXCOLL_REMOTE_ERROR within about 50 ms.  On failure *bs is NULL. */
flexcoll_result_t fc_bootstrap_init(fc_bootstrap_t **bs, const flexcoll_unique_id_t *id, int rank, int nranks,
                                    int timeout_ms, atomic_int *abort_flag);

/* Ring all-gather (collective): data holds nranks*bytes with this rank's slot (rank*bytes) filled;
 * on return every slot is.  All ranks must pass the same bytes (checked: FLEXCOLL_INTERNAL_ERROR). */
flexcoll_result_t fc_bootstrap_allgather(fc_bootstrap_t *bs, void *data, size_t bytes);

/* From now on every wait of bs calls progress(arg) between nonblocking polls instead of sleeping
 * in poll (NULL: back to sleeping).  For the exchanges of a communicator that carries traffic
 * (stage 2, comm_split, window registration): a rank that reaches one may still owe a peer bytes
 * of the last collective that only its own progress moves (UCX over TCP keeps what the socket did
 * not take), and that peer reaches the exchange only once they have arrived.  Not thread-safe
 * against a wait on bs in progress. */
void fc_bootstrap_set_progress(fc_bootstrap_t *bs, int (*progress)(void *), void *arg);

/* Returns once every rank has entered the barrier (collective). */
flexcoll_result_t fc_bootstrap_barrier(fc_bootstrap_t *bs);

/* Whether every rank passed ok != 0 (collective): *first_not is the lowest rank that did not, -1
 * when all did. */
flexcoll_result_t fc_bootstrap_agree(fc_bootstrap_t *bs, int ok, int *first_not);

/* Nonblocking: 1 when a ring neighbour's socket was closed or failed (its process died or closed
 * its bootstrap), else 0.  Consumes no protocol data. */
int fc_bootstrap_peer_lost(fc_bootstrap_t *bs);

/* Close every socket and free bs (NULL is fine). */
void fc_bootstrap_close(fc_bootstrap_t *bs);

#endif
