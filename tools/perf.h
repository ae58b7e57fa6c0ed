/* perf.h — the pieces of flexcoll-perf: options, the per-rank sweep, result checks, device
 * buffers, and the optional NCCL baseline. */
#ifndef FC_PERF_H
#define FC_PERF_H

#include <stddef.h>
#include <stdio.h>
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
  int graph;              /* -G: launches of a CUDA graph of `iters` captured calls (0: calls as they are) */
  int nranks;             /* ranks in this process (thread mode), from --nranks or -t and -g */
  int nthreads, ngpus;    /* -t and -g as given; 0: not given */
  int windows;            /* register the buffers as symmetric windows (-R; host: from flexcoll_host_alloc) */
  const char *memory, *json, *baseline, *plot;
  int dtype_given;        /* -d was given (moe: bfloat16 otherwise) */
  /* --coll moe_dispatch|moe_combine (perf_moe.c): the layer's shape, the largest token count per
   * rank (the sweep runs 1, f, f^2 ... up to it) and the synchronisation mode. */
  int moe_hidden, moe_top_k, moe_experts, moe_tokens;
  flexcoll_moe_sync_t moe_sync;
} perf_opts_t;

/* One size's measurements, as rank 0 reports them (stdout, JSON, the plot). */
#define PERF_MAX_LINKS 8
typedef struct {
  size_t bytes, count;
  double time[2], algbw[2], busbw[2], wrong[2]; /* out-of-place, in-place; time 0: not run, < 0: failed */
  double nccl_time, nccl_busbw, nccl_wrong;     /* the baseline, out of place (time as above) */
  double nccl_ip_time, nccl_ip_busbw;           /* ... in place (its wrong counts into nccl_wrong) */
  int nlinks, links_used;                       /* links that carried bytes: more than 1 to show */
  char link[PERF_MAX_LINKS][16];
  double share[PERF_MAX_LINKS];
} perf_result_t;

/* Where a rank runs, gathered on rank 0 for the device list (fixed layout: sent as bytes). */
typedef struct {
  int rank, pid, device, pci_bus;
  char host[64], name[64];
} perf_device_t;

/* What the report needs besides the options. */
typedef struct {
  int nranks, threads; /* ranks in all, ranks as threads of this process */
  int nccl;            /* the NCCL baseline ran */
  int nccl_windows;    /* ... on buffers registered as NCCL symmetric windows (with -R) */
  const perf_device_t *devices;
} perf_run_info_t;

/* The report (perf_report.c): nccl-tests' header, rows and footer on stdout, and the JSON file. */
void perf_print_header(const perf_opts_t *o, const perf_run_info_t *ri);
void perf_print_row(const perf_opts_t *o, const perf_run_info_t *ri, const perf_result_t *r);
/* The average over sizes of the out-of-place busbw, as nccl-tests' "# Avg bus bandwidth". */
double perf_avg_busbw(const perf_result_t *res, int n);
void perf_print_footer(double wrong, double avg_busbw);
void perf_write_json(FILE *f, const perf_opts_t *o, const perf_run_info_t *ri, const perf_result_t *res, int n,
                     double wrong);
/* --plot FILE.png (perf_plot.c): 0, or -1 with the reason in err (e.g. built without zlib). */
int perf_plot(const char *path, const perf_opts_t *o, const perf_run_info_t *ri, const perf_result_t *res, int n,
              char *err, size_t errlen);
/* 1 when this build can write PNG files (zlib). */
int perf_plot_available(void);

/* Read the command line into *o (which holds the defaults); --help prints the options and exits 0,
 * a bad option or value is named on stderr and exits 2 (perf_args.c). */
void perf_parse_args(int argc, char **argv, perf_opts_t *o);
/* "flexcoll-perf: <message>" and a pointer to --help on stderr, then exit status 2. */
void perf_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

