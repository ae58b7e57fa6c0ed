/* test_host_window.c — windows on host memory (flexcoll_host_alloc, flexcoll_host_free, and
 * flexcoll_window_register on their memory) through the public API.
 *
 * Cases (CK_RUN_CASE=<tcase> runs one):
 *   alloc        flexcoll_host_alloc / flexcoll_host_free alone: argument errors and the last
 *                error naming the argument, free(NULL), a malloc pointer, an interior pointer, a
 *                double free, zeroed page-aligned writable memory of the page-rounded size,
 *                distinct allocations, a free from another thread, a size that cannot be
 *                rounded, no descriptor kept per allocation, nothing linked in /dev/shm.
 *   procs        the windowed collectives (allreduce, reduce_scatter, allgather, broadcast),
 *                ranks as forked processes: 2, 3 and 4 ranks with FLEXCOLL_SHM_WINDOW_MIN_BYTES=0
 *                (every size takes the window path), 3 ranks with the default threshold, 3 ranks
 *                with 3 helper threads per rank and non-temporal stores at every size.  Each:
 *                every datatype (x op, AVG included, for the reductions) x count 1, 7, 1001, 65537
 *                (reduce_scatter's recvcount, allgather's sendcount); broadcast with root n-1 and
 *                root 0; allreduce in place and out of place; the others in three placements: in
 *                place (reduce_scatter: recvbuf = sendbuf + rank x count, allgather: sendbuf =
 *                recvbuf + rank x count, broadcast: sendbuf = recvbuf), out of place with the
 *                buffer the ranks need not agree on ("unshared": reduce_scatter's and broadcast's
 *                recvbuf, allgather's sendbuf) in the window too (at counts 7 and 65537 40 bytes
 *                further per rank: other offsets on every rank), and out of place with it on the
 *                heap (at counts 7 and 65537 on the even ranks only); at 65537 reduce_scatter's
 *                heap placement for one op per datatype.  Then about 4 MiB of data (+3 elements;
 *                reduce_scatter's sendbuf and allgather's recvbuf, n blocks, that size) for a
 *                subset (want_big): at 3 ranks (min 0) every datatype x op of allreduce (in place
 *                or not by turns) and every datatype of the others; elsewhere allreduce int8,
 *                float16, float32, uint64 x sum, avg, max, reduce_scatter five datatype-op pairs,
 *                allgather and broadcast four datatypes.  Buffers sit 128 bytes into their
 *                window (the shared buffer at the same offset on every rank; the other right
 *                after it, often unaligned), one window at the start of its allocation and one at
 *                an interior pointer (page 1 on, the last page left out), fresh inputs per call.
 *                Every result is checked against the harness's reference (integers exactly,
 *                floats within hx_tolerance, as test_coll; data movement bitwise) and bitwise
 *                against the same call on heap buffers (the normal host path, which folds in rank
 *                order too); inputs must be unchanged (broadcast: every rank's sendbuf;
 *                reduce_scatter in place: all but this rank's block), every byte of both
 *                allocations outside the call's buffers must keep its poison (0xA5), whoever
 *                wrote it, and a heap buffer its guards.  The 4 MiB calls check the reference on
 *                samples (both ends and around every 1/n boundary, 2048 elements each, of every
 *                block; float32 sum and float32 data movement at every element) and every element
 *                bitwise against the normal path.
 *   threads      the same with ranks as threads of one process: 2 ranks (the 4 MiB calls of the
 *                3-rank run above), 3 ranks, 2 ranks with the default threshold, 2 ranks with
 *                helper threads and non-temporal stores.
 *   many         110 calls of the four collectives, varying sizes, datatypes, ops, roots and
 *                offsets in one window: 50 each followed by the same on the heap, 50 straight
 *                after each other (reference only); then deregister, an allreduce, a
 *                reduce_scatter and a broadcast on the same (no longer registered) memory, a
 *                second registration of the same allocation, 10 more calls, deregister, free;
 *                processes (3) and threads (2).
 *   group        two ranks of flexcoll_comm_init_all driven by one thread: registration,
 *                windowed allreduces, reduce_scatters, allgathers and broadcasts (in place and
 *                not) and deregistration inside groups.
 *   err_register registration errors, every rank returning within half the timeout: heap memory
 *                on one rank only (processes and threads), unequal sizes, buf + bytes past the
 *                allocation on every rank (INVALID_ARGUMENT) and on one rank only; afterwards the
 *                communicator still works and a correct registration succeeds.
 *   err_call     ranks that disagree on a windowed allreduce (one rank at another offset, one
 *                rank's recvbuf only, one rank's buffers on the heap, one rank's sendbuf only on
 *                the heap, one rank in another window, in place at another offset; and one at
 *                4 MiB with the default threshold): every rank returns INVALID_USAGE or
 *                REMOTE_ERROR within half the timeout, nothing of the recvbuf written, inputs
 *                unchanged; free succeeds once the communicator is destroyed.
 *   err_coll     the same for reduce_scatter (sendbuf), allgather (recvbuf) and broadcast (every
 *                rank's sendbuf): one rank's shared buffer at another offset (with the unshared
 *                buffers in the window or on the heap; in place; at 4 MiB with the default
 *                threshold), on the heap, in another window; broadcast's odd rank out the root
 *                or not, and a non-root's sendbuf NULL.  Every rank must return INVALID_USAGE or
 *                REMOTE_ERROR within half the timeout with its inputs unchanged and nothing
 *                written (reduce_scatter, allgather); a broadcast's recvbuf may hold the root's
 *                data (a rank copies it once every rank posted), nothing else; a root whose own
 *                sendbuf is outside the windows may return SUCCESS with its data (the exchange's
 *                root waits for nobody).
 *   free_busy    flexcoll_host_free refused (INVALID_USAGE) while a window lies in the allocation
 *                (also while a second communicator still has one after the first deregistered),
 *                the memory still usable; an interior pointer refused; deregister, then free.
 *   destroy_busy a communicator destroyed with its windows still registered: free succeeds after.
 *   devshm       50 register / allreduce / deregister rounds: no /dev/shm/flexcoll* entry of
 *                these ranks exists after any registration returned, and no file this process
 *                maps is still linked there.  (Every other multi-rank case also compares
 *                /dev/shm before and after, and checks the ranks' mappings after each
 *                registration.)
 *
 * Multi-rank cases run the ranks through tests/harness.c (see harness.h) and create the
 * communicators they register on with flexcoll_comm_split, so that they can destroy them before
 * freeing.  FC_TEST_SEED reproduces a run's data (printed with every failure).
 */
#define _GNU_SOURCE
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include "dtype.h"
#include "harness.h"

#define OFF 128                  /* the calls' buffers start this far into their window */
#define GAP 64                   /* between sendbuf and recvbuf out of place */
#define SMALL_MAX_BYTES (65537u * 8u)
#define BIG_DATA (4u << 20)      /* the large calls: 4 MiB of data, plus 3 elements */
#define SAMPLE 2048              /* elements per sampled range of a large call */
#define ERR_TIMEOUT_MS 20000     /* FLEXCOLL_TIMEOUT_MS of the error cases */

static const size_t small_counts[] = {1, 7, 1001, 65537};
#define NSMALL (sizeof small_counts / sizeof small_counts[0])

static unsigned char poison_blk[1 << 16]; /* HX_POISON, filled in main */

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }
static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static size_t big_count(flexcoll_datatype_t dt) { return BIG_DATA / fc_dtype_size(dt) + 3; }

/* ---- /dev/shm and the mappings ---------------------------------------------------------------- */

typedef struct {
  char **name;
  int n;
} shm_list_t;

static void shm_list_free(shm_list_t *l) {
  hx_names_free(l->name, l->n);
  l->name = NULL;
  l->n = 0;
}

/* The entries of /dev/shm whose names start with "flexcoll". */
static shm_list_t shm_list(void) {
  shm_list_t l;
  l.name = hx_list_names("/dev/shm", "flexcoll", &l.n);
  return l;
}

static int shm_has(const shm_list_t *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->name[i], name)) return 1;
  return 0;
}

/* Whether name carries one of pids[0..n) as a whole field ("-<pid>-" or "-<pid>" at the end). */
static int name_has_pid(const char *name, const pid_t *pids, int n) {
  for (const char *p = name; (p = strchr(p, '-')); p++) {
    char *end;
    long v = strtol(p + 1, &end, 10);
    if (end == p + 1 || (*end != '-' && *end != '\0' && *end != '.' && *end != '_')) continue;
    for (int i = 0; i < n; i++)
      if (pids[i] > 0 && v == (long)pids[i]) return 1;
  }
  return 0;
}

/* Another process's entry: /flexcoll-<kind>-<pid>-... with a pid that is none of ours (a test
 * running alongside, whose communicator is being created). */
static int foreign(const char *name, const pid_t *ours, int nours) {
  const char *p = strchr(name, '-');
  if (!p || !(p = strchr(p + 1, '-'))) return 0;
  char *end;
  long v = strtol(p + 1, &end, 10);
  if (end == p + 1 || *end != '-' || v <= 0) return 0;
  if (v == (long)getpid()) return 0;
  for (int i = 0; i < nours; i++)
    if (v == (long)ours[i]) return 0;
  return 1;
}

/* The flexcoll entries of /dev/shm that are new since `before`, are not another process's, and
 * are still there after up to 3 s (another test's segment lives for milliseconds).  Each goes
 * to stderr; returns how many. */
static int shm_leftovers(const char *label, const shm_list_t *before, const pid_t *ours, int nours) {
  int left = 0;
  for (int attempt = 0; attempt < 30; attempt++) {
    shm_list_t now = shm_list();
    left = 0;
    for (int i = 0; i < now.n; i++)
      if (!shm_has(before, now.name[i]) && !foreign(now.name[i], ours, nours)) {
        left++;
        if (attempt == 29) fprintf(stderr, "[%s] FAIL: /dev/shm/%s left behind\n", label, now.name[i]);
      }
    shm_list_free(&now);
    if (!left) return 0;
    usleep(100 * 1000);
  }
  return left;
}

/* Every /dev/shm file that this process maps must be unlinked already ("(deleted)" in the maps):
 * a registration links its file only while it runs. */
static void check_maps_unlinked(hx_rank_t *r, const char *when) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "/dev/shm/flexcoll");
    if (p && !strstr(p, "(deleted)")) hx_fail(r, "%s: %.*s is mapped and still linked", when, (int)strcspn(p, "\n"), p);
  }
  fclose(f);
}

/* The pids of a run's ranks, in shared memory that the forked ranks inherit (procs: one per rank;
 * threads: the one process at index 0). */
