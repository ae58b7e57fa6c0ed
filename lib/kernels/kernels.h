/* kernels.h — flexcoll's CUDA kernels behind a C interface (the .cu files beside it, nvcc, sm_90).
 * Written once over (datatype, op) with templates and instantiated by a table; no -rdc.
 * Every function enqueues on `stream` and returns a cudaError_t as int (0 = cudaSuccess). */
#ifndef FC_KERNELS_H
#define FC_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "flexcoll.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FC_ONESHOT_MAX_RANKS 8

/* dst[i] = a[i] op b[i] (AVG reduces as SUM); dst may alias a or b.  float16/bfloat16 in float,
 * rounded to nearest even per operation, like lib/host/reduce.c. */
int fc_kernel_reduce(void *dst, const void *a, const void *b, size_t count, flexcoll_datatype_t dtype,
                     flexcoll_op_t op, flexcoll_stream_t stream);
/* buf[i] /= n (integers truncate). */
int fc_kernel_divide(void *buf, size_t count, flexcoll_datatype_t dtype, int n, flexcoll_stream_t stream);
/* An SM-driven copy (16-byte loads/stores when aligned); dst may be peer memory over NVLink. */
int fc_kernel_copy(void *dst, const void *src, size_t bytes, flexcoll_stream_t stream);
/* fc_oneshot_args_t.timeout_ns for a wait of timeout_ms: the kernels bound their waits by
 * the GPU's global nanosecond timer.  timeout_ms <= 0: UINT64_MAX, never time out. */
uint64_t fc_kernel_timeout_ns(int timeout_ms);

/* Load every kernel into the current device's context now: CUDA's lazy loading would otherwise
 * load a kernel at its first launch, waiting for the device's queued work (which, in the middle
 * of a collective, waits on peers).  Called once per device by each communicator. */
int fc_kernels_preload_reduce(void);
int fc_kernels_preload_oneshot(void);

/* One-shot collectives for small messages: one kernel per rank, no host involvement.
 * Every rank owns a staging area that all peers can write (peer-mapped device memory):
 * 2 parities × nranks slots of slot_bytes, plus flags: 2 parities × nranks × FC_MAX_BLOCKS
 * uint64 words.  A call's seq is epoch->seq + 1 (fc_dev_epoch_t below).
 * Rank r writes its input into slot r of every peer's staging area (parity seq&1),
 * block b of the grid (see FC_ONESHOT_BLOCK_BYTES) then sets flag [parity][r][b] = seq in that peer's flags after a system
 * fence; it then waits (bounded by timeout_ns of the global timer) for all its own flags [parity][q][b]
 * == seq and reduces in rank order 0..n-1 (so every rank gets bitwise the same result).
 * On timeout the kernel stores 1 into *error (host-mapped) and returns. */
/* The communicator's host-mapped error word (every kernel's `error`): what a kernel found first.
 * Kernels write only a zero word (a timeout that follows a bad expert id, the peers' kernels
 * waiting on what went nowhere, leaves the cause to be reported); the host's abort overwrites. */
enum {
  FC_DEV_ERROR_TIMEOUT = 1,   /* a wait on a peer ran past timeout_ns */
  FC_DEV_ERROR_ABORT = 2,     /* written by the host: flexcoll_comm_abort */
  FC_DEV_ERROR_EXPERT_ID = 3, /* a MoE dispatch met an expert id not below num_experts */
};
/* Blocks of the grid: one per 32 KiB of message, at least 1, at most FC_ONESHOT_BLOCKS (the
 * flags are sized for that many) or max_blocks.  Every rank computes the same grid from the same
 * size and cap. */
