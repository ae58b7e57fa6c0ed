/* shm.c — host collectives through one shared-memory segment per communicator (shm.h).
 *
 * Layout (every rank computes it from the rank count and FLEXCOLL_SHM_SLOT_BYTES, both the same
 * on every rank; the header repeats them as a check):
 *   header line | per rank: done line | per rank: FC_SHM_SLOTS slots, each a line (the round
 *   posted in it, the call's word, then up to INLINE_BYTES of data) and slot bytes
 * Every control word has a cache line of its own: a rank polling a peer's word never shares a
 * line with a word that someone else writes.  A round whose data fits beside its post carries it
 * there: the reader's poll brings the data along, one line moved instead of two.
 *
 * Rounds (shm.h): rounds are numbered from 1 over the communicator's life, the same on every
 * rank, and every rank takes part in every round (posting even when it has nothing to write), so
 * "q posted s" implies "q finished s - 1".  Round s writes slot s % FC_SHM_SLOTS; before that a
 * rank waits until every peer is done with round s - FC_SHM_SLOTS, the last one that used it
 * (known without a look where it saw that peer post s - FC_SHM_SLOTS + 1 or later).  A peer can
 * therefore run at most FC_SHM_SLOTS - 1 rounds ahead, and a slot's post is exactly s when a
 * reader of round s looks (it waits for >= s all the same).
 *
 * Three modes (the tuner picks, lib/sched/tuner.c):
 *  - FC_SHM_EXCHANGE: every collective, one round per piece of at most a slot: each rank copies
 *    its input piece (or the blocks its peers need) into its slot, and every rank that needs a
 *    result reads or folds all the slots in rank order; small messages take one round.
 *  - FC_SHM_SPLIT (allreduce, large): reduce-scatter then allgather per step, two rounds: each rank
 *    copies into its slot the parts of the step that the others own, folds its own part from the
 *    n inputs (its own read from its buffer) into its next slot, FOLD_BLOCK at a time, copying each
 *    block on to recv while it is in L1 (fold_out), posts it, and every rank copies the n - 1
 *    peers' reduced parts out.  Each rank reads every byte of the message once and folds 1/n of
 *    it, where the exchange folds all of it on every rank.
 *  - FC_SHM_WINDOW (buffers in host windows, window.c): no slot; round s says "my input is ready
 *    and my output may be written", then each rank does its share straight between the ranks'
 *    buffers, FOLD_BLOCK at a time, and round s + 1 says "done".  Allreduce: each rank folds its
 *    1/n of every input and writes it into every output, 2 bytes moved per byte of the message
 *    where the split moves 4; reduce_scatter: folds its block of every input into its output;
 *    allgather: writes its input into every output; broadcast: copies the root's input.
 * All fold in rank order (fold()), so all give the exchange algorithm's bits.
 *
 * Helper threads (the pool below): from FLEXCOLL_SHM_THREADS_MIN_BYTES a split allreduce runs each
 * step's copy in, fold and copy out as jobs cut into one part per thread (FLEXCOLL_SHM_THREADS,
 * the caller's included), the same cut whoever runs a part; the calling thread alone posts, waits
 * for the peers and checks for failures, and waits for a job's parts before it posts or marks a
 * round done.  One thread folds each element, in rank order: the same bits for any count.
 *
 * From FLEXCOLL_SHM_NT_MIN_BYTES (by default where 2 n times the message outgrows the last-level
 * cache) the split writes recv with non-temporal stores (copy_nt): no read of each output line
 * before it is written, and the slots stay in the caches. */
#define _GNU_SOURCE
#include "host/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "bootstrap.h"
#include "clock.h"
#include "comm.h"
#include "dtype.h"
#include "error.h"
#include "host/host.h"
#include "log.h"
#include "param.h"
#include "topo.h"
#include "window.h"

FC_PARAM_INT(shm_slot_bytes, "SHM_SLOT_BYTES", 256 << 10)
/* Threads per rank (the caller's included) for the copies and folds of a split allreduce of at
 * least SHM_THREADS_MIN_BYTES; 0: this rank's share of the cores it may run on, at most
 * SHM_THREADS_AUTO_MAX (see pool_auto). */
FC_PARAM_INT(shm_threads, "SHM_THREADS", 0)
FC_PARAM_INT(shm_threads_min_bytes, "SHM_THREADS_MIN_BYTES", 1 << 20)
#define SHM_THREADS_AUTO_MAX 4
/* Split allreduce from this size writes recv with non-temporal stores; -1: where the call's
 * buffers, every rank's input and output, outgrow the last-level cache (see nt_auto). */
FC_PARAM_INT(shm_nt_min_bytes, "SHM_NT_MIN_BYTES", -1)
#define SHM_THREADS_MAX 32

#define LINE 64
#define SHM_MAGIC 0x666373686d763031ULL /* "fcshmv01" */
/* Slots per rank: the split mode uses two per step, so four let a rank copy in its next step
 * while its peers still copy out the last one. */
#define FC_SHM_SLOTS 4
/* Bytes of each output a fold produces at a time: its n operand blocks and the result stay in
 * the core's caches between the n - 1 passes. */
#define FOLD_BLOCK (16 << 10)

typedef struct {
  uint64_t magic;
  uint32_t nranks, nslots;
  uint64_t slot_bytes;
  uint32_t cores; /* this host's online cores as rank 0 counted them */
  /* Set by a rank whose wait failed (peer lost, timeout, abort): every rank's waits stop. */
  atomic_uint broken;
} shm_header_t;

typedef struct {
  _Alignas(LINE) _Atomic uint64_t done;   /* last round this rank finished reading */
} shm_ctl_t;

#define INLINE_BYTES (LINE - 16)
typedef struct {
  _Alignas(LINE) _Atomic uint64_t posted; /* the last round whose content is in this slot */
  uint64_t call;                          /* that round's call (call_word): ranks must agree */
  char data[INLINE_BYTES];                /* its content, where it fits */
} slot_head_t;

struct fc_shm {
  char *base;
  size_t bytes;
  shm_header_t *hdr;
  shm_ctl_t *ctl;   /* [nranks] */
  char *slots;      /* [nranks][FC_SHM_SLOTS][a head line + slot_bytes] */
  size_t slot_bytes;
  uint64_t *seen_done; /* per rank: the last round it is known to have finished reading */
  uint64_t round;   /* rounds so far */
  int crowded;      /* more ranks than the host has cores */
  int spins;        /* polls of a word between yields */
  struct pool *pool; /* this rank's helper threads, started at the first call that uses them */
  int nthreads;     /* threads for a large split allreduce, the caller's included (1: none) */
  size_t nt_min;    /* split and window modes from this size (bytes) write recv with non-temporal stores */
};

