/* test_failure.c — what the survivors see when a rank fails, and flexcoll_comm_abort.
 *
 * Three forked ranks of one communicator (the unique id made by the test process before the fork)
 * run a few good allreduces; then one rank leaves instead of calling the next allreduce: it exits
 * (_exit(0)), is killed (SIGKILL), or just stops calling (sleeps); in one more case it is killed
 * while a large allreduce (64 MB) is moving data; the last two also over shared memory alone
 * (FLEXCOLL_LINKS=shm), which must then carry data in the default peer-failure mode.  The others
 * must get FLEXCOLL_REMOTE_ERROR or FLEXCOLL_TIMEOUT within the timeout (3000 ms, given by config.timeout_ms or FLEXCOLL_TIMEOUT_MS;
 * asserted: < 3 x timeout), with a last error that says why; flexcoll_comm_get_async_error must
 * report it; a further collective must fail promptly instead of hanging; flexcoll_comm_abort then
 * flexcoll_comm_destroy must succeed promptly.  The test process enforces a deadline on its ranks
 * and kills what is left, so that a hang fails the test instead of stalling it.
 *
 * Also: flexcoll_comm_abort from another thread releases a collective stuck waiting for a peer
 * that never calls it (ranks as threads of one process, flexcoll_comm_init_all), and an init whose
 * peer never shows up times out.  And misuse from threads: a call on a communicator that another
 * thread is inside is refused (FLEXCOLL_INVALID_USAGE), destroy included, while the call in
 * progress goes on unharmed; after an abort, destroy waits for that call instead.
 *
 * Ranks never call ck_assert (they are not the process Check watches): they record what went wrong
 * in shared memory and exit nonzero; the test process asserts on that.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flexcoll.h"
#include "harness.h"

#define TIMEOUT_MS 3000
#define NRANKS 3

static double tf_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void tf_sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

/* ---- forked ranks ------------------------------------------------------------------------------- */

typedef struct {
  char msg[768];  /* why the rank failed */
  char log[768];  /* what it saw (results, times), printed on failure */
  int done;       /* reached its end */
  int result;     /* a survivor's first failed collective (flexcoll_result_t), -1 if none */
  char phase[64]; /* what the rank is doing now: says where a hung rank hangs */
} report_t;

static report_t *reports; /* shared with the ranks */
static int last_results[NRANKS]; /* report_t.result of the last run_ranks */
static int my_rank = -1;

__attribute__((format(printf, 1, 2))) static void rank_log(const char *fmt, ...) {
  report_t *r = &reports[my_rank];
  size_t n = strlen(r->log);
  if (n + 2 >= sizeof r->log) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->log + n, sizeof r->log - n, fmt, ap);
  va_end(ap);
  n = strlen(r->log);
  if (n + 2 < sizeof r->log) strcat(r->log, "; ");
}

__attribute__((format(printf, 1, 2))) static void rank_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reports[my_rank].msg, sizeof reports[my_rank].msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rank %d: %s\n", my_rank, reports[my_rank].msg);
  _exit(1);
}

#define PHASE(what) snprintf(reports[my_rank].phase, sizeof reports[my_rank].phase, "%s", (what))

#define RANK_CHECK(cond, ...) \
  do {                        \
    if (!(cond)) rank_fail(__VA_ARGS__); \
  } while (0)

#define RANK_OK(call)                                                                                     \
  do {                                                                                                    \
    flexcoll_result_t r_ = (call);                                                                        \
    RANK_CHECK(r_ == FLEXCOLL_SUCCESS, "%s returned %d (%s): %s", #call, (int)r_,                         \
               flexcoll_get_error_string(r_), flexcoll_get_last_error(NULL));                             \
  } while (0)

typedef void (*rank_fn_t)(int rank, const flexcoll_unique_id_t *id, void *arg);

/* The ranks' pids; a rank sees those of the ranks forked before it (rank 0's in all of them). */
static pid_t rank_pids[NRANKS];

/* Entries of /dev/shm left by the shared-memory segments that pid created (rank 0's: the
 * segment's name starts with flexcoll-shm-<pid>-, lib/host/shm.c). */
static int shm_leftovers(pid_t pid) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "flexcoll-shm-%d-", (int)pid);
  const int n = hx_count_entries("/dev/shm", prefix);
  return n < 0 ? 0 : n;
}

enum { EXPECT_OK, EXPECT_EXIT0, EXPECT_SIGKILL, EXPECT_ANY };

/* Fork NRANKS ranks running fn with an id made here, before the fork; wait at most deadline_ms,
 * then kill what is left.  expect[r] says how rank r must end.  Once every rank expected to
 * succeed has ended, the others (a stalled rank) are killed. */
