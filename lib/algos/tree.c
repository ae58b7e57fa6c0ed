/* tree.c — FC_ALGO_TREE: binomial trees, pipelined over chunks as a wavefront.
 *
 * Ranks are renumbered v = (rank - root + n) % n, or by the hierarchy where the ranks are on
 * several hosts (tnode_t.order: the root's host first, each host a contiguous range of nodes).
 * The parent of v > 0 is v with its lowest set bit cleared; the children of v are v + 2^j for every j below that bit (every j for v = 0) with
 * v + 2^j < n.  So v's subtree is the contiguous range [v, v + 2^t) with t = v's lowest bit, and
 * the depth of v is popcount(v).
 *
 * Reduce: chunk k of child v+2^j arrives in global round j+k and v sends its own partial of chunk
 * k up in round t+k.  The children's rounds differ (one j each), so a chunk never gets two
 * contributions in one round, and all of them are in before v sends it.
 * Broadcast: v at depth d receives chunk k in round d-1+k and sends it to all its children in
 * round d+k.
 * Each message is sent and received in the same global round (see build.h). */
#include "build.h"

typedef struct {
  int n, root, v;
  int depth; /* popcount(v) */
  int t;     /* v > 0: index of v's lowest set bit (v sends up in round t+k) */
  int nkids; /* children are v + 2^j for j < nkids */
  /* With a hierarchy (fc_algo_args_t.order): node u is the rank at position (u + rot) % n of
   * order, where rot is the first position of the root's host, except that the root and the
   * rank at rot trade places (u = 0 is the root, u = swap the other).  Hosts stay contiguous
   * ranges of nodes, so subtrees fill a host before they cross to the next. */
  const int *order;
  int rot, swap;
} tnode_t;

/* The node number of rank r. */
static int node_of(const tnode_t *nd, const fc_algo_args_t *a, int r) {
  if (!nd->order) return fc_mod(r - nd->root, nd->n);
  int u = fc_mod(a->pos[r] - nd->rot, nd->n);
  return u == nd->swap ? 0 : u == 0 ? nd->swap : u;
}

/* The tree of rank `rank` rooted at root; hier: number the nodes by the hierarchy (where a
 * has one), else by rank (allgather's gather needs subtrees that are rank ranges). */
static tnode_t tnode_of(const fc_algo_args_t *a, int rank, int root, int hier) {
  const int n = a->nranks;
  tnode_t nd = {n, root, 0, 0, 0, 0, NULL, 0, 0};
  if (hier && a->order && a->pos && a->host) {
    nd.order = a->order;
    nd.rot = a->pos[root];
    while (nd.rot > 0 && a->host[a->order[nd.rot - 1]] == a->host[root]) nd.rot--;
    nd.swap = a->pos[root] - nd.rot;
  }
  nd.v = node_of(&nd, a, rank);
  for (int x = nd.v; x; x &= x - 1) nd.depth++;
  if (nd.v)
    while (!((nd.v >> nd.t) & 1)) nd.t++;
  while ((nd.v == 0 || nd.nkids < nd.t) && (long long)nd.v + (1LL << nd.nkids) < n) nd.nkids++;
  return nd;
}

static int rank_of(const tnode_t *nd, long long u) {
  if (!nd->order) return (int)((u + nd->root) % nd->n);
  if (u == 0) return nd->root;
  if (u == nd->swap) return nd->order[nd->rot];
  return nd->order[(u + nd->rot) % nd->n];
}
static int child_rank(const tnode_t *nd, int j) { return rank_of(nd, nd->v + (1LL << j)); }
static int parent_rank(const tnode_t *nd) { return rank_of(nd, nd->v & (nd->v - 1)); }

/* Reduction towards the tree's root: partials of chunk k accumulate in acc (at the chunk's own
 * offset, or in slot k % nslots when nslots > 0, to bound scratch). */
typedef struct {
  tnode_t nd;
  fc_chunks_t ch;
  fc_buf_t acc;
  long long nslots;
} tred_t;

static size_t acc_off(const tred_t *r, long long k) {
  return r->nslots ? (size_t)(k % r->nslots) * r->ch.chunk : fc_chunk_off(&r->ch, k);
}

