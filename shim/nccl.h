/*
 * nccl.h — the NCCL 2.28 public API as flexcoll's NCCL shim (libnccl.so.2) implements it.
 *
 * Written for flexcoll from NCCL's documented interface; it is not NVIDIA's header.  Programs
 * written for NCCL compile against it unchanged as long as they use the calls declared here;
 * see flexcoll-nccl(7) for what each call does on flexcoll and which ones return
 * ncclInvalidUsage.  FLEXCOLL_NCCL_SHIM tells a program at compile time that it is this header.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22800
/* Versions up to 2.8 were coded X*1000 + Y*100 + Z, later ones X*10000 + Y*100 + Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#define FLEXCOLL_NCCL_SHIM 1

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque communicator handle. */
typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

/* Opaque handle of a registered memory window (not supported by flexcoll). */
typedef struct ncclWindow_vidmem *ncclWindow_t;

/* Device-API communicator and its requirements: only named here, for the prototypes of
 * ncclDevCommCreate / ncclDevCommDestroy (both return ncclInvalidUsage on flexcoll). */
typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Result codes: the same values as flexcoll_result_t. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8, /* flexcoll: a peer did not answer within FLEXCOLL_TIMEOUT_MS */
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* The magic number of ncclConfig_t (and other versioned structs). */
#define NCCL_API_MAGIC 0xcafebeef

/* ncclCommWindowRegister flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy values. */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* Communicator options.  Always start from NCCL_CONFIG_INITIALIZER.  flexcoll reads `blocking`
 * only; the other fields are accepted and ignored. */
typedef struct ncclConfig_v22800 {
  size_t size;          /* do not touch: sizeof(ncclConfig_t) */
  unsigned int magic;   /* do not touch: NCCL_API_MAGIC */
  unsigned int version; /* do not touch: NCCL_VERSION_CODE */
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                  \
  {                                                                                              \
    sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,                                     \
        NCCL_CONFIG_UNDEF_INT /* blocking */, NCCL_CONFIG_UNDEF_INT /* cgaClusterSize */,        \
        NCCL_CONFIG_UNDEF_INT /* minCTAs */, NCCL_CONFIG_UNDEF_INT /* maxCTAs */,                \
        NCCL_CONFIG_UNDEF_PTR /* netName */, NCCL_CONFIG_UNDEF_INT /* splitShare */,             \
        NCCL_CONFIG_UNDEF_INT /* trafficClass */, NCCL_CONFIG_UNDEF_PTR /* commName */,          \
        NCCL_CONFIG_UNDEF_INT /* collnetEnable */, NCCL_CONFIG_UNDEF_INT /* CTAPolicy */,        \
        NCCL_CONFIG_UNDEF_INT /* shrinkShare */, NCCL_CONFIG_UNDEF_INT /* nvlsCTAs */,           \
        NCCL_CONFIG_UNDEF_INT /* nChannelsPerNetPeer */,                                         \
        NCCL_CONFIG_UNDEF_INT /* nvlinkCentricSched */                                           \
  }

/* What ncclGroupSimulateEnd would report (flexcoll cannot simulate: ncclInvalidUsage). */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT }

/* Reduction operators.  Values from ncclNumOps up are reserved for operators made by
 * ncclRedOpCreatePreMulSum, which flexcoll does not support. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff /* the largest value an ncclRedOp_t may hold (int-sized enum) */
} ncclRedOp_t;

/* Datatypes.  NCCL's order, which is not flexcoll's: the shim maps them one by one.  The float8
 * types move (all-gather, broadcast, all-to-all, send/receive) but do not reduce on flexcoll. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* ---- memory ------------------------------------------------------------------------------ */
/* cudaMalloc / cudaFree on the current device. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t pncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemFree(void *ptr);
ncclResult_t pncclMemFree(void *ptr);

/* ---- version, ids, errors ---------------------------------------------------------------- */
/* NCCL_VERSION_CODE of the library: 22800. */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t pncclGetVersion(int *version);
/* A new id for ncclCommInitRank; the calling process serves the rendezvous. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId);
/* A constant name for a result code. */
const char *ncclGetErrorString(ncclResult_t result);
const char *pncclGetErrorString(ncclResult_t result);
/* The message of the last error (of comm, else of this thread). */
const char *ncclGetLastError(ncclComm_t comm);
const char *pncclGetLastError(ncclComm_t comm);

/* ---- communicators ----------------------------------------------------------------------- */
/* Rank `rank` of an nranks communicator on the current CUDA device (host memory only when the
 * process has no GPU).  Inside ncclGroupStart/End the handle is returned at once and the
 * communicator is initialised at ncclGroupEnd. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
/* ndev communicators of this process, on devlist (NULL: devices 0..ndev-1, or host ranks when
 * there is no GPU). */
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
/* As ncclCommInitRankConfig with commIds[0] (flexcoll needs one id). */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId *commIds, ncclConfig_t *config);
/* Nothing to flush on flexcoll (ncclCommDestroy does the work): ncclSuccess. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);
/* Stops outstanding work without waiting for peers and frees comm. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);
/* Collective over comm: ranks of one color form a new communicator, ordered by key (ties: rank
 * in comm); NCCL_SPLIT_NOCOLOR gives *newcomm = NULL.  config NULL inherits comm's settings.
 * Not inside a group (ncclInvalidUsage): call it from each rank's own thread. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
/* Not supported by flexcoll: ncclInvalidUsage, *newcomm = NULL. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                            ncclConfig_t *config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                             ncclConfig_t *config, int shrinkFlags);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int *count);
/* The CUDA device of comm, -1 for a host-only communicator. */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank);

/* ---- registration (a hint: flexcoll works on any buffer) --------------------------------- */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle);
/* Not supported by flexcoll: ncclInvalidUsage. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm);
ncclResult_t pncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm);
ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm);

/* ---- reduction operators (custom ones are not supported: ncclInvalidUsage) --------------- */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---- collectives: enqueued on stream (device memory) or done on return (host memory) ----- */
/* recvbuff on root = op over all ranks of sendbuff (recvbuff may be NULL elsewhere). */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
/* In-place broadcast of buff from root. */
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                            int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
/* recvbuff[i] = op over ranks of sendbuff[rank*recvcount + i]. */
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);
/* recvbuff[r*sendcount + i] = rank r's sendbuff[i]. */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream);
/* recvbuff[r*count + i] = rank r's sendbuff[rank*count + i]; in place when sendbuff == recvbuff
 * (one extra copy of the buffer through a temporary). */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);

/* The root's recvbuff[r*count + i] = rank r's sendbuff[i] (NCCL 2.28). */
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream);
/* recvbuff[i] = the root's sendbuff[rank*count + i] (NCCL 2.28). */
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                          ncclComm_t comm, cudaStream_t stream);

/* ---- point to point: matched in order; inside a group they progress together ------------- */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);

/* ---- groups ------------------------------------------------------------------------------ */
/* Calls between ncclGroupStart and the outermost ncclGroupEnd are deferred to that end; none
 * blocks on its own. */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);
/* flexcoll cannot simulate: ends the group as ncclGroupEnd does and returns ncclInvalidUsage. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

#ifdef __cplusplus
}
#endif
#endif /* NCCL_H_ */
