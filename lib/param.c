/* param.c — FLEXCOLL_* environment parameters: the registry of them all, read once and logged. */
#define _GNU_SOURCE
#include "param.h"

#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <strings.h>

#include "error.h"
#include "log.h"

#define BIG ((int64_t)1 << 40)
#define INT_MAX_ 2147483647

/* Integer defaults are written as the FC_PARAM_INT users write them (fc_param_int_load warns when
 * the two disagree); a default that depends on the run is text ("8M|1M"), with the code's
 * sentinel in the macro.  shared: the variables whose difference between ranks would make them
 * build different schedules (rank 0 refuses the communicator, comm.c). */
static const fc_param_def_t table[] = {
    /* name, kind, default, description, shared, min, max, choices */
    {"FLEXCOLL_DEBUG", FC_PK_WORDI, "NONE", "log level; VERSION prints the version once", 0, 0, 0,
     "NONE|VERSION|WARN|INFO|TRACE"},
    {"FLEXCOLL_DEBUG_SUBSYS", FC_PK_TEXT, "ALL", "subsystems logged: INIT,BOOT,COLL,NET,ENV,TUNE,GPU,SCHED; ^ excludes", 0, 0, 0, NULL},
    {"FLEXCOLL_DEBUG_FILE", FC_PK_TEXT, "(stderr)", "log file; %h host, %p pid", 0, 0, 0, NULL},
    {"FLEXCOLL_ALGO", FC_PK_WORD, "(by size)", "algorithm for every collective", 1, 0, 0, "ring|tree|exchange"},
    {"FLEXCOLL_ONESHOT_MAX_BYTES", FC_PK_INT, "8M|1M", "device messages up to this size (2 ranks|more) use the one-shot kernels",
     1, -1, BIG, NULL},
    {"FLEXCOLL_ONESHOT_BLOCKS", FC_PK_INT, "64", "most thread blocks of a plain one-shot kernel", 1, 1, 128, NULL},
    {"FLEXCOLL_PIPELINE", FC_PK_INT, "1", "2 ranks, above the one-shot limit, outside windows: pipelined kernels (0: ring kernels)",
     1, 0, 1, NULL},
    {"FLEXCOLL_PIPELINE_BLOCKS", FC_PK_INT, "128", "thread blocks of a pipelined kernel", 1, 1, 128, NULL},
    {"FLEXCOLL_PIPELINE_THREADS", FC_PK_INT, "512", "threads per block of a pipelined kernel", 0, 0, 0, "512|1024"},
    {"FLEXCOLL_PIPELINE_SUBSLOTS", FC_PK_INT, "2", "staging sub-slots per block of a pipelined kernel", 1, 0, 0, "2|4"},
    {"FLEXCOLL_PIPELINE_PUSH_THREADS", FC_PK_INT, "0", "threads per block that push, the rest reduce (0: a quarter)", 0, 0,
     992, NULL},
    {"FLEXCOLL_RING_KERNEL", FC_PK_INT, "1", "device collectives above the one-shot limit: ring and alltoall kernels (0: schedules)", 1, 0, 1,
     NULL},
    {"FLEXCOLL_RING_BLOCKS", FC_PK_INT, "32", "most thread blocks of a ring kernel (fewer where ranks share a GPU)", 1, 1, 128,
     NULL},
    {"FLEXCOLL_RING_SUBSLOTS", FC_PK_INT, "2", "messages in flight per block between ring neighbours", 1, 2, 8, NULL},
    {"FLEXCOLL_RING_AREA_BYTES", FC_PK_INT, "16777216", "bytes of each rank's ring staging area", 1, 65536, BIG, NULL},
    {"FLEXCOLL_PCIE_AREA_BYTES", FC_PK_INT, "4M|32M", "bytes of each rank's host ring area (the pcie link; engine sm|ce)", 1, 65536, BIG,
     NULL},
    {"FLEXCOLL_PCIE_BLOCKS", FC_PK_INT, "16|4", "most thread blocks of a ring kernel on the pcie link (engine sm|ce)", 1, 1, 64, NULL},
    {"FLEXCOLL_PCIE_ENGINE", FC_PK_WORD, "sm", "what moves the pcie link's bytes: the ring kernel (sm) or copy engines driven by a proxy thread (ce)",
     1, 0, 0, "sm|ce"},
    {"FLEXCOLL_PCIE_CE_READY", FC_PK_WORD, "device",
     "engine ce: where the ring kernel waits for its incoming messages, device memory (device) or the host area (host)", 0, 0, 0,
     "device|host"},
    {"FLEXCOLL_RING_LANE", FC_PK_WORDS, "pcie",
     "what carries the ring kernels' lanes beside NVLink: host memory (pcie), the rdma link, device to device (rdma), or "
     "both (pcie,rdma)",
     1, 0, 0, "pcie|rdma"},
    {"FLEXCOLL_RING_LANE_INBAND", FC_PK_INT, "0",
     "ring lane over a link: descriptors and acknowledgements over the link too, within one host as well (1)", 1, 0, 1,
     NULL},
    {"FLEXCOLL_RING_HOPS", FC_PK_INT, "1",
     "ranks on several hosts with the rdma ring lane: NVLink between the ranks of a host, the link only between hosts (0: "
     "every hop over the link)",
     1, 0, 1, NULL},
    {"FLEXCOLL_LANE_STAGE2_BYTES", FC_PK_INT, "16777216",
     "device ring calls from this size (count x type size) are timed and move the nvlink/pcie split (0: never)", 1, 0, BIG,
     NULL},
    {"FLEXCOLL_LL_MAX_BYTES", FC_PK_INT, "65536", "one-shot messages up to this size per rank use the LL protocol", 1, 0, BIG,
     NULL},
    {"FLEXCOLL_DIRECT", FC_PK_INT, "1", "direct mode: 0 never, 1 symmetric windows, 2 also other buffers", 1, 0, 2, NULL},
    {"FLEXCOLL_DIRECT_MIN_BYTES", FC_PK_INT, "1048576", "direct allreduce/allgather/broadcast from this size", 1, 0, BIG, NULL},
    {"FLEXCOLL_DIRECT_RS_MIN_BYTES", FC_PK_INT, "33554432", "direct reduce_scatter from this size", 1, 0, BIG, NULL},
    {"FLEXCOLL_DIRECT_PIECES", FC_PK_INT, "2", "pieces per rank's chunk in direct allreduce/reduce_scatter", 0, 1, 64, NULL},
    {"FLEXCOLL_DIRECT_PIECE_BYTES", FC_PK_INT, "67108864", "largest piece of a direct collective", 0, 1, BIG, NULL},
    {"FLEXCOLL_CHUNK_SIZE", FC_PK_INT, "1048576", "bytes per pipeline chunk (tree/chain)", 1, 1, BIG, NULL},
    {"FLEXCOLL_SLICE_SIZE", FC_PK_INT, "1048576", "bytes per host transfer slice", 1, 1, BIG, NULL},
    {"FLEXCOLL_SHM_DIRECT", FC_PK_INT, "1",
     "host collectives of ranks on one host through a shared-memory segment of the communicator (0: through the links)", 1,
     0, 1, NULL},
    {"FLEXCOLL_SHM_SLOT_BYTES", FC_PK_INT, "262144", "bytes of each of a rank's 4 slots in that segment (a multiple of 4096)",
     1, 4096, 1 << 30, NULL},
    {"FLEXCOLL_SHM_THREADS", FC_PK_INT, "0",
     "threads per rank (the caller's included) for the copies and folds of a large shared-memory allreduce; "
     "0: the rank's share of the cores it may run on, at most 4 (1 where bound to one core or crowded)", 0, 0, 32, NULL},
    {"FLEXCOLL_SHM_THREADS_MIN_BYTES", FC_PK_INT, "1048576",
     "shared-memory allreduce from this size uses those threads", 0, 0, BIG, NULL},
    {"FLEXCOLL_SHM_NT_MIN_BYTES", FC_PK_INT, "-1",
     "shared-memory allreduce (split or window mode) from this size writes its output with non-temporal stores; -1: from the "
     "last-level cache's size / (2 x ranks)", 0, -1, BIG, NULL},
    {"FLEXCOLL_SHM_SPLIT_MIN_BYTES", FC_PK_INT, "64K|1M",
     "shared-memory allreduce from this size: reduce-scatter + allgather (below: every rank folds every input); "
     "default 64K with a core per rank, 1M where ranks outnumber cores", 1, 0, BIG,
     NULL},
    {"FLEXCOLL_SHM_WINDOW_MIN_BYTES", FC_PK_INT, "1K|4K|8K|1M",
     "shared-memory collectives on buffers in host windows (flexcoll_host_alloc) from this size read and write the "
     "peers' buffers in place; default with a core per rank 1K (allreduce, reduce_scatter), 4K (broadcast) or 8K "
     "(allgather), the split's threshold (1M) where ranks outnumber cores", 1, -1, BIG, NULL},
    {"FLEXCOLL_LINKS", FC_PK_LINKS, "(all)", "links to use: nvlink,pcie,rdma,shm,tcp; every one that works on all ranks (rdma: between those that have it)", 1, 0,
     0, NULL},
    {"FLEXCOLL_HIERARCHY", FC_PK_INT, "1", "ranks on several hosts: host rings and trees host by host, allreduce, allgather and reduce_scatter in two dimensions (0: rank order)",
     1, 0, 1, NULL},
    {"FLEXCOLL_ALLGATHER_2D_MAX_BYTES", FC_PK_INT, "-1",
     "host allgather over hosts of equally many ranks in two dimensions up to this size (larger: the flat ring); -1: "
     "up to 1M, and beyond where the link models predict it faster", 1, -1, BIG, NULL},
    {"FLEXCOLL_REDUCE_SCATTER_2D_MAX_BYTES", FC_PK_INT, "-1",
     "host reduce_scatter over hosts of equally many ranks in two dimensions up to this size (larger: the flat ring); "
     "-1: up to 4M, and beyond where the link models predict it faster", 1, -1, BIG, NULL},
    {"FLEXCOLL_HOSTID", FC_PK_TEXT, "(the host name)",
     "this rank's host as flexcoll compares hosts (as NCCL_HOSTID): ranks with equal ids share memory, peer access "
     "and shm, others reach each other over tcp or rdma", 0, 0, 0, NULL},
    {"FLEXCOLL_LINK_SHARES", FC_PK_SHARES, "(balanced)", "fixed fractions per link instead of the balancer, e.g. shm:0.7,tcp:0.3",
     1, 0, 0, NULL},
    {"FLEXCOLL_VERBS_PROVIDER", FC_PK_TEXT, "(libibverbs.so.1)", "the rdma link's verbs library: a path, or fake (the test suite's)", 0,
     0, 0, NULL},
    {"FLEXCOLL_VERBS_FAKE_LIB", FC_PK_TEXT, "(unset)", "the test suite's fake verbs provider, for FLEXCOLL_VERBS_PROVIDER=fake", 0,
     0, 0, NULL},
    {"FLEXCOLL_VERBS_FAKE_FAULT", FC_PK_TEXT, "(none)", "faults the fake verbs provider injects: post:N,drop:N,kill:N,portdown:N,regfail:N,delay:MS,nodev,nodev@R,fewer@R:M,noodp,pinned",
     0, 0, 0, NULL},
    {"FLEXCOLL_VERBS_FAKE_DEVICES", FC_PK_INT, "1", "how many devices the fake verbs provider presents", 0, 1, 8, NULL},
    {"FLEXCOLL_VERBS_FAKE_GIDS", FC_PK_INT, "1", "how many GID entries each fake port has (fe80:: v1, v2, fd00:: v1, v2)", 0, 1, 4, NULL},
    {"FLEXCOLL_VERBS_FAKE_PLACES", FC_PK_TEXT, "(node 0, a root port each)",
     "the fake verbs provider's devices' places, device by device: node[:root port],...", 0, 0, 0, NULL},
    {"FLEXCOLL_VERBS_FAKE_SYSFS", FC_PK_TEXT, "(none)",
     "where the fake verbs provider lays out its devices' sysfs-like PCI places (unset: unknown)", 0, 0, 0, NULL},
    {"FLEXCOLL_RDMA_ZCOPY_BYTES", FC_PK_INT, "262144",
     "rdma link: messages from this size are written straight into the receive buffer (rendezvous; 0: never)", 0, 0, BIG,
     NULL},
    {"FLEXCOLL_RDMA_RCACHE_BYTES", FC_PK_INT, "1073741824",
     "rdma link: most bytes of user buffers kept registered between rendezvous messages, host and device apart "
     "(0: register per message)",
     0, 0, BIG, NULL},
    {"FLEXCOLL_RDMA_RCACHE_PINNED", FC_PK_INT, "0",
     "rdma link: keep pinned registrations too (1: buffers given to flexcoll are never unmapped while it runs)", 0, 0, 1,
     NULL},
    {"FLEXCOLL_RDMA_PROGRESS_THREAD", FC_PK_INT, "1", "rdma: a thread per link polls completions and events between calls (0: in calls only)", 0, 0, 1, NULL},
    {"FLEXCOLL_TCP_PROGRESS_THREAD", FC_PK_INT, "1", "tcp: a thread per link moves what UCX still holds between calls, once the link carries something (0: in calls only)", 0, 0, 1, NULL},
    {"FLEXCOLL_IB_GID_INDEX", FC_PK_INT, "-1", "RoCE: the GID table entry of the rdma links' ports (-1: a RoCE v2 one, IPv4-mapped first)", 0, -1, 255, NULL},
    {"FLEXCOLL_IB_HCA", FC_PK_TEXT, "(nearest)", "RDMA devices of the rdma links (one rail each): a comma list of name or name:port", 0, 0, 0, NULL},
    {"FLEXCOLL_MEM_TYPE_CACHE", FC_PK_INT, "1",
     "remember buffers CUDA called host memory until something is unmapped (0: ask CUDA at every call)", 0, 0, 1, NULL},
    {"FLEXCOLL_CACHE_DIR", FC_PK_TEXT, "(XDG cache)", "where calibrated link models are kept", 0, 0, 0, NULL},
    {"FLEXCOLL_UCX_CUDA", FC_PK_INT, "1",
     "shm and tcp take device buffers through UCX's CUDA transports where UCX has them (1; tcp between processes "
     "only with FLEXCOLL_UCX_PEER_FAILURE=0), or host memory only (0)",
     1, 0, 1, NULL},
    {"FLEXCOLL_UCX_PEER_FAILURE", FC_PK_INT, "1", "UCX reports dead peers, shm without cross-memory attach (1), or may use it, unsafe (0)", 0, 0, 1,
     NULL},
    {"FLEXCOLL_TIMEOUT_MS", FC_PK_INT, "300000", "longest wait on a peer in ms (0 or less: no limit)", 0, -INT_MAX_, INT_MAX_, NULL},
    {"FLEXCOLL_BOOTSTRAP_TIMEOUT", FC_PK_INT, "120", "seconds a root waits for its ranks (0 or less: no limit)", 0, -INT_MAX_, INT_MAX_, NULL},
    {"FLEXCOLL_SOCKET_IFNAME", FC_PK_TEXT, "(first up)", "bootstrap interface: names or prefixes, ^ excludes, = exact", 0, 0,
     0, NULL},
    {"FLEXCOLL_RANK", FC_PK_INT, "(launcher)", "this process's rank (flexcoll_comm_init_from_env)", 0, 0, INT_MAX_, NULL},
    {"FLEXCOLL_NRANKS", FC_PK_INT, "(launcher)", "the rank count (flexcoll_comm_init_from_env)", 0, 1, INT_MAX_, NULL},
    {"FLEXCOLL_ROOT", FC_PK_HOSTPORT, "(MASTER_ADDR)", "the bootstrap root's host:port", 0, 0, 0, NULL},
    {"FLEXCOLL_BOOTSTRAP_SECRET", FC_PK_SECRET, "(job id)", "mixed into launcher jobs' magic", 0, 0, 0, NULL},
};
#define NTABLE (sizeof table / sizeof table[0])

