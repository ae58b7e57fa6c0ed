/*
 * flexcoll.h — the public C API of flexcoll, a collective-communication library for NVIDIA GPUs
 * that spreads every collective over all the links between them (NVLink, PCIe through host
 * memory, RDMA NICs).  Host memory buffers work too, with or without a GPU.
 *
 * Including this header needs no CUDA header: flexcoll_stream_t is the same type as cudaStream_t.
 * Every function returns a flexcoll_result_t; on failure flexcoll_get_last_error() says why.
 */
#ifndef FLEXCOLL_H
#define FLEXCOLL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLEXCOLL_MAJOR 0
#define FLEXCOLL_MINOR 1
#define FLEXCOLL_PATCH 0
/* flexcoll_get_version() returns MAJOR*10000 + MINOR*100 + PATCH. */
#define FLEXCOLL_VERSION_CODE(x, y, z) ((x) * 10000 + (y) * 100 + (z))
#define FLEXCOLL_VERSION FLEXCOLL_VERSION_CODE(FLEXCOLL_MAJOR, FLEXCOLL_MINOR, FLEXCOLL_PATCH)

/* Values line up with NCCL's ncclResult_t so that a shim is a cast. */
typedef enum {
  FLEXCOLL_SUCCESS = 0,
  FLEXCOLL_UNHANDLED_CUDA_ERROR = 1,
  FLEXCOLL_SYSTEM_ERROR = 2,
  FLEXCOLL_INTERNAL_ERROR = 3,
  FLEXCOLL_INVALID_ARGUMENT = 4,
  FLEXCOLL_INVALID_USAGE = 5,
  FLEXCOLL_REMOTE_ERROR = 6,
  FLEXCOLL_IN_PROGRESS = 7,
  FLEXCOLL_TIMEOUT = 8,
  FLEXCOLL_NUM_RESULTS
} flexcoll_result_t;

typedef enum {
  FLEXCOLL_INT8,
  FLEXCOLL_UINT8,
  FLEXCOLL_INT32,
  FLEXCOLL_UINT32,
  FLEXCOLL_INT64,
  FLEXCOLL_UINT64,
  FLEXCOLL_FLOAT16,
  FLEXCOLL_BFLOAT16,
  FLEXCOLL_FLOAT32,
  FLEXCOLL_FLOAT64,
  FLEXCOLL_NUM_DATATYPES
} flexcoll_datatype_t;

typedef enum {
  FLEXCOLL_SUM,
  FLEXCOLL_PROD,
  FLEXCOLL_MAX,
  FLEXCOLL_MIN,
  FLEXCOLL_AVG,
  FLEXCOLL_NUM_OPS
} flexcoll_op_t;

typedef struct flexcoll_comm *flexcoll_comm_t;
typedef struct CUstream_st *flexcoll_stream_t; /* the same type as cudaStream_t */

#define FLEXCOLL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[FLEXCOLL_UNIQUE_ID_BYTES];
} flexcoll_unique_id_t;

/* Communicator options.  Starts with size and version so that a caller built against an older,
 * shorter struct stays valid; always start from FLEXCOLL_CONFIG_INITIALIZER.  A field left at
 * FLEXCOLL_CONFIG_UNDEF takes its default (the FLEXCOLL_* environment variable, else built-in). */
#define FLEXCOLL_CONFIG_UNDEF (-2147483647 - 1)
#define FLEXCOLL_CONFIG_VERSION 1
typedef struct {
  size_t size;        /* sizeof(flexcoll_config_t) as the caller saw it */
  unsigned int version; /* FLEXCOLL_CONFIG_VERSION as the caller saw it */
  int cuda_device;    /* CUDA device of this rank; -1: host memory only; UNDEF: the current device */
  int timeout_ms;     /* longest wait on a peer before FLEXCOLL_TIMEOUT (FLEXCOLL_TIMEOUT_MS) */
  int blocking;       /* 1: init returns when ready (default); 0: may return FLEXCOLL_IN_PROGRESS */
} flexcoll_config_t;

#define FLEXCOLL_CONFIG_INITIALIZER \
  { sizeof(flexcoll_config_t), FLEXCOLL_CONFIG_VERSION, FLEXCOLL_CONFIG_UNDEF, FLEXCOLL_CONFIG_UNDEF, \
    FLEXCOLL_CONFIG_UNDEF }

