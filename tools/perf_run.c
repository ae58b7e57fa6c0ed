/* perf_run.c — one rank's sweep: buffers, warm-up, timed iterations, checks, the report. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "perf.h"

static const char *coll_names[PERF_NUM_COLLS] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce",
                                                 "alltoall",  "moe_dispatch", "moe_combine"};

int perf_coll_is_moe(int coll) { return coll == PERF_MOE_DISPATCH || coll == PERF_MOE_COMBINE; }

int perf_coll_from_name(const char *name) {
  for (int i = 0; i < PERF_NUM_COLLS; i++)
    if (strcmp(name, coll_names[i]) == 0) return i;
  return -1;
}

typedef struct {
  const perf_opts_t *o;
  int rank, nranks, device;
  flexcoll_comm_t comm;
  perf_nccl_comm_t *nccl;
  int nccl_windows;      /* the NCCL baseline's buffers are NCCL symmetric windows (-R) */
  void *stream;
  FILE *json;
  int status;
  int threads;           /* ranks as threads of this process */
  perf_result_t *results; /* rank 0: one per size, for the footer, the JSON and the plot */
  int nresults;
} perf_rank_t;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Host-memory collectives on the same communicator serve as barrier and reduction of results. */
static double max_over_ranks(perf_rank_t *r, double v) {
  double out = v;
  if (flexcoll_allreduce(&v, &out, 1, FLEXCOLL_FLOAT64, FLEXCOLL_MAX, r->comm, NULL) != FLEXCOLL_SUCCESS) r->status = 1;
  return out;
}

static double sum_over_ranks(perf_rank_t *r, double v) {
  double out = v;
  if (flexcoll_allreduce(&v, &out, 1, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, r->comm, NULL) != FLEXCOLL_SUCCESS) r->status = 1;
  return out;
}

static int coll_call(perf_rank_t *r, int use_nccl, int coll, const void *s, void *d, size_t count) {
  const perf_opts_t *o = r->o;
  if (use_nccl) return perf_nccl_run(r->nccl, coll, s, d, count, o->dtype, o->op, o->root, r->stream);
  switch (coll) {
    case PERF_ALLREDUCE: return flexcoll_allreduce(s, d, count, o->dtype, o->op, r->comm, r->stream);
    case PERF_ALLGATHER: return flexcoll_allgather(s, d, count, o->dtype, r->comm, r->stream);
    case PERF_REDUCE_SCATTER: return flexcoll_reduce_scatter(s, d, count, o->dtype, o->op, r->comm, r->stream);
    case PERF_BROADCAST: return flexcoll_broadcast(s, d, count, o->dtype, o->root, r->comm, r->stream);
    case PERF_ALLTOALL: return flexcoll_alltoall(s, d, count, o->dtype, r->comm, r->stream);
    default: return flexcoll_reduce(s, d, count, o->dtype, o->op, o->root, r->comm, r->stream);
  }
}

typedef struct {
  size_t count, send_elems, recv_elems;
  void *send, *recv, *host;
} perf_bufs_t;

/* Count per call from the total size, the way nccl-tests sizes its columns. */
static void size_counts(int coll, size_t bytes, size_t esize, int n, perf_bufs_t *b) {
  size_t total = bytes / esize;
  int per_rank = coll == PERF_ALLGATHER || coll == PERF_REDUCE_SCATTER || coll == PERF_ALLTOALL;
  b->count = per_rank ? total / (size_t)n : total;
  b->send_elems = (coll == PERF_REDUCE_SCATTER || coll == PERF_ALLTOALL) ? b->count * (size_t)n : b->count;
  b->recv_elems = (coll == PERF_ALLGATHER || coll == PERF_ALLTOALL) ? b->count * (size_t)n : b->count;
}

static int prepare(perf_rank_t *r, perf_bufs_t *b, int inplace, int coll) {
  size_t esize = fc_dtype_size(r->o->dtype);
  size_t sbytes = b->send_elems * esize, rbytes = b->recv_elems * esize;
  memset(b->host, 0xff, rbytes > sbytes ? rbytes : sbytes);
  if (perf_copy(b->recv, b->host, rbytes, r->device, r->stream)) return 1; /* poison the output */
  perf_fill_input(b->host, b->send_elems, r->o->dtype, r->rank, 0);
  void *dst = b->send;
  if (inplace) dst = (char *)b->recv + (coll == PERF_ALLGATHER ? (size_t)r->rank * sbytes : 0);
  return perf_copy(dst, b->host, sbytes, r->device, r->stream);
}

