/* test_soak.c — a long run of mixed, checked collectives on host memory (`make soak`; not part of
 * make check).  Issue 13: nothing may drift over 10^5 calls — no wrong result, no memory growth, no
 * descriptor or /dev/shm leak.
 *
 * Calls are split between three runs of tests/harness.c: 3 ranks as forked processes (1/2 of the
 * calls), 3 ranks as forked processes with every buffer in a host window (1/4, below), and 2 ranks
 * as threads of one process (flexcoll_comm_init_all, the rest).  Every call is drawn from the
 * run's seed and its index, the same on every rank: any of the six collectives, any datatype, any
 * op where it reduces, any root, in place or not, a count that is small (0-64 elements, 7 calls in
 * 8) or medium (up to 64 Ki elements); every buffer is checked against the reference, and the
 * guards around it (tests/pcall.c, harness.h).  The library chooses the algorithm as it does for
 * users.
 *
 * The window run: each rank allocates one flexcoll_host_alloc block and registers it whole as a
 * window (flexcoll_window_register; the peers' blocks must then be mapped in every rank, checked
 * in /proc/self/maps), with FLEXCOLL_SHM_WINDOW_MIN_BYTES=0, so that every windowed call of any
 * size takes the window mode (the default thresholds are test_host_window's).  The block holds a
 * send slot and a recv slot; each call's sendbuf (with its guards) goes at the send slot and its
 * recvbuf at the recv slot (in place: the one buffer at its slot), each shifted by a multiple of
 * the element size drawn with the call, the same on every rank: the buffers peers touch are at the
 * same offsets everywhere.  1 call in 4 shifts the buffer that peers need not agree on further by
 * rank x element size (reduce_scatter's and broadcast's recvbuf, allgather's sendbuf; reduce's and
 * alltoall's sendbuf); 1 call in 8 has its sendbuf on the heap instead, 1 in 8 its recvbuf (plain
 * paths, on every rank alike); broadcast's non-roots always pass a sendbuf there (host windows
 * decide broadcast's path on every rank's).  Reduce and alltoall have no window mode: they run
 * their usual paths on window memory.  Between calls the whole window is poison (each call's
 * buffers are poisoned again after its check), checked every 64 calls: a write anywhere outside a
 * call's buffers and guards, by the rank or a peer, shows.  At the end the window is deregistered
 * and freed: no mapping of it may be left, nor a descriptor more than before.
 *
 * Steadiness, per process (a rank; rank 0 in the threads run), between the warm-up (the first 10%
 * of the calls, which begin with the largest call of every collective, in place and not, in the
 * window run with both buffers in the window, so that the allocators and the mapped pages reach
 * their high-water marks) and the end: resident memory (/proc/self/statm) at the end exceeds the
 * warm-up's highest sample by less than 10% (plus 1 MiB, against allocator noise on small
 * processes), and the number of open descriptors at the end is the one at the warm-up's end.  Around the whole run: no /dev/shm entry is left behind (none new
 * is still there after up to 3 s).
 *
 * Environment: FC_SOAK_CALLS (default 100000: the total over the three runs), FC_TEST_SEED
 * (reproduces the calls and the data; each run salts it with its label), FC_SOAK_VERBOSE=0 (no
 * progress lines; by default rank 0 prints one every 10% of a run).
 * Exit 0: passed; 1: failed (why on stderr). */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "harness.h"
#include "pcall.h"

enum { SMALL_MAX = 64, MEDIUM_MAX = 64 * 1024 };
#define RSS_GROWTH 0.10
#define RSS_SLACK (1L << 20)

typedef struct {
  long calls;
  int verbose;
  int window; /* 1: the calls' buffers in a registered host window (see the header) */
} soak_t;

/* The window run: one flexcoll_host_alloc per rank, registered whole; two slots of slot_bytes()
 * each (the send region, then the recv region), each large enough for the largest buffer of the run
 * (n x MEDIUM_MAX float64: reduce_scatter's sendbuf, allgather's recvbuf, alltoall's) with its
 * guards and up to SHIFT_ROOM bytes of shift. */
