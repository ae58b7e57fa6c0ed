/* rdma_dev.c — the RDMA devices a rank takes (rails) and flexcoll-info's report (rdma_dev.h).
 *
 * Distances come from the PCI tree in sysfs (a device's ibdev_path/device is its PCI function,
 * /sys/bus/pci/devices/<bus id> a GPU's): the same tree hwloc reads for its PCI objects, read
 * directly so that a verbs provider's own ibdev_path (the test suite's fake presents a tree of its
 * own) is followed exactly as a real one.  The rank's NUMA node comes from hwloc (the node of the
 * CPUs it is bound to, else of the CPU it runs on). */
#define _GNU_SOURCE
#include "config.h"

#if HAVE_VERBS_H
#include "rdma_dev.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "param.h"
#include "transports.h"

#if HAVE_HWLOC
#include <hwloc.h>
#endif
#if HAVE_CUDA
#include <cuda_runtime.h>
#endif

const char *fc_rdma_mtu_name(enum ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return "256";
    case IBV_MTU_512: return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
    default: return "?";
  }
}

/* Gb/s per lane of ibv_port_attr.active_speed, times the lanes of active_width. */
double fc_rdma_port_gbps(const struct ibv_port_attr *a) {
  double lane = 0;
  switch (a->active_speed) {
    case 1: lane = 2.5; break;
    case 2: lane = 5; break;
    case 4: case 8: lane = 10; break;
    case 16: lane = 14; break;
    case 32: lane = 25; break;
    case 64: lane = 50; break;
    case 128: lane = 100; break;
    default: lane = 0;
  }
  int lanes = a->active_width == 1 ? 1 : a->active_width == 2 ? 4 : a->active_width == 4 ? 8 : a->active_width == 8 ? 12
              : a->active_width == 16 ? 2 : 0;
  return lane * lanes;
}

/* ---- PCI places --------------------------------------------------------------------------------- */

int fc_pci_hops(const char *a, const char *b) {
  if (!a || !b || !*a || !*b) return FC_RDMA_FAR;
  /* Component by component: the common prefix ends at the deepest shared bridge. */
  size_t i = 0, last = 0;
  while (a[i] && a[i] == b[i]) {
    if (a[i] == '/') last = i;
    i++;
  }
  if (!a[i] && !b[i]) return 0;
  if ((!a[i] && b[i] == '/') || (!b[i] && a[i] == '/')) last = i;
  int hops = 0;
  for (const char *p = a + last; *p; p++) hops += *p == '/';
  for (const char *p = b + last; *p; p++) hops += *p == '/';
  return hops;
}

void fc_pci_root_port(const char *path, char *out, size_t len) {
  out[0] = 0;
  /* .../pciDDDD:BB/<root port>/...: the host bridge, then the root port below it. */
  const char *host = strstr(path, "/pci");
  if (!host) return;
  const char *rp = strchr(host + 1, '/');
  if (!rp) return;
  const char *end = strchr(rp + 1, '/');
  size_t n = end ? (size_t)(end - path) : strlen(path);
  if (n + 1 > len) return;
  memcpy(out, path, n);
  out[n] = 0;
}

/* ---- GIDs ------------------------------------------------------------------------------------ */

static int gid_empty(const union ibv_gid *g) {
  for (int i = 0; i < 16; i++)
    if (g->raw[i]) return 0;
  return 1;
}

static int gid_ipv4_mapped(const union ibv_gid *g) {
  for (int i = 0; i < 10; i++)
    if (g->raw[i]) return 0;
  return g->raw[10] == 0xff && g->raw[11] == 0xff;
}

static int gid_link_local(const union ibv_gid *g) { return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80; }

int fc_rdma_pick_gid(const union ibv_gid *gids, const int *types, int n, int want) {
  if (!gids || !types || n <= 0) return -1;
  if (want >= 0) return want < n && !gid_empty(&gids[want]) ? want : -1;
  int best = -1, best_rank = 0;
  for (int i = 0; i < n; i++) {
    if (gid_empty(&gids[i])) continue;
    /* 4: v2 IPv4-mapped; 3: v2 global IPv6; 2: v2 link-local; 1: any other (the first there is) */
    const int rank = types[i] == 2 ? (gid_ipv4_mapped(&gids[i]) ? 4 : gid_link_local(&gids[i]) ? 2 : 3) : 1;
    if (rank > best_rank) best = i, best_rank = rank;
  }
  return best;
}

