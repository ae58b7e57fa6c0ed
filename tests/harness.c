/* harness.c — see harness.h. */
#define _GNU_SOURCE
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"

/* ---- seed, hashing, time ---------------------------------------------------------------------- */

uint64_t hx_mix64(uint64_t x) { /* splitmix64's finaliser */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

static pthread_once_t seed_once = PTHREAD_ONCE_INIT;
static uint64_t seed_value;

static void seed_init(void) {
  const char *s = getenv("FC_TEST_SEED");
  if (s && *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end) {
      fprintf(stderr, "[hx] FC_TEST_SEED=%s is not a number; ignoring it\n", s);
    } else {
      seed_value = v;
      fprintf(stderr, "[hx] seed 0x%016" PRIx64 " (from FC_TEST_SEED)\n", seed_value);
      return;
    }
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  seed_value = hx_mix64((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec) ^ hx_mix64((uint64_t)getpid() << 20);
  fprintf(stderr, "[hx] seed 0x%016" PRIx64 " (FC_TEST_SEED=0x%016" PRIx64 " reproduces this run)\n", seed_value,
          seed_value);
}

uint64_t hx_seed(void) {
  pthread_once(&seed_once, seed_init);
  return seed_value;
}

uint64_t hx_hash_str(const char *s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
  return hx_mix64(h);
}

double hx_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- reporting -------------------------------------------------------------------------------- */

static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

static void vreport(hx_rank_t *r, const char *fmt, va_list ap) {
  if (r->reports == HX_MAX_REPORTS) {
    r->reports++;
    fprintf(stderr, "[%s] rank %d/%d: more failures; not printing them\n", r->label, r->rank, r->nranks);
    return;
  }
  if (r->reports > HX_MAX_REPORTS) return;
  r->reports++;
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  pthread_mutex_lock(&print_lock);
  fprintf(stderr, "[%s] FAIL rank %d/%d%s%s (FC_TEST_SEED=0x%016" PRIx64 "): %s: %s\n", r->label, r->rank, r->nranks,
          r->algo ? " FLEXCOLL_ALGO=" : "", r->algo ? r->algo : "", hx_seed(), r->what[0] ? r->what : "-", msg);
  fflush(stderr);
  pthread_mutex_unlock(&print_lock);
}

int hx_fail(hx_rank_t *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  r->errors++;
  vreport(r, fmt, ap);
  va_end(ap);
  return 1;
}

/* A report line that does not count as an error by itself (the caller counts). */
static void note(hx_rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(hx_rank_t *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(r, fmt, ap);
  va_end(ap);
}

int hx_ok(hx_rank_t *r, flexcoll_result_t res, flexcoll_comm_t comm, const char *call) {
  if (res == FLEXCOLL_SUCCESS) return 1;
  const char *why = flexcoll_get_last_error(comm);
  hx_fail(r, "%s returned %d (%s): %s", call, (int)res, flexcoll_get_error_string(res), why ? why : "(no message)");
  return 0;
}

/* ---- environment and processes ---------------------------------------------------------------- */

void hx_apply_env(const hx_opts_t *o) {
  if (o->algo) setenv("FLEXCOLL_ALGO", o->algo, 1);
  else unsetenv("FLEXCOLL_ALGO");
  if (o->timeout_ms >= 0) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d", o->timeout_ms ? o->timeout_ms : 60000);
    setenv("FLEXCOLL_TIMEOUT_MS", buf, 1);
  }
  for (const char *const *e = o->env; e && *e; e++) {
    const char *eq = strchr(*e, '=');
    if (!eq) { unsetenv(*e); continue; }
    char name[256];
    size_t n = (size_t)(eq - *e) < sizeof name - 1 ? (size_t)(eq - *e) : sizeof name - 1;
    memcpy(name, *e, n);
    name[n] = '\0';
    setenv(name, eq + 1, 1);
  }
}

/* In a fresh child: die with the parent, and never return into the test framework. */
static void child_setup(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(3);
}

static void child_exit(int rc) {
  fflush(stdout);
  fflush(stderr);
  _exit(rc ? 1 : 0);
}

static const char *describe_status(int st, char *buf, size_t n) {
  if (WIFEXITED(st)) snprintf(buf, n, "exited with status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st)) snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else snprintf(buf, n, "ended with wait status 0x%x", st);
  return buf;
}

/* Best effort: the stacks of a stuck process, through gdb when it is installed (FC_TEST_BACKTRACE=0
 * turns it off). */
static void print_backtrace(pid_t pid) {
  const char *e = getenv("FC_TEST_BACKTRACE");
  if (e && !atoi(e)) return;
  if (system("command -v gdb >/dev/null 2>&1") != 0) return;
  char cmd[256];
  snprintf(cmd, sizeof cmd,
           "timeout 60 gdb -p %d -batch -nx -ex 'thread apply all bt' 2>/dev/null | grep -E '^(Thread|#)' | head -80 >&2",
           (int)pid);
  fflush(stderr);
  if (system(cmd) != 0) fprintf(stderr, "[hx] (no backtrace of pid %d)\n", (int)pid);
}

/* Wait for the n children until the deadline, then kill the rest.  Returns 1 when all exited 0. */
static int wait_children(const pid_t *pids, int n, double deadline, double grace_s, const char *label, const char *what,
                         int quiet) {
  int *done = calloc((size_t)n, sizeof *done), *status = calloc((size_t)n, sizeof *status);
  if (!done || !status) { perror("calloc"); abort(); }
  int left = 0;
  for (int i = 0; i < n; i++) left += pids[i] > 0;
  for (int i = 0; i < n; i++) done[i] = pids[i] <= 0;
  while (left > 0) {
    int progressed = 0;
    for (int i = 0; i < n; i++) {
      if (done[i]) continue;
      pid_t p = waitpid(pids[i], &status[i], WNOHANG);
      if (p == pids[i] || (p < 0 && errno == ECHILD)) {
        if (p < 0) status[i] = 0x7f00; /* reaped by someone else: treat as failure */
        done[i] = 1;
        left--;
        progressed = 1;
        /* Once a rank has failed, the others fail too (peer lost, or their timeout): do not wait
         * for the full deadline for one that hangs. */
        int failed = !(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0);
        if (failed && deadline > hx_now() + grace_s) deadline = hx_now() + grace_s;
      }
    }
    if (!left) break;
    if (hx_now() > deadline) {
      for (int i = 0; i < n; i++)
        if (!done[i]) {
          /* Where it is stuck, for the report (kernel wait channel; a debugger tells more). */
          char path[64], wchan[64] = "?";
          snprintf(path, sizeof path, "/proc/%d/wchan", (int)pids[i]);
          FILE *f = fopen(path, "r");
          if (f) {
            size_t k = fread(wchan, 1, sizeof wchan - 1, f);
            wchan[k] = '\0';
            fclose(f);
          }
          /* Said even where failures are expected (a rank killed on purpose): a rank still
           * running at the deadline hung, which no test expects. */
          fprintf(stderr, "[%s] %s %d (pid %d) still running at the deadline (waiting in %s): killing it\n", label,
                  what, i, (int)pids[i], wchan[0] ? wchan : "?");
          print_backtrace(pids[i]);
          kill(pids[i], SIGKILL);
        }
      for (int i = 0; i < n; i++)
        if (!done[i]) {
          while (waitpid(pids[i], &status[i], 0) < 0 && errno == EINTR) {}
          done[i] = 2; /* killed at the deadline */
        }
      left = 0;
      break;
    }
    if (!progressed) {
      struct timespec ts = {0, 5 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  int ok = 1;
  for (int i = 0; i < n; i++) {
    int good = done[i] == 1 && WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0;
    if (good) continue;
    ok = 0;
    if (quiet) continue;
    char buf[128];
    if (done[i] == 2)
      fprintf(stderr, "[%s] %s %d (pid %d) did not finish before the deadline: killed\n", label, what, i, (int)pids[i]);
    else
      fprintf(stderr, "[%s] %s %d (pid %d) %s\n", label, what, i, (int)pids[i], describe_status(status[i], buf, sizeof buf));
  }
  free(done);
  free(status);
  return ok;
}

/* After a first rank failed: long enough for the others to notice (a lost peer within
 * milliseconds, a hung one within their timeout) and report their own view. */
static double grace_of(const hx_opts_t *o) {
  int t = o->timeout_ms > 0 ? o->timeout_ms : 60000;
  return o->timeout_ms < 0 ? 75.0 : t / 1000.0 + 15.0;
}

static double deadline_of(const hx_opts_t *o) { return hx_now() + (o->deadline_s > 0 ? o->deadline_s : 300.0); }

static void timing_line(const hx_opts_t *o, const char *mode, int nranks, double t0, int ok) {
  fprintf(stderr, "[hx] %-34s %-7s %2d ranks%s%-5s %8.2f s  %s\n", o->label, mode, nranks, o->algo ? "  algo=" : "       ",
          o->algo ? o->algo : "", hx_now() - t0, ok ? "ok" : (o->expect_fail ? "failed (expected)" : "FAILED"));
  fflush(stderr);
}

void hx_rank_init(hx_rank_t *r, const hx_opts_t *o, int rank, int nranks, void *arg) {
  memset(r, 0, sizeof *r);
  r->rank = rank;
  r->nranks = nranks;
  r->seed = hx_seed() ^ hx_hash_str(o->label);
  r->label = o->label;
  r->algo = o->algo;
  r->arg = arg;
}

/* The exit barrier: every rank arrives, then waits (at most timeout_ms + 5 s) for the others. */
static void exit_barrier(atomic_int *arrived, int nranks, const hx_opts_t *o) {
  if (!arrived) return;
  atomic_fetch_add(arrived, 1);
  double limit = hx_now() + (o->timeout_ms > 0 ? o->timeout_ms : 60000) / 1000.0 + 5.0;
  while (atomic_load(arrived) < nranks && hx_now() < limit) {
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static int proc_rank_main(const hx_opts_t *o, int rank, int nranks, const flexcoll_unique_id_t *ids, int ncomms,
                          hx_rank_fn fn, void *arg, atomic_int *arrived) {
  hx_apply_env(o);
  /* Which rank this process is, for test seams that act on one rank (the fake's nodev@R). */
  char rank_s[16];
  snprintf(rank_s, sizeof rank_s, "%d", rank);
  setenv("FC_TEST_RANK", rank_s, 1);
  if (o->hosts > 1) {
    char host[32];
    snprintf(host, sizeof host, "hx-host-%d", rank % o->hosts);
    setenv("FLEXCOLL_HOSTID", host, 1);
  }
  hx_rank_t r;
  hx_rank_init(&r, o, rank, nranks, arg);
  r.ncomms = ncomms;
  snprintf(r.what, sizeof r.what, "flexcoll_comm_init_rank");
  for (int k = 0; k < ncomms; k++) {
    flexcoll_result_t res = flexcoll_comm_init_rank(&r.comms[k], nranks, ids[k], rank, NULL);
    if (!hx_ok(&r, res, NULL, "flexcoll_comm_init_rank")) return 1;
  }
  r.comm = r.comms[0];
  r.what[0] = '\0';
  int rc = fn(&r);
  exit_barrier(arrived, nranks, o);
  if (rc == 0 && r.errors == 0) snprintf(r.what, sizeof r.what, "flexcoll_comm_destroy");
  for (int k = 0; k < ncomms; k++) {
    flexcoll_result_t res = flexcoll_comm_destroy(r.comms[k]);
    if (res != FLEXCOLL_SUCCESS) hx_fail(&r, "flexcoll_comm_destroy returned %d", (int)res);
  }
  return rc != 0 || r.errors != 0;
}

/* A child's side of the id pipe: the ncomms ids, or 0 when the parent closed it without them. */
static int read_ids(int fd, flexcoll_unique_id_t *ids, int ncomms) {
  size_t want = (size_t)ncomms * sizeof *ids, got = 0;
  while (got < want) {
    ssize_t k = read(fd, (char *)ids + got, want - got);
    if (k > 0) got += (size_t)k;
    else if (k == 0 || errno != EINTR) return 0;
  }
  return 1;
}

int hx_run_procs(int nranks, const hx_opts_t *o, hx_rank_fn fn, void *arg) {
  double t0 = hx_now(), deadline = deadline_of(o);
  int ncomms = o->ncomms > 0 ? o->ncomms : 1;
  if (ncomms > HX_MAX_COMMS || nranks < 1) {
    fprintf(stderr, "[%s] hx_run_procs: bad arguments (nranks %d, ncomms %d)\n", o->label, nranks, ncomms);
    return 0;
  }
  (void)hx_seed(); /* printed by the parent, once */
  pid_t *pids = calloc((size_t)nranks, sizeof *pids);
  if (!pids) { perror("calloc"); return 0; }
  atomic_int *arrived = NULL;
  if (o->exit_barrier) {
    void *m = mmap(NULL, sizeof *arrived, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); free(pids); return 0; }
    arrived = m;
    atomic_init(arrived, 0);
  }
  /* The ranks are forked first and get the ids through a pipe: flexcoll_get_unique_id starts the
   * root's thread, and a process forked while another thread holds a lock (in malloc, in ASan's
   * allocator as the thread starts or ends, in UCX's hooks) inherits the lock held by nobody; the
   * child then hangs in its first ucp_init.  Forking before any thread starts rules that out. */
  int idp[2];
  if (pipe2(idp, O_CLOEXEC) != 0) {
    perror("pipe2");
    free(pids);
    if (arrived) munmap(arrived, sizeof *arrived);
    return 0;
  }
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  int ok = 1;
  for (int i = 0; i < nranks; i++) {
    pid_t p = fork();
    if (p < 0) {
      fprintf(stderr, "[%s] fork: %s\n", o->label, strerror(errno));
      ok = 0;
      break;
    }
    if (p == 0) {
      child_setup(parent);
      close(idp[1]);
      flexcoll_unique_id_t ids[HX_MAX_COMMS];
      if (!read_ids(idp[0], ids, ncomms)) _exit(1); /* the parent failed and says why */
      close(idp[0]);
      child_exit(proc_rank_main(o, i, nranks, ids, ncomms, fn, arg, arrived));
    }
    pids[i] = p;
  }
  flexcoll_unique_id_t ids[HX_MAX_COMMS];
  for (int k = 0; ok && k < ncomms; k++) {
    flexcoll_result_t res = flexcoll_get_unique_id(&ids[k]);
    if (res != FLEXCOLL_SUCCESS) {
      fprintf(stderr, "[%s] flexcoll_get_unique_id returned %d: %s\n", o->label, (int)res, flexcoll_get_last_error(NULL));
      ok = 0;
    }
  }
  /* Every rank reads the same bytes, so it matters not which copy a rank gets.  The parent keeps
   * the read end open meanwhile: no SIGPIPE when ranks have died. */
  for (int i = 0; ok && i < nranks; i++) {
    const char *b = (const char *)ids;
    size_t left = (size_t)ncomms * sizeof *ids;
    while (left > 0) {
      ssize_t k = write(idp[1], b, left);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        fprintf(stderr, "[%s] writing the ids to the ranks: %s\n", o->label, strerror(errno));
        ok = 0;
        break;
      }
      b += k, left -= (size_t)k;
    }
  }
  close(idp[0]);
  close(idp[1]);
  if (!ok) { /* do not leave the forked ranks waiting for the missing ones */
    for (int i = 0; i < nranks; i++)
      if (pids[i] > 0) kill(pids[i], SIGKILL);
  }
  ok = wait_children(pids, nranks, deadline, grace_of(o), o->label, "rank", o->expect_fail) && ok;
  free(pids);
  if (arrived) munmap(arrived, sizeof *arrived);
  timing_line(o, "procs", nranks, t0, ok);
  return ok;
}

typedef struct {
  hx_rank_t r;
  hx_rank_fn fn;
  int rc;
  pthread_t thread;
  atomic_int *arrived; /* exit barrier, NULL: none */
  const hx_opts_t *opts;
} thread_rank_t;

/* Each thread destroys its own rank when done, as a thread-per-rank program does. */
static void *thread_main(void *arg) {
  thread_rank_t *t = arg;
  t->rc = t->fn(&t->r);
  exit_barrier(t->arrived, t->r.nranks, t->opts);
  if (t->rc == 0 && t->r.errors == 0) snprintf(t->r.what, sizeof t->r.what, "flexcoll_comm_destroy");
  flexcoll_result_t res = flexcoll_comm_destroy(t->r.comm);
  if (res != FLEXCOLL_SUCCESS) hx_fail(&t->r, "flexcoll_comm_destroy returned %d", (int)res);
  return NULL;
}

static int threads_main(const hx_opts_t *o, int nranks, hx_rank_fn fn, void *arg) {
  hx_apply_env(o);
  /* Host ranks on every machine: init_all(NULL) puts rank i on GPU i where there are GPUs. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  flexcoll_comm_t *comms = calloc((size_t)nranks, sizeof *comms);
  thread_rank_t *t = calloc((size_t)nranks, sizeof *t);
  if (!comms || !t) { perror("calloc"); return 1; }
  flexcoll_result_t res = flexcoll_comm_init_all(comms, nranks, NULL);
  if (res != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "[%s] FAIL flexcoll_comm_init_all(%d) returned %d (%s): %s (FC_TEST_SEED=0x%016" PRIx64 ")\n",
            o->label, nranks, (int)res, flexcoll_get_error_string(res), flexcoll_get_last_error(NULL), hx_seed());
    return 1;
  }
  static atomic_int arrived;
  atomic_init(&arrived, 0);
  for (int i = 0; i < nranks; i++) {
    t[i].arrived = o->exit_barrier ? &arrived : NULL;
    t[i].opts = o;
    hx_rank_init(&t[i].r, o, i, nranks, arg);
    t[i].r.comm = t[i].r.comms[0] = comms[i];
    t[i].r.ncomms = 1;
    t[i].r.thread_mode = 1;
    t[i].fn = fn;
  }
  int started = 0, rc = 0;
  for (; started < nranks; started++) {
    int e = pthread_create(&t[started].thread, NULL, thread_main, &t[started]);
    if (e) {
      fprintf(stderr, "[%s] pthread_create: %s\n", o->label, strerror(e));
      /* The started ranks wait for this one: nothing to do but leave (the parent reports). */
      return 1;
    }
  }
  for (int i = 0; i < nranks; i++) {
    pthread_join(t[i].thread, NULL);
    if (t[i].rc || t[i].r.errors) rc = 1;
  }
  free(comms);
  free(t);
  return rc;
}

int hx_run_threads(int nranks, const hx_opts_t *o, hx_rank_fn fn, void *arg) {
  double t0 = hx_now(), deadline = deadline_of(o);
  (void)hx_seed();
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  pid_t p = fork();
  if (p < 0) {
    fprintf(stderr, "[%s] fork: %s\n", o->label, strerror(errno));
    return 0;
  }
  if (p == 0) {
    child_setup(parent);
    child_exit(threads_main(o, nranks, fn, arg));
  }
  int ok = wait_children(&p, 1, deadline, grace_of(o), o->label, "threads process", o->expect_fail);
  timing_line(o, "threads", nranks, t0, ok);
  return ok;
}

int hx_run_process(const hx_opts_t *o, hx_proc_fn fn, void *arg) {
  double t0 = hx_now(), deadline = deadline_of(o);
  (void)hx_seed();
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  pid_t p = fork();
  if (p < 0) {
    fprintf(stderr, "[%s] fork: %s\n", o->label, strerror(errno));
    return 0;
  }
  if (p == 0) {
    child_setup(parent);
    hx_apply_env(o);
    child_exit(fn(arg));
  }
  int ok = wait_children(&p, 1, deadline, grace_of(o), o->label, "process", o->expect_fail);
  timing_line(o, "process", 1, t0, ok);
  return ok;
}

/* ---- data ------------------------------------------------------------------------------------- */

hx_gen_t hx_gen_for_op(flexcoll_op_t op) {
  switch (op) {
    case FLEXCOLL_PROD: return HX_GEN_PROD;
    case FLEXCOLL_MAX:
    case FLEXCOLL_MIN: return HX_GEN_MAXMIN;
    default: return HX_GEN_SUM;
  }
}

static uint64_t rank_key(const hx_data_t *d, int rank) {
  return hx_mix64(hx_mix64(d->seed ^ hx_mix64(d->call * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL)) ^
               ((uint64_t)(rank + 1) * 0xd6e8feb86659fd93ULL));
}

/* The helpers below are always inlined: the fill and check loops are stamped out once per
 * (datatype, generator) pair (HX_SPECIALIZE) so that these switches fold away; the references of
 * 1M-element calls on 8 ranks are most of the test's time. */
#define HX_INLINE static inline __attribute__((always_inline))

HX_INLINE int is_signed_int(flexcoll_datatype_t t) {
  return t == FLEXCOLL_INT8 || t == FLEXCOLL_INT32 || t == FLEXCOLL_INT64;
}

HX_INLINE uint64_t type_mask(size_t esize) { return esize >= 8 ? ~0ULL : ((1ULL << (8 * esize)) - 1); }

/* Sign- or zero-extend the low esize bytes of v. */
HX_INLINE uint64_t extend(uint64_t v, size_t esize, int is_signed) {
  v &= type_mask(esize);
  if (is_signed && esize < 8 && (v >> (8 * esize - 1)) & 1) v |= ~type_mask(esize);
  return v;
}

HX_INLINE void store_bits(void *out, size_t esize, uint64_t v) {
  switch (esize) {
    case 1: *(uint8_t *)out = (uint8_t)v; break;
    case 2: *(uint16_t *)out = (uint16_t)v; break;
    case 4: *(uint32_t *)out = (uint32_t)v; break;
    default: *(uint64_t *)out = v; break;
  }
}

HX_INLINE uint64_t load_bits(const void *in, size_t esize) {
  switch (esize) {
    case 1: return *(const uint8_t *)in;
    case 2: return *(const uint16_t *)in;
    case 4: return *(const uint32_t *)in;
    default: return *(const uint64_t *)in;
  }
}

/* The value of a float element's bits. */
HX_INLINE double float_value(flexcoll_datatype_t t, uint64_t bits) {
  switch (t) {
    case FLEXCOLL_FLOAT16: return fc_half_to_float((uint16_t)bits);
    case FLEXCOLL_BFLOAT16: return fc_bf16_to_float((uint16_t)bits);
    case FLEXCOLL_FLOAT32: {
      uint32_t u = (uint32_t)bits;
      float f;
      memcpy(&f, &u, sizeof f);
      return f;
    }
    default: {
      double f;
      memcpy(&f, &bits, sizeof f);
      return f;
    }
  }
}

/* Element j of the input with key: its bits (in the low bytes) and, for floats, its value. */
HX_INLINE uint64_t elem_k(flexcoll_datatype_t t, hx_gen_t gen, uint64_t key, size_t j, double *val) {
  uint64_t h = hx_mix64(key + (uint64_t)j * 0x9e3779b97f4a7c15ULL);
  size_t esize = fc_dtype_size(t);
  if (gen == HX_GEN_BITS) {
    if (val) *val = fc_dtype_is_float(t) ? float_value(t, h & type_mask(esize)) : 0.0;
    return h & type_mask(esize);
  }
  if (!fc_dtype_is_float(t)) {
    uint64_t v = h;
    if (gen == HX_GEN_PROD) {
      v = 1 + (h & 3);
      if (is_signed_int(t) && (h & 4)) v = (uint64_t)0 - v;
    }
    if (val) *val = 0.0;
    return v & type_mask(esize);
  }
  double u01 = (double)(h >> 11) * 0x1p-53;
  double x = gen == HX_GEN_SUM ? u01 * 8.0 - 4.0 : gen == HX_GEN_PROD ? 0.5 + u01 : u01 * 2000.0 - 1000.0;
  uint64_t bits;
  switch (t) {
    case FLEXCOLL_FLOAT16: bits = fc_float_to_half((float)x); break;
    case FLEXCOLL_BFLOAT16: bits = fc_float_to_bf16((float)x); break;
    case FLEXCOLL_FLOAT32: {
      float f = (float)x;
      uint32_t u;
      memcpy(&u, &f, sizeof u);
      bits = u;
      break;
    }
    default: memcpy(&bits, &x, sizeof bits); break;
  }
  if (val) *val = float_value(t, bits);
  return bits;
}

/* Run CALL with the constants T_ (datatype) and G_ (generator) equal to t and g. */
#define HX_SPEC_G(TC, g, CALL)                                                              \
  switch (g) {                                                                              \
    case HX_GEN_BITS: { const flexcoll_datatype_t T_ = TC; const hx_gen_t G_ = HX_GEN_BITS; CALL; } break; \
    case HX_GEN_SUM: { const flexcoll_datatype_t T_ = TC; const hx_gen_t G_ = HX_GEN_SUM; CALL; } break;   \
    case HX_GEN_PROD: { const flexcoll_datatype_t T_ = TC; const hx_gen_t G_ = HX_GEN_PROD; CALL; } break; \
    default: { const flexcoll_datatype_t T_ = TC; const hx_gen_t G_ = HX_GEN_MAXMIN; CALL; } break;        \
  }
#define HX_SPECIALIZE(t, g, CALL)                                    \
  switch (t) {                                                       \
    case FLEXCOLL_INT8: HX_SPEC_G(FLEXCOLL_INT8, g, CALL); break;     \
    case FLEXCOLL_UINT8: HX_SPEC_G(FLEXCOLL_UINT8, g, CALL); break;   \
    case FLEXCOLL_INT32: HX_SPEC_G(FLEXCOLL_INT32, g, CALL); break;   \
    case FLEXCOLL_UINT32: HX_SPEC_G(FLEXCOLL_UINT32, g, CALL); break; \
    case FLEXCOLL_INT64: HX_SPEC_G(FLEXCOLL_INT64, g, CALL); break;   \
    case FLEXCOLL_UINT64: HX_SPEC_G(FLEXCOLL_UINT64, g, CALL); break; \
    case FLEXCOLL_FLOAT16: HX_SPEC_G(FLEXCOLL_FLOAT16, g, CALL); break; \
    case FLEXCOLL_BFLOAT16: HX_SPEC_G(FLEXCOLL_BFLOAT16, g, CALL); break; \
    case FLEXCOLL_FLOAT32: HX_SPEC_G(FLEXCOLL_FLOAT32, g, CALL); break; \
    default: HX_SPEC_G(FLEXCOLL_FLOAT64, g, CALL); break;             \
  }

void hx_elem(const hx_data_t *d, int rank, size_t j, void *out, double *val) {
  uint64_t bits = elem_k(d->dtype, d->gen, rank_key(d, rank), j, val);
  if (out) store_bits(out, fc_dtype_size(d->dtype), bits);
}

HX_INLINE void fill_w(flexcoll_datatype_t t, hx_gen_t g, uint64_t key, unsigned char *p, size_t first, size_t count) {
  const size_t esize = fc_dtype_size(t);
  for (size_t i = 0; i < count; i++) store_bits(p + i * esize, esize, elem_k(t, g, key, first + i, NULL));
}

void hx_fill(const hx_data_t *d, int rank, void *buf, size_t first, size_t count) {
  uint64_t key = rank_key(d, rank);
  HX_SPECIALIZE(d->dtype, d->gen, fill_w(T_, G_, key, buf, first, count));
}

#define HX_LINES_PER_CHECK 3

/* Mismatches of buf[i] against element first+i of key's input; the first HX_LINES_PER_CHECK
 * indices go to idx. */
HX_INLINE size_t input_w(flexcoll_datatype_t t, hx_gen_t g, uint64_t key, const unsigned char *p, size_t first,
                         size_t count, size_t *idx) {
  const size_t esize = fc_dtype_size(t);
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    if (load_bits(p + i * esize, esize) == elem_k(t, g, key, first + i, NULL)) continue;
    if (bad < HX_LINES_PER_CHECK) idx[bad] = i;
    bad++;
  }
  return bad;
}

size_t hx_check_input(hx_rank_t *r, const char *where, const hx_data_t *d, int src_rank, const void *buf,
                      size_t first, size_t count) {
  const size_t esize = fc_dtype_size(d->dtype);
  const uint64_t key = rank_key(d, src_rank);
  const unsigned char *p = buf;
  size_t idx[HX_LINES_PER_CHECK], bad = 0;
  HX_SPECIALIZE(d->dtype, d->gen, bad = input_w(T_, G_, key, p, first, count, idx));
  if (!bad) return 0;
  for (size_t k = 0; k < bad && k < HX_LINES_PER_CHECK; k++) {
    size_t i = idx[k];
    uint64_t want = elem_k(d->dtype, d->gen, key, first + i, NULL), got = load_bits(p + i * esize, esize);
    note(r, "%s: element %zu is 0x%0*" PRIx64 ", expected 0x%0*" PRIx64 " (rank %d's input element %zu)%s", where, i,
         (int)esize * 2, got, (int)esize * 2, want, src_rank, first + i,
         got == ((HX_POISON * 0x0101010101010101ULL) & type_mask(esize)) ? " [poison: never written]" : "");
  }
  r->errors++;
  if (bad > HX_LINES_PER_CHECK) note(r, "%s: %zu of %zu elements wrong (first at %zu)", where, bad, count, idx[0]);
  return bad;
}

size_t hx_check_gathered(hx_rank_t *r, const char *where, const hx_data_t *d, const void *buf, size_t count) {
  size_t esize = fc_dtype_size(d->dtype), bad = 0;
  for (int q = 0; q < d->nranks; q++) {
    char w[160];
    snprintf(w, sizeof w, "%s block %d", where, q);
    bad += hx_check_input(r, w, d, q, (const unsigned char *)buf + (size_t)q * count * esize, 0, count);
  }
  return bad;
}

double hx_tolerance(flexcoll_datatype_t t, int nranks) {
  double u;
  switch (t) {
    case FLEXCOLL_FLOAT16: u = 0x1p-11; break;
    case FLEXCOLL_BFLOAT16: u = 0x1p-8; break;
    case FLEXCOLL_FLOAT32: u = 0x1p-24; break;
    case FLEXCOLL_FLOAT64: u = 0x1p-53; break;
    default: return 0.0;
  }
  return 2.0 * (nranks + 1) * u;
}

/* Absolute slack for results that land among the subnormals of the type. */
static double abs_floor(flexcoll_datatype_t t, int nranks) {
  switch (t) {
    case FLEXCOLL_FLOAT16: return nranks * 0x1p-24;
    case FLEXCOLL_BFLOAT16: return nranks * 0x1p-133;
    case FLEXCOLL_FLOAT32: return nranks * 0x1p-149;
    default: return 0.0;
  }
}

/* The reference of element j: integers: *want (the type's bits); floats: *ref and *mag (the
 * magnitude the error is relative to). */
HX_INLINE void ref_elem(flexcoll_datatype_t t, hx_gen_t g, flexcoll_op_t op, const uint64_t *keys, int n, size_t j,
                        uint64_t *want, double *ref, double *mag) {
  const size_t esize = fc_dtype_size(t);
  if (!fc_dtype_is_float(t)) {
    const int sgn = is_signed_int(t);
    uint64_t acc = extend(elem_k(t, g, keys[0], j, NULL), esize, sgn);
    for (int q = 1; q < n; q++) {
      uint64_t v = extend(elem_k(t, g, keys[q], j, NULL), esize, sgn);
      switch (op) {
        case FLEXCOLL_SUM:
        case FLEXCOLL_AVG: acc += v; break;
        case FLEXCOLL_PROD: acc *= v; break;
        case FLEXCOLL_MAX: acc = sgn ? ((int64_t)v > (int64_t)acc ? v : acc) : (v > acc ? v : acc); break;
        default: acc = sgn ? ((int64_t)v < (int64_t)acc ? v : acc) : (v < acc ? v : acc); break;
      }
    }
    if (op == FLEXCOLL_AVG) {
      acc = extend(acc, esize, sgn); /* the sum wrapped in the type */
      acc = sgn ? (uint64_t)((int64_t)acc / (int64_t)n) : acc / (uint64_t)n;
    }
    *want = acc & type_mask(esize);
    return;
  }
  double v, acc, m;
  elem_k(t, g, keys[0], j, &acc);
  m = fabs(acc);
  for (int q = 1; q < n; q++) {
    elem_k(t, g, keys[q], j, &v);
    switch (op) {
      case FLEXCOLL_SUM:
      case FLEXCOLL_AVG: acc += v; m += fabs(v); break;
      case FLEXCOLL_PROD: acc *= v; break;
      case FLEXCOLL_MAX: acc = v > acc ? v : acc; break;
      default: acc = v < acc ? v : acc; break;
    }
  }
  if (op == FLEXCOLL_AVG) { acc /= n; m /= n; }
  if (op == FLEXCOLL_PROD) m = fabs(acc);
  *ref = acc;
  *mag = m;
}

/* Whether gotbits matches the reference (see hx_check_reduced). */
HX_INLINE int elem_good(flexcoll_datatype_t t, flexcoll_op_t op, uint64_t gotbits, uint64_t want, double ref, double mag,
                        double tol, double floor_) {
  if (!fc_dtype_is_float(t)) return gotbits == want;
  const double got = float_value(t, gotbits);
  if (op == FLEXCOLL_MAX || op == FLEXCOLL_MIN) return got == ref;
  return fabs(got - ref) <= tol * mag + floor_; /* false for NaN */
}

HX_INLINE size_t reduced_w(flexcoll_datatype_t t, hx_gen_t g, flexcoll_op_t op, const uint64_t *keys, int n,
                           const unsigned char *p, size_t first, size_t count, double tol, double floor_, size_t *idx) {
  const size_t esize = fc_dtype_size(t);
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    uint64_t want = 0;
    double ref = 0.0, mag = 0.0;
    ref_elem(t, g, op, keys, n, first + i, &want, &ref, &mag);
    if (elem_good(t, op, load_bits(p + i * esize, esize), want, ref, mag, tol, floor_)) continue;
    if (bad < HX_LINES_PER_CHECK) idx[bad] = i;
    bad++;
  }
  return bad;
}

size_t hx_check_reduced(hx_rank_t *r, const char *where, const hx_data_t *d, flexcoll_op_t op, const void *buf,
                        size_t first, size_t count) {
  const flexcoll_datatype_t t = d->dtype;
  const int n = d->nranks;
  const size_t esize = fc_dtype_size(t);
  const double tol = hx_tolerance(t, n), floor_ = abs_floor(t, n);
  uint64_t keys_small[64], *keys = n <= 64 ? keys_small : malloc((size_t)n * sizeof *keys);
  if (!keys) { hx_fail(r, "%s: out of memory for the reference", where); return 1; }
  for (int q = 0; q < n; q++) keys[q] = rank_key(d, q);
  const unsigned char *p = buf;
  size_t idx[HX_LINES_PER_CHECK], bad = 0;
  HX_SPECIALIZE(t, d->gen, bad = reduced_w(T_, G_, op, keys, n, p, first, count, tol, floor_, idx));
  for (size_t k = 0; k < bad && k < HX_LINES_PER_CHECK; k++) {
    const size_t i = idx[k], j = first + i;
    uint64_t want = 0, gotbits = load_bits(p + i * esize, esize);
    double ref = 0.0, mag = 0.0;
    ref_elem(t, d->gen, op, keys, n, j, &want, &ref, &mag);
    if (!fc_dtype_is_float(t)) {
      if (is_signed_int(t))
        note(r, "%s: element %zu is %" PRId64 ", expected %" PRId64 " (%s over %d ranks of input element %zu)", where,
             i, (int64_t)extend(gotbits, esize, 1), (int64_t)extend(want, esize, 1), fc_op_name(op), n, j);
      else
        note(r, "%s: element %zu is %" PRIu64 ", expected %" PRIu64 " (%s over %d ranks of input element %zu)", where,
             i, gotbits, want, fc_op_name(op), n, j);
    } else {
      double bound = (op == FLEXCOLL_MAX || op == FLEXCOLL_MIN) ? 0.0 : tol * mag + floor_;
      note(r, "%s: element %zu is %.17g (bits 0x%0*" PRIx64 "), expected %.17g +- %.3g (%s over %d ranks of input "
           "element %zu)", where, i, float_value(t, gotbits), (int)esize * 2, gotbits, ref, bound, fc_op_name(op), n, j);
    }
  }
  if (keys != keys_small) free(keys);
  if (bad) {
    r->errors++;
    if (bad > HX_LINES_PER_CHECK) note(r, "%s: %zu of %zu elements wrong (first at %zu)", where, bad, count, idx[0]);
  }
  return bad;
}

/* ---- buffers ---------------------------------------------------------------------------------- */

void *hx_buf_new(hx_rank_t *r, hx_buf_t *b, size_t bytes) {
  size_t total = (2 * HX_GUARD + bytes + 63) / 64 * 64;
  b->bytes = bytes;
  b->base = aligned_alloc(64, total);
  if (!b->base) {
    if (r) hx_fail(r, "out of memory for a %zu-byte buffer", bytes);
    return NULL;
  }
  memset(b->base, HX_POISON, 2 * HX_GUARD + bytes);
  return b->base + HX_GUARD;
}

void *hx_buf_ptr(const hx_buf_t *b) { return b->base ? b->base + HX_GUARD : NULL; }

void hx_buf_free(hx_buf_t *b) {
  free(b->base);
  b->base = NULL;
  b->bytes = 0;
}

void hx_buf_poison(hx_buf_t *b, size_t off, size_t len) { memset(b->base + HX_GUARD + off, HX_POISON, len); }

static size_t count_unpoisoned(const unsigned char *p, size_t n, size_t *first) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (p[i] != HX_POISON) {
      if (!bad) *first = i;
      bad++;
    }
  return bad;
}

size_t hx_buf_check_guards(hx_rank_t *r, const char *where, const hx_buf_t *b) {
  size_t f1 = 0, f2 = 0;
  size_t before = count_unpoisoned(b->base, HX_GUARD, &f1);
  size_t after = count_unpoisoned(b->base + HX_GUARD + b->bytes, HX_GUARD, &f2);
  if (before)
    hx_fail(r, "%s: %zu byte(s) written in the %d bytes before the buffer (first at offset %zd)", where, before,
            HX_GUARD, (ssize_t)f1 - HX_GUARD);
  if (after)
    hx_fail(r, "%s: %zu byte(s) written in the %d bytes after the buffer's %zu bytes (first at byte %zu past the end)",
            where, after, HX_GUARD, b->bytes, f2);
  return before + after;
}

size_t hx_check_poisoned(hx_rank_t *r, const char *where, const void *buf, size_t bytes) {
  size_t first = 0, bad = count_unpoisoned(buf, bytes, &first);
  if (bad) hx_fail(r, "%s: %zu of %zu bytes written (must stay untouched), first at byte %zu", where, bad, bytes, first);
  return bad;
}

/* ---- destroying ranks of one process ---------------------------------------------------------- */

typedef struct {
  flexcoll_comm_t comm;
  flexcoll_result_t res;
  pthread_t thread;
  int started;
} destroy_job_t;

static void *destroy_main(void *arg) {
  destroy_job_t *j = arg;
  j->res = flexcoll_comm_destroy(j->comm);
  return NULL;
}

int hx_destroy_concurrently(flexcoll_comm_t *comms, int n) {
  destroy_job_t *j = calloc((size_t)n, sizeof *j);
  if (!j) return 0;
  int ok = 1;
  for (int i = 0; i < n; i++) {
    j[i].comm = comms[i];
    j[i].started = pthread_create(&j[i].thread, NULL, destroy_main, &j[i]) == 0;
    if (!j[i].started) destroy_main(&j[i]);
  }
  for (int i = 0; i < n; i++) {
    if (j[i].started) pthread_join(j[i].thread, NULL);
    if (j[i].res != FLEXCOLL_SUCCESS) {
      fprintf(stderr, "[hx] flexcoll_comm_destroy(comm %d of %d) returned %d: %s\n", i, n, (int)j[i].res,
              flexcoll_get_last_error(NULL));
      ok = 0;
    }
    comms[i] = NULL;
  }
  free(j);
  return ok;
}

/* The bytes comm's rank has sent to each peer so far, over all links, into sent[nranks]. */
static int sent_per_peer(flexcoll_comm_t comm, int nranks, unsigned long long *sent) {
  flexcoll_link_stats_t st[64];
  int n = 0;
  if (flexcoll_comm_get_link_stats(comm, st, 64, &n) != FLEXCOLL_SUCCESS) return 0;
  for (int q = 0; q < nranks; q++) sent[q] = 0;
  for (int i = 0; i < n && i < 64; i++)
    if (st[i].peer >= 0 && st[i].peer < nranks) sent[st[i].peer] += st[i].bytes;
  return 1;
}

int hx_small_ints_call(flexcoll_comm_t comm, int rank, int nranks, int rs, size_t block, float *send, float *recv,
                       unsigned long long *sent, char *why, size_t len) {
  const char *name = rs ? "reduce_scatter" : "allgather";
  unsigned long long before[64];
  if (nranks > 64) return snprintf(why, len, "%s: more than 64 ranks", name), 1;
  const size_t nsend = rs ? (size_t)nranks * block : block;
  for (size_t i = 0; i < nsend; i++) send[i] = (float)((i * 3 + (size_t)rank * 5) % 11);
  if (!sent_per_peer(comm, nranks, before)) return snprintf(why, len, "flexcoll_comm_get_link_stats failed"), 1;
  flexcoll_result_t res = rs ? flexcoll_reduce_scatter(send, recv, block, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL)
                             : flexcoll_allgather(send, recv, block, FLEXCOLL_FLOAT32, comm, NULL);
  if (res != FLEXCOLL_SUCCESS)
    return snprintf(why, len, "%s returned %d (%s): %s", name, (int)res, flexcoll_get_error_string(res),
                    flexcoll_get_last_error(comm)), 1;
  if (!sent_per_peer(comm, nranks, sent)) return snprintf(why, len, "flexcoll_comm_get_link_stats failed"), 1;
  for (int q = 0; q < nranks; q++) sent[q] -= before[q];
  const size_t nrecv = rs ? block : (size_t)nranks * block;
  for (size_t i = 0; i < nrecv; i++) {
    float want = 0;
    if (rs)
      for (int q = 0; q < nranks; q++) want += (float)((((size_t)rank * block + i) * 3 + (size_t)q * 5) % 11);
    else
      want = (float)(((i % block) * 3 + (i / block) * 5) % 11);
    if (recv[i] != want) return snprintf(why, len, "%s element %zu: %g, expected %g", name, i, recv[i], want), 1;
  }
  return 0;
}

uint64_t hx_digest(const void *buf, size_t bytes) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (size_t i = 0; buf && i < bytes; i++) h = (h ^ ((const unsigned char *)buf)[i]) * 1099511628211ULL;
  return h;
}