static const void *send_ptr(perf_rank_t *r, perf_bufs_t *b, int inplace, int coll, size_t esize) {
  if (!inplace) return b->send;
  return (char *)b->recv + (coll == PERF_ALLGATHER ? (size_t)r->rank * b->count * esize : 0);
}

static void *recv_ptr(perf_rank_t *r, perf_bufs_t *b, int inplace, int coll, size_t esize) {
  if (inplace && coll == PERF_REDUCE_SCATTER) return (char *)b->recv + (size_t)r->rank * b->count * esize;
  return b->recv;
}

/* -G: the -n calls captured into one CUDA graph (as nccl-tests does), launched o->graph times;
 * the time per call.  A call the library refuses to capture (a path that could not replay)
 * fails the size with its reason.  Returns -1 where a rank failed; *wrong: the global count (w:
 * this rank's so far). */
static double measure_graph(perf_rank_t *r, int use_nccl, int coll, const void *s, void *d, size_t count, double w,
                            double *wrong) {
  const perf_opts_t *o = r->o;
  char why[256] = "";
  void *graph = NULL;
  int err = perf_graph_begin(r->stream, why, sizeof why);
  for (int i = 0; i < o->iters && !err; i++)
    if (coll_call(r, use_nccl, coll, s, d, count))
      err = snprintf(why, sizeof why, "capturing call %d: %s", i,
                     use_nccl ? "see NCCL_DEBUG=WARN" : flexcoll_get_last_error(r->comm)) > 0;
  /* End the capture whatever happened, so the stream is usable again. */
  char end_why[128] = "";
  if (perf_graph_end(r->stream, &graph, end_why, sizeof end_why) && !err) {
    snprintf(why, sizeof why, "%s", end_why);
    err = 1;
  }
  /* A rank whose capture failed launches nothing: nobody launches (the others would wait for it). */
  const int skip = max_over_ranks(r, err) > 0;
  double t0 = now_s();
  for (int i = 0; i < o->graph && !skip; i++) err = err || perf_graph_launch(graph, r->stream);
  err = perf_stream_sync(r->stream, r->device) || err;
  const double t = (now_s() - t0) / ((double)o->iters * o->graph);
  perf_graph_destroy(graph);
  if (err) {
    fprintf(stderr, "flexcoll-perf: rank %d: %s in a CUDA graph failed: %s\n", r->rank, use_nccl ? "NCCL" : o->coll,
            why[0] ? why : "cudaGraphLaunch failed");
    r->status = 1;
    w += 1;
  }
  *wrong = sum_over_ranks(r, w);
  return max_over_ranks(r, err) > 0 ? -1 : t;
}

/* One measurement: returns the time per call (s), max over ranks, or -1 where a rank's call
 * failed (its calls stopped early: their time means nothing); *wrong gets the global count. */