/* Library version as MAJOR*10000 + MINOR*100 + PATCH. */
flexcoll_result_t flexcoll_get_version(int *version);
/* A constant, human-readable name for a result code. */
const char *flexcoll_get_error_string(flexcoll_result_t result);
/* The last error message recorded for comm; comm NULL: this thread's last error. */
const char *flexcoll_get_last_error(flexcoll_comm_t comm);

/* A new unique id for flexcoll_comm_init_rank; the caller becomes the bootstrap root. */
flexcoll_result_t flexcoll_get_unique_id(flexcoll_unique_id_t *id);
/* Create rank `rank` of an `nranks` communicator identified by id (collective over all ranks). */
flexcoll_result_t flexcoll_comm_init_rank(flexcoll_comm_t *comm, int nranks, flexcoll_unique_id_t id,
                                          int rank, const flexcoll_config_t *config);
/* Create ndev communicators in this process, one per device (or host ranks when devlist is NULL
 * and there is no GPU), to be driven from threads or from one thread inside a group. */
flexcoll_result_t flexcoll_comm_init_all(flexcoll_comm_t *comms, int ndev, const int *devlist);
/* Create a communicator from the launcher's environment (flexcoll, torchrun, Open MPI, PMI, Slurm). */
flexcoll_result_t flexcoll_comm_init_from_env(flexcoll_comm_t *comm, const flexcoll_config_t *config);
/* Free a communicator once its work is done. */
flexcoll_result_t flexcoll_comm_destroy(flexcoll_comm_t comm);
/* Stop the outstanding work of comm without waiting for peers; free it with flexcoll_comm_destroy. */
flexcoll_result_t flexcoll_comm_abort(flexcoll_comm_t comm);
/* The first asynchronous error of comm (peer gone, timeout), FLEXCOLL_SUCCESS if none. */
flexcoll_result_t flexcoll_comm_get_async_error(flexcoll_comm_t comm, flexcoll_result_t *async_error);
/* Number of ranks in comm. */
flexcoll_result_t flexcoll_comm_count(flexcoll_comm_t comm, int *count);
/* This caller's rank in comm. */
flexcoll_result_t flexcoll_comm_user_rank(flexcoll_comm_t comm, int *rank);
/* CUDA device of comm, -1 on host-only communicators. */
flexcoll_result_t flexcoll_comm_cu_device(flexcoll_comm_t comm, int *device);

/* Communicator splitting (flexcoll_comm_split).  Collective over comm, like NCCL's ncclCommSplit:
 * ranks passing the same color >= 0 form a new communicator, ranked by key, ties by their rank in
 * comm; FLEXCOLL_SPLIT_NOCOLOR takes part but gets *newcomm = NULL.  config NULL (or a field left
 * at FLEXCOLL_CONFIG_UNDEF) inherits comm's settings, its CUDA device included.  Not inside a group. */
#define FLEXCOLL_SPLIT_NOCOLOR (-1)
flexcoll_result_t flexcoll_comm_split(flexcoll_comm_t comm, int color, int key, flexcoll_comm_t *newcomm,
                                      const flexcoll_config_t *config);

/* One link from this rank to one peer, and what it carried (flexcoll_comm_get_link_stats). */
typedef struct {
  char name[16];              /* "nvlink", "pcie", "rdma", "shm", "tcp" */
  int peer;                   /* rank at the other end */
  unsigned long long bytes;   /* bytes this rank sent over the link since creation */
  double busy_us;             /* time the link was busy with them */
  double share;               /* fraction of the last large collective's bytes it carried */
} flexcoll_link_stats_t;
/* Up to max_links entries (one per link and peer) into stats; *nlinks = how many there are. */
flexcoll_result_t flexcoll_comm_get_link_stats(flexcoll_comm_t comm, flexcoll_link_stats_t *stats, int max_links,
                                               int *nlinks);

/* recvbuf[i] = op over all ranks of sendbuf[i], i < count. */
flexcoll_result_t flexcoll_allreduce(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype,
                                     flexcoll_op_t op, flexcoll_comm_t comm, flexcoll_stream_t stream);