#define FC_ONESHOT_BLOCKS 64
#define FC_ONESHOT_BLOCK_BYTES (32u << 10)
/* The most blocks of any grid here (max_blocks, pipe_blocks): the flag arrays' stride. */
#define FC_MAX_BLOCKS 128
/* A communicator's sequence state, in device memory (zeroed at creation), so that a kernel
 * replayed from a CUDA graph takes the current numbers, not the ones of its capture.  A one-shot
 * or pipelined kernel takes seq + 1 as its call's seq and pipe_base as its counters' base (every
 * block reads them at its start); every block then counts itself in done, on every path
 * (one-shot kernels at their end, timeouts included; pipelined ones right after the read), and
 * the last one stores the call's seq into seq and adds the call's pipelined steps to pipe_base
 * (done returns to 0).  Every block has read the epoch by then, and the communicator's next
 * kernel starts after this one has finished (stream order, or the host's event chain), so all
 * blocks of a call agree and consecutive calls take consecutive seqs. */
typedef struct {
  unsigned long long seq, pipe_base;
  unsigned int done;
} fc_dev_epoch_t;
typedef struct {
  int rank, nranks;
  fc_dev_epoch_t *epoch;                        /* this rank's; 16-byte aligned */
  size_t slot_bytes;
  char *stage[FC_ONESHOT_MAX_RANKS];            /* stage[p]: rank p's staging area as seen from here (stage[rank] local) */
  uint64_t *flags[FC_ONESHOT_MAX_RANKS];        /* flags[p]: rank p's flags as seen from here */
  uint64_t timeout_ns;
  int *error;                                   /* host-mapped */
  unsigned max_blocks;                          /* grid cap of the plain kernels (<= FC_MAX_BLOCKS); 0: FC_ONESHOT_BLOCKS */
  /* LL variant (oneshot.cu): messages of up to ll_max bytes per rank (a multiple of 16; 0: never)
   * go as 16-byte lines of 8 data bytes and two copies of (uint32_t)seq, polled by the readers,
   * into ll[p]: rank p's LL area as seen from here, 2 parities x nranks slots of 2 * ll_max
   * bytes, zeroed before the first call. */
  size_t ll_max;
  char *ll[FC_ONESHOT_MAX_RANKS];
  /* Pipelined kernels: the grid (1..FC_MAX_BLOCKS), threads per block (512 or 1024) and
   * sub-slots per block (2 or 4); the base of their counters is epoch->pipe_base. */
  unsigned pipe_blocks, pipe_threads, pipe_subslots;
  /* Threads of a block in the pushing team when a block is two teams (a multiple of 32, at
   * least 32 fewer than pipe_threads). */
  unsigned pipe_push_threads;
} fc_oneshot_args_t;

/* recvbuf = op over ranks of sendbuf (count * dtype size <= slot_bytes); AVG divides at the end. */
int fc_kernel_oneshot_allreduce(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf, size_t count,
                                flexcoll_datatype_t dtype, flexcoll_op_t op, flexcoll_stream_t stream);
/* recvbuf[q*bytes ...] = rank q's sendbuf (bytes <= slot_bytes). */
int fc_kernel_oneshot_allgather(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf, size_t bytes,
                                flexcoll_stream_t stream);
/* recvbuf = op over ranks of their sendbuf[rank*recvcount ...] (recvcount * dtype size <= slot_bytes);
 * each rank sends a peer only the peer's chunk. */
int fc_kernel_oneshot_reduce_scatter(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf, size_t recvcount,
                                     flexcoll_datatype_t dtype, flexcoll_op_t op, flexcoll_stream_t stream);
/* recvbuf = root's sendbuf (bytes <= slot_bytes; sendbuf is read on the root only). */
int fc_kernel_oneshot_broadcast(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf, size_t bytes, int root,
                                flexcoll_stream_t stream);

/* Pipelined collectives (pipeline.cu) for 2 ranks, above the one-shot limit, on buffers the
 * peer cannot address: the one-shot staging area (all 2 x 2 slots of it: only the peer writes
 * into ours) shared out among pipe_blocks blocks as pipe_subslots sub-slots each of
 * fc_pipe_step_bytes, the one-shot flags, and after them 2 x nranks x FC_MAX_BLOCKS more uint64
 * counters (zeroed before the first call).  A call uses fc_pipe_steps steps after
 * epoch->pipe_base and adds them to it at its end; it also takes a seq, like a one-shot call. */
