/* flexcoll-info — what flexcoll sees on this machine (GPUs, links, NUMA, RDMA devices) and the
 * settings it would use, from the environment and the built-in defaults. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "flexcoll.h"
#include "sched/sched.h"
#include "topo.h"

static void setting(const char *var, const char *dflt, const char *what) {
  const char *v = getenv(var);
  printf("  %-28s %-12s %s%s\n", var, v && *v ? v : dflt, what, v && *v ? " (from the environment)" : "");
}

/* The link models communicators calibrated on this machine (the cache lib/sched/cost.c keeps):
 * one file per set of hosts, rank count and links, the links named at the end of its key. */
static void cached_links(void) {
  const char *dir = fc_cost_cache_dir();
  printf("Calibrated links (cache %s):\n", dir ? dir : "none: set FLEXCOLL_CACHE_DIR");
  DIR *d = dir ? opendir(dir) : NULL;
  int shown = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (len < 7 || strcmp(e->d_name + len - 6, ".links")) continue;
    /* The key is host-n<ranks>-<hosts' hash>-<link>-<link>...: the links follow the third dash. */
    char key[256], words[256], *names[FC_MAX_LINKS];
    snprintf(key, sizeof key, "%.*s", (int)(len - 6), e->d_name);
    snprintf(words, sizeof words, "%s", key);
    int nwords = 0, nlinks = 0;
    for (char *save = NULL, *w = strtok_r(words, "-", &save); w; w = strtok_r(NULL, "-", &save))
      if (nwords++ >= 3 && nlinks < FC_MAX_LINKS) names[nlinks++] = w;
    fc_link_model_t m[FC_MAX_LINKS];
    if (nlinks < 1 || fc_cost_cache_load(dir, key, m, nlinks) != FLEXCOLL_SUCCESS) continue;
    printf("  %s\n", key);
    for (int i = 0; i < nlinks; i++)
      printf("    %-8s alpha %9.2f us  beta %10.1f MB/s\n", names[i], m[i].alpha_us, m[i].beta);
    shown++;
  }
  if (d) closedir(d);
  if (!shown) printf("  none yet: a communicator with two links or more calibrates them at creation\n");
}

int main(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: %s\nPrints devices, links and flexcoll's settings. See flexcoll-info(1).\n", argv[0]);
    return 0;
  }
  int version = 0;
  flexcoll_get_version(&version);
  printf("flexcoll %d.%d.%d (CUDA %s, verbs %s, hwloc %s)\n", version / 10000, version / 100 % 100, version % 100,
         HAVE_CUDA ? "yes" : "no", HAVE_VERBS ? "yes" : "no", HAVE_HWLOC ? "yes" : "no");
  fc_topo_t t;
  fc_topo_discover(&t);
  fc_topo_print(&t, stdout);
  printf("Settings:\n");
  setting("FLEXCOLL_ALGO", "auto", "algorithm (ring|tree), else by size");
  setting("FLEXCOLL_NVLINK_ENGINE", "auto", "NVLink engine (sm|ce|auto)");
  setting("FLEXCOLL_ONESHOT_MAX_BYTES", "8M|1M", "device messages up to this size (2 ranks|more) use the one-shot kernels");
  setting("FLEXCOLL_ONESHOT_BLOCKS", "64", "most thread blocks of a plain one-shot kernel (1-128)");
  setting("FLEXCOLL_PIPELINE", "1", "2 ranks, above the one-shot limit, outside windows: pipelined kernels (0: staged)");
  setting("FLEXCOLL_PIPELINE_BLOCKS", "128", "thread blocks of a pipelined kernel (1-128)");
  setting("FLEXCOLL_PIPELINE_THREADS", "512", "threads per block of a pipelined kernel (512|1024)");
  setting("FLEXCOLL_PIPELINE_SUBSLOTS", "2", "staging sub-slots per block of a pipelined kernel (2|4)");
  setting("FLEXCOLL_PIPELINE_PUSH_THREADS", "0", "threads per block that push, the rest reduce (0: a quarter)");
  setting("FLEXCOLL_LL_MAX_BYTES", "65536", "one-shot messages up to this size per rank use the LL protocol");
  setting("FLEXCOLL_DIRECT", "1", "direct mode: 0 never, 1 symmetric windows, 2 also other buffers (host exchange)");
  setting("FLEXCOLL_DIRECT_MIN_BYTES", "1048576", "direct allreduce/allgather/broadcast from this size");
  setting("FLEXCOLL_DIRECT_RS_MIN_BYTES", "33554432", "direct reduce_scatter from this size");
  setting("FLEXCOLL_DIRECT_PIECES", "2", "pieces per rank's chunk in direct allreduce/reduce_scatter");
  setting("FLEXCOLL_GPU_SLICE_SIZE", "4194304", "bytes per device pipeline slice");
  setting("FLEXCOLL_GPU_SLOTS", "8", "staging slots per peer");
  setting("FLEXCOLL_CHUNK_SIZE", "1048576", "bytes per pipeline chunk (tree/chain)");
  setting("FLEXCOLL_SLICE_SIZE", "1048576", "bytes per host transfer slice");
  setting("FLEXCOLL_LINKS", "(all)", "links to use: nvlink,pcie,rdma,shm,tcp; every one that works on all ranks");
  setting("FLEXCOLL_LINK_SHARES", "(balanced)", "fixed fractions per link instead of the balancer, e.g. shm:0.7,tcp:0.3");
  setting("FLEXCOLL_CACHE_DIR", "(XDG cache)", "where calibrated link models are kept");
  setting("FLEXCOLL_UCX_PEER_FAILURE", "1", "UCX reports dead peers (1) or may use faster shared memory (0)");
  setting("FLEXCOLL_TIMEOUT_MS", "300000", "longest wait on a peer");
  setting("FLEXCOLL_BOOTSTRAP_TIMEOUT", "120", "seconds a root waits for its ranks");
  setting("FLEXCOLL_SOCKET_IFNAME", "(first up)", "bootstrap interface");
  /* Its value is never printed. */
  const char *secret = getenv("FLEXCOLL_BOOTSTRAP_SECRET");
  printf("  %-28s %-12s %s\n", "FLEXCOLL_BOOTSTRAP_SECRET", secret && *secret ? "(set)" : "(job id)",
         "mixed into launcher jobs' magic");
  cached_links();
  return 0;
}