#define MAX_PIDS 16
static pid_t *shared_pids(void) {
  void *m = mmap(NULL, MAX_PIDS * sizeof(pid_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  memset(m, 0, MAX_PIDS * sizeof(pid_t));
  return m;
}

/* A run of ranks wrapped in the /dev/shm comparison. */
typedef struct {
  pid_t *pids;     /* shared_pids() */
  const void *arg; /* the case's own */
  hx_rank_fn fn;   /* the case's rank function */
} run_arg_t;

static const void *case_arg(hx_rank_t *r) { return ((const run_arg_t *)r->arg)->arg; }

static void note_pid(hx_rank_t *r) {
  pid_t *pids = ((run_arg_t *)r->arg)->pids;
  if (pids && r->rank < MAX_PIDS) pids[r->thread_mode ? 0 : r->rank] = getpid();
}

static void heap_release(void);

/* Every rank: the case's function, then its heap buffers go. */
static int rank_main(hx_rank_t *r) {
  int rc = ((run_arg_t *)r->arg)->fn(r);
  heap_release();
  return rc;
}

static int run_ranks(int threads, int nranks, const hx_opts_t *o, hx_rank_fn fn, const void *arg) {
  run_arg_t ra = {shared_pids(), arg, fn};
  shm_list_t before = shm_list();
  int ok = threads ? hx_run_threads(nranks, o, rank_main, &ra) : hx_run_procs(nranks, o, rank_main, &ra);
  if (shm_leftovers(o->label, &before, ra.pids ? ra.pids : (pid_t[]){0}, ra.pids ? MAX_PIDS : 1)) ok = 0;
  shm_list_free(&before);
  if (ra.pids) munmap(ra.pids, MAX_PIDS * sizeof(pid_t));
  return ok;
}

/* ---- poison outside the buffers --------------------------------------------------------------- */

/* Bytes of [p, p + n) that are not poison; *first: the first one's index. */
static size_t not_poison(const unsigned char *p, size_t n, size_t *first) {
  size_t bad = 0;
  for (size_t off = 0; off < n;) {
    size_t k = n - off < sizeof poison_blk ? n - off : sizeof poison_blk;
    if (memcmp(p + off, poison_blk, k) != 0)
      for (size_t i = 0; i < k; i++)
        if (p[off + i] != HX_POISON) {
          if (!bad) *first = off + i;
          bad++;
        }
    off += k;
  }
  return bad;
}

/* Every byte of [base, base + len) outside [a, a + alen) and [b, b + blen) must be poison. */
static size_t check_outside(hx_rank_t *r, const char *what, const unsigned char *base, size_t len,
                            const unsigned char *a, size_t alen, const unsigned char *b, size_t blen) {
  if (!b || (a && b < a)) {
    const unsigned char *t = a;
    size_t tl = alen;
    a = b, alen = blen, b = t, blen = tl;
  }
  /* Now a (may be NULL) <= b. */
  struct { size_t from, to; } gaps[3];
  int ng = 0;
  size_t at = 0;
  const unsigned char *iv[2] = {a, b};
  const size_t il[2] = {alen, blen};
  for (int k = 0; k < 2; k++) {
    if (!iv[k]) continue;
    size_t s = (size_t)(iv[k] - base), e = s + il[k];
    if (s > at) gaps[ng].from = at, gaps[ng].to = s, ng++;
    if (e > at) at = e;
  }
  if (at < len) gaps[ng].from = at, gaps[ng].to = len, ng++;
  size_t total = 0;
  for (int g = 0; g < ng; g++) {
    size_t first = 0, bad = not_poison(base + gaps[g].from, gaps[g].to - gaps[g].from, &first);
    if (bad)
      hx_fail(r, "%s: %zu byte(s) written outside the call's buffers, in bytes [%zu, %zu) of the allocation (first at "
              "byte %zu: 0x%02x)", what, bad, gaps[g].from, gaps[g].to, gaps[g].from + first,
              base[gaps[g].from + first]);
    total += bad;
  }
  return total;
}

/* An allreduce of ordinary (heap) memory that checks the ranks are in step and comm works. */
static int in_step(hx_rank_t *r, flexcoll_comm_t comm, const char *after) {
  int32_t in[3] = {r->rank, 1, -r->rank}, out[3] = {-1, -1, -1};
  snprintf(r->what, sizeof r->what, "allreduce int32 sum count 3 (heap) after %s", after);
  if (!hx_ok(r, flexcoll_allreduce(in, out, 3, FLEXCOLL_INT32, FLEXCOLL_SUM, comm, NULL), comm, "flexcoll_allreduce"))
    return -1;
  const int n = r->nranks;
  if (out[0] != n * (n - 1) / 2 || out[1] != n || out[2] != -n * (n - 1) / 2)
    return hx_fail(r, "result %d %d %d, expected %d %d %d", out[0], out[1], out[2], n * (n - 1) / 2, n, -n * (n - 1) / 2);
  return 0;
}

/* ---- host windows ----------------------------------------------------------------------------- */

typedef struct {
  unsigned char *base; /* flexcoll_host_alloc's */
  size_t alloc;        /* its size (a multiple of the page size) */
  unsigned char *win;  /* the registered range */
  size_t win_bytes;
  flexcoll_window_t w;
} hwin_t;

/* Allocate lead + need + tail bytes (page-rounded), poison them all, and register [base + lead,
 * end - tail) on comm.  Returns 0, or -1 after reporting. */
static int hwin_open(hx_rank_t *r, flexcoll_comm_t comm, hwin_t *h, size_t lead, size_t need, size_t tail) {
  memset(h, 0, sizeof *h);
  h->alloc = round_up(lead + need + tail, page_size());
  void *p = NULL;
  snprintf(r->what, sizeof r->what, "flexcoll_host_alloc(%zu)", h->alloc);
  if (!hx_ok(r, flexcoll_host_alloc(h->alloc, &p), NULL, "flexcoll_host_alloc")) return -1;
  if (!p) return hx_fail(r, "flexcoll_host_alloc succeeded with a NULL pointer"), -1;
  h->base = p;
  memset(h->base, HX_POISON, h->alloc);
  h->win = h->base + lead;
  h->win_bytes = h->alloc - lead - tail;
  snprintf(r->what, sizeof r->what, "flexcoll_window_register(base + %zu, %zu bytes)", lead, h->win_bytes);
  if (!hx_ok(r, flexcoll_window_register(comm, h->win, h->win_bytes, &h->w), comm, "flexcoll_window_register"))
    return -1;
  if (!h->w) return hx_fail(r, "flexcoll_window_register succeeded without setting the window"), -1;
  /* Once every rank has returned (a collective later), no file that this rank maps may still have
   * a name: each rank's file is named only while its own registration runs. */
  if (in_step(r, comm, "flexcoll_window_register")) return -1;
  snprintf(r->what, sizeof r->what, "flexcoll_window_register(base + %zu, %zu bytes)", lead, h->win_bytes);
  check_maps_unlinked(r, "after flexcoll_window_register returned on every rank");
  return 0;
}

static int hwin_deregister(hx_rank_t *r, flexcoll_comm_t comm, hwin_t *h) {
  if (!h->w) return 0;
  snprintf(r->what, sizeof r->what, "flexcoll_window_deregister");
  flexcoll_result_t res = flexcoll_window_deregister(comm, h->w);
  h->w = NULL;
  return hx_ok(r, res, comm, "flexcoll_window_deregister") ? 0 : -1;
}

static int hwin_free(hx_rank_t *r, hwin_t *h) {
  if (!h->base) return 0;
  snprintf(r->what, sizeof r->what, "flexcoll_host_free");
  flexcoll_result_t res = flexcoll_host_free(h->base);
  h->base = NULL;
  return hx_ok(r, res, NULL, "flexcoll_host_free") ? 0 : -1;
}

static int hwin_close(hx_rank_t *r, flexcoll_comm_t comm, hwin_t *h) {
  int rc = hwin_deregister(r, comm, h);
  if (hwin_free(r, h)) rc = -1;
  return rc;
}

/* A communicator of the same ranks that this rank may destroy itself (the harness destroys r->comm). */
static flexcoll_comm_t split_comm(hx_rank_t *r) {
  flexcoll_comm_t c = NULL;
  snprintf(r->what, sizeof r->what, "flexcoll_comm_split(color 0, key rank)");
  if (!hx_ok(r, flexcoll_comm_split(r->comm, 0, r->rank, &c, NULL), r->comm, "flexcoll_comm_split")) return NULL;
  if (!c) hx_fail(r, "flexcoll_comm_split succeeded without a communicator");
  return c;
}

static int destroy_comm(hx_rank_t *r, flexcoll_comm_t c) {
  snprintf(r->what, sizeof r->what, "flexcoll_comm_destroy (the split communicator)");
  return hx_ok(r, flexcoll_comm_destroy(c), NULL, "flexcoll_comm_destroy") ? 0 : -1;
}

/* ---- one checked windowed collective ---------------------------------------------------------- */

/* The collectives of the window mode.  The ranks must agree on where some of their buffers lie
 * ("shared": allreduce both, reduce_scatter sendbuf, allgather recvbuf, broadcast every rank's
 * sendbuf, though the peers read only the root's); the other one ("unshared") may lie anywhere, at
 * any offset on each rank. */
enum { C_AR, C_RS, C_AG, C_BC, C_NCOLLS };
static const char *const coll_names[C_NCOLLS] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};
static const char *const coll_fns[C_NCOLLS] = {"flexcoll_allreduce", "flexcoll_reduce_scatter", "flexcoll_allgather",
                                               "flexcoll_broadcast"};
static int coll_reduces(int c) { return c == C_AR || c == C_RS; }
/* Elements of sendbuf and recvbuf for a call of `count` (the API's count) on n ranks. */
static size_t send_elems(int c, size_t count, int n) { return c == C_RS ? (size_t)n * count : count; }
static size_t recv_elems(int c, size_t count, int n) { return c == C_AG ? (size_t)n * count : count; }

static flexcoll_result_t coll_issue(int c, const void *send, void *recv, size_t count, flexcoll_datatype_t dt,
                                    flexcoll_op_t op, int root, flexcoll_comm_t comm) {
  switch (c) {
    case C_RS: return flexcoll_reduce_scatter(send, recv, count, dt, op, comm, NULL);
    case C_AG: return flexcoll_allgather(send, recv, count, dt, comm, NULL);
    case C_BC: return flexcoll_broadcast(send, recv, count, dt, root, comm, NULL);
    default: return flexcoll_allreduce(send, recv, count, dt, op, comm, NULL);
  }
}

/* Where the samples of a large result start (both ends and around every 1/n boundary, SAMPLE
 * elements each); returns how many. */
static int sample_starts(size_t count, int n, size_t *starts, int max) {
  int k = 0;
  starts[k++] = 0;
  starts[k++] = count > SAMPLE ? count - SAMPLE : 0;
  for (int q = 1; q < n && k < max; q++) {
    size_t b = count * (size_t)q / (size_t)n;
    starts[k++] = b > SAMPLE / 2 ? b - SAMPLE / 2 : 0;
  }
  return k;
}

/* The reference of a reduction on samples of a large result (elements first.. of the inputs). */
static void check_sampled(hx_rank_t *r, const hx_data_t *d, flexcoll_op_t op, const unsigned char *buf, size_t first,
                          size_t count) {
  const size_t es = fc_dtype_size(d->dtype);
  size_t starts[2 + MAX_PIDS];
  const int k = sample_starts(count, d->nranks, starts, (int)(sizeof starts / sizeof starts[0]));
  for (int i = 0; i < k; i++) {
    size_t len = count - starts[i] < SAMPLE ? count - starts[i] : SAMPLE;
    char w[64];
    snprintf(w, sizeof w, "recvbuf (elements %zu..%zu)", starts[i], starts[i] + len - 1);
    hx_check_reduced(r, w, d, op, buf + starts[i] * es, first + starts[i], len);
  }
}

/* The same for a copy of src_rank's input (allgather's blocks, broadcast). */
static void check_sampled_input(hx_rank_t *r, const char *where, const hx_data_t *d, int src_rank,
                                const unsigned char *buf, size_t count) {
  const size_t es = fc_dtype_size(d->dtype);
  size_t starts[2 + MAX_PIDS];
  const int k = sample_starts(count, d->nranks, starts, (int)(sizeof starts / sizeof starts[0]));
  for (int i = 0; i < k; i++) {
    size_t len = count - starts[i] < SAMPLE ? count - starts[i] : SAMPLE;
    char w[96];
    snprintf(w, sizeof w, "%s (elements %zu..%zu)", where, starts[i], starts[i] + len - 1);
    hx_check_input(r, w, d, src_rank, buf + starts[i] * es, starts[i], len);
  }
}

typedef struct {
  int coll;                  /* C_AR (the default), C_RS, C_AG, C_BC */
  flexcoll_datatype_t dt;
  flexcoll_op_t op;          /* allreduce, reduce_scatter */
  size_t count;              /* the API's count (reduce_scatter: recvcount; allgather: sendcount) */
  int inplace;
  int root;                  /* broadcast */
  size_t send_off, recv_off; /* from the window's start; in place, the buffer inside the other is unused */
  size_t skew;               /* the unshared buffer, in the window: rank * skew bytes further on each rank */
  int unshared_heap;         /* the unshared buffer on the heap: 1 on every rank, 2 on even ranks only */
  int sampled;               /* reference on samples only (large calls) */
  int compare;               /* also run the call on heap buffers and compare bitwise */
} wcall_t;

/* The heap buffers of the normal-path calls, kept from call to call (per rank: per thread), grown
 * as needed: fresh 4 MiB buffers per call would cost more page faults than the calls. */
static __thread hx_buf_t heap_send, heap_recv;

static int heap_reserve(hx_rank_t *r, size_t bytes) {
  if (heap_send.base && heap_send.bytes >= bytes) return 0;
  hx_buf_free(&heap_send);
  hx_buf_free(&heap_recv);
  if (!hx_buf_new(r, &heap_send, bytes) || !hx_buf_new(r, &heap_recv, bytes)) return -1;
  return 0;
}

static void heap_release(void) {
  hx_buf_free(&heap_send);
  hx_buf_free(&heap_recv);
}

/* Bytes [from, to) of a and b must be equal (an input against its copy). */
static void same_bytes(hx_rank_t *r, const char *what, const unsigned char *a, const unsigned char *b, size_t from,
                       size_t to, size_t es) {
  if (to <= from || memcmp(a + from, b + from, to - from) == 0) return;
  size_t i = from;
  while (a[i] == b[i]) i++;
  hx_fail(r, "%s changed: byte %zu (element %zu) is 0x%02x, was 0x%02x", what, i, i / es, a[i], b[i]);
}

/* One collective in window h of comm, the inputs of call `call`; h's allocation is all poison
 * outside the call's buffers before and after.  Returns 0, or -1 when the library returned an
 * error (the ranks may be out of step: stop). */
static int win_call(hx_rank_t *r, flexcoll_comm_t comm, hwin_t *h, const wcall_t *c, uint64_t call) {
  const int n = r->nranks, me = r->rank, co = c->coll, root = co == C_BC ? c->root : -1;
  const size_t es = fc_dtype_size(c->dt), cnt = c->count;
  const size_t sbytes = send_elems(co, cnt, n) * es, rbytes = recv_elems(co, cnt, n) * es;
  const int heap_here = !c->inplace && co != C_AR &&
                        (c->unshared_heap == 1 || (c->unshared_heap == 2 && me % 2 == 0));
  hx_buf_t uh = {0}; /* the unshared buffer on the heap */
  unsigned char *send = NULL, *recv = NULL;
  /* The window's regions that the call's buffers take (in place: one). */
  unsigned char *wa = NULL, *wb = NULL;
  size_t wal = 0, wbl = 0;
  switch (co) {
    case C_AR:
      send = h->win + c->send_off;
      recv = c->inplace ? send : h->win + c->recv_off;
      wa = send, wal = sbytes;
      if (!c->inplace) wb = recv, wbl = rbytes;
      break;
    case C_RS:
      send = h->win + c->send_off;
      wa = send, wal = sbytes;
      if (c->inplace) recv = send + (size_t)me * cnt * es;
      else if (heap_here) recv = hx_buf_new(r, &uh, rbytes);
      else recv = wb = h->win + c->recv_off + (size_t)me * c->skew, wbl = rbytes;
      if (!recv) return -1;
      break;
    case C_AG:
      recv = h->win + c->recv_off;
      wa = recv, wal = rbytes;
      if (c->inplace) send = recv + (size_t)me * cnt * es;
      else if (heap_here) send = hx_buf_new(r, &uh, sbytes);
      else send = wb = h->win + c->send_off + (size_t)me * c->skew, wbl = sbytes;
      if (!send) return -1;
      break;
    default: /* broadcast: every rank's sendbuf (the root's or not) in the window */
      send = h->win + c->send_off;
      wa = send, wal = sbytes;
      if (c->inplace) recv = send;
      else if (heap_here) recv = hx_buf_new(r, &uh, rbytes);
      else recv = wb = h->win + c->recv_off + (size_t)me * c->skew, wbl = rbytes;
      if (!recv) return -1;
      break;
  }
  hx_data_t d = {c->dt, coll_reduces(co) ? hx_gen_for_op(c->op) : HX_GEN_BITS, r->seed, call, n};
  char desc[240];
  int l = snprintf(desc, sizeof desc, "windowed %s %s", coll_names[co], fc_dtype_name(c->dt));
  if (coll_reduces(co)) l += snprintf(desc + l, sizeof desc - (size_t)l, " %s", fc_op_name(c->op));
  if (co == C_BC) l += snprintf(desc + l, sizeof desc - (size_t)l, " root %d", root);
  l += snprintf(desc + l, sizeof desc - (size_t)l, " count %zu %s", cnt, c->inplace ? "in place" : "out of place");
  /* The shared buffer(s) first, then the unshared one. */
  if (co != C_AG) l += snprintf(desc + l, sizeof desc - (size_t)l, ", sendbuf at window + %zu", c->send_off);
  else l += snprintf(desc + l, sizeof desc - (size_t)l, ", recvbuf at window + %zu", c->recv_off);
  if (!c->inplace) {
    const char *un = co != C_AG ? "recvbuf" : "sendbuf";
    const size_t uoff = co != C_AG ? c->recv_off : c->send_off;
    if (co == C_AR) l += snprintf(desc + l, sizeof desc - (size_t)l, ", recvbuf at + %zu", uoff);
    else if (c->unshared_heap == 1) l += snprintf(desc + l, sizeof desc - (size_t)l, ", %s on the heap", un);
    else if (c->unshared_heap == 2)
      l += snprintf(desc + l, sizeof desc - (size_t)l, ", %s on the heap on even ranks, at + %zu + rank x %zu on odd",
                    un, uoff, c->skew);
    else l += snprintf(desc + l, sizeof desc - (size_t)l, ", %s at + %zu + rank x %zu", un, uoff, c->skew);
  }
  snprintf(desc + l, sizeof desc - (size_t)l, " (call %" PRIu64 ")", call);
  snprintf(r->what, sizeof r->what, "%s", desc);
  /* Inputs: each rank's own (a broadcast's non-roots too: must stay, or be overwritten in place). */
  hx_fill(&d, me, send, 0, send_elems(co, cnt, n));
  unsigned char *nsend = NULL, *nrecv = NULL;
  if (c->compare) {
    if (heap_reserve(r, sbytes > rbytes ? sbytes : rbytes)) {
      hx_buf_free(&uh);
      return -1;
    }
    unsigned char *hs = hx_buf_ptr(&heap_send), *hr = hx_buf_ptr(&heap_recv);
    /* The result's bytes and the 64 after them (an earlier, larger call wrote there). */
    hx_buf_poison(&heap_recv, 0, heap_recv.bytes - rbytes < 64 ? heap_recv.bytes : rbytes + 64);
    switch (co) {
      case C_AR: nsend = hs, nrecv = c->inplace ? hs : hr; break;
      case C_RS: nsend = hs, nrecv = c->inplace ? hs + (size_t)me * cnt * es : hr; break;
      case C_AG: nrecv = hr, nsend = c->inplace ? hr + (size_t)me * cnt * es : hs; break;
      default: nsend = hs, nrecv = c->inplace ? hs : hr; break;
    }
    memcpy(nsend, send, sbytes); /* the input, bit for bit */
  }
  flexcoll_result_t res = coll_issue(co, send, recv, cnt, c->dt, c->op, root, comm);
  if (!hx_ok(r, res, comm, coll_fns[co])) {
    hx_buf_free(&uh);
    return -1;
  }
  /* The result against the reference. */
  switch (co) {
    case C_AR:
    case C_RS: {
      const size_t first = co == C_RS ? (size_t)me * cnt : 0;
      if (c->sampled) check_sampled(r, &d, c->op, recv, first, cnt);
      else hx_check_reduced(r, "recvbuf", &d, c->op, recv, first, cnt);
      break;
    }
    case C_AG:
      if (!c->sampled) hx_check_gathered(r, "recvbuf", &d, recv, cnt);
      else
        for (int q = 0; q < n; q++) {
          char w[48];
          snprintf(w, sizeof w, "recvbuf block %d", q);
          check_sampled_input(r, w, &d, q, recv + (size_t)q * cnt * es, cnt);
        }
      break;
    default:
      if (c->sampled) check_sampled_input(r, "recvbuf", &d, root, recv, cnt);
      else hx_check_input(r, "recvbuf", &d, root, recv, 0, cnt);
      break;
  }
  /* The inputs must not change (in place: the parts of the buffer that are no output). */
  if (!c->inplace) {
    if (!c->compare) hx_check_input(r, "sendbuf (must not change)", &d, me, send, 0, send_elems(co, cnt, n));
    else same_bytes(r, "sendbuf", send, nsend, 0, sbytes, es);
  } else if (c->inplace && co == C_RS) {
    const size_t a = (size_t)me * cnt * es, b = a + cnt * es;
    if (!c->compare) {
      hx_check_input(r, "sendbuf before this rank's block (must not change)", &d, me, send, 0, (size_t)me * cnt);
      hx_check_input(r, "sendbuf after this rank's block (must not change)", &d, me, send + b, (size_t)(me + 1) * cnt,
                     (size_t)(n - me - 1) * cnt);
    } else {
      same_bytes(r, "sendbuf before this rank's block", send, nsend, 0, a, es);
      same_bytes(r, "sendbuf after this rank's block", send, nsend, b, sbytes, es);
    }
  }
  check_outside(r, "window allocation", h->base, h->alloc, wa, wal, wb, wbl);
  if (uh.base) hx_buf_check_guards(r, co != C_AG ? "recvbuf on the heap" : "sendbuf on the heap", &uh);
  if (c->compare) {
    snprintf(r->what, sizeof r->what, "the same %s on heap buffers (normal host path) after %.180s", coll_names[co],
             desc);
    res = coll_issue(co, nsend, nrecv, cnt, c->dt, c->op, root, comm);
    if (!hx_ok(r, res, comm, coll_fns[co])) {
      hx_buf_free(&uh);
      return -1;
    }
    snprintf(r->what, sizeof r->what, "%s", desc);
    if (memcmp(nrecv, recv, rbytes) != 0) {
      size_t i = 0, diff = 0;
      while (i < rbytes && nrecv[i] == recv[i]) i++;
      for (size_t e = 0; e < rbytes / es; e++) diff += memcmp(nrecv + e * es, recv + e * es, es) != 0;
      uint64_t a = 0, b = 0;
      memcpy(&a, recv + i / es * es, es);
      memcpy(&b, nrecv + i / es * es, es);
      hx_fail(r, "the window path's result differs bitwise from the normal host path's in %zu of %zu elements; first "
              "element %zu: 0x%0*" PRIx64 " (window) vs 0x%0*" PRIx64 " (normal)", diff, rbytes / es, i / es,
              (int)es * 2, a, (int)es * 2, b);
    }
    if (nrecv == hx_buf_ptr(&heap_recv)) {
      size_t tail = heap_recv.bytes - rbytes < 64 ? heap_recv.bytes - rbytes : 64;
      hx_check_poisoned(r, "the 64 bytes after the normal path's recvbuf", nrecv + rbytes, tail);
    }
    hx_buf_check_guards(r, "normal-path recvbuf", &heap_recv);
    hx_buf_check_guards(r, "normal-path sendbuf", &heap_send);
  }
  hx_buf_free(&uh);
  if (wa) memset(wa, HX_POISON, wal);
  if (wb) memset(wb, HX_POISON, wbl);
  return 0;
}

/* ---- the matrix ------------------------------------------------------------------------------- */

typedef struct {
  int big_all; /* the 4 MiB calls for every datatype (x op); else a subset */
} mx_t;

/* The 4 MiB allreduces of the other runs: int8, float16, float32 and uint64 x sum, avg and max. */
static int big_subset(int dt, int op) {
  return (dt == FLEXCOLL_INT8 || dt == FLEXCOLL_FLOAT16 || dt == FLEXCOLL_FLOAT32 || dt == FLEXCOLL_UINT64) &&
         (op == FLEXCOLL_SUM || op == FLEXCOLL_AVG || op == FLEXCOLL_MAX);
}

static int big_dtype(int dt) {
  return dt == FLEXCOLL_INT8 || dt == FLEXCOLL_FLOAT16 || dt == FLEXCOLL_FLOAT32 || dt == FLEXCOLL_UINT64;
}

/* Placements of a call: in place, out of place with both buffers in the window (the unshared one
 * at another offset on each rank at counts 7 and 65537), out of place with the unshared buffer on
 * the heap (every rank's; at counts 7 and 65537 the even ranks' only, the odd ones' in the window). */
enum { P_INPLACE, P_WINDOW, P_HEAP, P_N };
#define SKEW 40 /* bytes per rank */

/* Which calls of 4 MiB (+ a few elements; reduce_scatter and allgather: their n-block buffer) a
 * run makes.  Where big_all: every datatype x op of allreduce (in place or out of place by turns),
 * every datatype of reduce_scatter (one op each, all ops in turn; float32 sum too), allgather and
 * broadcast (root n - 1 and 0 by turns), each in two of the three placements by turns.  Else
 * allreduce int8, float16, float32, uint64 x sum, avg, max both ways; reduce_scatter int8 sum,
 * float16 avg, float32 sum, uint64 max, bfloat16 prod; allgather and broadcast int8, float16,
 * float32, uint64 (broadcast: root n - 1 and 0 by turns); float32 in every placement (and
 * broadcast with both roots), the others in two by turns. */
static int want_big(const mx_t *m, int co, int dt, int op, int ri, int pl) {
  const int two = pl != (dt + op + ri) % P_N; /* two of the three placements, by turns */
  switch (co) {
    case C_AR: return m->big_all ? pl == (dt + op) % 2 : big_subset(dt, op);
    case C_RS:
      if (m->big_all) return (op == dt % FLEXCOLL_NUM_OPS || (dt == FLEXCOLL_FLOAT32 && op == FLEXCOLL_SUM)) && two;
      if (dt == FLEXCOLL_FLOAT32) return op == FLEXCOLL_SUM;
      return two && ((dt == FLEXCOLL_INT8 && op == FLEXCOLL_SUM) || (dt == FLEXCOLL_FLOAT16 && op == FLEXCOLL_AVG) ||
                     (dt == FLEXCOLL_UINT64 && op == FLEXCOLL_MAX) || (dt == FLEXCOLL_BFLOAT16 && op == FLEXCOLL_PROD));
    case C_AG: return m->big_all ? two : big_dtype(dt) && (dt == FLEXCOLL_FLOAT32 || two);
    default:
      if (dt == FLEXCOLL_FLOAT32 && !m->big_all) return 1;
      return (m->big_all || big_dtype(dt)) && ri == dt % 2 && two;
  }
}

/* At count 65537, reduce_scatter's heap placement for one op per datatype (all ops in turn): where
 * the output lies does not depend on the op. */
static int want_small(int co, int dt, int op, size_t k, int pl) {
  return !(co == C_RS && k == NSMALL - 1 && pl == P_HEAP && op != dt % FLEXCOLL_NUM_OPS);
}

static int matrix_rank(hx_rank_t *r) {
  const mx_t *m = case_arg(r);
  const int n = r->nranks;
  note_pid(r);
  double t0 = hx_now();
  flexcoll_comm_t comm = split_comm(r);
  if (!comm) return 1;
  /* Window A: the whole allocation; window B: from page 1, the last page left out.  Room for the
   * largest buffers of every collective (reduce_scatter's sendbuf, allgather's recvbuf: n counts)
   * and the unshared buffer's skew. */
  const size_t pg = page_size();
  hwin_t a, b;
  memset(&b, 0, sizeof b);
  if (hwin_open(r, comm, &a, 0, OFF + (size_t)(n + 1) * SMALL_MAX_BYTES + GAP + 64 * (size_t)n + 256, 0) ||
      hwin_open(r, comm, &b, pg, OFF + 2 * (BIG_DATA + 3 * 8 * (size_t)n) + GAP + 64 * (size_t)n + 256, pg))
    return 1;
  uint64_t call = 0, calls[C_NCOLLS] = {0};
  double t_size[C_NCOLLS][NSMALL + 1];
  memset(t_size, 0, sizeof t_size);
  for (int co = 0; co < C_NCOLLS; co++)
    for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt++)
      for (int op = 0; op < (coll_reduces(co) ? FLEXCOLL_NUM_OPS : 1); op++)
        for (size_t k = 0; k <= NSMALL; k++)
          for (int ri = 0; ri < (co == C_BC ? 2 : 1); ri++)
            for (int pl = 0; pl < (co == C_AR ? 2 : P_N); pl++) {
              const double tc = hx_now();
              const int big = k == NSMALL;
              if (big ? !want_big(m, co, dt, op, ri, pl) : !want_small(co, dt, op, k, pl)) continue;
              const size_t es = fc_dtype_size((flexcoll_datatype_t)dt);
              /* Large calls: the reference on samples (every element compared with the normal path),
               * float32 sum (and float32 data movement) at every element. */
              wcall_t c = {.coll = co, .dt = (flexcoll_datatype_t)dt, .op = (flexcoll_op_t)op,
                           .inplace = pl == P_INPLACE, .root = ri == 0 ? n - 1 : 0,
                           .sampled = big && dt != FLEXCOLL_FLOAT32, .compare = 1};
              if (big && dt == FLEXCOLL_FLOAT32 && coll_reduces(co) && op != FLEXCOLL_SUM) c.sampled = 1;
              if (!big) c.count = small_counts[k];
              else if (co == C_RS || co == C_AG) c.count = BIG_DATA / es / (size_t)n + 3;
              else c.count = big_count(c.dt);
              if (pl == P_WINDOW && co != C_AR) c.skew = k & 1 ? SKEW : 0;
              if (pl == P_HEAP) c.unshared_heap = !big && (k & 1) ? 2 : 1;
              /* The shared buffer at OFF, the other one after it. */
              const size_t sb = send_elems(co, c.count, n) * es, rb = recv_elems(co, c.count, n) * es;
              if (co != C_AG) c.send_off = OFF, c.recv_off = OFF + sb + GAP;
              else c.recv_off = OFF, c.send_off = OFF + rb + GAP;
              if (win_call(r, comm, big ? &b : &a, &c, call++)) return 1;
              calls[co]++;
              t_size[co][k] += hx_now() - tc;
            }
  r->what[0] = '\0';
  if (r->rank == 0)
    for (int co = 0; co < C_NCOLLS; co++)
      fprintf(stderr, "[%s] rank 0: %" PRIu64 " windowed %ss (and as many on the heap): counts 1, 7, 1001, 65537, "
              "4 MiB: %.2f %.2f %.2f %.2f %.2f s\n", r->label, calls[co], coll_names[co], t_size[co][0], t_size[co][1],
              t_size[co][2], t_size[co][3], t_size[co][4]);
  if (r->rank == 0)
    fprintf(stderr, "[%s] rank 0: %" PRIu64 " windowed calls in %.2f s\n", r->label, call, hx_now() - t0);
  if (hwin_close(r, comm, &a) || hwin_close(r, comm, &b)) return 1;
  if (destroy_comm(r, comm)) return 1;
  check_maps_unlinked(r, "at the end");
  return r->errors != 0;
}

