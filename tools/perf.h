/* perf.h — the pieces of flexcoll-perf: options, the per-rank sweep, result checks, device
 * buffers, and the optional NCCL baseline. */
#ifndef FC_PERF_H
#define FC_PERF_H

#include <stddef.h>
#include "flexcoll.h"

typedef struct {
  const char *coll;
  size_t minbytes, maxbytes;
  double step;      /* -f: the factor between sizes */
  int step_given;   /* -f was given (it excludes -i) */
  size_t stepbytes; /* -i: the increment between sizes; 0: use step */
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  int root, warmup, iters, check, device;
  int nranks;             /* ranks in this process (thread mode), from --nranks or -t and -g */
  int nthreads, ngpus;    /* -t and -g as given; 0: not given */
  int windows;            /* register device buffers as symmetric windows (-R) */
  const char *memory, *json, *baseline;
} perf_opts_t;

/* Read the command line into *o (which holds the defaults); --help prints the options and exits 0,
 * a bad option or value is named on stderr and exits 2 (perf_args.c). */
void perf_parse_args(int argc, char **argv, perf_opts_t *o);
/* "flexcoll-perf: <message>" and a pointer to --help on stderr, then exit status 2. */
void perf_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

enum { PERF_ALLREDUCE, PERF_ALLGATHER, PERF_REDUCE_SCATTER, PERF_BROADCAST, PERF_REDUCE, PERF_ALLTOALL, PERF_NUM_COLLS };
int perf_coll_from_name(const char *name);

/* Run the sweep with one rank per process (launcher) or nranks threads. Exit status. */
int perf_run_launched(const perf_opts_t *o);
int perf_run_threads(const perf_opts_t *o);

/* Test data: every rank's input is a function of (rank, index); expectations follow from it. */
void perf_fill_input(void *host, size_t count, flexcoll_datatype_t dt, int rank, size_t offset);
/* Elements of host (a result of n ranks) that differ from the expectation; `poisoned` shows
 * where the output was expected to stay untouched. */
size_t perf_count_wrong(int coll, const void *host, size_t count, flexcoll_datatype_t dt, flexcoll_op_t op, int rank,
                        int nranks, int root);

/* Device memory (no-ops that fail without CUDA). */
int perf_gpu_count(void);
int perf_set_device(int dev);
void *perf_alloc(size_t bytes, int device);
void perf_free(void *p, int device);
int perf_copy(void *dst, const void *src, size_t bytes, int device); /* default direction */
void *perf_stream_create(int device);
void perf_stream_destroy(void *stream, int device);
int perf_stream_sync(void *stream, int device);

/* The NCCL baseline, through dlopen.  perf_nccl_load returns 0 when NCCL is usable. */
int perf_nccl_load(char *err, size_t errlen);
typedef struct perf_nccl_comm perf_nccl_comm_t;
/* NCCL's 128-byte unique id (rank 0), then every rank joins with it (current device). */
int perf_nccl_unique_id(void *id);
int perf_nccl_init_rank(perf_nccl_comm_t **comm, int n, const void *id, int rank);
int perf_nccl_run(perf_nccl_comm_t *comm, int coll, const void *send, void *recv, size_t count, flexcoll_datatype_t dt,
                  flexcoll_op_t op, int root, void *stream);
void perf_nccl_destroy(perf_nccl_comm_t *comm);

#endif
