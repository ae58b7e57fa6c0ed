/* topo.h — what this machine has: GPUs (PCI bus id, NUMA node, memory, SMs), the peer links
 * between them (peer access, NVLink as reported by native peer atomics, CUDA's performance
 * rank).  hwloc for placement, CUDA for the GPUs and links; RDMA devices: fc_rdma_report. */
#ifndef FC_TOPO_H
#define FC_TOPO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FC_TOPO_MAX_GPUS 16

typedef struct {
  char name[256];
  char pci_bus_id[32];
  int numa_node;      /* -1 when unknown */
  size_t memory_bytes;
  int sm_count, cc_major, cc_minor, copy_engines;
} fc_topo_gpu_t;

typedef struct {
  int access;       /* peer access possible */
  int nvlink;       /* native atomics across the link: NVLink (or NVSwitch), not PCIe */
  int perf_rank;    /* CUDA's relative performance rank of the link (lower is better) */
} fc_topo_link_t;

typedef struct {
  int ngpus;
  fc_topo_gpu_t gpus[FC_TOPO_MAX_GPUS];
  fc_topo_link_t links[FC_TOPO_MAX_GPUS][FC_TOPO_MAX_GPUS];
  int numa_nodes;   /* NUMA nodes hwloc sees (0 without hwloc) */
  char cpu_model[128];
} fc_topo_t;

/* FNV-1a of len bytes, continuing from h (start with FC_HASH_INIT): the same on every rank for
 * the same bytes. */
#define FC_HASH_INIT 1469598103934665603ull
uint64_t fc_hash_bytes(uint64_t h, const void *data, size_t len);
/* This rank's host name, as every part of the library compares hosts: FLEXCOLL_HOSTID where it
 * is set (as NCCL_HOSTID: containers that share a machine under other names, or ranks of one
 * machine to be taken as several hosts, as the tests do), else gethostname.  Cut to len - 1
 * bytes, always terminated. */
void fc_topo_host_name(char *buf, size_t len);
/* This host, as a hash of its name: ranks with the same hash share a host. */
uint64_t fc_topo_host_hash(void);

/* Fill t from this machine; never fails (missing pieces stay zero / -1). */
void fc_topo_discover(fc_topo_t *t);
/* Human-readable description (flexcoll-info, INFO log). */
void fc_topo_print(const fc_topo_t *t, FILE *out);
/* Log the topology once per process at INFO. */
void fc_topo_log_once(void);

#endif
