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
 * In band (inband: ring neighbours on other hosts, whose host areas cannot be mapped here) the
 * descriptors and the acknowledgements travel over the link too.  Each message's descriptor is
 * one small message of its own ahead of its bytes (sent for an empty message as well, which
 * carries its ready value), and the receiver keeps a descriptor receive posted per message the
 * block may have in flight.  The kernel acknowledges into ack_out, a stand-in for the previous
 * rank's ack counters in our own memory; the mover sends each new value to the previous rank,
 * whose mover raises its ack_in (the counters its kernel waits on before reusing a slot).  So a
 * sender still writes message m only after the next rank consumed m - S, and the receiver's
 * inbox slot is free once a message for it can arrive.
 *
 * pcie_ce.c drives it from the proxy thread on a GPU; tests/test_lane_link.c drives it on host
 * memory over the host links, with the kernels' protocol played by the test. */
#ifndef FC_GPU_LANE_LINK_H
#define FC_GPU_LANE_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "transports/transports.h"

/* Acknowledgements in flight per block and direction, in band (each carries the latest value,
 * so a few cover any number of messages). */
#define FC_LANE_ACKS 4

typedef struct fc_lane_link {
  struct flexcoll_comm *comm;
  fc_link_t *link;
  int rank, next, prev;
  unsigned blocks; /* at most FC_MAX_BLOCKS */
  /* The kernels' published counts and descriptors: ours, and the previous rank's (its host area,
   * mapped here; NULL in band). */
  const volatile uint64_t *sent, *prev_sent;
  const volatile fc_pcie_desc_t *desc, *prev_desc;
  char *outbox, *inbox;
  size_t box_bytes;        /* of each box: a descriptor reaching past it is an error */
  int inband;
  const volatile uint64_t *ack_out; /* in band: what our kernel consumed of the previous rank's, per block */
  volatile uint64_t *ack_in;        /* in band: our kernel's ack counters, raised from the next rank's acks */
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
  /* In band: descriptors sent (kept until their send completes) and received, their requests,
   * and descriptor receives posted per block; acknowledgements sent (the last value told, sends
   * posted and done) and received (receives posted and done), FC_LANE_ACKS in flight each way. */
  fc_pcie_desc_t sdesc[FC_MAX_BLOCKS][FC_PCIE_DESCS], rdesc[FC_MAX_BLOCKS][FC_PCIE_DESCS];
  fc_link_req_t dsreq[FC_MAX_BLOCKS][FC_PCIE_DESCS], drreq[FC_MAX_BLOCKS][FC_PCIE_DESCS];
  uint64_t desc_posted[FC_MAX_BLOCKS];
  uint64_t ack_told[FC_MAX_BLOCKS], acks_sent[FC_MAX_BLOCKS], acks_sent_done[FC_MAX_BLOCKS];
  uint64_t acks_posted[FC_MAX_BLOCKS], acks_in_done[FC_MAX_BLOCKS];
  uint64_t ack_sbuf[FC_MAX_BLOCKS][FC_LANE_ACKS], ack_rbuf[FC_MAX_BLOCKS][FC_LANE_ACKS];
  fc_link_req_t asreq[FC_MAX_BLOCKS][FC_LANE_ACKS], arreq[FC_MAX_BLOCKS][FC_LANE_ACKS];
  /* The longest single step so far (a link call or raise_ready), what it was, and the block and
   * message it was for: a mover held up inside one (a copy or registration waiting for the
   * device) shows in the stall report. */
  double slowest_us;
  const char *slowest_what;
  unsigned slowest_block;
  uint64_t slowest_msg;
} fc_lane_link_t;

/* One turn over every block: progress the link while requests are in flight, retire finished
 * sends, send what was published since, post receives for what the previous rank published,
 * raise the ready counters past the receives done.  -1 when the link or raise_ready failed
 * (the link's error is the communicator's last error); else whether anything moved. */
int fc_lane_link_turn(fc_lane_link_t *m);
/* Whether requests are in flight (in band, the receives kept posted count too). */
int fc_lane_link_busy(const fc_lane_link_t *m);
/* In band, at the end: turn until every acknowledgement our kernel made has reached the previous
 * rank (whose kernel may still wait for the last one), at most until deadline_us (fc_now_us).
 * 0 when done (at once where not in band). */
int fc_lane_link_drain(fc_lane_link_t *m, double deadline_us);
/* The longest step so far, in words ("the mover's longest step: a send of block 0's message 8,
 * 19874.2 ms"), for a stall report. */
void fc_lane_link_slowest(const fc_lane_link_t *m, char *buf, size_t len);
/* Cancel the requests in flight (after a clean end only the receives in band keeps posted). */
void fc_lane_link_cancel(fc_lane_link_t *m);

#endif