static size_t ctl_offset(void) { return LINE; }
static size_t slots_offset(int n) { return ctl_offset() + (size_t)n * sizeof(shm_ctl_t); }
static size_t segment_bytes(int n, size_t slot) {
  return slots_offset(n) + (size_t)n * FC_SHM_SLOTS * (sizeof(slot_head_t) + slot);
}

static slot_head_t *head_of(const struct fc_shm *m, int rank, uint64_t round) {
  return (slot_head_t *)(m->slots + ((size_t)rank * FC_SHM_SLOTS + (size_t)(round % FC_SHM_SLOTS)) *
                                        (sizeof(slot_head_t) + m->slot_bytes));
}

/* Where rank's content of round `round` lies, `bytes` in all (writer and readers compute the same
 * bytes): beside the post when it fits, else in the slot proper. */
static char *slot_of(const struct fc_shm *m, int rank, uint64_t round, size_t bytes) {
  slot_head_t *h = head_of(m, rank, round);
  return bytes <= INLINE_BYTES ? h->data : (char *)(h + 1);
}

/* ---- waits ----------------------------------------------------------------------------------- */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Spins on the peer's word before giving the core away: a peer that runs is a few hundred
 * nanoseconds from its post.  Where ranks outnumber cores, the peer waited for is often not
 * running, and every spin delays it: yield almost at once (docs/PERFORMANCE.md). */
#define SPINS 128
#define SPINS_CROWDED 16
/* Past this long without progress the wait sleeps between looks: a peer that is this late is
 * busy elsewhere (its own computation, a slow start), and spinning would only steal its core. */
#define SLEEP_AFTER_MS 5.0

/* Wait until *w (a post or a done word) is at least v; *seen gets the value that satisfied it.
 * The stuck checks are the host executor's (abort, asynchronous error, the bootstrap ring's
 * watch, the timeout), plus the segment's broken word; a failure marks the segment broken for
 * every rank on the host. */
static flexcoll_result_t wait_word(struct flexcoll_comm *c, struct fc_shm *m, _Atomic uint64_t *w, uint64_t v,
                                   uint64_t *seen, double *last, double *next_peer_check) {
  if ((*seen = atomic_load_explicit(w, memory_order_acquire)) >= v) return FLEXCOLL_SUCCESS;
  for (unsigned i = 1;; i++) {
    for (int k = 0; k < m->spins; k++) {
      if ((*seen = atomic_load_explicit(w, memory_order_acquire)) >= v) {
        *last = -1; /* progress: the caller's next wait starts its clock again */
        return FLEXCOLL_SUCCESS;
      }
      cpu_relax();
    }
    if (*last < 0) *last = fc_now_ms();
    if (*next_peer_check == 0) *next_peer_check = *last + 50;
    double t = (i & 7) == 0 ? fc_now_ms() : 0;
    if (t > 0) {
      flexcoll_result_t res = FLEXCOLL_SUCCESS;
      if (atomic_load_explicit(&m->hdr->broken, memory_order_relaxed))
        res = fc_error(c, FLEXCOLL_REMOTE_ERROR, "another rank on this host failed during the collective (shared "
                       "memory round %llu)", (unsigned long long)v);
      else
        res = fc_host_check_stuck(c, c->coll_seq, *last, next_peer_check);
      if (res != FLEXCOLL_SUCCESS) {
        atomic_store(&m->hdr->broken, 1);
        fc_comm_set_async_error(c, res);
        return res;
      }
      if (t - *last > SLEEP_AFTER_MS) {
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
        continue;
      }
    }
    sched_yield();
  }
}

typedef struct {
  struct flexcoll_comm *c;
  struct fc_shm *m;
  double last, next_peer_check;
  uint64_t call; /* call_word of this call */
} waiter_t;

/* The call as a word every rank computes alike: where ranks disagree (count, type, op, root,
 * collective), a reader sees another word in the slot and fails instead of reading too few
 * or too many bytes (the links' receives check the length for the same reason). */
