/* exchange.c — FC_ALGO_EXCHANGE: every collective in one round of messages, for small ones.
 *
 * Each rank sends what each peer needs straight to it, all in round 0: its whole input to every
 * other rank (allreduce, allgather), block q of its input to rank q (reduce_scatter, alltoall),
 * its input to the root (reduce), or the root's input to every rank (broadcast).  Received inputs
 * to reduce land in slots of scratch (slot q: rank q's; a rank copies its own into its slot, so
 * that an in-place call may overwrite recv later), and the rank folds them into recv in rank
 * order, one local step per round (the steps of a round run concurrently, and each one writes
 * recv): recv = slot 0, recv op= slot 1, ..., recv op= slot n-1.
 *
 * Latency: one message time instead of the ring's n-1 or 2(n-1) or the tree's 2 log2(n), for up
 * to n-1 times the bytes sent by a rank; so only for small messages (the tuner decides).  Every
 * rank that reduces folds the same inputs in the same order, so all ranks hold the same bits,
 * also where op is not commutative bit for bit (floating-point MAX/MIN of +0 and -0, NaN
 * payloads): recursive doubling, which folds in partner order, would not give that. */
#include "build.h"

/* recv[0, count) = slot 0 op slot 1 op ... op slot n-1 of scratch, in that order. */
static void fold_slots(fc_build_t *b, int n, size_t count) {
  fc_build_round(b);
  fc_build_copy(b, FC_BUF_RECV, 0, FC_BUF_SCRATCH, 0, count);
  for (int q = 1; q < n; q++) {
    fc_build_round(b);
    fc_build_reduce(b, FC_BUF_RECV, 0, FC_BUF_SCRATCH, (size_t)q * count, count);
  }
  fc_build_result(b, FC_BUF_RECV, 0, count);
}

void fc_exchange_build(fc_build_t *b, const fc_algo_args_t *a) {
  const int n = a->nranks, me = a->rank, root = a->root;
  const size_t count = a->count;
  switch (a->coll) {
    case FC_COLL_ALLREDUCE:
    case FC_COLL_REDUCE_SCATTER: {
      /* What rank q needs of this rank's input: all of it, or its block. */
      const int blocks = a->coll == FC_COLL_REDUCE_SCATTER;
      b->s->scratch_count = (size_t)n * count;
      for (int q = 0; q < n; q++) {
        if (q == me) continue;
        fc_build_send(b, q, FC_BUF_SEND, blocks ? (size_t)q * count : 0, count);
        fc_build_recv(b, q, FC_BUF_SCRATCH, (size_t)q * count, count);
      }
      fc_build_copy(b, FC_BUF_SCRATCH, (size_t)me * count, FC_BUF_SEND, blocks ? (size_t)me * count : 0, count);
      fold_slots(b, n, count);
      break;
    }
    case FC_COLL_REDUCE:
      if (me != root) {
        fc_build_send(b, root, FC_BUF_SEND, 0, count);
        break;
      }
      b->s->scratch_count = (size_t)n * count;
      for (int q = 0; q < n; q++)
        if (q != me) fc_build_recv(b, q, FC_BUF_SCRATCH, (size_t)q * count, count);
      fc_build_copy(b, FC_BUF_SCRATCH, (size_t)me * count, FC_BUF_SEND, 0, count);
      fold_slots(b, n, count);
      break;
    case FC_COLL_ALLGATHER:
    case FC_COLL_ALLTOALL: {
      /* Rank q's block of recv comes from rank q: this rank's input (allgather), or block me of
       * rank q's input (alltoall); the own block is copied (allgather in place: the same memory,
       * which the executor skips). */
      const int blocks = a->coll == FC_COLL_ALLTOALL;
      for (int q = 0; q < n; q++) {
        if (q == me) continue;
        fc_build_send(b, q, FC_BUF_SEND, blocks ? (size_t)q * count : 0, count);
        fc_build_recv(b, q, FC_BUF_RECV, (size_t)q * count, count);
      }
      fc_build_copy(b, FC_BUF_RECV, (size_t)me * count, FC_BUF_SEND, blocks ? (size_t)me * count : 0, count);
      break;
    }
    case FC_COLL_BROADCAST:
      if (me != root) {
        fc_build_recv(b, root, FC_BUF_RECV, 0, count);
        break;
      }
      for (int q = 0; q < n; q++)
        if (q != me) fc_build_send(b, q, FC_BUF_SEND, 0, count);
      fc_build_copy(b, FC_BUF_RECV, 0, FC_BUF_SEND, 0, count);
      break;
    default:
      break;
  }
}