static const char *const env_win0[] = {"FLEXCOLL_SHM_WINDOW_MIN_BYTES=0", NULL};

/* One case of a TCase looped over processes (_i 0) and threads (_i 1): the label names the case,
 * the mode and the rank count; with_timeout: the short ERR_TIMEOUT_MS of the error cases. */
static void run_case(const char *what, int threads, int nranks, int deadline_s, int with_timeout, hx_rank_fn fn,
                     const void *arg) {
  char label[160];
  snprintf(label, sizeof label, "window %s (%s n=%d)", what, threads ? "threads" : "procs", nranks);
  hx_opts_t o = {.label = label, .deadline_s = deadline_s, .timeout_ms = with_timeout ? ERR_TIMEOUT_MS : 0,
                 .env = env_win0};
  ck_assert_msg(run_ranks(threads, nranks, &o, fn, arg), "%s: see stderr", label);
}
static const char *const env_default[] = {"FLEXCOLL_SHM_WINDOW_MIN_BYTES", NULL}; /* unset */
/* Helper threads (3 per rank: parts cut unevenly) and non-temporal stores at every size, whatever
 * the cores: the window mode's parts of parts, and unaligned outputs written with them. */
static const char *const env_helpers[] = {"FLEXCOLL_SHM_WINDOW_MIN_BYTES=0", "FLEXCOLL_SHM_THREADS=3",
                                          "FLEXCOLL_SHM_THREADS_MIN_BYTES=0", "FLEXCOLL_SHM_NT_MIN_BYTES=0", NULL};