#define SHIFT_ROOM 256
static size_t slot_bytes(int nranks) {
  size_t b = 2 * HX_GUARD + (size_t)nranks * MEDIUM_MAX * sizeof(double) + SHIFT_ROOM;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (b + pg - 1) / pg * pg;
}

static long rss_bytes(void) {
  long pages = -1, resident = -1;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * sysconf(_SC_PAGESIZE);
}


/* Draw call `call` of the run (the same on every rank) into p. */
static void draw(pcall_t *p, uint64_t seed, uint64_t call, int rank, int nranks) {
  uint64_t x = hx_mix64(seed ^ hx_mix64(call + 0x5eed));
  memset(p, 0, sizeof *p);
  p->coll = (int)(x % NCOLLS);
  x = hx_mix64(x);
  p->dtype = (flexcoll_datatype_t)(x % FLEXCOLL_NUM_DATATYPES);
  x = hx_mix64(x);
  p->op = (flexcoll_op_t)(x % FLEXCOLL_NUM_OPS);
  x = hx_mix64(x);
  p->root = (int)(x % (uint64_t)nranks);
  x = hx_mix64(x);
  p->inplace = (int)(x & 1);
  x = hx_mix64(x);
  p->count = (x & 7) ? (size_t)((x >> 3) % (SMALL_MAX + 1)) : (size_t)((x >> 3) % (MEDIUM_MAX + 1));
  if (call < 2 * NCOLLS) { /* first the largest calls, so that the warm-up reaches every high-water mark */
    p->coll = (int)(call % NCOLLS);
    p->dtype = FLEXCOLL_FLOAT64;
    p->count = MEDIUM_MAX;
    p->inplace = (int)(call / NCOLLS);
  }
  if (!coll_reduces(p->coll)) p->op = FLEXCOLL_SUM;
  p->rank = rank;
  p->nranks = nranks;
}

/* The buffer that the peers need not find at the same offset out of place (window mode:
 * reduce_scatter's and broadcast's recvbuf, allgather's sendbuf; reduce and alltoall have no window
 * mode: their sendbuf): 0 send, 1 recv, -1 none. */
static int unshared_buf(const pcall_t *p) {
  if (p->inplace) return -1;
  switch (p->coll) {
    case C_REDUCE_SCATTER:
    case C_BROADCAST: return 1;
    case C_ALLGATHER:
    case C_REDUCE:
    case C_ALLTOALL: return 0;
    default: return -1;
  }
}

/* Place call `call` (drawn into p) in the window win (2 slots of `slot` bytes): drawn from the seed
 * and the call the same on every rank, so that the shared buffers sit at the same offsets
 * everywhere.  Most calls have both buffers in the window, 1 in 8 its sendbuf on the heap, 1 in 8
 * its recvbuf (then a collective needing both takes the plain path; the first, largest calls
 * always in the window, so that the warm-up maps every page); each buffer shifted by a drawn
 * multiple of the element size (0-63 bytes, the same on every rank), and 1 call in 4 the unshared
 * buffer (unshared_buf) rank x element size further on this rank. */
static void place(pcall_place_t *pl, char *what, size_t n, const pcall_t *p, unsigned char *win, size_t slot,
                  uint64_t seed, uint64_t call) {
  const size_t es = fc_dtype_size(p->dtype);
  uint64_t x = hx_mix64(seed ^ hx_mix64(call + 0x91ace));
  const int heap = call < 2 * NCOLLS ? 0 : (int)(x & 7); /* 0: send on the heap, 1: recv */
  x = hx_mix64(x);
  size_t shift[2] = {(size_t)(x & 63) / es * es, (size_t)((x >> 6) & 63) / es * es};
  x = hx_mix64(x);
  const int u = unshared_buf(p);
  if (u >= 0 && (x & 3) == 0) shift[u] += (size_t)p->rank * es;
  pl->send = heap == 0 ? NULL : win + shift[0];
  pl->send_cap = slot - shift[0];
  pl->recv = heap == 1 ? NULL : win + slot + shift[1];
  pl->recv_cap = slot - shift[1];
  char s[48], r[48];
  if (pl->send) snprintf(s, sizeof s, "window + %zu", HX_GUARD + shift[0]);
  if (pl->recv) snprintf(r, sizeof r, "window + %zu", slot + HX_GUARD + shift[1]);
  snprintf(what, n, "buffers (if used): send %s, recv %s", pl->send ? s : "on the heap", pl->recv ? r : "on the heap");
  pl->what = what;
}

