/* test_rdma_gpu.c — device buffers over the rdma link (GPUDirect RDMA), against the fake provider.
 *
 * Two ranks, threads of one process, each a device communicator on GPU 0 whose only link is rdma
 * (FLEXCOLL_LINKS=rdma: no peer access, so the device paths hand send/recv batches to the host
 * links).  Every transfer goes straight from and into the device buffers: at and above the
 * zero-copy threshold the link registers them with the "NIC" (through a dma-buf of the
 * allocation, else by address where nvidia-peermem would allow it) and writes from one into the
 * other; below it, and where neither registration works, it copies them through its slots.  The
 * fake reads and writes GPU memory through the CUDA driver, as a NIC's DMA would.
 *
 * Each mode runs in a child process of its own (the fake reads its faults once per process):
 *   dmabuf    the default: registrations through dma-buf where this GPU can export one
 *   peermem   the fake's NIC driver without dma-buf, nvidia-peermem loaded: by address
 *   copy      neither: every byte through the slots (fc_mem_copy)
 *   eager     zero copy off (FLEXCOLL_RDMA_ZCOPY_BYTES=0): the slots at every size
 *   nocache   dma-buf with the registration cache off (FLEXCOLL_RDMA_RCACHE_BYTES=0): a
 *             registration per message and side
 * In each, both ranks send to each other at once (a group) messages of sizes around the
 * threshold and the slot size, odd and large (several writes of the port's largest message),
 * from buffers at odd offsets into their allocations; every received byte is checked; the fake's
 * counts show which registration carried them; nothing stays registered after destroy.  Then
 * each rank frees its send buffer, allocates another (often at the same address) and sends
 * from it: the device registration cache, which registers each allocation once, must register
 * the new one (its buffer id differs) and drop the freed one's, so that the fake's live
 * registrations are as many as before.  Then every collective (allgather, broadcast, alltoall,
 * allreduce, reduce_scatter, reduce) in and out of place, below and above the threshold, every
 * element checked: they go straight between the device buffers too, their reductions on the
 * device, so the fake registers no host memory meanwhile (the in-place alltoall's copy is pool
 * memory, which has no context of its own); last a float average (the division on the device).
 *
 * FC_TEST_RDMA_REAL=1 (tests/test_rdma_real.sh) runs the same transfers with the real provider,
 * libibverbs, for machines with a NIC: modes `real` (whichever registration the NIC takes) and
 * `real-eager`, every byte checked, no registration counts (the fake's); 77 without a device.
 *
 * Exit 77 (automake's skip) without a GPU. */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flexcoll.h"
#include "gpu/gpu.h"
#define TEST_TAG "[test_rdma_gpu]"
#include "crash_report.h"
#include "gpu_ranks.h"
#include "gpu_serial.h"
#include "transports/verbs.h"

#define NRANKS 2
#define OFFSET 3 /* bytes into each allocation: buffers need not start on a page */

static const size_t sizes[] = {1, 7, 4099, 65536, 196609, 262144, 1048593, 9437189};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define LARGEST 9437189

typedef struct {
  FC_TEST_RANK_MEMBERS;
} rank_t;

/* Byte i of what rank `from` sends in round k. */
static unsigned char pattern(int from, size_t k, size_t i) {
  return (unsigned char)(i * 131u + k * 29u + (unsigned)from * 71u + (i >> 9));
}

static void *fake_fn(const char *name) {
  void *h = dlopen(getenv("FLEXCOLL_VERBS_FAKE_LIB"), RTLD_NOW | RTLD_NOLOAD);
  void *f = h ? dlsym(h, name) : NULL;
  if (h) dlclose(h);
  return f;
}

/* Registrations live in this process (the fake's count), -1 with the real provider. */
static long live_registrations(void) {
  void (*mrs)(long *, long *, long *) = (void (*)(long *, long *, long *))fake_fn("fake_verbs_mr_stats");
  long ever = 0, now = -1, plain = 0;
  if (mrs) mrs(&ever, &now, &plain);
  return now;
}

