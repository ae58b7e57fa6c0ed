/* perf_report.c — what rank 0 prints: nccl-tests' header (version, settings, the rank and device
 * list, the column labels), a row per size, the footer, and the same run as JSON.  The layout
 * follows nccl-tests so that the scripts people keep for its output read this one too. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "dtype.h"
#include "perf.h"

/* nccl-tests prints "none" where the collective reduces nothing. */
static const char *redop_name(const perf_opts_t *o) {
  int c = perf_coll_from_name(o->coll);
  return c == PERF_ALLGATHER || c == PERF_BROADCAST || c == PERF_ALLTOALL ? "none" : fc_op_name(o->op);
}

static int rooted(const perf_opts_t *o) {
  int c = perf_coll_from_name(o->coll);
  return c == PERF_BROADCAST || c == PERF_REDUCE;
}

void perf_print_header(const perf_opts_t *o, const perf_run_info_t *ri) {
  const char *links = getenv("FLEXCOLL_LINKS"), *algo = getenv("FLEXCOLL_ALGO");
  printf("# flexcoll-perf version %s (flexcoll %s, CUDA %s)\n", PACKAGE_VERSION, PACKAGE_VERSION, HAVE_CUDA ? "yes" : "no");
  /* nThread and nGpus as nccl-tests counts them (threads of this process, GPUs per thread): what
   * the user typed with -t and -g; --nranks N (or every GPU) is -g N on device memory. */
  int nthread = 1, ngpu = o->device ? 1 : 0;
  if (o->nranks && (o->nthreads || o->ngpus))
    nthread = o->nthreads ? o->nthreads : 1, ngpu = o->device ? (o->ngpus ? o->ngpus : 1) : 0;
  else if (o->nranks)
    nthread = o->device ? 1 : ri->threads, ngpu = o->device ? ri->threads : 0;
  printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: ", nthread, ngpu, o->minbytes, o->maxbytes);
  if (o->stepbytes) printf("%zu(bytes)", o->stepbytes);
  else printf("%g(factor)", o->step);
  printf(" warmup iters: %d iters: %d agg iters: 1 validation: %d graph: %d\n", o->warmup, o->iters, o->check,
         o->graph);
  printf("# Collective %s, %d ranks, %s memory, %s %s, links %s, algorithm %s%s\n", o->coll, ri->nranks, o->memory,
         fc_dtype_name(o->dtype), redop_name(o), links && *links ? links : "all", algo && *algo ? algo : "auto",
         ri->nccl ? (ri->nccl_windows ? ", baseline NCCL (symmetric windows)" : ", baseline NCCL (unregistered)") : "");
  printf("#\n# Using devices\n");
  for (int i = 0; i < ri->nranks; i++) {
    const perf_device_t *d = &ri->devices[i];
    if (d->device >= 0)
      printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [0x%02x] %s\n", d->rank, d->pid, d->host, d->device,
             d->pci_bus, d->name);
    else printf("#  Rank %2d Group  0 Pid %6d on %10s host\n", d->rank, d->pid, d->host);
  }
  printf("#\n");
  /* The labels sit over their groups of four columns (time, algbw, busbw, #wrong). */
  printf("#%47s  %-32s  %-32s%s\n", "", "          out-of-place", "            in-place",
         ri->nccl ? "  NCCL, out-of-place             NCCL, in-place" : "");
  printf("#%11s %12s %8s %6s %5s  %9s %7s %7s %6s  %9s %7s %7s %6s%s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", ri->nccl ? "  nccl:time  busbw  flexcoll/nccl  nccl:time  busbw  flexcoll/nccl" : "");
  printf("#%11s %12s %8s %6s %5s  %9s %7s %7s %6s  %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
         "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  fflush(stdout);
}

void perf_print_row(const perf_opts_t *o, const perf_run_info_t *ri, const perf_result_t *r) {
  printf("%12zu %12zu %8s %6s %5d", r->bytes, r->count, fc_dtype_name(o->dtype), redop_name(o), rooted(o) ? o->root : -1);
  for (int ip = 0; ip < 2; ip++) {
    if (r->time[ip] > 0) printf("  %9.2f %7.2f %7.2f %6.0f", r->time[ip] * 1e6, r->algbw[ip], r->busbw[ip], r->wrong[ip]);
    else printf("  %9s %7s %7s %6.0f", r->time[ip] < 0 ? "failed" : "n/a", "", "", r->wrong[ip]);
  }
  if (ri->nccl)
    for (int ip = 0; ip < 2; ip++) {
      const double tn = ip ? r->nccl_ip_time : r->nccl_time, bw = ip ? r->nccl_ip_busbw : r->nccl_busbw;
      if (tn < 0) printf("  %9s %6s %13s", "failed", "", "");
      else printf("  %9.2f %6.2f %13.3f", tn * 1e6, bw, r->time[ip] > 0 ? tn / r->time[ip] : 0);
    }
  /* Each link's share of the bytes, where more than one carried some. */
  for (int k = 0; k < r->nlinks && r->links_used > 1; k++) printf("%s%s %.3f", k ? " " : "  links: ", r->link[k], r->share[k]);
  printf("\n");
  fflush(stdout);
}

