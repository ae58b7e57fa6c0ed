/* moe.c — flexcoll_moe_create/destroy/dispatch/combine: argument checks, the shared area (one
 * cudaMalloc per rank, registered as a window so every peer maps it once), the kernels' launch
 * (lib/kernels/moe.cu; moe.h has the layout and the protocol's state).  On builds without CUDA
 * the checks run and create says that MoE needs device memory. */
#define _GNU_SOURCE
#include "config.h"
#include "moe/moe.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "error.h"
#include "gpu/gpu.h"
#include "group.h"
#if HAVE_CUDA
#include "gpu/device.h"
#endif

#define MOE_MAGIC 0x666c65786d6f6531ULL /* "flexmoe1" */

/* AUTO takes SENTINEL (the receiver polls the data: no fence on the sender, lowest latency) when
 * one source's region of the receive buffer (max_tokens rows) is at most this many bytes, else
 * FENCE: polling touches every received element once more, which costs more than the fence
 * once rows are many; decode batches (a few to a few hundred tokens per rank) stay below it. */
#define FC_MOE_AUTO_SENTINEL_BYTES ((size_t)4 << 20)

struct flexcoll_moe {
  uint64_t magic;
  flexcoll_comm_t comm;
  flexcoll_moe_config_t cfg;
  int dispatched; /* a dispatch since the last combine */
  int last_T;     /* its token count, for combine */
#if HAVE_CUDA
  fc_moe_kargs_t k;
  struct flexcoll_window *window;
  char *shared, *local;
  cudaStream_t util;
  cudaEvent_t ev_last; /* after the last eagerly launched kernel */
  int ev_valid;
  cudaStream_t last_stream;
#endif
  struct flexcoll_moe *next;
};

/* Live handles, so that a destroyed or made-up handle is refused instead of dereferenced. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct flexcoll_moe *live_list;

static int moe_live(const struct flexcoll_moe *m) {
  int live = 0;
  pthread_mutex_lock(&live_lock);
  for (const struct flexcoll_moe *x = live_list; x && !live; x = x->next) live = x == m;
  pthread_mutex_unlock(&live_lock);
  return live;
}

static flexcoll_result_t check_handle(const struct flexcoll_moe *m, const char *fn) {
  if (!m) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: moe is NULL", fn);
  if (!moe_live(m))
    return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: moe %p is not a live handle (destroyed or never created)", fn,
                    (const void *)m);
  return FLEXCOLL_SUCCESS;
}

static size_t payload_size(flexcoll_datatype_t dt) {
  switch (dt) {
    case FLEXCOLL_BFLOAT16: case FLEXCOLL_FLOAT16: return 2;
    case FLEXCOLL_FLOAT32: return 4;
    case FLEXCOLL_INT8: return 1;
    default: return 0;
  }
}

static flexcoll_result_t check_config(flexcoll_comm_t comm, const flexcoll_moe_config_t *cfg, const char *fn) {
  if (!cfg) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: cfg is NULL", fn);
  if (cfg->size < sizeof(flexcoll_moe_config_t) || cfg->version == 0 || cfg->version > FLEXCOLL_MOE_CONFIG_VERSION)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                    "%s: cfg not initialised with FLEXCOLL_MOE_CONFIG_INITIALIZER (size %zu, version %u)", fn, cfg->size,
                    cfg->version);
  if (cfg->max_tokens < 1 || cfg->max_tokens > FC_MOE_MAX_TOKENS)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: cfg->max_tokens %d out of range [1, %d]", fn, cfg->max_tokens,
                    FC_MOE_MAX_TOKENS);
  const size_t es = payload_size(cfg->dtype);
  if (!es)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                    "%s: cfg->dtype %d is not a MoE payload type (bfloat16, float16, float32 or int8)", fn, (int)cfg->dtype);
  if (cfg->hidden < 1) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: cfg->hidden %d must be positive", fn, cfg->hidden);
  if ((size_t)cfg->hidden * es % 16)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                    "%s: cfg->hidden %d times the element size %zu is not a multiple of 16 bytes (rows move as 16-byte vectors)",
                    fn, cfg->hidden, es);
  if (cfg->top_k < 1 || cfg->top_k > FC_MOE_MAX_TOP_K)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: cfg->top_k %d out of range [1, %d]", fn, cfg->top_k,
                    FC_MOE_MAX_TOP_K);
  if (cfg->num_experts < comm->nranks || cfg->num_experts % comm->nranks)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                    "%s: cfg->num_experts %d is not a positive multiple of the rank count %d (experts are spread evenly, "
                    "rank-major)", fn, cfg->num_experts, comm->nranks);
  if ((unsigned)cfg->sync > FLEXCOLL_MOE_AUTO)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: cfg->sync %d is not a flexcoll_moe_sync_t", fn, (int)cfg->sync);
  if (cfg->sync == FLEXCOLL_MOE_SENTINEL && cfg->dtype == FLEXCOLL_INT8)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                    "%s: cfg->sync FLEXCOLL_MOE_SENTINEL needs a float payload (int8 has no value to spare as a sentinel); "
                    "use FLEXCOLL_MOE_FENCE or FLEXCOLL_MOE_AUTO", fn);
  const size_t rows = (size_t)comm->nranks * (size_t)cfg->max_tokens, row = (size_t)cfg->hidden * es;
  if (row > SIZE_MAX / 4 / rows)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: cfg->hidden %d and cfg->max_tokens %d overflow the buffer size",
                    fn, cfg->hidden, cfg->max_tokens);
  return FLEXCOLL_SUCCESS;
}

#if HAVE_CUDA

static size_t up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* What each rank says at create: its configuration (they must match) and its grid cap. */
typedef struct {
  int max_tokens, hidden, dtype, top_k, num_experts, sync;
  unsigned blocks;
} moe_hello_t;

