/* moe.cu — MoE dispatch and combine as one kernel per rank and call (lib/moe/moe.h has the
 * interface and the shared area's layout; flexcoll_moe_create(3) the contract).
 *
 * Dispatch, every block b of the grid (the same grid on every rank):
 *  1. read the epoch (e = *epoch + 1), count itself; the last block stores e (as fc_epoch_begin/
 *     end, so a graph replay takes the next number);
 *  2. SENTINEL: reset to all-ones its share of the rows the previous dispatch received (their
 *     counts are still in recv_counts), so the senders' rows of this call are told from them;
 *  3. release: system fence, rel[rank][b] := e in every rank's area (ourselves included);
 *  4. wait until every rank's every block has entered this call (rel >= e in our area): from
 *     then on no peer still reads what we overwrite (its rows of the last call, its combine
 *     area, its flags of the last call), and every block of ours has read the old counts;
 *  5. send: a warp per token reads its top_k expert ids; lanes naming the same rank elect the
 *     lowest, which takes the row (an atomic on this rank's counter for that destination) and
 *     counts it for its block; the warp copies the token once per destination into our region
 *     of its receive buffer, then the meta word tagged with the epoch; the route of every k
 *     (destination and row) is kept for combine;
 *  6. post: FENCE: barrier, system fence, then dflag[rank][b] := (e, rows) in every rank with a
 *     release store; SENTINEL: the same without the fence (the rows carry their own readiness);
 *  7. receive: wait for every rank's every block's dflag of this epoch, sum the rows per source
 *     (block 0 stores recv_counts); SENTINEL: poll each row's meta tag and every element until
 *     none is all-ones; copy the meta words into recv_meta.
 * Combine, every block (epoch e = *epoch, the dispatch's):
 *  1. push: a warp per received row copies the caller's expert output row to the source's
 *     combine area, at our region and the same row;
 *  2. FENCE: barrier, system fence, cflag[rank][b] := e in every peer; then wait for every
 *     peer's cflags (our own rows never move);
 *  3. reduce: a warp per own token; each lane, for its 16-byte columns, sums weights[t][k] * row
 *     in fp32 in k order (rounding each product and sum, no FMA: the host reference matches it
 *     bit for bit), reading our own rows straight from expert_out and the peers' from the
 *     combine area (SENTINEL: polled), then stores the column once; SENTINEL: it then resets
 *     the combine rows it read.
 * Why the buffers are free when written: a peer writes our receive and combine areas only after
 * step 4 of its dispatch of the same epoch saw our release, i.e. after our stream reached this
 * dispatch, behind the previous combine and whatever read the previous rows.  Every wait is
 * bounded by timeout_ns and returns at an abort (fc_wait_expired); a timeout stores 1 into
 * the communicator's error word (flexcoll_comm_get_async_error turns it into FLEXCOLL_TIMEOUT),
 * an expert id not below num_experts 3 (FLEXCOLL_INVALID_ARGUMENT). */
#include "kernels/oneshot.cuh"
#include "moe/moe.h"