static double measure(perf_rank_t *r, int use_nccl, perf_bufs_t *b, int inplace, double *wrong) {
  const perf_opts_t *o = r->o;
  int coll = perf_coll_from_name(o->coll);
  size_t esize = fc_dtype_size(o->dtype);
  /* In place, reduce_scatter reads and writes the larger send-sized buffer. */
  perf_bufs_t use = *b;
  if (inplace && coll == PERF_REDUCE_SCATTER) use.recv_elems = use.send_elems;
  /* Every rank takes part in the same collectives, whatever failed locally: agree first. */
  if (max_over_ranks(r, prepare(r, &use, inplace, coll)) > 0) {
    r->status = 1;
    *wrong = 1;
    return -1;
  }
  const void *s = send_ptr(r, &use, inplace, coll, esize);
  void *d = recv_ptr(r, &use, inplace, coll, esize);
  int err = coll_call(r, use_nccl, coll, s, d, use.count) || perf_stream_sync(r->stream, r->device);
  double w = 0;
  if (!err && o->check) {
    perf_copy(use.host, use.recv, use.recv_elems * esize, r->device, r->stream);
    const void *res = (char *)use.host + (d == use.recv ? 0 : (size_t)((char *)d - (char *)use.recv));
    w = (double)perf_count_wrong(coll, res, use.count, o->dtype, o->op, r->rank, r->nranks, o->root);
  }
  for (int i = 0; i < o->warmup && !err; i++) err = coll_call(r, use_nccl, coll, s, d, use.count);
  err = err || perf_stream_sync(r->stream, r->device);
  /* Every rank takes the same branch (where a rank's warmup failed, none times anything), so that
   * each makes the same calls over the communicator after it; also the start line of the timing. */
  const int any_err = max_over_ranks(r, err) > 0;
  if (!any_err && o->graph) return max_over_ranks(r, measure_graph(r, use_nccl, coll, s, d, use.count, w, wrong));
  double t0 = now_s();
  for (int i = 0; i < o->iters && !any_err && !err; i++) err = coll_call(r, use_nccl, coll, s, d, use.count);
  err = err || perf_stream_sync(r->stream, r->device);
  double t = (now_s() - t0) / o->iters;
  /* A kernel that gave up waiting shows only in the async error: its calls had returned. */
  flexcoll_result_t async = FLEXCOLL_SUCCESS;
  if (!err && !use_nccl && flexcoll_comm_get_async_error(r->comm, &async) == FLEXCOLL_SUCCESS &&
      async != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "flexcoll-perf: rank %d: %s: the communicator reports %s after the calls\n", r->rank, o->coll,
            flexcoll_get_error_string(async));
    err = 1;
    r->status = 1;
    w += 1;
  }
  if (err && async == FLEXCOLL_SUCCESS) {
    fprintf(stderr, "flexcoll-perf: rank %d: %s failed: %s\n", r->rank, use_nccl ? "NCCL" : o->coll,
            use_nccl ? "see NCCL_DEBUG=WARN" : flexcoll_get_last_error(r->comm));
    r->status = 1;
    w += 1;
  }
  *wrong = sum_over_ranks(r, w);
  if (max_over_ranks(r, err) > 0) return -1;
  return max_over_ranks(r, t);
}

static double bus_factor(int coll, int n) {
  if (coll == PERF_ALLREDUCE) return 2.0 * (n - 1) / n;
  if (coll == PERF_ALLGATHER || coll == PERF_REDUCE_SCATTER || coll == PERF_ALLTOALL) return (double)(n - 1) / n;
  return 1.0;
}

/* Bytes this rank has sent per link name since creation (summed over peers); returns the names. */
typedef struct {
  int n;
  char name[PERF_MAX_LINKS][16];
  unsigned long long bytes[PERF_MAX_LINKS];
} perf_links_t;

static void link_bytes(perf_rank_t *r, perf_links_t *l) {
  flexcoll_link_stats_t st[64];
  int n = 0;
  l->n = 0;
  if (flexcoll_comm_get_link_stats(r->comm, st, 64, &n) != FLEXCOLL_SUCCESS) return;
  for (int i = 0; i < n && i < 64; i++) {
    int k = 0;
    while (k < l->n && strcmp(l->name[k], st[i].name)) k++;
    if (k == l->n) {
      if (l->n == PERF_MAX_LINKS) continue;
      memcpy(l->name[l->n], st[i].name, sizeof l->name[0]);
      l->name[l->n][sizeof l->name[0] - 1] = 0;
      l->bytes[l->n++] = 0;
    }
    l->bytes[k] += st[i].bytes;
  }
}

/* Each link's fraction of the bytes sent between two snapshots. */
static void link_shares(const perf_links_t *before, const perf_links_t *after, perf_result_t *res) {
  unsigned long long total = 0;
  res->nlinks = res->links_used = 0;
  for (int k = 0; k < after->n; k++) {
    unsigned long long d = after->bytes[k] - (k < before->n ? before->bytes[k] : 0);
    total += d;
    res->links_used += d > 0;
  }
  for (int k = 0; k < after->n && total; k++) {
    memcpy(res->link[k], after->name[k], sizeof res->link[k]);
    res->share[k] = (double)(after->bytes[k] - (k < before->n ? before->bytes[k] : 0)) / (double)total;
    res->nlinks = k + 1;
  }
}