/* The runs of the matrix: ranks, threads or processes, environment, 4 MiB calls for every type and op. */
typedef struct {
  int nranks, threads;
  const char *what;
  const char *const *env;
  int big_all;
} mx_run_t;

static const mx_run_t procs_runs[] = {
    {2, 0, "min 0", env_win0, 0},           {3, 0, "min 0", env_win0, 1},
    {4, 0, "min 0", env_win0, 0},           {3, 0, "default threshold", env_default, 0},
    {3, 0, "min 0, 3 helper threads, nt stores", env_helpers, 0},
};
static const mx_run_t threads_runs[] = {
    {2, 1, "min 0", env_win0, 1},
    {3, 1, "min 0", env_win0, 0},
    {2, 1, "default threshold", env_default, 0},
    {2, 1, "min 0, 3 helper threads, nt stores", env_helpers, 0},
};

static int run_matrix(const mx_run_t *run) {
  char label[96];
  snprintf(label, sizeof label, "window %s n=%d %s", run->threads ? "threads" : "procs", run->nranks, run->what);
  hx_opts_t o = {.label = label, .deadline_s = 240, .env = run->env};
  const mx_t m = {.big_all = run->big_all};
  return run_ranks(run->threads, run->nranks, &o, matrix_rank, &m);
}

START_TEST(test_procs) {
  ck_assert_msg(run_matrix(&procs_runs[_i]), "procs n=%d %s: see stderr", procs_runs[_i].nranks, procs_runs[_i].what);
}
END_TEST

START_TEST(test_threads) {
  ck_assert_msg(run_matrix(&threads_runs[_i]), "threads n=%d %s: see stderr", threads_runs[_i].nranks,
                threads_runs[_i].what);
}
END_TEST

/* ---- many calls back to back ------------------------------------------------------------------ */

/* Call i of the sequence: the same on every rank (from r->seed). */
static wcall_t many_call(hx_rank_t *r, int i, size_t win_bytes) {
  uint64_t h = hx_mix64(r->seed ^ hx_mix64((uint64_t)i + 0x1234));
  wcall_t c;
  memset(&c, 0, sizeof c);
  c.coll = (int)((h >> 44) % C_NCOLLS);
  c.dt = (flexcoll_datatype_t)(h % FLEXCOLL_NUM_DATATYPES);
  c.op = (flexcoll_op_t)((h >> 8) % FLEXCOLL_NUM_OPS);
  c.inplace = (h >> 16) & 1;
  c.root = (int)(hx_mix64(h + 3) % (uint64_t)r->nranks);
  const size_t es = fc_dtype_size(c.dt);
  /* Sizes spread over 1 element .. 256 KiB (reduce_scatter's sendbuf, allgather's recvbuf: n
   * times that), a tenth of them up to 16 elements. */
  size_t bytes_max = ((h >> 20) % 10 == 0) ? 16 * es : (size_t)1 << (2 + (h >> 24) % 17);
  c.count = 1 + (size_t)(hx_mix64(h) % (bytes_max / es > 0 ? bytes_max / es : 1));
  /* The shared buffer (allreduce: sendbuf; in place: the one buffer) at a random offset, the
   * other one before or after it, not overlapping. */
  const size_t sb = send_elems(c.coll, c.count, r->nranks) * es, rb = recv_elems(c.coll, c.count, r->nranks) * es;
  const int send_first = c.coll != C_AG;
  const size_t fb = send_first ? sb : rb, ob = send_first ? rb : sb;
  size_t room = win_bytes - (c.inplace ? fb : fb + ob) - 64;
  size_t f = (size_t)(hx_mix64(h + 1) % (room / 8)) * 8, o = 0;
  if (!c.inplace) {
    size_t after = f + fb;
    size_t space = win_bytes - after - ob;
    if ((h >> 40) & 1 && f >= ob) o = (size_t)(hx_mix64(h + 2) % ((f - ob) / 8 + 1)) * 8;
    else o = after + (size_t)(hx_mix64(h + 2) % (space / 8 + 1)) * 8;
    if (o + ob > win_bytes) o = after; /* (cannot happen; kept safe) */
  }
  if (send_first) c.send_off = f, c.recv_off = o;
  else c.recv_off = f, c.send_off = o;
  c.compare = 1;
  return c;
}

