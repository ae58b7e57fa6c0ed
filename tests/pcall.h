/* pcall.h — one checked collective call of the API tests (test_coll, test_soak): the buffers of
 * one rank for one call (poisoned, guarded, filled with the harness's reproducible inputs), the
 * call itself, and the check of every buffer against the reference (harness.h). */
#ifndef FC_TEST_PCALL_H
#define FC_TEST_PCALL_H

#include <stddef.h>
#include <stdint.h>

#include "flexcoll.h"
#include "harness.h"

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_BROADCAST, C_REDUCE, C_ALLTOALL, NCOLLS };
extern const char *const coll_names[NCOLLS];

static inline int coll_reduces(int c) { return c == C_ALLREDUCE || c == C_REDUCE_SCATTER || c == C_REDUCE; }
static inline int coll_rooted(int c) { return c == C_BROADCAST || c == C_REDUCE; }
/* Collectives that FLEXCOLL_ALGO=tree does not implement (it falls back to the ring). */
static inline int coll_ring_only(int c) { return c == C_REDUCE_SCATTER || c == C_ALLTOALL; }

/* Optional placement of a call's buffers (pcall_t.place; NULL: heap buffers from hx_buf_new).
 * send and recv each point to a region that the caller owns (e.g. inside a registered host window)
 * for the buffer that pcall_prepare would otherwise allocate as sb or rb: the buffer's leading
 * guard starts there, its data HX_GUARD bytes further, its trailing guard right after the data;
 * all of it is poisoned (as hx_buf_new does) and must fit in the region's *_cap bytes.  A NULL
 * region: that buffer comes from the heap as usual.  The regions must not overlap.  Placed
 * buffers are never freed by pcall_check / pcall_free; the placement must stay as it is until then.
 * With a send region, a broadcast's non-roots always pass a sendbuf of their own (never NULL,
 * which host windows refuse: every rank's sendbuf decides broadcast's path). */
typedef struct {
  unsigned char *send, *recv;
  size_t send_cap, recv_cap;
  const char *what; /* how they are placed, for pcall_describe ("...; <what>"), or NULL */
} pcall_place_t;

typedef struct {
  int coll;
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  size_t count; /* as the API takes it: allgather sendcount, reduce_scatter recvcount */
  int root, inplace;
  int rank, nranks;
  hx_data_t d;
  hx_buf_t sb, rb; /* unused ones have base NULL */
  const void *send;
  void *recv;
  const pcall_place_t *place; /* NULL: heap buffers (see pcall_place_t) */
} pcall_t;

/* "allreduce float32 sum count 7 in place (call 12)" into buf (with a placement: "...; <its what>"). */
void pcall_describe(char *buf, size_t n, const pcall_t *p);
/* Allocate (or place, p->place) and fill the buffers of p for rank p->rank (the caller sets coll,
 * dtype, op, count, root, inplace, rank, nranks, place).  Returns 0, or -1 when out of memory or a
 * placed buffer does not fit its region (after reporting). */
int pcall_prepare(hx_rank_t *r, pcall_t *p, uint64_t seed, uint64_t call);
/* The call on comm, host buffers, NULL stream. */
flexcoll_result_t pcall_issue(const pcall_t *p, flexcoll_comm_t comm);
/* Check every buffer of p (reported as rank p->rank; mismatches count in r->errors), then free them
 * (placed ones are only forgotten). */
void pcall_check(hx_rank_t *r, pcall_t *p);
/* Free the buffers of p without checking (after a failed call). */
void pcall_free(pcall_t *p);

#endif