/* Rank 0 keeps every size's result. */
static void keep_result(perf_rank_t *r, const perf_result_t *res) {
  perf_result_t *v = realloc(r->results, (size_t)(r->nresults + 1) * sizeof *v);
  if (!v) return;
  r->results = v;
  v[r->nresults++] = *res;
}

/* Like for like with flexcoll's windows: the NCCL baseline on its own buffers from ncclMemAlloc,
 * registered as NCCL symmetric windows (NCCL's fastest mode since 2.27), for this size only.
 * Every rank allocates, agrees, registers (collective), agrees: a failure on one rank stops
 * them all before NCCL waits for it. */
static void measure_nccl_windows(perf_rank_t *r, const perf_bufs_t *b, size_t big, double t[2], double wrong[2]) {
  const size_t esize = fc_dtype_size(r->o->dtype), sbytes = b->send_elems * esize + 64, rbytes = big + 64;
  perf_bufs_t nb = *b;
  void *win[2] = {NULL, NULL};
  t[0] = t[1] = 0;
  nb.send = perf_nccl_mem_alloc(sbytes);
  nb.recv = perf_nccl_mem_alloc(rbytes);
  int bad = max_over_ranks(r, !nb.send || !nb.recv) > 0;
  if (!bad) bad = max_over_ranks(r, perf_nccl_window_register(r->nccl, nb.send, sbytes, &win[0]) ||
                                        perf_nccl_window_register(r->nccl, nb.recv, rbytes, &win[1])) > 0;
  if (bad) {
    if (r->rank == 0) fprintf(stderr, "flexcoll-perf: NCCL symmetric windows of %zu bytes failed (NCCL_DEBUG=WARN says why)\n", rbytes);
    r->status = 1;
    wrong[0] = 1;
    t[0] = t[1] = -1;
  } else {
    for (int ip = 0; ip < 2; ip++) t[ip] = measure(r, 1, &nb, ip, &wrong[ip]);
  }
  for (int i = 0; i < 2; i++)
    if (win[i] && perf_nccl_window_deregister(r->nccl, win[i])) r->status = 1;
  perf_nccl_mem_free(nb.send);
  perf_nccl_mem_free(nb.recv);
}

static void *host_alloc(perf_rank_t *r, size_t bytes) {
  void *p = NULL;
  if (flexcoll_host_alloc(bytes, &p) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "flexcoll-perf: rank %d: flexcoll_host_alloc: %s\n", r->rank, flexcoll_get_last_error(NULL));
    r->status = 1;
  }
  return p;
}