/* Both ranks here, within 60 s (a rank that failed early still comes: no wait for ever). */
static atomic_int arrived;
static int meet(int round) {
  atomic_fetch_add(&arrived, 1);
  for (int i = 0; i < 60000 && atomic_load(&arrived) < NRANKS * round; i++) usleep(1000);
  return atomic_load(&arrived) >= NRANKS * round;
}
#define MEETINGS 7
static void skip_meetings(void) {
  atomic_fetch_add(&arrived, MEETINGS);
}

/* n bytes of round k from send + OFFSET to the peer's recv + OFFSET and back, at once (a group);
 * every byte received checked, and the bytes around it untouched. */
static void exchange(rank_t *r, flexcoll_comm_t comm, cudaStream_t s, unsigned char *send, unsigned char *recv,
                     unsigned char *host, size_t k, size_t n) {
  const int peer = 1 - r->rank;
  for (size_t i = 0; i < n; i++) host[i] = pattern(r->rank, k, i);
  cudaMemcpy(send + OFFSET, host, n, cudaMemcpyHostToDevice);
  cudaMemset(recv, 0xee, LARGEST + OFFSET);
  cudaDeviceSynchronize();
  flexcoll_result_t a = flexcoll_group_start(), b = FLEXCOLL_SUCCESS, c = FLEXCOLL_SUCCESS, d;
  if (a == FLEXCOLL_SUCCESS) {
    b = flexcoll_send(send + OFFSET, n, FLEXCOLL_UINT8, peer, comm, s);
    c = flexcoll_recv(recv + OFFSET, n, FLEXCOLL_UINT8, peer, comm, s);
  }
  d = flexcoll_group_end();
  EXPECT(r, a == FLEXCOLL_SUCCESS && b == FLEXCOLL_SUCCESS && c == FLEXCOLL_SUCCESS && d == FLEXCOLL_SUCCESS,
         "%zu bytes: send/recv: %s", n, flexcoll_get_last_error(comm));
  EXPECT(r, cudaStreamSynchronize(s) == cudaSuccess, "%zu bytes: stream: %s", n,
         cudaGetErrorString(cudaGetLastError()));
  memset(host, 0, LARGEST);
  cudaMemcpy(host, recv, OFFSET, cudaMemcpyDeviceToHost);
  for (int i = 0; i < OFFSET; i++) EXPECT(r, host[i] == 0xee, "%zu bytes: a byte before the buffer was written", n);
  cudaMemcpy(host, recv + OFFSET, n, cudaMemcpyDeviceToHost);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (host[i] != pattern(peer, k, i) && !wrong++) first = i;
  EXPECT(r, wrong == 0, "%zu bytes: %zu wrong, the first at %zu (%02x, not %02x)", n, wrong, first, host[first],
         pattern(peer, k, first));
  unsigned char after = 0;
  if (n < LARGEST) {
    cudaMemcpy(&after, recv + OFFSET + n, 1, cudaMemcpyDeviceToHost);
    EXPECT(r, after == 0xee, "%zu bytes: the byte after the buffer was written", n);
  }
}

/* Element i of rank `from`'s input in collective k. */
static int value(int from, int k, size_t i) { return (int)((unsigned)from * 1000003u + (unsigned)k * 7919u + (unsigned)i * 7u); }

static long g_host_regs; /* the fake's registrations of host memory during the collectives (rank 0 counts) */
static long g_dmabuf_before = -1, g_peermem_before = -1; /* device registrations before them */

/* Rank `from`'s input and what each collective must give, in unsigned arithmetic (the kernels'
 * int32 sums wrap as two's complement does). */
static int sum_of(int k, size_t i) { return (int)((unsigned)value(0, k, i) + (unsigned)value(1, k, i)); }
static int max_of(int k, size_t i) { return value(0, k, i) > value(1, k, i) ? value(0, k, i) : value(1, k, i); }

enum { ALLGATHER, BROADCAST, ALLTOALL, ALLREDUCE, REDUCE_SCATTER, REDUCE, NCOLLS };
static const char *const coll_names[NCOLLS] = {"allgather", "broadcast", "alltoall", "allreduce", "reduce_scatter",
                                               "reduce"};

