/* api.c — the public entry points: argument checks, the group queue, dispatch by memory type. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "dtype.h"
#include "error.h"
#include "gpu/gpu.h"
#include "group.h"
#include "host/host.h"
#include "host/shm.h"
#include "sched/sched.h"

flexcoll_result_t flexcoll_get_version(int *version) {
  if (!version) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_get_version: version is NULL");
  *version = FLEXCOLL_VERSION;
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t flexcoll_get_unique_id(flexcoll_unique_id_t *id) {
  if (!id) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "flexcoll_get_unique_id: id is NULL");
  return fc_bootstrap_create_root(id);
}

flexcoll_result_t fc_check_config(const flexcoll_config_t *config, const char *fn) {
  if (!config) return FLEXCOLL_SUCCESS;
  if (config->size < offsetof(flexcoll_config_t, version) + sizeof config->version || config->version == 0 ||
      config->version > FLEXCOLL_CONFIG_VERSION)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT,
                    "%s: config not initialised with FLEXCOLL_CONFIG_INITIALIZER (size %zu, version %u)", fn,
                    config->size, config->version);
  if (config->size >= offsetof(flexcoll_config_t, timeout_ms) + sizeof(int) && config->timeout_ms != FLEXCOLL_CONFIG_UNDEF &&
      config->timeout_ms <= 0)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: config.timeout_ms %d must be positive", fn, config->timeout_ms);
  if (config->size >= offsetof(flexcoll_config_t, blocking) + sizeof(int) && config->blocking != FLEXCOLL_CONFIG_UNDEF &&
      config->blocking != 0 && config->blocking != 1)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: config.blocking %d must be 0 or 1", fn, config->blocking);
  if (config->size >= offsetof(flexcoll_config_t, cuda_device) + sizeof(int) && config->cuda_device != FLEXCOLL_CONFIG_UNDEF &&
      config->cuda_device < -1)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: config.cuda_device %d is neither a device index nor -1 (host only)",
                    fn, config->cuda_device);
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t flexcoll_comm_init_rank(flexcoll_comm_t *comm, int nranks, flexcoll_unique_id_t id, int rank,
                                          const flexcoll_config_t *config) {
  return fc_comm_init_rank(comm, nranks, id, rank, config, NULL);
}

static flexcoll_result_t init_rank(flexcoll_comm_t *comm, int nranks, const flexcoll_unique_id_t *id, int rank,
                                   const flexcoll_config_t *config, fc_bootstrap_root_t **root) {
  const char *fn = "flexcoll_comm_init_rank";
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  *comm = NULL;
  if (nranks < 1 || nranks > 65535)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: nranks %d out of range [1, 65535]", fn, nranks);
  if (rank < 0 || rank >= nranks)
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: rank %d out of range [0, %d)", fn, rank, nranks);
  FC_CHECK(fc_check_config(config, fn));
  flexcoll_comm_t c;
  FC_CHECK(fc_comm_alloc(&c, nranks, rank, id, config));
  c->root = *root; /* from here on the communicator stops it */
  *root = NULL;
  if (fc_group_active()) {
    flexcoll_result_t res = fc_group_enqueue_init(c);
    if (res != FLEXCOLL_SUCCESS) { flexcoll_comm_destroy(c); return res; }
    *comm = c;
    return FLEXCOLL_SUCCESS;
  }
  if (c->init_config.blocking == 0) {
    /* Returns at once; flexcoll_comm_get_async_error says IN_PROGRESS until the initialisation
     * ends, then its result (a failed communicator is handed out, so the caller can read why). */
    flexcoll_result_t res = fc_comm_init_in_background(c);
    if (res != FLEXCOLL_IN_PROGRESS) { flexcoll_comm_destroy(c); return res; }
    *comm = c;
    return res;
  }
  flexcoll_result_t res = fc_comm_init(c);
  if (res != FLEXCOLL_SUCCESS) { flexcoll_comm_destroy(c); return res; }
  *comm = c;
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_comm_init_rank(flexcoll_comm_t *comm, int nranks, flexcoll_unique_id_t id, int rank,
                                    const flexcoll_config_t *config, fc_bootstrap_root_t *root) {
  flexcoll_result_t res = init_rank(comm, nranks, &id, rank, config, &root);
  fc_bootstrap_stop_root(root); /* still ours only when refused before a communicator took it */
  return res;
}