/* Between calls every byte of the window is poison (HX_POISON): each call's placed buffers are
 * poisoned again after its check, and every WINDOW_CHECK_EVERY calls (and after the last) the whole
 * window is checked, so that a write anywhere outside a call's buffers and guards, by this rank or
 * a peer, shows. */
#define WINDOW_CHECK_EVERY 64
static unsigned char poison_blk[1 << 16];

/* Bytes of [p, p + n) that are not poison; *first: the first one's offset. */
static size_t not_poison(const unsigned char *p, size_t n, size_t *first) {
  size_t bad = 0;
  for (size_t off = 0; off < n; off += sizeof poison_blk) {
    size_t k = n - off < sizeof poison_blk ? n - off : sizeof poison_blk;
    if (memcmp(p + off, poison_blk, k))
      for (size_t i = 0; i < k; i++)
        if (p[off + i] != HX_POISON && !bad++) *first = off + i;
  }
  return bad;
}

/* Mappings of flexcoll_host_alloc's memory files in this process (/proc/self/maps); -1 when unreadable. */
static int host_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "memfd:flexcoll-host")) n++;
  fclose(f);
  return n;
}

/* The window run's set-up: allocate, register, check that the peers' allocations are mapped here.
 * Returns 0, or 1 after reporting. */
static int window_open(hx_rank_t *r, void **base, size_t bytes, flexcoll_window_t *w) {
  snprintf(r->what, sizeof r->what, "flexcoll_host_alloc(%zu)", bytes);
  if (!hx_ok(r, flexcoll_host_alloc(bytes, base), NULL, "flexcoll_host_alloc")) return 1;
  snprintf(r->what, sizeof r->what, "flexcoll_window_register(%zu bytes)", bytes);
  memset(*base, HX_POISON, bytes);
  if (!hx_ok(r, flexcoll_window_register(r->comm, *base, bytes, w), r->comm, "flexcoll_window_register")) return 1;
  /* This rank's allocation and every peer's (processes: a mapping each); else the window would
   * silently take the plain paths. */
  int maps = host_maps();
  if (!r->thread_mode && maps >= 0 && maps < r->nranks)
    return hx_fail(r, "%d mapping(s) of host allocations after the registration, expected %d (this rank's and its "
                   "peers'): the window is not mapped into the peers", maps, r->nranks);
  return 0;
}

/* Deregister and free; afterwards no allocation may stay mapped.  Returns 0, or 1 after reporting. */
static int window_close(hx_rank_t *r, void *base, flexcoll_window_t w) {
  snprintf(r->what, sizeof r->what, "flexcoll_window_deregister");
  if (!hx_ok(r, flexcoll_window_deregister(r->comm, w), r->comm, "flexcoll_window_deregister")) return 1;
  snprintf(r->what, sizeof r->what, "flexcoll_host_free");
  if (!hx_ok(r, flexcoll_host_free(base), NULL, "flexcoll_host_free")) return 1;
  int maps = host_maps();
  if (maps > 0) return hx_fail(r, "%d mapping(s) of host allocations left after deregister and free", maps);
  return 0;
}

typedef struct {
  long rss;
  int fds;
} sample_t;

static sample_t sample(void) { return (sample_t){rss_bytes(), hx_open_fds()}; }