/* Every collective, in and out of place, int32 counts below and above the zero-copy threshold:
 * with links that take device memory they go straight between the device buffers (no host
 * staging; the reductions on the device), every element checked. */
static void data_collectives(rank_t *r, flexcoll_comm_t comm, cudaStream_t s, unsigned char *dsend,
                             unsigned char *drecv, unsigned char *hbuf) {
  static const size_t counts[] = {1, 1001, 300007};
  int *in = (int *)hbuf, *out = (int *)(hbuf + LARGEST / 2);
  int *send = (int *)dsend, *recv = (int *)drecv;
  int k = 0;
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    const size_t c = counts[ci];
    for (int coll = 0; coll < NCOLLS; coll++)
      for (int inplace = 0; inplace < 2 && !r->failures; inplace++, k++) {
        /* allgather: c in, 2c out; alltoall: 2c in and out; reduce_scatter: 2c in, c out; the
         * rest c.  Broadcast and reduce at root k % 2 (reduce: the max, the others sum). */
        const size_t nin = coll == ALLTOALL || coll == REDUCE_SCATTER ? 2 * c : c;
        const size_t nout = coll == ALLGATHER || coll == ALLTOALL ? 2 * c : c;
        const int root = k % 2;
        for (size_t i = 0; i < nin; i++) in[i] = value(r->rank, k, i);
        int *sbuf = inplace && coll == ALLGATHER ? recv + (size_t)r->rank * c : inplace ? recv : send;
        int *rbuf = inplace && coll == REDUCE_SCATTER ? recv + (size_t)r->rank * c : recv;
        cudaMemset(recv, 0xff, (nin > nout ? nin : nout) * sizeof(int));
        cudaMemcpy(sbuf, in, nin * sizeof(int), cudaMemcpyHostToDevice);
        /* The legacy stream's memset and copy are not ordered before work on s (non-blocking). */
        cudaDeviceSynchronize();
        flexcoll_result_t res;
        switch (coll) {
        case ALLGATHER: res = flexcoll_allgather(sbuf, rbuf, c, FLEXCOLL_INT32, comm, s); break;
        case BROADCAST: res = flexcoll_broadcast(sbuf, rbuf, c, FLEXCOLL_INT32, root, comm, s); break;
        case ALLTOALL: res = flexcoll_alltoall(sbuf, rbuf, c, FLEXCOLL_INT32, comm, s); break;
        case ALLREDUCE: res = flexcoll_allreduce(sbuf, rbuf, c, FLEXCOLL_INT32, FLEXCOLL_SUM, comm, s); break;
        case REDUCE_SCATTER:
          res = flexcoll_reduce_scatter(sbuf, rbuf, c, FLEXCOLL_INT32, FLEXCOLL_SUM, comm, s);
          break;
        default: res = flexcoll_reduce(sbuf, rbuf, c, FLEXCOLL_INT32, FLEXCOLL_MAX, root, comm, s); break;
        }
        EXPECT(r, res == FLEXCOLL_SUCCESS, "%s of %zu%s: %s", coll_names[coll], c, inplace ? " in place" : "",
               flexcoll_get_last_error(comm));
        cudaStreamSynchronize(s);
        if (coll == REDUCE && r->rank != root) continue; /* only the root's output is defined */
        cudaMemcpy(out, rbuf, nout * sizeof(int), cudaMemcpyDeviceToHost);
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < nout; i++) {
          int want;
          switch (coll) {
          case ALLGATHER: want = value((int)(i / c), k, i % c); break;
          case BROADCAST: want = value(root, k, i); break;
          case ALLTOALL: want = value((int)(i / c), k, (size_t)r->rank * c + i % c); break;
          case ALLREDUCE: want = sum_of(k, i); break;
          case REDUCE_SCATTER: want = sum_of(k, (size_t)r->rank * c + i); break;
          default: want = max_of(k, i); break;
          }
          if (out[i] != want && !wrong++) first = i;
        }
        EXPECT(r, wrong == 0, "%s of %zu%s: %zu of %zu wrong, the first at %zu", coll_names[coll], c,
               inplace ? " in place" : "", wrong, nout, first);
      }
  }
}

