/* lane_link.c — the ring kernels' second lane over a host link: the proxy's half (lane_link.h). */
#include "config.h"

#include "gpu/lane_link.h"

/* A lane message's tag on the link: the block and the message's number (unique among the
 * block's messages in flight), under a message number of its own; the host executor's messages
 * on the link never meet a ring call's in flight (a host call waits for the stream first). */
static uint64_t lane_tag(int sender, unsigned block, uint64_t n) {
  return ((uint64_t)(uint16_t)sender << 48) | (1ull << 47) | (0x7ffffffeull << 16) | ((n & 0x1ffu) << 7) | block;
}

/* A request: done (and released) or still in flight; 0 when the link failed it. */
static int req_done(fc_lane_link_t *m, fc_link_req_t *q, size_t expect, int *done) {
  *done = 1;
  return !*q || m->link->ops->test(m->comm, m->link, q, expect, done) == FLEXCOLL_SUCCESS;
}

static int turn_block(fc_lane_link_t *m, unsigned b) {
  const fc_link_ops_t *ops = m->link->ops;
  int moved = 0, done;
  while (m->sends_done[b] < m->out_done[b]) {
    if (!req_done(m, &m->sreq[b][m->sends_done[b] % FC_PCIE_DESCS], SIZE_MAX, &done)) return -1;
    if (!done) break;
    m->sends_done[b]++;
  }
  const uint64_t sent = __atomic_load_n((const uint64_t *)&m->sent[b], __ATOMIC_ACQUIRE);
  for (; m->out_done[b] < sent && m->out_done[b] - m->sends_done[b] < FC_PCIE_DESCS; m->out_done[b]++, moved = 1) {
    const uint64_t n = m->out_done[b];
    const volatile fc_pcie_desc_t *d = &m->desc[b * FC_PCIE_DESCS + n % FC_PCIE_DESCS];
    fc_link_req_t *q = &m->sreq[b][n % FC_PCIE_DESCS];
    *q = NULL;
    if (d->bytes && ops->isend(m->comm, m->link, m->next, m->outbox + d->off, d->bytes, lane_tag(m->rank, b, n), q) !=
                        FLEXCOLL_SUCCESS)
      return -1;
  }
  const uint64_t published = __atomic_load_n((const uint64_t *)&m->prev_sent[b], __ATOMIC_ACQUIRE);
  for (; m->in_done[b] < published && m->in_done[b] - m->recvs_done[b] < FC_PCIE_DESCS; m->in_done[b]++, moved = 1) {
    const uint64_t n = m->in_done[b];
    const volatile fc_pcie_desc_t *d = &m->prev_desc[b * FC_PCIE_DESCS + n % FC_PCIE_DESCS];
    const unsigned k = n % FC_PCIE_DESCS;
    m->rready[b][k] = d->ready;
    m->rbytes[b][k] = d->bytes;
    m->rreq[b][k] = NULL;
    if (d->bytes &&
        ops->irecv(m->comm, m->link, m->prev, m->inbox + d->off, d->bytes, lane_tag(m->prev, b, n), &m->rreq[b][k]) !=
            FLEXCOLL_SUCCESS)
      return -1;
  }
  uint64_t ready = 0, bytes = 0;
  while (m->recvs_done[b] < m->in_done[b]) {
    const unsigned k = m->recvs_done[b] % FC_PCIE_DESCS;
    if (!req_done(m, &m->rreq[b][k], m->rbytes[b][k], &done)) return -1;
    if (!done) break;
    ready = m->rready[b][k];
    bytes += m->rbytes[b][k];
    m->recvs_done[b]++;
  }
  if (!ready) return moved;
  return m->raise_ready(m->arg, b, ready, bytes) ? -1 : 1;
}

int fc_lane_link_busy(const fc_lane_link_t *m) {
  for (unsigned b = 0; b < m->blocks; b++)
    if (m->sends_done[b] < m->out_done[b] || m->recvs_done[b] < m->in_done[b]) return 1;
  return 0;
}

int fc_lane_link_turn(fc_lane_link_t *m) {
  if (fc_lane_link_busy(m)) m->link->ops->progress(m->link);
  int moved = 0;
  for (unsigned b = 0; b < m->blocks; b++) {
    const int k = turn_block(m, b);
    if (k < 0) return -1;
    moved |= k;
  }
  return moved;
}

void fc_lane_link_cancel(fc_lane_link_t *m) {
  for (unsigned b = 0; b < m->blocks; b++) {
    for (uint64_t n = m->sends_done[b]; n < m->out_done[b]; n++)
      if (m->sreq[b][n % FC_PCIE_DESCS]) m->link->ops->cancel(m->link, &m->sreq[b][n % FC_PCIE_DESCS]);
    for (uint64_t n = m->recvs_done[b]; n < m->in_done[b]; n++)
      if (m->rreq[b][n % FC_PCIE_DESCS]) m->link->ops->cancel(m->link, &m->rreq[b][n % FC_PCIE_DESCS]);
    m->sends_done[b] = m->out_done[b];
    m->recvs_done[b] = m->in_done[b];
  }
}