static void run_ranks(rank_fn_t fn, void *arg, const int expect[NRANKS], int deadline_ms) {
  flexcoll_unique_id_t id;
  ck_assert_int_eq(flexcoll_get_unique_id(&id), FLEXCOLL_SUCCESS);
  reports = mmap(NULL, NRANKS * sizeof *reports, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_ptr_ne(reports, MAP_FAILED);
  memset(reports, 0, NRANKS * sizeof *reports);
  for (int r = 0; r < NRANKS; r++) reports[r].result = -1;
  pid_t parent = getpid(), pids[NRANKS];
  fflush(NULL);
  for (int r = 0; r < NRANKS; r++) {
    pids[r] = rank_pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      /* Die with the test process (Check kills it on its own timeout). */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(3);
      my_rank = r;
      fn(r, &id, arg);
      reports[r].done = 1;
      _exit(0);
    }
  }
  int status[NRANKS], ended[NRANKS] = {0};
  double t0 = tf_now_ms(), end = t0 + deadline_ms;
  int timed_out = 0;
  for (;;) {
    int needed_left = 0, left = 0;
    for (int r = 0; r < NRANKS; r++) {
      if (!ended[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) ended[r] = 1;
      if (!ended[r]) left++, needed_left += expect[r] != EXPECT_ANY;
    }
    if (!left) break;
    if (!needed_left) { /* only stalled ranks remain */
      for (int r = 0; r < NRANKS; r++)
        if (!ended[r]) kill(pids[r], SIGKILL);
    } else if (tf_now_ms() > end) {
      timed_out = 1;
      for (int r = 0; r < NRANKS; r++)
        if (!ended[r]) {
          kill(pids[r], SIGKILL);
          snprintf(reports[r].msg, sizeof reports[r].msg, "still running after %d ms, hung in %s: killed", deadline_ms,
                   reports[r].phase[0] ? reports[r].phase : "?");
        }
    }
    tf_sleep_ms(5);
  }
  char why[4096] = "";
  size_t n = 0;
  int failed = 0;
  for (int r = 0; r < NRANKS; r++) {
    int st = status[r], ok;
    switch (expect[r]) {
      case EXPECT_OK: ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && reports[r].done; break;
      case EXPECT_EXIT0: ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && !reports[r].done; break;
      case EXPECT_SIGKILL: ok = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && !reports[r].msg[0]; break;
      default: ok = !reports[r].msg[0]; break;
    }
    if (ok) continue;
    failed = 1;
    if (!reports[r].msg[0]) {
      if (WIFSIGNALED(st))
        snprintf(reports[r].msg, sizeof reports[r].msg, "killed by signal %d in %s", WTERMSIG(st),
                 reports[r].phase[0] ? reports[r].phase : "?");
      else snprintf(reports[r].msg, sizeof reports[r].msg, "exited with status %d (expected ending %d)", WEXITSTATUS(st), expect[r]);
    }
    n += (size_t)snprintf(why + n, n < sizeof why ? sizeof why - n : 0, "[rank %d: %s | saw: %s] ", r, reports[r].msg,
                          reports[r].log);
    if (n >= sizeof why) n = sizeof why - 1;
  }
  for (int r = 0; r < NRANKS; r++) {
    if (reports[r].log[0]) fprintf(stderr, "  rank %d: %s\n", r, reports[r].log);
    last_results[r] = reports[r].result;
  }
  munmap(reports, NRANKS * sizeof *reports);
  reports = NULL;
  ck_assert_msg(!failed, "%s%s", timed_out ? "deadline passed: " : "", why);
  /* Whatever happened, the segment was unlinked once mapped (or on the failure): nothing left. */
  for (int r = 0; r < NRANKS; r++)
    ck_assert_msg(shm_leftovers(pids[r]) == 0, "rank %d (pid %d) left a shared-memory segment in /dev/shm", r, (int)pids[r]);
  ck_assert_msg(tf_now_ms() - t0 < deadline_ms, "the ranks took %.0f ms", tf_now_ms() - t0);
}

/* ---- a rank leaves in the middle of a job --------------------------------------------------------- */

typedef enum {
  LEAVE_EXIT,     /* _exit(0) instead of the next allreduce */
  LEAVE_SIGKILL,  /* raise(SIGKILL) instead of the next allreduce */
  LEAVE_STALL,    /* stop calling (the process stays, its sockets open): only the timeout tells */
  LEAVE_MIDKILL   /* SIGKILL from a thread while a large allreduce moves data */
} leave_t;

typedef struct {
  leave_t how;
  int victim;
  int use_env; /* the timeout from FLEXCOLL_TIMEOUT_MS instead of config.timeout_ms */
  /* FLEXCOLL_LINKS for the ranks, with the shared-memory path off (FLEXCOLL_SHM_DIRECT=0) so that
   * the link carries the data; NULL: the defaults, where the shared-memory path carries it */
  const char *links;
  const char *split_min; /* FLEXCOLL_SHM_SPLIT_MIN_BYTES for the ranks, NULL: the default */
  const char *threads;   /* FLEXCOLL_SHM_THREADS for the ranks (helper threads), NULL: the default */
} job_t;

/* Threads of this process. */
static int count_threads(void) { return hx_count_entries("/proc/self/task", ""); }

/* The first communicator of a process may open descriptors that stay for the life of the
 * process (the CUDA driver's, when UCX is built with CUDA, as on the GPU node): count them only
 * after a one-rank communicator has come and gone, so that the check sees leaks, not these. */
static void open_process_lifetime_fds(void) {
  flexcoll_unique_id_t id;
  flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
  cfg.cuda_device = -1;
  flexcoll_comm_t c = NULL;
  if (flexcoll_get_unique_id(&id) == FLEXCOLL_SUCCESS && flexcoll_comm_init_rank(&c, 1, id, 0, &cfg) == FLEXCOLL_SUCCESS)
    flexcoll_comm_destroy(c);
}

static const char *result_name(flexcoll_result_t r) {
  static const char *const names[] = {"SUCCESS", "UNHANDLED_CUDA_ERROR", "SYSTEM_ERROR", "INTERNAL_ERROR",
                                      "INVALID_ARGUMENT", "INVALID_USAGE", "REMOTE_ERROR", "IN_PROGRESS", "TIMEOUT"};
  return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "?";
}

static int is_peer_failure(flexcoll_result_t r) { return r == FLEXCOLL_REMOTE_ERROR || r == FLEXCOLL_TIMEOUT; }

static void *killer_thread(void *arg) {
  tf_sleep_ms((int)(intptr_t)arg);
  raise(SIGKILL);
  return NULL;
}

static void leave_rank(int rank, const flexcoll_unique_id_t *id, void *arg) {
  const job_t *job = arg;
  flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
  cfg.cuda_device = -1;
  if (job->use_env) setenv("FLEXCOLL_TIMEOUT_MS", "3000", 1); /* before any library call here */
  else cfg.timeout_ms = TIMEOUT_MS;
  if (job->links) setenv("FLEXCOLL_LINKS", job->links, 1);
  if (job->links) setenv("FLEXCOLL_SHM_DIRECT", "0", 1);
  if (job->split_min) setenv("FLEXCOLL_SHM_SPLIT_MIN_BYTES", job->split_min, 1);
  if (job->threads) setenv("FLEXCOLL_SHM_THREADS", job->threads, 1);
  flexcoll_comm_t comm = NULL;
  open_process_lifetime_fds();
  int fds_before = hx_open_fds(), threads_before = count_threads();
  PHASE("flexcoll_comm_init_rank");
  RANK_OK(flexcoll_comm_init_rank(&comm, NRANKS, *id, rank, &cfg));
  const int threads_init = count_threads(); /* the communicator's own (the bootstrap's), no helper yet */
  PHASE("the good allreduces");

  size_t n = job->how == LEAVE_MIDKILL ? (size_t)16 << 20 : 4096;
  float *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
  RANK_CHECK(in && out, "out of memory");
  for (size_t i = 0; i < n; i++) in[i] = (float)(rank + 1) * (float)(i % 64);
  const float sum = NRANKS * (NRANKS + 1) / 2;

  /* A few good collectives first: the failure must hit a communicator that works.  No rank can
   * leave before every rank has checked its async error (before the last good allreduce). */
  for (int k = 0; k < 3; k++) {
    if (k == 2) {
      flexcoll_result_t ae = FLEXCOLL_INTERNAL_ERROR;
      RANK_OK(flexcoll_comm_get_async_error(comm, &ae));
      RANK_CHECK(ae == FLEXCOLL_SUCCESS, "async error %d before anything failed", ae);
    }
    memset(out, 0, n * sizeof *out);
    RANK_OK(flexcoll_allreduce(in, out, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL));
    for (size_t i = 0; i < n; i += 997)
      RANK_CHECK(out[i] == sum * (float)(i % 64), "good allreduce %d: out[%zu] = %g", k, i, (double)out[i]);
  }

  /* Which links carried the good allreduces: the default mode must move host data over shared
   * memory (with peer-failure handling) where UCX can report a dead peer there, as 1.13 can. */
  if (job->links) {
    flexcoll_link_stats_t st[16];
    int nl = 0;
    RANK_OK(flexcoll_comm_get_link_stats(comm, st, 16, &nl));
    unsigned long long carried = 0;
    for (int i = 0; i < nl && i < 16; i++)
      if (!strcmp(st[i].name, job->links)) carried += st[i].bytes;
    rank_log("%s carried %llu bytes", job->links, carried);
    RANK_CHECK(carried > 0, "link %s carried nothing of the good allreduces (%d links)", job->links, nl);
  } else {
    /* The defaults: the ranks share this host, so the shared-memory path carried the good
     * allreduces and no link carried a byte of them. */
    flexcoll_link_stats_t st[16];
    int nl = 0;
    RANK_OK(flexcoll_comm_get_link_stats(comm, st, 16, &nl));
    unsigned long long carried = 0;
    for (int i = 0; i < nl && i < 16; i++) carried += st[i].bytes;
    RANK_CHECK(carried == 0, "the links carried %llu bytes of the good allreduces: the shared-memory path was not taken",
               carried);
  }

  /* The helpers run (parked) from the first large split allreduce until destroy. */
  if (job->threads)
    RANK_CHECK(count_threads() == threads_init + atoi(job->threads) - 1, "%d threads after the good allreduces, %d "
               "after init, FLEXCOLL_SHM_THREADS=%s", count_threads(), threads_init, job->threads);

  if (rank == job->victim) {
    /* Let the others finish the last good allreduce (data this rank sent may still sit unread in
     * their sockets; a dead process's sockets are reset) and enter the next one. */
    if (job->how != LEAVE_MIDKILL) tf_sleep_ms(200);
    switch (job->how) {
      case LEAVE_EXIT: _exit(0);
      case LEAVE_SIGKILL: raise(SIGKILL); break;
      case LEAVE_STALL: for (;;) pause();
      case LEAVE_MIDKILL: {
        /* One more allreduce first: it completes only once every survivor has finished the last
         * good one (each has sent its part of this one), so the kill cannot land in that one
         * however slow a loaded machine makes it (a 3-rank 64 MB AllReduce on 2 busy cores
         * took longer than the killer's delay: the survivors failed the good allreduce). */
        flexcoll_allreduce(in, out, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL);
        pthread_t t;
        pthread_create(&t, NULL, killer_thread, (void *)(intptr_t)300);
        for (;;) flexcoll_allreduce(in, out, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL);
      }
    }
    rank_fail("the victim survived");
  }

  /* The survivors. */
  PHASE("the allreduce after the failure");
  flexcoll_result_t res = FLEXCOLL_SUCCESS;
  double took = 0;
  int calls = 0;
  do {
    double t0 = tf_now_ms();
    res = flexcoll_allreduce(in, out, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL);
    took = tf_now_ms() - t0;
    calls++;
  } while (job->how == LEAVE_MIDKILL && res == FLEXCOLL_SUCCESS && calls < 1000);
  char err[512], cerr[512];
  snprintf(err, sizeof err, "%s", flexcoll_get_last_error(NULL));
  snprintf(cerr, sizeof cerr, "%s", flexcoll_get_last_error(comm));
  rank_log("allreduce #%d after the failure: %s in %.0f ms (\"%s\")", calls, result_name(res), took, err);
  RANK_CHECK(is_peer_failure(res), "allreduce after rank %d left returned %d (%s), expected REMOTE_ERROR or TIMEOUT: %s",
             job->victim, res, flexcoll_get_error_string(res), err);
  RANK_CHECK(took < 3.0 * TIMEOUT_MS, "the failed allreduce took %.0f ms (timeout %d ms)", took, TIMEOUT_MS);
  reports[rank].result = res;
  if (job->how == LEAVE_STALL) {
    /* Nothing but the timeout can tell: not earlier.  (A survivor may see REMOTE_ERROR: the other
     * survivor timed out first and destroyed its communicator.) */
    RANK_CHECK(took > 0.8 * TIMEOUT_MS, "%s after only %.0f ms with a stalled peer (timeout %d ms)", result_name(res),
               took, TIMEOUT_MS);
  }
  RANK_CHECK(err[0], "no last error for this thread after the failed allreduce");
  RANK_CHECK(cerr[0], "no last error for the communicator after the failed allreduce");

  /* The communicator knows. */
  flexcoll_result_t ae = FLEXCOLL_SUCCESS;
  RANK_OK(flexcoll_comm_get_async_error(comm, &ae));
  rank_log("async error %s", result_name(ae));
  RANK_CHECK(is_peer_failure(ae), "flexcoll_comm_get_async_error reports %d (%s) after the failure", ae,
             flexcoll_get_error_string(ae));

  /* Another collective on the broken communicator fails; it must not hang or succeed. */
  PHASE("the next allreduce");
  double t0 = tf_now_ms();
  res = flexcoll_allreduce(in, out, n, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL);
  took = tf_now_ms() - t0;
  rank_log("next allreduce: %s in %.0f ms", result_name(res), took);
  RANK_CHECK(res != FLEXCOLL_SUCCESS, "an allreduce on the broken communicator succeeded");
  RANK_CHECK(took < 3.0 * TIMEOUT_MS, "the next allreduce took %.0f ms", took);

  PHASE("flexcoll_comm_abort");
  t0 = tf_now_ms();
  RANK_OK(flexcoll_comm_abort(comm));
  double t_abort = tf_now_ms() - t0;
  PHASE("flexcoll_comm_destroy");
  t0 = tf_now_ms();
  RANK_OK(flexcoll_comm_destroy(comm));
  double t_destroy = tf_now_ms() - t0;
  int fds_after = hx_open_fds(), threads_after = count_threads();
  rank_log("abort %.0f ms, destroy %.0f ms, fds %d -> %d, threads %d -> %d", t_abort, t_destroy, fds_before, fds_after,
           threads_before, threads_after);
  RANK_CHECK(t_abort < 1000, "abort took %.0f ms", t_abort);
  RANK_CHECK(t_destroy < 2000, "destroy after abort took %.0f ms", t_destroy);
  RANK_CHECK(fds_after == fds_before, "%d file descriptors before init, %d after destroy", fds_before, fds_after);
  /* The shared-memory path's helper threads are joined by destroy. */
  if (job->threads)
    RANK_CHECK(threads_after == threads_before, "%d threads before init, %d after destroy", threads_before, threads_after);
  free(in);
  free(out);
}

static void run_job(job_t job) {
  const leave_t how = job.how;
  const int victim = job.victim;
  int expect[NRANKS];
  for (int r = 0; r < NRANKS; r++) expect[r] = EXPECT_OK;
  expect[victim] = how == LEAVE_EXIT ? EXPECT_EXIT0 : how == LEAVE_STALL ? EXPECT_ANY : EXPECT_SIGKILL;
  run_ranks(leave_rank, &job, expect, 6 * TIMEOUT_MS);
}

static void run_leave_on(leave_t how, int victim, int use_env, const char *links) {
  run_job((job_t){how, victim, use_env, links, NULL, NULL});
}

static void run_leave(leave_t how, int victim, int use_env) { run_leave_on(how, victim, use_env, NULL); }

START_TEST(test_rank_exits) { run_leave(LEAVE_EXIT, 2, 0); }
END_TEST

START_TEST(test_rank_killed) { run_leave(LEAVE_SIGKILL, 2, 1); }
END_TEST

START_TEST(test_rank_stalls) {
  run_leave(LEAVE_STALL, 2, 0);
  ck_assert_msg(last_results[0] == FLEXCOLL_TIMEOUT || last_results[1] == FLEXCOLL_TIMEOUT,
                "with a stalled peer no survivor reported FLEXCOLL_TIMEOUT (%d, %d)", last_results[0], last_results[1]);
}
END_TEST

START_TEST(test_rank_killed_mid_transfer) { run_leave(LEAVE_MIDKILL, 1, 0); }
END_TEST

/* The defaults above take the shared-memory path (lib/host/shm.c): the 64 MB allreduce split
 * (reduce-scatter + allgather through the segment), the small ones in one exchange round.  Here
 * the 64 MB one in exchange rounds instead, slot after slot. */
START_TEST(test_rank_killed_mid_exchange_rounds) { run_job((job_t){LEAVE_MIDKILL, 2, 0, NULL, "1G", NULL}); }
END_TEST

/* The split 64 MB allreduce with 3 threads per rank (FLEXCOLL_SHM_THREADS=3, whatever the cores):
 * the survivors' waits end as without them, and destroy joins every helper. */
START_TEST(test_rank_killed_mid_split_threads) { run_job((job_t){LEAVE_MIDKILL, 1, 0, NULL, NULL, "3"}); }
END_TEST

/* The same over shared memory alone, in the default (peer-failure) mode: UCX's FIFOs with their
 * error handling (lib/transports/ucx_host.c).  A survivor must neither abort (no SIGBUS from the
 * dead rank's segment, no UCX assertion) nor hang: REMOTE_ERROR or TIMEOUT within the timeout. */
START_TEST(test_rank_killed_mid_transfer_shm) { run_leave_on(LEAVE_MIDKILL, 1, 0, "shm"); }
END_TEST

/* And a rank killed between collectives, shared memory alone. */
START_TEST(test_rank_killed_shm) { run_leave_on(LEAVE_SIGKILL, 2, 0, "shm"); }
END_TEST

/* ---- a rank dies while the shared-memory segment is being set up ---------------------------------- */

/* Rank 2 kills itself as soon as rank 0's segment appears in /dev/shm: rank 0 has created it and
 * waits for the others to map it.  The survivors' init must fail within the timeout (or succeed,
 * when rank 2 got through before its signal) and leave nothing in /dev/shm either way. */
static void *kill_at_segment(void *arg) {
  (void)arg;
  for (;;) {
    if (shm_leftovers(rank_pids[0])) raise(SIGKILL);
    struct timespec t = {0, 20 * 1000};
    nanosleep(&t, NULL);
  }
  return NULL;
}

static void init_kill_rank(int rank, const flexcoll_unique_id_t *id, void *arg) {
  (void)arg;
  flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
  cfg.cuda_device = -1;
  cfg.timeout_ms = TIMEOUT_MS;
  if (rank == 2) {
    pthread_t t;
    RANK_CHECK(pthread_create(&t, NULL, kill_at_segment, NULL) == 0, "cannot start the killer thread");
  }
  PHASE("flexcoll_comm_init_rank");
  flexcoll_comm_t comm = NULL;
  double t0 = tf_now_ms();
  flexcoll_result_t res = flexcoll_comm_init_rank(&comm, NRANKS, *id, rank, &cfg);
  double took = tf_now_ms() - t0;
  rank_log("init %s in %.0f ms", result_name(res), took);
  RANK_CHECK(res == FLEXCOLL_SUCCESS || is_peer_failure(res), "init returned %d (%s): %s", res,
             flexcoll_get_error_string(res), flexcoll_get_last_error(NULL));
  RANK_CHECK(took < 3.0 * TIMEOUT_MS, "init took %.0f ms", took);
  /* Rank 0 made the segment: its own init unlinks it before returning, whatever the outcome.  The
   * other ranks' inits may end (rank 2 gone) while rank 0's still runs, so they cannot ask this;
   * run_ranks checks it for every rank once all have ended. */
  if (rank == 0)
    RANK_CHECK(shm_leftovers(getpid()) == 0, "rank 0's segment is still in /dev/shm after its init returned %s",
               result_name(res));
  if (rank == 2) raise(SIGKILL); /* got through before its thread saw the segment */
  if (res == FLEXCOLL_SUCCESS) {
    PHASE("flexcoll_comm_destroy");
    flexcoll_comm_abort(comm);
    RANK_OK(flexcoll_comm_destroy(comm));
  }
}

START_TEST(test_rank_killed_during_shm_setup) {
  static const int expect[NRANKS] = {EXPECT_OK, EXPECT_OK, EXPECT_SIGKILL};
  run_ranks(init_kill_rank, NULL, expect, 6 * TIMEOUT_MS);
}
END_TEST

/* ---- init whose peer never comes --------------------------------------------------------------- */

START_TEST(test_init_peer_missing) {
  flexcoll_unique_id_t id;
  ck_assert_int_eq(flexcoll_get_unique_id(&id), FLEXCOLL_SUCCESS);
  flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
  cfg.cuda_device = -1;
  cfg.timeout_ms = 2000;
  flexcoll_comm_t comm = (flexcoll_comm_t)(uintptr_t)0x1;
  double t0 = tf_now_ms();
  flexcoll_result_t res = flexcoll_comm_init_rank(&comm, 2, id, 0, &cfg);
  double took = tf_now_ms() - t0;
  const char *e = flexcoll_get_last_error(NULL);
  ck_assert_msg(is_peer_failure(res), "init without its peer returned %d (%s): %s", res, flexcoll_get_error_string(res), e);
  ck_assert_ptr_null(comm);
  ck_assert_msg(e && e[0], "no last error");
  ck_assert_msg(took < 3.0 * cfg.timeout_ms, "init without its peer took %.0f ms (timeout %d)", took, cfg.timeout_ms);
}
END_TEST

/* ---- abort from another thread --------------------------------------------------------------------- */

typedef struct {
  flexcoll_comm_t comm;
  atomic_int finished;
  flexcoll_result_t res;
  double ended_ms;
  char err[512];
} stuck_t;

static void *stuck_allreduce(void *arg) {
  stuck_t *s = arg;
  static float in[1024], out[1024];
  s->res = flexcoll_allreduce(in, out, 1024, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, s->comm, NULL);
  snprintf(s->err, sizeof s->err, "%s", flexcoll_get_last_error(NULL));
  s->ended_ms = tf_now_ms();
  atomic_store(&s->finished, 1);
  return NULL;
}

START_TEST(test_abort_from_other_thread) {
  /* Host ranks as threads of this (Check-forked) process; a timeout far beyond the test so that
   * only the abort can release the collective. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  setenv("FLEXCOLL_TIMEOUT_MS", "30000", 1);
  open_process_lifetime_fds();
  int fds_before = hx_open_fds();
  flexcoll_comm_t comms[2] = {NULL, NULL};
  ck_assert_msg(flexcoll_comm_init_all(comms, 2, NULL) == FLEXCOLL_SUCCESS, "init_all: %s", flexcoll_get_last_error(NULL));

  stuck_t s = {.comm = comms[0]};
  atomic_init(&s.finished, 0);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, stuck_allreduce, &s), 0);
  /* Rank 1 never calls: the allreduce of rank 0 waits. */
  tf_sleep_ms(500);
  ck_assert_msg(!atomic_load(&s.finished), "allreduce returned %d (%s) without its peer: %s", s.res,
                flexcoll_get_error_string(s.res), s.err);

  double t_abort = tf_now_ms();
  ck_assert_int_eq(flexcoll_comm_abort(comms[0]), FLEXCOLL_SUCCESS);
  ck_assert_msg(tf_now_ms() - t_abort < 1000, "abort took %.0f ms", tf_now_ms() - t_abort);
  while (!atomic_load(&s.finished) && tf_now_ms() - t_abort < 5000) tf_sleep_ms(5);
  ck_assert_msg(atomic_load(&s.finished), "the allreduce still waits 5 s after flexcoll_comm_abort");
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  double released = s.ended_ms - t_abort;
  ck_assert_msg(s.res != FLEXCOLL_SUCCESS, "the aborted allreduce returned SUCCESS");
  ck_assert_msg(s.res == FLEXCOLL_REMOTE_ERROR || s.res == FLEXCOLL_INVALID_USAGE || s.res == FLEXCOLL_TIMEOUT,
                "the aborted allreduce returned %d (%s): %s", s.res, flexcoll_get_error_string(s.res), s.err);
  ck_assert_msg(s.err[0], "no last error in the aborted thread");
  ck_assert_msg(released < 1000, "the allreduce returned %.0f ms after the abort", released);
  fprintf(stderr, "  aborted allreduce: %s after %.0f ms: %s\n", result_name(s.res), released, s.err);

  /* Only destroy is allowed now; the surviving rank is aborted and destroyed too, all promptly. */
  int v;
  ck_assert_int_eq(flexcoll_comm_count(comms[0], &v), FLEXCOLL_INVALID_USAGE);
  double t0 = tf_now_ms();
  ck_assert_int_eq(flexcoll_comm_destroy(comms[0]), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_comm_abort(comms[1]), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_comm_destroy(comms[1]), FLEXCOLL_SUCCESS);
  ck_assert_msg(tf_now_ms() - t0 < 2000, "destroying the aborted communicators took %.0f ms", tf_now_ms() - t0);
  /* Everything is released (the rendezvous server of init_all ends with the rendezvous). */
  int fds_after = hx_open_fds();
  for (int i = 0; i < 100 && fds_after != fds_before; i++) tf_sleep_ms(10), fds_after = hx_open_fds();
  ck_assert_msg(fds_after == fds_before, "%d file descriptors before init_all, %d after destroy", fds_before, fds_after);
}
END_TEST

typedef struct {
  flexcoll_comm_t comms[2];
  atomic_int finished;
  flexcoll_result_t res;
} group_stuck_t;

static int stuck_in[2][256], stuck_out[2][256];

static void *stuck_group(void *arg) {
  group_stuck_t *g = arg;
  int(*in)[256] = stuck_in, (*out)[256] = stuck_out;
  /* Rank 0 runs an allreduce and then a broadcast; rank 1 only the allreduce: the group waits in
   * rank 0's broadcast. */
  flexcoll_group_start();
  flexcoll_allreduce(in[0], out[0], 256, FLEXCOLL_INT32, FLEXCOLL_SUM, g->comms[0], NULL);
  flexcoll_broadcast(in[0], out[0], 256, FLEXCOLL_INT32, 1, g->comms[0], NULL);
  flexcoll_allreduce(in[1], out[1], 256, FLEXCOLL_INT32, FLEXCOLL_SUM, g->comms[1], NULL);
  g->res = flexcoll_group_end();
  atomic_store(&g->finished, 1);
  return NULL;
}

START_TEST(test_abort_releases_group) {
  /* A group stuck at its end (one rank waits for a peer that has nothing more to do) is released
   * by aborting the waiting communicator from another thread. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  setenv("FLEXCOLL_TIMEOUT_MS", "30000", 1);
  group_stuck_t g;
  memset(&g, 0, sizeof g);
  atomic_init(&g.finished, 0);
  ck_assert_msg(flexcoll_comm_init_all(g.comms, 2, NULL) == FLEXCOLL_SUCCESS, "init_all: %s",
                flexcoll_get_last_error(NULL));
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 256; i++) stuck_in[r][i] = r + 1, stuck_out[r][i] = -1;
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, stuck_group, &g), 0);
  /* Abort only once both allreduces are done (on a loaded machine that may take a while): an
   * abort during them would leave rank 1's allreduce waiting for its timeout, not the group's
   * stuck broadcast this case is about. */
  double t_wait = tf_now_ms();
  while ((__atomic_load_n(&stuck_out[0][255], __ATOMIC_ACQUIRE) != 3 ||
          __atomic_load_n(&stuck_out[1][255], __ATOMIC_ACQUIRE) != 3) &&
         tf_now_ms() - t_wait < 20000)
    tf_sleep_ms(5);
  tf_sleep_ms(200);
  ck_assert_msg(!atomic_load(&g.finished), "the group ended (%d) although rank 1 never joined the broadcast", g.res);
  double t0 = tf_now_ms();
  ck_assert_int_eq(flexcoll_comm_abort(g.comms[0]), FLEXCOLL_SUCCESS);
  while (!atomic_load(&g.finished) && tf_now_ms() - t0 < 5000) tf_sleep_ms(5);
  ck_assert_msg(atomic_load(&g.finished), "the group still waits 5 s after flexcoll_comm_abort");
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_msg(g.res != FLEXCOLL_SUCCESS, "the aborted group returned SUCCESS");
  ck_assert_msg(tf_now_ms() - t0 < 1500, "the group ended %.0f ms after the abort", tf_now_ms() - t0);
  t0 = tf_now_ms();
  ck_assert_int_eq(flexcoll_comm_destroy(g.comms[0]), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_comm_abort(g.comms[1]), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_comm_destroy(g.comms[1]), FLEXCOLL_SUCCESS);
  ck_assert_msg(tf_now_ms() - t0 < 2000, "destroying took %.0f ms", tf_now_ms() - t0);
}
END_TEST

/* ---- one communicator, two threads ------------------------------------------------------------------ */

/* A host allreduce of rank 0 that waits for rank 1 until someone joins or aborts.  A call refused
 * because the main thread's probe held the communicator at that instant is made again. */
typedef struct {
  flexcoll_comm_t comm;
  int32_t in[64], out[64];
  atomic_int finished;
  flexcoll_result_t res;
  char err[512];
} busy_t;

static void *busy_allreduce(void *arg) {
  busy_t *b = arg;
  do {
    b->res = flexcoll_allreduce(b->in, b->out, 64, FLEXCOLL_INT32, FLEXCOLL_SUM, b->comm, NULL);
    snprintf(b->err, sizeof b->err, "%s", flexcoll_get_last_error(NULL));
  } while (b->res == FLEXCOLL_INVALID_USAGE && strstr(b->err, "in use"));
  atomic_store(&b->finished, 1);
  return NULL;
}

/* Start b's allreduce in thread *t and return once it is inside the library: a count-0 call
 * (which moves nothing when the communicator is free) is refused as "in use" from then on. */
static void start_busy(busy_t *b, flexcoll_comm_t comm, pthread_t *t) {
  memset(b, 0, sizeof *b);
  b->comm = comm;
  for (int i = 0; i < 64; i++) b->in[i] = i, b->out[i] = -1;
  atomic_init(&b->finished, 0);
  ck_assert_int_eq(pthread_create(t, NULL, busy_allreduce, b), 0);
  double t0 = tf_now_ms();
  for (;;) {
    flexcoll_result_t r = flexcoll_allreduce(NULL, NULL, 0, FLEXCOLL_INT32, FLEXCOLL_SUM, comm, NULL);
    if (r == FLEXCOLL_INVALID_USAGE && strstr(flexcoll_get_last_error(NULL), "already in use by another thread")) break;
    ck_assert_msg(r == FLEXCOLL_SUCCESS, "count-0 probe returned %d: %s", r, flexcoll_get_last_error(NULL));
    ck_assert_msg(!atomic_load(&b->finished), "the allreduce returned %d without its peer: %s", b->res, b->err);
    ck_assert_msg(tf_now_ms() - t0 < 20000, "the allreduce thread never entered the library");
    tf_sleep_ms(1);
  }
}

/* call must be refused at once (it used to run alongside the other thread's call) with a last
 * error, the thread's and the communicator's, that contains what. */
#define EXPECT_IN_USE(call, comm, what)                                                                     \
  do {                                                                                                      \
    double t0_ = tf_now_ms();                                                                               \
    flexcoll_result_t r_ = (call);                                                                          \
    double took_ = tf_now_ms() - t0_;                                                                       \
    const char *e_ = flexcoll_get_last_error(NULL), *ce_ = flexcoll_get_last_error(comm);                   \
    ck_assert_msg(r_ == FLEXCOLL_INVALID_USAGE, "%s returned %d (%s): %s", #call, r_,                       \
                  flexcoll_get_error_string(r_), e_);                                                       \
    ck_assert_msg(strstr(e_, what) && strstr(ce_, what), "%s: last errors \"%s\" / \"%s\" lack \"%s\"", #call, \
                  e_, ce_, what);                                                                           \
    ck_assert_msg(took_ < 2000, "%s took %.0f ms to refuse", #call, took_);                                 \
  } while (0)

START_TEST(test_comm_used_from_two_threads) {
  /* Host ranks as threads of this process.  Thread A is inside an allreduce of rank 0; every call
   * on rank 0 from this thread is refused meanwhile, A's call goes on unharmed, and calls from any
   * thread that only watch it (get_async_error, get_last_error) work.  Rank 1 driven from this
   * thread (another communicator) and groups (whose work runs in threads of their own) are no
   * misuse. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  setenv("FLEXCOLL_TIMEOUT_MS", "60000", 1);
  flexcoll_comm_t c[2] = {NULL, NULL};
  ck_assert_msg(flexcoll_comm_init_all(c, 2, NULL) == FLEXCOLL_SUCCESS, "init_all: %s", flexcoll_get_last_error(NULL));
  busy_t b;
  pthread_t t;
  start_busy(&b, c[0], &t);
  const char *in_use = "already in use by another thread";
  int32_t x[64] = {0}, y[64] = {0};
  EXPECT_IN_USE(flexcoll_allreduce(x, y, 64, FLEXCOLL_INT32, FLEXCOLL_SUM, c[0], NULL), c[0], in_use);
  EXPECT_IN_USE(flexcoll_broadcast(x, y, 64, FLEXCOLL_INT32, 0, c[0], NULL), c[0], in_use);
  EXPECT_IN_USE(flexcoll_reduce(x, y, 64, FLEXCOLL_INT32, FLEXCOLL_SUM, 1, c[0], NULL), c[0], in_use);
  EXPECT_IN_USE(flexcoll_send(x, 64, FLEXCOLL_INT32, 1, c[0], NULL), c[0], in_use);
  EXPECT_IN_USE(flexcoll_recv(y, 64, FLEXCOLL_INT32, 1, c[0], NULL), c[0], in_use);
  flexcoll_window_t w = NULL;
  EXPECT_IN_USE(flexcoll_window_register(c[0], x, sizeof x, &w), c[0], in_use);
  /* A group that also holds rank 1: nothing of it runs, and rank 1 is released again. */
  ck_assert_int_eq(flexcoll_group_start(), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_allreduce(x, y, 64, FLEXCOLL_INT32, FLEXCOLL_SUM, c[1], NULL), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_allreduce(x, y, 64, FLEXCOLL_INT32, FLEXCOLL_SUM, c[0], NULL), FLEXCOLL_SUCCESS);
  EXPECT_IN_USE(flexcoll_group_end(), c[0], in_use);
  ck_assert_msg(!atomic_load(&b.finished), "A's allreduce returned %d meanwhile: %s", b.res, b.err);
  flexcoll_result_t ae = FLEXCOLL_INTERNAL_ERROR;
  ck_assert_int_eq(flexcoll_comm_get_async_error(c[0], &ae), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(ae, FLEXCOLL_SUCCESS);
  ck_assert_ptr_nonnull(flexcoll_get_last_error(c[0]));
  /* Rank 1 from this thread completes A's allreduce, with the right result. */
  int32_t in1[64], out1[64];
  for (int i = 0; i < 64; i++) in1[i] = 1000 * i;
  ck_assert_msg(flexcoll_allreduce(in1, out1, 64, FLEXCOLL_INT32, FLEXCOLL_SUM, c[1], NULL) == FLEXCOLL_SUCCESS,
                "rank 1: %s", flexcoll_get_last_error(NULL));
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_msg(b.res == FLEXCOLL_SUCCESS, "A's allreduce returned %d: %s", b.res, b.err);
  for (int i = 0; i < 64; i++) {
    ck_assert_int_eq(b.out[i], 1001 * i);
    ck_assert_int_eq(out1[i], 1001 * i);
  }
  /* Both ranks from this thread in a group: each runs in a thread of the group. */
  int32_t g[2][64];
  ck_assert_int_eq(flexcoll_group_start(), FLEXCOLL_SUCCESS);
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < 64; i++) g[r][i] = r + i;
    ck_assert_int_eq(flexcoll_allreduce(g[r], g[r], 64, FLEXCOLL_INT32, FLEXCOLL_SUM, c[r], NULL), FLEXCOLL_SUCCESS);
  }
  ck_assert_msg(flexcoll_group_end() == FLEXCOLL_SUCCESS, "group: %s", flexcoll_get_last_error(NULL));
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 64; i++) ck_assert_int_eq(g[r][i], 2 * i + 1);
  ck_assert_int_eq(flexcoll_comm_destroy(c[0]), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_comm_destroy(c[1]), FLEXCOLL_SUCCESS);
}
END_TEST

