/* ring.c — FC_ALGO_RING: ring allreduce / allgather / reduce-scatter, pipelined chains for
 * broadcast and reduce, and pairwise exchange for alltoall.  The ring is the ranks in
 * fc_algo_args_t.order (host by host; rank order without it): a rank sends to the next position
 * and receives from the previous one, except the reduce chain, which runs the other way so that
 * data ends at the root, and alltoall, whose round k pairs rank r with r+k and r-k.
 *
 * Rounds are numbered globally (see build.h); a message is always sent and received in the same
 * global round, so schedules stay deadlock-free even with rendezvous sends. */
#include <stdlib.h>
#include <string.h>

#include "build.h"

/* Ranks sit on the ring in a->order (rank order without it): v is this rank's position, and
 * block b of allgather and reduce_scatter belongs to the rank at position b (rk). */
typedef struct {
  int n, r, next, prev;
  size_t count;
  int v;
  const int *order, *pos;
} ring_t;

static int rk(const ring_t *g, int p) { return g->order ? g->order[p] : p; }
static int at(const ring_t *g, int rank) { return g->pos ? g->pos[rank] : rank; }

static ring_t ring_of(const fc_algo_args_t *a) {
  const int hier = a->order && a->pos;
  ring_t g = {a->nranks, a->rank, 0, 0, a->count, 0, hier ? a->order : NULL, hier ? a->pos : NULL};
  g.v = at(&g, a->rank);
  g.next = rk(&g, (g.v + 1) % g.n);
  g.prev = rk(&g, (g.v + g.n - 1) % g.n);
  return g;
}

/* Allreduce: ring reduce-scatter then ring allgather, both on balanced blocks of recv.  Block b
 * starts at rank b and is reduced once by every rank along the ring, ending fully reduced at
 * rank b-1; the allgather then only copies it.  So every rank holds the same bits.
 * Round s of the first half sends block r-s (from send at s = 0, else the partial in recv) and
 * reduces block r-s-1 into recv: different blocks, so the round's steps never overlap, and in
 * place (send == recv) block r-s-1 is read and written only by that one element-wise step. */
static void ring_allreduce(fc_build_t *b, const ring_t *g) {
  int n = g->n;
  for (int s = 0; s < n - 1; s++) {
    int sb = fc_mod(g->v - s, n), rb = fc_mod(g->v - s - 1, n);
    fc_build_round(b);
    fc_build_send(b, g->next, s == 0 ? FC_BUF_SEND : FC_BUF_RECV, fc_block_start(g->count, n, sb),
                  fc_block_len(g->count, n, sb));
    fc_build_recv_reduce(b, g->prev, FC_BUF_RECV, fc_block_start(g->count, n, rb), FC_BUF_SEND,
                         fc_block_start(g->count, n, rb), fc_block_len(g->count, n, rb));
  }
  /* Rank r now owns block r+1. */
  for (int s = 0; s < n - 1; s++) {
    int sb = fc_mod(g->v + 1 - s, n), rb = fc_mod(g->v - s, n);
    fc_build_round(b);
    fc_build_send(b, g->next, FC_BUF_RECV, fc_block_start(g->count, n, sb), fc_block_len(g->count, n, sb));
    fc_build_recv(b, g->prev, FC_BUF_RECV, fc_block_start(g->count, n, rb), fc_block_len(g->count, n, rb));
  }
  fc_build_result(b, FC_BUF_RECV, 0, g->count);
}

/* Allreduce over hosts of L ranks each (H >= 2 hosts, L >= 2, every host alike), in two
 * dimensions as NCCL's trees and rings go within nodes first: (A) a ring reduce-scatter within
 * the host leaves host position l with block l+1 of the message reduced over the host; (B) the H
 * ranks of one host position, one per host, run a ring allreduce of that block (sub-blocks by host
 * index); (C) a ring allgather within the host.  Between hosts each rank moves 2(H-1)/H of its
 * block, 1/L of the message, over L parallel rings instead of the flat ring's whole message on one
 * pair per host boundary; and 2(L-1) + 2(H-1) rounds instead of 2(LH-1).  Every element is folded
 * at exactly one rank (its sub-block's last step in B) and only copied after, so every rank holds
 * the same bits.  Rounds: A is 0..L-2, B the next 2(H-1), C the last L-1, the same on every rank,
 * and each message is sent and received in one round (build.h).  In place, A is the flat ring's
 * first half; B folds recv into itself, one element-wise step per sub-block and round. */