/* recvbuf[r*sendcount + i] = sendbuf of rank r [i]. */
flexcoll_result_t flexcoll_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                     flexcoll_datatype_t dtype, flexcoll_comm_t comm, flexcoll_stream_t stream);
/* recvbuf[i] = op over all ranks of sendbuf[rank*recvcount + i]. */
flexcoll_result_t flexcoll_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                          flexcoll_datatype_t dtype, flexcoll_op_t op, flexcoll_comm_t comm,
                                          flexcoll_stream_t stream);
/* recvbuf = root's sendbuf on every rank (sendbuf is read on the root only; with host windows,
 * every rank's sendbuf decides the path: see flexcoll_window_register). */
flexcoll_result_t flexcoll_broadcast(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype,
                                     int root, flexcoll_comm_t comm, flexcoll_stream_t stream);
/* recvbuf on root = op over all ranks of sendbuf. */
flexcoll_result_t flexcoll_reduce(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype,
                                  flexcoll_op_t op, int root, flexcoll_comm_t comm, flexcoll_stream_t stream);

/* recvbuf[r*count + i] = rank r's sendbuf[rank*count + i].  In place when sendbuf == recvbuf (as in
 * NCCL), at the cost of one extra copy through a temporary of the buffer's size; any other
 * overlap is refused. */
flexcoll_result_t flexcoll_alltoall(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype,
                                    flexcoll_comm_t comm, flexcoll_stream_t stream);
/* The root's recvbuf[r*count + i] = rank r's sendbuf[i] (recvbuf is read on the root only; in
 * place: the root's sendbuf at recvbuf + root*count).  Run as point-to-point transfers between
 * the root and every rank, as NCCL's ncclGather: matched in order with flexcoll_send/recv. */
flexcoll_result_t flexcoll_gather(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype, int root,
                                  flexcoll_comm_t comm, flexcoll_stream_t stream);
/* recvbuf[i] = the root's sendbuf[rank*count + i] (sendbuf is read on the root only; in place:
 * the root's recvbuf at sendbuf + root*count).  As flexcoll_gather, point-to-point transfers. */
flexcoll_result_t flexcoll_scatter(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype, int root,
                                   flexcoll_comm_t comm, flexcoll_stream_t stream);
/* Send count elements to rank peer, matched in order by peer's flexcoll_recv from this rank.
 * Inside a group, all sends and receives of a communicator run concurrently. */
flexcoll_result_t flexcoll_send(const void *sendbuf, size_t count, flexcoll_datatype_t dtype, int peer,
                                flexcoll_comm_t comm, flexcoll_stream_t stream);
/* Receive count elements from rank peer (see flexcoll_send). */
flexcoll_result_t flexcoll_recv(void *recvbuf, size_t count, flexcoll_datatype_t dtype, int peer,
                                flexcoll_comm_t comm, flexcoll_stream_t stream);

/* Symmetric windows: memory that every rank registers together, so that large collectives on
 * it copy straight between the ranks' buffers with no per-call handshake.
 * Collective: every rank of comm calls it with its own buffer, all of the same size, in the same
 * order.  The buffer is either device memory of comm's device inside one allocation from
 * cudaMalloc, or host memory inside one allocation from flexcoll_host_alloc (the other processes
 * of the host map it).  A device collective takes the direct path when each buffer that peers
 * touch (allreduce: both; allgather and broadcast: recvbuf; reduce_scatter: sendbuf) lies in a
 * window at the SAME offset from its window's start on every rank; otherwise it runs the staged
 * pipeline.  Breaking that rule on some ranks only ends in FLEXCOLL_TIMEOUT.  On host memory, for
 * ranks that share one host, the buffers peers touch in windows (at the same offsets; allreduce:
 * both, reduce_scatter and broadcast: sendbuf on every rank, allgather: recvbuf) let a collective
 * read the peers' inputs and write their outputs in place; ranks that disagree on the windows or
 * the offsets get FLEXCOLL_INVALID_USAGE.  From one thread driving several communicators, call it inside
 * flexcoll_group_start/end (*window is set at the group's end). */
typedef struct flexcoll_window *flexcoll_window_t;
flexcoll_result_t flexcoll_window_register(flexcoll_comm_t comm, void *buf, size_t bytes, flexcoll_window_t *window);
/* Collective: waits for comm's work on the window, unmaps the peers' buffers; after it returns
 * on every rank the buffer may be freed. */
flexcoll_result_t flexcoll_window_deregister(flexcoll_comm_t comm, flexcoll_window_t window);
/* Host memory that the processes of one host can map into one another, for windows on host
 * memory (flexcoll_window_register): bytes (> 0) rounded up to whole pages, zero-filled, shared
 * with no other process until it is registered.  Not collective; any thread. */