/* Last global round in which the reduction has work on this rank. */
static long long tree_reduce_last(const tred_t *r) {
  return (r->nd.v ? r->nd.t : r->nd.nkids - 1) + r->ch.nchunks - 1;
}

/* Round g writes chunks g-j (j < nkids) and reads chunk g-t (t >= nkids): all distinct.  The first
 * child's contribution (j = 0, always present when there are children) is combined with send,
 * later ones with the partial; a leaf sends straight from send. */
static void tree_reduce_round(fc_build_t *b, const tred_t *r, long long g) {
  const tnode_t *nd = &r->nd;
  for (int j = 0; j < nd->nkids; j++) {
    long long k = g - j;
    if (!fc_chunk_valid(&r->ch, k)) continue;
    int first = j == 0;
    fc_build_recv_reduce(b, child_rank(nd, j), r->acc, acc_off(r, k), first ? FC_BUF_SEND : r->acc,
                         first ? fc_chunk_off(&r->ch, k) : acc_off(r, k), fc_chunk_len(&r->ch, k));
  }
  long long k = g - nd->t;
  if (nd->v == 0 || !fc_chunk_valid(&r->ch, k)) return;
  if (nd->nkids)
    fc_build_send(b, parent_rank(nd), r->acc, acc_off(r, k), fc_chunk_len(&r->ch, k));
  else
    fc_build_send(b, parent_rank(nd), FC_BUF_SEND, fc_chunk_off(&r->ch, k), fc_chunk_len(&r->ch, k));
}

/* Broadcast from the tree's root into recv; the root reads src.  Round g writes chunk g-d+1 and
 * reads chunk g-d. */
static void tree_bcast_round(fc_build_t *b, const tnode_t *nd, const fc_chunks_t *ch, fc_buf_t src, long long g) {
  long long k = g - nd->depth + 1;
  if (nd->v && fc_chunk_valid(ch, k))
    fc_build_recv(b, parent_rank(nd), FC_BUF_RECV, fc_chunk_off(ch, k), fc_chunk_len(ch, k));
  k = g - nd->depth;
  if (!fc_chunk_valid(ch, k)) return;
  for (int j = 0; j < nd->nkids; j++)
    fc_build_send(b, child_rank(nd, j), nd->v ? FC_BUF_RECV : src, fc_chunk_off(ch, k), fc_chunk_len(ch, k));
}

static long long tree_bcast_last(const tnode_t *nd, const fc_chunks_t *ch) {
  return nd->depth + ch->nchunks - 1;
}

static void tree_broadcast(fc_build_t *b, const fc_algo_args_t *a) {
  tnode_t nd = tnode_of(a, a->rank, a->root, 1);
  fc_chunks_t ch = fc_chunks(a->count, a->chunk_count);
  for (long long g = nd.v ? nd.depth - 1 : 0; g <= tree_bcast_last(&nd, &ch); g++) {
    fc_build_round(b);
    if (nd.v == 0 && g == 0) fc_build_copy(b, FC_BUF_RECV, 0, FC_BUF_SEND, 0, a->count);
    tree_bcast_round(b, &nd, &ch, FC_BUF_SEND, g);
  }
}

/* Reduce: the root accumulates in recv; other ranks in scratch (never in recv, which they may
 * not write).  A non-root's chunk k is live from round k (first child) to round t+k (sent), so
 * t+1 slots suffice. */
static void tree_reduce(fc_build_t *b, const fc_algo_args_t *a) {
  tred_t r = {tnode_of(a, a->rank, a->root, 1), fc_chunks(a->count, a->chunk_count), FC_BUF_RECV, 0};
  if (r.nd.v) {
    r.acc = FC_BUF_SCRATCH;
    r.nslots = r.ch.nchunks < r.nd.t + 1 ? r.ch.nchunks : r.nd.t + 1;
    if (r.nd.nkids) {
      size_t slots_len = (size_t)r.nslots * r.ch.chunk;
      b->s->scratch_count = slots_len < a->count ? slots_len : a->count;
    }
  }
  for (long long g = 0; g <= tree_reduce_last(&r); g++) {
    fc_build_round(b);
    tree_reduce_round(b, &r, g);
  }
  if (r.nd.v == 0) fc_build_result(b, FC_BUF_RECV, 0, a->count);
}