static void free_device(struct flexcoll_moe *m) {
  if (m->ev_valid) cudaEventSynchronize(m->ev_last);
  if (m->ev_last) cudaEventDestroy(m->ev_last);
  if (m->util) cudaStreamDestroy(m->util);
  cudaFree(m->shared);
  cudaFree(m->local);
  cudaGetLastError();
}

static flexcoll_result_t create_device(flexcoll_comm_t comm, const flexcoll_moe_config_t *cfg, struct flexcoll_moe *m,
                                       const char *fn) {
  struct fc_gpu *g = comm->gpu;
  const int n = comm->nranks, me = comm->rank;
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  char **peer_host = NULL;
  moe_hello_t *all = calloc((size_t)n, sizeof *all);
  if (!all) return fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "%s: out of memory", fn);
  if (n > FC_MOE_MAX_RANKS) {
    free(all);
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: %d ranks; MoE takes at most %d", fn, n, FC_MOE_MAX_RANKS);
  }
  if (!g->p2p) {
    free(all);
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "%s: not every peer's device memory is reachable from this rank (peer access): MoE writes straight "
                    "into the peers' buffers", fn);
  }
  unsigned cap = g->oneshot_blocks >= 1 && g->oneshot_blocks < FC_MOE_MAX_BLOCKS ? g->oneshot_blocks : FC_MOE_MAX_BLOCKS;
  all[me] = (moe_hello_t){cfg->max_tokens, cfg->hidden, (int)cfg->dtype, cfg->top_k, cfg->num_experts, (int)cfg->sync, cap};
  FC_CHECK_GOTO(fc_bootstrap_allgather(comm->bootstrap, all, sizeof *all), res, out);
  for (int q = 0; q < n; q++) {
    const moe_hello_t *h = &all[q];
    if (h->max_tokens != cfg->max_tokens || h->hidden != cfg->hidden || h->dtype != (int)cfg->dtype ||
        h->top_k != cfg->top_k || h->num_experts != cfg->num_experts || h->sync != (int)cfg->sync) {
      res = fc_error(comm, FLEXCOLL_INVALID_USAGE,
                     "%s: rank %d's cfg differs from this rank's (max_tokens %d/%d, hidden %d/%d, dtype %d/%d, top_k "
                     "%d/%d, num_experts %d/%d, sync %d/%d): every rank must pass the same", fn, q, h->max_tokens,
                     cfg->max_tokens, h->hidden, cfg->hidden, h->dtype, (int)cfg->dtype, h->top_k, cfg->top_k,
                     h->num_experts, cfg->num_experts, h->sync, (int)cfg->sync);
      goto out;
    }
    if (h->blocks < cap) cap = h->blocks;
  }

  const size_t es = payload_size(cfg->dtype), row = (size_t)cfg->hidden * es;
  const size_t nt = (size_t)n * (size_t)cfg->max_tokens, nflags = (size_t)n * cap;
  const int floats = cfg->dtype != FLEXCOLL_INT8;
  fc_moe_kargs_t *k = &m->k;
  k->rank = me;
  k->nranks = n;
  k->max_tokens = cfg->max_tokens;
  k->top_k = cfg->top_k;
  k->num_experts = cfg->num_experts;
  k->experts_per_rank = cfg->num_experts / n;
  k->dtype = (int)cfg->dtype;
  k->sentinel = cfg->sync == FLEXCOLL_MOE_SENTINEL ||
                (cfg->sync == FLEXCOLL_MOE_AUTO && floats && (size_t)cfg->max_tokens * row <= FC_MOE_AUTO_SENTINEL_BYTES);
  k->blocks = cap;
  k->row_bytes = row;
  k->off_dflag = 0;
  k->off_rel = nflags * 8;
  k->off_cflag = 2 * nflags * 8;
  k->off_meta = 3 * nflags * 8;
  k->off_recv = up(k->off_meta + nt * 8, 256);
  k->off_comb = k->off_recv + nt * row;
  const size_t shared_bytes = k->off_comb + (floats ? nt * row : 0);
  const size_t l_ctr = 16, l_counts = l_ctr + 2 * (size_t)n * sizeof(int), l_meta = l_counts + (size_t)n * sizeof(int);
  const size_t l_route = l_meta + nt * sizeof(int);
  const size_t l_peer = up(l_route + (size_t)cfg->max_tokens * (size_t)cfg->top_k * sizeof(int), 16);
  const size_t local_bytes = l_peer + (size_t)n * sizeof(char *);

  /* A rank that cannot allocate still takes part in the registration (with no buffer), so that
   * every rank returns an error instead of waiting for it. */
  flexcoll_result_t alloc_res = FLEXCOLL_SUCCESS;
  cudaError_t ce = cudaStreamCreateWithFlags(&m->util, cudaStreamNonBlocking);
  if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&m->ev_last, cudaEventDisableTiming);
  if (ce == cudaSuccess) ce = cudaMalloc((void **)&m->shared, shared_bytes);
  if (ce == cudaSuccess) ce = cudaMalloc((void **)&m->local, local_bytes);
  /* On our own stream, not the legacy one: other ranks' kernels may be waiting on peers. */
  if (ce == cudaSuccess) ce = cudaMemsetAsync(m->shared, 0, k->off_recv, m->util);
  if (ce == cudaSuccess) ce = cudaMemsetAsync(m->shared + k->off_recv, 0xff, shared_bytes - k->off_recv, m->util);
  if (ce == cudaSuccess) ce = cudaMemsetAsync(m->local, 0, local_bytes, m->util);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(m->util);
  if (ce == cudaSuccess) ce = (cudaError_t)fc_moe_kernels_preload();
  if (ce != cudaSuccess) {
    alloc_res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s: allocating %zu + %zu bytes of device memory failed: %s",
                         fn, shared_bytes, local_bytes, cudaGetErrorString(ce));
    cudaGetLastError();
  }
  res = fc_gpu_window_register(comm, alloc_res == FLEXCOLL_SUCCESS ? m->shared : NULL, shared_bytes, &m->window);
  if (alloc_res != FLEXCOLL_SUCCESS) {
    if (res == FLEXCOLL_SUCCESS) fc_gpu_window_deregister(comm, m->window);
    res = alloc_res;
    goto out;
  }
  if (res != FLEXCOLL_SUCCESS) goto out;

  k->shared = m->shared;
  k->epoch = (unsigned long long *)m->local;
  k->done = (unsigned *)(m->local + 8);
  k->ctr = (int *)(m->local + l_ctr);
  k->recv_counts = (int *)(m->local + l_counts);
  k->recv_meta = (int *)(m->local + l_meta);
  k->route = (int *)(m->local + l_route);
  k->peer = (char *const *)(m->local + l_peer);
  k->timeout_ns = g->timeout_ns;
  k->error = g->error_dev;
  peer_host = malloc((size_t)n * sizeof *peer_host);
  if (!peer_host) { res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "%s: out of memory", fn); goto fail_window; }
  for (int q = 0; q < n; q++) peer_host[q] = m->window->peer[q];
  ce = cudaMemcpyAsync(m->local + l_peer, peer_host, (size_t)n * sizeof *peer_host, cudaMemcpyHostToDevice, m->util);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(m->util);
  if (ce != cudaSuccess) {
    res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s: uploading the peers' addresses failed: %s", fn,
                   cudaGetErrorString(ce));
    goto fail_window;
  }
  /* Nobody launches a kernel before every rank's area is ready and mapped. */
  FC_CHECK_GOTO(fc_bootstrap_barrier(comm->bootstrap), res, fail_window);
  FC_INFO(FC_SUB_GPU, "rank %d: moe created: %d ranks, %d tokens of %zu bytes, top_k %d, %d experts, %s, %u blocks, %zu bytes shared",
          me, n, cfg->max_tokens, row, cfg->top_k, cfg->num_experts, k->sentinel ? "sentinel" : "fence", cap, shared_bytes);
  free(peer_host);
  free(all);
  return FLEXCOLL_SUCCESS;