flexcoll_result_t flexcoll_comm_init_all(flexcoll_comm_t *comms, int ndev, const int *devlist) {
  const char *fn = "flexcoll_comm_init_all";
  if (!comms) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: comms is NULL", fn);
  if (ndev < 1 || ndev > 65535) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: ndev %d out of range [1, 65535]", fn, ndev);
  /* Refused or not, comms holds no handle a cleanup loop could mistake for a communicator. */
  for (int i = 0; i < ndev; i++) comms[i] = NULL;
  int ngpus = fc_gpu_count();
  if (devlist) {
    for (int i = 0; i < ndev; i++) {
      if (devlist[i] < 0 || devlist[i] >= ngpus)
        return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: devlist[%d] = %d but this process sees %d CUDA device(s)", fn,
                        i, devlist[i], ngpus);
      for (int j = 0; j < i; j++)
        if (devlist[j] == devlist[i])
          return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: devlist[%d] and devlist[%d] are both device %d", fn, j, i,
                          devlist[i]);
    }
  } else if (ngpus > 0 && ndev > ngpus) {
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: ndev %d but only %d CUDA device(s); pass devlist or fewer", fn,
                    ndev, ngpus);
  }
  flexcoll_unique_id_t id;
  FC_CHECK(fc_bootstrap_create_root(&id));
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  /* All ranks are initialised together in one group: each in its own thread at group_end. */
  flexcoll_group_start();
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  for (int i = 0; i < ndev && res == FLEXCOLL_SUCCESS; i++) {
    config.cuda_device = devlist ? devlist[i] : (ngpus > 0 ? i : -1);
    res = flexcoll_comm_init_rank(&comms[i], ndev, id, i, &config);
  }
  flexcoll_result_t end = flexcoll_group_end();
  if (res == FLEXCOLL_SUCCESS) res = end;
  if (res != FLEXCOLL_SUCCESS) {
    for (int i = 0; i < ndev; i++)
      if (comms[i]) { flexcoll_comm_abort(comms[i]); flexcoll_comm_destroy(comms[i]); comms[i] = NULL; }
  }
  return res;
}

/* ------------------------------------------------------------------------------------------ */

/* The buffers of a collective may coincide only in NCCL's in-place forms: a partial overlap
 * makes a rank read input it has already overwritten with output, which gives wrong results,
 * different ones on different ranks, with rc 0.  Pure pointer arithmetic, so device buffers are
 * checked too.  Only called when this rank uses both buffers (a broadcast's non-root ignores
 * sendbuf, a reduce's recvbuf). */
static flexcoll_result_t check_overlap(const fc_call_t *c, size_t send_bytes, size_t recv_bytes, size_t esize,
                                       const char *fn) {
  flexcoll_comm_t comm = c->comm;
  /* uintptr_t: comparing pointers into different objects is undefined in C. */
  uintptr_t s = (uintptr_t)c->sendbuf, r = (uintptr_t)c->recvbuf;
  if (!(s < r + recv_bytes && r < s + send_bytes)) return FLEXCOLL_SUCCESS;
  size_t slot = (size_t)comm->rank * c->count * esize;
  switch (c->coll) {
    case FC_COLL_ALLGATHER:
      if (s == r + slot) return FLEXCOLL_SUCCESS;
      return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                      "%s: sendbuf and recvbuf overlap but sendbuf is not this rank's slot of recvbuf (recvbuf + rank %d "
                      "x sendcount), the only overlap allowed (in place)", fn, comm->rank);
    case FC_COLL_REDUCE_SCATTER:
      if (r == s + slot) return FLEXCOLL_SUCCESS;
      return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                      "%s: sendbuf and recvbuf overlap but recvbuf is not this rank's block of sendbuf (sendbuf + rank %d "
                      "x recvcount), the only overlap allowed (in place)", fn, comm->rank);
    default:
      /* allreduce, broadcast, reduce, alltoall (whose executors send an in-place input from a
       * copy: fc_host_run, fc_gpu_run). */
      if (s == r) return FLEXCOLL_SUCCESS;
      return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                      "%s: sendbuf and recvbuf overlap partially (recvbuf - sendbuf = %td bytes); they must be the same "
                      "pointer (in place) or not overlap", fn, (ptrdiff_t)(r - s));
  }
}