int hx_same_digests(const char *tag, const char *dir, int nranks, const char *a, const char *b) {
  for (int q = 0; q < nranks; q++) {
    char pa[400], pb[400], la[160], lb[160];
    snprintf(pa, sizeof pa, "%s/%s.rank%d", dir, a, q);
    snprintf(pb, sizeof pb, "%s/%s.rank%d", dir, b, q);
    FILE *fa = fopen(pa, "r"), *fb = fopen(pb, "r");
    int same = fa && fb, lines = 0;
    while (same && fgets(la, sizeof la, fa)) {
      same = fgets(lb, sizeof lb, fb) && !strcmp(la, lb);
      if (!same)
        fprintf(stderr, "[%s] rank %d: %s has \"%.*s\" where %s has \"%.*s\"\n", tag, q, a, (int)strcspn(la, "\n"), la,
                b, (int)strcspn(lb, "\n"), lb);
      lines++;
    }
    if (same && fgets(lb, sizeof lb, fb)) same = 0;
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    if (!same || lines == 0) return 0;
  }
  return 1;
}

/* ---- what a process holds (leak checks) ---------------------------------------------------- */

static int plain_name(const char *name) { return strcmp(name, ".") && strcmp(name, ".."); }

/* Voluntary context switches so far of the threads named prefix..., and how many threads. */
static long thread_switches(const char *prefix, int *threads) {
  long total = 0;
  *threads = 0;
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));) {
    char path[300], line[128];
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    const int ours = fgets(line, sizeof line, f) && !strncmp(line, prefix, strlen(prefix));
    fclose(f);
    if (!ours) continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
    if (!(f = fopen(path, "r"))) continue;
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "voluntary_ctxt_switches:", 24)) total += atol(line + 24), ++*threads;
    fclose(f);
  }
  closedir(d);
  return total;
}