enum { PERF_ALLREDUCE, PERF_ALLGATHER, PERF_REDUCE_SCATTER, PERF_BROADCAST, PERF_REDUCE, PERF_ALLTOALL,
       PERF_MOE_DISPATCH, PERF_MOE_COMBINE, PERF_NUM_COLLS };
int perf_coll_from_name(const char *name);
/* MoE dispatch or combine: the token sweep of perf_moe.c instead of the size sweep. */
int perf_coll_is_moe(int coll);
/* One rank's MoE sweep (perf_moe.c) on device memory; its own table on rank 0's stdout, the same
 * exchange through flexcoll_alltoall (counts, then rows padded to the call's token count) in the
 * same run as the baseline.  Returns nonzero on a failure or a wrong count. */
int perf_moe_sweep(const perf_opts_t *o, flexcoll_comm_t comm, int rank, int nranks, int device, void *stream);

/* Run the sweep with one rank per process (launcher) or nranks threads. Exit status. */
int perf_run_launched(const perf_opts_t *o);
int perf_run_threads(const perf_opts_t *o);

/* Test data: every rank's input is a function of (rank, index); expectations follow from it. */
void perf_fill_input(void *host, size_t count, flexcoll_datatype_t dt, int rank, size_t offset);
/* Elements of host (a result of n ranks) that differ from the expectation; `poisoned` shows
 * where the output was expected to stay untouched. */
size_t perf_count_wrong(int coll, const void *host, size_t count, flexcoll_datatype_t dt, flexcoll_op_t op, int rank,
                        int nranks, int root);

/* Name and PCI bus of a device (device -1: host memory). */
void perf_device_info(int device, perf_device_t *d);

/* Device memory (no-ops that fail without CUDA). */
int perf_gpu_count(void);
int perf_set_device(int dev);
void *perf_alloc(size_t bytes, int device);
void perf_free(void *p, int device);
/* A copy in the default direction on the rank's stream, finished when it returns. */
int perf_copy(void *dst, const void *src, size_t bytes, int device, void *stream);
void *perf_stream_create(int device);
void perf_stream_destroy(void *stream, int device);
int perf_stream_sync(void *stream, int device);
/* -G: capture the calls issued on stream between begin and end into a graph (*graph), launch it,
 * destroy it; nonzero on failure (no CUDA: always), with the CUDA error in err. */
int perf_graph_begin(void *stream, char *err, size_t errlen);
int perf_graph_end(void *stream, void **graph, char *err, size_t errlen);
int perf_graph_launch(void *graph, void *stream);
void perf_graph_destroy(void *graph);

/* The NCCL baseline, through dlopen.  perf_nccl_load returns 0 when NCCL is usable. */
int perf_nccl_load(char *err, size_t errlen);
typedef struct perf_nccl_comm perf_nccl_comm_t;
/* NCCL's 128-byte unique id (rank 0), then every rank joins with it (current device). */
int perf_nccl_unique_id(void *id);
int perf_nccl_init_rank(perf_nccl_comm_t **comm, int n, const void *id, int rank);
int perf_nccl_run(perf_nccl_comm_t *comm, int coll, const void *send, void *recv, size_t count, flexcoll_datatype_t dt,
                  flexcoll_op_t op, int root, void *stream);
void perf_nccl_destroy(perf_nccl_comm_t *comm);
/* NCCL's symmetric windows (2.27 and later): whether the library has them; buffers from
 * ncclMemAlloc; registration with NCCL_WIN_COLL_SYMMETRIC (collective: every rank, same order).
 * The int functions return 0 on success. */
int perf_nccl_has_windows(void);
void *perf_nccl_mem_alloc(size_t bytes);
void perf_nccl_mem_free(void *p);
int perf_nccl_window_register(perf_nccl_comm_t *comm, void *buf, size_t bytes, void **win);
int perf_nccl_window_deregister(perf_nccl_comm_t *comm, void *win);

#endif