/* The communicator of a call: live, or initialised earlier in this thread's group.  held: the
 * caller entered it (fc_comm_enter), which proved it live. */
static flexcoll_result_t check_call_comm(flexcoll_comm_t comm, const char *fn, int held) {
  if (!comm) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: comm is NULL", fn);
  if (held) return fc_comm_check_held(comm, fn);
  if (fc_group_active() && fc_comm_is_live(comm) && atomic_load(&comm->state) == FC_COMM_PENDING && fc_group_inits(comm))
    return FLEXCOLL_SUCCESS;
  return fc_comm_check(comm, fn);
}

static flexcoll_result_t check_call(const fc_call_t *c, const char *fn, int held) {
  flexcoll_comm_t comm = c->comm;
  FC_CHECK(check_call_comm(comm, fn, held));
  if ((unsigned)c->dtype >= FLEXCOLL_NUM_DATATYPES)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: datatype %d is not a flexcoll_datatype_t", fn, (int)c->dtype);
  if ((unsigned)c->op >= FLEXCOLL_NUM_OPS)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: op %d is not a flexcoll_op_t", fn, (int)c->op);
  if (c->kind == FC_CALL_COLL && (c->coll == FC_COLL_BROADCAST || c->coll == FC_COLL_REDUCE) &&
      (c->root < 0 || c->root >= comm->nranks))
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: root %d out of range [0, %d)", fn, c->root, comm->nranks);
  if (c->kind != FC_CALL_COLL && (c->root < 0 || c->root >= comm->nranks))
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: peer %d out of range [0, %d)", fn, c->root, comm->nranks);
  size_t esize = fc_dtype_size(c->dtype);
  size_t send = c->kind == FC_CALL_COLL ? fc_coll_send_count(c->coll, c->count, comm->nranks) : c->count;
  size_t recv = c->kind == FC_CALL_COLL ? fc_coll_recv_count(c->coll, c->count, comm->nranks) : c->count;
  size_t most = send > recv ? send : recv;
  if (c->count > SIZE_MAX / (size_t)comm->nranks || most > SIZE_MAX / esize || most * esize > (size_t)INT64_MAX)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: count %zu overflows the byte size of the buffers", fn, c->count);
  if (c->count == 0) return FLEXCOLL_SUCCESS;
  int is_root = comm->rank == c->root;
  int needs_send = c->kind == FC_CALL_SEND || (c->kind == FC_CALL_COLL && (c->coll != FC_COLL_BROADCAST || is_root));
  int needs_recv = c->kind == FC_CALL_RECV || (c->kind == FC_CALL_COLL && (c->coll != FC_COLL_REDUCE || is_root));
  if (needs_send && !c->sendbuf) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: sendbuf is NULL", fn);
  if (needs_recv && !c->recvbuf) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: recvbuf is NULL", fn);
  if (c->kind == FC_CALL_COLL && needs_send && needs_recv) return check_overlap(c, send * esize, recv * esize, esize, fn);
  return FLEXCOLL_SUCCESS;
}

/* Where the buffers of a call live; FLEXCOLL_INVALID_USAGE when they disagree with each other or
 * with the communicator. */
static flexcoll_result_t locate(flexcoll_comm_t comm, const void *const *bufs, int n, const char *fn, fc_mem_t *mem) {
  int first = -1, dev0 = -1;
  for (int i = 0; i < n; i++) {
    /* An in-place call's second pointer is the first: asked once (a CUDA query per buffer is
     * much of a small host call's cost). */
    if (!bufs[i] || (first >= 0 && bufs[i] == bufs[first])) continue;
    int dev;
    fc_mem_t m = fc_mem_type(bufs[i], &dev);
    if (first < 0) { first = i; *mem = m; dev0 = dev; continue; }
    if (m != *mem || dev != dev0)
      return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: buffers in different memories (%s of %s, %s of %s)", fn,
                      *mem == FC_MEM_DEVICE ? "device" : "host", first == 0 ? "sendbuf" : "the first buffer",
                      m == FC_MEM_DEVICE ? "device" : "host", i == 1 && n == 2 ? "recvbuf" : "another buffer");
  }
  if (first < 0) *mem = FC_MEM_HOST;
  if (*mem == FC_MEM_DEVICE && comm->cuda_device < 0)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: device buffers on a host-only communicator (config.cuda_device -1)", fn);
  if (*mem == FC_MEM_DEVICE && dev0 != comm->cuda_device)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: buffer of CUDA device %d but the communicator drives device %d", fn,
                    dev0, comm->cuda_device);
  return FLEXCOLL_SUCCESS;
}