static int uniform_hosts(const fc_algo_args_t *a, int *hosts, int *per) {
  if (!a->order || !a->pos || !a->host || a->nranks < 4) return 0;
  int h = a->host[a->order[a->nranks - 1]] + 1, l = a->nranks / h;
  if (h < 2 || l < 2 || l * h != a->nranks) return 0;
  for (int p = 0; p < a->nranks; p++)
    if (a->host[a->order[p]] != p / l) return 0;
  *hosts = h;
  *per = l;
  return 1;
}

static void ring2d_allreduce(fc_build_t *b, const fc_algo_args_t *a, int H, int L) {
  const int v = a->pos[a->rank], hv = v / L, lv = v % L;
  const int lnext = a->order[hv * L + (lv + 1) % L], lprev = a->order[hv * L + (lv + L - 1) % L];
  const int hnext = a->order[((hv + 1) % H) * L + lv], hprev = a->order[((hv + H - 1) % H) * L + lv];
  const size_t c = a->count;
  for (int s = 0; s < L - 1; s++) { /* A */
    int sb = fc_mod(lv - s, L), rb = fc_mod(lv - s - 1, L);
    fc_build_round(b);
    fc_build_send(b, lnext, s == 0 ? FC_BUF_SEND : FC_BUF_RECV, fc_block_start(c, L, sb), fc_block_len(c, L, sb));
    fc_build_recv_reduce(b, lprev, FC_BUF_RECV, fc_block_start(c, L, rb), FC_BUF_SEND, fc_block_start(c, L, rb),
                         fc_block_len(c, L, rb));
  }
  const int own = (lv + 1) % L; /* the block this rank holds reduced over its host */
  const size_t bs = fc_block_start(c, L, own), bl = fc_block_len(c, L, own);
  for (int s = 0; s < H - 1; s++) { /* B: reduce-scatter of the block between hosts */
    int sb = fc_mod(hv - s, H), rb = fc_mod(hv - s - 1, H);
    fc_build_round(b);
    fc_build_send(b, hnext, FC_BUF_RECV, bs + fc_block_start(bl, H, sb), fc_block_len(bl, H, sb));
    fc_build_recv_reduce(b, hprev, FC_BUF_RECV, bs + fc_block_start(bl, H, rb), FC_BUF_RECV,
                         bs + fc_block_start(bl, H, rb), fc_block_len(bl, H, rb));
  }
  for (int s = 0; s < H - 1; s++) { /* B: allgather of the block between hosts */
    int sb = fc_mod(hv + 1 - s, H), rb = fc_mod(hv - s, H);
    fc_build_round(b);
    fc_build_send(b, hnext, FC_BUF_RECV, bs + fc_block_start(bl, H, sb), fc_block_len(bl, H, sb));
    fc_build_recv(b, hprev, FC_BUF_RECV, bs + fc_block_start(bl, H, rb), fc_block_len(bl, H, rb));
  }
  for (int s = 0; s < L - 1; s++) { /* C */
    int sb = fc_mod(lv + 1 - s, L), rb = fc_mod(lv - s, L);
    fc_build_round(b);
    fc_build_send(b, lnext, FC_BUF_RECV, fc_block_start(c, L, sb), fc_block_len(c, L, sb));
    fc_build_recv(b, lprev, FC_BUF_RECV, fc_block_start(c, L, rb), fc_block_len(c, L, rb));
  }
  fc_build_result(b, FC_BUF_RECV, 0, c);
}

