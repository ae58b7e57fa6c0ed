/* exchange.c — FC_ALGO_EXCHANGE: allreduce in one round of messages, for small messages.
 *
 * Round 0: every rank sends its whole input to every other rank and receives every other rank's
 * into its slot of scratch (n slots of count elements; its own input is copied into its slot, so
 * that an in-place call may overwrite recv later).  Then every rank folds the n slots into recv
 * in rank order, one local step per round (the steps of a round run concurrently, and each one
 * writes recv): recv = slot 0, recv op= slot 1, ..., recv op= slot n-1.
 *
 * Latency: one message time instead of the ring's 2(n-1) or the tree's 2 log2(n), for (n-1)
 * times the bytes sent; so only for small messages (the tuner decides).  Every rank computes the
 * same fold in the same order, so all ranks hold the same bits, also where op is not commutative
 * bit for bit (floating-point MAX/MIN of +0 and -0, NaN payloads): recursive doubling, which
 * folds in partner order, would not give that. */
#include "build.h"

void fc_exchange_build(fc_build_t *b, const fc_algo_args_t *a) {
  const int n = a->nranks, me = a->rank;
  const size_t count = a->count;
  b->s->scratch_count = (size_t)n * count;
  for (int q = 0; q < n; q++) {
    if (q == me) continue;
    fc_build_send(b, q, FC_BUF_SEND, 0, count);
    fc_build_recv(b, q, FC_BUF_SCRATCH, (size_t)q * count, count);
  }
  fc_build_copy(b, FC_BUF_SCRATCH, (size_t)me * count, FC_BUF_SEND, 0, count);
  fc_build_round(b);
  fc_build_copy(b, FC_BUF_RECV, 0, FC_BUF_SCRATCH, 0, count);
  for (int q = 1; q < n; q++) {
    fc_build_round(b);
    fc_build_reduce(b, FC_BUF_RECV, 0, FC_BUF_SCRATCH, (size_t)q * count, count);
  }
  fc_build_result(b, FC_BUF_RECV, 0, count);
}
