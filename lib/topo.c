/* topo.c — machine topology for logging, flexcoll-info and (later) the link cost model.  RDMA
 * devices are the rdma link's (lib/transports/rdma_dev.c: through its run-time loader, so that
 * what is listed is what the link would open). */
#define _GNU_SOURCE
#include "config.h"
#include "topo.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "param.h"

#if HAVE_CUDA
#include <cuda_runtime.h>
#endif
#if HAVE_HWLOC
#include <hwloc.h>
#endif

#if HAVE_HWLOC && HAVE_CUDA
/* The NUMA node closest to a PCI device, through hwloc's I/O tree. */
static int numa_of_pci(hwloc_topology_t topo, const char *busid) {
  unsigned dom, bus, dev, fn;
  if (sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return -1;
  hwloc_obj_t pci = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, fn);
  if (!pci) return -1;
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, pci);
  if (!anc || !anc->nodeset) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}
#endif

static void discover_gpus(fc_topo_t *t, void *hwloc_topo) {
  (void)hwloc_topo;
#if HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); n = 0; }
  t->ngpus = n < FC_TOPO_MAX_GPUS ? n : FC_TOPO_MAX_GPUS;
  for (int i = 0; i < t->ngpus; i++) {
    fc_topo_gpu_t *g = &t->gpus[i];
    struct cudaDeviceProp p;
    g->numa_node = -1;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    snprintf(g->name, sizeof g->name, "%s", p.name);
    g->memory_bytes = p.totalGlobalMem;
    g->sm_count = p.multiProcessorCount;
    g->cc_major = p.major;
    g->cc_minor = p.minor;
    g->copy_engines = p.asyncEngineCount;
    cudaDeviceGetPCIBusId(g->pci_bus_id, sizeof g->pci_bus_id, i);
#if HAVE_HWLOC && HAVE_CUDA
    if (hwloc_topo) g->numa_node = numa_of_pci((hwloc_topology_t)hwloc_topo, g->pci_bus_id);
#endif
    for (int j = 0; j < t->ngpus; j++) {
      if (i == j) continue;
      fc_topo_link_t *l = &t->links[i][j];
      cudaDeviceGetP2PAttribute(&l->access, cudaDevP2PAttrAccessSupported, i, j);
      cudaDeviceGetP2PAttribute(&l->nvlink, cudaDevP2PAttrNativeAtomicSupported, i, j);
      cudaDeviceGetP2PAttribute(&l->perf_rank, cudaDevP2PAttrPerformanceRank, i, j);
    }
  }
  cudaGetLastError();
#else
  t->ngpus = 0;
#endif
}

void fc_topo_discover(fc_topo_t *t) {
  memset(t, 0, sizeof *t);
  void *ht = NULL;
#if HAVE_HWLOC
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) == 0) {
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
#if HWLOC_API_VERSION >= 0x00020100
    /* CPUs, memory and PCI are all we read (a GPU's NUMA node by its bus id).  The components
     * that name OS devices query vendor runtimes (OpenCL, OpenGL, CUDA, NVML, ROCm, Level Zero)
     * at every communicator's creation; hwloc's CUDA component would even initialise CUDA. */
    static const char *const unused[] = {"opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"};
    for (size_t i = 0; i < sizeof unused / sizeof unused[0]; i++)
      hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, unused[i]);
#endif
    if (hwloc_topology_load(topo) == 0) {
      ht = topo;
      t->numa_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
      hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
      const char *model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
      snprintf(t->cpu_model, sizeof t->cpu_model, "%s", model ? model : "unknown");
    }
  }
#endif
  discover_gpus(t, ht);
#if HAVE_HWLOC
  if (ht) hwloc_topology_destroy((hwloc_topology_t)ht);
#endif
}

void fc_topo_print(const fc_topo_t *t, FILE *out) {
  fprintf(out, "CPU: %s, %d NUMA node(s)\n", t->cpu_model[0] ? t->cpu_model : "unknown (no hwloc)", t->numa_nodes);
  fprintf(out, "GPUs: %d\n", t->ngpus);
  for (int i = 0; i < t->ngpus; i++) {
    const fc_topo_gpu_t *g = &t->gpus[i];
    fprintf(out, "  GPU %d: %s, PCI %s, NUMA node %d, %.1f GiB, %d SMs, sm_%d%d, %d copy engines\n", i, g->name,
            g->pci_bus_id, g->numa_node, (double)g->memory_bytes / (1 << 30), g->sm_count, g->cc_major, g->cc_minor,
            g->copy_engines);
  }
  for (int i = 0; i < t->ngpus; i++)
    for (int j = 0; j < t->ngpus; j++)
      if (i != j)
        fprintf(out, "  link GPU %d -> GPU %d: %s, performance rank %d\n", i, j,
                !t->links[i][j].access ? "no peer access (through host memory)"
                                       : t->links[i][j].nvlink ? "NVLink peer access" : "PCIe peer access",
                t->links[i][j].perf_rank);
}

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;

static void log_topology(void) {
  if (fc_log_level() < FC_LOG_INFO) return;
  fc_topo_t t;
  fc_topo_discover(&t);
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  if (!m) return;
  fc_topo_print(&t, m);
  fclose(m);
  for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
    FC_INFO(FC_SUB_INIT, "topology: %s", line);
  free(buf);
}

void fc_topo_log_once(void) { pthread_once(&topo_once, log_topology); }

uint64_t fc_hash_bytes(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void fc_topo_host_name(char *buf, size_t len) {
  if (len == 0) return;
  memset(buf, 0, len);
  const char *id = fc_param_str("FLEXCOLL_HOSTID", NULL);
  if (id) snprintf(buf, len, "%s", id);
  else gethostname(buf, len - 1);
}

uint64_t fc_topo_host_hash(void) {
  char name[256];
  fc_topo_host_name(name, sizeof name);
  return fc_hash_bytes(FC_HASH_INIT, name, strlen(name));
}
