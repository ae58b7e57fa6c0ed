/* lane_link.c — the ring kernels' second lane over a host link: the proxy's half (lane_link.h). */
#include "config.h"

#include <stdio.h>

#include "clock.h"
#include "error.h"
#include "gpu/lane_link.h"

/* A lane message's tag on the link: the sender, the block and the message's number (unique among
 * the block's messages of that kind in flight), under a message number of the lane's own per
 * kind; the host executor's messages on the link never meet a ring call's in flight (a host call
 * waits for the stream first), and its message numbers stay far below these. */
enum { TAG_DATA = 0x7ffffffe, TAG_DESC = 0x7ffffffd, TAG_ACK = 0x7ffffffc };
static uint64_t lane_tag(int sender, unsigned kind, unsigned block, uint64_t n) {
  return ((uint64_t)(uint16_t)sender << 48) | (1ull << 47) | ((uint64_t)kind << 16) | ((n & 0x1ffu) << 7) | block;
}

/* The one step that is for no block or message (fc_lane_link_slowest words it without them). */
static const char progress_step[] = "the link's progress";

/* Keep the step that began at t0 if it is the longest so far. */
static void timed(fc_lane_link_t *m, double t0, const char *what, unsigned b, uint64_t n) {
  const double us = fc_now_us() - t0;
  if (us <= m->slowest_us) return;
  m->slowest_us = us;
  m->slowest_what = what;
  m->slowest_block = b;
  m->slowest_msg = n;
}

/* A request: done (and released) or still in flight; 0 when the link failed it. */
static int req_done(fc_lane_link_t *m, fc_link_req_t *q, size_t expect, int *done, unsigned b, uint64_t n) {
  *done = 1;
  if (!*q) return 1;
  const double t0 = fc_now_us();
  const int ok = m->link->ops->test(m->comm, m->link, q, expect, done) == FLEXCOLL_SUCCESS;
  timed(m, t0, "a test", b, n);
  return ok;
}

/* Sends: retire those done (a message and, in band, its descriptor), then send what the kernel
 * published since.  0, or -1 when the link failed. */
static int turn_sends(fc_lane_link_t *m, unsigned b, int *moved) {
  const fc_link_ops_t *ops = m->link->ops;
  int done;
  while (m->sends_done[b] < m->out_done[b]) {
    const unsigned k = m->sends_done[b] % FC_PCIE_DESCS;
    if (!req_done(m, &m->dsreq[b][k], SIZE_MAX, &done, b, m->sends_done[b])) return -1;
    if (!done) break;
    if (!req_done(m, &m->sreq[b][k], SIZE_MAX, &done, b, m->sends_done[b])) return -1;
    if (!done) break;
    m->sends_done[b]++;
  }
  const uint64_t sent = __atomic_load_n((const uint64_t *)&m->sent[b], __ATOMIC_ACQUIRE);
  for (; m->out_done[b] < sent && m->out_done[b] - m->sends_done[b] < FC_PCIE_DESCS; m->out_done[b]++, *moved = 1) {
    const uint64_t n = m->out_done[b];
    const unsigned k = n % FC_PCIE_DESCS;
    const volatile fc_pcie_desc_t *d = &m->desc[b * FC_PCIE_DESCS + k];
    const fc_pcie_desc_t msg = {.off = d->off, .bytes = d->bytes, .ready = d->ready};
    m->sreq[b][k] = m->dsreq[b][k] = NULL;
    if (m->inband) {
      m->sdesc[b][k] = msg;
      if (ops->isend(m->comm, m->link, m->next, &m->sdesc[b][k], sizeof msg, lane_tag(m->rank, TAG_DESC, b, n),
                     &m->dsreq[b][k]) != FLEXCOLL_SUCCESS)
        return -1;
    }
    const double t0 = fc_now_us();
    if (msg.bytes && ops->isend(m->comm, m->link, m->next, m->outbox + msg.off, msg.bytes,
                                lane_tag(m->rank, TAG_DATA, b, n), &m->sreq[b][k]) != FLEXCOLL_SUCCESS)
      return -1;
    timed(m, t0, "a send", b, n);
  }
  return 0;
}

/* Post the receive of the previous rank's message n of block b, as its descriptor says. */
static int post_receive(fc_lane_link_t *m, unsigned b, uint64_t n, uint64_t off, uint64_t bytes, uint64_t ready) {
  const unsigned k = n % FC_PCIE_DESCS;
  if (off > m->box_bytes || bytes > m->box_bytes - off) {
    fc_error(m->comm, FLEXCOLL_REMOTE_ERROR,
             "ring lane over %s: rank %d's message %llu of block %u says %llu bytes at %llu, past the %zu-byte inbox",
             m->link->ops->name, m->prev, (unsigned long long)n, b, (unsigned long long)bytes, (unsigned long long)off,
             m->box_bytes);
    return -1;
  }
  m->rready[b][k] = ready;
  m->rbytes[b][k] = bytes;
  m->rreq[b][k] = NULL;
  const double t0 = fc_now_us();
  const int failed = bytes && m->link->ops->irecv(m->comm, m->link, m->prev, m->inbox + off, bytes,
                                                  lane_tag(m->prev, TAG_DATA, b, n), &m->rreq[b][k]) != FLEXCOLL_SUCCESS;
  timed(m, t0, "a receive", b, n);
  return failed ? -1 : 0;
}

