/* lane_link.h — private to lib/gpu: the ring kernels' second lane carried by a host link, the
 * proxy's half of the protocol, without CUDA.
 *
 * The kernels' side (lib/kernels/ring.cu, a copy-engine lane's protocol): each block stores
 * message n into our outbox at the offset its descriptor gives, writes the descriptor (offset,
 * bytes, the ready value the next rank's counter takes once the message is there) at n %
 * FC_PCIE_DESCS, then raises its published count to n + 1.  The mover sends every published
 * message to the next rank as one of the link's messages, and receives the previous rank's
 * into our inbox at the offset of the previous rank's descriptor; as receives complete, in
 * order per block, it hands the ready value to raise_ready (on a GPU: a flush of the NIC's
 * writes, then a stream write of the counter the kernel waits for).  A message of no bytes is
 * neither sent nor received: both ends read the same descriptor.
 *
 * pcie_ce.c drives it from the proxy thread on a GPU; tests/test_lane_link.c drives it on host
 * memory over the host links, with the kernels' protocol played by the test. */
#ifndef FC_GPU_LANE_LINK_H
#define FC_GPU_LANE_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "transports/transports.h"

typedef struct fc_lane_link {
  struct flexcoll_comm *comm;
  fc_link_t *link;
  int rank, next, prev;
  unsigned blocks; /* at most FC_MAX_BLOCKS */
  /* The kernels' published counts and descriptors: ours, and the previous rank's (its host area,
   * mapped here). */
  const volatile uint64_t *sent, *prev_sent;
  const volatile fc_pcie_desc_t *desc, *prev_desc;
  char *outbox, *inbox;
  /* The ready counter of block b may become value: the message's `bytes` (and those of every
   * earlier one of the block) are in the inbox.  Nonzero: failed. */
  int (*raise_ready)(void *arg, unsigned block, uint64_t value, uint64_t bytes);
  void *arg;
  /* Per block: messages sent (posted) and done, receives posted and done; the requests in flight
   * at n % FC_PCIE_DESCS. */
  uint64_t out_done[FC_MAX_BLOCKS], sends_done[FC_MAX_BLOCKS], in_done[FC_MAX_BLOCKS], recvs_done[FC_MAX_BLOCKS];
  fc_link_req_t sreq[FC_MAX_BLOCKS][FC_PCIE_DESCS], rreq[FC_MAX_BLOCKS][FC_PCIE_DESCS];
  size_t rbytes[FC_MAX_BLOCKS][FC_PCIE_DESCS];
  uint64_t rready[FC_MAX_BLOCKS][FC_PCIE_DESCS];
} fc_lane_link_t;

/* One turn over every block: progress the link while requests are in flight, retire finished
 * sends, send what was published since, post receives for what the previous rank published,
 * raise the ready counters past the receives done.  -1 when the link or raise_ready failed
 * (the link's error is the communicator's last error); else whether anything moved. */
int fc_lane_link_turn(fc_lane_link_t *m);
/* Whether requests are in flight. */
int fc_lane_link_busy(const fc_lane_link_t *m);
/* Cancel the requests in flight (none after a clean end: every message was consumed). */
void fc_lane_link_cancel(fc_lane_link_t *m);

#endif
