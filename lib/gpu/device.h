/* device.h — private to lib/gpu: the per-communicator device state. */
#ifndef FC_GPU_DEVICE_H
#define FC_GPU_DEVICE_H

#include <stdint.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "gpu.h"
#include "kernels/kernels.h"
#include "sched/sched.h"
#include "window.h"

/* Stream memory operations through the driver's entry points (no link to libcuda). */
typedef CUresult (*fc_wait_value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*fc_write_value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

typedef CUresult (*fc_get_address_range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);

/* Direct mode's flags of one peer pair, in the receiver's memory: written remotely by the peer. */
typedef struct {
  uint32_t arrive; /* direct mode: the last call peer q's stream has reached (its buffers are ready) */
  uint32_t done;   /* direct mode: the last call in which peer q has finished with my buffers */
  uint32_t desc;   /* direct mode: what peer q's current call is (coll, count, window offsets...) */
  uint32_t pad[29];
} fc_pair_flags_t;

/* A peer's allocation mapped into this process through CUDA IPC (peer_mem.c), kept while a
 * window pins it, else until the communicator is destroyed or the cache fills. */
typedef struct {
  int peer;
  int pins;  /* windows that use it */
  cudaIpcMemHandle_t handle;
  char *base;
} fc_ipc_entry_t;
#define FC_IPC_CACHE 64
/* What a rank tells the others about one of its buffers. */
typedef struct {
  uint64_t ptr;               /* in the owner's address space; 0: no buffer */
  uint64_t offset;            /* from the start of its allocation */
  cudaIpcMemHandle_t handle;  /* of that allocation (when some peer is in another process) */
} fc_buf_desc_t;

/* Direct mode pipelines a rank's chunk in pieces; events of the last FC_DIRECT_EVENTS pieces. */
#define FC_DIRECT_EVENTS 8

typedef struct {
  char *stage;             /* the peer's staging area (or ours), mapped here */
  int ipc_opened;          /* stage came from cudaIpcOpenMemHandle */
  int same_process;        /* the peer's pointers are valid here as they are */
  int same_device;         /* the peer runs on our GPU (its kernels compete with ours for SMs) */
} fc_peer_t;

/* Stage 2's board (pcie.c): the lanes' models as rank 0 updates them, one entry per update, in
 * POSIX shared memory that rank 0 creates and every rank maps; entry m lives at m %
 * FC_LANE_BOARD_ENTRIES and is written as a seqlock (m zeroed, the fields, m stored last). */
#define FC_LANE_BOARD_ENTRIES 256
typedef struct {
  uint64_t m;                /* the update's number (>= 1); 0 while the entry is rewritten */
  fc_link_model_t model[FC_RING_LANES]; /* nvlink, the side lanes */
  int32_t probe[FC_RING_LANES];
  double parts[FC_RING_LANES], us[FC_RING_LANES]; /* rank 0's timed calls behind it, and their time (the log) */
} fc_lane_board_entry_t;

/* A rank's host area of the pcie lane: counters (ready and ack per block, as kernels.h lays
 * out ring counters; then, for the copy-engine lane, the kernel's published counts, the proxy's
 * staged counts and the descriptors per block; then, for a lane whose neighbours are on other
 * hosts, a stand-in for the previous rank's counters laid out as ours, whose ack half the
 * kernel raises and the proxy forwards), then the ring area. */
#define FC_PCIE_SENT_OFF (2 * FC_MAX_BLOCKS * sizeof(uint64_t))
#define FC_PCIE_STAGED_OFF (3 * FC_MAX_BLOCKS * sizeof(uint64_t))
#define FC_PCIE_DESC_OFF (4 * FC_MAX_BLOCKS * sizeof(uint64_t))
#define FC_PCIE_PREV_OFF (FC_PCIE_DESC_OFF + FC_MAX_BLOCKS * FC_PCIE_DESCS * sizeof(fc_pcie_desc_t))
#define FC_PCIE_CTR_BYTES ((FC_PCIE_PREV_OFF + 2 * FC_MAX_BLOCKS * sizeof(uint64_t) + 4095) / 4096 * 4096)
struct fc_pcie_proxy;

/* A side lane of the ring kernels (pcie.c): host staging areas, ours and our ring neighbours',
 * mapped here, and what moves its bytes.  Its place in fc_ring_args_t.side is index; its model
 * is fc_pcie_t.model[index + 1] (lane index + 1 wherever arrays count NVLink as lane 0). */
typedef struct {
  int index;
  int on;                  /* on every rank */
  int ce;                  /* its messages moved by a proxy thread (pcie_ce.c), on every rank */
  /* ce: the proxy's mover: NULL, copy engines through the host areas; else this host link
   * (FLEXCOLL_RING_LANE=rdma), which takes device buffers: each message goes from our outbox
   * into the next rank's inbox as one of the link's messages, and the lane carries its name. */
  struct fc_link *link;
  const char *name;        /* "pcie", or the link's name */
  /* link: the ranks are on several hosts, so no rank maps another's host area: descriptors and
   * acknowledgements go over the link too (lane_link.h, in band); next and prev (the kernel's
   * side ctr_next and ctr_prev) then point into our own area (unused, and the stand-in). */
  int inband;
  struct fc_pcie_proxy *proxy; /* ce: this rank's */
  char *boxes;             /* ce: device memory: outbox, inbox (area_bytes each), the published counts */
  uint64_t *pub;           /* ce: in boxes */
  uint64_t *ready;         /* ce: the kernel's ready counters in boxes (FLEXCOLL_PCIE_CE_READY=device), else NULL */
  size_t bytes;            /* of every rank's area: counters, then the ring area */
  size_t ctr_bytes, area_bytes;
  unsigned blocks;         /* most blocks of a ring grid on this lane */
  char *own_host, *next_host, *prev_host; /* the mappings (prev_host == next_host with 2 ranks) */
  char *own, *next, *prev;                /* the same as device pointers */
  int stall_reported;      /* fc_pcie_report_timeout has written its lines */
} fc_side_lane_t;

/* The ring kernels' lanes beside NVLink (pcie.c): the side lanes and the lanes' cost models.
 * Arrays of FC_RING_LANES hold NVLink at 0 and side lane k at k + 1. */
typedef struct {
  fc_side_lane_t side[FC_RING_SIDE_LANES];
  int nside;               /* side lanes on: side[0 .. nside - 1], in FLEXCOLL_RING_LANE's order, on every rank */
  int only;                /* no NVLink lane (no peer access): ring calls go through the side lanes whole */
  /* A ring by hops (ranks on several hosts, FLEXCOLL_RING_HOPS): NVLink within a host, side lane
   * 0 over the link between hosts; hop_in and hop_out are our two edges' lanes (kernels.h). */
  int hops, hop_in, hop_out;
  /* FLEXCOLL_LINK_SHARES's fractions of the lanes it names (summing to 1 over the lanes that can
   * carry bytes); fixed[0] < 0: the balancer's split */
  double fixed[FC_RING_LANES];
  fc_link_model_t model[FC_RING_LANES]; /* identical on every rank */
  unsigned long long sent[FC_RING_LANES]; /* bytes this rank pushed to the next one on each lane */
  double share[FC_RING_LANES]; /* of the last ring call's bytes */
  /* Stage 2 of the lanes (pcie.c): ring calls of at least stage2_bytes (count x type size) are
   * timed by the kernel (fc_lane_record_t).  adapt: rank 0's times move the models (the split is
   * the balancer's): every FC_STAGE2_EVERY large calls rank 0 posts an update on the board, and
   * every rank puts it in force FC_LANE_STAGE2_LAG large calls later. */
  int adapt;
  size_t stage2_bytes;     /* 0: no call is timed */
  unsigned long long issued, seen; /* timed calls launched; records taken or lost */
  unsigned large_calls;    /* large ring calls so far, captured ones too: the same on every rank */
  double meas_parts[FC_RING_LANES], meas_bytes[FC_RING_LANES], meas_us[FC_RING_LANES]; /* since rank 0's last update */
  double throttle[FC_RING_LANES]; /* tests: measured times are multiplied by it (0: 1) */
  int probe[FC_RING_LANES];       /* in force, with model */
  fc_link_model_t next_model[FC_RING_LANES]; /* rank 0: as of its last update (the others' lag behind) */
  int next_idle[FC_RING_LANES], next_probe[FC_RING_LANES];
  fc_stage2_history_t next_hist[FC_RING_LANES];
  fc_lane_board_entry_t *board; /* mapped (adapt) */
  double busy_us[FC_RING_LANES];  /* the timed calls' lane times, summed (statistics) */
} fc_pcie_t;

struct fc_gpu {
  int device;
  uint64_t where_hash;     /* every rank's host and GPU, in rank order (connect_peers): a cache key */
  int p2p;                 /* every peer reachable by NVLink/PCIe peer access */
  cudaStream_t util_stream;    /* set-up, abort */
  /* Direct mode's copies and reductions (direct.c), made at its first call (NULL before). */
  cudaStream_t send_stream, recv_stream, reduce_stream;
  cudaEvent_t ev_user, ev_send, ev_recv;

  char *stage;             /* local staging allocation */
  size_t stage_bytes;
  /* Layout of every staging area (identical on all ranks). */
  size_t oneshot_off, oneshot_slot, oneshot_flags_off;
  size_t ll_off, ll_max;   /* the one-shot kernels' LL area, and their LL limit per rank (0: off) */
  unsigned oneshot_blocks; /* grid cap of the plain one-shot kernels */
  size_t pair_flags_off;   /* nranks fc_pair_flags_t: [q] written by peer q */
  fc_peer_t *peers;
  /* One-shot and pipelined kernels enqueued or captured so far: only whether there was one
   * (the kernels number their calls themselves, in epoch). */
  uint64_t oneshot_seq;
  fc_dev_epoch_t *epoch;       /* their sequence state, device memory (kernels.h) */
  int pipeline;                /* FLEXCOLL_PIPELINE and a slot big enough: pipelined kernels in use */
  unsigned pipe_blocks, pipe_threads, pipe_subslots; /* their shape (kernels.h) */
  unsigned pipe_push_threads;
  /* Ring kernels (lib/kernels/ring.cu) for any rank count: on (FLEXCOLL_RING_KERNEL), their
   * area and counters in the staging area, their grid cap and sub-slots. */
  int ring;
  size_t ring_off, ring_bytes, ring_ctr_off;
  unsigned ring_blocks, ring_subslots;
  /* The ring's order (ring_place, set_ring_order in gpu.c): host by host where the ranks are on
   * several hosts (the links' order), else by rank.  Our place, the ranks before and after us,
   * and the rank at each place in device memory (NULL where places are ranks). */
  int ring_pos, ring_next, ring_prev;
  int *ring_rank_dev;
  fc_pcie_t pcie;              /* their second lane, through host memory (pcie.c) */
  /* The ring kernels' clock (device memory) and record ring (host-mapped; the device's view of
   * it), kernels.h: stage 2 of the lanes. */
  fc_lane_clock_t *lane_clk;
  fc_lane_record_t *lane_rec, *lane_rec_dev;
  /* The point-to-point kernel (lib/kernels/p2p.cu): counters before the slots, the area (one
   * region per sender) after the ring area, the pair counts and the peers' pointers on the
   * device, its grid. */
  size_t p2p_ctr_off, p2p_off, p2p_region;
  unsigned p2p_blocks;
  uint64_t *p2p_base;          /* 2 * nranks counts, then the kernel's block counter */
  char **p2p_peer_area;        /* device arrays of the peers' areas and counters */
  uint64_t **p2p_peer_ctr;
  cudaEvent_t ev_oneshot;      /* after the last one-shot, pipelined, ring, alltoall or p2p kernel */
  cudaStream_t oneshot_stream; /* where it ran (valid once oneshot_seq > 0) */
  char *dev_scratch;       /* direct mode's scratch in device memory, grown on demand (direct.c) */
  size_t dev_scratch_bytes;
  char *host_copy[2];      /* host copies of send and recv buffers (exec.c run_through_host), grown on demand */
  size_t host_copy_bytes[2];

  /* Direct mode (direct.c) and the peers' memory it uses (peer_mem.c). */
  uint32_t direct_seq;         /* direct calls so far */
  uint32_t direct_desc;        /* the current direct call's descriptor (abort releases waits on it) */
  struct flexcoll_window *windows;
  unsigned windows_registered;
  int any_ipc_peer;            /* some peer lives in another process */
  fc_ipc_entry_t ipc_cache[FC_IPC_CACHE];
  int ipc_cached;
  cudaEvent_t ev_pulled[FC_DIRECT_EVENTS], ev_reduced[FC_DIRECT_EVENTS], ev_local;

  int *error_host, *error_dev; /* kernels' timeout flag, host-mapped */
  uint64_t timeout_ns;

  /* In-flight collectives for timeout detection: completion events and when they were enqueued. */
  cudaEvent_t inflight_ev[64];
  double inflight_t[64];
  unsigned inflight_head, inflight_tail;

  fc_wait_value32_fn wait_value32;
  fc_write_value32_fn write_value32;
  fc_get_address_range_fn get_address_range;
};

/* The side lanes (pcie.c).  Open: collective, after the peers are connected; a lane is on only
 * where every rank could map its areas (else one INFO line says why; not an error).  Split: the
 * bytes of a ring chunk each side lane carries (side[k]: a multiple of 16, or the rest of the
 * chunk; the NVLink lane takes what they leave, fc_ring_lane_cut), a pure function of
 * communicator constants and the shared models. */
flexcoll_result_t fc_pcie_open(struct flexcoll_comm *comm, struct fc_gpu *g);
void fc_pcie_close(struct fc_gpu *g);
/* Once a kernel of the communicator timed out: the kernel-driven lane's counters in the three
 * host areas this rank maps (its own, the previous and the next rank's), one warning per block
 * that has moved, so that the ranks' lines together show where the ring stopped.  Once per
 * communicator; the copy-engine lane's proxy reports its own. */
void fc_pcie_report_timeout(struct fc_gpu *g, int rank);
/* Each side lane's bytes of a ring chunk (fc_lanes_split over the lanes' models in force), for a
 * call in which a rank pushes at most msgs chunk messages: the same on every rank. */
void fc_pcie_split(const struct fc_gpu *g, size_t chunk, unsigned msgs, size_t *side);
/* The copy-engine mover (pcie_ce.c), after the areas are mapped: its device boxes and proxy
 * thread for side lane s; where it cannot start, s->proxy stays NULL and why says so.  Stop: the proxy joined,
 * its copies done, the boxes freed (also after a failed start). */
flexcoll_result_t fc_pcie_ce_start(struct flexcoll_comm *comm, struct fc_gpu *g, fc_side_lane_t *s, char *why,
                                   size_t wlen);
void fc_pcie_ce_stop(fc_side_lane_t *s);
/* Before a ring call with a share on a proxy's lane: wake the lane's proxy if it sleeps. */
void fc_pcie_ce_kick(fc_side_lane_t *s);
/* Stage 2 of the lanes around a ring call of `bytes` (count x type size) whose split is already in
 * a->side[k].chunk_bytes: before the launch, take the records of timed calls that have finished (never
 * waiting for one) and, for a large eager call, have the kernel time this one (a's clock fields;
 * pushes: the chunk messages this rank sends, 0 at a chain's end); after the launch, count a
 * large call (captured ones too: every rank counts alike), post rank 0's update every
 * FC_STAGE2_EVERY of them and put the one due in force (waiting, on ranks other than 0, only
 * while rank 0's host is that far behind; bounded by the timeout and abort).  Returns whether
 * the call is large. */
int fc_pcie_before_ring(struct fc_gpu *g, size_t bytes, size_t chunk, int pushes, int capturing, fc_ring_args_t *a);
flexcoll_result_t fc_pcie_after_ring(struct flexcoll_comm *comm, struct fc_gpu *g, int large);
/* A rank's place in the ring kernels' order (gpu.c, fc_gpu.ring_pos). */
int fc_gpu_ring_place(const struct flexcoll_comm *comm, int rank);
/* The ring kernels' arguments of this communicator, without a pcie share (exec.c). */
void fc_gpu_ring_args(const struct flexcoll_comm *comm, const struct fc_gpu *g, fc_ring_args_t *a);

/* Return a CUDA failure (runtime or driver) from the enclosing function as
 * FLEXCOLL_UNHANDLED_CUDA_ERROR, naming the call. */
#define CU_TRY(comm, call)                                                                                   \
  do {                                                                                                       \
    CUresult r_ = (call);                                                                                    \
    if (r_ != CUDA_SUCCESS)                                                                                  \
      return fc_error((comm), FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s failed: CUresult %d", #call, (int)r_);      \
  } while (0)
#define CUDA_TRY(comm, call)                                                                                 \
  do {                                                                                                       \
    cudaError_t e_ = (cudaError_t)(call);                                                                    \
    if (e_ != cudaSuccess)                                                                                   \
      return fc_error((comm), FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s failed: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

struct flexcoll_comm;
/* Remember that a collective was enqueued on stream, for timeout detection. */
void fc_gpu_track(struct flexcoll_comm *comm, cudaStream_t stream);

/* Flags of peer q in the staging area `stage` (ours, or a peer's as mapped here). */
static inline fc_pair_flags_t *fc_pair_flags(struct fc_gpu *g, char *stage, int q) {
  return (fc_pair_flags_t *)(stage + g->pair_flags_off) + q;
}

/* Direct mode's streams: made where they are not yet (gpu.c), waited for where they are. */
flexcoll_result_t fc_gpu_side_streams(struct flexcoll_comm *comm, struct fc_gpu *g);
/* Make device current on this thread, its context too; returns what to hand fc_gpu_leave_device
 * afterwards: the caller's device, or -1 when it was current already. */
int fc_gpu_switch_device(int device);
void fc_gpu_side_streams_sync(struct fc_gpu *g);

/* Direct mode (direct.c): large allreduce, allgather, reduce_scatter and broadcast copied by
 * the copy engines straight between the ranks' own buffers, no staging.  *done = 0 when the
 * other device paths run the call instead (the buffers are not in windows, or cannot be shared). */
flexcoll_result_t fc_gpu_direct_run(struct flexcoll_comm *comm, const fc_algo_args_t *args, const void *sendbuf,
                                    void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op, cudaStream_t user,
                                    int *done);

/* The peers' memory (peer_mem.c). */
/* Describe ptr for the peers; 0 when it cannot be shared with another process. */
int fc_peer_mem_describe(struct fc_gpu *g, const void *ptr, fc_buf_desc_t *d);
/* Peer q's buffer d as a pointer valid here, mapping its allocation if needed (pin: for a window). */
flexcoll_result_t fc_peer_mem_map(struct flexcoll_comm *comm, int q, const fc_buf_desc_t *d, int pin, char **out);
/* Make room for `entries` more mappings (may wait for this communicator's device work). */
flexcoll_result_t fc_peer_mem_reserve(struct fc_gpu *g, int entries);
/* The window holding [ptr, ptr + bytes), and ptr's offset in it; 0 if none. */
int fc_peer_mem_window_of(struct fc_gpu *g, const void *ptr, size_t bytes, const struct flexcoll_window **w,
                          size_t *offset);
/* Unmap everything (destroy). */
void fc_peer_mem_release(struct fc_gpu *g);

#endif