/* A communicator whose collective failed half-way is out of step with its peers: refuse. */
static flexcoll_result_t check_not_failed(flexcoll_comm_t comm, const char *fn) {
  fc_gpu_note_kernel_error(comm);
  int err = atomic_load(&comm->async_error);
  if (err == FLEXCOLL_SUCCESS) return FLEXCOLL_SUCCESS;
  return fc_error(comm, (flexcoll_result_t)err,
                  "%s: the communicator failed earlier (%s); abort and destroy it", fn,
                  flexcoll_get_error_string((flexcoll_result_t)err));
}

/* The graph rule (docs/ARCHITECTURE.md): a captured call must replay correctly.  The kernels
 * keep their sequence state on the device and may be captured (fc_gpu_graph_refusal says when;
 * captured, a call in a window takes them instead of direct mode, whose stream-memory operations
 * hold host counters); host copies block on the host, and a host-memory call runs at once and
 * would not be in the graph at all.
 * Those are refused before anything is enqueued (the capture stays valid and the communicator
 * usable). */
static flexcoll_result_t refuse_capture(flexcoll_comm_t comm, const char *fn, const char *why) {
  return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                  "%s: stream is being captured into a CUDA graph, and this call could not be replayed from one (%s); "
                  "it is refused instead of replaying wrong results",
                  fn, why);
}

static flexcoll_result_t check_capture(flexcoll_comm_t comm, const fc_call_t *c, fc_mem_t mem, const fc_algo_args_t *args,
                                       int capturing) {
  const char *fn = fc_coll_name(c->coll);
  if (capturing == 2) return refuse_capture(comm, fn, "another stream's capture forbids using this one meanwhile");
  if (mem != FC_MEM_DEVICE) return refuse_capture(comm, fn, "its buffers are in host memory, and such a call runs at once");
  const char *why = fc_gpu_graph_refusal(comm, args, c->stream);
  return why ? refuse_capture(comm, fn, why) : FLEXCOLL_SUCCESS;
}

flexcoll_result_t fc_call_run(const fc_call_t *c) {
  flexcoll_comm_t comm = c->comm;
  /* Both callers hold comm (submit entered it, a group's end enters its communicators). */
  FC_CHECK(fc_comm_check_held(comm, fc_coll_name(c->coll)));
  FC_CHECK(check_not_failed(comm, fc_coll_name(c->coll)));
  fc_log_set_rank(comm->rank);
  /* Nothing moves, on any path and on every rank alike (the count is the same everywhere):
   * nothing to capture either. */
  if (c->count == 0) return FLEXCOLL_SUCCESS;
  const int capturing = fc_gpu_stream_capturing(c->stream);
  size_t esize = fc_dtype_size(c->dtype);
  size_t bytes = fc_coll_recv_count(c->coll, c->count, comm->nranks) * esize;
  size_t send_bytes = fc_coll_send_count(c->coll, c->count, comm->nranks) * esize;
  if (send_bytes > bytes) bytes = send_bytes;
  fc_mem_t mem;
  /* Only the buffers this rank uses decide (a broadcast's non-roots ignore sendbuf, a reduce's
   * recvbuf), or one rank could fail alone. */
  int is_root = comm->rank == c->root;
  const void *bufs[2] = {c->coll == FC_COLL_BROADCAST && !is_root ? NULL : c->sendbuf,
                         c->coll == FC_COLL_REDUCE && !is_root ? NULL : c->recvbuf};
  FC_CHECK(locate(comm, bufs, 2, fc_coll_name(c->coll), &mem));
  fc_algo_args_t args = {.coll = c->coll, .rank = comm->rank, .nranks = comm->nranks, .root = c->root, .count = c->count};
  args.algo = fc_tuner_pick(c->coll, bytes, comm->nranks, mem);
  args.chunk_count = fc_tuner_chunk_count(c->count, esize);
  FC_TRACE(FC_SUB_COLL, "%s count %zu %s %s root %d algo %s %s memory seq %u", fc_coll_name(c->coll), c->count,
           fc_dtype_name(c->dtype), fc_op_name(c->op), c->root, fc_algo_name(args.algo),
           mem == FC_MEM_DEVICE ? "device" : "host", comm->coll_seq);
  if (capturing) FC_CHECK(check_capture(comm, c, mem, &args, capturing));
  if (mem == FC_MEM_DEVICE) return fc_gpu_run(comm, &args, c->sendbuf, c->recvbuf, c->dtype, c->op, c->stream, capturing);
  return fc_host_run(comm, &args, c->sendbuf, c->recvbuf, c->dtype, c->op);
}