/* Receives: post those of the messages the previous rank published (its descriptors read from its
 * host area, or in band received ahead of them), then raise the ready counter past the receives
 * done, in order.  0 or 1 (raised), -1 when the link or raise_ready failed. */
static int turn_receives(fc_lane_link_t *m, unsigned b, int *moved) {
  int done;
  if (!m->inband) {
    const uint64_t published = __atomic_load_n((const uint64_t *)&m->prev_sent[b], __ATOMIC_ACQUIRE);
    for (; m->in_done[b] < published && m->in_done[b] - m->recvs_done[b] < FC_PCIE_DESCS; m->in_done[b]++, *moved = 1) {
      const volatile fc_pcie_desc_t *d = &m->prev_desc[b * FC_PCIE_DESCS + m->in_done[b] % FC_PCIE_DESCS];
      if (post_receive(m, b, m->in_done[b], d->off, d->bytes, d->ready)) return -1;
    }
  } else {
    for (; m->desc_posted[b] < m->recvs_done[b] + FC_PCIE_DESCS; m->desc_posted[b]++) {
      const uint64_t n = m->desc_posted[b];
      const unsigned k = n % FC_PCIE_DESCS;
      m->drreq[b][k] = NULL;
      if (m->link->ops->irecv(m->comm, m->link, m->prev, &m->rdesc[b][k], sizeof m->rdesc[b][k],
                              lane_tag(m->prev, TAG_DESC, b, n), &m->drreq[b][k]) != FLEXCOLL_SUCCESS)
        return -1;
    }
    while (m->in_done[b] < m->desc_posted[b]) {
      const unsigned k = m->in_done[b] % FC_PCIE_DESCS;
      if (!req_done(m, &m->drreq[b][k], sizeof m->rdesc[b][k], &done, b, m->in_done[b])) return -1;
      if (!done) break;
      const fc_pcie_desc_t *d = &m->rdesc[b][k];
      if (post_receive(m, b, m->in_done[b], d->off, d->bytes, d->ready)) return -1;
      m->in_done[b]++;
      *moved = 1;
    }
  }
  uint64_t ready = 0, bytes = 0;
  while (m->recvs_done[b] < m->in_done[b]) {
    const unsigned k = m->recvs_done[b] % FC_PCIE_DESCS;
    if (!req_done(m, &m->rreq[b][k], m->rbytes[b][k], &done, b, m->recvs_done[b])) return -1;
    if (!done) break;
    ready = m->rready[b][k];
    bytes += m->rbytes[b][k];
    m->recvs_done[b]++;
  }
  if (!ready) return 0;
  const double t0 = fc_now_us();
  const int failed = m->raise_ready(m->arg, b, ready, bytes);
  timed(m, t0, "raising a ready counter", b, m->recvs_done[b] - 1);
  return failed ? -1 : 1;
}

/* In band: tell the previous rank what our kernel consumed since we last did, and raise our
 * kernel's ack counter from what the next rank tells us. */
static int turn_acks(fc_lane_link_t *m, unsigned b, int *moved) {
  const fc_link_ops_t *ops = m->link->ops;
  int done;
  while (m->acks_sent_done[b] < m->acks_sent[b]) {
    if (!req_done(m, &m->asreq[b][m->acks_sent_done[b] % FC_LANE_ACKS], SIZE_MAX, &done, b, m->acks_sent_done[b]))
      return -1;
    if (!done) break;
    m->acks_sent_done[b]++;
  }
  const uint64_t consumed = __atomic_load_n((const uint64_t *)&m->ack_out[b], __ATOMIC_ACQUIRE);
  if (consumed > m->ack_told[b] && m->acks_sent[b] - m->acks_sent_done[b] < FC_LANE_ACKS) {
    const uint64_t j = m->acks_sent[b];
    m->ack_sbuf[b][j % FC_LANE_ACKS] = consumed;
    m->asreq[b][j % FC_LANE_ACKS] = NULL;
    if (ops->isend(m->comm, m->link, m->prev, &m->ack_sbuf[b][j % FC_LANE_ACKS], sizeof(uint64_t),
                   lane_tag(m->rank, TAG_ACK, b, j), &m->asreq[b][j % FC_LANE_ACKS]) != FLEXCOLL_SUCCESS)
      return -1;
    m->ack_told[b] = consumed;
    m->acks_sent[b]++;
    *moved = 1;
  }
  for (; m->acks_posted[b] < m->acks_in_done[b] + FC_LANE_ACKS; m->acks_posted[b]++) {
    const uint64_t j = m->acks_posted[b];
    m->arreq[b][j % FC_LANE_ACKS] = NULL;
    if (ops->irecv(m->comm, m->link, m->next, &m->ack_rbuf[b][j % FC_LANE_ACKS], sizeof(uint64_t),
                   lane_tag(m->next, TAG_ACK, b, j), &m->arreq[b][j % FC_LANE_ACKS]) != FLEXCOLL_SUCCESS)
      return -1;
  }
  while (m->acks_in_done[b] < m->acks_posted[b]) {
    const unsigned j = m->acks_in_done[b] % FC_LANE_ACKS;
    if (!req_done(m, &m->arreq[b][j], sizeof(uint64_t), &done, b, m->acks_in_done[b])) return -1;
    if (!done) break;
    /* Acknowledgements come in order, each the latest: the counter only grows. */
    if (m->ack_rbuf[b][j] > m->ack_in[b]) __atomic_store_n((uint64_t *)&m->ack_in[b], m->ack_rbuf[b][j], __ATOMIC_RELEASE);
    m->acks_in_done[b]++;
    *moved = 1;
  }
  return 0;
}