#define FC_PIPE_MIN_STEP_BYTES 4096
/* A block's share is cut into FC_PIPE_MIN_STEPS steps, but none below FC_PIPE_STEP_FLOOR_BYTES
 * (fewer steps then) and none above the room.  One step does not pipeline (a step's push
 * overlaps only the previous step's reduction); every step costs a flag round trip behind a
 * system fence that waits for the step's stores to land.  Measured on 2 x H200 (allreduce, no
 * windows, 1024 threads, NCCL in the same run): steps of 128 KiB beat 64 KiB at 128-512 MB
 * (1.11-1.14x NCCL against 1.03-1.09x); at 16 MB 4 steps of 32 KiB lost to 2 of 64 KiB (0.93
 * against 0.99-1.01x), and allgather of 8 MB per rank, 4 steps of 16 KiB, to 1 of 64 KiB (0.86
 * against 1.21x). */
#define FC_PIPE_MIN_STEPS 4
#define FC_PIPE_STEP_FLOOR_BYTES (64u << 10)
#ifdef __CUDACC__
#define FC_HOST_DEVICE __host__ __device__
#else
#define FC_HOST_DEVICE
#endif
/* The largest step the staging area has room for (a multiple of 16; below
 * FC_PIPE_MIN_STEP_BYTES: unusable). */
static inline FC_HOST_DEVICE size_t fc_pipe_room_bytes(size_t slot_bytes, unsigned blocks, unsigned subslots) {
  return blocks && subslots ? 4 * slot_bytes / ((size_t)blocks * subslots) / 16 * 16 : 0;
}
/* One block's share of a `bytes` message (fc_block_range in oneshot.cuh splits it alike). */
static inline FC_HOST_DEVICE size_t fc_pipe_block_share(size_t bytes, unsigned blocks) {
  return blocks ? ((bytes + 15) / 16 + blocks - 1) / blocks * 16 : 0;
}
/* Bytes per step of a call that moves `bytes` (a multiple of 16; 0: unusable): the block's
 * share over FC_PIPE_MIN_STEPS, within [FC_PIPE_STEP_FLOOR_BYTES, room].  Every rank computes
 * the same from the same size. */
static inline FC_HOST_DEVICE size_t fc_pipe_step_bytes(size_t bytes, size_t slot_bytes, unsigned blocks,
                                                       unsigned subslots) {
  const size_t room = fc_pipe_room_bytes(slot_bytes, blocks, subslots);
  if (room < FC_PIPE_MIN_STEP_BYTES) return 0;
  size_t want = (fc_pipe_block_share(bytes, blocks) / FC_PIPE_MIN_STEPS + 15) / 16 * 16;
  if (want < FC_PIPE_STEP_FLOOR_BYTES) want = FC_PIPE_STEP_FLOOR_BYTES;
  return want < room ? want : room;
}
/* Steps of such a call (every block takes as many, some of them empty). */
static inline FC_HOST_DEVICE size_t fc_pipe_steps(size_t bytes, size_t slot_bytes, unsigned blocks, unsigned subslots) {
  const size_t step = fc_pipe_step_bytes(bytes, slot_bytes, blocks, subslots);
  return step ? (fc_pipe_block_share(bytes, blocks) + step - 1) / step : 0;
}
typedef enum { FC_PIPE_ALLREDUCE, FC_PIPE_ALLGATHER, FC_PIPE_REDUCE_SCATTER, FC_PIPE_BROADCAST } fc_pipe_coll_t;
/* `bytes`: allreduce and broadcast the buffer, allgather the send buffer, reduce_scatter the
 * receive buffer; dtype and op matter to the reducing two only. */
