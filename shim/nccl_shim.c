/*
 * nccl_shim.c — libnccl.so.2: NCCL 2.28's API over flexcoll, for programs built against NCCL
 * (PyTorch through LD_PRELOAD, or any program linked with -lnccl).
 *
 * An ncclComm_t is the flexcoll_comm_t itself, cast: flexcoll_comm_init_rank hands out the
 * handle at once inside a group and initialises it at group end, so a handle needs nothing of
 * the shim's to survive group-deferred initialisation, and flexcoll's registry of live
 * communicators catches handles that were destroyed.
 *
 * Result codes have the same values on both sides (checked below), so a flexcoll result is
 * returned as it is.  Datatypes do not line up (NCCL puts bfloat16 after float64) and are
 * mapped one by one.  What flexcoll cannot do returns ncclInvalidUsage with a message in a
 * thread-local buffer that ncclGetLastError returns until a later flexcoll error replaces it.
 *
 * Every entry point is also exported as pnccl* (the profiling names NCCL exports), as an alias.
 * shim/nccl.map keeps everything else local (libflexcoll, the CUDA runtime).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "flexcoll.h"
#include "nccl.h"

_Static_assert(sizeof(ncclUniqueId) == sizeof(flexcoll_unique_id_t), "unique ids differ in size");
_Static_assert(ncclSuccess == (int)FLEXCOLL_SUCCESS && ncclUnhandledCudaError == (int)FLEXCOLL_UNHANDLED_CUDA_ERROR &&
                   ncclSystemError == (int)FLEXCOLL_SYSTEM_ERROR && ncclInternalError == (int)FLEXCOLL_INTERNAL_ERROR &&
                   ncclInvalidArgument == (int)FLEXCOLL_INVALID_ARGUMENT &&
                   ncclInvalidUsage == (int)FLEXCOLL_INVALID_USAGE && ncclRemoteError == (int)FLEXCOLL_REMOTE_ERROR &&
                   ncclInProgress == (int)FLEXCOLL_IN_PROGRESS && ncclTimeout == (int)FLEXCOLL_TIMEOUT &&
                   ncclNumResults == (int)FLEXCOLL_NUM_RESULTS,
               "ncclResult_t and flexcoll_result_t must have the same values");
_Static_assert(NCCL_CONFIG_UNDEF_INT == FLEXCOLL_CONFIG_UNDEF, "undefined config values differ");

/* ---- errors ---------------------------------------------------------------------------------- */

#define SHIM_ERROR_LEN 512
static _Thread_local char shim_error[SHIM_ERROR_LEN];
/* 1 while the shim's own message is this thread's latest error (a flexcoll error clears it). */
static _Thread_local int shim_error_fresh;

__attribute__((format(printf, 2, 3))) static ncclResult_t shim_fail(ncclResult_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(shim_error, sizeof shim_error, fmt, ap);
  va_end(ap);
  shim_error_fresh = 1;
  return code;
}

static ncclResult_t unsupported(const char *fn, const char *why) {
  return shim_fail(ncclInvalidUsage, "%s: not supported by flexcoll's NCCL shim (%s)", fn, why);
}

/* Groups opened through the shim by this thread, and the calls queued in the outermost one. */
static _Thread_local int group_depth;
static _Thread_local unsigned long group_calls;

/* A flexcoll result as an NCCL one; a failure makes flexcoll's message the latest. */
static ncclResult_t fwd(flexcoll_result_t res) {
  if (res != FLEXCOLL_SUCCESS) shim_error_fresh = 0;
  return (ncclResult_t)res;
}

/* fwd() for a collective or point-to-point call: counts what a group queued. */
static ncclResult_t fwd_call(flexcoll_result_t res) {
  if (res == FLEXCOLL_SUCCESS && group_depth > 0) group_calls++;
  return fwd(res);
}

#define SHIM_CHECK(call)                            \
  do {                                              \
    ncclResult_t shim_res_ = (call);                \
    if (shim_res_ != ncclSuccess) return shim_res_; \
  } while (0)