static inline uint64_t mix(uint64_t h, uint64_t v) {
  h = (h ^ v) * 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

/* A multiply per field: the byte-wise FNV hash of the five fields it replaced was 40 dependent
 * multiplies, a tenth of a small call's time. */
static uint64_t call_word(const fc_algo_args_t *a, flexcoll_datatype_t dtype, flexcoll_op_t op) {
  const uint64_t root = (uint64_t)(a->coll == FC_COLL_BROADCAST || a->coll == FC_COLL_REDUCE ? a->root : 0);
  uint64_t h = mix(FC_HASH_INIT, (uint64_t)a->coll);
  h = mix(h, (uint64_t)a->count);
  h = mix(h, (uint64_t)dtype << 32 | (uint64_t)op);
  return mix(h, root);
}

static void waiter_init(waiter_t *w, struct flexcoll_comm *c, uint64_t call) {
  w->c = c;
  w->m = c->shm;
  w->last = -1;
  w->next_peer_check = 0; /* set at the first wait that has to look (no clock read per call) */
  w->call = call;
}

/* Start round s: the slot it writes is free once every peer is done with round s - FC_SHM_SLOTS.
 * Where this rank waited for every peer's post lately (allreduce, allgather, ...), it knows that
 * already and reads no peer's line. */
static flexcoll_result_t begin_round(waiter_t *w, uint64_t s) {
  if (s <= FC_SHM_SLOTS) return FLEXCOLL_SUCCESS;
  struct fc_shm *m = w->m;
  for (int q = 0; q < w->c->nranks; q++)
    if (q != w->c->rank && m->seen_done[q] < s - FC_SHM_SLOTS)
      FC_CHECK(wait_word(w->c, m, &m->ctl[q].done, s - FC_SHM_SLOTS, &m->seen_done[q], &w->last, &w->next_peer_check));
  return FLEXCOLL_SUCCESS;
}

static void post(waiter_t *w, uint64_t s) {
  slot_head_t *h = head_of(w->m, w->c->rank, s);
  h->call = w->call;
  atomic_store_explicit(&h->posted, s, memory_order_release);
}

static flexcoll_result_t wait_posted(waiter_t *w, int q, uint64_t s) {
  if (q == w->c->rank) return FLEXCOLL_SUCCESS;
  uint64_t seen;
  slot_head_t *h = head_of(w->m, q, s);
  FC_CHECK(wait_word(w->c, w->m, &h->posted, s, &seen, &w->last, &w->next_peer_check));
  if (h->call != w->call) {
    atomic_store(&w->m->hdr->broken, 1);
    fc_comm_set_async_error(w->c, FLEXCOLL_INVALID_USAGE);
    return fc_error(w->c, FLEXCOLL_INVALID_USAGE, "rank %d made another call than this one (collective, count, datatype, "
                    "op or root differ, or the buffers' host windows or offsets in them; shared-memory round %llu)", q,
                    (unsigned long long)s);
  }
  /* q posted s only after it finished s - 1 (every rank takes part in every round). */
  if (w->m->seen_done[q] < s - 1) w->m->seen_done[q] = s - 1;
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t wait_all_posted(waiter_t *w, uint64_t s) {
  for (int q = 0; q < w->c->nranks; q++) FC_CHECK(wait_posted(w, q, s));
  return FLEXCOLL_SUCCESS;
}

static void finish_round(waiter_t *w, uint64_t s) {
  atomic_store_explicit(&w->m->ctl[w->c->rank].done, s, memory_order_release);
}

/* ---- helper threads -------------------------------------------------------------------------- */

/* A rank's helpers split the copies and folds of a large split allreduce with the calling thread
 * (issue 14: one core's loads and stores in flight do not fill the memory's bandwidth).  Only the
 * calling thread talks to the peers (posts, waits, the failure checks); a job is local work on
 * buffers that nobody else writes meanwhile, so it always ends, and the caller waits for it before
 * it posts or marks a round done.  Which thread does an element never changes its fold (every
 * element is folded by one thread, in rank order): the bits are the same for any thread count.
 * Helpers start at the first call that uses them, poll for HELPER_SPIN_US after each job (the next
 * one of the call comes within microseconds, the next call's often too), yielding now and then,
 * then sleep on a futex until a job comes; they are joined when the communicator is destroyed. */
typedef void (*job_fn)(void *arg, int part, int nparts);

struct pool;
typedef struct {
  struct pool *p;
  int id;
} helper_t;

/* A job is cut into nthreads parts, always the same cut whoever runs them; the threads claim
 * parts one at a time (ticket), so a caller whose helpers are not running (more threads than
 * cores) does the parts itself instead of waiting for them. */
struct pool {
  int nthreads;                          /* helpers + the caller: the parts of every job */
  pthread_t tid[SHM_THREADS_MAX];
  helper_t helper[SHM_THREADS_MAX];
  _Alignas(LINE) _Atomic uint32_t job;   /* the current job's number (futex word) */
  _Atomic int sleepers;                  /* helpers in (or about to enter) futex_wait */
  _Alignas(LINE) _Atomic uint64_t ticket; /* job number << 32 | the next part to claim */
  _Alignas(LINE) _Atomic int done;       /* parts of the current job finished */
  _Alignas(LINE) _Atomic(job_fn) fn;     /* the job */
  _Atomic(void *) arg;
  _Atomic int stop;
};

/* How long a helper polls for the next job before it sleeps, in microseconds: the jobs of one
 * call come a peer's round apart. */
#define HELPER_SPIN_US 200.0

static void futex_wait(_Atomic uint32_t *w, uint32_t v) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0); }
static void futex_wake(_Atomic uint32_t *w) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0); }

/* Run parts of job j while any is left.  fn and arg were read before the claim: a claim that
 * succeeds is of job j, whose fn and arg the caller rewrites only after every part of j is done,
 * this one included. */
static void claim_parts(struct pool *p, uint32_t j, job_fn fn, void *arg) {
  uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
  while ((uint32_t)(t >> 32) == j && (uint32_t)t < (uint32_t)p->nthreads) {
    if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel, memory_order_acquire)) continue;
    fn(arg, (int)(uint32_t)t, p->nthreads);
    atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    t = atomic_load_explicit(&p->ticket, memory_order_acquire);
  }
}

static void *helper_main(void *v) {
  helper_t *h = v;
  struct pool *p = h->p;
  uint32_t seen = 0;
  double spin_until = 0;
  for (unsigned i = 0;; i++) {
    const uint32_t j = atomic_load_explicit(&p->job, memory_order_acquire);
    if (j == seen) {
      if (spin_until > 0 && ((i & 63) || fc_now_us() < spin_until)) {
        /* Now and then the core goes to whoever else wants it (a peer rank, where threads
         * outnumber cores): on an idle core sched_yield returns at once. */
        if ((i & 63) == 0) sched_yield();
        else cpu_relax();
        continue;
      }
      spin_until = 0;
      /* Either the caller sees this helper among the sleepers and wakes it, or this helper sees
       * the new job (both sequentially consistent); FUTEX_WAIT rechecks the word itself. */
      atomic_fetch_add(&p->sleepers, 1);
      if (atomic_load(&p->job) == seen) futex_wait(&p->job, seen);
      atomic_fetch_sub(&p->sleepers, 1);
      continue;
    }
    seen = j;
    if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
    claim_parts(p, j, atomic_load_explicit(&p->fn, memory_order_relaxed), atomic_load_explicit(&p->arg, memory_order_relaxed));
    spin_until = fc_now_us() + HELPER_SPIN_US;
  }
}

/* Run fn over the pool's parts, with the helpers that come; returns once every part is done. */
static void pool_run(struct pool *p, job_fn fn, void *arg) {
  const uint32_t j = atomic_load_explicit(&p->job, memory_order_relaxed) + 1;
  atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
  atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  atomic_store_explicit(&p->ticket, (uint64_t)j << 32, memory_order_release);
  atomic_store(&p->job, j);
  if (atomic_load(&p->sleepers) > 0) futex_wake(&p->job);
  claim_parts(p, j, fn, arg);
  for (unsigned i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < p->nthreads; i++) {
    if (i < 4096) cpu_relax();
    else sched_yield(); /* a helper put aside in the middle of its part: give it the core */
  }
}

static void pool_stop(struct pool *p) {
  if (!p) return;
  atomic_store(&p->stop, 1);
  atomic_fetch_add(&p->job, 1);
  futex_wake(&p->job);
  for (int i = 1; i < p->nthreads; i++) pthread_join(p->tid[i], NULL);
  free(p);
}

/* Start the helpers of m (nthreads - 1 of them); fewer where the system refuses some (INFO), none
 * where it refuses all: m->nthreads says how many run. */
static void pool_start(struct fc_shm *m) {
  struct pool *p = calloc(1, sizeof *p);
  if (!p) {
    m->nthreads = 1;
    return;
  }
  atomic_init(&p->job, 0);
  atomic_init(&p->sleepers, 0);
  atomic_init(&p->ticket, 0);
  atomic_init(&p->done, 0);
  atomic_init(&p->fn, NULL);
  atomic_init(&p->arg, NULL);
  atomic_init(&p->stop, 0);
  /* Helpers take no signals: those are the application's threads' business. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int started = 1, err = 0;
  for (; started < m->nthreads; started++) {
    p->helper[started] = (helper_t){p, started};
    p->nthreads = started + 1; /* read by the helpers only at their first job */
    if ((err = pthread_create(&p->tid[started], NULL, helper_main, &p->helper[started])) != 0) break;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  p->nthreads = started;
  if (started < m->nthreads)
    FC_INFO(FC_SUB_COLL, "shared memory: %d of %d threads started (%s)", started, m->nthreads, strerror(err));
  m->nthreads = started;
  if (started == 1) {
    free(p);
    return;
  }
  m->pool = p;
}

