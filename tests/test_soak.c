/* test_soak.c — a long run of mixed, checked collectives on host memory (`make soak`; not part of
 * make check).  Issue 13: nothing may drift over 10^5 calls — no wrong result, no memory growth, no
 * descriptor or /dev/shm leak.
 *
 * Calls are split between two runs of tests/harness.c: 3 ranks as forked processes (3/4 of the
 * calls) and 2 ranks as threads of one process (flexcoll_comm_init_all, the rest).  Every call is
 * drawn from the run's seed and its index, the same on every rank: any of the six collectives, any
 * datatype, any op where it reduces, any root, in place or not, a count that is small (0-64
 * elements, 7 calls in 8) or medium (up to 64 Ki elements); every buffer is checked against the
 * reference (tests/pcall.c, harness.h).  The library chooses the algorithm as it does for users.
 *
 * Steadiness, per process (a rank; rank 0 in the threads run), between the end of the warm-up (the
 * first 10% of the calls, which begin with the largest call of every collective, in place and
 * not, so that the allocators reach their high-water marks) and the end: resident memory (/proc/self/statm) grows less than 10%
 * (plus 1 MiB, against allocator noise on small processes), and the number of open descriptors
 * does not change.  Around the whole run: no /dev/shm entry is left behind.
 *
 * Environment: FC_SOAK_CALLS (default 100000: the total over both runs), FC_TEST_SEED (reproduces
 * the calls and the data), FC_SOAK_VERBOSE=0 (no progress lines; by default rank 0 prints one every
 * 10% of a run).
 * Exit 0: passed; 1: failed (why on stderr). */
#define _GNU_SOURCE
#include <dirent.h>
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
} soak_t;

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static long rss_bytes(void) {
  long pages = -1, resident = -1;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * sysconf(_SC_PAGESIZE);
}

/* Open descriptors of this process (without the one that lists them); -1 when unreadable. */
static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n - 1; /* the descriptor of d itself */
}

/* The names in /dev/shm, one allocated string each; *n of them. */
static char **shm_list(int *n) {
  *n = 0;
  DIR *d = opendir("/dev/shm");
  if (!d) return NULL;
  char **v = NULL;
  int cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 64;
      char **w = realloc(v, (size_t)cap * sizeof *v);
      if (!w) break;
      v = w;
    }
    v[(*n)++] = strdup(e->d_name);
  }
  closedir(d);
  return v;
}

static void shm_free(char **v, int n) {
  for (int i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* Draw call `call` of the run (the same on every rank) into p. */
static void draw(pcall_t *p, uint64_t seed, uint64_t call, int rank, int nranks) {
  uint64_t x = mix64(seed ^ mix64(call + 0x5eed));
  memset(p, 0, sizeof *p);
  p->coll = (int)(x % NCOLLS);
  x = mix64(x);
  p->dtype = (flexcoll_datatype_t)(x % FLEXCOLL_NUM_DATATYPES);
  x = mix64(x);
  p->op = (flexcoll_op_t)(x % FLEXCOLL_NUM_OPS);
  x = mix64(x);
  p->root = (int)(x % (uint64_t)nranks);
  x = mix64(x);
  p->inplace = (int)(x & 1);
  x = mix64(x);
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

typedef struct {
  long rss;
  int fds;
} sample_t;

static sample_t sample(void) { return (sample_t){rss_bytes(), open_fds()}; }

/* The ranks of a run: every rank issues the calls; the one that samples (every process rank; rank
 * 0 of the threads run) checks that its process stays steady. */
static int soak_rank(hx_rank_t *r) {
  const soak_t *s = r->arg;
  const long warm = s->calls / 10;
  const int samples = !r->thread_mode || r->rank == 0;
  sample_t start = {0, 0};
  double t0 = hx_now();
  for (long c = 0; c < s->calls; c++) {
    if (c == warm && samples) start = sample();
    pcall_t p;
    draw(&p, r->seed, (uint64_t)c, r->rank, r->nranks);
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
    pcall_check(r, &p);
    if (r->errors) return 1;
    if (s->verbose && r->rank == 0 && s->calls >= 10 && (c + 1) % (s->calls / 10) == 0)
      fprintf(stderr, "[%s] rank 0: %ld of %ld calls, %.1f s, RSS %.1f MiB, %d fds\n", r->label, c + 1, s->calls,
              hx_now() - t0, rss_bytes() / 1048576.0, open_fds());
  }
  if (!samples) return 0;
  sample_t end = sample();
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
  int nshm0;
  char **shm0 = shm_list(&nshm0);
  double t0 = hx_now();

  soak_t procs = {total - total / 4, verbose}, threads = {total / 4, verbose};
  /* 60 s of timeout per call is far more than any of these takes: a hang still ends the run. */
  hx_opts_t po = {.label = "soak procs", .deadline_s = 3600, .timeout_ms = 60000, .exit_barrier = 1};
  hx_opts_t to = {.label = "soak threads", .deadline_s = 3600, .timeout_ms = 60000, .exit_barrier = 1};
  int ok = hx_run_procs(3, &po, soak_rank, &procs);
  ok = hx_run_threads(2, &to, soak_rank, &threads) && ok;

  int nshm1;
  char **shm1 = shm_list(&nshm1);
  int leaked = 0;
  for (int i = 0; i < nshm1; i++) {
    int known = 0;
    for (int j = 0; j < nshm0 && !known; j++) known = !strcmp(shm1[i], shm0[j]);
    if (!known) {
      fprintf(stderr, "test_soak: /dev/shm/%s was left behind\n", shm1[i]);
      leaked++;
    }
  }
  shm_free(shm0, nshm0);
  shm_free(shm1, nshm1);
  ok = ok && !leaked;
  fprintf(stderr, "test_soak: %s: %ld mixed checked calls in %.1f s (3 processes, then 2 threads); "
          "FC_TEST_SEED=0x%016" PRIx64 " reproduces them\n", ok ? "passed" : "FAILED", total, hx_now() - t0, seed);
  return ok ? 0 : 1;
}