static inline flexcoll_comm_t fc_comm(ncclComm_t comm) { return (flexcoll_comm_t)(void *)comm; }
static inline ncclComm_t nccl_comm(flexcoll_comm_t comm) { return (ncclComm_t)(void *)comm; }

/* ---- datatypes and operators ------------------------------------------------------------------- */

/* flexcoll's datatype for t.  The float8 types have no arithmetic on flexcoll: a collective that
 * only moves data (moves_only 1) takes them as bytes, a reduction refuses them. */
static ncclResult_t map_dtype(ncclDataType_t t, int moves_only, const char *fn, flexcoll_datatype_t *out) {
  switch ((int)t) {
    case ncclInt8: *out = FLEXCOLL_INT8; return ncclSuccess;
    case ncclUint8: *out = FLEXCOLL_UINT8; return ncclSuccess;
    case ncclInt32: *out = FLEXCOLL_INT32; return ncclSuccess;
    case ncclUint32: *out = FLEXCOLL_UINT32; return ncclSuccess;
    case ncclInt64: *out = FLEXCOLL_INT64; return ncclSuccess;
    case ncclUint64: *out = FLEXCOLL_UINT64; return ncclSuccess;
    case ncclFloat16: *out = FLEXCOLL_FLOAT16; return ncclSuccess;
    case ncclFloat32: *out = FLEXCOLL_FLOAT32; return ncclSuccess;
    case ncclFloat64: *out = FLEXCOLL_FLOAT64; return ncclSuccess;
    case ncclBfloat16: *out = FLEXCOLL_BFLOAT16; return ncclSuccess;
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      if (moves_only) { *out = FLEXCOLL_UINT8; return ncclSuccess; }
      return shim_fail(ncclInvalidArgument, "%s: %s reductions are not supported by flexcoll (float8 data can only be "
                       "moved: all-gather, broadcast, all-to-all, send/receive)", fn,
                       t == ncclFloat8e4m3 ? "ncclFloat8e4m3" : "ncclFloat8e5m2");
    default: return shim_fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t", fn, (int)t);
  }
}

static ncclResult_t map_op(ncclRedOp_t op, const char *fn, flexcoll_op_t *out) {
  switch ((int)op) {
    case ncclSum: *out = FLEXCOLL_SUM; return ncclSuccess;
    case ncclProd: *out = FLEXCOLL_PROD; return ncclSuccess;
    case ncclMax: *out = FLEXCOLL_MAX; return ncclSuccess;
    case ncclMin: *out = FLEXCOLL_MIN; return ncclSuccess;
    case ncclAvg: *out = FLEXCOLL_AVG; return ncclSuccess;
    default:
      if ((int)op >= ncclNumOps)
        return shim_fail(ncclInvalidArgument, "%s: op %d is not a built-in ncclRedOp_t (flexcoll has no custom operators: "
                         "ncclRedOpCreatePreMulSum is not supported)", fn, (int)op);
      return shim_fail(ncclInvalidArgument, "%s: op %d is not an ncclRedOp_t", fn, (int)op);
  }
}

/* ---- version, ids, errors ---------------------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return shim_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId) return shim_fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  flexcoll_unique_id_t id;
  flexcoll_result_t res = flexcoll_get_unique_id(&id);
  if (res == FLEXCOLL_SUCCESS) memcpy(uniqueId, &id, sizeof id);
  return fwd(res);
}

const char *ncclGetErrorString(ncclResult_t result) { return flexcoll_get_error_string((flexcoll_result_t)result); }

const char *ncclGetLastError(ncclComm_t comm) {
  if (shim_error_fresh) return shim_error;
  const char *msg = flexcoll_get_last_error(fc_comm(comm));
  /* Errors that belong to no communicator (a NULL argument, a failed group) are the thread's. */
  if (comm && (!msg || !*msg)) msg = flexcoll_get_last_error(NULL);
  return msg ? msg : "";
}

/* ---- communicators ----------------------------------------------------------------------------- */

