/* ring_plan.h — the plan of a ring kernel call (lib/kernels/ring.cu): how its chunks are cut
 * among the lanes (NVLink, then the side lanes), each lane among its blocks, each block's part
 * into slices of at most a sub-slot.  Pure arithmetic on the call's size and the communicator's
 * constants, so every rank plans alike; nvcc compiles it into the kernels' launcher and the C
 * compiler into tests/test_ring_plan, which checks it without a GPU. */
#ifndef FC_KERNELS_RING_PLAN_H
#define FC_KERNELS_RING_PLAN_H

#ifndef __cplusplus
#include <stdbool.h>
#endif
#include <stddef.h>

#include "kernels/kernels.h"

/* A block's part of a chunk is at least this (fewer blocks for smaller messages): below it a
 * block's flag round trips cost more than its bytes. */
#define FC_RING_MIN_PART ((size_t)64 << 10)
/* A chain (broadcast, reduce) needs slices to pipeline: its part is cut into about 2n of
 * them, none below this. */
#define FC_RING_CHAIN_MIN_STEP ((size_t)32 << 10)

/* One call's plan: the same on every rank (a function of the size, the rank count and the
 * communicator's constants). */
typedef struct fc_ring_io {
  const char *send;
  char *recv;
  size_t total;        /* bytes over all chunks (chunk c: [c * chunk, min((c + 1) * chunk, total))) */
  size_t chunk;        /* bytes per chunk */
  size_t own_stride;   /* from one chunk's own operand to the next (0: the one send buffer) */
  size_t out_stride;   /* from one chunk's place in recv to the next (0: the one receive buffer) */
  /* Per lane (0: NVLink, the blocks first; 1 and 2: the side lanes, their blocks after): its
   * bytes of a chunk [start, end), its blocks, a block's part of them (a multiple of 16), bytes
   * per message and per sub-slot (multiples of 16, room >= step), slices per block. */
  size_t start[FC_RING_LANES], end[FC_RING_LANES];
  unsigned blocks[FC_RING_LANES];
  size_t part[FC_RING_LANES], step[FC_RING_LANES], room[FC_RING_LANES];
  unsigned nslices[FC_RING_LANES];
  unsigned steps;      /* ring steps per slice */
  unsigned coll;       /* fc_ring_coll_t */
  int root;
  unsigned long long msgs; /* most messages of a block and edge in the call: the epoch's advance */
} fc_ring_io;

/* How a chunk of `chunk` bytes is cut among the lanes: side lane 1 carries its first bytes, side
 * lane 2 the next, the NVLink lane the rest; lane L's are [start[L], end[L]).  The host counts
 * each lane's bytes with it (statistics, stage 2's records) as the kernels cut them. */
static inline FC_HOST_DEVICE void fc_ring_lane_cut(const fc_ring_args_t *a, size_t chunk, size_t *start, size_t *end) {
  size_t at = 0;
  for (int L = 1; L < FC_RING_LANES; L++) {
    const size_t want = a->side[L - 1].chunk_bytes, left = chunk - at;
    start[L] = at;
    at += want < left ? want : left;
    end[L] = at;
  }
  start[0] = at;
  end[0] = chunk;
}

/* The plan of a call of `bytes` (fc_kernel_ring_collective's meaning) and its grid; false when
 * some lane's area leaves a sub-slot no room. */
static inline bool fc_ring_plan(const fc_ring_args_t *a, fc_ring_coll_t coll, size_t bytes, int root, fc_ring_io *io,
                                unsigned *grid) {
  const int n = a->nranks;
  const bool chain = coll == FC_RING_BROADCAST || coll == FC_RING_REDUCE;
  io->coll = (unsigned)coll;
  io->root = root;
  switch (coll) {
    case FC_RING_ALLREDUCE:
      io->total = bytes;
      io->chunk = fc_ring_chunk_bytes(coll, bytes, n);
      io->own_stride = io->out_stride = io->chunk;
      io->steps = 2 * (unsigned)n - 1;
      io->msgs = 2 * (unsigned)n - 2;
      break;
    case FC_RING_ALLGATHER:
    case FC_RING_REDUCE_SCATTER:
      io->total = (size_t)n * bytes;
      io->chunk = bytes;
      io->own_stride = coll == FC_RING_REDUCE_SCATTER ? bytes : 0;
      io->out_stride = coll == FC_RING_ALLGATHER ? bytes : 0;
      io->steps = (unsigned)n;
      io->msgs = (unsigned)n - 1;
      break;
    default:
      io->total = io->chunk = bytes;
      io->own_stride = io->out_stride = 0;
      io->steps = 1;
      io->msgs = 1;
      break;
  }
  /* Each lane's bytes of a chunk are cut among its own blocks as a whole chunk would be. */
  fc_ring_lane_cut(a, io->chunk, io->start, io->end);
  size_t area[FC_RING_LANES] = {a->area_bytes};
  for (int L = 1; L < FC_RING_LANES; L++) area[L] = a->side[L - 1].area_bytes;
  const unsigned long long per_slice = io->msgs;
  io->msgs = 0;
  /* The side lanes first: the NVLink lane takes every block they leave (a thin side share needs
   * few blocks, and the grid's size is fixed by what every communicator on the GPU may use). */
  unsigned side_blocks = 0;
  for (int L = FC_RING_LANES - 1; L >= 0; L--) {
    const unsigned cap = L ? a->side[L - 1].blocks : a->blocks > side_blocks ? a->blocks - side_blocks : 1;
    const size_t lane = io->end[L] - io->start[L];
    io->blocks[L] = 0;
    io->part[L] = io->step[L] = io->room[L] = 0;
    io->nslices[L] = 0;
    if (!lane) continue;
    size_t g = (lane + FC_RING_MIN_PART - 1) / FC_RING_MIN_PART;
    if (g < 1) g = 1;
    if (g > cap) g = cap;
    if (g < 1) return false; /* a lane with bytes and no blocks (fc_ring_args_ok refuses it) */
    io->blocks[L] = (unsigned)g;
    io->part[L] = ((lane + 15) / 16 + g - 1) / g * 16;
    io->room[L] = area[L] / (g * a->subslots) / 16 * 16;
    if (io->room[L] < 16) return false;
    size_t want = io->part[L];
    if (chain) {
      want = (io->part[L] / (2 * (size_t)n) + 15) / 16 * 16;
      if (want < FC_RING_CHAIN_MIN_STEP) want = FC_RING_CHAIN_MIN_STEP;
    }
    if (want < 16) want = 16;
    io->step[L] = want < io->room[L] ? want : io->room[L];
    io->nslices[L] = (unsigned)((io->part[L] + io->step[L] - 1) / io->step[L]);
    if (io->nslices[L] < 1) io->nslices[L] = 1;
    if (per_slice * io->nslices[L] > io->msgs) io->msgs = per_slice * io->nslices[L];
    if (L) side_blocks += io->blocks[L];
  }
  *grid = io->blocks[0] + side_blocks;
  return true;
}

#endif