int fc_kernel_pipe_collective(const fc_oneshot_args_t *args, fc_pipe_coll_t coll, const void *sendbuf, void *recvbuf,
                              size_t bytes, flexcoll_datatype_t dtype, flexcoll_op_t op, int root,
                              flexcoll_stream_t stream);
int fc_kernels_preload_pipeline(void);

/* Ring kernels (ring.cu): allreduce, allgather, reduce_scatter, broadcast and reduce for any
 * number of ranks, one kernel per rank and call, SM loads and stores only (the hardware-queue
 * rule: nothing a rank enqueues waits on the host or on a stream-memory operation).  Each rank
 * writes only into the next rank's ring area and reads only its own, which the previous rank
 * fills, so a rank needs its two neighbours' pointers, whatever the rank count.  Per block b
 * of the grid, two counters per rank: ready (raised by the previous rank: messages it has put
 * into our area) and ack (raised by the next rank: our messages it has consumed), at
 * ctr[kind * FC_MAX_BLOCKS + b].  Counters only grow: a call uses those after epoch->pipe_base
 * and the last block advances it by the call's messages per edge (the same on every rank;
 * seq is left alone: the one-shot area is not touched). */
/* Stage 2 of the ring kernels' lanes (lib/gpu/pcie.c): a measured call's busy time per lane from
 * the device clock (%globaltimer, ns), from the lane's first block start to its last block end.
 * Every block of a measured call folds its start and end into the communicator's fc_lane_clock_t
 * (device memory, zeroed at creation; start kept as ~t so that a zeroed field is "none yet" and
 * atomicMax finds the earliest), and the last block to finish publishes the spans in record
 * call % FC_LANE_RECORDS of a host-mapped ring, `call` last behind a system fence, and zeroes the
 * clock for the next call (which starts after this one: the communicator's kernels run one after
 * another).  So the host reads a record only once its kernel is done, and never waits for one. */
#define FC_LANE_RECORDS 16
/* The ring kernels' lanes: NVLink (0), then the side lanes (1, 2: fc_ring_args_t.side). */
#define FC_RING_SIDE_LANES 2
#define FC_RING_LANES (1 + FC_RING_SIDE_LANES)
typedef struct {
  unsigned long long start_inv[FC_RING_LANES], end[FC_RING_LANES];
  unsigned int done;
  unsigned int pad;
} fc_lane_clock_t;
typedef struct {
  unsigned long long ns[FC_RING_LANES];    /* per lane; 0: the lane had no blocks */
  unsigned long long bytes[FC_RING_LANES]; /* what the lane pushed, as the launch said */
  unsigned long long call;                 /* the call's number (>= 1), written last */
  unsigned long long pad;
} fc_lane_record_t;
/* One message of the pcie lane for the copy-engine proxies: where it is in the outbox (and, at
 * the same offset, in the host staging area and the next rank's inbox), its bytes, and the value
 * the next rank's ready counter takes once it has landed. */
#define FC_PCIE_DESCS 8 /* >= the most sub-slots: a block has at most that many messages in flight */
typedef struct {
  unsigned long long off, bytes, ready;
} fc_pcie_desc_t;
/* A side lane of the ring kernels: the same ring through other memory than the peers' device
 * memory, host memory that every rank's GPU reaches over PCIe (a ring area and counters per rank,
 * laid out as the NVLink lane's, mapped here), or device boxes that a proxy moves.  Its blocks
 * come after the NVLink lane's and the earlier side lane's; side lane 1 carries the first
 * chunk_bytes of every chunk, side lane 2 the next chunk_bytes (at most blocks of them each, each
 * block with its own counters), the NVLink lane the rest.  chunk_bytes 0: no lane in this call. */