/* The CUDA device current in this thread, as NCCL takes it; -1 (host memory only) without a GPU. */
static int current_device(void) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError(); /* no driver or no device: not a sticky error */
    return -1;
  }
  return dev;
}

/* The flexcoll options for an NCCL config (NULL: defaults); flexcoll reads `blocking` only. */
static ncclResult_t read_config(const ncclConfig_t *config, const char *fn, flexcoll_config_t *out) {
  const flexcoll_config_t dflt = FLEXCOLL_CONFIG_INITIALIZER;
  *out = dflt;
  out->cuda_device = current_device();
  if (!config) return ncclSuccess;
  if (config->magic != NCCL_API_MAGIC || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    return shim_fail(ncclInvalidArgument, "%s: config not initialised with NCCL_CONFIG_INITIALIZER (size %zu, magic %#x)",
                     fn, config->size, config->magic);
  if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    return shim_fail(ncclInvalidArgument, "%s: config->blocking is %d, not 0 or 1", fn, config->blocking);
  /* Non-blocking: flexcoll_comm_init_rank returns IN_PROGRESS (ncclInProgress) at once and
   * initialises in a thread; ncclCommGetAsyncError says when it is done, as NCCL's. */
  out->blocking = config->blocking;
  return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *commId, int rank,
                              const ncclConfig_t *config, const char *fn) {
  if (!comm) return shim_fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  *comm = NULL;
  flexcoll_config_t fconfig;
  SHIM_CHECK(read_config(config, fn, &fconfig));
  flexcoll_unique_id_t id;
  memcpy(&id, commId, sizeof id);
  flexcoll_comm_t c = NULL;
  flexcoll_result_t res = flexcoll_comm_init_rank(&c, nranks, id, rank, &fconfig);
  *comm = nccl_comm(c);
  return fwd(res);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
  return init_rank(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, &commId, rank, NULL, "ncclCommInitRank");
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config) {
  const char *fn = "ncclCommInitRankScalable";
  if (nId < 1 || !commIds)
    return shim_fail(ncclInvalidArgument, "%s: need at least one unique id (nId %d, commIds %p)", fn, nId,
                     (void *)commIds);
  /* Every rank passes the same ids in the same order: the first one identifies the clique. */
  return init_rank(newcomm, nranks, &commIds[0], myrank, config, fn);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
  if (!comm) return shim_fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  if (ndev < 1) return shim_fail(ncclInvalidArgument, "ncclCommInitAll: ndev %d is not positive", ndev);
  flexcoll_comm_t *comms = calloc((size_t)ndev, sizeof *comms);
  if (!comms) return shim_fail(ncclSystemError, "ncclCommInitAll: out of memory for %d communicators", ndev);
  flexcoll_result_t res = flexcoll_comm_init_all(comms, ndev, devlist);
  for (int i = 0; i < ndev; i++) comm[i] = nccl_comm(comms[i]);
  free(comms);
  return fwd(res);
}

/* Destroy does all the work on flexcoll; there is nothing to flush before it. */
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return shim_fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess; /* as NCCL: destroying NULL does nothing */
  return fwd(flexcoll_comm_destroy(fc_comm(comm)));
}

/* NCCL's abort also frees the communicator; flexcoll's abort only stops it. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  flexcoll_result_t res = flexcoll_comm_abort(fc_comm(comm));
  if (res != FLEXCOLL_SUCCESS) return fwd(res);
  return fwd(flexcoll_comm_destroy(fc_comm(comm)));
}

/* flexcoll_comm_split has ncclCommSplit's semantics.  config NULL inherits the parent's settings
 * (as in NCCL); otherwise its defined fields apply (flexcoll reads `blocking`), and the device
 * stays the parent's, as NCCL's split keeps it. */