namespace {

constexpr unsigned MT = FC_MOE_THREADS;
constexpr unsigned WARPS = MT / 32;
static_assert(FC_MOE_MAX_TOP_K < 32, "a warp holds one lane per k");

__device__ __forceinline__ uint64_t *moe_flag(const fc_moe_kargs_t &a, char *area, size_t off, int src, int b) {
  return (uint64_t *)(area + off) + (size_t)src * a.blocks + (size_t)b;
}
__device__ __forceinline__ void st_relaxed_sys(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/* A 16-byte volatile load (the rows a SENTINEL receiver polls): the LL protocol's (oneshot.cuh). */
__device__ __forceinline__ uint4 ld_volatile_v4(const void *p) { return fc_ll_load((const uint4 *)p); }

/* SENTINEL: whether no element of v is the all-ones pattern (every element has arrived). */
__device__ __forceinline__ bool arrived(uint4 v, int esize) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
  bool ok = true;
#pragma unroll
  for (int i = 0; i < 4; i++)
    ok &= esize == 4 ? w[i] != 0xffffffffu : ((w[i] & 0xffffu) != 0xffffu && (w[i] >> 16) != 0xffffu);
  return ok;
}
/* A payload element equal to the sentinel becomes the type's canonical quiet NaN (still a NaN;
 * every other pattern, ±0 and the other NaNs included, is sent as it is). */
__device__ __forceinline__ unsigned fix_word(unsigned w, int esize, int dtype) {
  if (esize == 4) return w == 0xffffffffu ? 0x7fc00000u : w;
  const unsigned nan = dtype == FLEXCOLL_BFLOAT16 ? 0x7fc0u : 0x7e00u;
  unsigned lo = w & 0xffffu, hi = w >> 16;
  if (lo == 0xffffu) lo = nan;
  if (hi == 0xffffu) hi = nan;
  return lo | hi << 16;
}
__device__ __forceinline__ uint4 fix_sentinel(uint4 v, int esize, int dtype) {
  v.x = fix_word(v.x, esize, dtype);
  v.y = fix_word(v.y, esize, dtype);
  v.z = fix_word(v.z, esize, dtype);
  v.w = fix_word(v.w, esize, dtype);
  return v;
}

__device__ __forceinline__ int esize_of(int dtype) {
  return dtype == FLEXCOLL_FLOAT32 ? 4 : dtype == FLEXCOLL_INT8 ? 1 : 2;
}

/* The error word keeps what was found first (and an abort). */
__device__ __forceinline__ void set_error(const fc_moe_kargs_t &a, int what) {
  if (a.error && *(volatile int *)a.error == 0) *(volatile int *)a.error = what;
  __threadfence_system();
}
__device__ __forceinline__ void set_timeout(const fc_moe_kargs_t &a) { set_error(a, FC_DEV_ERROR_TIMEOUT); }

/* One bounded wait of one thread: until pred(load) holds. */
template <class Pred>
__device__ __forceinline__ bool wait_word(const fc_moe_kargs_t &a, const uint64_t *p, Pred pred) {
  const long long start = fc_now_ns();
  long long last_abort_check = start;
  unsigned spins = 0, ns = 32;
  while (!pred(fc_ld_volatile(p))) {
    if (fc_wait_expired(a, start, &last_abort_check)) return false;
    if (++spins > 64) {
      __nanosleep(ns);
      if (ns < 256) ns *= 2;
    }
  }
  return true;
}

/* The whole block waits for flags [src][b] of our area at `off`, every src (but `skip`) and
 * block, threads sharing the flags out; tag: compare the high 32 bits with e's low 32 bits,
 * else wait for >= e.  Then the acquire side (system fence).  False in every thread after a
 * timeout or abort (the error word is set). */
__device__ bool wait_all(const fc_moe_kargs_t &a, size_t off, uint64_t e, bool tag, int skip) {
  const size_t nf = (size_t)a.nranks * a.blocks;
  const uint64_t *f = (const uint64_t *)(a.shared + off);
  const uint32_t e32 = (uint32_t)e;
  int ok = 1;
  for (size_t i = threadIdx.x; i < nf && ok; i += blockDim.x) {
    if ((int)(i / a.blocks) == skip) continue;
    ok = tag ? wait_word(a, f + i, [e32](uint64_t v) { return (uint32_t)(v >> 32) == e32; })
             : wait_word(a, f + i, [e](uint64_t v) { return v >= e; });
  }
  ok = __syncthreads_and(ok);
  if (!ok && threadIdx.x == 0) set_timeout(a);
  __threadfence_system();
  return ok != 0;
}

/* The block's thread 0 stores v into flag [rank][b] at `off` of every rank's area (but skip),
 * after the block's stores: barrier, then (fence) a system fence and release stores, else
 * relaxed ones. */
__device__ void post_all(const fc_moe_kargs_t &a, size_t off, bool fence, int skip, const int *counts, uint64_t hi) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (fence) __threadfence_system();
  for (int q = 0; q < a.nranks; q++) {
    if (q == skip) continue;
    uint64_t *p = moe_flag(a, a.peer[q], off, a.rank, blockIdx.x);
    const uint64_t v = counts ? (hi << 32 | (uint32_t)counts[q]) : hi;
    if (fence) fc_st_release_sys(p, v);
    else st_relaxed_sys(p, v);
  }
}

/* Vectors of 16 bytes each lane keeps in flight: a row (7168 bf16 = 896 vectors) copied or
 * polled by one warp a vector per lane at a time would wait for one load latency per 32
 * vectors; CU of them in flight wait once per 32 * CU.  A slab is what one warp takes at once. */
constexpr unsigned CU = 8;
constexpr size_t SLAB = 32 * CU;
__device__ __forceinline__ size_t slabs_of(size_t nvec) { return (nvec + SLAB - 1) / SLAB; }

/* The warp copies vectors [v0, v1) of a row (SENTINEL: a payload equal to the sentinel is
 * changed as fix_sentinel says), all its loads before its stores. */