/* The ranks of a run: every rank issues the calls; the one that samples (every process rank; rank
 * 0 of the threads run) checks that its process stays steady. */
static int soak_rank(hx_rank_t *r) {
  const soak_t *s = r->arg;
  const long warm = s->calls / 10;
  const int samples = !r->thread_mode || r->rank == 0;
  sample_t start = {0, 0};
  void *wbase = NULL;
  flexcoll_window_t w = NULL;
  const size_t slot = slot_bytes(r->nranks);
  pcall_place_t pl;
  char where[128];
  if (s->window && window_open(r, &wbase, 2 * slot, &w)) return 1;
  double t0 = hx_now();
  for (long c = 0; c < s->calls; c++) {
    /* The start is the warm-up's high-water mark, not one sample at its end: the allocator gives
     * large freed blocks back and takes them again (RSS moved 14.4 -> 16.4 -> 14.6 -> 16.2 MiB
     * between progress lines of one run), and a sample at a low point read as 2-3 MiB grown. */
    if (samples && c <= warm && (c % 256 == 0 || c == warm)) {
      const long rss = rss_bytes();
      /* An unreadable sample (-1) stays, for the check below to report. */
      if (c == 0 || rss < 0 || (start.rss >= 0 && rss > start.rss)) start.rss = rss;
      if (c == warm) start.fds = hx_open_fds();
    }
    pcall_t p;
    draw(&p, r->seed, (uint64_t)c, r->rank, r->nranks);
    if (s->window) {
      place(&pl, where, sizeof where, &p, wbase, slot, r->seed, (uint64_t)c);
      p.place = &pl;
    }
    pcall_describe(r->what, sizeof r->what, &p);
    if (pcall_prepare(r, &p, r->seed, (uint64_t)c) != 0) {
      pcall_free(&p);
      return 1;
    }
    pcall_describe(r->what, sizeof r->what, &p);
    if (!hx_ok(r, pcall_issue(&p, r->comm), r->comm, coll_names[p.coll])) {
      pcall_free(&p);
      return 1; /* the ranks may be out of step now */
    }
    const hx_buf_t used[2] = {p.sb, p.rb};
    pcall_check(r, &p);
    if (r->errors) return 1;
    if (s->window) {
      for (int k = 0; k < 2; k++)
        if (used[k].base && (used[k].base == pl.send || used[k].base == pl.recv))
          memset(used[k].base, HX_POISON, 2 * HX_GUARD + used[k].bytes);
      if (c % WINDOW_CHECK_EVERY == WINDOW_CHECK_EVERY - 1 || c == s->calls - 1) {
        size_t first = 0, bad = not_poison(wbase, 2 * slot, &first);
        if (bad) {
          long from = c - c % WINDOW_CHECK_EVERY;
          snprintf(r->what, sizeof r->what, "window check after calls %ld-%ld", from, c);
          return hx_fail(r, "%zu byte(s) of this rank's window written outside every call's buffers and guards, "
                         "first at window + %zu (0x%02x)", bad, first, ((unsigned char *)wbase)[first]);
        }
      }
    }
    if (s->verbose && r->rank == 0 && s->calls >= 10 && (c + 1) % (s->calls / 10) == 0)
      fprintf(stderr, "[%s] rank 0: %ld of %ld calls, %.1f s, RSS %.1f MiB, %d fds\n", r->label, c + 1, s->calls,
              hx_now() - t0, rss_bytes() / 1048576.0, hx_open_fds());
  }
  sample_t end = {0, 0};
  if (samples) end = sample();
  if (s->window && window_close(r, wbase, w)) return 1;
  if (!samples) return 0;
  /* Deregistering and freeing must not have left a descriptor behind. */
  int fds_after = hx_open_fds();
  if (s->window && fds_after > end.fds)
    hx_fail(r, "open descriptors went from %d to %d over flexcoll_window_deregister and flexcoll_host_free", end.fds,
            fds_after);
  snprintf(r->what, sizeof r->what, "steadiness over calls %ld-%ld", warm, s->calls);
  fprintf(stderr, "[%s] rank %d: %ld calls in %.1f s; after warm-up RSS %.1f -> %.1f MiB, fds %d -> %d\n", r->label,
          r->rank, s->calls, hx_now() - t0, start.rss / 1048576.0, end.rss / 1048576.0, start.fds, end.fds);
  if (start.rss < 0 || end.rss < 0 || start.fds < 0 || end.fds < 0)
    return hx_fail(r, "cannot read /proc/self/statm or /proc/self/fd");
  if (end.rss > (long)(start.rss * (1 + RSS_GROWTH)) + RSS_SLACK)
    hx_fail(r, "resident memory grew from %.1f to %.1f MiB (more than %.0f%% + 1 MiB)", start.rss / 1048576.0,
            end.rss / 1048576.0, RSS_GROWTH * 100);
  if (end.fds != start.fds) hx_fail(r, "open descriptors went from %d to %d", start.fds, end.fds);
  return r->errors != 0;
}

