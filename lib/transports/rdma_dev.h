/* rdma_dev.h — which RDMA devices a rank takes for its rdma links, and flexcoll-info's list of them
 * (rdma_dev.c).
 *
 * A rank's rails are the devices with an active port nearest to it: to its GPU by PCI distance
 * (hops through the PCIe tree between the two functions), without a GPU to the NUMA node its CPUs
 * are on; every device at the least distance is a rail (multi-rail), in the device list's order.
 * FLEXCOLL_IB_HCA (a comma list of name or name:port) overrides: exactly the devices it names, in
 * its order, whatever their distance. */
#ifndef FC_RDMA_DEV_H
#define FC_RDMA_DEV_H

#include <stddef.h>
#include <stdio.h>

#include "verbs.h"

#define FC_RDMA_MAX_RAILS 8

typedef struct {
  int dev, port;  /* index in the device list; port number */
  int dist;       /* from this rank (see above): lower is nearer; FC_RDMA_FAR when unknown */
  int numa;       /* the device's NUMA node, -1 when unknown */
  char name[64];
  char pci[256];  /* the PCI function's sysfs path, "" when unknown */
  char root[256]; /* its PCIe root port (what it shares its path to the CPU with), "" unknown */
  struct ibv_port_attr pa;
} fc_rdma_cand_t;

#define FC_RDMA_FAR 1000

/* This rank's rails from the device list (gpu: its CUDA device, -1 none): up to max, nearest
 * first; the count, or 0 with the reason in why. */
int fc_rdma_rails(const fc_verbs_t *v, struct ibv_device **list, int n, int gpu, fc_rdma_cand_t *out, int max,
                  char *why, size_t len);
/* Hops between two sysfs paths of PCI functions through their deepest common bridge (the same
 * function: 0); FC_RDMA_FAR when either is unknown.  Pure: unit-tested on strings. */
int fc_pci_hops(const char *a, const char *b);
/* The PCIe root port of a PCI function's sysfs path (the component after the host bridge
 * pciDDDD:BB) into out; "" when there is none. */
void fc_pci_root_port(const char *path, char *out, size_t len);
const char *fc_rdma_mtu_name(enum ibv_mtu m);
double fc_rdma_port_gbps(const struct ibv_port_attr *a);

#endif