fail_window:
  fc_gpu_window_deregister(comm, m->window);
out:
  free(peer_host);
  free(all);
  return res;
}

static flexcoll_result_t check_dev_ptr(struct flexcoll_moe *m, const void *p, size_t align, const char *name,
                                       const char *fn) {
  flexcoll_comm_t comm = m->comm;
  if (!p) return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
  int dev = -1;
  if (fc_mem_type(p, &dev) != FC_MEM_DEVICE || dev != comm->gpu->device)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: %s (%p) is not device memory of the communicator's device %d",
                    fn, name, p, comm->gpu->device);
  if ((uintptr_t)p % align)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: %s (%p) is not %zu-byte aligned", fn, name, p, align);
  return FLEXCOLL_SUCCESS;
}

/* The checks every call shares, then the stream: refused while another capture forbids it. */
static flexcoll_result_t check_call(struct flexcoll_moe *m, flexcoll_stream_t stream, int *capturing, const char *fn) {
  flexcoll_comm_t comm = m->comm;
  FC_CHECK(fc_comm_check(comm, fn));
  if (fc_group_active())
    return fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: not inside flexcoll_group_start/end (MoE calls run at once)", fn);
  *capturing = fc_gpu_stream_capturing(stream);
  if (*capturing == 2)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "%s: stream cannot be used now: another stream's CUDA graph capture forbids it", fn);
  return FLEXCOLL_SUCCESS;
}