/* Entry idx's type from sysfs: 2 RoCE v2, 1 v1 or IB, 0 unknown. */
static int gid_type(const char *ibdev_path, int port, int idx) {
  if (!ibdev_path || !ibdev_path[0]) return 0;
  char fn[PATH_MAX], buf[64] = "";
  snprintf(fn, sizeof fn, "%s/ports/%d/gid_attrs/types/%d", ibdev_path, port, idx);
  FILE *f = fopen(fn, "r");
  if (!f) return 0;
  const int got = fgets(buf, sizeof buf, f) != NULL;
  fclose(f);
  if (!got) return 0;
  if (strstr(buf, "RoCE v2")) return 2;
  return strstr(buf, "v1") || strstr(buf, "IB") ? 1 : 0;
}

FC_PARAM_INT(ib_gid_index, "IB_GID_INDEX", -1)

int fc_rdma_gid_index_wanted(void) { return (int)fc_param_ib_gid_index(); }

/* A real table has up to a few hundred entries; a rank reads this many at most. */
#define FC_RDMA_MAX_GIDS 256

int fc_rdma_port_gid(const fc_verbs_t *v, struct ibv_context *ctx, const char *ibdev_path, int port,
                     const struct ibv_port_attr *pa, int want, union ibv_gid *gid, int *type, char *why, size_t len) {
  const int n = pa->gid_tbl_len < FC_RDMA_MAX_GIDS ? pa->gid_tbl_len : FC_RDMA_MAX_GIDS;
  union ibv_gid *gids = calloc(n > 0 ? (size_t)n : 1, sizeof *gids);
  int *types = calloc(n > 0 ? (size_t)n : 1, sizeof *types);
  int idx = -1;
  if (!gids || !types) {
    snprintf(why, len, "out of memory");
    goto out;
  }
  /* Only the entries that can be chosen are read: the one named (if the table has it), else all. */
  const int first = want >= 0 ? want : 0, end = want < 0 ? n : want < n ? want + 1 : 0;
  for (int i = first; i < end; i++) {
    if (v->query_gid(ctx, (uint8_t)port, i, &gids[i])) memset(&gids[i], 0, sizeof gids[i]);
    types[i] = gid_type(ibdev_path, port, i);
  }
  idx = fc_rdma_pick_gid(gids, types, n, want);
  if (idx < 0) {
    if (want >= 0)
      snprintf(why, len, "FLEXCOLL_IB_GID_INDEX=%d: port %d's GID table has %d entries%s", want, port, n,
               want < n ? ", and that one is empty" : "");
    else
      snprintf(why, len, "port %d has no GID (a table of %d entries, all empty)", port, n);
    goto out;
  }
  *gid = gids[idx];
  *type = types[idx];
out:
  free(gids);
  free(types);
  return idx;
}

void fc_rdma_gid_text(const union ibv_gid *g, char *out, size_t len) {
  if (gid_ipv4_mapped(g)) {
    snprintf(out, len, "::ffff:%u.%u.%u.%u", g->raw[12], g->raw[13], g->raw[14], g->raw[15]);
    return;
  }
  size_t k = 0;
  for (int i = 0; i < 16 && k < len; i += 2)
    k += (size_t)snprintf(out + k, len - k, "%s%x", i ? ":" : "", (unsigned)(g->raw[i] << 8 | g->raw[i + 1]));
}

const char *fc_rdma_gid_type_name(int type) { return type == 2 ? "RoCE v2" : type == 1 ? "RoCE v1 or IB" : "type unknown"; }