/* Allreduce over hosts of unequal rank counts (H >= 2 hosts of L_h ranks, some L_h >= 2): the
 * equal hosts' three phases, each host with its own blocks.  (A) a ring reduce-scatter within host
 * h over L_h blocks of the message leaves each rank its own block reduced over the host (a host of
 * one rank: its input); (B) the message is cut where any host's blocks begin (the common
 * refinement: each segment lies in one block on every host, so it has one owner per host), and
 * each segment runs a ring allreduce among its H owners, in sub-blocks by host index; (C) a ring
 * allgather within each host.  Between hosts every rank moves 2(H-1)/H of its block instead of the
 * flat ring's whole message over one pair per host boundary.
 * The build rule (build.h) allows one message per pair, direction and round, and a rank may own
 * several segments; two segments whose owners are the same pair between some neighbouring hosts
 * would break it.  So segments run in waves (greedy over the segments in order: a segment joins
 * the first wave holding none it shares such a pair with), each wave its 2(H-1) rounds; ownership
 * is contiguous, so waves are few.  Every element is folded once along a fixed chain (within its
 * host, then along its segment's ring) and only copied after: every rank holds the same bits.  The
 * inputs are the same on every rank (order, hosts, count), so every rank builds the same waves.
 * Up to FC_RING2D_MAX ranks (fixed-size tables, no allocation that one rank could fail alone);
 * beyond, the flat ring. */
#define FC_RING2D_MAX 256

typedef struct {
  int H, base[FC_RING2D_MAX + 1]; /* host h holds positions base[h] .. base[h+1]-1 */
  int nseg;
  size_t start[2 * FC_RING2D_MAX + 2]; /* segment k: [start[k], start[k+1]) */
  int wave[2 * FC_RING2D_MAX + 1];
} hosts2d_t;

/* Hosts contiguous in order (as links.c numbers them), at least two, one of them with 2 ranks. */
static int uneven_hosts(const fc_algo_args_t *a, hosts2d_t *t) {
  const int n = a->nranks;
  if (!a->order || !a->pos || !a->host || n < 3 || n > FC_RING2D_MAX) return 0;
  int h = 0, most = 0;
  t->base[0] = 0;
  for (int p = 1; p <= n; p++)
    if (p == n || a->host[a->order[p]] != a->host[a->order[p - 1]]) {
      if (p < n && a->host[a->order[p]] != h + 1) return 0;
      most = p - t->base[h] > most ? p - t->base[h] : most;
      t->base[++h] = p;
    }
  t->H = h;
  return h >= 2 && most >= 2;
}

static int host_size(const hosts2d_t *t, int h) { return t->base[h + 1] - t->base[h]; }

/* The rank of host h holding x after phase A: the block of the host's L blocks that contains x is
 * held by position (block - 1) mod L, as the ring reduce-scatter leaves it. */
static int owner(const fc_algo_args_t *a, const hosts2d_t *t, int h, size_t x) {
  const int L = host_size(t, h);
  int i = 0;
  while (i < L - 1 && x >= fc_block_start(a->count, L, i + 1)) i++;
  return a->order[t->base[h] + fc_mod(i - 1, L)];
}

static int cmp_size(const void *x, const void *y) {
  const size_t u = *(const size_t *)x, v = *(const size_t *)y;
  return (u > v) - (u < v);
}

/* Segments and their waves.  0 when waves would run out (cannot happen with contiguous blocks;
 * the flat ring then). */