static void *rank_main(void *arg) {
  rank_t *r = arg;
  cudaSetDevice(0);
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = 0;
  config.timeout_ms = 20000;
  flexcoll_comm_t comm = NULL;
  if (flexcoll_comm_init_rank(&comm, NRANKS, r->id, r->rank, &config) != FLEXCOLL_SUCCESS) {
    EXPECT(r, 0, "comm_init_rank: %s", flexcoll_get_last_error(NULL));
    skip_meetings();
    return NULL;
  }
  cudaStream_t s;
  unsigned char *send = NULL, *recv = NULL, *host = malloc(LARGEST);
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&send, LARGEST + OFFSET) != cudaSuccess ||
      cudaMalloc((void **)&recv, LARGEST + OFFSET) != cudaSuccess || !host) {
    EXPECT(r, 0, "allocating: %s", cudaGetErrorString(cudaGetLastError()));
    flexcoll_comm_destroy(comm);
    skip_meetings();
    return NULL;
  }
  for (size_t k = 0; k < NSIZES && !r->failures; k++) exchange(r, comm, s, send, recv, host, k, sizes[k]);
  /* A new send buffer in place of the old: the freed allocation's registration must go, the new
   * one's come (the fake counts live registrations; both ranks' cached ones are in it). */
  const long before = meet(1) ? live_registrations() : -1;
  meet(2);
  const uintptr_t old = (uintptr_t)send;
  cudaFree(send);
  send = NULL;
  if (cudaMalloc((void **)&send, LARGEST + OFFSET) != cudaSuccess) {
    EXPECT(r, 0, "allocating again: %s", cudaGetErrorString(cudaGetLastError()));
    send = NULL;
  } else {
    if (r->rank == 0)
      printf("[test_rdma_gpu] the new send buffer is %s\n",
             (uintptr_t)send == old ? "at the freed one's address" : "elsewhere");
    exchange(r, comm, s, send, recv, host, NSIZES, 1048593);
  }
  meet(3);
  const long after = live_registrations();
  EXPECT(r, before < 0 || after == before, "live registrations %ld before the send buffer was allocated anew, %ld after",
         before, after);
  /* Host registrations the fake made meanwhile: none where the collectives went straight. */
  void (*mrs)(long *, long *, long *) = (void (*)(long *, long *, long *))fake_fn("fake_verbs_mr_stats");
  void (*dev)(long *, long *) = (void (*)(long *, long *))fake_fn("fake_verbs_dev_stats");
  long ever0 = 0, ever1 = 0, now = 0, plain = 0, db0 = 0, pm0 = 0, db1 = 0, pm1 = 0;
  if (meet(4) && r->rank == 0 && mrs && dev) {
    mrs(&ever0, &now, &plain), dev(&db0, &pm0);
    g_dmabuf_before = db0, g_peermem_before = pm0;
  }
  meet(5);
  if (send) data_collectives(r, comm, s, send, recv, host);
  meet(6);
  if (r->rank == 0 && mrs && dev) {
    mrs(&ever1, &now, &plain), dev(&db1, &pm1);
    g_host_regs = (ever1 - ever0) - ((db1 - db0) + (pm1 - pm0));
  }
  meet(MEETINGS);
  /* A float average, the division on the device too: every element ((rank 0 + 1) + (rank 1 +
   * 1)) / 2 = 1.5. */
  const size_t count = 262147;
  float *vals = malloc(count * sizeof *vals);
  for (size_t i = 0; vals && i < count; i++) vals[i] = (float)(r->rank + 1);
  if (vals && send && !r->failures) {
    cudaMemcpy(send, vals, count * sizeof *vals, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize(); /* the legacy stream's copy is not ordered before work on s */
    EXPECT(r, flexcoll_allreduce(send, recv, count, FLEXCOLL_FLOAT32, FLEXCOLL_AVG, comm, s) == FLEXCOLL_SUCCESS,
           "allreduce: %s", flexcoll_get_last_error(comm));
    cudaStreamSynchronize(s);
    cudaMemcpy(vals, recv, count * sizeof *vals, cudaMemcpyDeviceToHost);
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) wrong += vals[i] != 1.5f;
    EXPECT(r, wrong == 0, "allreduce (average): %zu of %zu elements are not 1.5", wrong, count);
  }
  free(vals);
  if (r->failures) flexcoll_comm_abort(comm);
  flexcoll_comm_destroy(comm);
  cudaFree(send);
  cudaFree(recv);
  cudaStreamDestroy(s);
  free(host);
  return NULL;
}

