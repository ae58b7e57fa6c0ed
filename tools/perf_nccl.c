/* perf_nccl.c — the optional NCCL baseline: libnccl.so.2 through dlopen, never a build or run
 * dependency of flexcoll.  Only the handful of entry points the sweep needs, with NCCL's ABI
 * (enums as int, opaque pointers). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "perf.h"

typedef int (*nccl_get_id_fn)(void *id);
typedef int (*nccl_allreduce_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*nccl_allgather_fn)(const void *, void *, size_t, int, void *, void *);
typedef int (*nccl_reduce_scatter_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*nccl_broadcast_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*nccl_reduce_fn)(const void *, void *, size_t, int, int, int, void *, void *);
typedef int (*nccl_alltoall_fn)(const void *, void *, size_t, int, void *, void *);
typedef int (*nccl_destroy_fn)(void *);
typedef int (*nccl_mem_alloc_fn)(void **, size_t);
typedef int (*nccl_mem_free_fn)(void *);
typedef int (*nccl_win_register_fn)(void *, void *, size_t, void **, int);
typedef int (*nccl_win_deregister_fn)(void *, void *);
/* ncclCommWindowRegister's flag for NCCL's symmetric kernels (nccl.h, NCCL 2.27). */
#define NCCL_WIN_COLL_SYMMETRIC 0x01

static struct {
  void *lib;
  nccl_get_id_fn get_id;
  void *init_rank; /* takes the 128-byte id by value: called through nccl_init_rank_byval_fn */
  nccl_allreduce_fn allreduce;
  nccl_allgather_fn allgather;
  nccl_reduce_scatter_fn reduce_scatter;
  nccl_broadcast_fn broadcast;
  nccl_reduce_fn reduce;
  nccl_alltoall_fn alltoall; /* NCCL >= 2.28; NULL before */
  nccl_destroy_fn destroy;
  /* NCCL >= 2.27: buffers from ncclMemAlloc registered as symmetric windows; NULL before. */
  nccl_mem_alloc_fn mem_alloc;
  nccl_mem_free_fn mem_free;
  nccl_win_register_fn win_register;
  nccl_win_deregister_fn win_deregister;
} nccl;

struct perf_nccl_comm {
  void *comm;
};

typedef struct { char internal[128]; } nccl_id_t;
typedef int (*nccl_init_rank_byval_fn)(void **comm, int n, nccl_id_t id, int rank);

int perf_nccl_load(char *err, size_t errlen) {
  if (nccl.lib) return 0;
  const char *path = getenv("FLEXCOLL_PERF_NCCL_LIB");
  void *lib = dlopen(path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!lib) { snprintf(err, errlen, "%s", dlerror()); return 1; }
  nccl.get_id = (nccl_get_id_fn)dlsym(lib, "ncclGetUniqueId");
  nccl.init_rank = dlsym(lib, "ncclCommInitRank");
  nccl.allreduce = (nccl_allreduce_fn)dlsym(lib, "ncclAllReduce");
  nccl.allgather = (nccl_allgather_fn)dlsym(lib, "ncclAllGather");
  nccl.reduce_scatter = (nccl_reduce_scatter_fn)dlsym(lib, "ncclReduceScatter");
  nccl.broadcast = (nccl_broadcast_fn)dlsym(lib, "ncclBroadcast");
  nccl.reduce = (nccl_reduce_fn)dlsym(lib, "ncclReduce");
  nccl.destroy = (nccl_destroy_fn)dlsym(lib, "ncclCommDestroy");
  nccl.alltoall = (nccl_alltoall_fn)dlsym(lib, "ncclAlltoAll");
  nccl.mem_alloc = (nccl_mem_alloc_fn)dlsym(lib, "ncclMemAlloc");
  nccl.mem_free = (nccl_mem_free_fn)dlsym(lib, "ncclMemFree");
  nccl.win_register = (nccl_win_register_fn)dlsym(lib, "ncclCommWindowRegister");
  nccl.win_deregister = (nccl_win_deregister_fn)dlsym(lib, "ncclCommWindowDeregister");
  if (!nccl.get_id || !nccl.init_rank || !nccl.allreduce || !nccl.allgather || !nccl.reduce_scatter ||
      !nccl.broadcast || !nccl.reduce || !nccl.destroy) {
    snprintf(err, errlen, "libnccl.so.2 lacks an expected symbol");
    dlclose(lib);
    return 1;
  }
  nccl.lib = lib;
  return 0;
}