/* Allreduce: reduce to rank 0 in recv on every rank, then broadcast recv from rank 0; every rank
 * ends with rank 0's bits.  The broadcast of chunk k starts (round B0+k, B0 = rank 0's number of
 * children) as soon as rank 0 has reduced it, overlapping the reduction of later chunks.  On a
 * rank, round g's broadcast touches chunks below g-B0-d+2 <= g-t, the reduction chunks >= g-t
 * (B0 > t since 2^t <= v < n <= 2^B0), so the two phases never share memory in a round, and a
 * chunk is overwritten by the broadcast only after its partial went up. */
static void tree_allreduce(fc_build_t *b, const fc_algo_args_t *a) {
  tred_t r = {tnode_of(a, a->rank, 0, 1), fc_chunks(a->count, a->chunk_count), FC_BUF_RECV, 0};
  long long b0 = tnode_of(a, 0, 0, 1).nkids;
  long long last = tree_reduce_last(&r), blast = b0 + tree_bcast_last(&r.nd, &r.ch);
  if (blast > last) last = blast;
  for (long long g = 0; g <= last; g++) {
    fc_build_round(b);
    tree_reduce_round(b, &r, g);
    if (g >= b0) tree_bcast_round(b, &r.nd, &r.ch, FC_BUF_RECV, g - b0);
  }
  fc_build_result(b, FC_BUF_RECV, 0, a->count);
}

/* Gather to rank 0 (tree rooted at 0, so v == rank and subtrees are contiguous rank ranges, hence
 * contiguous blocks of recv): child v+2^j sends its whole subtree in round j.  A leaf sends its
 * block from send; an inner rank first copies its own block into recv (round 0, beside child 0's
 * block v+1) and sends [v, v+2^t) in round t, after all children's rounds j < t. */
static void tree_gather_round(fc_build_t *b, const tnode_t *nd, size_t c, long long g) {
  if (g == 0 && (nd->nkids || nd->v == 0)) fc_build_copy(b, FC_BUF_RECV, (size_t)nd->v * c, FC_BUF_SEND, 0, c);
  if (g < nd->nkids) {
    long long lo = nd->v + (1LL << g), hi = nd->v + (2LL << g);
    if (hi > nd->n) hi = nd->n;
    fc_build_recv(b, child_rank(nd, (int)g), FC_BUF_RECV, (size_t)lo * c, (size_t)(hi - lo) * c);
  }
  if (nd->v == 0 || g != nd->t) return;
  if (nd->nkids == 0) {
    fc_build_send(b, parent_rank(nd), FC_BUF_SEND, 0, c);
  } else {
    long long hi = nd->v + (1LL << nd->t);
    if (hi > nd->n) hi = nd->n;
    fc_build_send(b, parent_rank(nd), FC_BUF_RECV, (size_t)nd->v * c, (size_t)(hi - nd->v) * c);
  }
}

/* Allgather: gather, then broadcast all of recv (n*count, chunked) from rank 0 from round B0 on,
 * when rank 0's gather is done.  Every rank receives the whole buffer, its own blocks included:
 * one contiguous message per chunk beats skipping a few blocks for the small sizes trees are for. */
static void tree_allgather(fc_build_t *b, const fc_algo_args_t *a) {
  tnode_t nd = tnode_of(a, a->rank, 0, 0);
  fc_chunks_t ch = fc_chunks((size_t)a->nranks * a->count, a->chunk_count);
  long long b0 = tnode_of(a, 0, 0, 0).nkids;
  if (a->count == 0) return;
  for (long long g = 0; g <= b0 + tree_bcast_last(&nd, &ch); g++) {
    fc_build_round(b);
    if (g < b0) tree_gather_round(b, &nd, a->count, g);
    else tree_bcast_round(b, &nd, &ch, FC_BUF_RECV, g - b0);
  }
}

void fc_tree_build(fc_build_t *b, const fc_algo_args_t *a) {
  switch (a->coll) {
    case FC_COLL_ALLREDUCE: tree_allreduce(b, a); break;
    case FC_COLL_ALLGATHER: tree_allgather(b, a); break;
    case FC_COLL_BROADCAST: tree_broadcast(b, a); break;
    case FC_COLL_REDUCE: tree_reduce(b, a); break;
    default: b->err = FLEXCOLL_INVALID_ARGUMENT; break;
  }
}