/* Threads for this rank where FLEXCOLL_SHM_THREADS is 0: its share of the cores it may run on
 * (each core of its affinity mask counts 1 / the number of the segment's ranks that may run
 * there too), at most SHM_THREADS_AUTO_MAX, at least 1.  Ranks bound to a core each (mpirun's
 * default for 2 processes) or outnumbering the cores get 1: no helpers. */
typedef struct {
  uint64_t host;  /* fc_topo_host_hash */
  cpu_set_t cpus; /* the rank's affinity */
} where_t;

static int pool_auto(const where_t *ranks, int n, int me) {
  double share = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &ranks[me].cpus)) continue;
    int users = 0;
    for (int q = 0; q < n; q++) users += CPU_ISSET(cpu, &ranks[q].cpus) != 0;
    share += 1.0 / users;
  }
  int t = (int)(share + 1e-9);
  return t < 1 ? 1 : t > SHM_THREADS_AUTO_MAX ? SHM_THREADS_AUTO_MAX : t;
}

/* ---- folds ----------------------------------------------------------------------------------- */

/* dst = in[0] op in[1] op ... op in[n-1], left to right as the exchange folds (recv = slot 0,
 * recv op= slot 1, ...), block by block.  dst aliases none of in[1..]. */
static void fold(char *dst, const char *const *in, int n, size_t count, size_t esize, flexcoll_datatype_t dtype,
                 flexcoll_op_t op) {
  const size_t per = FOLD_BLOCK / esize;
  for (size_t first = 0; first < count; first += per) {
    size_t k = count - first < per ? count - first : per, off = first * esize;
    if (n == 1) {
      if (dst + off != in[0] + off) memcpy(dst + off, in[0] + off, k * esize);
      continue;
    }
    fc_host_reduce(dst + off, in[0] + off, in[1] + off, k, dtype, op);
    for (int q = 2; q < n; q++) fc_host_reduce(dst + off, dst + off, in[q] + off, k, dtype, op);
  }
}

static void copy(void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src) memcpy(dst, src, bytes);
}

/* copy() with non-temporal stores where the target has them: the lines go to memory without
 * being read first (a plain store reads each line of the output before it writes it) and
 * without evicting the slots from the caches.  Ends with a store fence: the stores are weakly
 * ordered, and a post (or a helper's done) must not overtake them. */
static void copy_nt(void *dst, const void *src, size_t bytes) {
#if defined(__x86_64__)
  if (!bytes || dst == src) return;
  char *d = dst;
  const char *s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > bytes) head = bytes;
  memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {
    const __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16)),
                  e = _mm_loadu_si128((const __m128i *)(s + 32)), f = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), e);
    _mm_stream_si128((__m128i *)(d + 48), f);
  }
  memcpy(d, s, bytes);
  _mm_sfence();
#else
  copy(dst, src, bytes);
#endif
}

/* The copies to the output: non-temporal for a call that says so (call_t.nt). */
#define COPY_OUT(nt, dst, src, bytes) ((nt) ? copy_nt(dst, src, bytes) : copy(dst, src, bytes))

/* ---- the exchange mode ----------------------------------------------------------------------- */

typedef struct {
  waiter_t w;
  const fc_algo_args_t *a;
  const char *send;
  char *recv;
  size_t esize;
  flexcoll_datatype_t dtype;
  flexcoll_op_t op;
  struct pool *pool; /* the helpers that share this call's copies and folds, or NULL */
  int nt;            /* the split's copies to recv with non-temporal stores */
} call_t;