static void read_pci(const char *sysdir, char *pci, size_t len, int *numa) {
  char p[PATH_MAX + 16], real[PATH_MAX];
  pci[0] = 0;
  *numa = -1;
  if (!sysdir || !*sysdir) return;
  snprintf(p, sizeof p, "%s/device", sysdir);
  if (!realpath(p, real)) return;
  snprintf(pci, len, "%s", real);
  snprintf(p, sizeof p, "%s/numa_node", real);
  FILE *f = fopen(p, "r");
  if (f) {
    if (fscanf(f, "%d", numa) != 1) *numa = -1;
    fclose(f);
  }
}

/* The sysfs path of CUDA device gpu's PCI function, "" without one. */
static void gpu_pci(int gpu, char *out, size_t len) {
  out[0] = 0;
#if HAVE_CUDA
  char id[32], p[64], real[PATH_MAX];
  if (gpu < 0 || cudaDeviceGetPCIBusId(id, sizeof id, gpu) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  for (char *c = id; *c; c++) *c = (char)(*c >= 'A' && *c <= 'F' ? *c - 'A' + 'a' : *c);
  snprintf(p, sizeof p, "/sys/bus/pci/devices/%s", id);
  if (realpath(p, real)) snprintf(out, len, "%s", real);
#else
  (void)gpu, (void)len;
#endif
}

/* The NUMA node of the CPUs this thread may run on (the one it runs on where they span several),
 * -1 when unknown. */
static int my_numa_node(void) {
  int node = -1;
#if HAVE_HWLOC
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) == 0) {
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc(), nodes = hwloc_bitmap_alloc();
    if (cpus && nodes && hwloc_topology_load(t) == 0 && hwloc_get_cpubind(t, cpus, HWLOC_CPUBIND_THREAD) == 0) {
      hwloc_cpuset_to_nodeset(t, cpus, nodes);
      if (hwloc_bitmap_weight(nodes) != 1 && hwloc_get_last_cpu_location(t, cpus, HWLOC_CPUBIND_THREAD) == 0)
        hwloc_cpuset_to_nodeset(t, cpus, nodes);
      if (hwloc_bitmap_weight(nodes) >= 1) node = hwloc_bitmap_first(nodes);
    }
    if (cpus) hwloc_bitmap_free(cpus);
    if (nodes) hwloc_bitmap_free(nodes);
    hwloc_topology_destroy(t);
  }
#endif
  if (node < 0) {
    unsigned cpu = 0, n = 0;
    if (getcpu(&cpu, &n) == 0) node = (int)n;
  }
  return node;
}

/* ---- FLEXCOLL_IB_HCA ---------------------------------------------------------------------------- */

/* Position of (dev, port) in FLEXCOLL_IB_HCA's comma list of name or name:port; *explicit_port
 * when the item names the port.  Unset: 0 for every device.  -1: not named. */
static int hca_pos(const char *dev, int port, int *explicit_port) {
  const char *s = fc_param_str("FLEXCOLL_IB_HCA", NULL);
  *explicit_port = 0;
  if (!s) return 0;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", s);
  int i = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save), i++) {
    size_t n = strcspn(tok, ":");
    if (strlen(dev) != n || strncmp(tok, dev, n)) continue;
    if (tok[n] != ':') return i;
    if (atoi(tok + n + 1) == port) return *explicit_port = 1, i;
  }
  return -1;
}

/* ---- the rails ---------------------------------------------------------------------------------- */

typedef struct {
  fc_rdma_cand_t c;
  int order; /* FLEXCOLL_IB_HCA position, else the device's index */
} ranked_t;

/* Every active port a rank may take (one per device unless FLEXCOLL_IB_HCA names ports), with its
 * distance; *n_out of them.  why: the reason when there is none. */