static void sweep_size(perf_rank_t *r, size_t bytes, double *wrong_total) {
  const perf_opts_t *o = r->o;
  int coll = perf_coll_from_name(o->coll);
  size_t esize = fc_dtype_size(o->dtype);
  perf_bufs_t b;
  size_counts(coll, bytes, esize, r->nranks, &b);
  size_t big = (b.send_elems > b.recv_elems ? b.send_elems : b.recv_elems) * esize;
  /* Host buffers as windows come from flexcoll_host_alloc: the other processes map them. */
  const int host_windows = o->windows && r->device < 0;
  b.send = host_windows ? host_alloc(r, b.send_elems * esize + 64) : perf_alloc(b.send_elems * esize + 64, r->device);
  b.recv = host_windows ? host_alloc(r, big + 64) : perf_alloc(big + 64, r->device);
  b.host = malloc(big + 64);
  /* Symmetric windows: flexcoll's large collectives copy straight between the ranks' buffers
   * (device memory; the NCCL baseline then gets its own, in NCCL's symmetric windows; with -R 0 it
   * gets these, unregistered, as nccl-tests does by default), and host allreduce reads and writes
   * the peers' buffers in place. */
  flexcoll_window_t win[2] = {NULL, NULL};
  if (r->o->windows && b.send && b.recv &&
      (flexcoll_window_register(r->comm, b.send, b.send_elems * esize + 64, &win[0]) ||
       flexcoll_window_register(r->comm, b.recv, big + 64, &win[1]))) {
    fprintf(stderr, "flexcoll-perf: rank %d: flexcoll_window_register: %s\n", r->rank, flexcoll_get_last_error(r->comm));
    r->status = 1;
  }
  double t[2], wr[2], tn[2] = {0, 0}, wn[2] = {0, 0};
  perf_links_t links_before, links_after;
  link_bytes(r, &links_before);
  for (int ip = 0; ip < 2; ip++) {
    wr[ip] = 0;
    t[ip] = measure(r, 0, &b, ip, &wr[ip]);
  }
  link_bytes(r, &links_after);
  if (r->nccl && r->nccl_windows) measure_nccl_windows(r, &b, big, tn, wn);
  else if (r->nccl)
    for (int ip = 0; ip < 2; ip++) tn[ip] = measure(r, 1, &b, ip, &wn[ip]);
  size_t total = (coll == PERF_ALLGATHER || coll == PERF_REDUCE_SCATTER || coll == PERF_ALLTOALL)
                     ? b.count * (size_t)r->nranks * esize
                     : b.count * esize;
  double f = bus_factor(coll, r->nranks);
  *wrong_total += wr[0] + wr[1] + wn[0] + wn[1];
  if (r->rank == 0) {
    perf_result_t res = {.bytes = total, .count = b.count, .nccl_time = tn[0], .nccl_wrong = wn[0] + wn[1],
                         .nccl_ip_time = tn[1]};
    for (int ip = 0; ip < 2; ip++) {
      res.time[ip] = t[ip];
      res.wrong[ip] = wr[ip];
      res.algbw[ip] = t[ip] > 0 ? (double)total / t[ip] / 1e9 : 0;
      res.busbw[ip] = res.algbw[ip] * f;
    }
    res.nccl_busbw = tn[0] > 0 ? (double)total / tn[0] / 1e9 * f : 0;
    res.nccl_ip_busbw = tn[1] > 0 ? (double)total / tn[1] / 1e9 * f : 0;
    link_shares(&links_before, &links_after, &res);
    perf_run_info_t ri = {.nranks = r->nranks, .threads = r->threads, .nccl = r->nccl != NULL,
                          .nccl_windows = r->nccl_windows};
    perf_print_row(o, &ri, &res);
    keep_result(r, &res);
  }
  for (int i = 0; i < 2; i++)
    if (win[i] && flexcoll_window_deregister(r->comm, win[i])) {
      fprintf(stderr, "flexcoll-perf: rank %d: flexcoll_window_deregister: %s\n", r->rank, flexcoll_get_last_error(r->comm));
      r->status = 1;
    }
  if (host_windows) {
    flexcoll_host_free(b.send);
    flexcoll_host_free(b.recv);
  } else {
    perf_free(b.send, r->device);
    perf_free(b.recv, r->device);
  }
  free(b.host);
}

/* -J and --plot: opened before the sweep, so that a path that cannot be written ends the run at
 * once (status 2) rather than after it. */
static void open_outputs(perf_rank_t *r) {
  const perf_opts_t *o = r->o;
  if (o->json && !(r->json = fopen(o->json, "w"))) {
    fprintf(stderr, "flexcoll-perf: -J (--json) %s: %s\n", o->json, strerror(errno));
    r->status = 2;
  }
  FILE *f = o->plot && !r->status ? fopen(o->plot, "wb") : NULL;
  if (o->plot && !r->status && !f) {
    fprintf(stderr, "flexcoll-perf: --plot %s: %s\n", o->plot, strerror(errno));
    r->status = 2;
  }
  if (f) fclose(f);
}

/* Every rank's host, process and device, on rank 0 (NULL elsewhere, or when that failed). */
static perf_device_t *gather_devices(perf_rank_t *r) {
  perf_device_t mine;
  memset(&mine, 0, sizeof mine);
  mine.rank = r->rank;
  mine.pid = (int)getpid();
  gethostname(mine.host, sizeof mine.host - 1);
  char *dot = strchr(mine.host, '.');
  if (dot) *dot = 0;
  perf_device_info(r->device, &mine);
  perf_device_t *all = calloc((size_t)r->nranks, sizeof *all);
  int failed = !all;
  if (max_over_ranks(r, failed) > 0 ||
      flexcoll_allgather(&mine, all, sizeof mine, FLEXCOLL_UINT8, r->comm, NULL) != FLEXCOLL_SUCCESS) {
    r->status = r->status ? r->status : 1;
    free(all);
    return NULL;
  }
  if (r->rank != 0) { free(all); return NULL; }
  return all;
}