/* Launch on stream after the moe's previous kernel: an eager call on another stream waits for
 * it (the kernels' state on the device needs them one after another).  A captured call records
 * nothing: the application orders graph launches with the moe's other calls. */
static flexcoll_result_t launch(struct flexcoll_moe *m, int capturing, flexcoll_stream_t stream, int combine,
                                const void *a, const void *b, const void *c, int T, const char *fn) {
  flexcoll_comm_t comm = m->comm;
  cudaStream_t s = (cudaStream_t)stream;
  int prev = -1;
  cudaGetDevice(&prev);
  if (prev != comm->gpu->device) cudaSetDevice(comm->gpu->device);
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  cudaError_t e = cudaSuccess;
  if (!capturing && m->ev_valid && m->last_stream != s) e = cudaStreamWaitEvent(s, m->ev_last, 0);
  if (e == cudaSuccess)
    e = (cudaError_t)(combine ? fc_moe_kernel_combine(&m->k, a, (const float *)b, (void *)c, T, stream)
                              : fc_moe_kernel_dispatch(&m->k, a, (const int *)b, T, stream));
  if (e == cudaSuccess && !capturing) {
    e = cudaEventRecord(m->ev_last, s);
    m->ev_valid = e == cudaSuccess;
    m->last_stream = s;
    fc_gpu_track(comm, s);
  }
  if (e != cudaSuccess) {
    res = fc_error(comm, FLEXCOLL_UNHANDLED_CUDA_ERROR, "%s: launching the kernel failed: %s", fn, cudaGetErrorString(e));
    cudaGetLastError();
  }
  if (prev >= 0 && prev != comm->gpu->device) cudaSetDevice(prev);
  return res;
}