__device__ __forceinline__ void warp_copy(uint4 *dst, const uint4 *src, size_t v0, size_t v1, unsigned lane,
                                          bool sentinel, int esize, int dtype) {
  for (size_t base = v0; base < v1; base += SLAB) {
    uint4 x[CU];
#pragma unroll
    for (unsigned j = 0; j < CU; j++) {
      const size_t v = base + j * 32 + lane;
      if (v < v1) x[j] = __ldcg(src + v);
    }
#pragma unroll
    for (unsigned j = 0; j < CU; j++) {
      const size_t v = base + j * 32 + lane;
      if (v < v1) dst[v] = sentinel ? fix_sentinel(x[j], esize, dtype) : x[j];
    }
  }
}

/* SENTINEL: the warp polls vectors [v0, v1) of a received row until none holds the sentinel,
 * all its loads issued before it looks at any; false after a timeout or abort. */
__device__ __forceinline__ bool warp_poll(const fc_moe_kargs_t &a, const char *row, size_t v0, size_t v1, unsigned lane,
                                          int esize) {
  for (size_t base = v0; base < v1; base += SLAB) {
    uint4 x[CU];
#pragma unroll
    for (unsigned j = 0; j < CU; j++) {
      const size_t v = base + j * 32 + lane;
      if (v < v1) x[j] = ld_volatile_v4(row + 16 * v);
    }
#pragma unroll
    for (unsigned j = 0; j < CU; j++) {
      const size_t v = base + j * 32 + lane;
      if (v >= v1) continue;
      const long long start = fc_now_ns();
      long long last = start;
      while (!arrived(x[j], esize)) {
        if (fc_wait_expired(a, start, &last)) return false;
        x[j] = ld_volatile_v4(row + 16 * v);
      }
    }
  }
  return true;
}