_Static_assert(NCCL_SPLIT_NOCOLOR == FLEXCOLL_SPLIT_NOCOLOR, "NCCL_SPLIT_NOCOLOR is passed through as it is");
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  const char *fn = "ncclCommSplit";
  if (newcomm) *newcomm = NULL;
  flexcoll_config_t fconfig;
  if (config) {
    SHIM_CHECK(read_config(config, fn, &fconfig));
    fconfig.cuda_device = FLEXCOLL_CONFIG_UNDEF; /* the parent's */
  }
  flexcoll_comm_t c = NULL;
  flexcoll_result_t res = flexcoll_comm_split(fc_comm(comm), color, key, newcomm ? &c : NULL, config ? &fconfig : NULL);
  if (newcomm) *newcomm = nccl_comm(c);
  return fwd(res);
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                            ncclConfig_t *config, int shrinkFlags) {
  (void)comm, (void)excludeRanksList, (void)excludeRanksCount, (void)config, (void)shrinkFlags;
  if (newcomm) *newcomm = NULL;
  return unsupported("ncclCommShrink", "flexcoll cannot shrink communicators yet; create a new one with "
                     "ncclGetUniqueId and ncclCommInitRank");
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  flexcoll_result_t err = FLEXCOLL_SUCCESS;
  flexcoll_result_t res = flexcoll_comm_get_async_error(fc_comm(comm), asyncError ? &err : NULL);
  if (res == FLEXCOLL_SUCCESS) *asyncError = (ncclResult_t)err;
  return fwd(res);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { return fwd(flexcoll_comm_count(fc_comm(comm), count)); }

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  return fwd(flexcoll_comm_cu_device(fc_comm(comm), device));
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  return fwd(flexcoll_comm_user_rank(fc_comm(comm), rank));
}

/* ---- memory and registration --------------------------------------------------------------------- */

ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  if (!ptr) return shim_fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  cudaError_t e = cudaMalloc(ptr, size);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *ptr = NULL;
    return shim_fail(ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc(%zu bytes) failed: %s", size,
                     cudaGetErrorString(e));
  }
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void *ptr) {
  cudaError_t e = cudaFree(ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return shim_fail(ncclUnhandledCudaError, "ncclMemFree: cudaFree(%p) failed: %s", ptr, cudaGetErrorString(e));
  }
  return ncclSuccess;
}

/* What ncclCommRegister hands out: registration is only a hint, flexcoll works on any buffer. */
static char registered_dummy;

ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  (void)buff, (void)size;
  if (!comm) return shim_fail(ncclInvalidArgument, "ncclCommRegister: comm is NULL");
  if (!handle) return shim_fail(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  *handle = &registered_dummy;
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  (void)handle;
  if (!comm) return shim_fail(ncclInvalidArgument, "ncclCommDeregister: comm is NULL");
  return ncclSuccess;
}

/* Windows.  NCCL_WIN_COLL_SYMMETRIC promises what flexcoll's windows need (every rank's buffers
 * at the same offsets of equal windows): those become flexcoll windows, registered collectively
 * like NCCL's.  A default window promises nothing about offsets: it stays a hint, as
 * ncclCommRegister's buffers. */
static char window_hint;

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags) {
  const char *fn = "ncclCommWindowRegister";
  if (!comm) return shim_fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  if (!win) return shim_fail(ncclInvalidArgument, "%s: win is NULL", fn);
  *win = NULL;
  if (winFlags & ~NCCL_WIN_COLL_SYMMETRIC) return shim_fail(ncclInvalidArgument, "%s: unknown winFlags 0x%x", fn, winFlags);
  if (!(winFlags & NCCL_WIN_COLL_SYMMETRIC)) {
    if (!buff || !size) return shim_fail(ncclInvalidArgument, "%s: buff is NULL or size is 0", fn);
    *win = (ncclWindow_t)(void *)&window_hint;
    return ncclSuccess;
  }
  /* Straight into the caller's handle: inside a group flexcoll sets it at the group's end. */
  _Static_assert(sizeof(ncclWindow_t) == sizeof(flexcoll_window_t), "window handles are pointers");
  return fwd_call(flexcoll_window_register(fc_comm(comm), buff, size, (flexcoll_window_t *)(void *)win));
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  const char *fn = "ncclCommWindowDeregister";
  if (!comm) return shim_fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  if (!win) return shim_fail(ncclInvalidArgument, "%s: win is NULL", fn);
  if ((void *)win == (void *)&window_hint) return ncclSuccess;
  return fwd_call(flexcoll_window_deregister(fc_comm(comm), (flexcoll_window_t)(void *)win));
}

ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm) {
  (void)comm, (void)reqs, (void)outDevComm;
  return unsupported("ncclDevCommCreate", "no device-side communication API");
}

ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm) {
  (void)comm, (void)devComm;
  return unsupported("ncclDevCommDestroy", "no device-side communication API");
}