static int many_rank(hx_rank_t *r) {
  note_pid(r);
  flexcoll_comm_t comm = split_comm(r);
  if (!comm) return 1;
  hwin_t h;
  if (hwin_open(r, comm, &h, 0, 2u << 20, 0)) return 1;
  uint64_t call = 0;
  /* 50 calls each followed by the same on the heap, then 50 windowed calls straight after each
   * other (checked against the reference only). */
  for (int i = 0; i < 100; i++) {
    wcall_t c = many_call(r, i, h.win_bytes);
    c.compare = i < 50;
    if (win_call(r, comm, &h, &c, call++)) return 1;
  }
  if (hwin_deregister(r, comm, &h)) return 1;
  check_maps_unlinked(r, "after flexcoll_window_deregister");
  /* The memory is no window any more, but still memory: calls in it take the normal path. */
  {
    wcall_t c = {.dt = FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM, .count = 100003, .send_off = OFF, .compare = 1};
    c.recv_off = OFF + c.count * 4 + GAP;
    if (win_call(r, comm, &h, &c, call++)) return 1;
    wcall_t rs = {.coll = C_RS, .dt = FLEXCOLL_INT32, .op = FLEXCOLL_MAX, .count = 3001, .send_off = OFF, .compare = 1};
    rs.recv_off = OFF + (size_t)r->nranks * rs.count * 4 + GAP;
    if (win_call(r, comm, &h, &rs, call++)) return 1;
    wcall_t bc = {.coll = C_BC, .dt = FLEXCOLL_UINT8, .count = 100003, .root = r->nranks - 1, .recv_off = OFF,
                  .send_off = OFF + 100003 + GAP, .compare = 1};
    if (win_call(r, comm, &h, &bc, call++)) return 1;
  }
  /* The same allocation registered again, at an interior pointer this time. */
  snprintf(r->what, sizeof r->what, "flexcoll_window_register again (base + 4096)");
  h.win = h.base + 4096;
  h.win_bytes = h.alloc - 4096;
  if (!hx_ok(r, flexcoll_window_register(comm, h.win, h.win_bytes, &h.w), comm, "flexcoll_window_register")) return 1;
  for (int i = 100; i < 110; i++) {
    wcall_t c = many_call(r, i, h.win_bytes);
    if (win_call(r, comm, &h, &c, call++)) return 1;
  }
  if (hwin_close(r, comm, &h)) return 1;
  if (destroy_comm(r, comm)) return 1;
  return r->errors != 0;
}

START_TEST(test_many) {
  run_case("many calls", _i == 1, _i == 1 ? 2 : 3, 120, 0, many_rank, NULL);
}
END_TEST

/* ---- groups: two ranks from one thread ---------------------------------------------------------- */

static int group_body(void *arg) {
  const hx_opts_t *o = arg;
  hx_rank_t rr, *r = &rr;
  hx_rank_init(r, o, 0, 2, NULL);
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  flexcoll_comm_t c[2] = {NULL, NULL};
  snprintf(r->what, sizeof r->what, "flexcoll_comm_init_all(2)");
  if (!hx_ok(r, flexcoll_comm_init_all(c, 2, NULL), NULL, "flexcoll_comm_init_all")) return 1;
  hwin_t h[2];
  const size_t need = OFF + 3 * 65537 * 8 + GAP + 256;
  for (int i = 0; i < 2; i++) {
    memset(&h[i], 0, sizeof h[i]);
    h[i].alloc = round_up(need, page_size());
    void *p = NULL;
    snprintf(r->what, sizeof r->what, "flexcoll_host_alloc");
    if (!hx_ok(r, flexcoll_host_alloc(h[i].alloc, &p), NULL, "flexcoll_host_alloc")) return 1;
    h[i].base = h[i].win = p;
    h[i].win_bytes = h[i].alloc;
    memset(p, HX_POISON, h[i].alloc);
  }
  snprintf(r->what, sizeof r->what, "flexcoll_window_register of both ranks in a group");
  int ok = hx_ok(r, flexcoll_group_start(), NULL, "flexcoll_group_start");
  for (int i = 0; i < 2; i++)
    ok &= hx_ok(r, flexcoll_window_register(c[i], h[i].win, h[i].win_bytes, &h[i].w), c[i], "flexcoll_window_register");
  ok &= hx_ok(r, flexcoll_group_end(), NULL, "flexcoll_group_end");
  if (!ok) return 1;
  if (!h[0].w || !h[1].w) return hx_fail(r, "the group's end did not set both windows");
  static const struct {
    int coll;
    flexcoll_datatype_t dt;
    flexcoll_op_t op;
    size_t count;
    int inplace, root;
  } calls[] = {
      {C_AR, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 1001, 0, 0},   {C_AR, FLEXCOLL_INT64, FLEXCOLL_MAX, 65537, 1, 0},
      {C_AR, FLEXCOLL_BFLOAT16, FLEXCOLL_AVG, 7, 0, 0},     {C_AR, FLEXCOLL_UINT8, FLEXCOLL_PROD, 65537, 0, 0},
      {C_AR, FLEXCOLL_FLOAT64, FLEXCOLL_MIN, 1, 1, 0},      {C_RS, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 1001, 0, 0},
      {C_RS, FLEXCOLL_INT32, FLEXCOLL_AVG, 65537, 1, 0},    {C_AG, FLEXCOLL_FLOAT16, FLEXCOLL_SUM, 7, 0, 0},
      {C_AG, FLEXCOLL_INT64, FLEXCOLL_SUM, 65537, 1, 0},    {C_BC, FLEXCOLL_UINT8, FLEXCOLL_SUM, 1001, 0, 1},
      {C_BC, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, 65537, 1, 0}};
  for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
    const int co = calls[k].coll;
    const size_t es = fc_dtype_size(calls[k].dt), cnt = calls[k].count;
    const size_t sb = send_elems(co, cnt, 2) * es, rb = recv_elems(co, cnt, 2) * es;
    const size_t fb = co != C_AG ? sb : rb, ob = co != C_AG ? rb : sb;
    hx_data_t d = {calls[k].dt, coll_reduces(co) ? hx_gen_for_op(calls[k].op) : HX_GEN_BITS, r->seed, k, 2};
    unsigned char *s[2], *rv[2];
    for (int i = 0; i < 2; i++) {
      /* The shared buffer at OFF, the other one after it. */
      unsigned char *shared = h[i].win + OFF, *other = shared + fb + GAP;
      const size_t slot = (size_t)i * cnt * es;
      switch (co) {
        case C_AR: s[i] = shared, rv[i] = calls[k].inplace ? shared : other; break;
        case C_RS: s[i] = shared, rv[i] = calls[k].inplace ? shared + slot : other; break;
        case C_AG: rv[i] = shared, s[i] = calls[k].inplace ? shared + slot : other; break;
        default: s[i] = shared, rv[i] = calls[k].inplace ? shared : other; break;
      }
      hx_fill(&d, i, s[i], 0, send_elems(co, cnt, 2));
    }
    snprintf(r->what, sizeof r->what, "windowed %s %s %s count %zu %s root %d of both ranks in a group", coll_names[co],
             fc_dtype_name(calls[k].dt), coll_reduces(co) ? fc_op_name(calls[k].op) : "-", cnt,
             calls[k].inplace ? "in place" : "out of place", calls[k].root);
    ok = hx_ok(r, flexcoll_group_start(), NULL, "flexcoll_group_start");
    for (int i = 0; i < 2; i++)
      ok &= hx_ok(r, coll_issue(co, s[i], rv[i], cnt, calls[k].dt, calls[k].op, calls[k].root, c[i]), c[i],
                  coll_fns[co]);
    ok &= hx_ok(r, flexcoll_group_end(), NULL, "flexcoll_group_end");
    if (!ok) return 1;
    for (int i = 0; i < 2; i++) {
      r->rank = i;
      const size_t slot = (size_t)i * cnt * es;
      switch (co) {
        case C_AR: hx_check_reduced(r, "recvbuf", &d, calls[k].op, rv[i], 0, cnt); break;
        case C_RS: hx_check_reduced(r, "recvbuf", &d, calls[k].op, rv[i], (size_t)i * cnt, cnt); break;
        case C_AG: hx_check_gathered(r, "recvbuf", &d, rv[i], cnt); break;
        default: hx_check_input(r, "recvbuf", &d, calls[k].root, rv[i], 0, cnt); break;
      }
      if (!calls[k].inplace) hx_check_input(r, "sendbuf", &d, i, s[i], 0, send_elems(co, cnt, 2));
      else if (co == C_RS) {
        hx_check_input(r, "sendbuf before this rank's block", &d, i, s[i], 0, (size_t)i * cnt);
        hx_check_input(r, "sendbuf after this rank's block", &d, i, s[i] + slot + cnt * es, (size_t)(i + 1) * cnt,
                       (size_t)(1 - i) * cnt);
      }
      unsigned char *shared = h[i].win + OFF, *other = calls[k].inplace ? NULL : shared + fb + GAP;
      check_outside(r, "window allocation", h[i].base, h[i].alloc, shared, fb, other, ob);
      memset(shared, HX_POISON, fb);
      if (other) memset(other, HX_POISON, ob);
    }
    r->rank = 0;
  }
  snprintf(r->what, sizeof r->what, "flexcoll_window_deregister of both ranks in a group");
  ok = hx_ok(r, flexcoll_group_start(), NULL, "flexcoll_group_start");
  for (int i = 0; i < 2; i++) ok &= hx_ok(r, flexcoll_window_deregister(c[i], h[i].w), c[i], "flexcoll_window_deregister");
  ok &= hx_ok(r, flexcoll_group_end(), NULL, "flexcoll_group_end");
  if (!ok) return 1;
  for (int i = 0; i < 2; i++) {
    h[i].w = NULL;
    if (hwin_free(r, &h[i])) return 1;
  }
  if (!hx_destroy_concurrently(c, 2)) return hx_fail(r, "destroying the two ranks failed");
  return r->errors != 0;
}

START_TEST(test_group) {
  hx_opts_t o = {.label = "window group init_all n=2", .deadline_s = 120, .env = env_win0};
  shm_list_t before = shm_list();
  ck_assert_msg(hx_run_process(&o, group_body, &o), "windows in groups: see stderr");
  pid_t none = 0;
  ck_assert_msg(!shm_leftovers(o.label, &before, &none, 1), "entries left in /dev/shm: see stderr");
  shm_list_free(&before);
}
END_TEST

/* ---- errors ----------------------------------------------------------------------------------- */

/* res must be one of want[0..nwant) and have come within half the timeout; when `mention` is
 * given, comm's last error must contain it.  Returns 1 when so. */
static int expect_res(hx_rank_t *r, flexcoll_result_t res, flexcoll_comm_t comm, const flexcoll_result_t *want,
                      int nwant, const char *mention, double took_s) {
  int good = 0;
  for (int i = 0; i < nwant; i++) good |= res == want[i];
  const char *e = flexcoll_get_last_error(comm);
  if (!good) {
    char names[160] = "";
    for (int i = 0; i < nwant; i++) {
      size_t l = strlen(names);
      snprintf(names + l, sizeof names - l, "%s%s", i ? " or " : "", flexcoll_get_error_string(want[i]));
    }
    hx_fail(r, "returned %d (%s), expected %s; last error: %s", (int)res, flexcoll_get_error_string(res), names,
            e ? e : "(null)");
    return 0;
  }
  if (took_s > ERR_TIMEOUT_MS / 2000.0) {
    hx_fail(r, "returned %s only after %.1f s (timeout %d ms): it waited for the timeout instead of being told",
            flexcoll_get_error_string(res), took_s, ERR_TIMEOUT_MS);
    return 0;
  }
  if (mention && (!e || !strstr(e, mention))) {
    hx_fail(r, "returned %s, but the last error does not mention \"%s\": %s", flexcoll_get_error_string(res), mention,
            e ? e : "(null)");
    return 0;
  }
  return 1;
}

enum { E_HEAP_ONE, E_UNEQUAL, E_PAST_END_ALL, E_PAST_END_ONE, E_NCASES };
static const char *const e_names[E_NCASES] = {"heap memory on rank 1", "unequal sizes (rank n-1 one page less)",
                                              "buf + bytes past the allocation on every rank",
                                              "buf + bytes past the allocation on rank 0"};

/* One registration that must fail on every rank (case e), then the communicator must still work,
 * and a correct registration must succeed. */