static ranked_t *candidates(const fc_verbs_t *v, struct ibv_device **list, int n, int gpu, int *n_out, char *why,
                            size_t len) {
  const int hca = fc_param_str("FLEXCOLL_IB_HCA", NULL) != NULL;
  ranked_t *out = calloc((size_t)n * 4 + 1, sizeof *out);
  *n_out = 0;
  if (!out) return snprintf(why, len, "out of memory"), NULL;
  char gpath[PATH_MAX];
  gpu_pci(gpu, gpath, sizeof gpath);
  const int mine = gpath[0] ? -1 : my_numa_node();
  snprintf(why, len, "no active port on %d RDMA device(s)%s", n, hca ? " that FLEXCOLL_IB_HCA allows" : "");
  for (int i = 0; i < n; i++) {
    const char *name = v->get_device_name(list[i]);
    struct ibv_context *ctx = v->open_device(list[i]);
    struct ibv_device_attr da;
    if (!ctx) {
      /* Most often the permissions of /dev/infiniband: say so rather than "no active port". */
      snprintf(why, len, "cannot open RDMA device %s: %s", name, strerror(errno));
      continue;
    }
    int taken = 0;
    if (v->query_device(ctx, &da) == 0)
      for (int p = 1; p <= da.phys_port_cnt && *n_out < n * 4; p++) {
        ranked_t *r = &out[*n_out];
        int explicit_port = 0, pos = hca_pos(name, p, &explicit_port);
        memset(&r->c.pa, 0, sizeof r->c.pa);
        if (pos < 0 || (taken && !explicit_port)) continue;
        if (v->query_port(ctx, (uint8_t)p, &r->c.pa) || r->c.pa.state != IBV_PORT_ACTIVE) continue;
        r->c.dev = i;
        r->c.port = p;
        snprintf(r->c.name, sizeof r->c.name, "%s", name);
        read_pci(list[i]->ibdev_path, r->c.pci, sizeof r->c.pci, &r->c.numa);
        fc_pci_root_port(r->c.pci, r->c.root, sizeof r->c.root);
        if (gpath[0]) r->c.dist = fc_pci_hops(gpath, r->c.pci);
        else r->c.dist = r->c.numa < 0 || mine < 0 ? 1 : r->c.numa == mine ? 0 : 2;
        r->order = hca ? pos * 256 + p : i * 256 + p;
        taken = 1;
        (*n_out)++;
      }
    v->close_device(ctx);
  }
  return out;
}

static int by_order(const void *a, const void *b) {
  const ranked_t *x = a, *y = b;
  return (x->order > y->order) - (x->order < y->order);
}

int fc_rdma_rails(const fc_verbs_t *v, struct ibv_device **list, int n, int gpu, fc_rdma_cand_t *out, int max,
                  char *why, size_t len) {
  int nc = 0;
  ranked_t *c = candidates(v, list, n, gpu, &nc, why, len);
  if (!c) return 0;
  qsort(c, (size_t)nc, sizeof *c, by_order);
  /* FLEXCOLL_IB_HCA: what it names; else the nearest, all of them at that distance. */
  int best = FC_RDMA_FAR + 1;
  for (int i = 0; i < nc; i++) best = c[i].c.dist < best ? c[i].c.dist : best;
  const int hca = fc_param_str("FLEXCOLL_IB_HCA", NULL) != NULL;
  int k = 0;
  for (int i = 0; i < nc && k < max; i++)
    if (hca || c[i].c.dist == best) out[k++] = c[i].c;
  free(c);
  return k;
}

/* ---- device memory (GPUDirect RDMA) ---------------------------------------------------------- */

struct ibv_mr *fc_rdma_reg_device(const fc_verbs_t *v, struct ibv_pd *pd, void *buf, size_t bytes, int access, int *how,
                                  char *why, size_t len) {
  int fd = -1;
  uint64_t off = 0;
  struct ibv_mr *mr = NULL;
  why[0] = 0;
  if (!v->reg_dmabuf_mr) snprintf(why, len, "%s has no ibv_reg_dmabuf_mr", v->path);
  else if (fc_gpu_dmabuf(buf, bytes, &fd, &off, why, len) == 0) {
    mr = v->reg_dmabuf_mr(pd, off, bytes, (uint64_t)(uintptr_t)buf, fd, access);
    if (!mr) snprintf(why, len, "ibv_reg_dmabuf_mr failed: %s", strerror(errno ? errno : EINVAL));
    close(fd); /* the registration holds the pages itself */
  }
  if (mr) {
    *how = FC_RDMA_REG_DMABUF;
    return mr;
  }
  mr = v->reg_mr(pd, buf, bytes, access);
  *how = mr ? FC_RDMA_REG_ADDRESS : FC_RDMA_REG_NONE;
  if (!mr) {
    const size_t used = strlen(why);
    snprintf(why + used, len - used, "; ibv_reg_mr of device memory: %s (no nvidia-peermem?)",
             strerror(errno ? errno : EINVAL));
  }
  return mr;
}

