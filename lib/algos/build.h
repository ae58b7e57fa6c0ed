/* build.h — private helpers the algorithms (ring.c, tree.c, exchange.c) use to append steps to a schedule.
 *
 * Builders write rounds in a global numbering shared by all ranks (round g of rank a and round g
 * of rank b happen "at the same time").  A rank has nothing to do in many of those rounds, so
 * fc_build_round reuses the current round while it is still empty: a rank's schedule only holds
 * the rounds in which it acts.  Because every message is sent and received in the same global
 * round, and a pair exchanges at most one message per direction and round, the schedules are
 * deadlock-free even when a SEND only completes once the peer has posted its RECV.
 *
 * Steps of count 0 are dropped: both ends compute the same count, so they drop the same message.
 * (Point-to-point batches, fc_algo_build_p2p, are the exception to "one message per pair, direction
 * and round": a batch is one round, and its messages of a pair are matched in op order.)
 */
#ifndef FC_ALGOS_BUILD_H
#define FC_ALGOS_BUILD_H

#include "algos.h"

typedef struct {
  fc_schedule_t *s;
  flexcoll_result_t err; /* first failure; later appends are ignored so builders need no checks */
} fc_build_t;

/* Start a new round (no-op while the current round is still empty). */
void fc_build_round(fc_build_t *b);
/* Append a step to the current round (starting round 0 if there is none). */
void fc_build_step(fc_build_t *b, fc_step_kind_t kind, int peer, fc_buf_t buf, size_t off, fc_buf_t src_buf,
                   size_t src_off, size_t count);

static inline void fc_build_send(fc_build_t *b, int peer, fc_buf_t buf, size_t off, size_t count) {
  fc_build_step(b, FC_STEP_SEND, peer, buf, off, FC_BUF_NONE, 0, count);
}
static inline void fc_build_recv(fc_build_t *b, int peer, fc_buf_t buf, size_t off, size_t count) {
  fc_build_step(b, FC_STEP_RECV, peer, buf, off, FC_BUF_NONE, 0, count);
}
static inline void fc_build_recv_reduce(fc_build_t *b, int peer, fc_buf_t buf, size_t off, fc_buf_t src_buf,
                                        size_t src_off, size_t count) {
  fc_build_step(b, FC_STEP_RECV_REDUCE, peer, buf, off, src_buf, src_off, count);
}
static inline void fc_build_copy(fc_build_t *b, fc_buf_t buf, size_t off, fc_buf_t src_buf, size_t src_off,
                                 size_t count) {
  fc_build_step(b, FC_STEP_COPY, -1, buf, off, src_buf, src_off, count);
}
static inline void fc_build_reduce(fc_build_t *b, fc_buf_t buf, size_t off, fc_buf_t src_buf, size_t src_off,
                                   size_t count) {
  fc_build_step(b, FC_STEP_REDUCE, -1, buf, off, src_buf, src_off, count);
}
static inline void fc_build_result(fc_build_t *b, fc_buf_t buf, size_t off, size_t count) {
  b->s->result_buf = (uint8_t)buf;
  b->s->result_off = off;
  b->s->result_count = count;
}

/* Start of block i when count elements are split into n balanced blocks: floor(i*count/n),
 * computed as i*(count/n) + i*(count%n)/n so that i*count cannot overflow. */
static inline size_t fc_block_start(size_t count, int n, int i) {
  size_t q = count / (size_t)n, rem = count % (size_t)n;
  return (size_t)i * q + (size_t)i * rem / (size_t)n;
}
static inline size_t fc_block_len(size_t count, int n, int i) {
  return fc_block_start(count, n, i + 1) - fc_block_start(count, n, i);
}

/* A message cut into pipeline chunks of `chunk` elements (the last one may be shorter). */
typedef struct {
  size_t count, chunk;
  long long nchunks; /* signed: builders compute chunk indices as round - depth, which go negative */
} fc_chunks_t;

static inline fc_chunks_t fc_chunks(size_t count, size_t chunk_count) {
  fc_chunks_t c;
  c.count = count;
  c.chunk = (chunk_count == 0 || chunk_count > count) ? count : chunk_count;
  c.nchunks = count == 0 ? 0 : (long long)((count - 1) / c.chunk + 1);
  return c;
}
static inline int fc_chunk_valid(const fc_chunks_t *c, long long i) { return i >= 0 && i < c->nchunks; }
static inline size_t fc_chunk_off(const fc_chunks_t *c, long long i) { return (size_t)i * c->chunk; }
static inline size_t fc_chunk_len(const fc_chunks_t *c, long long i) {
  size_t off = fc_chunk_off(c, i);
  return c->count - off < c->chunk ? c->count - off : c->chunk;
}

/* (x mod n) in [0, n) for any int x. */
static inline int fc_mod(int x, int n) { return ((x % n) + n) % n; }

/* Algorithm entry points, called by fc_algo_build for nranks >= 2 with valid, supported args. */
void fc_ring_build(fc_build_t *b, const fc_algo_args_t *a);
void fc_tree_build(fc_build_t *b, const fc_algo_args_t *a);
void fc_exchange_build(fc_build_t *b, const fc_algo_args_t *a);

#endif
