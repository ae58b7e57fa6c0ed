/* algos.h — collective algorithms as schedules of steps.
 *
 * An algorithm turns (collective, rank, nranks, root, count) into a list of steps over three
 * buffers (the user's send and receive buffers and a scratch buffer the executor provides).
 * It knows nothing of links, memory types or reductions' arithmetic: executors (host C code,
 * CUDA kernels and copy engines) run the same schedule.
 *
 * Steps are grouped into rounds.  All steps of one round may run concurrently; round r+1 starts
 * when every step of round r on this rank has completed.  Between two ranks, the k-th SEND from
 * a to b (in schedule order) matches the k-th RECV/RECV_REDUCE on b from a, with equal counts.
 * Offsets and counts are in elements.  Pure C, no I/O: unit-tested by a simulator.
 */
#ifndef FC_ALGOS_H
#define FC_ALGOS_H

#include <stddef.h>
#include <stdint.h>
#include "flexcoll.h"

typedef enum { FC_COLL_ALLREDUCE, FC_COLL_ALLGATHER, FC_COLL_REDUCE_SCATTER, FC_COLL_BROADCAST,
               FC_COLL_REDUCE, FC_COLL_ALLTOALL, FC_NUM_COLLS } fc_coll_t;
typedef enum { FC_ALGO_RING, FC_ALGO_TREE, FC_ALGO_EXCHANGE, FC_NUM_ALGOS } fc_algo_t;
/* FC_BUF_EXT + i: the i-th buffer of a point-to-point batch (fc_algo_build_p2p). */
typedef enum { FC_BUF_SEND, FC_BUF_RECV, FC_BUF_SCRATCH, FC_BUF_NONE, FC_BUF_EXT } fc_buf_t;
#define FC_P2P_MAX_OPS 250 /* buffers of a batch must fit the uint8_t buffer index */

typedef enum {
  FC_STEP_SEND,        /* send count elements at (buf, off) to peer */
  FC_STEP_RECV,        /* receive count elements from peer into (buf, off) */
  FC_STEP_RECV_REDUCE, /* (buf, off) = (src_buf, src_off) op (count elements received from peer) */
  FC_STEP_COPY,        /* (buf, off) = (src_buf, src_off); the executor skips it when both are the same memory */
  FC_STEP_REDUCE       /* (buf, off) = (buf, off) op (src_buf, src_off), locally */
} fc_step_kind_t;

typedef struct {
  uint8_t kind;    /* fc_step_kind_t */
  uint8_t buf;     /* fc_buf_t: destination (RECV, RECV_REDUCE, COPY, REDUCE) or source (SEND) */
  uint8_t src_buf; /* fc_buf_t: RECV_REDUCE's local operand, COPY's source, REDUCE's second operand; FC_BUF_NONE otherwise */
  int peer;        /* SEND/RECV/RECV_REDUCE; -1 for COPY and REDUCE */
  size_t off;
  size_t src_off;
  size_t count;
} fc_step_t;

typedef struct {
  fc_step_t *steps;
  int nsteps, cap_steps;
  int *round_start; /* steps of round r: [round_start[r], round_start[r+1]) */
  int nrounds, cap_rounds;
  size_t scratch_count; /* elements of scratch the executor must provide */
  /* Where the reduced result lands on this rank (for FLEXCOLL_AVG's final division);
   * result_count 0 when this rank holds no reduced result (or the collective reduces nothing). */
  uint8_t result_buf;
  size_t result_off, result_count;
} fc_schedule_t;

/* The arguments of one collective call, as the user gave them.
 * count: allreduce/broadcast/reduce: elements; allgather: sendcount; reduce_scatter: recvcount. */
typedef struct {
  fc_coll_t coll;
  fc_algo_t algo;
  int rank, nranks, root;
  size_t count;
  size_t chunk_count; /* pipeline chunk in elements (tree/chain algorithms); 0: one chunk */
  /* The ranks' hierarchy (NULL: rank order, one host).  order[p] is the rank at position p, the
   * ranks of each host next to each other; pos its inverse; host[r] the host of rank r.  Rings
   * follow order (a ring crosses each host boundary once whatever the rank numbering); the
   * binomial trees of allreduce, broadcast and reduce number their nodes so that the root's host
   * comes first and each host is a contiguous range of nodes, so the lowest levels (the first
   * reduction steps, the last broadcast steps) stay within hosts and only the upper ones cross
   * between them.  Every rank must pass the same arrays. */
  const int *order, *pos, *host;
  /* 1: allgather and reduce_scatter keep the flat ring where the hosts would allow two
   * dimensions (the tuner's choice by size, the same on every rank). */
  int flat_ring;
} fc_algo_args_t;

/* Build the schedule of args on this rank into s (fc_schedule_init'ed or reused; fc_schedule_reset
 * is done inside).  Returns FLEXCOLL_INVALID_ARGUMENT for unsupported (coll, algo) pairs. */
flexcoll_result_t fc_algo_build(fc_schedule_t *s, const fc_algo_args_t *args);
/* A batch of sends and receives of one rank (the point-to-point calls of a group): one round,
 * op i's buffer is FC_BUF_EXT + i, steps in op order.  nops <= FC_P2P_MAX_OPS. */
typedef struct {
  int is_send;
  int peer;
  size_t count;
} fc_p2p_op_t;
flexcoll_result_t fc_algo_build_p2p(fc_schedule_t *s, const fc_p2p_op_t *ops, int nops);

/* Whether algo implements coll. */
int fc_algo_supports(fc_coll_t coll, fc_algo_t algo);
const char *fc_algo_name(fc_algo_t algo);
const char *fc_coll_name(fc_coll_t coll);
/* Parse "ring"/"tree"/"exchange" (case-insensitive); -1 when unknown. */
int fc_algo_from_name(const char *name);

void fc_schedule_init(fc_schedule_t *s);
void fc_schedule_reset(fc_schedule_t *s);
void fc_schedule_free(fc_schedule_t *s);

/* Elements of the send and receive buffers the collective touches on rank (for the simulator
 * and the executors' bounds). */
size_t fc_coll_send_count(fc_coll_t coll, size_t count, int nranks);
size_t fc_coll_recv_count(fc_coll_t coll, size_t count, int nranks);

/* What a rank's collective reads and writes of the caller's buffers, for executors that stage
 * them (lib/gpu's host copies): send_read, whether send is an input (a broadcast's non-root send
 * is not: NCCL lets it be any pointer); send_in_recv, whether send lies whole inside recv (in
 * place, as allreduce, allgather, broadcast and reduce have it), send_off then its byte offset
 * there (recv inside send, in-place reduce_scatter, is not this: on rank 0 both start at the same
 * address); recv_written, whether recv is an output (a reduce's non-root recv is not). */
typedef struct {
  int send_read, send_in_recv, recv_written;
  size_t send_off;
} fc_coll_io_t;
fc_coll_io_t fc_coll_io(const fc_algo_args_t *a, const void *send, const void *recv, size_t esize);

#endif