/* One round of the exchange mode: elements [first, first + len) of the input (of each block). */
static flexcoll_result_t exchange_piece(call_t *x, size_t first, size_t len) {
  struct flexcoll_comm *c = x->w.c;
  struct fc_shm *m = x->w.m;
  const int n = c->nranks, me = c->rank, root = x->a->root;
  const size_t es = x->esize, count = x->a->count, bytes = len * es;
  const uint64_t s = ++m->round;
  const char *in[FC_SHM_MAX_RANKS];
  FC_CHECK(begin_round(&x->w, s));
  const int blocks = x->a->coll == FC_COLL_REDUCE_SCATTER || x->a->coll == FC_COLL_ALLTOALL;
  const size_t used = blocks ? (size_t)n * bytes : bytes; /* of a slot, by each rank */
  char *mine = slot_of(m, me, s, used);
  switch (x->a->coll) {
    case FC_COLL_ALLREDUCE:
    case FC_COLL_REDUCE:
    case FC_COLL_ALLGATHER:
      copy(mine, x->send + first * es, bytes);
      break;
    case FC_COLL_BROADCAST:
      if (me == root) copy(mine, x->send + first * es, bytes);
      break;
    case FC_COLL_REDUCE_SCATTER:
    case FC_COLL_ALLTOALL:
      /* Block q's piece at q * len: what rank q reads. */
      for (int q = 0; q < n; q++) copy(mine + (size_t)q * bytes, x->send + ((size_t)q * count + first) * es, bytes);
      break;
    default:
      return fc_error(c, FLEXCOLL_INTERNAL_ERROR, "shared-memory exchange: collective %d", (int)x->a->coll);
  }
  post(&x->w, s);
  switch (x->a->coll) {
    case FC_COLL_ALLREDUCE:
    case FC_COLL_REDUCE:
      if (x->a->coll == FC_COLL_REDUCE && me != root) break;
      FC_CHECK(wait_all_posted(&x->w, s));
      for (int q = 0; q < n; q++) in[q] = slot_of(m, q, s, used);
      fold(x->recv + first * es, in, n, len, es, x->dtype, x->op);
      if (x->op == FLEXCOLL_AVG) fc_host_divide(x->recv + first * es, len, x->dtype, n);
      break;
    case FC_COLL_REDUCE_SCATTER:
      FC_CHECK(wait_all_posted(&x->w, s));
      for (int q = 0; q < n; q++) in[q] = slot_of(m, q, s, used) + (size_t)me * bytes;
      fold(x->recv + first * es, in, n, len, es, x->dtype, x->op);
      if (x->op == FLEXCOLL_AVG) fc_host_divide(x->recv + first * es, len, x->dtype, n);
      break;
    case FC_COLL_ALLGATHER:
      for (int q = 0; q < n; q++) {
        FC_CHECK(wait_posted(&x->w, q, s));
        /* In place, this rank's block of recv is its sendbuf: copy() skips it. */
        copy(x->recv + ((size_t)q * count + first) * es, q == me ? x->send + first * es : slot_of(m, q, s, used), bytes);
      }
      break;
    case FC_COLL_ALLTOALL:
      for (int q = 0; q < n; q++) {
        FC_CHECK(wait_posted(&x->w, q, s));
        copy(x->recv + ((size_t)q * count + first) * es, slot_of(m, q, s, used) + (size_t)me * bytes, bytes);
      }
      break;
    case FC_COLL_BROADCAST:
      if (me == root) copy(x->recv + first * es, x->send + first * es, bytes);
      else {
        FC_CHECK(wait_posted(&x->w, root, s));
        copy(x->recv + first * es, slot_of(m, root, s, used), bytes);
      }
      break;
    default:
      break;
  }
  finish_round(&x->w, s);
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t run_exchange(call_t *x) {
  const int n = x->w.c->nranks;
  const fc_coll_t coll = x->a->coll;
  /* Elements per round: what one slot holds of the input, or of each of the n blocks. */
  size_t per = x->w.m->slot_bytes / x->esize;
  if (coll == FC_COLL_REDUCE_SCATTER || coll == FC_COLL_ALLTOALL) per /= (size_t)n;
  for (size_t first = 0; first < x->a->count; first += per)
    FC_CHECK(exchange_piece(x, first, x->a->count - first < per ? x->a->count - first : per));
  return FLEXCOLL_SUCCESS;
}

/* ---- the split mode (allreduce) -------------------------------------------------------------- */

/* Step [base, base + len) of the message: part q is [q * pp, (q + 1) * pp) of it, clipped. */
static void part(size_t len, size_t pp, int q, size_t *off, size_t *k) {
  size_t a = (size_t)q * pp, b = a + pp;
  if (a > len) a = len;
  if (b > len) b = len;
  *off = a;
  *k = b - a;
}

/* out = the fold of in[0..n-1] (count elements; AVG divided), and the same into recv, FOLD_BLOCK
 * at a time: each block is copied to recv right after it is folded, from this core's L1, so the
 * copy-out of the round after reads only the peers' parts.  out aliases nothing; recv may be
 * in[me] (in place), whose block is consumed before it is overwritten. */
static void fold_out(char *out, char *recv, const char *const *in, int n, size_t count, const call_t *x) {
  const size_t es = x->esize, per = FOLD_BLOCK / es;
  const char *blk[FC_SHM_MAX_RANKS];
  for (size_t first = 0; first < count; first += per) {
    const size_t k = count - first < per ? count - first : per, off = first * es;
    for (int q = 0; q < n; q++) blk[q] = in[q] + off;
    fold(out + off, blk, n, k, es, x->dtype, x->op);
    if (x->op == FLEXCOLL_AVG) fc_host_divide(out + off, k, x->dtype, n);
    COPY_OUT(x->nt, recv + off, out + off, k * es);
  }
}

/* Copies of a step as one job: segments (dst, src, bytes) end to end; part i of nparts copies
 * bytes [edge(i), edge(i + 1)) of them, edges on cache lines. */
typedef struct {
  char *dst;
  const char *src;
  size_t bytes;
} seg_t;

typedef struct {
  seg_t seg[FC_SHM_MAX_RANKS];
  int nseg;
  int nt; /* non-temporal stores (copy_nt) */
  size_t total;
} copy_job_t;

/* Where part i of nparts of total begins: a multiple of unit, the remainder in the last part. */
static size_t edge(size_t total, size_t unit, int i, int nparts) {
  return i >= nparts ? total : total / unit * (size_t)i / (size_t)nparts * unit;
}

static void add_seg(copy_job_t *j, char *dst, const char *src, size_t bytes) {
  if (!bytes) return;
  j->seg[j->nseg++] = (seg_t){dst, src, bytes};
  j->total += bytes;
}

static void copy_job(void *v, int part, int nparts) {
  const copy_job_t *j = v;
  const size_t a = edge(j->total, LINE, part, nparts), b = edge(j->total, LINE, part + 1, nparts);
  size_t pos = 0;
  for (int i = 0; i < j->nseg && pos < b; pos += j->seg[i++].bytes) {
    const seg_t *g = &j->seg[i];
    const size_t lo = a > pos ? a : pos, hi = b < pos + g->bytes ? b : pos + g->bytes;
    if (lo < hi) COPY_OUT(j->nt, g->dst + (lo - pos), g->src + (lo - pos), hi - lo);
  }
}

/* This rank's part of a step: fold_out over elements [edge(i), edge(i + 1)), edges on lines. */
typedef struct {
  const call_t *x;
  char *out, *recv;
  const char *in[FC_SHM_MAX_RANKS];
  int n;
  size_t count, align;
} fold_job_t;

static void fold_job(void *v, int part, int nparts) {
  const fold_job_t *j = v;
  const size_t es = j->x->esize;
  const size_t a = edge(j->count, j->align, part, nparts), b = edge(j->count, j->align, part + 1, nparts);
  if (a >= b) return;
  const char *in[FC_SHM_MAX_RANKS];
  for (int q = 0; q < j->n; q++) in[q] = j->in[q] + a * es;
  fold_out(j->out + a * es, j->recv + a * es, in, j->n, b - a, j->x);
}

/* A job over this call's threads: the pool's, or this thread alone. */
static void run_job(const call_t *x, job_fn fn, void *arg) {
  if (x->pool) pool_run(x->pool, fn, arg);
  else fn(arg, 0, 1);
}

static flexcoll_result_t split_step(call_t *x, size_t base, size_t len, size_t align) {
  struct flexcoll_comm *c = x->w.c;
  struct fc_shm *m = x->w.m;
  const int n = c->nranks, me = c->rank;
  const size_t es = x->esize;
  /* Parts start on cache lines (align elements), so no two ranks write one line of the output. */
  size_t pp = (len + (size_t)n - 1) / (size_t)n;
  pp = (pp + align - 1) / align * align;
  size_t off, k;
  copy_job_t cj = {.nseg = 0, .total = 0};

  /* Round s: the parts the others own, at their offsets within the step. */
  const uint64_t s = ++m->round;
  FC_CHECK(begin_round(&x->w, s));
  char *mine = slot_of(m, me, s, len * es);
  for (int q = 0; q < n; q++) {
    part(len, pp, q, &off, &k);
    if (q != me) add_seg(&cj, mine + off * es, x->send + (base + off) * es, k * es);
  }
  run_job(x, copy_job, &cj);
  post(&x->w, s);
  FC_CHECK(wait_all_posted(&x->w, s));
  /* Fold this rank's part into its slot of round s + 1, free already: every peer posted s, so
   * every peer finished s - 1 and round s + 1 - FC_SHM_SLOTS before it; each block of the
   * result goes on to recv while it is still in this core's cache (fold_out). */
  part(len, pp, me, &off, &k);
  fold_job_t fj = {.x = x, .out = slot_of(m, me, s + 1, k * es), .recv = x->recv + (base + off) * es, .n = n, .count = k,
                   .align = align};
  for (int q = 0; q < n; q++) fj.in[q] = q == me ? x->send + (base + off) * es : slot_of(m, q, s, len * es) + off * es;
  run_job(x, fold_job, &fj);
  finish_round(&x->w, s);

  /* Round s + 1: the peers' reduced parts into place (this rank's own is there already).  Alone,
   * each as soon as its peer posted it; with helpers, all at once. */
  const uint64_t t = ++m->round;
  post(&x->w, t);
  if (x->pool) {
    FC_CHECK(wait_all_posted(&x->w, t));
    cj.nseg = 0;
    cj.total = 0;
    cj.nt = x->nt;
    for (int q = 0; q < n; q++) {
      part(len, pp, q, &off, &k);
      if (q != me) add_seg(&cj, x->recv + (base + off) * es, slot_of(m, q, t, k * es), k * es);
    }
    run_job(x, copy_job, &cj);
  } else {
    for (int q = 0; q < n; q++) {
      if (q == me) continue;
      FC_CHECK(wait_posted(&x->w, q, t));
      part(len, pp, q, &off, &k);
      COPY_OUT(x->nt, x->recv + (base + off) * es, slot_of(m, q, t, k * es), k * es);
    }
  }
  finish_round(&x->w, t);
  return FLEXCOLL_SUCCESS;
}

static flexcoll_result_t run_split(call_t *x) {
  const int n = x->w.c->nranks;
  const size_t align = LINE / x->esize;
  /* A step is n parts of a whole number of lines, each within a slot. */
  size_t pp = x->w.m->slot_bytes / (size_t)n / LINE * LINE / x->esize;
  size_t step = pp * (size_t)n;
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  for (size_t base = 0; base < x->a->count && res == FLEXCOLL_SUCCESS; base += step)
    res = split_step(x, base, x->a->count - base < step ? x->a->count - base : step, align);
  /* The helpers poll on for HELPER_SPIN_US, then sleep: calls back to back (a training step's
   * buckets, a benchmark) find them awake instead of paying a futex wake each. */
  return res;
}

/* ---- the window mode (buffers in host windows) ------------------------------------------------ */

/* This rank's work of a call, cut between the threads: count elements of each of nin inputs,
 * folded in rank order (one input: copied), into each of nout outputs, as mapped here. */
typedef struct {
  const call_t *x;
  const char *in[FC_SHM_MAX_RANKS];
  char *out[FC_SHM_MAX_RANKS];
  int nin, nout;
  size_t count, align;
} window_job_t;

/* Each block is folded into a buffer of this thread's before any output is written: in place,
 * an output is one of the inputs, and the block of every input must be read first. */
static void window_job(void *v, int part, int nparts) {
  const window_job_t *j = v;
  const call_t *x = j->x;
  const size_t es = x->esize, per = FOLD_BLOCK / es;
  const size_t a = edge(j->count, j->align, part, nparts), b = edge(j->count, j->align, part + 1, nparts);
  _Alignas(LINE) char tmp[FOLD_BLOCK];
  const char *blk[FC_SHM_MAX_RANKS];
  for (size_t first = a; first < b; first += per) {
    const size_t k = b - first < per ? b - first : per, off = first * es;
    const char *src = j->in[0] + off;
    if (j->nin > 1) {
      for (int q = 0; q < j->nin; q++) blk[q] = j->in[q] + off;
      fold(tmp, blk, j->nin, k, es, x->dtype, x->op);
      if (x->op == FLEXCOLL_AVG) fc_host_divide(tmp, k, x->dtype, j->nin);
      src = tmp;
    }
    for (int q = 0; q < j->nout; q++) COPY_OUT(x->nt, j->out[q] + off, src, k * es);
  }
}

/* Round s: "my inputs are ready and my outputs may be written"; this rank's work; round t: "my
 * work is in its outputs and I read no input any more".  A rank waits in round t for the ranks
 * whose work touches its buffers (all of them, but for broadcast: only the root's input is read,
 * and nobody touches another's output). */
static flexcoll_result_t run_window(call_t *x, const fc_shm_windows_t *win) {
  struct fc_shm *m = x->w.m;
  const int n = x->w.c->nranks, me = x->w.c->rank, root = x->a->root;
  const size_t es = x->esize, count = x->a->count, align = LINE / es;
  window_job_t j = {.x = x, .count = count, .align = align};
  switch (x->a->coll) {
    case FC_COLL_ALLREDUCE: {
      /* Parts start on cache lines (of the buffers' offsets in their windows), so no two ranks
       * write one line of an output whose offset is a multiple of a line. */
      size_t pp = (count + (size_t)n - 1) / (size_t)n, off;
      pp = (pp + align - 1) / align * align;
      part(count, pp, me, &off, &j.count);
      for (int q = 0; q < n; q++) {
        j.in[q] = win->send->peer[q] + win->send_off + off * es;
        j.out[q] = win->recv->peer[q] + win->recv_off + off * es;
      }
      j.nin = j.nout = n;
      break;
    }
    case FC_COLL_REDUCE_SCATTER: /* block me of every input, into this rank's output */
      for (int q = 0; q < n; q++) j.in[q] = win->send->peer[q] + win->send_off + (size_t)me * count * es;
      j.out[0] = x->recv;
      j.nin = n, j.nout = 1;
      break;
    case FC_COLL_ALLGATHER: /* this rank's input, into block me of every output */
      j.in[0] = x->send;
      for (int q = 0; q < n; q++) j.out[q] = win->recv->peer[q] + win->recv_off + (size_t)me * count * es;
      j.nin = 1, j.nout = n;
      break;
    case FC_COLL_BROADCAST: /* the root's input, into this rank's output (every rank at once) */
      j.in[0] = win->send->peer[root] + win->send_off;
      j.out[0] = x->recv;
      j.nin = j.nout = 1;
      break;
    default:
      return fc_error(x->w.c, FLEXCOLL_INTERNAL_ERROR, "shared-memory window mode: collective %d", (int)x->a->coll);
  }
  const int bcast = x->a->coll == FC_COLL_BROADCAST;
  const uint64_t s = ++m->round;
  FC_CHECK(begin_round(&x->w, s));
  post(&x->w, s);
  /* Broadcast needs only the root's post here, but every rank looks at every peer's: ranks that
   * disagree on the windows then all fail, not only the root and the one that differs. */
  FC_CHECK(wait_all_posted(&x->w, s));
  if (j.count) run_job(x, window_job, &j);
  finish_round(&x->w, s);
  const uint64_t t = ++m->round;
  FC_CHECK(begin_round(&x->w, t));
  post(&x->w, t);
  if (!bcast || me == root) FC_CHECK(wait_all_posted(&x->w, t));
  finish_round(&x->w, t);
  return FLEXCOLL_SUCCESS;
}

/* The window mode's call word adds where the buffers lie: a rank whose buffers are elsewhere in
 * the windows (or in other windows) would have its peers read and write the wrong bytes, so the
 * ranks must agree on it like on the count.  A buffer the mode does not share adds nothing. */
static uint64_t window_word(uint64_t call, const fc_shm_windows_t *win) {
  if (win->send) call = mix(mix(call, (uint64_t)win->send->id << 1), (uint64_t)win->send_off);
  if (win->recv) call = mix(mix(call, (uint64_t)win->recv->id << 1 | 1), (uint64_t)win->recv_off);
  return call;
}

flexcoll_result_t fc_shm_run(struct flexcoll_comm *comm, fc_shm_mode_t mode, const fc_algo_args_t *args,
                             const void *sendbuf, void *recvbuf, flexcoll_datatype_t dtype, flexcoll_op_t op,
                             size_t bytes, const fc_shm_windows_t *win) {
  call_t x = {.a = args, .send = sendbuf, .recv = recvbuf, .esize = fc_dtype_size(dtype), .dtype = dtype, .op = op};
  const int windowed = mode == FC_SHM_WINDOW && win;
  const int split = mode == FC_SHM_SPLIT && args->coll == FC_COLL_ALLREDUCE;
  uint64_t word = call_word(args, dtype, op);
  /* Every mode gets its own word: ranks that chose differently fail at the first round. */
  word = windowed ? window_word(mix(word, FC_SHM_WINDOW), win) : mix(word, split ? FC_SHM_SPLIT : FC_SHM_EXCHANGE);
  waiter_init(&x.w, comm, word);
  struct fc_shm *m = comm->shm;
  if ((split || windowed) && m->nthreads > 1 && bytes >= (size_t)fc_param_shm_threads_min_bytes()) {
    if (!m->pool) pool_start(m);
    x.pool = m->pool;
  }
  x.nt = (split || windowed) && bytes >= m->nt_min;
  flexcoll_result_t res = windowed ? run_window(&x, win) : split ? run_split(&x) : run_exchange(&x);
  /* A call that failed half-way leaves this rank's rounds out of step with its peers: the
   * communicator is unusable (as for the host executor). */
  if (res != FLEXCOLL_SUCCESS) fc_comm_set_async_error(comm, res);
  return res;
}

/* ---- set-up ---------------------------------------------------------------------------------- */

#define NAME_LEN 64

static void unmap(struct fc_shm *m) {
  pool_stop(m->pool); /* before the pages its helpers may read go */
  if (m->base) munmap(m->base, m->bytes);
  free(m->seen_done);
  free(m);
}

/* Create (rank 0) the segment named name, sized and initialised; NULL and why otherwise. */
static struct fc_shm *create(const char *name, int n, size_t slot, char *why, size_t wlen) {
  struct fc_shm *m = calloc(1, sizeof *m);
  if (!m) return snprintf(why, wlen, "out of memory"), NULL;
  m->bytes = segment_bytes(n, slot);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    snprintf(why, wlen, "shm_open(%s): %s", name, strerror(errno));
    free(m);
    return NULL;
  }
  /* Reserve the pages now: a full /dev/shm fails here instead of raising SIGBUS at a store. */
  int e = posix_fallocate(fd, 0, (off_t)m->bytes);
  void *p = e ? MAP_FAILED : mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    snprintf(why, wlen, "%s %zu bytes of %s: %s", e ? "reserving" : "mapping", m->bytes, name, strerror(e ? e : errno));
    close(fd);
    shm_unlink(name);
    free(m);
    return NULL;
  }
  close(fd);
  m->base = p;
  if (!(m->seen_done = calloc((size_t)n, sizeof *m->seen_done))) {
    snprintf(why, wlen, "out of memory");
    unmap(m);
    shm_unlink(name);
    return NULL;
  }
  shm_header_t *h = p;
  h->nranks = (uint32_t)n;
  h->nslots = FC_SHM_SLOTS;
  h->slot_bytes = slot;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  h->cores = cores > 0 ? (uint32_t)cores : 1;
  atomic_init(&h->broken, 0);
  h->magic = SHM_MAGIC; /* the name reaches the others over the bootstrap, after this */
  return m;
}

