/* pcie_ce.c — the ring kernels' second lane moved by a proxy thread per rank: copy engines
 * through the host areas (the pcie link), or a host link that takes device buffers (rdma).
 *
 * Why: SM loads and stores of pinned host memory through one PCIe port at once top out well
 * below what the copy engines move both ways (docs/PERFORMANCE.md, tools/sysmem_sm_bench.cu and
 * the TMA variant), so with FLEXCOLL_PCIE_ENGINE=ce the ring kernel's pcie blocks keep their
 * protocol but touch only device memory: a push stores the message into our outbox and publishes
 * it (kernels.h, fc_pcie_desc_t); this rank's proxy copies it device -> host into our host area
 * (the staging the next rank maps) and marks it staged; the next rank's proxy copies it host ->
 * device into that rank's inbox and raises its ready counter.  Each hop is a cudaMemcpyAsync
 * followed, on the same stream, by a stream write of the counter, so a counter never runs ahead
 * of its bytes and the proxy never waits for a copy.  Each GPU's own copy engines do its hops
 * (device -> host of what it sends, host -> device of what it receives): its own PCIe port.
 *
 * The proxy follows counters only (published counts, staged counts), never a call: a graph that
 * replays ring kernels is served as eager calls are.  Copy-engine work and stream memory writes
 * on the proxy's streams progress while the ring kernels spin, with one hardware queue too
 * (measured on the node: docs/PERFORMANCE.md, session 15).  Flow control is the ring's own: a
 * block writes message m into its outbox only after the next rank consumed m - S, which implies
 * both proxies are done with that slot (outbox, staging, inbox) and its descriptor.
 *
 * Over a link (FLEXCOLL_RING_LANE=rdma, the side lane's link) the kernels' protocol is the same; the
 * proxy sends each published message from our outbox to the next rank as one of the link's
 * messages (GPUDirect RDMA on a NIC: no host copy), and receives the previous rank's into our
 * inbox at the offset its descriptor gives (read from its host area, as the copies read its
 * staged count), then raises our ready counter by a stream write, behind a flush of the NIC's
 * writes into device memory where the GPU offers one.  Messages of one block are sent and
 * received in order, each tagged with its block and number; a message of no bytes is neither
 * sent nor received (both ends read the same descriptor).  Within one host the descriptors and
 * the kernels' acknowledgements stay in the host areas; between hosts (the side lane's inband) they go
 * over the link too, the kernel acknowledging into a stand-in in our own area that the proxy
 * forwards (lane_link.h).  The link's own flow control and the ring's bound what is in flight. */
#define _GNU_SOURCE
#include "config.h"

#if HAVE_CUDA
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "comm.h"
#include "error.h"
#include "gpu/device.h"
#include "log.h"
#include "param.h"
#include "gpu/lane_link.h"