__global__ void __launch_bounds__(MT) fc_moe_dispatch_kernel(const fc_moe_kargs_t a, const char *tokens, const int *ids,
                                                             int T) {
  __shared__ unsigned long long e_sh;
  __shared__ int cnt_sh[FC_MOE_MAX_RANKS];  /* prev counts, then rows this block sent per destination */
  __shared__ int in_sh[FC_MOE_MAX_RANKS];   /* rows received per source */
  const int n = a.nranks, me = a.rank, esize = esize_of(a.dtype);
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const size_t gw = (size_t)blockIdx.x * WARPS + warp, nw = (size_t)gridDim.x * WARPS;
  const size_t nvec = a.row_bytes / 16;
  if (threadIdx.x == 0) e_sh = *(volatile unsigned long long *)a.epoch + 1;
  for (int q = threadIdx.x; q < n; q += blockDim.x) cnt_sh[q] = a.recv_counts[q];
  __syncthreads();
  const uint64_t e = e_sh;
  const uint32_t e32 = (uint32_t)e;
  if (threadIdx.x == 0) { /* counted right after the read, as fc_epoch_end */
    __threadfence();
    if (atomicAdd(a.done, 1u) == gridDim.x - 1) {
      __threadfence();
      atomicExch(a.done, 0u);
      *(volatile unsigned long long *)a.epoch = e;
    }
  }
  const int par = (int)(e & 1);
  if (blockIdx.x == 0)
    for (int q = threadIdx.x; q < n; q += blockDim.x) a.ctr[(1 - par) * n + q] = 0; /* the next call's */

  /* 2. SENTINEL: the previous call's rows back to all-ones. */
  if (a.sentinel) {
    const uint4 ones = make_uint4(~0u, ~0u, ~0u, ~0u);
    for (int s = 0; s < n; s++)
      for (size_t r = gw; r < (size_t)cnt_sh[s]; r += nw) {
        uint4 *row = (uint4 *)(a.shared + a.off_recv + ((size_t)s * a.max_tokens + r) * a.row_bytes);
        for (size_t v = lane; v < nvec; v += 32) row[v] = ones;
      }
  }
  __syncthreads();
  for (int q = threadIdx.x; q < n; q += blockDim.x) cnt_sh[q] = 0;
  /* 3, 4. */
  post_all(a, a.off_rel, true, -1, nullptr, e);
  if (!wait_all(a, a.off_rel, e, false, -1)) return;

  /* 5. send */
  for (size_t t = gw; t < (size_t)T; t += nw) {
    int d = -1;
    if ((int)lane < a.top_k) {
      const int id = ids[t * a.top_k + lane];
      if (id >= 0 && id < a.num_experts) d = id / a.experts_per_rank;
      /* Sent nowhere, as an id below 0, so that the peers' dispatch completes; the host reports
       * it (flexcoll_comm_get_async_error). */
      else if (id >= a.num_experts) set_error(a, FC_DEV_ERROR_EXPERT_ID);
    }
    const unsigned same = __match_any_sync(0xffffffffu, d);
    const int leader = __ffs(same) - 1;
    const bool lead = d >= 0 && (int)lane == leader;
    int row = 0;
    if (lead) {
      row = atomicAdd(&a.ctr[par * n + d], 1);
      atomicAdd(&cnt_sh[d], 1);
    }
    row = __shfl_sync(0xffffffffu, row, leader);
    if ((int)lane < a.top_k) a.route[t * a.top_k + lane] = d >= 0 ? d * a.max_tokens + row : -1;
    unsigned leaders = __ballot_sync(0xffffffffu, lead);
    const unsigned kmask_all = (1u << a.top_k) - 1;
    const uint4 *src = (const uint4 *)(tokens + t * a.row_bytes);
    while (leaders) {
      const int l = __ffs(leaders) - 1;
      leaders &= leaders - 1;
      const int dd = __shfl_sync(0xffffffffu, d, l);
      const int rr = __shfl_sync(0xffffffffu, row, l);
      const unsigned kmask = __shfl_sync(0xffffffffu, same, l) & kmask_all;
      char *area = a.peer[dd];
      const size_t at = (size_t)me * a.max_tokens + (size_t)rr;
      uint4 *dst = (uint4 *)(area + a.off_recv + at * a.row_bytes);
      warp_copy(dst, src, 0, nvec, lane, a.sentinel, esize, a.dtype);
      if (lane == 0) {
        const uint64_t meta = (uint64_t)e32 << 32 | (uint64_t)(kmask << 16 | (unsigned)t);
        uint64_t *mp = (uint64_t *)(area + a.off_meta) + at;
        if (a.sentinel) st_relaxed_sys(mp, meta); /* after the row's stores of this lane only: polled by tag and data */
        else *(volatile uint64_t *)mp = meta;
      }
    }
    __syncwarp();
  }

  /* 6. post */
  post_all(a, a.off_dflag, !a.sentinel, -1, cnt_sh, e32);

  /* 7. receive */
  if (!wait_all(a, a.off_dflag, e, true, -1)) return;
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    unsigned sum = 0;
    for (unsigned b = 0; b < a.blocks; b++) sum += (uint32_t)fc_ld_volatile(moe_flag(a, a.shared, a.off_dflag, s, b));
    in_sh[s] = (int)sum;
    if (blockIdx.x == 0) a.recv_counts[s] = (int)sum;
  }
  __syncthreads();
  /* Each warp takes (row, slab) pairs: a few rows are polled by many warps at once.  The slab
   * 0 warp of a row also waits for its meta word (SENTINEL) and copies it out. */
  const size_t ns = a.sentinel ? slabs_of(nvec) : 1;
  bool ok = true;
  for (int s = 0; s < n && ok; s++)
    for (size_t i = gw; i < (size_t)in_sh[s] * ns && ok; i += nw) {
      const size_t r = i / ns, sl = i % ns, at = (size_t)s * a.max_tokens + r;
      const uint64_t *mp = (const uint64_t *)(a.shared + a.off_meta) + at;
      if (a.sentinel) {
        int good = 1;
        if (sl == 0 && lane == 0) good = wait_word(a, mp, [e32](uint64_t v) { return (uint32_t)(v >> 32) == e32; });
        good = __shfl_sync(0xffffffffu, good, 0);
        const size_t v0 = sl * SLAB, v1 = v0 + SLAB < nvec ? v0 + SLAB : nvec;
        if (good) good = warp_poll(a, a.shared + a.off_recv + at * a.row_bytes, v0, v1, lane, esize);
        ok = __all_sync(0xffffffffu, good);
        if (!ok) break;
      }
      if (sl == 0 && lane == 0) a.recv_meta[at] = (int)(uint32_t)fc_ld_volatile(mp);
    }
  if (!ok && lane == 0) set_timeout(a);
}

