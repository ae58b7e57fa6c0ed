/* device.h — private to lib/gpu: the per-communicator device state. */
#ifndef FC_GPU_DEVICE_H
#define FC_GPU_DEVICE_H

#include <stdint.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "gpu.h"
#include "kernels/kernels.h"

/* Stream memory operations through the driver's entry points (no link to libcuda). */
typedef CUresult (*fc_wait_value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*fc_write_value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

typedef enum { FC_ENGINE_CE, FC_ENGINE_SM, FC_ENGINE_AUTO } fc_engine_t;

/* Flags of one peer pair, in the receiver's memory: written remotely by the peer. */
typedef struct {
  uint32_t ready;  /* chunks peer q has written into my slots from q */
  uint32_t credit; /* chunks of mine that peer q has consumed from its slots from me */
  uint32_t pad[30];
} fc_pair_flags_t;

typedef struct {
  char *stage;             /* the peer's staging area (or ours), mapped here */
  int ipc_opened;          /* stage came from cudaIpcOpenMemHandle */
  /* Chunks sent to / received from this peer so far.  64 bits, so that the slot index
   * (chunk % nslots) never jumps; the flags in device memory carry the low 32 bits, which the
   * stream waits compare wrap-aware. */
  uint64_t sent, received;
} fc_peer_t;

struct fc_gpu {
  int device;
  int p2p;                 /* every peer reachable by NVLink/PCIe peer access */
  fc_engine_t engine;
  size_t auto_sm_max;      /* auto engine: SM copies up to this slice size, copy engines above */
  cudaStream_t send_stream, recv_stream, util_stream;
  cudaEvent_t ev_user, ev_send, ev_recv;

  char *stage;             /* local staging allocation */
  size_t stage_bytes;
  /* Layout of every staging area (identical on all ranks). */
  size_t oneshot_off, oneshot_slot, oneshot_flags_off;
  size_t pair_flags_off;   /* nranks fc_pair_flags_t: [q] written by peer q */
  size_t slots_off, slice_bytes;
  int nslots;              /* per peer */
  fc_peer_t *peers;
  uint64_t oneshot_seq;
  cudaEvent_t ev_oneshot;      /* after the last one-shot kernel */
  cudaStream_t oneshot_stream; /* where it ran (valid once oneshot_seq > 0) */
  char *dev_scratch;       /* schedule scratch in device memory, grown on demand */
  size_t dev_scratch_bytes;

  int *error_host, *error_dev; /* kernels' timeout flag, host-mapped */
  uint64_t timeout_cycles;

  /* In-flight collectives for timeout detection: completion events and when they were enqueued. */
  cudaEvent_t inflight_ev[64];
  double inflight_t[64];
  unsigned inflight_head, inflight_tail;

  fc_wait_value32_fn wait_value32;
  fc_write_value32_fn write_value32;
};

struct flexcoll_comm;
/* Remember that a collective was enqueued on stream, for timeout detection. */
void fc_gpu_track(struct flexcoll_comm *comm, cudaStream_t stream);

#endif