/* Whether cudaMalloc's allocations here are plain ones to CUDA (fc_gpu_alloc_of), which the
 * device registration cache keeps; elsewhere each message registers for itself. */
static int cache_keeps_allocations(void) {
  void *p = NULL;
  fc_gpu_alloc_t a;
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess) return 0;
  const int plain = fc_gpu_alloc_of((char *)p + 5, &a) == 0 && a.plain && a.base == (uintptr_t)p && a.id != 0;
  cudaFree(p);
  if (!plain) printf("[test_rdma_gpu] cudaMalloc's memory is no plain allocation here: registered per message\n");
  return plain;
}

/* Whether this GPU exports device memory as a dma-buf (the library's own probe). */
static int gpu_has_dmabuf(void) {
  void *p = NULL;
  int fd = -1, ok = 0;
  uint64_t off = 0;
  char why[160];
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess) return 0;
  if (fc_gpu_dmabuf((char *)p + 100, 4096, &fd, &off, why, sizeof why) == 0) {
    ok = off == 100;
    close(fd);
  } else {
    printf("[test_rdma_gpu] no dma-buf here: %s\n", why);
  }
  cudaFree(p);
  return ok;
}

/* One mode, in this (child) process: the ranks, then the fake's counts. */
static int run_mode(const char *mode) {
  if (!strcmp(mode, "peermem")) setenv("FLEXCOLL_VERBS_FAKE_FAULT", "nodmabuf,peermem", 1);
  if (!strcmp(mode, "copy")) setenv("FLEXCOLL_VERBS_FAKE_FAULT", "nodmabuf", 1);
  if (!strcmp(mode, "eager") || !strcmp(mode, "real-eager")) setenv("FLEXCOLL_RDMA_ZCOPY_BYTES", "0", 1);
  if (!strcmp(mode, "nocache")) setenv("FLEXCOLL_RDMA_RCACHE_BYTES", "0", 1);
  cudaSetDevice(0);
  const int dmabuf_here = gpu_has_dmabuf(), cached = cache_keeps_allocations();
  flexcoll_unique_id_t id;
  if (flexcoll_get_unique_id(&id) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "[test_rdma_gpu] %s: get_unique_id: %s\n", mode, flexcoll_get_last_error(NULL));
    return 1;
  }
  rank_t ranks[NRANKS];
  memset(ranks, 0, sizeof ranks);
  const int failures = fc_test_run_ranks(ranks, sizeof ranks[0], NRANKS, id, rank_main);
  if (!strncmp(mode, "real", 4)) return failures != 0; /* the fake's counts do not apply */
  long dmabuf = -1, peermem = -1, ever = -1, now = -1, plain = -1;
  void (*dev)(long *, long *) = (void (*)(long *, long *))fake_fn("fake_verbs_dev_stats");
  void (*mrs)(long *, long *, long *) = (void (*)(long *, long *, long *))fake_fn("fake_verbs_mr_stats");
  if (dev) dev(&dmabuf, &peermem);
  if (mrs) mrs(&ever, &now, &plain);
  printf("[test_rdma_gpu] %s: device registrations: %ld through dma-buf, %ld by address; %ld registered after "
         "destroy\n", mode, dmabuf, peermem, now);
  if (!dev || !mrs) {
    fprintf(stderr, "[test_rdma_gpu] %s: the fake provider was not loaded\n", mode);
    return 1;
  }
  /* Before the collectives, without the cache: two ranks, each a rendezvous send and receive
   * for each size at or above the threshold and the message from the new buffer.  With it: each
   * rank's three allocations (send, receive, the new send buffer) once each. */
  const long zc_msgs = 2 * 2 * 4, allocations = 2 * 3;
  const long db = g_dmabuf_before, pm = g_peermem_before;
  printf("[test_rdma_gpu] %s: before the collectives %ld through dma-buf, %ld by address\n", mode, db, pm);
  int bad = 0;
  if (!strcmp(mode, "dmabuf") || !strcmp(mode, "nocache")) {
    const int per_message = !strcmp(mode, "nocache") || !cached;
    bad = !dmabuf_here ? db != 0 || pm != 0 : per_message ? db < zc_msgs || pm != 0 : db != allocations || pm != 0;
  } else if (!strcmp(mode, "peermem")) {
    bad = db != 0 || (cached ? pm != allocations : pm < zc_msgs);
  } else {
    bad = dmabuf != 0 || peermem != 0;
  }
  /* The collectives' sizes above the threshold register their buffers wherever zero copy is
   * on; through host staging those would be host buffers. */
  printf("[test_rdma_gpu] %s: %ld host registrations during the collectives\n", mode, g_host_regs);
  if (g_host_regs != 0) {
    fprintf(stderr, "[test_rdma_gpu] %s: the collectives were staged through host memory\n", mode);
    bad = 1;
  }
  if (bad) fprintf(stderr, "[test_rdma_gpu] %s: not the registrations this mode must make (dma-buf here: %s)\n", mode,
                   dmabuf_here ? "yes" : "no");
  if (now != 0) fprintf(stderr, "[test_rdma_gpu] %s: %ld registrations left after destroy\n", mode, now);
  return failures || bad || now != 0;
}