static int segments(const fc_algo_args_t *a, hosts2d_t *t) {
  int nb = 0;
  for (int h = 0; h < t->H; h++)
    for (int i = 0; i <= host_size(t, h); i++) t->start[nb++] = fc_block_start(a->count, host_size(t, h), i);
  qsort(t->start, (size_t)nb, sizeof t->start[0], cmp_size);
  int k = 0;
  for (int i = 0; i < nb; i++)
    if (k == 0 || t->start[i] != t->start[k - 1]) t->start[k++] = t->start[i];
  t->nseg = k - 1; /* nonempty [start[k], start[k+1]) */
  /* A host's owner follows its block index, which only grows along the message: the segments
   * whose owners on an edge (hosts h, h+1) are a given pair form one run.  So segment j shares a
   * pair with exactly the earlier segments from the first of the runs it ends, over all edges:
   * O(segments x ranks), not a pairwise comparison per schedule built. */
  int cur[FC_RING2D_MAX], prev[FC_RING2D_MAX], run[FC_RING2D_MAX];
  for (int j = 0; j < t->nseg; j++) {
    for (int h = 0; h < t->H; h++) cur[h] = owner(a, t, h, t->start[j]);
    int from = j;
    for (int h = 0; h < t->H; h++) {
      const int g = (h + 1) % t->H;
      if (j == 0 || cur[h] != prev[h] || cur[g] != prev[g]) run[h] = j;
      from = run[h] < from ? run[h] : from;
    }
    memcpy(prev, cur, sizeof(int) * (size_t)t->H);
    unsigned long long used = 0;
    for (int i = from; i < j; i++) used |= 1ull << t->wave[i];
    int w = 0;
    while (w < 64 && (used >> w & 1)) w++;
    if (w == 64) return 0;
    t->wave[j] = w;
  }
  return 1;
}

static void ring2d_uneven_allreduce(fc_build_t *b, const fc_algo_args_t *a, const hosts2d_t *t) {
  const int v = a->pos[a->rank];
  int hv = 0;
  while (v >= t->base[hv + 1]) hv++;
  const int L = host_size(t, hv), lv = v - t->base[hv], H = t->H;
  int most = 0, waves = 0;
  for (int h = 0; h < H; h++) most = host_size(t, h) > most ? host_size(t, h) : most;
  for (int k = 0; k < t->nseg; k++) waves = t->wave[k] + 1 > waves ? t->wave[k] + 1 : waves;
  const int lnext = a->order[t->base[hv] + (lv + 1) % L], lprev = a->order[t->base[hv] + fc_mod(lv - 1, L)];
  const size_t c = a->count;
  if (L == 1) {
    fc_build_round(b);
    fc_build_copy(b, FC_BUF_RECV, 0, FC_BUF_SEND, 0, c);
  }
  for (int s = 0; s < most - 1; s++) { /* A (rounds all hosts count alike; a smaller host idles) */
    fc_build_round(b);
    if (s >= L - 1) continue;
    int sb = fc_mod(lv - s, L), rb = fc_mod(lv - s - 1, L);
    fc_build_send(b, lnext, s == 0 ? FC_BUF_SEND : FC_BUF_RECV, fc_block_start(c, L, sb), fc_block_len(c, L, sb));
    fc_build_recv_reduce(b, lprev, FC_BUF_RECV, fc_block_start(c, L, rb), FC_BUF_SEND, fc_block_start(c, L, rb),
                         fc_block_len(c, L, rb));
  }
  for (int w = 0; w < waves; w++)
    for (int s = 0; s < 2 * (H - 1); s++) { /* B: per wave, reduce-scatter then allgather between hosts */
      fc_build_round(b);
      const int rs = s < H - 1, q = rs ? s : s - (H - 1);
      const int sb = rs ? fc_mod(hv - q, H) : fc_mod(hv + 1 - q, H);
      const int rb = rs ? fc_mod(hv - q - 1, H) : fc_mod(hv - q, H);
      for (int k = 0; k < t->nseg; k++) {
        if (t->wave[k] != w || owner(a, t, hv, t->start[k]) != a->rank) continue;
        const size_t bs = t->start[k], bl = t->start[k + 1] - t->start[k];
        const int to = owner(a, t, (hv + 1) % H, bs), from = owner(a, t, fc_mod(hv - 1, H), bs);
        fc_build_send(b, to, FC_BUF_RECV, bs + fc_block_start(bl, H, sb), fc_block_len(bl, H, sb));
        if (rs)
          fc_build_recv_reduce(b, from, FC_BUF_RECV, bs + fc_block_start(bl, H, rb), FC_BUF_RECV,
                               bs + fc_block_start(bl, H, rb), fc_block_len(bl, H, rb));
        else
          fc_build_recv(b, from, FC_BUF_RECV, bs + fc_block_start(bl, H, rb), fc_block_len(bl, H, rb));
      }
    }
  for (int s = 0; s < most - 1; s++) { /* C */
    fc_build_round(b);
    if (s >= L - 1) continue;
    int sb = fc_mod(lv + 1 - s, L), rb = fc_mod(lv - s, L);
    fc_build_send(b, lnext, FC_BUF_RECV, fc_block_start(c, L, sb), fc_block_len(c, L, sb));
    fc_build_recv(b, lprev, FC_BUF_RECV, fc_block_start(c, L, rb), fc_block_len(c, L, rb));
  }
  fc_build_result(b, FC_BUF_RECV, 0, c);
}