typedef CUresult (*fc_write_value64_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

/* How busy each hop's stream was: its batches (copies behind one counter write) are done in
 * stream order, so the proxy watches only the oldest one's counter and counts the stream busy
 * from a batch's enqueue (or the previous batch's end) to the moment it sees the counter.  Set
 * against the time the lane had anything in flight, this tells a slow copy (bytes per busy
 * second low) from a stalled pipeline (streams idle while the lane is active). */
#define FC_HOP_TRACE_MAX 256u
typedef struct {
  double enqueued_us;
  uint64_t target, bytes; /* the counter value that says it landed; its bytes */
  unsigned block;
} fc_hop_batch_t;
typedef struct {
  fc_hop_batch_t q[FC_HOP_TRACE_MAX];
  unsigned head, tail; /* pending batches: q[head % MAX] .. q[(tail - 1) % MAX] */
  double last_done_us, busy_us;
  uint64_t batches, bytes, lost; /* lost: batches not traced (the queue was full) */
} fc_hop_trace_t;

struct fc_pcie_proxy {
  pthread_t thread;
  atomic_int stop;
  /* Dozing (fc_pcie_ce_kick): the proxy sleeps on wake, which every enqueue of a ring call with
   * a pcie share bumps; sleeping says whether the bump needs a system call to wake it. */
  atomic_uint wake;
  atomic_int sleeping;
  int device, rank;
  unsigned blocks;
  cudaStream_t out, in;
  fc_write_value64_fn write64;
  /* Ours: the kernel's published counts and descriptors, the staging it is copied into, and the
   * counters the stream writes raise (device views of our host area). */
  const volatile uint64_t *sent;
  const volatile fc_pcie_desc_t *desc;
  char *staging;
  CUdeviceptr staged_dev, ready_dev;
  /* The kernel's ready counters in device memory (FLEXCOLL_PCIE_CE_READY=device), raised before
   * ready_dev, which then only mirrors them for the trace and the stall report; 0: none. */
  CUdeviceptr ready_kernel;
  char *outbox, *inbox;
  /* The previous rank's: what its proxy has staged, its descriptors and its staging. */
  const volatile uint64_t *prev_staged;
  const volatile fc_pcie_desc_t *prev_desc;
  const char *prev_staging;
  uint64_t out_done[FC_MAX_BLOCKS], in_done[FC_MAX_BLOCKS];
  const volatile int *error; /* the kernels' timeout flag: once set, say where the lane stood */
  const volatile uint64_t *ctr; /* ours: ready, then ack (FC_MAX_BLOCKS each) */
  const volatile uint64_t *staged;
  fc_hop_trace_t trace_out, trace_in;
  double active_us; /* time with a batch in flight on either stream */
  /* The link mover (the side lane's link; mover.link NULL: copy engines), lane_link.h. */
  fc_lane_link_t mover;
  int gdr_flush; /* the device can flush remote (NIC) writes before a counter says they landed */
};

static void trace_enqueued(fc_hop_trace_t *t, unsigned block, uint64_t target, uint64_t bytes, double now) {
  if (t->tail - t->head == FC_HOP_TRACE_MAX) {
    t->lost++;
    return;
  }
  t->q[t->tail++ % FC_HOP_TRACE_MAX] = (fc_hop_batch_t){.enqueued_us = now, .target = target, .bytes = bytes, .block = block};
}

/* Retire the batches whose counters (counter[block]) have reached their targets, oldest first. */
static void trace_landed(fc_hop_trace_t *t, const volatile uint64_t *counter, double now) {
  while (t->head != t->tail) {
    const unsigned i = t->head % FC_HOP_TRACE_MAX;
    if (counter[t->q[i].block] < t->q[i].target) break;
    const double from = t->q[i].enqueued_us > t->last_done_us ? t->q[i].enqueued_us : t->last_done_us;
    t->busy_us += now - from;
    t->last_done_us = now;
    t->batches++;
    t->bytes += t->q[i].bytes;
    t->head++;
  }
}

static void trace_line(const struct fc_pcie_proxy *x, const char *hop, const fc_hop_trace_t *t) {
  if (!t->batches) return;
  FC_INFO(FC_SUB_SCHED,
          "rank %d: pcie lane (copy engines), %s: %llu batches, %.1f MB, stream busy %.1f ms (%.1f GB/s while busy), "
          "%.0f%% of the %.1f ms the lane had bytes in flight%s",
          x->rank, hop, (unsigned long long)t->batches, t->bytes / 1e6, t->busy_us / 1e3,
          t->busy_us > 0 ? t->bytes / t->busy_us / 1e3 : 0.0, x->active_us > 0 ? 100.0 * t->busy_us / x->active_us : 0.0,
          x->active_us / 1e3, t->lost ? " (some batches not traced)" : "");
}

/* Every block's counters as this proxy sees them, so that a stall names the hop it stopped at
 * (kernel -> proxy, proxy -> staged, staged -> the next proxy): a warning once a kernel timed
 * out, an INFO line (SCHED) once the lane has been idle a while. */
static void report(const struct fc_pcie_proxy *x, int warn) {
  for (unsigned b = 0; b < x->blocks; b++) {
    const fc_lane_link_t *m = &x->mover;
    /* In band the previous rank's published count is not visible here: its descriptors received. */
    const uint64_t sent = x->sent[b], staged = x->staged[b],
                   prev = !m->link ? x->prev_staged[b] : m->inband ? m->in_done[b] : m->prev_sent[b];
    if (!sent && !prev) continue;
    char line[400];
    if (!m->link) {
      snprintf(line, sizeof line,
               "rank %d: pcie lane (copy engines) %s, block %u: published %llu, copied out %llu, staged %llu; previous "
               "rank staged %llu, copied in %llu; ready %llu, ack %llu",
               x->rank, warn ? "at the timeout" : "idle", b, (unsigned long long)sent, (unsigned long long)x->out_done[b],
               (unsigned long long)staged, (unsigned long long)prev, (unsigned long long)x->in_done[b],
               (unsigned long long)x->ctr[b], (unsigned long long)x->ctr[FC_MAX_BLOCKS + b]);
    } else {
      const int len = snprintf(line, sizeof line,
                               "rank %d: ring lane %s %s, block %u: published %llu, sent %llu (%llu done); previous rank "
                               "%s %llu, received %llu (%llu done); ready %llu, ack %llu",
                               x->rank, m->link->ops->name, warn ? "at the timeout" : "idle", b, (unsigned long long)sent,
                               (unsigned long long)m->out_done[b], (unsigned long long)m->sends_done[b],
                               m->inband ? "described" : "published", (unsigned long long)prev,
                               (unsigned long long)m->in_done[b], (unsigned long long)m->recvs_done[b],
                               (unsigned long long)x->ctr[b], (unsigned long long)x->ctr[FC_MAX_BLOCKS + b]);
      if (m->inband && len > 0 && (size_t)len < sizeof line)
        snprintf(line + len, sizeof line - (size_t)len, "; acknowledged %llu (told %llu), the next rank's acks received %llu",
                 (unsigned long long)m->ack_out[b], (unsigned long long)m->ack_told[b],
                 (unsigned long long)m->acks_in_done[b]);
    }
    if (warn) FC_WARN("%s", line);
    else FC_INFO(FC_SUB_SCHED, "%s", line);
  }
  /* The link's own view of the two neighbours: where a message the mover posted stands. */
  const fc_lane_link_t *m = &x->mover;
  if (!m->link) return;
  char slow[200];
  fc_lane_link_slowest(m, slow, sizeof slow);
  if (warn) FC_WARN("rank %d: %s", x->rank, slow);
  else FC_INFO(FC_SUB_SCHED, "rank %d: %s", x->rank, slow);
  if (!m->link->ops->describe) return;
  const int peers[2] = {m->next, m->prev};
  for (int i = 0; i < (m->next == m->prev ? 1 : 2); i++) {
    char line[600];
    m->link->ops->describe(m->link, peers[i], line, sizeof line);
    if (warn) FC_WARN("rank %d: %s", x->rank, line);
    else FC_INFO(FC_SUB_SCHED, "rank %d: %s", x->rank, line);
  }
}

/* A copy of one message on a proxy stream. */
static int copy(cudaStream_t s, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  return !bytes || cudaMemcpyAsync(dst, src, bytes, kind, s) == cudaSuccess;
}

/* Idle rounds: spinning, then yielding, then short sleeps; after a few seconds of those the
 * proxy dozes, sleeping up to FC_PCIE_DOZE_NS at a time unless an enqueue wakes it (graph
 * replays enqueue nothing: their first message may wait that long); the idle report comes a
 * few seconds later. */
#define FC_PCIE_SPIN 2000u
#define FC_PCIE_YIELD 20000u
#define FC_PCIE_DOZE 70000u
#define FC_PCIE_DOZE_NS 1000000L
#define FC_PCIE_IDLE_REPORT (FC_PCIE_DOZE + 4000u)
/* How long a stopping proxy gives its last acknowledgements over a link (in band). */
#define FC_LANE_DRAIN_US 2e6

static void doze(struct fc_pcie_proxy *x, unsigned seen) {
  atomic_store(&x->sleeping, 1);
  const struct timespec t = {0, FC_PCIE_DOZE_NS};
  /* Returns at once if an enqueue bumped wake since seen was read. */
  syscall(SYS_futex, &x->wake, FUTEX_WAIT_PRIVATE, seen, &t, NULL, 0);
  atomic_store(&x->sleeping, 0);
}

void fc_pcie_ce_kick(fc_side_lane_t *s) {
  struct fc_pcie_proxy *x = s->proxy;
  if (!x) return;
  atomic_fetch_add(&x->wake, 1u);
  if (atomic_load(&x->sleeping)) syscall(SYS_futex, &x->wake, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* The link mover's raise_ready: the NIC's writes into device memory may still be on their way
 * when its completion is seen, so they are flushed before the counter the kernel trusts them by;
 * then the counter, by a stream write (its mirror in our host area too, for the trace). */
static int link_raise_ready(void *arg, unsigned b, uint64_t ready, uint64_t bytes) {
  struct fc_pcie_proxy *x = arg;
  if (x->gdr_flush && cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                                         cudaFlushGPUDirectRDMAWritesToOwner) != cudaSuccess)
    return -1;
  if ((x->ready_kernel && x->write64(x->in, x->ready_kernel + b * sizeof(uint64_t), ready, 0) != CUDA_SUCCESS) ||
      x->write64(x->in, x->ready_dev + b * sizeof(uint64_t), ready, 0) != CUDA_SUCCESS)
    return -1;
  trace_enqueued(&x->trace_in, b, ready, bytes, fc_now_us());
  return 0;
}

static void *proxy_main(void *arg) {
  struct fc_pcie_proxy *x = arg;
  cudaSetDevice(x->device);
  unsigned idle = 0, seen = atomic_load(&x->wake);
  int reported = 0;
  double last_us = fc_now_us();
  while (!atomic_load_explicit(&x->stop, memory_order_acquire)) {
    const int in_flight = x->trace_out.head != x->trace_out.tail || x->trace_in.head != x->trace_in.tail;
    const double now = fc_now_us();
    if (in_flight) {
      x->active_us += now - last_us;
      trace_landed(&x->trace_out, x->staged, now);
      trace_landed(&x->trace_in, x->ctr, now);
    }
    last_us = now;
    const unsigned wake = atomic_load(&x->wake);
    int moved = wake != seen; /* a call is on its way: spin */
    seen = wake;
    if (x->mover.link) {
      const int m = fc_lane_link_turn(&x->mover);
      if (m < 0) goto link_failed;
      moved |= m;
    }
    /* A block's messages found ready together are copied one after another, then one counter
     * write behind the last covers them all (the counters only grow). */
    for (unsigned b = 0; !x->mover.link && b < x->blocks; b++) {
      const uint64_t sent = __atomic_load_n((const uint64_t *)&x->sent[b], __ATOMIC_ACQUIRE);
      if (x->out_done[b] < sent) {
        uint64_t batch = 0;
        for (; x->out_done[b] < sent; x->out_done[b]++) {
          const volatile fc_pcie_desc_t *d = &x->desc[b * FC_PCIE_DESCS + x->out_done[b] % FC_PCIE_DESCS];
          const size_t off = d->off, bytes = d->bytes;
          if (!copy(x->out, x->staging + off, x->outbox + off, bytes, cudaMemcpyDeviceToHost)) goto failed;
          batch += bytes;
        }
        if (x->write64(x->out, x->staged_dev + b * sizeof(uint64_t), sent, 0) != CUDA_SUCCESS) goto failed;
        trace_enqueued(&x->trace_out, b, sent, batch, last_us);
        moved = 1;
      }
      const uint64_t staged = __atomic_load_n((const uint64_t *)&x->prev_staged[b], __ATOMIC_ACQUIRE);
      if (x->in_done[b] < staged) {
        uint64_t ready = 0, batch = 0;
        for (; x->in_done[b] < staged; x->in_done[b]++) {
          const volatile fc_pcie_desc_t *d = &x->prev_desc[b * FC_PCIE_DESCS + x->in_done[b] % FC_PCIE_DESCS];
          const size_t off = d->off, bytes = d->bytes;
          ready = d->ready;
          if (!copy(x->in, x->inbox + off, x->prev_staging + off, bytes, cudaMemcpyHostToDevice)) goto failed;
          batch += bytes;
        }
        if (x->ready_kernel && x->write64(x->in, x->ready_kernel + b * sizeof(uint64_t), ready, 0) != CUDA_SUCCESS)
          goto failed;
        if (x->write64(x->in, x->ready_dev + b * sizeof(uint64_t), ready, 0) != CUDA_SUCCESS) goto failed;
        trace_enqueued(&x->trace_in, b, ready, batch, last_us);
        moved = 1;
      }
    }
    if (!reported && *x->error == 1) reported = 1, report(x, 1);
    /* Where a lane stands once it has been still for a while (FLEXCOLL_DEBUG=INFO, SCHED): the
     * last call's counters, or those of a stall that has not timed out yet. */
    if (idle == FC_PCIE_IDLE_REPORT) report(x, 0);
    /* Spin while messages flow, then yield, then sleep, then doze: an idle communicator's
     * proxy costs next to nothing, and an eager call wakes it as it is enqueued. */
    if (moved) idle = 0;
    else if (++idle > FC_PCIE_DOZE) doze(x, seen);
    else if (idle > FC_PCIE_YIELD) nanosleep(&(struct timespec){0, 20000}, NULL);
    else if (idle > FC_PCIE_SPIN) sched_yield();
  }
  if (x->mover.link) {
    /* In band the previous rank's kernel may still wait for our last acknowledgement (ours has
     * ended, its last wait has not): it goes out first, unless a kernel already failed. */
    if (!*x->error && fc_lane_link_drain(&x->mover, fc_now_us() + FC_LANE_DRAIN_US))
      FC_WARN("rank %d: ring lane %s: the last acknowledgements did not go out: %s", x->rank, x->mover.link->ops->name,
              flexcoll_get_last_error(x->mover.comm));
    fc_lane_link_cancel(&x->mover);
  }
  return NULL;
failed:
  /* The ring kernels waiting for these messages time out and say so; this says why. */
  FC_WARN("rank %d: pcie lane proxy stopped: a copy or stream write failed: %s", x->rank,
          cudaGetErrorString(cudaGetLastError()));
  return NULL;
link_failed:
  FC_WARN("rank %d: ring lane %s: the proxy stopped: %s", x->rank, x->mover.link->ops->name,
          flexcoll_get_last_error(x->mover.comm));
  fc_lane_link_cancel(&x->mover);
  return NULL;
}

flexcoll_result_t fc_pcie_ce_start(struct flexcoll_comm *comm, struct fc_gpu *g, fc_side_lane_t *s, char *why,
                                   size_t wlen) {
  enum cudaDriverEntryPointQueryResult q;
  void *w = NULL;
  if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &w, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    snprintf(why, wlen, "the CUDA driver has no 64-bit stream writes");
    return FLEXCOLL_SUCCESS;
  }
  struct fc_pcie_proxy *x = calloc(1, sizeof *x);
  if (!x) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  x->write64 = (fc_write_value64_fn)w;
  x->device = g->device;
  x->rank = comm->rank;
  x->blocks = s->blocks;
  x->sent = (const volatile uint64_t *)(s->own_host + FC_PCIE_SENT_OFF);
  x->desc = (const volatile fc_pcie_desc_t *)(s->own_host + FC_PCIE_DESC_OFF);
  x->staging = s->own_host + s->ctr_bytes;
  x->staged_dev = (CUdeviceptr)(s->own + FC_PCIE_STAGED_OFF);
  x->ready_dev = (CUdeviceptr)s->own; /* the ready counters come first (kernels.h) */
  x->error = g->error_host;
  x->ctr = (const volatile uint64_t *)s->own_host;
  x->staged = (const volatile uint64_t *)(s->own_host + FC_PCIE_STAGED_OFF);
  if (s->prev_host) { /* not in band */
    x->prev_staged = (const volatile uint64_t *)(s->prev_host + FC_PCIE_STAGED_OFF);
    x->prev_desc = (const volatile fc_pcie_desc_t *)(s->prev_host + FC_PCIE_DESC_OFF);
    x->prev_staging = s->prev_host + s->ctr_bytes;
  }
  if (s->link) {
    fc_lane_link_t *m = &x->mover;
    m->comm = comm;
    m->link = s->link;
    m->rank = comm->rank;
    m->next = g->ring_next;
    m->prev = g->ring_prev;
    m->blocks = x->blocks;
    m->sent = x->sent;
    m->desc = x->desc;
    m->box_bytes = s->area_bytes;
    m->inband = s->inband;
    if (s->inband) {
      /* The kernel raises the previous rank's ack at pc_ctr_prev + FC_MAX_BLOCKS (exec.c points
       * it at the stand-in); our own ack counters follow our ready counters. */
      m->ack_out = (const volatile uint64_t *)(s->own_host + FC_PCIE_PREV_OFF) + FC_MAX_BLOCKS;
      m->ack_in = (volatile uint64_t *)s->own_host + FC_MAX_BLOCKS;
    } else {
      m->prev_sent = (const volatile uint64_t *)(s->prev_host + FC_PCIE_SENT_OFF);
      m->prev_desc = x->prev_desc;
    }
    m->raise_ready = link_raise_ready;
    m->arg = x;
    int flush = 0;
    if (cudaDeviceGetAttribute(&flush, cudaDevAttrGPUDirectRDMAFlushWritesOptions, g->device) != cudaSuccess) flush = 0;
    x->gdr_flush = (flush & cudaFlushGPUDirectRDMAWritesOptionHost) != 0;
    cudaGetLastError();
  }
  /* Published counts, then the kernel's ready counters, after the two boxes. */
  cudaError_t e = cudaMalloc((void **)&s->boxes, 2 * s->area_bytes + 2 * FC_MAX_BLOCKS * sizeof(uint64_t));
  if (e == cudaSuccess) {
    x->outbox = x->mover.outbox = s->boxes;
    x->inbox = x->mover.inbox = s->boxes + s->area_bytes;
    s->pub = (uint64_t *)(s->boxes + 2 * s->area_bytes);
    if (strcmp(fc_param_str("FLEXCOLL_PCIE_CE_READY", "device"), "host") != 0) {
      s->ready = s->pub + FC_MAX_BLOCKS;
      x->ready_kernel = (CUdeviceptr)s->ready;
    }
    e = cudaMemsetAsync(s->pub, 0, 2 * FC_MAX_BLOCKS * sizeof(uint64_t), g->util_stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(g->util_stream);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&x->out, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&x->in, cudaStreamNonBlocking);
  /* Each stream's first copy and stream write now, while no kernel of ours waits for them: a
   * first use may set up state in the driver that waits for the device (seen on the node: the
   * first of a fresh process's operations held back behind a spinning kernel).  The values
   * written are the counters' own (zero). */
  if (e == cudaSuccess) e = cudaMemcpyAsync(x->staging, x->outbox, 16, cudaMemcpyDeviceToHost, x->out);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(x->inbox, x->prev_staging ? x->prev_staging : x->staging, 16, cudaMemcpyHostToDevice, x->in);
  if (e == cudaSuccess && (x->write64(x->out, x->staged_dev, 0, 0) != CUDA_SUCCESS ||
                           (x->ready_kernel && x->write64(x->in, x->ready_kernel, 0, 0) != CUDA_SUCCESS) ||
                           x->write64(x->in, x->ready_dev, 0, 0) != CUDA_SUCCESS))
    e = cudaErrorUnknown;
  if (e == cudaSuccess) e = cudaStreamSynchronize(x->out);
  if (e == cudaSuccess) e = cudaStreamSynchronize(x->in);
  /* A link copies the lane's device boxes itself (eager messages through host memory): its copy
   * stream and pinned bounce buffer now too, for the same reason (gpu.h, fc_mem_prepare). */
  char prep[200];
  if (e == cudaSuccess && x->mover.link && fc_mem_prepare(g->device, x->outbox, prep, sizeof prep))
    FC_INFO(FC_SUB_SCHED, "rank %d: ring lane %s: device copies not prepared (%s): made at their first use", comm->rank,
            x->mover.link->ops->name, prep);
  fc_link_t *link = x->mover.link;
  if (e == cudaSuccess && link && link->ops->prepare_device && link->ops->prepare_device(link, g->device, prep, sizeof prep))
    FC_INFO(FC_SUB_SCHED, "rank %d: ring lane %s: the link's host memory stays pageable (%s): its copies go through a "
            "bounce buffer", comm->rank, link->ops->name, prep);
  int err = e == cudaSuccess ? pthread_create(&x->thread, NULL, proxy_main, x) : 0;
  if (e != cudaSuccess || err) {
    snprintf(why, wlen, "starting its proxy: %s", e != cudaSuccess ? cudaGetErrorString(e) : strerror(err));
    cudaGetLastError();
    if (x->out) cudaStreamDestroy(x->out);
    if (x->in) cudaStreamDestroy(x->in);
    cudaFree(s->boxes);
    s->boxes = NULL;
    s->pub = NULL;
    s->ready = NULL;
    free(x);
    return FLEXCOLL_SUCCESS;
  }
  s->proxy = x;
  return FLEXCOLL_SUCCESS;
}

void fc_pcie_ce_stop(fc_side_lane_t *s) {
  struct fc_pcie_proxy *x = s->proxy;
  if (x) {
    atomic_store_explicit(&x->stop, 1, memory_order_release);
    fc_pcie_ce_kick(s);
    pthread_join(x->thread, NULL);
    cudaStreamSynchronize(x->out);
    cudaStreamSynchronize(x->in);
    trace_line(x, "device -> host", &x->trace_out);
    trace_line(x, "host -> device", &x->trace_in);
    cudaStreamDestroy(x->out);
    cudaStreamDestroy(x->in);
    free(x);
    s->proxy = NULL;
  }
  cudaFree(s->boxes);
  s->boxes = NULL;
  s->pub = NULL;
  s->ready = NULL;
  cudaGetLastError();
}
#endif
