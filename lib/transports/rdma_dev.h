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
/* RoCE: the entry of a port's GID table a rank addresses its queue pairs by.  want >= 0 (from
 * FLEXCOLL_IB_GID_INDEX): that entry, if the table has it and it is not empty.  want < 0: a RoCE v2
 * entry with an IPv4-mapped address (routed RoCE fabrics' usual setup, and NCCL's default), else a
 * v2 entry with a global IPv6 address, else a v2 link-local one, else the first non-empty entry
 * (lowest index first within a kind); types[i] is 2 for RoCE v2, 1 for v1 or InfiniBand, 0 unknown.  The index, or -1
 * when there is none.  Pure: unit-tested on tables. */
int fc_rdma_pick_gid(const union ibv_gid *gids, const int *types, int n, int want);
/* FLEXCOLL_IB_GID_INDEX: the GID entry asked for, -1 when unset (the pick above chooses). */
int fc_rdma_gid_index_wanted(void);
/* The GID a rank uses on an open device's port (link layer Ethernet, or InfiniBand without a
 * LID): the table read with ibv_query_gid, the types from the device's sysfs directory
 * (ports/P/gid_attrs/types/I, as the kernel lays it out), want as above.  Returns the index, its
 * GID and type, or -1 with the reason in why. */
int fc_rdma_port_gid(const fc_verbs_t *v, struct ibv_context *ctx, const char *ibdev_path, int port,
                     const struct ibv_port_attr *pa, int want, union ibv_gid *gid, int *type, char *why, size_t len);
/* A GID as text (IPv6 notation; an IPv4-mapped one as ::ffff:a.b.c.d) and a type's name. */
void fc_rdma_gid_text(const union ibv_gid *gid, char *out, size_t len);
const char *fc_rdma_gid_type_name(int type);
const char *fc_rdma_mtu_name(enum ibv_mtu m);
double fc_rdma_port_gbps(const struct ibv_port_attr *a);
/* Device memory registered on pd (GPUDirect RDMA): through a dma-buf of its allocation where the
 * provider (ibv_reg_dmabuf_mr) and the driver offer it, else by its device address (ibv_reg_mr,
 * which only nvidia-peermem makes work).  *how says which (FC_RDMA_REG_*); NULL where neither
 * works, with both reasons in why (where it is by address, why holds the dma-buf's). */
enum { FC_RDMA_REG_DMABUF = 1, FC_RDMA_REG_ADDRESS = 2, FC_RDMA_REG_NONE = 3 };
struct ibv_mr *fc_rdma_reg_device(const fc_verbs_t *v, struct ibv_pd *pd, void *buf, size_t bytes, int access, int *how,
                                  char *why, size_t len);

#endif