static int err_register_rank(hx_rank_t *r) {
  const int e = *(const int *)case_arg(r), n = r->nranks, me = r->rank;
  note_pid(r);
  flexcoll_comm_t comm = split_comm(r);
  if (!comm) return 1;
  const size_t pg = page_size(), bytes = 16 * pg;
  void *p = NULL, *heap = NULL;
  snprintf(r->what, sizeof r->what, "flexcoll_host_alloc(%zu)", bytes);
  if (!hx_ok(r, flexcoll_host_alloc(bytes, &p), NULL, "flexcoll_host_alloc")) return 1;
  unsigned char *buf = p;
  size_t len = bytes;
  flexcoll_result_t want = FLEXCOLL_INVALID_USAGE;
  const char *mention = NULL;
  char who[32];
  switch (e) {
    case E_HEAP_ONE:
      if (me == 1) {
        if (posix_memalign(&heap, pg, bytes) != 0) return hx_fail(r, "out of memory");
        memset(heap, 0, bytes);
        buf = heap;
      } else {
        snprintf(who, sizeof who, "rank 1");
        mention = who;
      }
      break;
    case E_UNEQUAL:
      if (me == n - 1) len = bytes - pg;
      break;
    case E_PAST_END_ALL:
      buf += 128;
      len = bytes - 128 + 1;
      want = FLEXCOLL_INVALID_ARGUMENT;
      break;
    default:
      if (me == 0) {
        buf += pg;
        len = bytes; /* a page past the end */
        want = FLEXCOLL_INVALID_ARGUMENT;
      } else {
        snprintf(who, sizeof who, "rank 0");
        mention = who;
      }
      break;
  }
  flexcoll_window_t w = (flexcoll_window_t)&w; /* must come back NULL */
  snprintf(r->what, sizeof r->what, "flexcoll_window_register: %s (this rank: %s + %zu, %zu bytes)", e_names[e],
           buf == heap ? "heap" : "host_alloc", heap && buf == heap ? (size_t)0 : (size_t)(buf - (unsigned char *)p), len);
  double t0 = hx_now();
  flexcoll_result_t res = flexcoll_window_register(comm, buf, len, &w);
  double took = hx_now() - t0;
  if (!expect_res(r, res, comm, &want, 1, mention, took)) {
    if (res == FLEXCOLL_SUCCESS) flexcoll_window_deregister(comm, w);
    return 1;
  }
  if (w) hx_fail(r, "the window is not NULL after a failed registration");
  /* The memory is not held by a window: free succeeds. */
  if (in_step(r, comm, "a refused registration")) return 1;
  snprintf(r->what, sizeof r->what, "flexcoll_host_free after a refused registration");
  if (!hx_ok(r, flexcoll_host_free(p), NULL, "flexcoll_host_free")) return 1;
  free(heap);
  /* A correct registration on the same communicator, and a call in it. */
  hwin_t h;
  if (hwin_open(r, comm, &h, 0, OFF + 2 * 4004 + GAP, 0)) return 1;
  wcall_t c = {.dt = FLEXCOLL_FLOAT32, .op = FLEXCOLL_SUM, .count = 1001, .send_off = OFF, .recv_off = OFF + 4004 + GAP,
               .compare = 1};
  if (win_call(r, comm, &h, &c, 1)) return 1;
  if (hwin_close(r, comm, &h)) return 1;
  if (destroy_comm(r, comm)) return 1;
  return r->errors != 0;
}

START_TEST(test_err_register) {
  /* _i: the cases as processes (3 ranks), then heap memory on one rank with threads. */
  const int e = _i < E_NCASES ? _i : E_HEAP_ONE;
  char what[96];
  snprintf(what, sizeof what, "register: %s", e_names[e]);
  run_case(what, _i >= E_NCASES, 3, 90, 1, err_register_rank, &e);
}
END_TEST

/* The end of a disagreement case: the communicator may be unusable (REMOTE_ERROR): abort where it
 * is, destroy it with the windows still registered; then the memory can be freed. */
static int end_err_case(hx_rank_t *r, flexcoll_comm_t comm, flexcoll_result_t res, hwin_t h[2]) {
  if (res != FLEXCOLL_SUCCESS && res != FLEXCOLL_INVALID_USAGE) flexcoll_comm_abort(comm);
  if (destroy_comm(r, comm)) return 1;
  for (int i = 0; i < 2; i++) {
    h[i].w = NULL;
    if (hwin_free(r, &h[i])) return 1;
  }
  return r->errors != 0;
}

/* Ranks that disagree on a windowed allreduce. */
enum { D_OFFSET, D_RECV_OFFSET, D_HEAP, D_SEND_HEAP, D_OTHER_WINDOW, D_INPLACE_OFFSET, D_BIG_DEFAULT, D_NCASES };
static const char *const d_names[D_NCASES] = {
    "rank n-1's buffers at +256, the others' at +128", "rank 0's recvbuf at another offset",
    "rank 1's buffers on the heap",                    "rank 1's sendbuf on the heap",
    "rank 0's buffers in its second window",           "in place, rank n-1 at +256",
    "4 MiB, default threshold, rank n-1 at +256"};

static int err_call_rank(hx_rank_t *r) {
  const int v = *(const int *)case_arg(r), n = r->nranks, me = r->rank;
  note_pid(r);
  flexcoll_comm_t comm = split_comm(r);
  if (!comm) return 1;
  const size_t count = v == D_BIG_DEFAULT ? (BIG_DATA / 4 + 3) : 1001, bytes = count * 4;
  hwin_t h[2];
  memset(h, 0, sizeof h);
  if (hwin_open(r, comm, &h[0], 0, 512 + 2 * bytes + 2 * GAP, 0)) return 1;
  if (v == D_OTHER_WINDOW && hwin_open(r, comm, &h[1], 0, 512 + 2 * bytes + 2 * GAP, 0)) return 1;
  hwin_t *hw = v == D_OTHER_WINDOW && me == 0 ? &h[1] : &h[0];
  size_t soff = OFF, roff = OFF + bytes + GAP;
  if ((v == D_OFFSET || v == D_INPLACE_OFFSET || v == D_BIG_DEFAULT) && me == n - 1) soff += 128, roff += 128;
  if (v == D_RECV_OFFSET && me == 0) roff += 64;
  const int inplace = v == D_INPLACE_OFFSET;
  hx_buf_t hs = {0}, hr = {0};
  unsigned char *send = hw->win + soff, *recv = inplace ? send : hw->win + roff;
  if ((v == D_HEAP || v == D_SEND_HEAP) && me == 1) {
    if (!(send = hx_buf_new(r, &hs, bytes))) return 1;
    if (v == D_HEAP && !(recv = hx_buf_new(r, &hr, bytes))) return 1;
  }
  hx_data_t d = {FLEXCOLL_FLOAT32, HX_GEN_SUM, r->seed, 7, n};
  hx_fill(&d, me, send, 0, count);
  snprintf(r->what, sizeof r->what, "allreduce float32 sum count %zu %s: %s", count, inplace ? "in place" : "out of place",
           d_names[v]);
  double t0 = hx_now();
  flexcoll_result_t res = flexcoll_allreduce(send, recv, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL);
  double took = hx_now() - t0;
  static const flexcoll_result_t want[2] = {FLEXCOLL_INVALID_USAGE, FLEXCOLL_REMOTE_ERROR};
  expect_res(r, res, comm, want, 2, NULL, took);
  /* Nothing written: a wrong result must never land. */
  if (res != FLEXCOLL_SUCCESS) {
    if (!inplace) {
      hx_check_input(r, "sendbuf (must not change)", &d, me, send, 0, count);
      hx_check_poisoned(r, "recvbuf of the refused call", recv, bytes);
    } else {
      hx_check_input(r, "the in-place buffer of the refused call (must not change)", &d, me, send, 0, count);
    }
    for (int i = 0; i < 2; i++)
      if (h[i].base)
        check_outside(r, "window allocation", h[i].base, h[i].alloc, hw == &h[i] && !hs.base ? send : NULL, bytes,
                      hw == &h[i] && !hr.base && !inplace ? recv : NULL, bytes);
  }
  hx_buf_free(&hs);
  hx_buf_free(&hr);
  return end_err_case(r, comm, res, h);
}

START_TEST(test_err_call) {
  /* _i: the cases as processes (3 ranks), then a few with threads (2 ranks). */
  static const int thread_cases[] = {D_OFFSET, D_HEAP, D_OTHER_WINDOW};
  const int threads = _i >= D_NCASES, v = threads ? thread_cases[_i - D_NCASES] : _i, n = threads ? 2 : 3;
  char label[128];
  snprintf(label, sizeof label, "window call: %s (%s n=%d)", d_names[v], threads ? "threads" : "procs", n);
  hx_opts_t o = {.label = label, .deadline_s = 90, .timeout_ms = ERR_TIMEOUT_MS,
                 .env = v == D_BIG_DEFAULT ? env_default : env_win0};
  ck_assert_msg(run_ranks(threads, n, &o, err_call_rank, &v), "%s: see stderr", label);
}
END_TEST

/* Ranks that disagree on the shared buffer of a windowed reduce_scatter (sendbuf), allgather
 * (recvbuf) or broadcast (every rank's sendbuf); float32, 1001 elements per block (4 MiB with the
 * default threshold). */
enum { K_OFFSET, K_HEAP_ONE, K_NULL_ONE, K_OTHER_WINDOW, K_BIG_DEFAULT };
typedef struct {
  int coll, kind;
  int inplace;
  int unshared_heap; /* the unshared buffer on the heap on every rank */
  int root;          /* broadcast; -1: n - 1 */
  const char *name;
} dc_t;
static const dc_t dc_cases[] = {
    {C_RS, K_OFFSET, 0, 0, 0, "reduce_scatter: rank n-1's sendbuf at +256, the others' at +128"},
    {C_RS, K_OFFSET, 0, 1, 0, "reduce_scatter, recvbufs on the heap: rank n-1's sendbuf at +256"},
    {C_RS, K_OFFSET, 1, 0, 0, "reduce_scatter in place: rank n-1 at +256"},
    {C_RS, K_HEAP_ONE, 0, 0, 0, "reduce_scatter: rank 1's sendbuf on the heap"},
    {C_RS, K_OTHER_WINDOW, 0, 0, 0, "reduce_scatter: rank 0's sendbuf in its second window"},
    {C_RS, K_BIG_DEFAULT, 0, 1, 0, "reduce_scatter 4 MiB, default threshold, recvbufs on the heap: rank n-1 at +256"},
    {C_AG, K_OFFSET, 0, 0, 0, "allgather: rank n-1's recvbuf at +256, the others' at +128"},
    {C_AG, K_OFFSET, 0, 1, 0, "allgather, sendbufs on the heap: rank n-1's recvbuf at +256"},
    {C_AG, K_OFFSET, 1, 0, 0, "allgather in place: rank n-1 at +256"},
    {C_AG, K_HEAP_ONE, 0, 0, 0, "allgather: rank 1's recvbuf on the heap"},
    {C_AG, K_OTHER_WINDOW, 0, 0, 0, "allgather: rank 0's recvbuf in its second window"},
    {C_AG, K_BIG_DEFAULT, 0, 0, 0, "allgather 4 MiB, default threshold: rank n-1's recvbuf at +256"},
    {C_BC, K_OFFSET, 0, 0, -1, "broadcast root n-1: the root's sendbuf at +256, the others' at +128"},
    {C_BC, K_OFFSET, 0, 1, -1, "broadcast root n-1, recvbufs on the heap: the root's sendbuf at +256"},
    {C_BC, K_OFFSET, 1, 0, -1, "broadcast in place root n-1: the root at +256"},
    {C_BC, K_OFFSET, 0, 0, 0, "broadcast root 0: rank n-1's sendbuf at +256"},
    {C_BC, K_HEAP_ONE, 0, 0, 1, "broadcast root 1: the root's sendbuf on the heap"},
    {C_BC, K_HEAP_ONE, 0, 0, 0, "broadcast root 0: rank 1's sendbuf on the heap"},
    {C_BC, K_NULL_ONE, 0, 0, 0, "broadcast root 0: rank 1's sendbuf NULL"},
    {C_BC, K_OTHER_WINDOW, 0, 0, -1, "broadcast root n-1: rank 0's sendbuf in its second window"},
    {C_BC, K_BIG_DEFAULT, 0, 0, -1, "broadcast 4 MiB, default threshold: the root's (n-1) sendbuf at +256"},
};
#define DC_NCASES ((int)(sizeof dc_cases / sizeof dc_cases[0]))

