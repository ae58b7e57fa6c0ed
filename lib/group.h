/* group.h — one collective call as data, and the group queue (flexcoll_group_start/end).
 * Inside a group, calls and communicator initialisations are queued per thread and run at the
 * outermost group_end, each communicator's work in its own thread so that a single thread can
 * drive several communicators whose ranks wait on one another. */
#ifndef FC_GROUP_H
#define FC_GROUP_H

#include "flexcoll.h"
#include "algos/algos.h"

typedef enum { FC_CALL_COLL, FC_CALL_SEND, FC_CALL_RECV, FC_CALL_WINDOW_REGISTER, FC_CALL_WINDOW_DEREGISTER } fc_call_kind_t;

static inline int fc_call_is_p2p(fc_call_kind_t k) { return k == FC_CALL_SEND || k == FC_CALL_RECV; }

typedef struct {
  fc_coll_t coll;
  const void *sendbuf;
  void *recvbuf;
  size_t count; /* as fc_algo_args_t.count */
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  int root;                 /* the peer of a send or receive */
  flexcoll_comm_t comm;
  flexcoll_stream_t stream;
  fc_call_kind_t kind;
  /* Windows: recvbuf and count are the buffer and its bytes. */
  struct flexcoll_window *window;      /* deregister */
  struct flexcoll_window **window_out; /* register */
} fc_call_t;

/* Run a validated collective now (api.c). */
flexcoll_result_t fc_call_run(const fc_call_t *call);
/* Run n validated sends and receives of one communicator together (api.c). */
flexcoll_result_t fc_p2p_run(const fc_call_t *calls, int n);

/* Register or deregister a window now (api.c). */
flexcoll_result_t fc_window_call_run(const fc_call_t *call);

/* Nonzero inside flexcoll_group_start/end on this thread. */
int fc_group_active(void);
flexcoll_result_t fc_group_enqueue_call(const fc_call_t *call);
flexcoll_result_t fc_group_enqueue_init(flexcoll_comm_t comm);
/* How many more sends and receives of comm this thread's group takes in a row (a batch holds
 * FC_P2P_MAX_OPS). */
int fc_group_p2p_room(flexcoll_comm_t comm);
/* Tests: the root of a gather or scatter outside a group queues at most ops (2..FC_P2P_MAX_OPS)
 * of its sends and receives per group, to cover the cut that large communicators need (api.c). */
void fc_rooted_set_batch_ops(int ops);
/* Whether comm's initialisation is queued in this thread's group (so calls on it may be queued). */
int fc_group_inits(flexcoll_comm_t comm);

#endif