/* The issue's own case: two threads issue allreduces on rank 0 at once while a third drives rank 1.
 * Tickets keep the totals equal: a thread takes one before its call and gives it back if the call
 * is refused, so rank 0 completes exactly as many calls as rank 1 makes. */
enum { HAMMER_CALLS = 300 };
typedef struct {
  flexcoll_comm_t comm;
  atomic_int *tickets, *refused, *wrong;
  char err[512];
  flexcoll_result_t bad; /* a result other than SUCCESS or "in use" */
} hammer_t;

/* Never past HAMMER_CALLS, even for a moment: a ticket taken and given back there could make the
 * other thread stop one call short. */
static int take_ticket(atomic_int *tickets) {
  int v = atomic_load(tickets);
  while (v < HAMMER_CALLS)
    if (atomic_compare_exchange_weak(tickets, &v, v + 1)) return 1;
  return 0;
}

static void *hammer_rank0(void *arg) {
  hammer_t *h = arg;
  int32_t in[256], out[256];
  for (int i = 0; i < 256; i++) in[i] = i;
  while (take_ticket(h->tickets)) {
    flexcoll_result_t r = flexcoll_allreduce(in, out, 256, FLEXCOLL_INT32, FLEXCOLL_SUM, h->comm, NULL);
    if (r == FLEXCOLL_INVALID_USAGE && strstr(flexcoll_get_last_error(NULL), "already in use by another thread")) {
      atomic_fetch_sub(h->tickets, 1);
      atomic_fetch_add(h->refused, 1);
      sched_yield(); /* leave the cores to the call in progress and its peer */
      continue;
    }
    if (r != FLEXCOLL_SUCCESS) {
      h->bad = r;
      snprintf(h->err, sizeof h->err, "%s", flexcoll_get_last_error(NULL));
      break;
    }
    for (int i = 0; i < 256; i++)
      if (out[i] != 1001 * i) { atomic_fetch_add(h->wrong, 1); break; }
  }
  return NULL;
}