/* Allgather: round s forwards block r-s and receives block r-s-1.  Round 0 sends straight from
 * send so the own-block copy (skipped in place) runs alongside instead of before it. */
static void ring_allgather(fc_build_t *b, const ring_t *g) {
  size_t c = g->count;
  for (int s = 0; s < g->n - 1; s++) {
    int sb = fc_mod(g->v - s, g->n), rb = fc_mod(g->v - s - 1, g->n);
    fc_build_round(b);
    if (s == 0) {
      fc_build_copy(b, FC_BUF_RECV, (size_t)g->r * c, FC_BUF_SEND, 0, c);
      fc_build_send(b, g->next, FC_BUF_SEND, 0, c);
    } else {
      fc_build_send(b, g->next, FC_BUF_RECV, (size_t)rk(g, sb) * c, c);
    }
    fc_build_recv(b, g->prev, FC_BUF_RECV, (size_t)rk(g, rb) * c, c);
  }
}

/* Allgather over hosts of L ranks each (H >= 2 hosts, L >= 2, every host alike), in two
 * dimensions: (A) the H ranks of one host position, one per host, run a ring allgather of their
 * blocks, so each holds its position's column (H blocks); (B) a ring allgather of the columns
 * within the host.  Between hosts each rank sends H-1 blocks over L parallel rings, where the flat
 * ring takes every rank's block over one pair per host boundary, one after another; and (H-1) +
 * (L-1) + 1 rounds instead of HL-1.  A column's blocks lie apart in recv (the ranks of a
 * position are numbered anyhow), so it travels packed: A gathers this rank's column into scratch
 * slot 0 in host order, B sends slot s%2 and receives the next column into slot (s+1)%2, and
 * each round also copies the column it sends out to its places in recv; the last round only
 * copies.  Slot s%2 is read in round s and written again in round s+1 at the earliest. */
static void ring2d_allgather(fc_build_t *b, const fc_algo_args_t *a, int H, int L) {
  const int v = a->pos[a->rank], hv = v / L, lv = v % L;
  const int lnext = a->order[hv * L + (lv + 1) % L], lprev = a->order[hv * L + (lv + L - 1) % L];
  const int hnext = a->order[((hv + 1) % H) * L + lv], hprev = a->order[((hv + H - 1) % H) * L + lv];
  const size_t c = a->count, column = (size_t)H * c;
  for (int s = 0; s < H - 1; s++) { /* A */
    const int sh = fc_mod(hv - s, H), rh = fc_mod(hv - s - 1, H);
    fc_build_round(b);
    if (s == 0) {
      fc_build_copy(b, FC_BUF_RECV, (size_t)a->rank * c, FC_BUF_SEND, 0, c);
      fc_build_copy(b, FC_BUF_SCRATCH, (size_t)hv * c, FC_BUF_SEND, 0, c);
      fc_build_send(b, hnext, FC_BUF_SEND, 0, c);
    } else {
      fc_build_send(b, hnext, FC_BUF_SCRATCH, (size_t)sh * c, c);
    }
    fc_build_recv(b, hprev, FC_BUF_SCRATCH, (size_t)rh * c, c);
  }
  for (int s = 0; s <= L - 1; s++) { /* B: round s sends column lv - s; the last one only unpacks */
    const int col = fc_mod(lv - s, L);
    const size_t slot = (size_t)(s % 2) * column, next_slot = (size_t)((s + 1) % 2) * column;
    fc_build_round(b);
    if (s < L - 1) {
      fc_build_send(b, lnext, FC_BUF_SCRATCH, slot, column);
      fc_build_recv(b, lprev, FC_BUF_SCRATCH, next_slot, column);
    }
    for (int h = 0; h < H; h++) {
      const int q = a->order[h * L + col];
      if (q != a->rank) fc_build_copy(b, FC_BUF_RECV, (size_t)q * c, FC_BUF_SCRATCH, slot + (size_t)h * c, c);
    }
  }
  b->s->scratch_count = 2 * column;
}

