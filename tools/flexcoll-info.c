/* flexcoll-info — what flexcoll sees on this machine (GPUs, links, NUMA, RDMA devices) and the
 * settings it would use, from the environment and the built-in defaults. */
#define _GNU_SOURCE
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "flexcoll.h"
#include "bootstrap/net.h"
#include "param.h"
#include "sched/sched.h"
#include "topo.h"
#include "transports/transports.h"
#if HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* The settings' name column: room for the longest name the registry holds. */
#define NAME_WIDTH 38

/* Every parameter of the registry (lib/param.c): its value, where it comes from, and whether
 * the library will accept it — a bad value is otherwise found only at the first communicator,
 * or silently replaced by the default with a warning nobody sees without FLEXCOLL_DEBUG. */
static int settings(void) {
  size_t n = 0;
  const fc_param_def_t *t = fc_param_table(&n);
  int invalid = 0;
  printf("Settings (* the same on every rank):\n");
  for (size_t i = 0; i < n; i++) {
    const char *v = getenv(t[i].name);
    char why[160] = "";
    int bad = v && *v && fc_param_validate(&t[i], v, why, sizeof why);
    const char *shown = !(v && *v) ? t[i].dflt : t[i].kind == FC_PK_SECRET ? "(set)" : v;
    printf("  %-*s%s %-12s %s", NAME_WIDTH, t[i].name, t[i].shared ? "*" : " ", shown, t[i].help);
    if (bad) printf(" (from the environment: INVALID, %s; the default is %s)", why, t[i].dflt);
    else if (v && *v) printf(" (from the environment)");
    printf("\n");
    invalid += bad;
  }
  /* Set, but not a name flexcoll knows: most often a typo of one it does. */
  extern char **environ;
  for (char **e = environ; *e; e++) {
    char name[128];
    const char *eq = strchr(*e, '=');
    if (strncmp(*e, "FLEXCOLL_", 9) || !eq || (size_t)(eq - *e) >= sizeof name) continue;
    snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
    if (!fc_param_find(name) && strcmp(name, "FLEXCOLL_LOCAL_RANK")) {
      printf("  %-*s %-12s UNKNOWN: flexcoll reads no such variable\n", NAME_WIDTH + 1, name, eq + 1);
      invalid++;
    }
  }
  return invalid;
}

/* Why there is no GPU: the CUDA runtime's own reason, or the build. */
static void gpu_reason(int ngpus) {
  if (ngpus > 0) return;
#if HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    printf("  no GPU: CUDA says \"%s\" (%s)%s\n", cudaGetErrorString(e), cudaGetErrorName(e),
           access("/proc/driver/nvidia/version", F_OK) ? "; no NVIDIA driver is loaded" : "");
  else printf("  no GPU: the CUDA runtime sees none%s\n", getenv("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES is set)" : "");
#else
  printf("  no GPU: this flexcoll was built without CUDA (configure --without-cuda, or no CUDA toolkit found)\n");
#endif
}

/* The interface the bootstrap would listen on, as it picks it (lib/bootstrap/net.c). */
static void bootstrap_interface(void) {
  struct sockaddr_storage a;
  socklen_t len = 0;
  char buf[96], name[IF_NAMESIZE + 1] = "?";
  if (fc_bs_pick_interface(&a, &len) != FLEXCOLL_SUCCESS) {
    printf("Bootstrap interface: none: %s\n", flexcoll_get_last_error(NULL));
    return;
  }
  struct ifaddrs *list = NULL;
  if (getifaddrs(&list) == 0)
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != a.ss_family) continue;
      const void *x = a.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&a)->sin_addr
                                             : (const void *)&((struct sockaddr_in6 *)&a)->sin6_addr;
      const void *y = a.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                             : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
      if (!memcmp(x, y, a.ss_family == AF_INET ? 4 : 16)) { snprintf(name, sizeof name, "%s", i->ifa_name); break; }
    }
  if (list) freeifaddrs(list);
  fc_bs_addr_str(&a, len, buf, sizeof buf);
  char *colon = strrchr(buf, ':');
  if (colon) *colon = 0; /* the port is chosen when a root listens */
  printf("Bootstrap interface: %s, address %s%s\n", name, buf,
         getenv("FLEXCOLL_SOCKET_IFNAME") ? " (FLEXCOLL_SOCKET_IFNAME)" : "");
}

/* The link models communicators calibrated on this machine (the cache lib/sched/cost.c keeps):
 * one file per set of hosts, rank count and links (host-... on one host; on several hosts-... for
 * pairs within a host and between-... for pairs between hosts), or per shape of the ring kernels'
 * device lanes (ring-...), the links or lanes named at the end of its key (then "pf" where UCX
 * handles peer failures, which changes shm's models). */
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
    const int pf = strncmp(key, "ring-", 5) && nlinks > 1 && !strcmp(names[nlinks - 1], "pf");
    nlinks -= pf;
    fc_link_model_t m[FC_MAX_LINKS];
    if (nlinks < 1 || fc_cost_cache_load(dir, key, m, nlinks) != FLEXCOLL_SUCCESS) continue;
    printf("  %s%s\n", key,
           !strncmp(key, "ring-", 5)      ? " (the ring kernels' device lanes)"
           : !strncmp(key, "hosts-", 6)   ? " (pairs within a host, of several hosts)"
           : !strncmp(key, "between-", 8) ? " (pairs between hosts)"
                                          : "");
    for (int i = 0; i < nlinks; i++)
      printf("    %-8s alpha %9.2f us  beta %10.1f MB/s\n", names[i], m[i].alpha_us, m[i].beta);
    shown++;
  }
  if (d) closedir(d);
  if (!shown) printf("  none yet: a communicator with two links or more calibrates them at creation\n");
}

int main(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: flexcoll-info [-h|--help]\nPrints devices, links and flexcoll's settings; exit status 1 when a "
           "FLEXCOLL_* setting is invalid. See flexcoll-info(1).\n");
    return 0;
  }
  if (argc > 1) {
    fprintf(stderr, "flexcoll-info: unknown %s '%s' (flexcoll-info takes no options but -h, --help)\n",
            argv[1][0] == '-' ? "option" : "argument", argv[1]);
    return 2;
  }
  int version = 0;
  flexcoll_get_version(&version);
  printf("flexcoll %d.%d.%d (CUDA %s, verbs %s, hwloc %s)\n", version / 10000, version / 100 % 100, version % 100,
         HAVE_CUDA ? "yes" : "no", HAVE_VERBS ? "yes" : "no", HAVE_HWLOC ? "yes" : "no");
  fc_topo_t t;
  fc_topo_discover(&t);
  fc_topo_print(&t, stdout);
  gpu_reason(t.ngpus);
  /* What the rdma link would find: its own loader (libibverbs or FLEXCOLL_VERBS_PROVIDER). */
  fc_rdma_report(stdout);
  bootstrap_interface();
  int invalid = settings();
  cached_links();
  /* The report first: with both streams in one file, a buffered line would be cut by this one. */
  fflush(stdout);
  if (invalid) fprintf(stderr, "flexcoll-info: %d FLEXCOLL_* setting(s) invalid or unknown (see above)\n", invalid);
  return invalid ? 1 : 0;
}