/* ---- reduction operators ------------------------------------------------------------------------ */

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  (void)op, (void)scalar, (void)datatype, (void)residence, (void)comm;
  return unsupported("ncclRedOpCreatePreMulSum", "no custom reduction operators; scale the data and use ncclSum");
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  (void)comm;
  if ((int)op >= 0 && (int)op < ncclNumOps)
    return shim_fail(ncclInvalidArgument, "ncclRedOpDestroy: op %d is a built-in operator", (int)op);
  return unsupported("ncclRedOpDestroy", "no custom reduction operators, so none to destroy");
}

/* ---- collectives ------------------------------------------------------------------------------- */

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  flexcoll_datatype_t dt;
  flexcoll_op_t fop;
  SHIM_CHECK(map_dtype(datatype, 0, "ncclAllReduce", &dt));
  SHIM_CHECK(map_op(op, "ncclAllReduce", &fop));
  return fwd_call(flexcoll_allreduce(sendbuff, recvbuff, count, dt, fop, fc_comm(comm), stream));
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  flexcoll_datatype_t dt;
  flexcoll_op_t fop;
  SHIM_CHECK(map_dtype(datatype, 0, "ncclReduce", &dt));
  SHIM_CHECK(map_op(op, "ncclReduce", &fop));
  return fwd_call(flexcoll_reduce(sendbuff, recvbuff, count, dt, fop, root, fc_comm(comm), stream));
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  flexcoll_datatype_t dt;
  flexcoll_op_t fop;
  SHIM_CHECK(map_dtype(datatype, 0, "ncclReduceScatter", &dt));
  SHIM_CHECK(map_op(op, "ncclReduceScatter", &fop));
  return fwd_call(flexcoll_reduce_scatter(sendbuff, recvbuff, recvcount, dt, fop, fc_comm(comm), stream));
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  flexcoll_datatype_t dt;
  SHIM_CHECK(map_dtype(datatype, 1, "ncclAllGather", &dt));
  return fwd_call(flexcoll_allgather(sendbuff, recvbuff, sendcount, dt, fc_comm(comm), stream));
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  flexcoll_datatype_t dt;
  SHIM_CHECK(map_dtype(datatype, 1, "ncclBroadcast", &dt));
  return fwd_call(flexcoll_broadcast(sendbuff, recvbuff, count, dt, root, fc_comm(comm), stream));
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  flexcoll_datatype_t dt;
  SHIM_CHECK(map_dtype(datatype, 1, "ncclBcast", &dt));
  return fwd_call(flexcoll_broadcast(buff, buff, count, dt, root, fc_comm(comm), stream));
}

ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                          cudaStream_t stream) {
  flexcoll_datatype_t dt;
  SHIM_CHECK(map_dtype(datatype, 1, "ncclAlltoAll", &dt));
  return fwd_call(flexcoll_alltoall(sendbuff, recvbuff, count, dt, fc_comm(comm), stream));
}

ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  flexcoll_datatype_t dt;
  SHIM_CHECK(map_dtype(datatype, 1, "ncclGather", &dt));
  return fwd_call(flexcoll_gather(sendbuff, recvbuff, count, dt, root, fc_comm(comm), stream));
}

ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  flexcoll_datatype_t dt;
  SHIM_CHECK(map_dtype(datatype, 1, "ncclScatter", &dt));
  return fwd_call(flexcoll_scatter(sendbuff, recvbuff, count, dt, root, fc_comm(comm), stream));
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  flexcoll_datatype_t dt;
  SHIM_CHECK(map_dtype(datatype, 1, "ncclSend", &dt));
  return fwd_call(flexcoll_send(sendbuff, count, dt, peer, fc_comm(comm), stream));
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  flexcoll_datatype_t dt;
  SHIM_CHECK(map_dtype(datatype, 1, "ncclRecv", &dt));
  return fwd_call(flexcoll_recv(recvbuff, count, dt, peer, fc_comm(comm), stream));
}

