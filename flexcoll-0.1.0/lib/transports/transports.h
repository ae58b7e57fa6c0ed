/* transports.h — how bytes move between ranks.
 *
 * The host transport (ucx_host.c) carries host-memory collectives between processes and hosts
 * through UCX (shared memory, TCP, RDMA — whatever UCX finds) and between threads of one process
 * on the same code path.  It offers tagged, nonblocking point-to-point messages; the executors
 * decide what to send.  Every wait is the caller's: requests are tested, never blocked on. */
#ifndef FC_TRANSPORTS_H
#define FC_TRANSPORTS_H

#include <stddef.h>
#include <stdint.h>

#include "flexcoll.h"

struct flexcoll_comm;
typedef struct fc_ucx fc_ucx_t;
typedef void *fc_ucx_req_t; /* NULL: completed at post time */

/* Create the UCX context and worker of comm, exchange worker addresses through the bootstrap and
 * connect to every peer. */
flexcoll_result_t fc_ucx_init(struct flexcoll_comm *comm);
/* Close endpoints (flushing unless force) and free everything. */
void fc_ucx_close(struct flexcoll_comm *comm, int force);

flexcoll_result_t fc_ucx_isend(struct flexcoll_comm *comm, int peer, const void *buf, size_t bytes, uint64_t tag,
                               fc_ucx_req_t *req);
flexcoll_result_t fc_ucx_irecv(struct flexcoll_comm *comm, int peer, void *buf, size_t bytes, uint64_t tag,
                               fc_ucx_req_t *req);
/* Drive the worker; returns nonzero when something happened. */
int fc_ucx_progress(struct flexcoll_comm *comm);
/* *done = 1 once *req has completed (the request is then released and *req set to NULL). */
flexcoll_result_t fc_ucx_test(struct flexcoll_comm *comm, fc_ucx_req_t *req, int *done);
/* fc_ucx_test for a receive that must bring exactly `expect` bytes (else FLEXCOLL_INVALID_USAGE). */
flexcoll_result_t fc_ucx_test_recv(struct flexcoll_comm *comm, fc_ucx_req_t *req, size_t expect, int *done);
/* Cancel and release a request that will not be waited for (abort, error paths). */
void fc_ucx_cancel(struct flexcoll_comm *comm, fc_ucx_req_t *req);

#endif