/* Map the segment rank 0 created; NULL and why otherwise. */
static struct fc_shm *attach(const char *name, int n, size_t slot, char *why, size_t wlen) {
  struct fc_shm *m = calloc(1, sizeof *m);
  if (!m) return snprintf(why, wlen, "out of memory"), NULL;
  m->bytes = segment_bytes(n, slot);
  int fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0) {
    snprintf(why, wlen, "shm_open(%s): %s", name, strerror(errno));
    free(m);
    return NULL;
  }
  struct stat st;
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size == m->bytes)
    p = mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  else
    snprintf(why, wlen, "%s is not the %zu bytes expected", name, m->bytes);
  close(fd);
  if (p == MAP_FAILED) {
    if (!why[0]) snprintf(why, wlen, "mmap of %s: %s", name, strerror(errno));
    free(m);
    return NULL;
  }
  m->base = p;
  if (!(m->seen_done = calloc((size_t)n, sizeof *m->seen_done))) {
    snprintf(why, wlen, "out of memory");
    unmap(m);
    return NULL;
  }
  const shm_header_t *h = p;
  if (h->magic != SHM_MAGIC || h->nranks != (uint32_t)n || h->slot_bytes != slot || h->nslots != FC_SHM_SLOTS) {
    snprintf(why, wlen, "%s does not hold this communicator's layout", name);
    unmap(m);
    return NULL;
  }
  return m;
}