template <int ES>
__device__ __forceinline__ void to_float(uint4 v, int dtype, float *f) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
  if (ES == 4) {
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const unsigned short h = (unsigned short)(w[i / 2] >> (16 * (i & 1)));
      f[i] = dtype == FLEXCOLL_BFLOAT16 ? __uint_as_float((unsigned)h << 16) : __half2float(__ushort_as_half(h));
    }
  }
}
template <int ES>
__device__ __forceinline__ uint4 from_float(const float *f, int dtype) {
  unsigned w[4];
  if (ES == 4) {
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = __float_as_uint(f[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      unsigned short lo, hi;
      if (dtype == FLEXCOLL_BFLOAT16) {
        lo = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i]));
        hi = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1]));
      } else {
        lo = __half_as_ushort(__float2half_rn(f[2 * i]));
        hi = __half_as_ushort(__float2half_rn(f[2 * i + 1]));
      }
      w[i] = (unsigned)lo | (unsigned)hi << 16;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Step 3 of combine for vectors [v0, v1) of token t, by one warp: per k, the lanes' RU vectors
 * of that row are loaded (SENTINEL: polled) together, then folded in k order; false after a
 * timeout (SENTINEL polls). */
constexpr unsigned RU = 4;
template <int ES>
__device__ bool reduce_slab(const fc_moe_kargs_t &a, const char *eout, char *out, size_t t, const int *rt,
                            const float *wt, unsigned lane, size_t v0, size_t v1) {
  constexpr int E = 16 / ES;
  const int me = a.rank;
  for (size_t base = v0; base < v1; base += 32 * RU) {
    float acc[RU][E];
#pragma unroll
    for (unsigned u = 0; u < RU; u++)
#pragma unroll
      for (int j = 0; j < E; j++) acc[u][j] = 0.0f;
    for (int k = 0; k < a.top_k; k++) {
      const int r = rt[k];
      if (r < 0) continue;
      const int d = r / a.max_tokens, slot = r % a.max_tokens;
      const char *row = d == me ? eout + ((size_t)me * a.max_tokens + slot) * a.row_bytes
                                : a.shared + a.off_comb + ((size_t)d * a.max_tokens + slot) * a.row_bytes;
      const bool poll = d != me && a.sentinel;
      uint4 x[RU];
#pragma unroll
      for (unsigned u = 0; u < RU; u++) {
        const size_t v = base + u * 32 + lane;
        if (v < v1) x[u] = poll ? ld_volatile_v4(row + 16 * v) : __ldcg((const uint4 *)row + v);
      }
      const float w = wt[k];
#pragma unroll
      for (unsigned u = 0; u < RU; u++) {
        const size_t v = base + u * 32 + lane;
        if (v >= v1) continue;
        if (poll) {
          const long long start = fc_now_ns();
          long long last = start;
          while (!arrived(x[u], ES)) {
            if (fc_wait_expired(a, start, &last)) return false;
            x[u] = ld_volatile_v4(row + 16 * v);
          }
        }
        float f[E];
        to_float<ES>(x[u], a.dtype, f);
#pragma unroll
        for (int j = 0; j < E; j++) acc[u][j] = fc_fadd(acc[u][j], fc_fmul(w, f[j]));
      }
    }
#pragma unroll
    for (unsigned u = 0; u < RU; u++) {
      const size_t v = base + u * 32 + lane;
      if (v < v1) ((uint4 *)(out + t * a.row_bytes))[v] = from_float<ES>(acc[u], a.dtype);
    }
    if (a.sentinel)
      for (int k = 0; k < a.top_k; k++) {
        const int r = rt[k];
        if (r < 0 || r / a.max_tokens == me) continue;
        char *p = a.shared + a.off_comb + (size_t)r * a.row_bytes;
#pragma unroll
        for (unsigned u = 0; u < RU; u++) {
          const size_t v = base + u * 32 + lane;
          if (v < v1) ((uint4 *)p)[v] = make_uint4(~0u, ~0u, ~0u, ~0u);
        }
      }
  }
  return true;
}