int perf_nccl_unique_id(void *id) {
  char err[256];
  if (perf_nccl_load(err, sizeof err)) { fprintf(stderr, "flexcoll-perf: NCCL baseline unavailable: %s\n", err); return 1; }
  return nccl.get_id(id) != 0;
}

int perf_nccl_init_rank(perf_nccl_comm_t **comm, int n, const void *id, int rank) {
  char err[256];
  if (perf_nccl_load(err, sizeof err)) { fprintf(stderr, "flexcoll-perf: NCCL baseline unavailable: %s\n", err); return 1; }
  perf_nccl_comm_t *c = calloc(1, sizeof *c);
  nccl_id_t v;
  for (int i = 0; i < 128; i++) v.internal[i] = ((const char *)id)[i];
  if (!c || ((nccl_init_rank_byval_fn)nccl.init_rank)(&c->comm, n, v, rank) != 0) { free(c); return 1; }
  *comm = c;
  return 0;
}

/* flexcoll's datatype and op enums list NCCL's in the same order (ncclInt8 .. ncclFloat64 with
 * ncclFloat16 at 6 and ncclBfloat16 at 9 differ): map explicitly. */
static int nccl_dtype(flexcoll_datatype_t dt) {
  static const int map[] = {0 /*int8*/, 1 /*uint8*/, 2 /*int32*/, 3 /*uint32*/, 4 /*int64*/, 5 /*uint64*/,
                            6 /*float16*/, 9 /*bfloat16*/, 7 /*float32*/, 8 /*float64*/};
  return map[dt];
}

int perf_nccl_run(perf_nccl_comm_t *c, int coll, const void *send, void *recv, size_t count, flexcoll_datatype_t dt,
                  flexcoll_op_t op, int root, void *stream) {
  int t = nccl_dtype(dt), o = (int)op; /* ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg = 0..4 */
  switch (coll) {
    case PERF_ALLREDUCE: return nccl.allreduce(send, recv, count, t, o, c->comm, stream);
    case PERF_ALLGATHER: return nccl.allgather(send, recv, count, t, c->comm, stream);
    case PERF_REDUCE_SCATTER: return nccl.reduce_scatter(send, recv, count, t, o, c->comm, stream);
    case PERF_BROADCAST: return nccl.broadcast(send, recv, count, t, root, c->comm, stream);
    case PERF_ALLTOALL: return nccl.alltoall ? nccl.alltoall(send, recv, count, t, c->comm, stream) : 1;
    default: return nccl.reduce(send, recv, count, t, o, root, c->comm, stream);
  }
}

int perf_nccl_has_windows(void) {
  return nccl.mem_alloc && nccl.mem_free && nccl.win_register && nccl.win_deregister;
}

void *perf_nccl_mem_alloc(size_t bytes) {
  void *p = NULL;
  return nccl.mem_alloc && nccl.mem_alloc(&p, bytes) == 0 ? p : NULL;
}

void perf_nccl_mem_free(void *p) {
  if (p && nccl.mem_free) nccl.mem_free(p);
}

int perf_nccl_window_register(perf_nccl_comm_t *c, void *buf, size_t bytes, void **win) {
  *win = NULL;
  return !nccl.win_register || nccl.win_register(c->comm, buf, bytes, win, NCCL_WIN_COLL_SYMMETRIC) != 0;
}

int perf_nccl_window_deregister(perf_nccl_comm_t *c, void *win) {
  return win && nccl.win_deregister ? nccl.win_deregister(c->comm, win) != 0 : 0;
}

void perf_nccl_destroy(perf_nccl_comm_t *c) {
  if (!c) return;
  nccl.destroy(c->comm);
  free(c);
}