static void *hammer_rank1(void *arg) {
  hammer_t *h = arg;
  int32_t in[256], out[256];
  for (int i = 0; i < 256; i++) in[i] = 1000 * i;
  for (int k = 0; k < HAMMER_CALLS; k++) {
    flexcoll_result_t r = flexcoll_allreduce(in, out, 256, FLEXCOLL_INT32, FLEXCOLL_SUM, h->comm, NULL);
    if (r != FLEXCOLL_SUCCESS) {
      h->bad = r;
      snprintf(h->err, sizeof h->err, "call %d: %s", k, flexcoll_get_last_error(NULL));
      break;
    }
    for (int i = 0; i < 256; i++)
      if (out[i] != 1001 * i) { atomic_fetch_add(h->wrong, 1); break; }
  }
  return NULL;
}

START_TEST(test_comm_hammered_from_two_threads) {
  /* Two threads on one communicator used to give wrong results (up to 367 of 400 calls) or abort
   * in UCX.  Now each call either runs alone or is refused: every result is right. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  setenv("FLEXCOLL_TIMEOUT_MS", "30000", 1);
  flexcoll_comm_t c[2] = {NULL, NULL};
  ck_assert_msg(flexcoll_comm_init_all(c, 2, NULL) == FLEXCOLL_SUCCESS, "init_all: %s", flexcoll_get_last_error(NULL));
  atomic_int tickets, refused, wrong;
  atomic_init(&tickets, 0);
  atomic_init(&refused, 0);
  atomic_init(&wrong, 0);
  hammer_t h[3];
  pthread_t t[3];
  for (int k = 0; k < 3; k++) {
    h[k] = (hammer_t){.comm = c[k == 2], .tickets = &tickets, .refused = &refused, .wrong = &wrong};
    ck_assert_int_eq(pthread_create(&t[k], NULL, k == 2 ? hammer_rank1 : hammer_rank0, &h[k]), 0);
  }
  for (int k = 0; k < 3; k++) ck_assert_int_eq(pthread_join(t[k], NULL), 0);
  for (int k = 0; k < 3; k++)
    ck_assert_msg(h[k].bad == FLEXCOLL_SUCCESS, "thread %d: %d (%s): %s", k, h[k].bad, flexcoll_get_error_string(h[k].bad),
                  h[k].err);
  ck_assert_msg(atomic_load(&wrong) == 0, "%d wrong results", atomic_load(&wrong));
  fprintf(stderr, "  %d allreduces on rank 0 from two threads, %d calls refused as in use\n", HAMMER_CALLS,
          atomic_load(&refused));
  ck_assert_int_eq(flexcoll_comm_destroy(c[0]), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_comm_destroy(c[1]), FLEXCOLL_SUCCESS);
}
END_TEST

START_TEST(test_destroy_during_collective) {
  /* destroy while another thread is inside a collective on the communicator killed the process
   * (SIGABRT).  It is refused now, leaving the communicator and the call alone; after an abort
   * it waits for the call to return (abort makes it return) and then frees: a watchdog thread may
   * abort and destroy in one go, as ncclCommAbort does. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  setenv("FLEXCOLL_TIMEOUT_MS", "60000", 1);
  flexcoll_comm_t c[2] = {NULL, NULL};
  ck_assert_msg(flexcoll_comm_init_all(c, 2, NULL) == FLEXCOLL_SUCCESS, "init_all: %s", flexcoll_get_last_error(NULL));
  busy_t b;
  pthread_t t;
  start_busy(&b, c[0], &t);
  for (int i = 0; i < 3; i++)
    EXPECT_IN_USE(flexcoll_comm_destroy(c[0]), c[0], "in use by another thread (inside flexcoll_allreduce)");
  ck_assert_msg(!atomic_load(&b.finished), "A's allreduce returned %d after a refused destroy: %s", b.res, b.err);
  double t0 = tf_now_ms();
  ck_assert_int_eq(flexcoll_comm_abort(c[0]), FLEXCOLL_SUCCESS);
  ck_assert_msg(flexcoll_comm_destroy(c[0]) == FLEXCOLL_SUCCESS, "destroy after abort: %s", flexcoll_get_last_error(NULL));
  double took = tf_now_ms() - t0;
  ck_assert_msg(took < 3000, "abort + destroy took %.0f ms", took);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_msg(b.res == FLEXCOLL_REMOTE_ERROR, "A's aborted allreduce returned %d (%s): %s", b.res,
                flexcoll_get_error_string(b.res), b.err);
  ck_assert_int_eq(flexcoll_comm_abort(c[1]), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(flexcoll_comm_destroy(c[1]), FLEXCOLL_SUCCESS);
}
END_TEST

/* ---- main ---------------------------------------------------------------------------------------- */

static Suite *failure_suite(void) {
  Suite *s = suite_create("failure");
  TCase *dead = tcase_create("dead_rank");
  tcase_set_timeout(dead, 8 * TIMEOUT_MS / 1000);
  tcase_add_test(dead, test_rank_exits);
  tcase_add_test(dead, test_rank_killed);
  tcase_add_test(dead, test_rank_stalls);
  tcase_add_test(dead, test_rank_killed_mid_transfer);
  tcase_add_test(dead, test_rank_killed_mid_exchange_rounds);
  tcase_add_test(dead, test_rank_killed_mid_split_threads);
  tcase_add_test(dead, test_rank_killed_mid_transfer_shm);
  tcase_add_test(dead, test_rank_killed_shm);
  tcase_add_test(dead, test_init_peer_missing);
  tcase_add_test(dead, test_rank_killed_during_shm_setup);
  suite_add_tcase(s, dead);

  TCase *abort_tc = tcase_create("abort");
  tcase_set_timeout(abort_tc, 15);
  tcase_add_test(abort_tc, test_abort_from_other_thread);
  tcase_add_test(abort_tc, test_abort_releases_group);
  suite_add_tcase(s, abort_tc);

  TCase *threads = tcase_create("threads");
  tcase_set_timeout(threads, 60);
  tcase_add_test(threads, test_comm_used_from_two_threads);
  tcase_add_test(threads, test_destroy_during_collective);
  tcase_add_test(threads, test_comm_hammered_from_two_threads);
  suite_add_tcase(s, threads);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(failure_suite());
  /* Every test in its own process: the ranks are forked from it and it sets the environment. */
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