int fc_lane_link_busy(const fc_lane_link_t *m) {
  if (m->inband) return 1; /* descriptor and acknowledgement receives stay posted */
  for (unsigned b = 0; b < m->blocks; b++)
    if (m->sends_done[b] < m->out_done[b] || m->recvs_done[b] < m->in_done[b]) return 1;
  return 0;
}

int fc_lane_link_turn(fc_lane_link_t *m) {
  if (fc_lane_link_busy(m)) {
    const double t0 = fc_now_us();
    m->link->ops->progress(m->link);
    timed(m, t0, progress_step, 0, 0);
  }
  int moved = 0;
  for (unsigned b = 0; b < m->blocks; b++) {
    if (turn_sends(m, b, &moved) || (m->inband && turn_acks(m, b, &moved))) return -1;
    const int k = turn_receives(m, b, &moved);
    if (k < 0) return -1;
    moved |= k;
  }
  return moved;
}

int fc_lane_link_drain(fc_lane_link_t *m, double deadline_us) {
  for (;;) {
    int pending = 0;
    for (unsigned b = 0; m->inband && b < m->blocks; b++)
      pending |= m->acks_sent_done[b] < m->acks_sent[b] ||
                 __atomic_load_n((const uint64_t *)&m->ack_out[b], __ATOMIC_ACQUIRE) > m->ack_told[b];
    if (!pending) return 0;
    if (fc_lane_link_turn(m) < 0 || fc_now_us() > deadline_us) return -1;
  }
}

void fc_lane_link_slowest(const fc_lane_link_t *m, char *buf, size_t len) {
  if (!m->slowest_what) snprintf(buf, len, "the mover has not called its link yet");
  else if (m->slowest_what == progress_step)
    snprintf(buf, len, "the mover's longest step: %s, %.1f ms", progress_step, m->slowest_us / 1e3);
  else
    snprintf(buf, len, "the mover's longest step: %s of block %u's message %llu, %.1f ms", m->slowest_what,
             m->slowest_block, (unsigned long long)m->slowest_msg, m->slowest_us / 1e3);
}

static void cancel_range(fc_lane_link_t *m, fc_link_req_t *reqs, unsigned ring, uint64_t from, uint64_t to) {
  for (uint64_t n = from; n < to; n++)
    if (reqs[n % ring]) m->link->ops->cancel(m->link, &reqs[n % ring]);
}

void fc_lane_link_cancel(fc_lane_link_t *m) {
  for (unsigned b = 0; b < m->blocks; b++) {
    cancel_range(m, m->sreq[b], FC_PCIE_DESCS, m->sends_done[b], m->out_done[b]);
    cancel_range(m, m->dsreq[b], FC_PCIE_DESCS, m->sends_done[b], m->out_done[b]);
    cancel_range(m, m->rreq[b], FC_PCIE_DESCS, m->recvs_done[b], m->in_done[b]);
    cancel_range(m, m->drreq[b], FC_PCIE_DESCS, m->in_done[b], m->desc_posted[b]);
    cancel_range(m, m->asreq[b], FC_LANE_ACKS, m->acks_sent_done[b], m->acks_sent[b]);
    cancel_range(m, m->arreq[b], FC_LANE_ACKS, m->acks_in_done[b], m->acks_posted[b]);
    m->sends_done[b] = m->out_done[b];
    m->recvs_done[b] = m->in_done[b];
    m->desc_posted[b] = m->in_done[b];
    m->acks_sent_done[b] = m->acks_sent[b];
    m->acks_posted[b] = m->acks_in_done[b];
  }
}