typedef struct {
  char *area, *area_next;
  uint64_t *ctr, *ctr_next, *ctr_prev;
  size_t area_bytes;       /* a multiple of 16 */
  unsigned blocks;         /* 1..FC_MAX_BLOCKS / 2 */
  size_t chunk_bytes;      /* a multiple of 16, or the whole chunk (fc_ring_chunk_bytes) */
  /* Through a proxy (ce): area is our inbox and area_next our outbox, both device memory; a
   * push stores into the outbox and publishes the message for our proxy (desc[block][n %
   * FC_PCIE_DESCS], then sent[block] = n + 1, host-mapped, n counted over the communicator's life
   * in pub[block], device memory); the proxies move it into the next rank's inbox and raise its
   * ready counter (lib/gpu/pcie_ce.c). */
  int ce;
  fc_pcie_desc_t *desc;
  uint64_t *sent, *pub;
  /* ce: our ready counters in device memory, raised by our proxy's stream writes, so that the
   * kernel's waits poll no host memory over the port the copies use; NULL: the host area's. */
  uint64_t *ready;
} fc_ring_side_t;
typedef struct {
  int rank, nranks;
  fc_dev_epoch_t *epoch;   /* this rank's; 16-byte aligned */
  char *area;              /* our ring area (the previous rank fills it) */
  char *area_next;         /* the next rank's, as seen here */
  uint64_t *ctr;           /* our counters */
  uint64_t *ctr_next;      /* the next rank's (we raise its ready) */
  uint64_t *ctr_prev;      /* the previous rank's (we raise its ack) */
  size_t area_bytes;       /* of every rank's ring area (a multiple of 16) */
  unsigned blocks;         /* most blocks of a grid (1..FC_MAX_BLOCKS) */
  unsigned subslots;       /* messages in flight per block and edge (2..8) */
  uint64_t timeout_ns;
  int *error;              /* host-mapped, as the one-shot kernels' */
  fc_ring_side_t side[FC_RING_SIDE_LANES];
  /* Ranks on several hosts: rank is our place in the ring, which visits the ranks host by host,
   * and ring_rank (device memory, nranks entries) the rank at each place, whose block an
   * allgather's or reduce_scatter's chunk of that place is (NULL: places are ranks).  hops: a
   * ring by hops, whose every block carries its whole part of a chunk on each edge's own lane:
   * hop_in the lane of the edge from the previous rank, hop_out of the edge to the next (0: the
   * NVLink lane, the peers' device memory of our host; k: side lane k, over the link between
   * hosts).  The plan then gives lane 0 every block and byte (the side lanes' chunk_bytes are 0)
   * and area_bytes is the smaller of the areas the block uses. */
  const int *ring_rank;
  int hops, hop_in, hop_out;
  /* Stage 2: clk NULL, nothing measured (small calls, captured ones); else the clock, the record
   * ring (as the device sees it), this call's number and its lanes' bytes for the record. */
  fc_lane_clock_t *clk;
  fc_lane_record_t *rec;
  unsigned long long call;
  unsigned long long lane_bytes[FC_RING_LANES];
} fc_ring_args_t;
typedef enum { FC_RING_ALLREDUCE, FC_RING_ALLGATHER, FC_RING_REDUCE_SCATTER, FC_RING_BROADCAST, FC_RING_REDUCE } fc_ring_coll_t;
/* `bytes`: allreduce, broadcast and reduce the buffer, allgather the send buffer,
 * reduce_scatter the receive buffer.  Reduction order is fixed by the ring: chunk c (or, for
 * reduce, the whole buffer) is folded from the rank after its owner round to the owner, so all
 * ranks get bitwise the same result, whatever the timing. */
int fc_kernel_ring_collective(const fc_ring_args_t *args, fc_ring_coll_t coll, const void *sendbuf, void *recvbuf,
                              size_t bytes, flexcoll_datatype_t dtype, flexcoll_op_t op, int root,
                              flexcoll_stream_t stream);
int fc_kernels_preload_ring(void);
/* The bytes of one chunk of a ring call (the unit that the side lanes' chunk_bytes split):
 * allreduce the buffer's n-th (rounded up to 16), allgather and reduce_scatter one rank's block,
 * broadcast and reduce the buffer. */
