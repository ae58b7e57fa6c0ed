/* flexcoll-perf — sweep message sizes for one collective and report time, algbw and busbw the
 * way nccl-tests does, checking every result.  Under a launcher (FLEXCOLL_RANK, torchrun, mpirun,
 * srun) each process is one rank; alone, it starts its ranks as threads of this process (-t, -g,
 * --nranks).  The options are read in perf_args.c.
 * --baseline nccl runs the same sweep through the machine's NCCL (dlopen, never linked). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "flexcoll.h"
#include "perf.h"

static perf_opts_t opts = {
    .coll = "allreduce", .minbytes = 8, .maxbytes = 64 << 20, .step = 2, .dtype = FLEXCOLL_FLOAT32,
    .op = FLEXCOLL_SUM, .root = 0, .warmup = 5, .iters = 20, .nranks = 0, .memory = NULL, .check = 1, .windows = -1,
    .moe_hidden = 7168, .moe_top_k = 8, .moe_experts = 256, .moe_tokens = 4096, .moe_sync = FLEXCOLL_MOE_AUTO,
};

static int launched(void) {
  static const char *vars[] = {"FLEXCOLL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return 1;
  return 0;
}

/* The rank count of a run without a launcher: --nranks, or -t threads of -g GPUs each as in
 * nccl-tests, or by default every GPU (device memory) or 2 (host memory). */
static void set_rank_count(int ngpus) {
  if (!opts.device && opts.ngpus)
    perf_usage_error("-g (--ngpus) %d: GPUs per thread, but the buffers are in host memory; -t sets the host ranks",
                     opts.ngpus);
  /* --nranks may exceed the GPUs (ranks share them round-robin); -t and -g name GPUs that must exist. */
  const int shared_ok = opts.nranks != 0;
  if (!opts.nranks && (opts.nthreads || opts.ngpus))
    opts.nranks = (opts.nthreads ? opts.nthreads : 1) * (opts.ngpus ? opts.ngpus : 1);
  if (!opts.nranks) opts.nranks = opts.device ? ngpus : 2;
  if (opts.device && opts.nranks > ngpus && !shared_ok)
    perf_usage_error("%d ranks on device memory, but %d GPU(s) are visible (--nranks lets ranks share GPUs)",
                     opts.nranks, ngpus);
}

int main(int argc, char **argv) {
  perf_parse_args(argc, argv, &opts);
  int ngpus = perf_gpu_count();
  if (!opts.memory) opts.memory = ngpus > 0 ? "device" : "host";
  opts.device = strcmp(opts.memory, "device") == 0;
  /* Windows by default on device memory only: host programs (and MPI, the host baseline) have
   * plain buffers; -R 1 takes them from flexcoll_host_alloc. */
  if (opts.windows < 0) opts.windows = opts.device;
  if (opts.device && ngpus == 0) perf_usage_error("-m (--memory) device, but no GPU is visible: use -m host");
  if (opts.graph && !opts.device)
    perf_usage_error("-G %d: a CUDA graph captures device work, and the buffers are in host memory", opts.graph);
  if (perf_coll_is_moe(perf_coll_from_name(opts.coll)) && !opts.device)
    perf_usage_error("--coll %s: MoE dispatch and combine move device memory: use -m device (a GPU per rank)", opts.coll);
  if (launched()) {
    if (opts.nranks > 1 || opts.nthreads > 1 || opts.ngpus > 1)
      perf_usage_error("under a launcher every process is one rank: -t, -g and --nranks above 1 do not apply");
    return perf_run_launched(&opts);
  }
  set_rank_count(ngpus);
  if (opts.root >= opts.nranks)
    perf_usage_error("-r (--root) %d: the root must be below the rank count, %d", opts.root, opts.nranks);
  return perf_run_threads(&opts);
}