double perf_avg_busbw(const perf_result_t *res, int n) {
  double sum = 0;
  for (int i = 0; i < n; i++) sum += res[i].busbw[0];
  return n ? sum / n : 0;
}

void perf_print_footer(double wrong, double avg_busbw) {
  printf("# Out of bounds values : %.0f %s\n", wrong, wrong ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g \n#\n", avg_busbw);
  fflush(stdout);
}

/* JSON strings here are names from this program or the system (a GPU's, a host's): escape the
 * two characters that could break the file anyway. */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s >= 0x20) fputc(*s, f);
  }
  fputc('"', f);
}

static void json_settings(FILE *f, const perf_opts_t *o, const perf_run_info_t *ri) {
  const char *links = getenv("FLEXCOLL_LINKS"), *algo = getenv("FLEXCOLL_ALGO");
  fprintf(f, "  \"settings\": {\"minbytes\": %zu, \"maxbytes\": %zu, \"stepfactor\": %g, \"stepbytes\": %zu, "
          "\"warmup_iters\": %d, \"iters\": %d, \"check\": %d, \"root\": %d, \"nthreads\": %d, \"local_register\": %d, "
          "\"links\": ", o->minbytes, o->maxbytes, o->stepbytes ? 0 : o->step, o->stepbytes, o->warmup, o->iters,
          o->check, o->root, ri->threads, o->windows);
  json_str(f, links && *links ? links : "all");
  fprintf(f, ", \"algorithm\": ");
  json_str(f, algo && *algo ? algo : "auto");
  fprintf(f, ", \"baseline\": %s, \"baseline_windows\": %s},\n  \"devices\": [", ri->nccl ? "\"nccl\"" : "null",
          ri->nccl && ri->nccl_windows ? "true" : "false");
  for (int i = 0; i < ri->nranks; i++) {
    const perf_device_t *d = &ri->devices[i];
    fprintf(f, "%s\n    {\"rank\": %d, \"pid\": %d, \"host\": ", i ? "," : "", d->rank, d->pid);
    json_str(f, d->host);
    fprintf(f, ", \"device\": %d, \"pci_bus\": %d, \"name\": ", d->device, d->pci_bus);
    json_str(f, d->name);
    fprintf(f, "}");
  }
  fprintf(f, "\n  ],\n");
}

/* A time in microseconds, or null where the calls failed (perf_result_t: time < 0). */
static void json_time(FILE *f, const char *key, double t) {
  if (t < 0) fprintf(f, "\"%s\": null", key);
  else fprintf(f, "\"%s\": %.3f", key, t * 1e6);
}

static void json_result(FILE *f, const perf_result_t *r, int nccl) {
  fprintf(f, "    {\"bytes\": %zu, \"count\": %zu, ", r->bytes, r->count);
  json_time(f, "time_us", r->time[0]);
  fprintf(f, ", \"algbw\": %.3f, \"busbw\": %.3f, \"wrong\": %.0f, ", r->algbw[0], r->busbw[0], r->wrong[0]);
  json_time(f, "inplace_time_us", r->time[1]);
  fprintf(f, ", \"inplace_busbw\": %.3f, \"inplace_wrong\": %.0f", r->busbw[1], r->wrong[1]);
  if (nccl) {
    fprintf(f, ", ");
    json_time(f, "nccl_time_us", r->nccl_time);
    fprintf(f, ", \"nccl_busbw\": %.3f, ", r->nccl_busbw);
    json_time(f, "nccl_inplace_time_us", r->nccl_ip_time);
    fprintf(f, ", \"nccl_inplace_busbw\": %.3f", r->nccl_ip_busbw);
  }
  fprintf(f, ", \"links\": {");
  for (int k = 0; k < r->nlinks; k++) fprintf(f, "%s\"%s\": %.4f", k ? ", " : "", r->link[k], r->share[k]);
  fprintf(f, "}}");
}

void perf_write_json(FILE *f, const perf_opts_t *o, const perf_run_info_t *ri, const perf_result_t *res, int n,
                     double wrong) {
  fprintf(f, "{\"collective\": \"%s\", \"nranks\": %d, \"memory\": \"%s\", \"dtype\": \"%s\", \"op\": \"%s\",\n",
          o->coll, ri->nranks, o->memory, fc_dtype_name(o->dtype), redop_name(o));
  fprintf(f, "  \"version\": \"%s\", \"cuda\": %s,\n", PACKAGE_VERSION, HAVE_CUDA ? "true" : "false");
  json_settings(f, o, ri);
  fprintf(f, "  \"results\": [");
  for (int i = 0; i < n; i++) {
    fprintf(f, "%s\n", i ? "," : "");
    json_result(f, &res[i], ri->nccl);
  }
  fprintf(f, "\n  ],\n  \"out_of_bounds\": %.0f, \"avg_busbw\": %.6g\n}\n", wrong, perf_avg_busbw(res, n));
}