flexcoll_result_t fc_p2p_run(const fc_call_t *calls, int n) {
  flexcoll_comm_t comm = calls[0].comm;
  FC_CHECK(fc_comm_check(comm, "flexcoll_send/recv"));
  FC_CHECK(check_not_failed(comm, "flexcoll_send/recv"));
  /* A batch runs as one kernel on the first call's stream: captured, it must all be on that one. */
  int capturing = 0, streams = 1;
  for (int i = 0; i < n; i++) {
    int c = fc_gpu_stream_capturing(calls[i].stream);
    if (c == 2) return refuse_capture(comm, "flexcoll_send/recv", "another stream's capture forbids using this one meanwhile");
    if (c) capturing = 1;
    if (calls[i].stream != calls[0].stream) streams = 2;
  }
  if (capturing && streams > 1)
    return refuse_capture(comm, "flexcoll_send/recv", "the batch's calls are on several streams; capture them on one");
  fc_log_set_rank(comm->rank);
  fc_p2p_op_t ops[FC_P2P_MAX_OPS];
  void *bufs[FC_P2P_MAX_OPS];
  for (int i = 0; i < n; i++) {
    const fc_call_t *c = &calls[i];
    ops[i] = (fc_p2p_op_t){.is_send = c->kind == FC_CALL_SEND, .peer = c->root, .count = c->count * fc_dtype_size(c->dtype)};
    bufs[i] = c->kind == FC_CALL_SEND ? (void *)c->sendbuf : c->recvbuf;
  }
  fc_mem_t mem;
  FC_CHECK(locate(comm, (const void *const *)bufs, n, "flexcoll_send/recv", &mem));
  if (capturing) {
    if (mem != FC_MEM_DEVICE)
      return refuse_capture(comm, "flexcoll_send/recv", "its buffers are in host memory, and such a call runs at once");
    const char *why = fc_gpu_p2p_graph_refusal(comm, calls[0].stream);
    if (why) return refuse_capture(comm, "flexcoll_send/recv", why);
  }
  if (mem == FC_MEM_DEVICE) return fc_gpu_run_p2p(comm, ops, n, bufs, calls[0].stream, capturing);
  return fc_host_run_p2p(comm, ops, n, bufs);
}

static flexcoll_result_t submit(const fc_call_t *c, const char *fn) {
  if (fc_group_active()) {
    /* Only queued: the group's end holds the communicator while the call runs.  A group runs
     * its calls at its end, maybe in other threads, in an order that the capture's same-stream
     * condition (fc_gpu_graph_refusal) cannot be checked against now: a collective is refused
     * at the call, so that the group never holds half a collective.  Sends and receives are
     * checked at the group's end (fc_p2p_run), where their batch forms: every rank decides
     * alike there, from communicator constants and its own stream. */
    FC_CHECK(check_call(c, fn, 0));
    if (fc_gpu_stream_capturing(c->stream) && c->kind == FC_CALL_COLL)
      return refuse_capture(c->comm, fn, "collectives inside a group cannot be captured");
    return fc_group_enqueue_call(c);
  }
  /* Entered first: the checks read the communicator, which another thread could be using. */
  FC_CHECK(fc_comm_enter(c->comm, fn));
  flexcoll_result_t res = check_call(c, fn, 1);
  if (res == FLEXCOLL_SUCCESS) res = c->kind == FC_CALL_COLL ? fc_call_run(c) : fc_p2p_run(c, 1);
  fc_comm_leave(c->comm);
  return res;
}

flexcoll_result_t flexcoll_allreduce(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype,
                                     flexcoll_op_t op, flexcoll_comm_t comm, flexcoll_stream_t stream) {
  fc_call_t c = {FC_COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, 0, comm, stream, FC_CALL_COLL, NULL, NULL};
  return submit(&c, "flexcoll_allreduce");
}