/* The quietest of up to eight seconds of the threads named prefix... (hx_threads_park); it stops
 * early at a second with at most `enough`, which must be well under the bound: a second half
 * napping, half parked passes a loose bound while the threads have not parked for good. */
static long idle_wakeups(const char *prefix, int *threads, long enough) {
  int n = 0;
  long quietest = -1;
  thread_switches(prefix, threads);
  for (int k = 0; k < 8 && (quietest < 0 || quietest > enough); k++) {
    const long s0 = thread_switches(prefix, &n);
    usleep(1000000);
    const long s1 = thread_switches(prefix, &n);
    if (s0 < 0 || s1 < 0) return -1;
    if (quietest < 0 || s1 - s0 < quietest) quietest = s1 - s0;
  }
  return quietest;
}

/* One float32 sum allreduce of 1000 elements by the two ranks (a group), checked. */
static int allreduce_pair(flexcoll_comm_t comms[2]) {
  enum { N = 1000 };
  static float in[2][N], out[2][N];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < N; i++) in[r][i] = (float)(i + r), out[r][i] = -1;
  flexcoll_result_t res = flexcoll_group_start();
  for (int r = 0; r < 2 && res == FLEXCOLL_SUCCESS; r++)
    res = flexcoll_allreduce(in[r], out[r], N, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comms[r], NULL);
  const flexcoll_result_t end = flexcoll_group_end();
  if (res == FLEXCOLL_SUCCESS) res = end;
  if (res != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "[hx] allreduce of two ranks: %s: %s\n", flexcoll_get_error_string(res), flexcoll_get_last_error(NULL));
    return 0;
  }
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < N; i++)
      if (out[r][i] != (float)(2 * i + 1)) {
        fprintf(stderr, "[hx] allreduce of two ranks: rank %d element %d is %g, not %d\n", r, i, out[r][i], 2 * i + 1);
        return 0;
      }
  return 1;
}