static int err_coll_rank(hx_rank_t *r) {
  const dc_t *v = &dc_cases[*(const int *)case_arg(r)];
  const int n = r->nranks, me = r->rank, co = v->coll, root = v->root < 0 ? n - 1 : v->root;
  note_pid(r);
  flexcoll_comm_t comm = split_comm(r);
  if (!comm) return 1;
  const size_t es = 4;
  const size_t count = v->kind != K_BIG_DEFAULT ? 1001 : co == C_BC ? BIG_DATA / es + 3 : BIG_DATA / es / (size_t)n + 3;
  const size_t sbytes = send_elems(co, count, n) * es, rbytes = recv_elems(co, count, n) * es;
  /* The shared buffer (allgather: recvbuf; else sendbuf) at OFF, on the odd rank out at OFF + 128
   * (offset cases), on the heap, NULL or in the second window; the other one after it. */
  const size_t fb = co != C_AG ? sbytes : rbytes, ob = co != C_AG ? rbytes : sbytes;
  const int odd = v->kind == K_HEAP_ONE || v->kind == K_NULL_ONE ? 1 : v->kind == K_OTHER_WINDOW ? 0 : n - 1;
  hwin_t h[2];
  memset(h, 0, sizeof h);
  if (hwin_open(r, comm, &h[0], 0, 512 + fb + ob + 2 * GAP, 0)) return 1;
  if (v->kind == K_OTHER_WINDOW && hwin_open(r, comm, &h[1], 0, 512 + fb + ob + 2 * GAP, 0)) return 1;
  hwin_t *hw = v->kind == K_OTHER_WINDOW && me == odd ? &h[1] : &h[0];
  hx_buf_t hf = {0}, ho = {0};
  unsigned char *shared = hw->win + OFF + ((v->kind == K_OFFSET || v->kind == K_BIG_DEFAULT) && me == odd ? 128 : 0);
  if (v->kind == K_HEAP_ONE && me == odd && !(shared = hx_buf_new(r, &hf, fb))) return 1;
  if (v->kind == K_NULL_ONE && me == odd) shared = NULL; /* (broadcast's non-root only) */
  unsigned char *other = NULL; /* the unshared buffer, out of place */
  if (!v->inplace) {
    if (!v->unshared_heap) other = h[0].win + OFF + 128 + fb + GAP;
    else if (!(other = hx_buf_new(r, &ho, ob))) return 1;
  }
  unsigned char *send, *recv;
  switch (co) {
    case C_RS: send = shared, recv = v->inplace ? shared + (size_t)me * count * es : other; break;
    case C_AG: recv = shared, send = v->inplace ? shared + (size_t)me * count * es : other; break;
    default: send = shared, recv = v->inplace ? shared : other; break;
  }
  hx_data_t d = {FLEXCOLL_FLOAT32, co == C_RS ? HX_GEN_SUM : HX_GEN_BITS, r->seed, 7, n};
  if (send) hx_fill(&d, me, send, 0, send_elems(co, count, n));
  snprintf(r->what, sizeof r->what, "%s float32%s count %zu %s: %s", coll_names[co], co == C_RS ? " sum" : "", count,
           v->inplace ? "in place" : "out of place", v->name);
  double t0 = hx_now();
  flexcoll_result_t res = coll_issue(co, send, recv, count, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, root, comm);
  double took = hx_now() - t0;
  /* A broadcast root whose sendbuf is outside the windows runs the exchange mode, whose root posts
   * its input and returns without waiting for anyone: it cannot see the difference (its data is
   * right; every other rank fails). */
  const int blind_root = co == C_BC && me == root && me == odd && (v->kind == K_HEAP_ONE || v->kind == K_NULL_ONE);
  static const flexcoll_result_t want[3] = {FLEXCOLL_INVALID_USAGE, FLEXCOLL_REMOTE_ERROR, FLEXCOLL_SUCCESS};
  expect_res(r, res, comm, want, blind_root ? 3 : 2, NULL, took);
  if (res != FLEXCOLL_SUCCESS) {
    /* No input changed, no output written: a wrong result must never land.  (A broadcast's root
     * copies its input into its recvbuf before it waits for anyone, and a non-root may copy the
     * root's input before a third rank fails: the root's data is no wrong result.) */
    switch (co) {
      case C_RS:
        hx_check_input(r, v->inplace ? "the in-place sendbuf of the refused call, this rank's block included (must not "
                       "change)" : "sendbuf (must not change)", &d, me, send, 0, (size_t)n * count);
        if (!v->inplace) hx_check_poisoned(r, "recvbuf of the refused call", recv, rbytes);
        break;
      case C_AG:
        hx_check_input(r, "sendbuf (must not change)", &d, me, send, 0, count);
        for (int q = 0; q < n; q++) {
          if (v->inplace && q == me) continue;
          char w[64];
          snprintf(w, sizeof w, "recvbuf block %d of the refused call", q);
          hx_check_poisoned(r, w, recv + (size_t)q * count * es, count * es);
        }
        break;
      default: {
        if (send && !v->inplace) hx_check_input(r, "sendbuf (must not change)", &d, me, send, 0, count);
        unsigned char *rootdata = malloc(rbytes);
        if (!rootdata) return hx_fail(r, "out of memory");
        hx_fill(&d, root, rootdata, 0, count);
        if (memcmp(recv, rootdata, rbytes) != 0) {
          if (v->inplace)
            hx_check_input(r, "the in-place buffer of the refused call (neither untouched nor the root's data)", &d, me,
                           recv, 0, count);
          else
            hx_check_poisoned(r, "recvbuf of the refused call (neither untouched nor the root's data)", recv, rbytes);
        }
        free(rootdata);
        break;
      }
    }
    for (int i = 0; i < 2; i++)
      if (h[i].base)
        check_outside(r, "window allocation", h[i].base, h[i].alloc, hw == &h[i] && shared && !hf.base ? shared : NULL,
                      fb, i == 0 && other && !ho.base ? other : NULL, ob);
    if (hf.base) hx_buf_check_guards(r, "the shared buffer on the heap", &hf);
    if (ho.base) hx_buf_check_guards(r, "the unshared buffer on the heap", &ho);
  } else {
    /* Already a failure; say whether the data is right at least. */
    switch (co) {
      case C_RS:
        hx_check_reduced(r, "recvbuf of the call that succeeded", &d, FLEXCOLL_SUM, recv, (size_t)me * count, count);
        break;
      case C_AG: hx_check_gathered(r, "recvbuf of the call that succeeded", &d, recv, count); break;
      default: hx_check_input(r, "recvbuf of the call that succeeded", &d, root, recv, 0, count); break;
    }
  }
  hx_buf_free(&hf);
  hx_buf_free(&ho);
  return end_err_case(r, comm, res, h);
}

START_TEST(test_err_coll) {
  /* _i: the cases as processes (3 ranks), then a few with threads (2 ranks). */
  static const int thread_cases[] = {0, 7, 12, 15, 18};
  const int threads = _i >= DC_NCASES, v = threads ? thread_cases[_i - DC_NCASES] : _i, n = threads ? 2 : 3;
  char label[160];
  snprintf(label, sizeof label, "window call: %s (%s n=%d)", dc_cases[v].name, threads ? "threads" : "procs", n);
  hx_opts_t o = {.label = label, .deadline_s = 90, .timeout_ms = ERR_TIMEOUT_MS,
                 .env = dc_cases[v].kind == K_BIG_DEFAULT ? env_default : env_win0};
  ck_assert_msg(run_ranks(threads, n, &o, err_coll_rank, &v), "%s: see stderr", label);
}
END_TEST

/* flexcoll_host_free while a window lies in the allocation. */
static int free_busy_rank(hx_rank_t *r) {
  note_pid(r);
  flexcoll_comm_t c1 = split_comm(r), c2 = c1 ? split_comm(r) : NULL;
  if (!c2) return 1;
  hwin_t h;
  if (hwin_open(r, c1, &h, 0, OFF + 2 * 40000 + GAP + 4096, 0)) return 1;
  /* The same memory, from page 1, as a window of a second communicator. */
  flexcoll_window_t w2 = NULL;
  snprintf(r->what, sizeof r->what, "flexcoll_window_register on a second communicator (base + 4096)");
  if (!hx_ok(r, flexcoll_window_register(c2, h.base + 4096, h.alloc - 4096, &w2), c2, "flexcoll_window_register"))
    return 1;
  static const flexcoll_result_t usage[1] = {FLEXCOLL_INVALID_USAGE}, arg[1] = {FLEXCOLL_INVALID_ARGUMENT};
  snprintf(r->what, sizeof r->what, "flexcoll_host_free while windows of two communicators lie in the allocation");
  double t0 = hx_now();
  if (!expect_res(r, flexcoll_host_free(h.base), NULL, usage, 1, NULL, hx_now() - t0)) return 1;
  snprintf(r->what, sizeof r->what, "flexcoll_host_free of an interior pointer of a registered allocation");
  if (!expect_res(r, flexcoll_host_free(h.base + 4096), NULL, arg, 1, NULL, 0)) return 1;
  /* Still memory, still the windows: calls in both. */
  wcall_t c = {.dt = FLEXCOLL_INT32, .op = FLEXCOLL_SUM, .count = 10007, .send_off = OFF,
               .recv_off = OFF + 40028 + GAP, .compare = 1};
  hwin_t h2 = h; /* the second communicator's view: its window from page 1 */
  h2.win = h.base + 4096;
  h2.win_bytes = h.alloc - 4096;
  h2.w = w2;
  if (win_call(r, c1, &h, &c, 1)) return 1;
  if (win_call(r, c2, &h2, &c, 2)) return 1;
  if (hwin_deregister(r, c1, &h)) return 1;
  snprintf(r->what, sizeof r->what, "flexcoll_host_free while the second communicator's window lies in the allocation");
  if (!expect_res(r, flexcoll_host_free(h.base), NULL, usage, 1, NULL, 0)) return 1;
  snprintf(r->what, sizeof r->what, "flexcoll_window_deregister (second communicator)");
  if (!hx_ok(r, flexcoll_window_deregister(c2, w2), c2, "flexcoll_window_deregister")) return 1;
  unsigned char *base = h.base;
  if (hwin_free(r, &h)) return 1;
  snprintf(r->what, sizeof r->what, "flexcoll_host_free again (double free)");
  if (!expect_res(r, flexcoll_host_free(base), NULL, arg, 1, NULL, 0)) return 1;
  if (destroy_comm(r, c1) || destroy_comm(r, c2)) return 1;
  return r->errors != 0;
}

START_TEST(test_free_busy) {
  run_case("free while registered", _i == 1, 2, 90, 1, free_busy_rank, NULL);
}
END_TEST

/* Destroy a communicator with windows still registered; then free. */
static int destroy_busy_rank(hx_rank_t *r) {
  note_pid(r);
  flexcoll_comm_t comm = split_comm(r);
  if (!comm) return 1;
  hwin_t h[2];
  if (hwin_open(r, comm, &h[0], 0, OFF + 2 * 4004 + GAP, 0) || hwin_open(r, comm, &h[1], 0, 3 * page_size(), 0))
    return 1;
  wcall_t c = {.dt = FLEXCOLL_FLOAT64, .op = FLEXCOLL_MAX, .count = 500, .send_off = OFF, .recv_off = OFF + 4000 + GAP,
               .compare = 1};
  if (win_call(r, comm, &h[0], &c, 1)) return 1;
  static const flexcoll_result_t usage[1] = {FLEXCOLL_INVALID_USAGE};
  snprintf(r->what, sizeof r->what, "flexcoll_host_free while registered, before the destroy");
  if (!expect_res(r, flexcoll_host_free(h[1].base), NULL, usage, 1, NULL, 0)) return 1;
  if (destroy_comm(r, comm)) return 1;
  for (int i = 0; i < 2; i++) {
    h[i].w = NULL;
    snprintf(r->what, sizeof r->what, "flexcoll_host_free of allocation %d after the communicator's destroy", i);
    if (hwin_free(r, &h[i])) return 1;
  }
  return r->errors != 0;
}

START_TEST(test_destroy_busy) {
  run_case("destroy while registered", _i == 1, 2, 90, 1, destroy_busy_rank, NULL);
}
END_TEST

/* ---- /dev/shm --------------------------------------------------------------------------------- */

/* After each registration has returned on every rank (an allreduce later), no /dev/shm entry
 * carries the pid of one of this run's ranks. */