/* The footer, the JSON file and the plot, from the results rank 0 kept. */
static void finish_outputs(perf_rank_t *r, const perf_run_info_t *ri, double wrong) {
  const perf_opts_t *o = r->o;
  perf_print_footer(wrong, perf_avg_busbw(r->results, r->nresults));
  if (r->json) {
    perf_write_json(r->json, o, ri, r->results, r->nresults, wrong);
    if (fclose(r->json)) { fprintf(stderr, "flexcoll-perf: -J (--json) %s: %s\n", o->json, strerror(errno)); r->status = 1; }
    r->json = NULL;
  }
  char err[256];
  if (o->plot && perf_plot(o->plot, o, ri, r->results, r->nresults, err, sizeof err)) {
    fprintf(stderr, "flexcoll-perf: --plot %s: %s\n", o->plot, err);
    r->status = 1;
  }
}

static void *rank_main(void *arg) {
  perf_rank_t *r = arg;
  const perf_opts_t *o = r->o;
  if (r->device >= 0 && perf_set_device(r->device)) { r->status = 1; return NULL; }
  r->stream = r->device >= 0 ? perf_stream_create(r->device) : NULL;
  if (o->baseline && r->device >= 0) {
    char id[128] = {0};
    if (r->rank == 0 && perf_nccl_unique_id(id)) r->status = 1;
    flexcoll_broadcast(id, id, sizeof id, FLEXCOLL_UINT8, 0, r->comm, NULL);
    /* Rank 0 alone knows whether NCCL gave an id: all ranks go on, or none. */
    if (max_over_ranks(r, r->status) > 0) r->status = 1;
    else if (perf_nccl_init_rank(&r->nccl, r->nranks, id, r->rank)) r->status = 1;
    r->nccl_windows = o->windows && r->nccl && perf_nccl_has_windows();
    if (r->rank == 0 && o->windows && r->nccl && !r->nccl_windows)
      fprintf(stderr, "flexcoll-perf: this NCCL has no symmetric windows (ncclCommWindowRegister, NCCL 2.27): "
                      "the baseline runs unregistered\n");
  }
  /* Rank 0 alone writes the files; the sweep below stops every rank when it cannot. */
  if (r->rank == 0) open_outputs(r);
  if (perf_coll_is_moe(perf_coll_from_name(o->coll))) {
    if (perf_moe_sweep(o, r->comm, r->rank, r->nranks, r->device, r->stream)) r->status = 1;
    if (r->stream) perf_stream_destroy(r->stream, r->device);
    return NULL;
  }
  perf_device_t *devs = gather_devices(r);
  perf_run_info_t ri = {.nranks = r->nranks, .threads = r->threads, .nccl = r->nccl != NULL,
                        .nccl_windows = r->nccl_windows, .devices = devs};
  if (r->rank == 0 && !r->status && devs) perf_print_header(o, &ri);
  double wrong = 0;
  size_t esize = fc_dtype_size(o->dtype), unit = esize * (size_t)r->nranks;
  for (size_t bytes = o->minbytes; bytes <= o->maxbytes && max_over_ranks(r, r->status) == 0;) {
    size_t rounded = bytes / unit * unit;
    sweep_size(r, rounded ? rounded : unit, &wrong);
    size_t next = o->stepbytes ? bytes + o->stepbytes : (size_t)((double)bytes * o->step);
    bytes = next > bytes ? next : bytes + 1;
  }
  if (r->rank == 0 && r->status != 2 && devs) finish_outputs(r, &ri, wrong);
  if (r->json) fclose(r->json);
  free(devs);
  free(r->results);
  if (wrong) r->status = 1;
  if (r->nccl) perf_nccl_destroy(r->nccl);
  if (r->stream) perf_stream_destroy(r->stream, r->device);
  return NULL;
}