flexcoll_result_t flexcoll_allgather(const void *sendbuf, void *recvbuf, size_t sendcount, flexcoll_datatype_t dtype,
                                     flexcoll_comm_t comm, flexcoll_stream_t stream) {
  fc_call_t c = {FC_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, FLEXCOLL_SUM, 0, comm, stream, FC_CALL_COLL, NULL, NULL};
  return submit(&c, "flexcoll_allgather");
}

flexcoll_result_t flexcoll_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, flexcoll_datatype_t dtype,
                                          flexcoll_op_t op, flexcoll_comm_t comm, flexcoll_stream_t stream) {
  fc_call_t c = {FC_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0, comm, stream, FC_CALL_COLL, NULL, NULL};
  return submit(&c, "flexcoll_reduce_scatter");
}

flexcoll_result_t flexcoll_broadcast(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype, int root,
                                     flexcoll_comm_t comm, flexcoll_stream_t stream) {
  fc_call_t c = {FC_COLL_BROADCAST, sendbuf, recvbuf, count, dtype, FLEXCOLL_SUM, root, comm, stream, FC_CALL_COLL, NULL, NULL};
  return submit(&c, "flexcoll_broadcast");
}

flexcoll_result_t flexcoll_reduce(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype,
                                  flexcoll_op_t op, int root, flexcoll_comm_t comm, flexcoll_stream_t stream) {
  fc_call_t c = {FC_COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, comm, stream, FC_CALL_COLL, NULL, NULL};
  return submit(&c, "flexcoll_reduce");
}

flexcoll_result_t flexcoll_alltoall(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype,
                                    flexcoll_comm_t comm, flexcoll_stream_t stream) {
  fc_call_t c = {FC_COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, FLEXCOLL_SUM, 0, comm, stream, FC_CALL_COLL, NULL, NULL};
  return submit(&c, "flexcoll_alltoall");
}

flexcoll_result_t flexcoll_send(const void *sendbuf, size_t count, flexcoll_datatype_t dtype, int peer, flexcoll_comm_t comm,
                                flexcoll_stream_t stream) {
  fc_call_t c = {FC_COLL_ALLREDUCE, sendbuf, NULL, count, dtype, FLEXCOLL_SUM, peer, comm, stream, FC_CALL_SEND, NULL, NULL};
  return submit(&c, "flexcoll_send");
}

flexcoll_result_t flexcoll_recv(void *recvbuf, size_t count, flexcoll_datatype_t dtype, int peer, flexcoll_comm_t comm,
                                flexcoll_stream_t stream) {
  fc_call_t c = {FC_COLL_ALLREDUCE, NULL, recvbuf, count, dtype, FLEXCOLL_SUM, peer, comm, stream, FC_CALL_RECV, NULL, NULL};
  return submit(&c, "flexcoll_recv");
}

/* ---- gather and scatter: point-to-point batches -------------------------------------------- */

/* The root exchanges count elements with every rank, itself included, in groups of sends and
 * receives (NCCL 2.28 defines ncclGather and ncclScatter alike, so they match flexcoll_send/recv
 * in order as NCCL's do).  Every call is checked before any is queued, so an invalid argument
 * leaves nothing half-issued; in place, the root's own block stays where it is.  A group's batch
 * holds FC_P2P_MAX_OPS, so outside a group the root's n + 1 calls go in groups of at most that
 * many, its exchange with itself first (a send and its receive in one batch): each group needs
 * only its own peers, who each make one call.  Inside the caller's group they must all fit. */
static int rooted_batch_ops = FC_P2P_MAX_OPS;
void fc_rooted_set_batch_ops(int ops) { rooted_batch_ops = ops >= 2 && ops <= FC_P2P_MAX_OPS ? ops : FC_P2P_MAX_OPS; }