static int devshm_rank(hx_rank_t *r) {
  note_pid(r);
  const pid_t *pids = ((run_arg_t *)r->arg)->pids;
  flexcoll_comm_t comm = split_comm(r);
  if (!comm) return 1;
  if (in_step(r, comm, "every rank noted its pid")) return 1;
  for (int round = 0; round < 50; round++) {
    hwin_t h;
    if (hwin_open(r, comm, &h, 0, (size_t)(1 + round % 5) * page_size(), 0)) return 1;
    wcall_t c = {.dt = FLEXCOLL_UINT32, .op = FLEXCOLL_SUM, .count = 7 + (size_t)round, .send_off = OFF,
                 .recv_off = OFF + 4 * (7 + (size_t)round) + GAP, .compare = 0};
    if (win_call(r, comm, &h, &c, (uint64_t)round)) return 1;
    shm_list_t l = shm_list();
    for (int i = 0; i < l.n; i++)
      if (name_has_pid(l.name[i], pids, MAX_PIDS))
        hx_fail(r, "registration round %d: /dev/shm/%s (a rank's pid) is still there once every rank returned",
                round, l.name[i]);
    shm_list_free(&l);
    if (hwin_close(r, comm, &h)) return 1;
    if (r->errors) return 1;
  }
  if (destroy_comm(r, comm)) return 1;
  return r->errors != 0;
}

START_TEST(test_devshm) {
  run_case("/dev/shm", _i == 1, _i == 1 ? 2 : 3, 90, 0, devshm_rank, NULL);
}
END_TEST

/* ---- flexcoll_host_alloc / flexcoll_host_free alone ------------------------------------------- */

/* res must be code, with a fresh last error (a sentinel is recorded first) that contains what. */
#define EXPECT_ERR(call, code, what)                                                                           \
  do {                                                                                                         \
    char sentinel_[512];                                                                                       \
    flexcoll_get_version(NULL);                                                                                \
    snprintf(sentinel_, sizeof sentinel_, "%s", flexcoll_get_last_error(NULL));                               \
    flexcoll_result_t r_ = (call);                                                                             \
    const char *e_ = flexcoll_get_last_error(NULL);                                                            \
    ck_assert_msg(r_ == (code), "%s returned %d (%s), expected %d (%s); last error: %s", #call, (int)r_,        \
                  flexcoll_get_error_string(r_), (int)(code), flexcoll_get_error_string(code), e_ ? e_ : "(null)"); \
    ck_assert_msg(e_ && strcmp(e_, sentinel_) != 0, "%s returned %d without recording a last error", #call,    \
                  (int)r_);                                                                                    \
    ck_assert_msg(!(what) || strstr(e_, (what) ? (what) : ""), "%s: last error \"%s\" does not mention \"%s\"", \
                  #call, e_, (what) ? (what) : "");                                                            \
  } while (0)

#define EXPECT_OK(call)                                                                                        \
  do {                                                                                                         \
    flexcoll_result_t r_ = (call);                                                                             \
    ck_assert_msg(r_ == FLEXCOLL_SUCCESS, "%s returned %d (%s): %s", #call, (int)r_,                           \
                  flexcoll_get_error_string(r_), flexcoll_get_last_error(NULL));                               \
  } while (0)


START_TEST(test_alloc_args) {
  void *p = (void *)&p; /* a failure sets it to NULL */
  EXPECT_ERR(flexcoll_host_alloc(0, &p), FLEXCOLL_INVALID_ARGUMENT, "bytes");
  ck_assert_ptr_null(p);
  EXPECT_ERR(flexcoll_host_alloc(4096, NULL), FLEXCOLL_INVALID_ARGUMENT, "ptr");
  EXPECT_ERR(flexcoll_host_alloc(0, NULL), FLEXCOLL_INVALID_ARGUMENT, NULL);
  /* A size whose page rounding overflows: refused, whatever the code, without a crash. */
  p = (void *)&p;
  flexcoll_result_t res = flexcoll_host_alloc(SIZE_MAX, &p);
  ck_assert_msg(res != FLEXCOLL_SUCCESS, "flexcoll_host_alloc(SIZE_MAX) succeeded (%p)", p);
  ck_assert_ptr_null(p);
  p = (void *)&p;
  res = flexcoll_host_alloc(SIZE_MAX - page_size() + 2, &p);
  ck_assert_msg(res != FLEXCOLL_SUCCESS, "flexcoll_host_alloc(SIZE_MAX - page + 2) succeeded (%p)", p);
  ck_assert_ptr_null(p);
  EXPECT_OK(flexcoll_host_free(NULL));
}
END_TEST

START_TEST(test_free_unknown) {
  void *m = malloc(1 << 16);
  ck_assert_ptr_nonnull(m);
  EXPECT_ERR(flexcoll_host_free(m), FLEXCOLL_INVALID_ARGUMENT, NULL);
  free(m);
  /* An anonymous mapping of whole pages, as flexcoll_host_alloc's would look. */
  void *a = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(a, MAP_FAILED);
  EXPECT_ERR(flexcoll_host_free(a), FLEXCOLL_INVALID_ARGUMENT, NULL);
  ((volatile char *)a)[0] = 1; /* still mapped */
  munmap(a, 8192);
  void *p = NULL;
  EXPECT_OK(flexcoll_host_alloc(3 * page_size(), &p));
  EXPECT_ERR(flexcoll_host_free((char *)p + 1), FLEXCOLL_INVALID_ARGUMENT, NULL);
  EXPECT_ERR(flexcoll_host_free((char *)p + page_size()), FLEXCOLL_INVALID_ARGUMENT, NULL);
  ((volatile char *)p)[3 * page_size() - 1] = 1; /* still there */
  EXPECT_OK(flexcoll_host_free(p));
  EXPECT_ERR(flexcoll_host_free(p), FLEXCOLL_INVALID_ARGUMENT, NULL);
}
END_TEST

START_TEST(test_alloc_memory) {
  const size_t pg = page_size();
  static const size_t sizes[] = {1, 100, 4095, 4096, 4097, 100000, 3u << 20};
  void *p[sizeof sizes / sizeof sizes[0]];
  shm_list_t before = shm_list();
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    p[i] = NULL;
    EXPECT_OK(flexcoll_host_alloc(sizes[i], &p[i]));
    ck_assert_ptr_nonnull(p[i]);
    ck_assert_msg((uintptr_t)p[i] % pg == 0, "flexcoll_host_alloc(%zu) = %p: not page-aligned", sizes[i], p[i]);
    const size_t len = round_up(sizes[i], pg);
    /* (Plain loops: every ck_assert writes to Check's pipe.) */
    const unsigned char *b = p[i];
    size_t j = 0;
    while (j < len && b[j] == 0) j++;
    ck_assert_msg(j == len, "flexcoll_host_alloc(%zu): byte %zu of the page-rounded %zu is 0x%02x, not 0", sizes[i], j,
                  len, b[j]);
    memset(p[i], 0x5a ^ (int)i, len); /* writable up to the page-rounded size */
  }
  /* Distinct, non-overlapping, and each keeps its own contents. */
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    const size_t li = round_up(sizes[i], pg);
    for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++) {
      if (i == j) continue;
      const size_t lj = round_up(sizes[j], pg);
      const uintptr_t a = (uintptr_t)p[i], b = (uintptr_t)p[j];
      ck_assert_msg(a + li <= b || b + lj <= a, "allocations %zu (%p, %zu bytes) and %zu (%p, %zu bytes) overlap", i,
                    p[i], li, j, p[j], lj);
    }
    const unsigned char *b = p[i];
    size_t k = 0;
    while (k < li && b[k] == (0x5a ^ (int)i)) k++;
    ck_assert_msg(k == li, "allocation %zu: byte %zu is 0x%02x, not the 0x%02x written", i, k, b[k], 0x5a ^ (int)i);
  }
  /* Nothing shared before a registration: nothing new in /dev/shm (allow others' brief entries). */
  pid_t me = getpid();
  ck_assert_msg(!shm_leftovers("alloc", &before, &me, 1), "flexcoll_host_alloc left entries in /dev/shm: see stderr");
  shm_list_free(&before);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) EXPECT_OK(flexcoll_host_free(p[i]));
  /* A fresh allocation after frees is zeroed again. */
  void *q = NULL;
  EXPECT_OK(flexcoll_host_alloc(100000, &q));
  size_t j = 0;
  while (j < round_up(100000, pg) && ((unsigned char *)q)[j] == 0) j++;
  ck_assert_msg(j == round_up(100000, pg), "a fresh allocation after frees: byte %zu is not 0", j);
  EXPECT_OK(flexcoll_host_free(q));
}
END_TEST

START_TEST(test_alloc_fds) {
  /* Warm up (whatever the library sets up once), then 64 allocations and frees keep no descriptor. */
  void *p = NULL;
  EXPECT_OK(flexcoll_host_alloc(4096, &p));
  EXPECT_OK(flexcoll_host_free(p));
  const int fds = hx_open_fds();
  void *many[64];
  for (int i = 0; i < 64; i++) EXPECT_OK(flexcoll_host_alloc((size_t)(i + 1) * 1000, &many[i]));
  for (int i = 0; i < 64; i += 2) EXPECT_OK(flexcoll_host_free(many[i]));
  for (int i = 1; i < 64; i += 2) EXPECT_OK(flexcoll_host_free(many[i]));
  ck_assert_int_eq(hx_open_fds(), fds);
}
END_TEST

static void *free_in_thread(void *arg) { return (void *)(intptr_t)flexcoll_host_free(arg); }
static void *alloc_in_thread(void *arg) {
  void **p = arg;
  return (void *)(intptr_t)flexcoll_host_alloc(12345, p);
}

START_TEST(test_alloc_threads) {
  /* Allocated in one thread, freed in another (and the reverse); 4 threads at once. */
  void *p = NULL;
  EXPECT_OK(flexcoll_host_alloc(65536, &p));
  pthread_t t;
  void *rv = NULL;
  ck_assert_int_eq(pthread_create(&t, NULL, free_in_thread, p), 0);
  pthread_join(t, &rv);
  ck_assert_int_eq((int)(intptr_t)rv, FLEXCOLL_SUCCESS);
  EXPECT_ERR(flexcoll_host_free(p), FLEXCOLL_INVALID_ARGUMENT, NULL);
  void *q[4] = {NULL, NULL, NULL, NULL};
  pthread_t ts[4];
  for (int i = 0; i < 4; i++) ck_assert_int_eq(pthread_create(&ts[i], NULL, alloc_in_thread, &q[i]), 0);
  for (int i = 0; i < 4; i++) {
    pthread_join(ts[i], &rv);
    ck_assert_int_eq((int)(intptr_t)rv, FLEXCOLL_SUCCESS);
    ck_assert_ptr_nonnull(q[i]);
  }
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++) ck_assert_ptr_ne(q[i], q[j]);
  for (int i = 0; i < 4; i++) EXPECT_OK(flexcoll_host_free(q[i]));
}
END_TEST

/* ---- main ------------------------------------------------------------------------------------- */

static Suite *host_window_suite(void) {
  Suite *s = suite_create("host_window");
  TCase *tc = tcase_create("alloc");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_alloc_args);
  tcase_add_test(tc, test_free_unknown);
  tcase_add_test(tc, test_alloc_memory);
  tcase_add_test(tc, test_alloc_fds);
  tcase_add_test(tc, test_alloc_threads);
  suite_add_tcase(s, tc);
  struct {
    const char *name;
    const TTest *test;
    int loops;
  } cases[] = {
      {"procs", test_procs, (int)(sizeof procs_runs / sizeof procs_runs[0])},
      {"threads", test_threads, (int)(sizeof threads_runs / sizeof threads_runs[0])},
      {"many", test_many, 2},
      {"group", test_group, 1},
      {"err_register", test_err_register, E_NCASES + 1},
      {"err_call", test_err_call, D_NCASES + 3},
      {"err_coll", test_err_coll, DC_NCASES + 5},
      {"free_busy", test_free_busy, 2},
      {"destroy_busy", test_destroy_busy, 2},
      {"devshm", test_devshm, 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tc = tcase_create(cases[i].name);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, cases[i].test, 0, cases[i].loops);
    suite_add_tcase(s, tc);
  }
  return s;
}

int main(void) {
  memset(poison_blk, HX_POISON, sizeof poison_blk);
  uint64_t seed = hx_seed(); /* chosen and printed once; the forked cases inherit it */
  double t0 = hx_now();
  SRunner *sr = srunner_create(host_window_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  fprintf(stderr, "[test_host_window] %s in %.1f s; FC_TEST_SEED=0x%016" PRIx64 " reproduces the data\n",
          failed ? "FAILED" : "passed", hx_now() - t0, seed);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