/* The launcher's local rank (processes on this host), or -1. */
static int local_rank(void) {
  static const char *const vars[] = {"FLEXCOLL_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                     "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return atoi(v);
  }
  return -1;
}

int perf_run_launched(const perf_opts_t *o) {
  perf_rank_t r = {.o = o, .device = -1, .threads = 1};
  flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
  if (!o->device) cfg.cuda_device = -1;
  /* One GPU per process: the local rank's, when the launcher says which that is. */
  int local = local_rank(), ngpus = o->device ? perf_gpu_count() : 0;
  if (local >= 0 && ngpus > 0) cfg.cuda_device = local % ngpus;
  flexcoll_result_t res = flexcoll_comm_init_from_env(&r.comm, &cfg);
  if (res != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "flexcoll-perf: init failed: %s\n", flexcoll_get_last_error(NULL));
    return 1;
  }
  flexcoll_comm_count(r.comm, &r.nranks);
  flexcoll_comm_user_rank(r.comm, &r.rank);
  if (o->device) flexcoll_comm_cu_device(r.comm, &r.device);
  /* The rank count is known only now; every rank sees the same one and refuses alike. */
  if (o->root >= r.nranks) {
    if (r.rank == 0) fprintf(stderr, "flexcoll-perf: -r (--root) %d: the root must be below the rank count, %d\n", o->root, r.nranks);
    flexcoll_comm_destroy(r.comm);
    return 2;
  }
  rank_main(&r);
  flexcoll_comm_destroy(r.comm);
  return r.status;
}

/* n ranks in this process, rank i on CUDA device devs[i] (-1 for every rank without devs: host
 * only).  One group: the ranks join one another at group_end, each in a thread of the library's.
 * Not flexcoll_comm_init_all: it would put host-only ranks on the GPUs where there are some, and
 * it takes a device once only, where more ranks than GPUs share them. */
static flexcoll_result_t init_ranks(flexcoll_comm_t *comms, int n, const int *devs) {
  flexcoll_unique_id_t id;
  flexcoll_result_t res = flexcoll_get_unique_id(&id);
  if (res != FLEXCOLL_SUCCESS) return res;
  flexcoll_group_start();
  for (int i = 0; i < n && res == FLEXCOLL_SUCCESS; i++) {
    flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
    cfg.cuda_device = devs ? devs[i] : -1;
    res = flexcoll_comm_init_rank(&comms[i], n, id, i, &cfg);
  }
  flexcoll_result_t end = flexcoll_group_end();
  return res != FLEXCOLL_SUCCESS ? res : end;
}

int perf_run_threads(const perf_opts_t *o) {
  int n = o->nranks;
  flexcoll_comm_t *comms = calloc((size_t)n, sizeof *comms);
  perf_rank_t *ranks = calloc((size_t)n, sizeof *ranks);
  pthread_t *threads = calloc((size_t)n, sizeof *threads);
  /* More ranks than GPUs share them round-robin (flexcoll lets ranks share a GPU). */
  int *devs = calloc((size_t)n, sizeof *devs), ngpus = o->device ? perf_gpu_count() : 0;
  for (int i = 0; devs && i < n; i++) devs[i] = ngpus > 0 ? i % ngpus : 0;
  flexcoll_result_t res = devs ? init_ranks(comms, n, o->device ? devs : NULL) : FLEXCOLL_SYSTEM_ERROR;
  free(devs);
  if (res != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "flexcoll-perf: init of %d ranks failed: %s\n", n, flexcoll_get_last_error(NULL));
    return 1;
  }
  for (int i = 0; i < n; i++) {
    ranks[i] = (perf_rank_t){.o = o, .rank = i, .nranks = n, .comm = comms[i], .device = -1, .threads = n};
    if (o->device) flexcoll_comm_cu_device(comms[i], &ranks[i].device);
    pthread_create(&threads[i], NULL, rank_main, &ranks[i]);
  }
  int status = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(threads[i], NULL);
    status |= ranks[i].status;
    flexcoll_comm_destroy(comms[i]);
  }
  free(comms);
  free(ranks);
  free(threads);
  return status;
}