/* FLEXCOLL_SHM_NT_MIN_BYTES unset: non-temporal stores once the n inputs and n outputs of a call
 * (2 n x its bytes) fill the last-level cache, so that a call's output would not stay there
 * for the next anyway; below that, plain stores keep it in the cache (a benchmark's buffers,
 * reused call after call, stay there).  Measured on the 2-core machine (32 MiB L3, shared),
 * 2 processes: 15 % faster at 8 MiB, 21 % at 32 MiB, no change at 2 MiB (docs/PERFORMANCE.md). */
static size_t nt_auto(int n) {
  /* The last level of the cache that core 0 uses, as sysfs gives it (one instance: sysconf's
   * _SC_LEVEL3_CACHE_SIZE said 256 MiB on the 2-core VM, whose L3 is 32 MiB). */
  long llc = 0;
  for (int i = 0; i < 8; i++) {
    char path[96];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *f = fopen(path, "r");
    if (!f) break;
    long v = 0;
    char unit = 0;
    if (fscanf(f, "%ld%c", &v, &unit) >= 1) llc = v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0); /* the highest index last */
    fclose(f);
  }
  if (llc <= 0) llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = 32L << 20; /* unknown: a server's usual */
  return (size_t)llc / (2 * (size_t)n);
}

static void finish_layout(struct fc_shm *m, int n, size_t slot) {
  m->hdr = (shm_header_t *)m->base;
  m->ctl = (shm_ctl_t *)(m->base + ctl_offset());
  m->slots = m->base + slots_offset(n);
  m->slot_bytes = slot;
  m->crowded = (uint32_t)n > m->hdr->cores;
  m->spins = m->crowded ? SPINS_CROWDED : SPINS;
}