/* Reduce-scatter: round s sends partial block r-s-1 and reduces block r-s-2, so rank r's last
 * round (s = n-2) completes block r, straight into recv.  Partials live in two scratch slots used
 * alternately: round s reads slot (s-1)%2 while writing slot s%2.  recv is written only by the
 * last step, which in place (recv == send block r) reads exactly the elements it writes, and
 * block r of send is read nowhere else. */
static void ring_reduce_scatter(fc_build_t *b, const ring_t *g) {
  size_t c = g->count;
  int n = g->n;
  for (int s = 0; s < n - 1; s++) {
    int sb = rk(g, fc_mod(g->v - s - 1, n)), rb = rk(g, fc_mod(g->v - s - 2, n));
    fc_build_round(b);
    if (s == 0)
      fc_build_send(b, g->next, FC_BUF_SEND, (size_t)sb * c, c);
    else
      fc_build_send(b, g->next, FC_BUF_SCRATCH, (size_t)((s - 1) % 2) * c, c);
    if (s == n - 2)
      fc_build_recv_reduce(b, g->prev, FC_BUF_RECV, 0, FC_BUF_SEND, (size_t)rb * c, c);
    else
      fc_build_recv_reduce(b, g->prev, FC_BUF_SCRATCH, (size_t)(s % 2) * c, FC_BUF_SEND, (size_t)rb * c, c);
  }
  b->s->scratch_count = n >= 4 ? 2 * c : n == 3 ? c : 0;
  fc_build_result(b, FC_BUF_RECV, 0, c);
}

/* Reduce-scatter over hosts of L ranks each (H >= 2 hosts, L >= 2, every host alike), in two
 * dimensions, the allgather's mirror: (A) a ring reduce-scatter of the columns within the host
 * (column l: the blocks of the H ranks at host position l) leaves each rank its position's column
 * reduced over its host; (B) the H ranks of one position, one per host, run a ring reduce-scatter
 * of that column, so each ends with its own block reduced over every rank.  Between hosts each
 * rank sends H-1 blocks over L parallel rings, where the flat ring has one pair per host boundary
 * carry n-1; and 1 + (L-1) + (H-1) rounds instead of n-1.  A column's blocks lie apart in send,
 * so round 0 packs send column by column into scratch (P, host order within a column); A then
 * runs on P with its partial columns in two slots (round s reads slot (s-1)%2 and writes slot
 * s%2, as the flat ring), and B on the column A left in slot (L-2)%2 with its partial blocks in
 * the first two blocks of the other slot.  recv is written only by B's last step, and send read
 * only by round 0, so in place is safe. */