static flexcoll_result_t rooted_exchange(int gather, const void *sendbuf, void *recvbuf, size_t count,
                                         flexcoll_datatype_t dtype, int root, flexcoll_comm_t comm,
                                         flexcoll_stream_t stream, const char *fn) {
  FC_CHECK(check_call_comm(comm, fn, 0));
  if ((unsigned)dtype >= FLEXCOLL_NUM_DATATYPES)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: datatype %d is not a flexcoll_datatype_t", fn, (int)dtype);
  const int n = comm->nranks, me = comm->rank;
  if (root < 0 || root >= n) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: root %d out of range [0, %d)", fn, root, n);
  const size_t es = fc_dtype_size(dtype);
  if (count > SIZE_MAX / (size_t)n / es || count * (size_t)n * es > (size_t)INT64_MAX)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: count %zu overflows the byte size of the buffers", fn, count);
  if (count == 0) return FLEXCOLL_SUCCESS; /* nothing moves, on every rank alike */
  const size_t bytes = count * es;
  /* The root's many-block buffer and its own block of it. */
  const char *many = gather ? (const char *)recvbuf : (const char *)sendbuf;
  const char *own = gather ? (const char *)sendbuf : (const char *)recvbuf;
  if (me == root) {
    if (!sendbuf) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: sendbuf is NULL on the root", fn);
    if (!recvbuf) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: recvbuf is NULL on the root", fn);
    if (own != many + (size_t)root * bytes && own < many + (size_t)n * bytes && many < own + bytes)
      return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                      "%s: sendbuf and recvbuf overlap without being in place (the root's block at %s + root * count)",
                      fn, gather ? "recvbuf" : "sendbuf");
  } else if (!(gather ? sendbuf : recvbuf)) {
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: %s is NULL", fn, gather ? "sendbuf" : "recvbuf");
  }
  const int in_place = me == root && own == many + (size_t)root * bytes;
  fc_call_t *calls = calloc((size_t)n + 1, sizeof *calls);
  if (!calls) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "%s: out of memory", fn);
  int k = 0;
  const fc_call_kind_t to_root = gather ? FC_CALL_SEND : FC_CALL_RECV, from_root = gather ? FC_CALL_RECV : FC_CALL_SEND;
  const fc_call_t base = {FC_COLL_ALLREDUCE, NULL, NULL, count, dtype, FLEXCOLL_SUM, root, comm, stream, to_root, NULL, NULL};
  if (me != root || !in_place) {
    /* Our block to (gather) or from (scatter) the root, the root's own included. */
    calls[k] = base;
    if (gather) calls[k].sendbuf = sendbuf;
    else calls[k].recvbuf = recvbuf;
    k++;
  }
  for (int j = 0; j < n && me == root; j++) {
    const int q = (root + j) % n; /* the root itself first */
    if (q == root && in_place) continue;
    calls[k] = base;
    calls[k].kind = from_root;
    calls[k].root = q;
    if (gather) calls[k].recvbuf = (char *)recvbuf + (size_t)q * bytes;
    else calls[k].sendbuf = (const char *)sendbuf + (size_t)q * bytes;
    k++;
  }
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  for (int i = 0; i < k && res == FLEXCOLL_SUCCESS; i++) res = check_call(&calls[i], fn, 0);
  const int in_group = fc_group_active(), room = in_group ? fc_group_p2p_room(comm) : 0;
  if (res == FLEXCOLL_SUCCESS && in_group && k > room)
    res = fc_error(comm, FLEXCOLL_INVALID_USAGE,
                   "%s: this rank's %d sends and receives do not fit the group (room for %d more of this "
                   "communicator in a row); call it outside a group, or end the group first",
                   fn, k, room);
  const int per = in_group ? k : rooted_batch_ops;
  for (int at = 0; res == FLEXCOLL_SUCCESS && at < k; at += per) {
    FC_CHECK_GOTO(flexcoll_group_start(), res, out);
    for (int i = at; i < at + per && i < k && res == FLEXCOLL_SUCCESS; i++) res = submit(&calls[i], fn);
    flexcoll_result_t end = flexcoll_group_end();
    if (res == FLEXCOLL_SUCCESS) res = end;
  }
out:
  free(calls);
  return res;
}

flexcoll_result_t flexcoll_gather(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype, int root,
                                  flexcoll_comm_t comm, flexcoll_stream_t stream) {
  return rooted_exchange(1, sendbuf, recvbuf, count, dtype, root, comm, stream, "flexcoll_gather");
}

flexcoll_result_t flexcoll_scatter(const void *sendbuf, void *recvbuf, size_t count, flexcoll_datatype_t dtype, int root,
                                   flexcoll_comm_t comm, flexcoll_stream_t stream) {
  return rooted_exchange(0, sendbuf, recvbuf, count, dtype, root, comm, stream, "flexcoll_scatter");
}

/* ---- symmetric windows --------------------------------------------------------------------- */