flexcoll_result_t flexcoll_host_alloc(size_t bytes, void **ptr);
/* Free what flexcoll_host_alloc returned (ptr exactly; NULL does nothing).  Refused with
 * FLEXCOLL_INVALID_USAGE while a window of a live communicator lies in it. */
flexcoll_result_t flexcoll_host_free(void *ptr);

/* MoE dispatch and combine (flexcoll_moe_create(3)): tokens go straight into the receive buffers
 * of the ranks holding their experts, over the peers' NVLink mappings, and the expert outputs
 * come back summed.  All ranks of comm must reach each other's device memory (one node).
 * Always start from FLEXCOLL_MOE_CONFIG_INITIALIZER. */
typedef struct flexcoll_moe *flexcoll_moe_t;
typedef enum { FLEXCOLL_MOE_FENCE, FLEXCOLL_MOE_SENTINEL, FLEXCOLL_MOE_AUTO } flexcoll_moe_sync_t;
#define FLEXCOLL_MOE_CONFIG_VERSION 1
typedef struct {
  size_t size; unsigned version;      /* FLEXCOLL_MOE_CONFIG_INITIALIZER */
  int max_tokens;                     /* per rank per call, 1..65536 */
  int hidden;                         /* elements per token (hidden * element size: a multiple of 16 bytes) */
  flexcoll_datatype_t dtype;          /* payload type: bfloat16, float16, float32, int8 */
  int top_k;                          /* experts per token, 1..15 */
  int num_experts;                    /* across all ranks, experts rank-major: expert e lives on rank e / (num_experts / nranks) */
  flexcoll_moe_sync_t sync;
} flexcoll_moe_config_t;
#define FLEXCOLL_MOE_CONFIG_INITIALIZER \
  { sizeof(flexcoll_moe_config_t), FLEXCOLL_MOE_CONFIG_VERSION, 0, 0, FLEXCOLL_BFLOAT16, 0, 0, FLEXCOLL_MOE_AUTO }
/* A received row's meta word (recv_meta): the sender's token index and which of its top_k
 * experts (bit k: expert_ids[t][k]) live on this rank. */
#define FLEXCOLL_MOE_META_TOKEN(m) ((int)((unsigned)(m) & 0xffffu))
#define FLEXCOLL_MOE_META_MASK(m) ((int)((unsigned)(m) >> 16))
flexcoll_result_t flexcoll_moe_create(flexcoll_comm_t comm, const flexcoll_moe_config_t *cfg, flexcoll_moe_t *moe);   /* collective */
flexcoll_result_t flexcoll_moe_destroy(flexcoll_moe_t moe);                                                          /* collective */
/* Send each token (tokens[T][hidden]) to the ranks of its top_k experts (expert_ids[T][top_k], below 0 = none;
 * an id not below num_experts goes nowhere and makes the communicator's async error FLEXCOLL_INVALID_ARGUMENT),
 * once per destination rank. On return (stream-ordered) recv_tokens points at this rank's rank-major receive
 * buffer [nranks][max_tokens][hidden] in device memory, recv_counts[nranks] (device) says how many rows came from
 * each source, recv_meta[nranks][max_tokens] (device) gives for each row its source token index and top_k mask. */
flexcoll_result_t flexcoll_moe_dispatch(flexcoll_moe_t moe, const void *tokens, const int *expert_ids, int T,
                                        void **recv_tokens, int **recv_counts, int **recv_meta, flexcoll_stream_t stream);
/* The expert outputs, in the same rank-major layout as the receive buffer, go back to their source tokens:
 * out[T][hidden] = sum over the token's top_k experts of weights[t][k] * expert_out row, accumulated in fp32. */
flexcoll_result_t flexcoll_moe_combine(flexcoll_moe_t moe, const void *expert_out, const float *weights, void *out,
                                       flexcoll_stream_t stream);

/* Queue the following calls of this thread until the matching flexcoll_group_end. */
flexcoll_result_t flexcoll_group_start(void);
/* Run the calls queued since flexcoll_group_start (the outermost end runs them). */
flexcoll_result_t flexcoll_group_end(void);

#ifdef __cplusplus
}
#endif
#endif /* FLEXCOLL_H */