static void ring2d_reduce_scatter(fc_build_t *b, const fc_algo_args_t *a, int H, int L) {
  const int v = a->pos[a->rank], hv = v / L, lv = v % L;
  const int lnext = a->order[hv * L + (lv + 1) % L], lprev = a->order[hv * L + (lv + L - 1) % L];
  const int hnext = a->order[((hv + 1) % H) * L + lv], hprev = a->order[((hv + H - 1) % H) * L + lv];
  const size_t c = a->count, column = (size_t)H * c, packed = (size_t)L * column;
  /* Scratch: P (L columns), then slots 0 and 1 of a column each. */
  const size_t slot[2] = {packed, packed + column};
  fc_build_round(b);
  for (int col = 0; col < L; col++)
    for (int h = 0; h < H; h++)
      fc_build_copy(b, FC_BUF_SCRATCH, (size_t)col * column + (size_t)h * c, FC_BUF_SEND,
                    (size_t)a->order[h * L + col] * c, c);
  for (int s = 0; s < L - 1; s++) { /* A: round s sends partial column lv-s-1, folds column lv-s-2 */
    const int sc = fc_mod(lv - s - 1, L), rc = fc_mod(lv - s - 2, L);
    fc_build_round(b);
    if (s == 0) fc_build_send(b, lnext, FC_BUF_SCRATCH, (size_t)sc * column, column);
    else fc_build_send(b, lnext, FC_BUF_SCRATCH, slot[(s - 1) % 2], column);
    fc_build_recv_reduce(b, lprev, FC_BUF_SCRATCH, slot[s % 2], FC_BUF_SCRATCH, (size_t)rc * column, column);
  }
  /* Column lv, reduced over the host; B's partials in the other slot's first two blocks. */
  const size_t col = slot[(L - 2) % 2], part[2] = {slot[(L - 1) % 2], slot[(L - 1) % 2] + c};
  for (int s = 0; s < H - 1; s++) { /* B: round s sends partial block hv-s-1, folds block hv-s-2 */
    const int sb = fc_mod(hv - s - 1, H), rb = fc_mod(hv - s - 2, H);
    fc_build_round(b);
    if (s == 0) fc_build_send(b, hnext, FC_BUF_SCRATCH, col + (size_t)sb * c, c);
    else fc_build_send(b, hnext, FC_BUF_SCRATCH, part[(s - 1) % 2], c);
    if (s == H - 2) fc_build_recv_reduce(b, hprev, FC_BUF_RECV, 0, FC_BUF_SCRATCH, col + (size_t)rb * c, c);
    else fc_build_recv_reduce(b, hprev, FC_BUF_SCRATCH, part[s % 2], FC_BUF_SCRATCH, col + (size_t)rb * c, c);
  }
  b->s->scratch_count = packed + 2 * column;
  fc_build_result(b, FC_BUF_RECV, 0, c);
}

/* Broadcast as a chain root -> root+1 -> ... -> root-1, pipelined over chunks: the rank at chain
 * position p receives chunk k in global round p-1+k and forwards it in round p+k, so successive
 * chunks occupy successive links at once.  A round writes chunk g-p+1 and reads chunk g-p. */
static void ring_broadcast(fc_build_t *b, const ring_t *g, int root, size_t chunk_count) {
  int p = fc_mod(g->v - at(g, root), g->n);
  fc_chunks_t ch = fc_chunks(g->count, chunk_count);
  long long first = p > 0 ? p - 1 : 0, last = p + ch.nchunks - 1;
  for (long long gr = first; gr <= last; gr++) {
    fc_build_round(b);
    long long kin = gr - p + 1, kout = gr - p;
    if (p == 0 && gr == 0) fc_build_copy(b, FC_BUF_RECV, 0, FC_BUF_SEND, 0, g->count); /* beside chunk 0's send */
    if (p > 0 && fc_chunk_valid(&ch, kin))
      fc_build_recv(b, g->prev, FC_BUF_RECV, fc_chunk_off(&ch, kin), fc_chunk_len(&ch, kin));
    if (p < g->n - 1 && fc_chunk_valid(&ch, kout))
      fc_build_send(b, g->next, p == 0 ? FC_BUF_SEND : FC_BUF_RECV, fc_chunk_off(&ch, kout),
                    fc_chunk_len(&ch, kout));
  }
}

/* Reduce as a chain root-1 -> root-2 -> ... -> root+1 -> root (each rank sends to r-1),
 * pipelined like the broadcast.  With d = distance from the far
 * end, a rank reduces chunk k in global round d-1+k and sends it in round d+k.  Non-roots keep
 * partials in two scratch slots (chunk k in slot k%2: a round writes chunk g-d+1 and reads chunk
 * g-d, and a slot is rewritten only after its chunk was sent) and never touch recv; the root
 * reduces straight into recv. */