static flexcoll_result_t dispatch_run(struct flexcoll_moe *m, const void *tokens, const int *expert_ids, int T,
                                      flexcoll_stream_t stream, const char *fn) {
  flexcoll_comm_t comm = m->comm;
  int capturing = 0;
  FC_CHECK(check_call(m, stream, &capturing, fn));
  if (T < 0 || T > m->cfg.max_tokens)
    return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT, "%s: T %d out of range [0, max_tokens %d]", fn, T, m->cfg.max_tokens);
  if (T > 0) {
    FC_CHECK(check_dev_ptr(m, tokens, 16, "tokens", fn));
    FC_CHECK(check_dev_ptr(m, expert_ids, sizeof(int), "expert_ids", fn));
  }
  FC_CHECK(launch(m, capturing, stream, 0, tokens, expert_ids, NULL, T, fn));
  m->dispatched = 1;
  m->last_T = T;
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t combine_run(struct flexcoll_moe *m, const void *expert_out, const float *weights, void *out,
                                     flexcoll_stream_t stream, const char *fn) {
  flexcoll_comm_t comm = m->comm;
  int capturing = 0;
  FC_CHECK(check_call(m, stream, &capturing, fn));
  if (m->cfg.dtype == FLEXCOLL_INT8)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "%s: this moe's dtype is int8; combine sums in fp32 into the payload type, a float type", fn);
  if (!m->dispatched)
    return fc_error(comm, FLEXCOLL_INVALID_USAGE,
                    "%s: no flexcoll_moe_dispatch since the last combine (each combine returns one dispatch's tokens)", fn);
  FC_CHECK(check_dev_ptr(m, expert_out, 16, "expert_out", fn));
  const int T = m->last_T;
  if (T > 0) {
    FC_CHECK(check_dev_ptr(m, weights, sizeof(float), "weights", fn));
    FC_CHECK(check_dev_ptr(m, out, 16, "out", fn));
    const uintptr_t o = (uintptr_t)out, oe = o + (size_t)T * m->k.row_bytes;
    const uintptr_t x = (uintptr_t)expert_out, xe = x + (size_t)m->k.nranks * m->k.max_tokens * m->k.row_bytes;
    if (o < xe && x < oe)
      return fc_error(comm, FLEXCOLL_INVALID_ARGUMENT,
                      "%s: out overlaps expert_out (combine reads this rank's expert rows while it writes out)", fn);
  }
  FC_CHECK(launch(m, capturing, stream, 1, expert_out, weights, out, T, fn));
  m->dispatched = 0;
  return FLEXCOLL_SUCCESS;
}

#endif /* HAVE_CUDA */

flexcoll_result_t flexcoll_moe_create(flexcoll_comm_t comm, const flexcoll_moe_config_t *cfg, flexcoll_moe_t *moe) {
  const char *fn = "flexcoll_moe_create";
  if (!moe) return fc_error(NULL, FLEXCOLL_INVALID_ARGUMENT, "%s: moe is NULL", fn);
  *moe = NULL;
  FC_CHECK(fc_comm_enter(comm, fn));
  flexcoll_result_t res = fc_comm_check(comm, fn);
  if (res == FLEXCOLL_SUCCESS && fc_group_active())
    res = fc_error(comm, FLEXCOLL_INVALID_USAGE, "%s: not inside flexcoll_group_start/end", fn);
  if (res == FLEXCOLL_SUCCESS) res = check_config(comm, cfg, fn);
  if (res == FLEXCOLL_SUCCESS && comm->cuda_device < 0)
    res = fc_error(comm, FLEXCOLL_INVALID_USAGE,
                   "%s: comm is host-only (no CUDA device%s): MoE dispatch and combine move device memory over the "
                   "peers' mappings", fn, HAVE_CUDA ? "" : "; this flexcoll was built without CUDA");
  struct flexcoll_moe *m = NULL;
  if (res == FLEXCOLL_SUCCESS) {
    m = calloc(1, sizeof *m);
    if (!m) res = fc_error(comm, FLEXCOLL_SYSTEM_ERROR, "%s: out of memory", fn);
  }
#if HAVE_CUDA
  if (res == FLEXCOLL_SUCCESS) {
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != comm->gpu->device) cudaSetDevice(comm->gpu->device);
    m->comm = comm;
    m->cfg = *cfg;
    res = create_device(comm, cfg, m, fn);
    if (res != FLEXCOLL_SUCCESS) free_device(m);
    if (prev >= 0 && prev != comm->gpu->device) cudaSetDevice(prev);
  }