/* Whether the real provider lists a device (the library's own loader, as the link loads it). */
static int real_devices(void) {
  char why[300] = "";
  const fc_verbs_t *v = fc_verbs_load(why, sizeof why);
  int n = 0;
  struct ibv_device **list = v ? v->get_device_list(&n) : NULL;
  if (list) v->free_device_list(list);
  if (!list || n == 0) printf("[test_rdma_gpu] no RDMA device (%s)\n", v ? "the device list is empty" : why);
  return list && n > 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* what a mode printed survives its crash */
  if (argc == 2) {
    /* A mode that crashes prints where, then dies of the same signal, which the parent reports. */
    crash_report_install(TEST_TAG, NULL);
    return run_mode(argv[1]);
  }
  const int real = getenv("FC_TEST_RDMA_REAL") && *getenv("FC_TEST_RDMA_REAL") == '1';
  int ndev = 0;
  /* Asked in a child: this process forks the modes and must not hold CUDA itself. */
  pid_t probe = fork();
  if (probe == 0) _exit(cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0 ? 0 : 77);
  int st = 0;
  waitpid(probe, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("test_rdma_gpu: SKIP: no GPU\n");
    return 77;
  }
  if (real) {
    unsetenv("FLEXCOLL_VERBS_PROVIDER");
    if (!real_devices()) return 77;
  } else {
    setenv("FLEXCOLL_VERBS_PROVIDER", "fake", 1);
    setenv("FLEXCOLL_VERBS_FAKE_LIB", FC_FAKE_VERBS_LIB, 1);
  }
  fc_test_gpu_serialize("[test_rdma_gpu]");
  setenv("FLEXCOLL_LINKS", "rdma", 1);
  unsetenv("FLEXCOLL_VERBS_FAKE_FAULT");
  unsetenv("FLEXCOLL_RDMA_ZCOPY_BYTES");
  static const char *const fake_modes[] = {"dmabuf", "nocache", "peermem", "copy", "eager", NULL};
  static const char *const real_modes[] = {"real", "real-eager", NULL};
  const char *const *modes = real ? real_modes : fake_modes;
  int failures = 0;
  for (size_t m = 0; modes[m]; m++) {
    pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], modes[m], (char *)NULL);
      _exit(127);
    }
    waitpid(pid, &st, 0);
    const int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (WIFSIGNALED(st)) printf("[test_rdma_gpu] mode %s: killed by signal %d\n", modes[m], WTERMSIG(st));
    printf("[test_rdma_gpu] mode %s: %s\n", modes[m], ok ? "PASS" : "FAIL");
    failures += !ok;
  }
  printf("test_rdma_gpu: %s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