flexcoll_result_t fc_shm_open(struct flexcoll_comm *c) {
  const int n = c->nranks, me = c->rank;
  c->shm = NULL;
  if (!fc_tuner_shm_enabled() || n < 2) return FLEXCOLL_SUCCESS;
  if (n > FC_SHM_MAX_RANKS) {
    FC_INFO(FC_SUB_INIT, "shared-memory collectives off: %d ranks (at most %d)", n, FC_SHM_MAX_RANKS);
    return FLEXCOLL_SUCCESS;
  }
  const int64_t slot_param = fc_param_shm_slot_bytes();
  if (slot_param < 4096 || slot_param % 4096 || slot_param / n < LINE)
    return fc_error(c, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_SHM_SLOT_BYTES=%lld: not a multiple of 4096 of at least "
                    "4096 and %d lines per rank", (long long)slot_param, n);
  const size_t slot = (size_t)slot_param;

  /* Every rank on this host? (The same answer everywhere: the same gathered hashes.)  With it,
   * the cores each rank may run on, for its helper threads (pool_auto). */
  where_t *h = calloc((size_t)n, sizeof *h);
  if (!h) return fc_error(c, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  h[me].host = fc_topo_host_hash();
  if (sched_getaffinity(0, sizeof h[me].cpus, &h[me].cpus) != 0) {
    CPU_ZERO(&h[me].cpus);
    CPU_SET(0, &h[me].cpus); /* unknown: count one core */
  }
  flexcoll_result_t res = fc_bootstrap_allgather(c->bootstrap, h, sizeof *h);
  int one_host = 1;
  for (int q = 0; q < n; q++) one_host &= h[q].host == h[0].host;
  const int64_t threads_param = fc_param_shm_threads();
  const int nthreads = threads_param > 0 ? (int)(threads_param < SHM_THREADS_MAX ? threads_param : SHM_THREADS_MAX)
                                         : pool_auto(h, n, me);
  free(h);
  FC_CHECK(res);
  if (!one_host) {
    FC_INFO(FC_SUB_INIT, "shared-memory collectives off: the ranks are on several hosts");
    return FLEXCOLL_SUCCESS;
  }

  /* Rank 0 creates the segment and hands its name round; rank 0's pid in the name says whose it
   * is (tests look for leftovers by it). */
  char *names = calloc((size_t)n, NAME_LEN), why[256] = "";
  if (!names) return fc_error(c, FLEXCOLL_SYSTEM_ERROR, "out of memory");
  struct fc_shm *m = NULL;
  if (me == 0) {
    static atomic_uint serial;
    const uint64_t id = fc_hash_bytes(FC_HASH_INIT, &c->init_id, sizeof c->init_id);
    snprintf(names, NAME_LEN, "/flexcoll-shm-%d-%u-%016llx", (int)getpid(), atomic_fetch_add(&serial, 1),
             (unsigned long long)id);
    m = create(names, n, slot, why, sizeof why);
    if (!m) names[0] = '\0';
  }
  char mine[NAME_LEN];
  snprintf(mine, sizeof mine, "%s", names);
  res = fc_bootstrap_allgather(c->bootstrap, names, NAME_LEN);
  const int have_name = res == FLEXCOLL_SUCCESS ? names[0] != '\0' : me == 0 && mine[0];
  if (res == FLEXCOLL_SUCCESS && me != 0) {
    if (names[0]) m = attach(names, n, slot, why, sizeof why);
    else snprintf(why, sizeof why, "rank 0 could not create the segment");
  }
  int first_not = -1;
  if (res == FLEXCOLL_SUCCESS) res = fc_bootstrap_agree(c->bootstrap, m != NULL, &first_not);
  /* Every rank mapped it, failed to, or left: nobody opens it by name any more.  Every rank
   * unlinks it (the first succeeds, the others find it gone), so that no rank returns from init
   * with the name still in /dev/shm, whichever rank gets here first. */
  if (have_name) shm_unlink(me == 0 ? mine : names);
  free(names);
  if (res != FLEXCOLL_SUCCESS || first_not >= 0) {
    if (m) unmap(m);
    FC_CHECK(res);
    FC_INFO(FC_SUB_INIT, "shared-memory collectives off: rank %d could not map the segment%s%s", first_not,
            why[0] ? ": " : "", why);
    return FLEXCOLL_SUCCESS;
  }
  finish_layout(m, n, slot);
  m->nthreads = nthreads;
  const int64_t nt_param = fc_param_shm_nt_min_bytes();
  m->nt_min = nt_param >= 0 ? (size_t)nt_param : nt_auto(n);
  c->shm = m;
  FC_INFO(FC_SUB_INIT, "shared-memory collectives on: %d ranks, %d slots of %zu bytes each, %u cores, %d thread%s per rank "
          "for allreduce from %lld bytes, non-temporal stores from %zu bytes", n, FC_SHM_SLOTS, slot, m->hdr->cores, nthreads,
          nthreads > 1 ? "s" : "", (long long)fc_param_shm_threads_min_bytes(), m->nt_min);
  return FLEXCOLL_SUCCESS;
}

int fc_shm_crowded(const struct flexcoll_comm *c) { return c->shm ? c->shm->crowded : 0; }

void fc_shm_close(struct flexcoll_comm *c) {
  if (!c->shm) return;
  unmap(c->shm);
  c->shm = NULL;
}
