/* host.h — the host-memory executor: runs algorithm schedules (lib/algos) on host buffers with
 * C reductions, moving data between ranks through the host transport (UCX). */
#ifndef FC_HOST_H
#define FC_HOST_H

#include <stddef.h>
#include <stdint.h>
#include "flexcoll.h"
#include "algos/algos.h"

/* dst[i] = a[i] op b[i] for i < count (dst may alias a or b).  AVG reduces as SUM here; the
 * division happens once at the end (fc_host_divide).  float16/bfloat16 accumulate in float and
 * round to nearest even per operation, as the CUDA kernels do. */
void fc_host_reduce(void *dst, const void *a, const void *b, size_t count, flexcoll_datatype_t dtype,
                    flexcoll_op_t op);
/* buf[i] /= n (integers: C division, truncating toward zero). */
void fc_host_divide(void *buf, size_t count, flexcoll_datatype_t dtype, int n);

struct flexcoll_comm;
/* Run the schedule of args on comm with host buffers; returns when this rank's part is done. */
flexcoll_result_t fc_host_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                              void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op);

/* The same on device buffers, where some link toward every peer takes device memory
 * (fc_links_device_memory; the transfers go over those links only): sends and receives straight
 * from and into the device buffers, copy steps and reductions on the device (fc_mem_copy,
 * fc_mem_reduce; scratch and landing space in device memory), never the shared-memory paths.
 * An in-place alltoall is refused (FLEXCOLL_INTERNAL_ERROR): lib/gpu runs it out of place from a
 * copy of its input. */
flexcoll_result_t fc_host_run_device(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                                     void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op);

/* Why a host wait must stop, or FLEXCOLL_SUCCESS: abort, an asynchronous error, a ring
 * neighbour lost (looked at when now passes *next_peer_check, then 50 ms later), or no progress
 * since last_progress (ms, CLOCK_MONOTONIC) for the communicator's timeout; seq names the
 * collective in the message.  The last two also set the communicator's asynchronous error. */
flexcoll_result_t fc_host_check_stuck(struct flexcoll_comm *comm, uint32_t seq, double last_progress,
                                      double *next_peer_check);

/* Run a batch of point-to-point sends and receives (counts in bytes) over host buffers bufs[i]. */
flexcoll_result_t fc_host_run_p2p(struct flexcoll_comm *comm, const fc_p2p_op_t *ops, int nops, void *const *bufs);

#endif
