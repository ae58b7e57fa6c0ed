/* transports.h — the links between ranks: one table of functions per transport, and the set of
 * links a communicator keeps.
 *
 * A link moves bytes between this rank and its peers; it never chooses what to send (the
 * scheduler in lib/sched splits each transfer over the links, the executors post the parts).
 * Every usable link of the list FLEXCOLL_LINKS is kept (NCCL keeps the first), so that a transfer
 * can run over several at once.  Host memory has three: two through UCX, each its own UCP
 * context and worker restricted to one kind of transport, `shm` (shared memory) and `tcp`; and
 * `rdma` (RC queue pairs through libibverbs, loaded at run time; absent without a device).  The
 * three take device buffers too where they can (fc_link.device_memory).  The
 * device links (nvlink, pcie) take the same table as the engine moves onto it
 * (docs/ARCHITECTURE.md, "The FlexLink engine").
 *
 * Messages are tagged, nonblocking, point to point; every wait is the caller's (requests are
 * tested, never blocked on).  Tags only need to be unique per link: every link has its own
 * matching. */
#ifndef FC_TRANSPORTS_H
#define FC_TRANSPORTS_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "flexcoll.h"

struct flexcoll_comm;
typedef struct fc_link fc_link_t;
typedef void *fc_link_req_t; /* NULL: completed at post time */

typedef struct {
  const char *name; /* as FLEXCOLL_LINKS and flexcoll_link_stats_t spell it */
  /* Open the link from this rank to every peer.  Collective: every rank calls it for the same
   * links in the same order.  *usable = 0 (and a reason in why) when the link cannot exist here
   * on this rank, which is not an error: the caller then closes it on every rank. */
  flexcoll_result_t (*open)(struct flexcoll_comm *comm, fc_link_t *link, int *usable, char *why, size_t len);
  /* Close (flushing unless force) and free the link's state; never waits on a peer. */
  void (*close)(struct flexcoll_comm *comm, fc_link_t *link, int force);
  flexcoll_result_t (*isend)(struct flexcoll_comm *comm, fc_link_t *link, int peer, const void *buf, size_t bytes,
                             uint64_t tag, fc_link_req_t *req);
  flexcoll_result_t (*irecv)(struct flexcoll_comm *comm, fc_link_t *link, int peer, void *buf, size_t bytes,
                             uint64_t tag, fc_link_req_t *req);
  /* Drive the link; nonzero when something happened. */
  int (*progress)(fc_link_t *link);
  /* *done = 1 once *req completed (then released, *req = NULL).  expect: the exact length a
   * receive must bring (else FLEXCOLL_INVALID_USAGE); SIZE_MAX for sends. */
  flexcoll_result_t (*test)(struct flexcoll_comm *comm, fc_link_t *link, fc_link_req_t *req, size_t expect, int *done);
  /* Cancel and release a request nobody will wait for (abort, error paths). */
  void (*cancel)(fc_link_t *link, fc_link_req_t *req);
  /* Nonzero: while none of this link's requests is pending, a wait may progress it only now and
   * then (lib/host/exec.c).  For links whose connections are complete when open returns and
   * whose idle progress is costly (a TCP worker's is a system call); zero where an idle link's
   * progress still owes peers something (rdma returns receive credits there). */
  int idle_progress_rarely;
  /* Nonzero: the link joins ranks of one host only (shared memory); lib/sched/links.c then never
   * asks it for a peer on another host.  Zero: any two ranks, wherever they run. */
  int same_host;
  /* Several devices (multi-rail), NULL for one: after rail 0 opened, how many rails this rank can
   * open (at most max), and alone[k] = 1 where rail k's device sits behind a PCIe port none of
   * rails 0..k-1 uses (its bandwidth adds to theirs).  lib/sched/links.c opens rails 1.. as links
   * of their own (fc_link.rail), so the balancer splits over them: as many as the rank with the
   * most has where the transport is pairwise (rail k between the ranks that have it), else as
   * many as every rank has. */
  int (*rails)(fc_link_t *link, unsigned char *alone, int max);
  /* Nonzero: the link may work on some ranks only (a NIC on some hosts): open marks the peers
   * whose side failed as unreached (reach[q] = 0), and lib/sched/links.c keeps the link for the
   * pairs whose ranks both have it wherever two ranks or more do.  Zero: every rank or none. */
  int pairwise;
  /* What the link holds for peer (its queues, counters, credits) in one line, for a stall
   * report; NULL where the link has nothing to say beyond its requests. */
  void (*describe)(fc_link_t *link, int peer, char *buf, size_t len);
  /* NULL, or: the link is about to carry device buffers of CUDA device `device` while kernels
   * wait for them (a ring lane's proxy, lib/gpu/pcie_ce.c); make what its copies need now, while
   * none waits yet (rdma pins its slots, gpu.h fc_mem_pin).  0, or -1 with the reason: the link
   * still works, its copies then take the slower way. */
  int (*prepare_device)(fc_link_t *link, int device, char *why, size_t len);
} fc_link_ops_t;

/* What this rank sent over one link to one peer (flexcoll_comm_get_link_stats). */
typedef struct {
  unsigned long long bytes;
  double busy_us;
  double share; /* fraction of the last large collective's bytes to this peer */
} fc_link_peer_stats_t;

struct fc_link {
  const fc_link_ops_t *ops;
  void *state;                  /* the transport's */
  fc_link_peer_stats_t *stats;  /* per peer */
  /* Per peer: 1 where this link joins this rank and the peer (1 for itself).  Set by
   * lib/sched/links.c before open from the ranks' hosts and the link's same_host, so both ends of
   * a pair agree without a message; open connects those peers only, and nothing is ever sent to
   * a peer the link does not reach. */
  unsigned char *reach;
  /* A pairwise link kept where some ranks lack it: on[q] says whether rank q has it (NULL: every
   * rank).  On a rank without it the entry stays (links are numbered alike on every rank) but
   * off, with no state: no pair joins that rank over it and nothing is asked of it there. */
  unsigned char *on;
  int off;
  int rail;      /* which of the transport's devices (0: its first; set before open) */
  int own_port;  /* a rail whose port no earlier rail shares, on every rank: its own port in the model */
  /* Set by open, the same on every rank: nonzero where isend and irecv take device buffers (the
   * link moves them itself: rdma registers them with the NIC where it can, else copies them;
   * shm and tcp where UCX has its CUDA transports, cuda_ipc and cuda_copy, on every rank); zero:
   * host memory only, and callers stage device buffers through host copies (lib/gpu/exec.c). */
  int device_memory;
};

/* The transports this build knows, in the order FLEXCOLL_LINKS lists them by default. */
extern const fc_link_ops_t fc_link_shm, fc_link_tcp;
/* RDMA through libibverbs, loaded at run time (rdma.c, verbs.h); absent without a device. */
extern const fc_link_ops_t fc_link_rdma;
/* flexcoll-info: the RDMA devices, their ports, state and speed, PCI place, nearest NUMA node and
 * GPU, which ones a rank here would take, or why there are none. */
void fc_rdma_report(FILE *out);
/* Whether the host links run with UCX's peer-failure handling (FLEXCOLL_UCX_PEER_FAILURE, on by
 * default): shared memory then copies through UCX's FIFOs instead of cross-memory attach, so its
 * calibrated models are not those of the other mode. */
int fc_ucx_peer_failure(void);

/* Whether name is a link FLEXCOLL_LINKS may name (host or device, built here or not). */
int fc_link_name_known(const char *name);

#endif