int main(void) {
  const char *e = getenv("FC_SOAK_CALLS");
  long total = e ? strtol(e, NULL, 0) : 100000;
  if (total < 4) {
    fprintf(stderr, "test_soak: FC_SOAK_CALLS=%s: at least 4 calls\n", e);
    return 1;
  }
  e = getenv("FC_SOAK_VERBOSE");
  int verbose = !e || atoi(e);
  uint64_t seed = hx_seed();
  memset(poison_blk, HX_POISON, sizeof poison_blk);
  int nshm0;
  char **shm0 = hx_list_names("/dev/shm", "", &nshm0);
  double t0 = hx_now();

  soak_t procs = {total - 2 * (total / 4), verbose, 0}, windows = {total / 4, verbose, 1},
         threads = {total / 4, verbose, 0};
  /* 60 s of timeout per call is far more than any of these takes: a hang still ends the run. */
  static const char *const win_env[] = {"FLEXCOLL_SHM_WINDOW_MIN_BYTES=0", NULL};
  hx_opts_t po = {.label = "soak procs", .deadline_s = 3600, .timeout_ms = 60000, .exit_barrier = 1};
  hx_opts_t wo = {.label = "soak windows", .deadline_s = 3600, .timeout_ms = 60000, .exit_barrier = 1,
                  .env = win_env};
  hx_opts_t to = {.label = "soak threads", .deadline_s = 3600, .timeout_ms = 60000, .exit_barrier = 1};
  int ok = hx_run_procs(3, &po, soak_rank, &procs);
  ok = hx_run_procs(3, &wo, soak_rank, &windows) && ok;
  ok = hx_run_threads(2, &to, soak_rank, &threads) && ok;

  /* New entries still there after up to 3 s (a test running alongside may hold a short-lived one). */
  int leaked = 0;
  for (int attempt = 0; attempt < 30; attempt++) {
    int nshm1;
    char **shm1 = hx_list_names("/dev/shm", "", &nshm1);
    leaked = 0;
    for (int i = 0; i < nshm1; i++) {
      int known = 0;
      for (int j = 0; j < nshm0 && !known; j++) known = !strcmp(shm1[i], shm0[j]);
      if (!known) {
        if (attempt == 29) fprintf(stderr, "test_soak: /dev/shm/%s was left behind\n", shm1[i]);
        leaked++;
      }
    }
    hx_names_free(shm1, nshm1);
    if (!leaked) break;
    usleep(100 * 1000);
  }
  hx_names_free(shm0, nshm0);
  ok = ok && !leaked;
  fprintf(stderr, "test_soak: %s: %ld mixed checked calls in %.1f s (3 processes, 3 processes on host windows, "
          "then 2 threads); FC_TEST_SEED=0x%016" PRIx64 " reproduces them\n",
          ok ? "passed" : "FAILED", total, hx_now() - t0, seed);
  return ok ? 0 : 1;
}