const fc_param_def_t *fc_param_table(size_t *n) {
  *n = NTABLE;
  return table;
}

const fc_param_def_t *fc_param_find(const char *name) {
  for (size_t i = 0; i < NTABLE; i++)
    if (!strcmp(table[i].name, name)) return &table[i];
  return NULL;
}

/* word is one of "a|b|c". */
static int in_choices(const char *choices, const char *word, int ignore_case, int numeric) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", choices);
  int64_t v = 0, c = 0;
  if (numeric && fc_parse_int(word, &v)) return 0;
  for (char *save = NULL, *tok = strtok_r(buf, "|", &save); tok; tok = strtok_r(NULL, "|", &save)) {
    if (numeric ? (!fc_parse_int(tok, &c) && c == v) : ignore_case ? !strcasecmp(tok, word) : !strcmp(tok, word)) return 1;
  }
  return 0;
}

/* A comma list whose items are each a link name, followed by ":fraction" in [0, 1] when shares. */
static int link_list_ok(const char *value, int shares, char *why, size_t len) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", value);
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    char *colon = strchr(tok, ':'), *end = NULL;
    if (shares) {
      double f = colon ? strtod(colon + 1, &end) : -1;
      if (!colon || end == colon + 1 || *end || !(f >= 0 && f <= 1))
        return snprintf(why, len, "\"%s\" is not link:fraction in [0, 1]", tok), -1;
      *colon = 0;
    }
    if (!in_choices("nvlink|pcie|rdma|shm|tcp", tok, 0, 0))
      return snprintf(why, len, "\"%s\" is not a link (nvlink, pcie, rdma, shm, tcp)", tok), -1;
  }
  return 0;
}