int hx_threads_park(const char *prefix, long most) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1); /* host ranks as threads, whatever GPUs the machine has */
  flexcoll_comm_t comms[2] = {NULL, NULL};
  if (flexcoll_comm_init_all(comms, 2, NULL) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "[hx] init_all of two ranks: %s\n", flexcoll_get_last_error(NULL));
    return 0;
  }
  int ok = allreduce_pair(comms), threads = 0; /* the link's first transfers start its threads */
  const long woke = ok ? idle_wakeups(prefix, &threads, most / 10) : -1;
  if (ok) {
    fprintf(stderr, "[hx] idle %s threads: %ld wake-ups in their quietest second (%d threads)\n", prefix, woke, threads);
    if (woke < 0) fprintf(stderr, "[hx] cannot read the threads' context switches in /proc/self/task\n"), ok = 0;
    if (threads != 2) fprintf(stderr, "[hx] %d %s threads for 2 ranks, not 2\n", threads, prefix), ok = 0;
    if (woke > most) fprintf(stderr, "[hx] idle %s threads woke %ld times in 1 s, more than %ld\n", prefix, woke, most), ok = 0;
  }
  ok = allreduce_pair(comms) && ok; /* still a working link once parked */
  for (int r = 0; r < 2; r++)
    if (flexcoll_comm_destroy(comms[r]) != FLEXCOLL_SUCCESS) {
      fprintf(stderr, "[hx] destroy of rank %d: %s\n", r, flexcoll_get_last_error(NULL));
      ok = 0;
    }
  return ok;
}

int hx_count_entries(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += plain_name(e->d_name) && !strncmp(e->d_name, prefix, strlen(prefix));
  closedir(d);
  return n;
}

int hx_open_fds(void) {
  const int n = hx_count_entries("/proc/self/fd", "");
  return n < 0 ? -1 : n - 1; /* the directory's own descriptor */
}

char **hx_list_names(const char *dir, const char *prefix, int *n) {
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return NULL;
  char **v = NULL;
  int cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!plain_name(e->d_name) || strncmp(e->d_name, prefix, strlen(prefix))) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 64;
      char **w = realloc(v, (size_t)cap * sizeof *v);
      if (!w) break;
      v = w;
    }
    if (!(v[*n] = strdup(e->d_name))) break;
    (*n)++;
  }
  closedir(d);
  return v;
}

void hx_names_free(char **names, int n) {
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
}
