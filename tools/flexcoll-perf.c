/* flexcoll-perf — sweep message sizes for one collective and report time, algbw and busbw the
 * way nccl-tests does, checking every result.  Under a launcher (FLEXCOLL_RANK, torchrun, mpirun,
 * srun) each process is one rank; alone, -n N starts N ranks as threads of this process.
 * --baseline nccl runs the same sweep through the machine's NCCL (dlopen, never linked). */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "dtype.h"
#include "flexcoll.h"
#include "perf.h"

static perf_opts_t opts = {
    .coll = "allreduce", .minbytes = 8, .maxbytes = 64 << 20, .step = 2, .dtype = FLEXCOLL_FLOAT32,
    .op = FLEXCOLL_SUM, .root = 0, .warmup = 5, .iters = 20, .nranks = 0, .memory = NULL, .check = 1, .windows = 1,
};

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return (size_t)v;
}

static void usage(const char *argv0, int status) {
  fprintf(status ? stderr : stdout,
          "usage: %s [-c allreduce|allgather|reduce_scatter|broadcast|reduce|alltoall] [-b minbytes] [-e maxbytes]\n"
          "          [-f stepfactor] [-d dtype] [-o sum|prod|max|min|avg] [-r root] [-w warmup] [-i iters]\n"
          "          [-n nranks] [-m host|device] [-a ring|tree|auto] [-C 0|1] [-R 0|1] [-J file.json]\n"
          "          [--baseline nccl]\n"
          "See flexcoll-perf(1).\n", argv0);
  exit(status);
}

static void parse_args(int argc, char **argv) {
  static const struct option longopts[] = {
      {"coll", 1, 0, 'c'}, {"minbytes", 1, 0, 'b'}, {"maxbytes", 1, 0, 'e'}, {"stepfactor", 1, 0, 'f'},
      {"dtype", 1, 0, 'd'}, {"op", 1, 0, 'o'}, {"root", 1, 0, 'r'}, {"warmup", 1, 0, 'w'}, {"iters", 1, 0, 'i'},
      {"nranks", 1, 0, 'n'}, {"memory", 1, 0, 'm'}, {"algo", 1, 0, 'a'}, {"check", 1, 0, 'C'}, {"windows", 1, 0, 'R'}, {"json", 1, 0, 'J'},
      {"baseline", 1, 0, 'B'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "c:b:e:f:d:o:r:w:i:n:m:a:C:R:J:h", longopts, NULL)) != -1) {
    switch (c) {
      case 'c': opts.coll = optarg; break;
      case 'b': opts.minbytes = parse_size(optarg); break;
      case 'e': opts.maxbytes = parse_size(optarg); break;
      case 'f': opts.step = atof(optarg); break;
      case 'd': opts.dtype = fc_dtype_from_name(optarg); if ((int)opts.dtype < 0) usage(argv[0], 2); break;
      case 'o': opts.op = fc_op_from_name(optarg); if ((int)opts.op < 0) usage(argv[0], 2); break;
      case 'r': opts.root = atoi(optarg); break;
      case 'w': opts.warmup = atoi(optarg); break;
      case 'i': opts.iters = atoi(optarg); break;
      case 'n': opts.nranks = atoi(optarg); break;
      case 'm': opts.memory = optarg; break;
      case 'a': if (strcmp(optarg, "auto")) setenv("FLEXCOLL_ALGO", optarg, 1); break;
      case 'C': opts.check = atoi(optarg); break;
      case 'R': opts.windows = atoi(optarg); break;
      case 'J': opts.json = optarg; break;
      case 'B': opts.baseline = optarg; break;
      case 'h': usage(argv[0], 0); break;
      default: usage(argv[0], 2);
    }
  }
  if (perf_coll_from_name(opts.coll) < 0 || opts.step < 1 || opts.iters < 1 || opts.warmup < 0 || opts.minbytes > opts.maxbytes)
    usage(argv[0], 2);
  if (opts.baseline && strcmp(opts.baseline, "nccl")) usage(argv[0], 2);
}

static int launched(void) {
  static const char *vars[] = {"FLEXCOLL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  int ngpus = perf_gpu_count();
  if (!opts.memory) opts.memory = ngpus > 0 ? "device" : "host";
  opts.device = strcmp(opts.memory, "device") == 0;
  if (opts.device && ngpus == 0) {
    fprintf(stderr, "flexcoll-perf: -m device but no GPU is visible; use -m host\n");
    return 2;
  }
  if (launched()) return perf_run_launched(&opts);
  if (opts.nranks <= 0) opts.nranks = opts.device ? ngpus : 2;
  if (opts.device && opts.nranks > ngpus) {
    fprintf(stderr, "flexcoll-perf: -n %d but only %d GPU(s)\n", opts.nranks, ngpus);
    return 2;
  }
  return perf_run_threads(&opts);
}