/* ---- flexcoll-info ------------------------------------------------------------------------------ */

/* Whether the rdma link of a rank on GPU `gpu` could hand its device buffers to NIC `dev`
 * (GPUDirect RDMA), tried as the link tries (rdma.c, reg_device): a dma-buf of device memory
 * registered on the device, else the device address itself (nvidia-peermem). */
static void report_gpudirect(FILE *out, const fc_verbs_t *v, struct ibv_device *dev, int gpu) {
#if HAVE_CUDA
  if (gpu < 0) {
    fprintf(out, "GPUDirect RDMA: no GPU here\n");
    return;
  }
  char why[400] = "";
  int how = FC_RDMA_REG_NONE;
  void *buf = NULL;
  struct ibv_context *ctx = v->open_device(dev);
  struct ibv_pd *pd = ctx ? v->alloc_pd(ctx) : NULL;
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (!pd) snprintf(why, sizeof why, "cannot open %s: %s", v->get_device_name(dev), strerror(errno ? errno : ENODEV));
  else if (cudaSetDevice(gpu) != cudaSuccess || cudaMalloc(&buf, 2 << 20) != cudaSuccess) {
    snprintf(why, sizeof why, "cannot allocate on GPU %d: %s", gpu, cudaGetErrorString(cudaGetLastError()));
    buf = NULL;
  } else {
    struct ibv_mr *mr = fc_rdma_reg_device(v, pd, buf, 2 << 20, access, &how, why, sizeof why);
    if (mr) v->dereg_mr(mr);
  }
  if (how != FC_RDMA_REG_NONE)
    fprintf(out, "GPUDirect RDMA: GPU %d's buffers register on %s %s\n", gpu, v->get_device_name(dev),
            how == FC_RDMA_REG_DMABUF ? "through a dma-buf of the buffer's allocation" : "by address (nvidia-peermem)");
  else fprintf(out, "GPUDirect RDMA: no (%s): device buffers are copied through host memory\n", why);
  if (buf) cudaFree(buf);
  cudaGetLastError();
  if (pd) v->dealloc_pd(pd);
  if (ctx) v->close_device(ctx);
#else
  (void)v, (void)dev, (void)gpu;
  fprintf(out, "GPUDirect RDMA: not in this build (flexcoll was built without CUDA)\n");
#endif
}