__global__ void __launch_bounds__(MT) fc_moe_combine_kernel(const fc_moe_kargs_t a, const char *eout,
                                                            const float *weights, char *out, int T) {
  __shared__ int cnt_sh[FC_MOE_MAX_RANKS];
  __shared__ int rt_sh[WARPS][FC_MOE_MAX_TOP_K];
  __shared__ float wt_sh[WARPS][FC_MOE_MAX_TOP_K];
  const int n = a.nranks, me = a.rank, esize = esize_of(a.dtype);
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const size_t gw = (size_t)blockIdx.x * WARPS + warp, nw = (size_t)gridDim.x * WARPS;
  const size_t nvec = a.row_bytes / 16;
  const uint64_t e = *(volatile unsigned long long *)a.epoch;
  for (int q = threadIdx.x; q < n; q += blockDim.x) cnt_sh[q] = a.recv_counts[q];
  __syncthreads();

  /* 1. push: (row, slab) pairs over the warps */
  const size_t ns = slabs_of(nvec);
  for (int d = 1; d < n; d++) {
    const int s = (me + d) % n;
    char *area = a.peer[s];
    for (size_t i = gw; i < (size_t)cnt_sh[s] * ns; i += nw) {
      const size_t r = i / ns, v0 = (i % ns) * SLAB, v1 = v0 + SLAB < nvec ? v0 + SLAB : nvec;
      const size_t at = (size_t)s * a.max_tokens + r;
      const uint4 *src = (const uint4 *)(eout + at * a.row_bytes);
      uint4 *dst = (uint4 *)(area + a.off_comb + ((size_t)me * a.max_tokens + r) * a.row_bytes);
      warp_copy(dst, src, v0, v1, lane, a.sentinel, esize, a.dtype);
    }
  }
  /* 2. */
  if (!a.sentinel) {
    post_all(a, a.off_cflag, true, me, nullptr, e);
    if (!wait_all(a, a.off_cflag, e, false, me)) return;
  }

  /* 3. reduce: (token, slab) pairs over the warps, so that a few tokens use many warps */
  bool ok = true;
  for (size_t i = gw; i < (size_t)T * ns && ok; i += nw) {
    const size_t t = i / ns, v0 = (i % ns) * SLAB, v1 = v0 + SLAB < nvec ? v0 + SLAB : nvec;
    if ((int)lane < a.top_k) {
      rt_sh[warp][lane] = a.route[t * a.top_k + lane];
      wt_sh[warp][lane] = weights[t * a.top_k + lane];
    }
    __syncwarp();
    const bool good = esize == 4 ? reduce_slab<4>(a, eout, out, t, rt_sh[warp], wt_sh[warp], lane, v0, v1)
                                 : reduce_slab<2>(a, eout, out, t, rt_sh[warp], wt_sh[warp], lane, v0, v1);
    ok = __all_sync(0xffffffffu, good);
    __syncwarp();
  }
  if (!ok && lane == 0) set_timeout(a);
}

}  // namespace

static bool moe_args_ok(const fc_moe_kargs_t *a) {
  return a && a->nranks >= 1 && a->nranks <= FC_MOE_MAX_RANKS && a->rank >= 0 && a->rank < a->nranks &&
         a->blocks >= 1 && a->blocks <= FC_MOE_MAX_BLOCKS && a->row_bytes && a->row_bytes % 16 == 0 && a->peer &&
         a->shared && a->epoch && a->done && a->ctr && a->recv_counts && a->recv_meta && a->route && a->top_k >= 1 &&
         a->top_k <= FC_MOE_MAX_TOP_K && a->max_tokens >= 1 && a->max_tokens <= FC_MOE_MAX_TOKENS &&
         a->experts_per_rank >= 1;
}

extern "C" int fc_moe_kernel_dispatch(const fc_moe_kargs_t *a, const void *tokens, const int *ids, int T,
                                      flexcoll_stream_t stream) {
  if (!moe_args_ok(a) || T < 0 || T > a->max_tokens || (T && (!tokens || !ids))) return (int)cudaErrorInvalidValue;
  fc_moe_dispatch_kernel<<<a->blocks, MT, 0, (cudaStream_t)stream>>>(*a, (const char *)tokens, ids, T);
  return (int)cudaGetLastError();
}

extern "C" int fc_moe_kernel_combine(const fc_moe_kargs_t *a, const void *expert_out, const float *weights, void *out,
                                     int T, flexcoll_stream_t stream) {
  if (!moe_args_ok(a) || a->dtype == FLEXCOLL_INT8 || T < 0 || T > a->max_tokens || !expert_out ||
      (T && (!weights || !out)))
    return (int)cudaErrorInvalidValue;
  fc_moe_combine_kernel<<<a->blocks, MT, 0, (cudaStream_t)stream>>>(*a, (const char *)expert_out, weights, (char *)out,
                                                                    T);
  return (int)cudaGetLastError();
}

extern "C" int fc_moe_kernels_preload(void) {
  cudaFuncAttributes fa;
  int e = (int)cudaFuncGetAttributes(&fa, fc_moe_dispatch_kernel);
  if (!e) e = (int)cudaFuncGetAttributes(&fa, fc_moe_combine_kernel);
  return e;
}