static void ring_reduce(fc_build_t *b, const ring_t *g, int root, size_t chunk_count) {
  int n = g->n, p = fc_mod(g->v - at(g, root), n), d = n - 1 - p;
  fc_chunks_t ch = fc_chunks(g->count, chunk_count);
  int up = g->next, down = g->prev; /* receive from up, send to down */
  long long first = d > 0 ? d - 1 : 0, last = d + ch.nchunks - 1;
  for (long long gr = first; gr <= last; gr++) {
    fc_build_round(b);
    long long kin = gr - d + 1, kout = gr - d;
    if (d > 0 && fc_chunk_valid(&ch, kin)) {
      size_t off = fc_chunk_off(&ch, kin), len = fc_chunk_len(&ch, kin);
      if (p == 0)
        fc_build_recv_reduce(b, up, FC_BUF_RECV, off, FC_BUF_SEND, off, len);
      else
        fc_build_recv_reduce(b, up, FC_BUF_SCRATCH, (size_t)(kin % 2) * ch.chunk, FC_BUF_SEND, off, len);
    }
    if (p > 0 && fc_chunk_valid(&ch, kout)) {
      if (d == 0)
        fc_build_send(b, down, FC_BUF_SEND, fc_chunk_off(&ch, kout), fc_chunk_len(&ch, kout));
      else
        fc_build_send(b, down, FC_BUF_SCRATCH, (size_t)(kout % 2) * ch.chunk, fc_chunk_len(&ch, kout));
    }
  }
  if (p > 0 && d > 0) b->s->scratch_count = ch.nchunks >= 2 ? 2 * ch.chunk : g->count;
  if (p == 0) fc_build_result(b, FC_BUF_RECV, 0, g->count);
}

/* Alltoall by pairwise exchange: round k (1..n-1) sends block r+k of send to rank r+k and
 * receives block r-k of recv from rank r-k, which sends it in its own round k.  The own block is
 * copied beside round 1.  send and recv never overlap (an in-place alltoall runs from a copy
 * of the buffer, made by the executor: fc_host_run, fc_gpu_run), so the steps of a round touch
 * disjoint memory and no scratch is needed. */
static void ring_alltoall(fc_build_t *b, const ring_t *g) {
  size_t c = g->count;
  int n = g->n;
  if (c == 0) return;
  for (int k = 1; k < n; k++) {
    int to = (g->r + k) % n, from = fc_mod(g->r - k, n);
    fc_build_round(b);
    if (k == 1) fc_build_copy(b, FC_BUF_RECV, (size_t)g->r * c, FC_BUF_SEND, (size_t)g->r * c, c);
    fc_build_send(b, to, FC_BUF_SEND, (size_t)to * c, c);
    fc_build_recv(b, from, FC_BUF_RECV, (size_t)from * c, c);
  }
}

void fc_ring_build(fc_build_t *b, const fc_algo_args_t *a) {
  ring_t g = ring_of(a);
  switch (a->coll) {
    case FC_COLL_ALLREDUCE: {
      int hosts, per;
      hosts2d_t t;
      if (uniform_hosts(a, &hosts, &per)) ring2d_allreduce(b, a, hosts, per);
      else if (uneven_hosts(a, &t) && segments(a, &t)) ring2d_uneven_allreduce(b, a, &t);
      else ring_allreduce(b, &g);
      break;
    }
    case FC_COLL_ALLGATHER: {
      int hosts, per;
      if (!a->flat_ring && uniform_hosts(a, &hosts, &per)) ring2d_allgather(b, a, hosts, per);
      else ring_allgather(b, &g);
      break;
    }
    case FC_COLL_REDUCE_SCATTER: {
      int hosts, per;
      if (!a->flat_ring && uniform_hosts(a, &hosts, &per)) ring2d_reduce_scatter(b, a, hosts, per);
      else ring_reduce_scatter(b, &g);
      break;
    }
    case FC_COLL_BROADCAST: ring_broadcast(b, &g, a->root, a->chunk_count); break;
    case FC_COLL_REDUCE: ring_reduce(b, &g, a->root, a->chunk_count); break;
    case FC_COLL_ALLTOALL: ring_alltoall(b, &g); break;
    default: b->err = FLEXCOLL_INVALID_ARGUMENT; break;
  }
}