flexcoll_result_t fc_window_call_run(const fc_call_t *c) {
  flexcoll_comm_t comm = c->comm;
  int reg = c->kind == FC_CALL_WINDOW_REGISTER;
  const char *fn = reg ? "flexcoll_window_register" : "flexcoll_window_deregister";
  FC_CHECK(fc_comm_check(comm, fn));
  FC_CHECK(check_not_failed(comm, fn));
  if (reg) {
    int dev = -1;
    /* Host memory (or any memory of a host-only communicator) makes a host window: the host
     * side says what it accepts (flexcoll_host_alloc's memory only). */
    if (comm->cuda_device < 0 || fc_mem_type(c->recvbuf, &dev) != FC_MEM_DEVICE)
      return fc_host_window_register(comm, c->recvbuf, c->count, c->window_out);
    return fc_gpu_window_register(comm, c->recvbuf, c->count, c->window_out);
  }
  if (fc_host_window_valid(comm, c->window)) return fc_host_window_deregister(comm, c->window);
  if (!fc_gpu_window_valid(comm, c->window))
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: window is not a registered window of this communicator", fn);
  return fc_gpu_window_deregister(comm, c->window);
}

/* Outside a group: the window calls are collective, run on the communicator like a collective. */
static flexcoll_result_t run_window_call(const fc_call_t *c, const char *fn) {
  FC_CHECK(fc_comm_enter(c->comm, fn));
  flexcoll_result_t res = fc_window_call_run(c);
  fc_comm_leave(c->comm);
  return res;
}

flexcoll_result_t flexcoll_window_register(flexcoll_comm_t comm, void *buf, size_t bytes, flexcoll_window_t *window) {
  const char *fn = "flexcoll_window_register";
  FC_CHECK(check_call_comm(comm, fn, 0));
  if (!window) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: window is NULL", fn);
  *window = NULL;
  if (!buf) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: buf is NULL", fn);
  if (bytes == 0) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: bytes is 0", fn);
  fc_call_t c = {.recvbuf = buf, .count = bytes, .comm = comm, .kind = FC_CALL_WINDOW_REGISTER, .window_out = window};
  if (fc_group_active()) return fc_group_enqueue_call(&c);
  return run_window_call(&c, fn);
}

flexcoll_result_t flexcoll_window_deregister(flexcoll_comm_t comm, flexcoll_window_t window) {
  const char *fn = "flexcoll_window_deregister";
  FC_CHECK(check_call_comm(comm, fn, 0));
  if (!window) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: window is NULL", fn);
  fc_call_t c = {.comm = comm, .kind = FC_CALL_WINDOW_DEREGISTER, .window = window};
  if (fc_group_active()) return fc_group_enqueue_call(&c);
  return run_window_call(&c, fn);
}

/* ---- link statistics ----------------------------------------------------------------------- */

flexcoll_result_t flexcoll_comm_get_link_stats(flexcoll_comm_t comm, flexcoll_link_stats_t *stats, int max_links,
                                               int *nlinks) {
  const char *fn = "flexcoll_comm_get_link_stats";
  FC_CHECK(fc_comm_check(comm, fn));
  if (!nlinks) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: nlinks is NULL", fn);
  if (max_links < 0) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: max_links %d is negative", fn, max_links);
  if (max_links > 0 && !stats) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: stats is NULL but max_links is %d", fn, max_links);
  const fc_links_t *l = comm->links;
  int n = 0;
  for (int i = 0; l && i < l->n; i++)
    for (int q = 0; q < comm->nranks; q++) {
      /* The pairs the link joins only (shm: the ranks of this host). */
      if (q == comm->rank || !l->link[i].reach[q]) continue;
      if (n < max_links) {
        flexcoll_link_stats_t *s = &stats[n];
        memset(s, 0, sizeof *s);
        snprintf(s->name, sizeof s->name, "%s", l->link[i].ops->name);
        s->peer = q;
        s->bytes = l->link[i].stats[q].bytes;
        s->busy_us = l->link[i].stats[q].busy_us;
        s->share = l->link[i].stats[q].share;
      }
      n++;
    }
  /* The device links (the ring kernels' lanes), after the host ones. */
  n += fc_gpu_link_stats(comm, n < max_links ? stats + n : NULL, n < max_links ? max_links - n : 0);
  *nlinks = n;
  return FLEXCOLL_SUCCESS;
}