/* ---- groups ------------------------------------------------------------------------------------ */

ncclResult_t ncclGroupStart(void) {
  flexcoll_result_t res = flexcoll_group_start();
  if (res == FLEXCOLL_SUCCESS) group_depth++;
  return fwd(res);
}

static flexcoll_result_t group_end(void) {
  if (group_depth > 0 && --group_depth == 0) group_calls = 0;
  return flexcoll_group_end();
}

ncclResult_t ncclGroupEnd(void) { return fwd(group_end()); }

/* flexcoll cannot simulate a group, nor drop what it queued.  The group is ended all the same (as
 * ncclGroupEnd would: its calls run) so that this thread does not stay inside it forever. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo) {
  (void)simInfo;
  const char *fn = "ncclGroupSimulateEnd";
  if (group_depth == 0) return unsupported(fn, "no simulation; and no group was started");
  if (group_depth > 1) {
    group_end();
    return unsupported(fn, "no simulation; the nested group was closed as by ncclGroupEnd");
  }
  unsigned long queued = group_calls;
  flexcoll_result_t res = group_end();
  return shim_fail(ncclInvalidUsage, "%s: not supported by flexcoll's NCCL shim (no simulation); the group was ended "
                   "as by ncclGroupEnd: its %lu queued call(s) ran, %s", fn, queued,
                   res == FLEXCOLL_SUCCESS ? "successfully" : flexcoll_get_last_error(NULL));
}

/* ---- pnccl* aliases ---------------------------------------------------------------------------- */

#define PNCCL(name) extern __typeof__(name) p##name __attribute__((alias(#name)));
PNCCL(ncclAllGather)
PNCCL(ncclAllReduce)
PNCCL(ncclAlltoAll)
PNCCL(ncclGather)
PNCCL(ncclScatter)
PNCCL(ncclBcast)
PNCCL(ncclBroadcast)
PNCCL(ncclCommAbort)
PNCCL(ncclCommCount)
PNCCL(ncclCommCuDevice)
PNCCL(ncclCommDeregister)
PNCCL(ncclCommDestroy)
PNCCL(ncclCommFinalize)
PNCCL(ncclCommGetAsyncError)
PNCCL(ncclCommInitAll)
PNCCL(ncclCommInitRank)
PNCCL(ncclCommInitRankConfig)
PNCCL(ncclCommInitRankScalable)
PNCCL(ncclCommRegister)
PNCCL(ncclCommShrink)
PNCCL(ncclCommSplit)
PNCCL(ncclCommUserRank)
PNCCL(ncclCommWindowDeregister)
PNCCL(ncclCommWindowRegister)
PNCCL(ncclDevCommCreate)
PNCCL(ncclDevCommDestroy)
PNCCL(ncclGetErrorString)
PNCCL(ncclGetLastError)
PNCCL(ncclGetUniqueId)
PNCCL(ncclGetVersion)
PNCCL(ncclGroupEnd)
PNCCL(ncclGroupSimulateEnd)
PNCCL(ncclGroupStart)
PNCCL(ncclMemAlloc)
PNCCL(ncclMemFree)
PNCCL(ncclRecv)
PNCCL(ncclRedOpCreatePreMulSum)
PNCCL(ncclRedOpDestroy)
PNCCL(ncclReduce)
PNCCL(ncclReduceScatter)
PNCCL(ncclSend)