/* A comma list of at least one word, each one of choices, none twice. */
static int word_list_ok(const char *choices, const char *value, char *why, size_t len) {
  char buf[256], seen[256] = ",";
  snprintf(buf, sizeof buf, "%s", value);
  int words = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save), words++) {
    char item[80];
    snprintf(item, sizeof item, ",%s,", tok);
    if (!in_choices(choices, tok, 0, 0)) return snprintf(why, len, "\"%s\" is not %s", tok, choices), -1;
    if (strstr(seen, item)) return snprintf(why, len, "\"%s\" is named twice", tok), -1;
    snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s,", tok);
  }
  if (!words) return snprintf(why, len, "names none of %s", choices), -1;
  return 0;
}

int fc_param_validate(const fc_param_def_t *p, const char *value, char *why, size_t len) {
  int64_t v = 0;
  const char *colon;
  switch (p->kind) {
    case FC_PK_INT:
      if (fc_parse_int(value, &v)) return snprintf(why, len, "not an integer"), -1;
      if (p->choices && !in_choices(p->choices, value, 0, 1)) return snprintf(why, len, "not %s", p->choices), -1;
      if (!p->choices && (v < p->min || v > p->max))
        return snprintf(why, len, "not in %lld..%lld", (long long)p->min, (long long)p->max), -1;
      return 0;
    case FC_PK_WORD:
    case FC_PK_WORDI:
      if (!in_choices(p->choices, value, p->kind == FC_PK_WORDI, 0)) return snprintf(why, len, "not %s", p->choices), -1;
      return 0;
    case FC_PK_WORDS: return word_list_ok(p->choices, value, why, len);
    case FC_PK_LINKS: return link_list_ok(value, 0, why, len);
    case FC_PK_SHARES: return link_list_ok(value, 1, why, len);
    case FC_PK_HOSTPORT:
      colon = strrchr(value, ':');
      if (!colon || colon == value || fc_parse_int(colon + 1, &v) || v < 1 || v > 65535)
        return snprintf(why, len, "not host:port"), -1;
      return 0;
    default: return 0;
  }
}