void fc_rdma_report(FILE *out) {
  char why[300] = "";
  const fc_verbs_t *v = fc_verbs_load(why, sizeof why);
  if (!v) {
    fprintf(out, "RDMA devices: none (%s)\n", why);
    return;
  }
  int n = 0;
  errno = 0;
  struct ibv_device **list = v->get_device_list(&n);
  if (!list || n == 0) {
    fprintf(out, "RDMA devices: none (%s: %s)\n", v->path,
            !list ? (errno ? strerror(errno) : "no device list") : "no device");
    if (list) v->free_device_list(list);
    return;
  }
  /* What a rank of this process would take: its GPU's nearest where it has one (device 0 here),
   * else its NUMA node's. */
  int gpu = -1;
#if HAVE_CUDA
  int ngpus = 0;
  if (cudaGetDeviceCount(&ngpus) == cudaSuccess && ngpus > 0) gpu = 0;
  cudaGetLastError();
#endif
  fc_rdma_cand_t rails[FC_RDMA_MAX_RAILS];
  char rwhy[300] = "";
  int nr = fc_rdma_rails(v, list, n, gpu, rails, FC_RDMA_MAX_RAILS, rwhy, sizeof rwhy);
  const int mine = my_numa_node();
  fprintf(out, "RDMA devices (%s): %d\n", v->path, n);
  for (int i = 0; i < n; i++) {
    const char *name = v->get_device_name(list[i]);
    struct ibv_context *ctx = v->open_device(list[i]);
    struct ibv_device_attr da;
    if (!ctx || v->query_device(ctx, &da)) {
      fprintf(out, "  %s: cannot open (%s)\n", name, strerror(errno));
      if (ctx) v->close_device(ctx);
      continue;
    }
    char pci[PATH_MAX], root[PATH_MAX], where[96] = "NUMA node unknown";
    int node = -1;
    read_pci(list[i]->ibdev_path, pci, sizeof pci, &node);
    fc_pci_root_port(pci, root, sizeof root);
    const char *bus = strrchr(pci, '/'), *rp = strrchr(root, '/');
    if (node >= 0) snprintf(where, sizeof where, "NUMA node %d%s", node, node == mine ? " (this process's)" : "");
    fprintf(out, "  %s: PCI %s (root port %s), %s, %d port(s), %d queue pairs, %d CQ entries\n", name,
            bus ? bus + 1 : "unknown", rp ? rp + 1 : "unknown", where, da.phys_port_cnt, da.max_qp, da.max_cqe);
#if HAVE_CUDA
    /* The GPUs nearest to it by PCI distance (those under the same switch first). */
    if (pci[0]) {
      int best = FC_RDMA_FAR, near[64], nn = 0;
      for (int g = 0; g < ngpus && g < 64; g++) {
        char gp[PATH_MAX];
        gpu_pci(g, gp, sizeof gp);
        int h = fc_pci_hops(gp, pci);
        if (h < best) best = h, nn = 0;
        if (h == best && h < FC_RDMA_FAR) near[nn++] = g;
      }
      if (nn) {
        fprintf(out, "    nearest GPU(s), %d PCI hops:", best);
        for (int g = 0; g < nn; g++) fprintf(out, " %d", near[g]);
        fprintf(out, "\n");
      }
    }
#endif
    for (int p = 1; p <= da.phys_port_cnt; p++) {
      struct ibv_port_attr pa;
      memset(&pa, 0, sizeof pa);
      if (v->query_port(ctx, (uint8_t)p, &pa)) continue;
      int rail = -1;
      for (int k = 0; k < nr; k++)
        if (rails[k].dev == i && rails[k].port == p) rail = k;
      char taken[96] = "";
      if (rail >= 0)
        snprintf(taken, sizeof taken, " (rail %d of a rank %s here)", rail, gpu >= 0 ? "on GPU 0" : "on this NUMA node");
      fprintf(out, "    port %d: %s, %s, MTU %s, %.0f Gb/s%s\n", p,
              pa.state == IBV_PORT_ACTIVE ? "active" : pa.state == IBV_PORT_DOWN ? "down" : "not active",
              pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", fc_rdma_mtu_name(pa.active_mtu),
              fc_rdma_port_gbps(&pa), taken);
      /* Addressed by GID (RoCE, or InfiniBand without a LID): the entry a rank takes. */
      if (pa.link_layer == IBV_LINK_LAYER_ETHERNET || pa.lid == 0) {
        union ibv_gid gid;
        int type = 0;
        char gwhy[200], text[64];
        const int want = fc_rdma_gid_index_wanted();
        const int gi = fc_rdma_port_gid(v, ctx, list[i]->ibdev_path, p, &pa, want, &gid, &type, gwhy, sizeof gwhy);
        if (gi < 0) {
          fprintf(out, "      GID: none usable (%s)\n", gwhy);
        } else {
          fc_rdma_gid_text(&gid, text, sizeof text);
          fprintf(out, "      GID index %d of %d (%s, %s)%s\n", gi, pa.gid_tbl_len, fc_rdma_gid_type_name(type), text,
                  want >= 0 ? ", named by FLEXCOLL_IB_GID_INDEX" : "");
        }
      }
    }
    v->close_device(ctx);
  }
  if (!nr) fprintf(out, "  no rail for a rank here: %s\n", rwhy);
  report_gpudirect(out, v, list[nr ? rails[0].dev : 0], gpu);
  v->free_device_list(list);
}

#endif
