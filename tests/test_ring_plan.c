/* test_ring_plan.c — the ring kernels' plan of a call (lib/kernels/ring_plan.h), without a GPU.
 *
 * What the kernels rely on, for every collective, rank count, size, grid, sub-slot count, area
 * size and split between the lanes (NVLink, side lane 1, side lane 2): the lanes cut every chunk
 * into [side 1 | side 2 | NVLink] in that order, each side lane taking what it was given (or what
 * is left); every byte of a chunk lies in exactly one slice of one block of one lane; a block's
 * sub-slots fit in its lane's area; no lane has more blocks than its cap; the grid is the blocks
 * of all lanes; the epoch advances by the most messages any block sends.  And with side lane 2
 * empty the plan is the two-lane plan the kernels ran before side lanes became an array (the
 * reference below is that plan, kept here as the oracle). */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ring_plan.h"

/* Check's own assertions talk to the runner at every call (a system call each): millions of
 * them here, so the checks call it only when they fail. */
#define EXPECT(cond)                                                     \
  do {                                                                   \
    if (!(cond)) ck_abort_msg("%s (line %d)", #cond, __LINE__);          \
  } while (0)

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* The two-lane plan as it was (one side lane, its first pc bytes of each chunk). */
typedef struct {
  size_t start[2], end[2], part[2], step[2], room[2];
  unsigned blocks[2], nslices[2], grid;
  unsigned long long msgs;
} ref_plan_t;

static int ref_plan(const fc_ring_args_t *a, fc_ring_coll_t coll, size_t bytes, const fc_ring_io *io, ref_plan_t *r) {
  const int n = a->nranks;
  const int chain = coll == FC_RING_BROADCAST || coll == FC_RING_REDUCE;
  const unsigned long long per_slice = coll == FC_RING_ALLREDUCE ? 2ull * n - 2
                                       : coll == FC_RING_ALLGATHER || coll == FC_RING_REDUCE_SCATTER ? (unsigned long long)n - 1
                                                                                                      : 1;
  (void)bytes;
  const size_t pc = a->side[0].chunk_bytes < io->chunk ? a->side[0].chunk_bytes : io->chunk;
  r->start[1] = 0;
  r->end[1] = r->start[0] = pc;
  r->end[0] = io->chunk;
  const size_t area[2] = {a->area_bytes, a->side[0].area_bytes};
  r->msgs = 0;
  for (int L = 1; L >= 0; L--) {
    const unsigned cap = L == 1 ? (pc ? a->side[0].blocks : 0) : (a->blocks > r->blocks[1] ? a->blocks - r->blocks[1] : 1);
    const size_t lane = r->end[L] - r->start[L];
    r->blocks[L] = 0;
    r->part[L] = r->step[L] = r->room[L] = 0;
    r->nslices[L] = 0;
    if (!lane) continue;
    size_t g = (lane + FC_RING_MIN_PART - 1) / FC_RING_MIN_PART;
    if (g < 1) g = 1;
    if (g > cap) g = cap;
    r->blocks[L] = (unsigned)g;
    r->part[L] = ((lane + 15) / 16 + g - 1) / g * 16;
    r->room[L] = area[L] / (g * a->subslots) / 16 * 16;
    if (r->room[L] < 16) return 0;
    size_t want = r->part[L];
    if (chain) {
      want = (r->part[L] / (2 * (size_t)n) + 15) / 16 * 16;
      if (want < FC_RING_CHAIN_MIN_STEP) want = FC_RING_CHAIN_MIN_STEP;
    }
    if (want < 16) want = 16;
    r->step[L] = want < r->room[L] ? want : r->room[L];
    r->nslices[L] = (unsigned)((r->part[L] + r->step[L] - 1) / r->step[L]);
    if (r->nslices[L] < 1) r->nslices[L] = 1;
    if (per_slice * r->nslices[L] > r->msgs) r->msgs = per_slice * r->nslices[L];
  }
  r->grid = r->blocks[0] + r->blocks[1];
  return 1;
}

typedef struct {
  size_t lo, hi;
} span_t;

static int by_lo(const void *x, const void *y) {
  const span_t *a = x, *b = y;
  return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Every slice a block of a lane moves of chunk 0 (a full chunk): [lo, hi) as ring.cu cuts them. */
static size_t slices(const fc_ring_io *io, span_t *out, size_t max) {
  size_t k = 0;
  for (int L = 0; L < FC_RING_LANES; L++)
    for (unsigned b = 0; b < io->blocks[L]; b++) {
      size_t blo = io->start[L] + (size_t)b * io->part[L];
      if (blo > io->end[L]) blo = io->end[L];
      const size_t bhi = blo + io->part[L] < io->end[L] ? blo + io->part[L] : io->end[L];
      for (unsigned s = 0; s < io->nslices[L]; s++) {
        size_t lo = blo + (size_t)s * io->step[L];
        if (lo > bhi) lo = bhi;
        const size_t hi = lo + io->step[L] < bhi ? lo + io->step[L] : bhi;
        if (hi > lo && k < max) out[k++] = (span_t){lo, hi};
        else if (hi > lo) return SIZE_MAX;
      }
    }
  return k;
}

static const fc_ring_coll_t colls[] = {FC_RING_ALLREDUCE, FC_RING_ALLGATHER, FC_RING_REDUCE_SCATTER, FC_RING_BROADCAST,
                                       FC_RING_REDUCE};
static const int ranks[] = {2, 3, 4, 8};
static const size_t sizes[] = {16, 1000, 65536, MiB + 48, 16 * MiB, 100000016};
static const unsigned grids[] = {2, 8, 32, 128};
static const unsigned subslots[] = {2, 4, 8};
static const size_t areas[] = {64 * KiB, MiB, 32 * MiB};

#define MAX_SPANS 400000
static span_t spans[MAX_SPANS];

/* One configuration: side lane k gets frac[k] of a chunk (0: none, 1: all of it), side blocks
 * sb[k] (caps), areas as given. */
static void check_one(fc_ring_coll_t coll, int n, size_t bytes, unsigned grid, unsigned sub, size_t area, const double *frac,
                      const unsigned *sb, long *checked) {
  fc_ring_args_t a;
  memset(&a, 0, sizeof a);
  a.nranks = n;
  a.blocks = grid;
  a.subslots = sub;
  a.area_bytes = 16 * MiB;
  const size_t chunk = fc_ring_chunk_bytes(coll, bytes, n);
  for (int k = 0; k < FC_RING_SIDE_LANES; k++) {
    a.side[k].chunk_bytes = frac[k] >= 1 ? chunk : (size_t)((double)chunk * frac[k]) / 16 * 16;
    a.side[k].blocks = sb[k];
    a.side[k].area_bytes = area;
  }
  fc_ring_io io;
  memset(&io, 0, sizeof io);
  unsigned g = 0;
  const int ok = fc_ring_plan(&a, coll, bytes, 0, &io, &g);
  EXPECT((io.chunk) == (chunk));
  /* The lanes in order: side 1, side 2, NVLink, each what it was given or what is left. */
  EXPECT((io.start[1]) == (0));
  EXPECT((io.end[1]) == (a.side[0].chunk_bytes < chunk ? a.side[0].chunk_bytes : chunk));
  EXPECT((io.start[2]) == (io.end[1]));
  const size_t left = chunk - io.end[1];
  EXPECT((io.end[2] - io.start[2]) == (a.side[1].chunk_bytes < left ? a.side[1].chunk_bytes : left));
  EXPECT((io.start[0]) == (io.end[2]));
  EXPECT((io.end[0]) == (chunk));
  int room_short = 0;
  for (int L = 0; L < FC_RING_LANES; L++) {
    const size_t lane = io.end[L] - io.start[L];
    const unsigned cap = L ? sb[L - 1] : grid;
    const size_t lane_area = L ? area : a.area_bytes;
    if (!lane) continue;
    const size_t want = (lane + FC_RING_MIN_PART - 1) / FC_RING_MIN_PART;
    const size_t blocks = want < 1 ? 1 : want;
    /* NVLink's cap is what the side lanes leave (computed after them). */
    if (L && lane_area / ((blocks < cap ? blocks : cap) * sub) / 16 * 16 < 16) room_short = 1;
    if (!ok) continue;
    EXPECT((io.blocks[L]) >= (1));
    EXPECT((io.blocks[L]) <= (cap));
    EXPECT((io.part[L] % 16) == (0));
    EXPECT(((size_t)io.part[L] * io.blocks[L]) >= (lane));
    EXPECT((io.room[L] % 16) == (0));
    EXPECT((io.step[L]) >= (16));
    EXPECT((io.step[L]) <= (io.room[L]));
    EXPECT((io.step[L] % 16) == (0));
    EXPECT(((size_t)io.room[L] * io.blocks[L] * sub) <= (lane_area)); /* every sub-slot inside the area */
    EXPECT(((size_t)io.nslices[L] * io.step[L]) >= (io.part[L]));
  }
  if (ok != !room_short) ck_abort_msg("planned %d where a side lane %s room for a sub-slot", ok, room_short ? "has no" : "has");
  if (!ok) return;
  EXPECT((g) == (io.blocks[0] + io.blocks[1] + io.blocks[2]));
  EXPECT((io.blocks[1] + io.blocks[2]) <= (grid));
  unsigned most = 0;
  for (int L = 0; L < FC_RING_LANES; L++) most = io.nslices[L] > most ? io.nslices[L] : most;
  const unsigned long long per = coll == FC_RING_ALLREDUCE ? 2ull * n - 2
                                 : coll == FC_RING_ALLGATHER || coll == FC_RING_REDUCE_SCATTER ? (unsigned long long)n - 1
                                                                                                : 1;
  EXPECT((io.msgs) == (per * most));
  /* Every byte of a chunk in exactly one slice. */
  const size_t k = slices(&io, spans, MAX_SPANS);
  if (k != SIZE_MAX) {
    qsort(spans, k, sizeof *spans, by_lo);
    size_t at = 0;
    for (size_t i = 0; i < k; i++) {
      if (spans[i].lo != at) ck_abort_msg("a gap or an overlap at byte %zu of a %zu-byte chunk", at, chunk);
      at = spans[i].hi;
    }
    EXPECT((at) == (chunk));
  }
  /* With side lane 2 empty: the two-lane plan. */
  if (!a.side[1].chunk_bytes) {
    ref_plan_t r;
    EXPECT(ref_plan(&a, coll, bytes, &io, &r) == 1);
    for (int L = 0; L < 2; L++) {
      EXPECT((io.start[L]) == (r.start[L]));
      EXPECT((io.end[L]) == (r.end[L]));
      EXPECT((io.blocks[L]) == (r.blocks[L]));
      EXPECT((io.part[L]) == (r.part[L]));
      EXPECT((io.step[L]) == (r.step[L]));
      EXPECT((io.room[L]) == (r.room[L]));
      EXPECT((io.nslices[L]) == (r.nslices[L]));
    }
    EXPECT((io.blocks[2]) == (0));
    EXPECT((g) == (r.grid));
    EXPECT((io.msgs) == (r.msgs));
  }
  (*checked)++;
}

/* The splits: none, side 1 only (thin, half, all), side 2 only, both (thin, even, all of the
 * chunk between them: no NVLink bytes). */
static const double fracs[][2] = {{0, 0},     {0.01, 0},   {0.5, 0},   {1, 0},   {0, 0.3},
                                  {0.1, 0.1}, {0.3, 0.3}, {0.5, 0.5}, {0.7, 1}, {1, 1}};

START_TEST(test_plan_every_case) {
  const fc_ring_coll_t coll = colls[_i];
  long checked = 0;
  for (size_t r = 0; r < sizeof ranks / sizeof *ranks; r++)
    for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++)
      for (size_t gi = 0; gi < sizeof grids / sizeof *grids; gi++)
        for (size_t si = 0; si < sizeof subslots / sizeof *subslots; si++)
          for (size_t ai = 0; ai < sizeof areas / sizeof *areas; ai++)
            for (size_t f = 0; f < sizeof fracs / sizeof *fracs; f++) {
              const unsigned grid = grids[gi];
              /* Side caps as the host sets them: each at most a third of the grid with two,
               * half with one (and at least 1). */
              const int two = fracs[f][0] > 0 && fracs[f][1] > 0;
              unsigned cap = grid / (two ? 3 : 2);
              if (cap < 1) cap = 1;
              const unsigned sb[2] = {cap < 4 ? cap : 4, cap};
              check_one(coll, ranks[r], sizes[z], grid, subslots[si], areas[ai], fracs[f], sb, &checked);
            }
  ck_assert_int_gt(checked, 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ring_plan");
  TCase *tc = tcase_create("plan");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_plan_every_case, 0, (int)(sizeof colls / sizeof *colls));
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