#endif
  fc_comm_leave(comm);
  if (res != FLEXCOLL_SUCCESS) {
    free(m);
    return res;
  }
  m->magic = MOE_MAGIC;
  pthread_mutex_lock(&live_lock);
  m->next = live_list;
  live_list = m;
  pthread_mutex_unlock(&live_lock);
  *moe = m;
  return FLEXCOLL_SUCCESS;
}

flexcoll_result_t flexcoll_moe_destroy(flexcoll_moe_t moe) {
  const char *fn = "flexcoll_moe_destroy";
  FC_CHECK(check_handle(moe, fn));
  flexcoll_comm_t comm = moe->comm;
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  const int comm_live = fc_comm_is_live(comm);
  if (comm_live) FC_CHECK(fc_comm_enter(comm, fn));
  pthread_mutex_lock(&live_lock);
  for (struct flexcoll_moe **l = &live_list; *l; l = &(*l)->next)
    if (*l == moe) {
      *l = moe->next;
      break;
    }
  pthread_mutex_unlock(&live_lock);
#if HAVE_CUDA
  int prev = -1;
  cudaGetDevice(&prev);
  const int dev = comm_live ? comm->gpu->device : prev;
  if (prev != dev) cudaSetDevice(dev);
  if (moe->ev_valid) cudaEventSynchronize(moe->ev_last); /* our eagerly launched kernels (an abort releases them) */
  moe->ev_valid = 0;
  if (!comm_live) {
    res = fc_error(NULL, FLEXCOLL_INVALID_USAGE,
                   "%s: its communicator was destroyed first (destroy the moe before the communicator); freed anyway", fn);
  } else if (!atomic_load(&comm->abort_flag) && atomic_load(&comm->state) == FC_COMM_READY) {
    /* Deregistering ends with a barrier: after it no peer writes into our area any more (every
     * peer has waited for its own kernels above), so it may be freed. */
    res = fc_gpu_window_deregister(comm, moe->window);
  }
  /* An aborted communicator takes no collective step; the window goes with the communicator. */
  free_device(moe);
  if (prev >= 0 && prev != dev) cudaSetDevice(prev);
#endif
  if (comm_live) fc_comm_leave(comm);
  moe->magic = 0;
  free(moe);
  return res;
}

flexcoll_result_t flexcoll_moe_dispatch(flexcoll_moe_t moe, const void *tokens, const int *expert_ids, int T,
                                        void **recv_tokens, int **recv_counts, int **recv_meta, flexcoll_stream_t stream) {
  const char *fn = "flexcoll_moe_dispatch";
  if (recv_tokens) *recv_tokens = NULL;
  if (recv_counts) *recv_counts = NULL;
  if (recv_meta) *recv_meta = NULL;
  FC_CHECK(check_handle(moe, fn));
  FC_CHECK(fc_comm_enter(moe->comm, fn));
#if HAVE_CUDA
  flexcoll_result_t res = dispatch_run(moe, tokens, expert_ids, T, stream, fn);
  if (res == FLEXCOLL_SUCCESS) {
    if (recv_tokens) *recv_tokens = moe->shared + moe->k.off_recv;
    if (recv_counts) *recv_counts = moe->k.recv_counts;
    if (recv_meta) *recv_meta = moe->k.recv_meta;
  }
#else
  (void)tokens; (void)expert_ids; (void)T; (void)stream;
  flexcoll_result_t res = fc_error(moe->comm, FLEXCOLL_INTERNAL_ERROR, "%s: no moe exists without CUDA", fn);
#endif
  fc_comm_leave(moe->comm);
  return res;
}

flexcoll_result_t flexcoll_moe_combine(flexcoll_moe_t moe, const void *expert_out, const float *weights, void *out,
                                       flexcoll_stream_t stream) {
  const char *fn = "flexcoll_moe_combine";
  FC_CHECK(check_handle(moe, fn));
  FC_CHECK(fc_comm_enter(moe->comm, fn));
#if HAVE_CUDA
  flexcoll_result_t res = combine_run(moe, expert_out, weights, out, stream, fn);
#else
  (void)expert_out; (void)weights; (void)out; (void)stream;
  flexcoll_result_t res = fc_error(moe->comm, FLEXCOLL_INTERNAL_ERROR, "%s: no moe exists without CUDA", fn);
#endif
  fc_comm_leave(moe->comm);
  return res;
}