static inline FC_HOST_DEVICE size_t fc_ring_chunk_bytes(fc_ring_coll_t coll, size_t bytes, int nranks) {
  if (coll == FC_RING_ALLREDUCE) return ((bytes + 15) / 16 + (size_t)nranks - 1) / (size_t)nranks * 16;
  return bytes;
}
/* How many chunk messages this rank pushes to the next rank in a call (each carries one chunk's
 * slices), for the links' statistics. */
int fc_ring_pushes(fc_ring_coll_t coll, int rank, int nranks, int root);

/* AllToAll (alltoall.cu) for up to FC_ONESHOT_MAX_RANKS ranks, one kernel per rank and call:
 * each rank stores its block for peer q into its own slots of q's one-shot staging area (the two
 * parities' slot `rank`, as two sub-slots shared out among the grid's blocks), in steps, with the
 * pipelined kernels' ready and ack counters per sender and block; q copies them into place.  It
 * takes a seq and first meets every peer on the one-shot flags, as the pipelined kernels do, so
 * the staging area is free.  bytes: one block (count * size); sendbuf and recvbuf must not
 * overlap.  Grid: one block per 64 KiB of a block, up to args->max_blocks. */
#define FC_ALLTOALL_MIN_ROOM 4096
int fc_kernel_alltoall(const fc_oneshot_args_t *args, const void *sendbuf, void *recvbuf, size_t bytes,
                       flexcoll_stream_t stream);
int fc_kernels_preload_alltoall(void);

/* Sends and receives (p2p.cu): one kernel per rank for a batch (a group's sends and receives
 * of one communicator), any rank count.  Every rank owns a point-to-point area with one region
 * per sender; sender s stores into its region of receiver r's area, in messages of at most a
 * sub-slot per block.  Messages are numbered per direction of a pair over the communicator's
 * life, so they match across batches whatever their grouping (the k-th send from s to r meets
 * the k-th receive on r from s): the counts so far live on the device (base[q]: messages sent
 * to q; base[nranks + q]: received from q), and the last block of a kernel advances them.  The
 * counters, per block: ready from sender q at ctr[q * FC_MAX_BLOCKS + b], ack from receiver q at
 * ctr[(nranks + q) * FC_MAX_BLOCKS + b]. */
#define FC_P2P_KERNEL_OPS 250
typedef struct {
  int rank, nranks;
  uint64_t *base;                 /* 2 * nranks message counts, device memory */
  unsigned *done;                 /* blocks of the current kernel that have read base */
  char *area;                     /* ours */
  uint64_t *ctr;                  /* ours */
  char *const *peer_area;         /* [q]: q's area as seen here (a device array) */
  uint64_t *const *peer_ctr;      /* [q]: q's counters as seen here (a device array) */
  size_t region_bytes;            /* per sender, a multiple of 16 */
  unsigned blocks, subslots;      /* the grid (every kernel of the communicator) and sub-slots */
  uint64_t timeout_ns;
  int *error;
} fc_p2p_args_t;
typedef struct {
  char *buf;
  size_t bytes;
  int peer, is_send;
} fc_p2p_kop_t;
/* ops: in the batch's order; bytes must match the peer's op alike (it times out otherwise). */
int fc_kernel_p2p(const fc_p2p_args_t *args, const fc_p2p_kop_t *ops, int nops, flexcoll_stream_t stream);
int fc_kernels_preload_p2p(void);
/* Blocks of the one-shot (oneshot.cu) and ring kernels that fit on one SM of the current
 * device at once, the fewest over their instances (0: unknown).  Ranks that share a GPU spin
 * while waiting for each other's blocks: their grids together must fit (lib/gpu caps them). */
int fc_kernels_oneshot_blocks_per_sm(void);
int fc_kernels_ring_blocks_per_sm(void);

#ifdef __cplusplus
}
#endif
#endif