/* A FC_PARAM_INT whose name or default the table does not have: the table is out of date. */
static void check_registered(const char *env, int64_t dflt) {
  const fc_param_def_t *p = fc_param_find(env);
  int64_t t;
  if (!p) FC_WARN("%s is not in the parameter registry (lib/param.c)", env);
  else if (!fc_parse_int(p->dflt, &t) && t != dflt)
    FC_WARN("%s: the registry's default %s is not the code's %lld (lib/param.c)", env, p->dflt, (long long)dflt);
}

int64_t fc_param_int_load(const char *env, int64_t dflt, int64_t *cache, int *state) {
  if (__atomic_load_n(state, __ATOMIC_ACQUIRE) == 2) return *cache;
  int64_t value = dflt;
  check_registered(env, dflt);
  const char *s = getenv(env);
  if (s && *s) {
    int64_t v = 0;
    if (fc_parse_int(s, &v)) {
      FC_WARN("%s=\"%s\" is not an integer; using the default %lld", env, s, (long long)dflt);
    } else {
      value = v;
      FC_INFO(FC_SUB_ENV, "%s set to %lld", env, (long long)v);
    }
  }
  /* Racing first readers compute the same value; publishing it twice is harmless. */
  *cache = value;
  __atomic_store_n(state, 2, __ATOMIC_RELEASE);
  return value;
}

const char *fc_param_str(const char *env, const char *dflt) {
  if (fc_log_level() >= FC_LOG_WARN && !fc_param_find(env))
    FC_WARN("%s is not in the parameter registry (lib/param.c)", env);
  const char *s = getenv(env);
  if (s && *s) {
    FC_INFO(FC_SUB_ENV, "%s set to %s", env, s);
    return s;
  }
  return dflt;
}

flexcoll_result_t fc_param_check(flexcoll_comm_t comm, const char *name) {
  const char *s = getenv(name);
  const fc_param_def_t *d = fc_param_find(name);
  char why[120];
  if (s && *s && d && fc_param_validate(d, s, why, sizeof why))
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s=%s: %s", name, s, why);
  return FLEXCOLL_SUCCESS;
}
