/* test_api.c — the public API's error paths, through flexcoll.h only, as a user calls it.
 *
 * Every entry point is given bad input (NULL pointers, invalid datatypes and operators, roots and
 * ranks out of range, counts whose byte size overflows, uninitialised configs, damaged or orphaned
 * unique ids, destroyed communicators, unbalanced groups, broken launcher environments, send and
 * receive buffers that overlap other than in place) and must return the documented code with a
 * last-error string that names the culprit; a count whose scratch cannot be allocated fails alone.  Also: version and
 * error strings, the getters, one-rank communicators for every collective, groups, and real
 * init_from_env runs (flexcoll and torchrun variables) with two forked processes, and
 * flexcoll_comm_split with 4 ranks as processes and 3 as threads (tests/harness.c).
 *
 * Multi-process cases fork ranks from the (Check-forked) test process; a rank never calls
 * ck_assert (it is not the process Check watches): it records what went wrong in shared memory
 * and exits nonzero, and the test process asserts on that, killing ranks that pass a deadline.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flexcoll.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static double ta_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void ta_sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

/* What a failing assertion was doing (loops over collectives, datatypes...). */
static char ta_ctx[128] = "";
#define CTX(...) snprintf(ta_ctx, sizeof ta_ctx, __VA_ARGS__)

/* res must be code, and this thread's last error (and comm's, when comm is given) must name what.
 * A sentinel error is recorded first (flexcoll_get_version(NULL)) so that a call that fails without
 * recording its own message cannot pass on a stale one. */
#define EXPECT_ERR(call, code, comm, what)                                                                     \
  do {                                                                                                         \
    char sentinel_[512];                                                                                       \
    flexcoll_get_version(NULL);                                                                                \
    snprintf(sentinel_, sizeof sentinel_, "%s", flexcoll_get_last_error(NULL));                               \
    flexcoll_result_t r_ = (call);                                                                             \
    const char *e_ = flexcoll_get_last_error(NULL);                                                            \
    ck_assert_msg(strstr(#call, "flexcoll_get_version") || !e_ || strcmp(e_, sentinel_) != 0,                  \
                  "[%s] %s returned %d without recording a last error", ta_ctx, #call, (int)r_);               \
    ck_assert_msg(r_ == (code), "[%s] %s returned %d (%s), expected %d (%s); last error: %s", ta_ctx, #call,   \
                  (int)r_, flexcoll_get_error_string(r_), (int)(code), flexcoll_get_error_string(code),        \
                  e_ ? e_ : "(null)");                                                                         \
    ck_assert_msg(e_ && strstr(e_, (what)), "[%s] %s: last error \"%s\" does not mention \"%s\"", ta_ctx, #call, \
                  e_ ? e_ : "(null)", (what));                                                                 \
    flexcoll_comm_t c_ = (comm);                                                                               \
    if (c_) {                                                                                                  \
      const char *ce_ = flexcoll_get_last_error(c_);                                                           \
      ck_assert_msg(ce_ && strstr(ce_, (what)),                                                                \
                    "[%s] %s: the communicator's last error \"%s\" does not mention \"%s\"", ta_ctx, #call,    \
                    ce_ ? ce_ : "(null)", (what));                                                             \
    }                                                                                                          \
  } while (0)

#define EXPECT_OK(call)                                                                                        \
  do {                                                                                                         \
    flexcoll_result_t r_ = (call);                                                                             \
    ck_assert_msg(r_ == FLEXCOLL_SUCCESS, "[%s] %s returned %d (%s): %s", ta_ctx, #call, (int)r_,              \
                  flexcoll_get_error_string(r_), flexcoll_get_last_error(NULL));                               \
  } while (0)

static flexcoll_config_t host_config(int timeout_ms) {
  flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
  cfg.cuda_device = -1;
  cfg.timeout_ms = timeout_ms;
  return cfg;
}

/* A one-rank, host-only communicator. */
static flexcoll_comm_t make_comm1(void) {
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(10000);
  flexcoll_comm_t comm = NULL;
  EXPECT_OK(flexcoll_comm_init_rank(&comm, 1, id, 0, &cfg));
  ck_assert_ptr_nonnull(comm);
  return comm;
}

/* Two host-only ranks of one communicator in this process, initialised by one thread in a group. */
static void make_pair(flexcoll_comm_t c[2]) {
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(10000);
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_comm_init_rank(&c[0], 2, id, 0, &cfg));
  EXPECT_OK(flexcoll_comm_init_rank(&c[1], 2, id, 1, &cfg));
  EXPECT_OK(flexcoll_group_end());
}

/* Destroy the ranks of one communicator that live in this process, each in its own thread, as
 * ranks driven by separate threads would.  (Destroying them one after the other from one thread is
 * its own test: test_destroy_sequential.) */
static void *destroy_thread(void *arg) {
  flexcoll_comm_t c = arg;
  return (void *)(intptr_t)flexcoll_comm_destroy(c);
}
static void destroy_concurrently(flexcoll_comm_t *c, int n) {
  pthread_t t[8];
  ck_assert_int_le(n, 8);
  for (int i = 0; i < n; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, destroy_thread, c[i]), 0);
  for (int i = 0; i < n; i++) {
    void *res;
    ck_assert_int_eq(pthread_join(t[i], &res), 0);
    ck_assert_msg((intptr_t)res == FLEXCOLL_SUCCESS, "destroy of rank %d returned %d", i, (int)(intptr_t)res);
  }
}

/* The byte layout of a unique id (bootstrap.h): version, "fcb", 64-bit big-endian magic at 4,
 * packed address at 12 (family, 0, port, address), FNV-1a checksum of bytes 0..35 at 36. */
#define ID_MAGIC_OFF 4
#define ID_PORT_OFF 14
#define ID_SUM_OFF 36
static void id_fix_checksum(flexcoll_unique_id_t *id) {
  unsigned char *p = (unsigned char *)id->internal;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int i = 0; i < ID_SUM_OFF; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  uint32_t s = (uint32_t)h;
  p[ID_SUM_OFF] = (unsigned char)(s >> 24);
  p[ID_SUM_OFF + 1] = (unsigned char)(s >> 16);
  p[ID_SUM_OFF + 2] = (unsigned char)(s >> 8);
  p[ID_SUM_OFF + 3] = (unsigned char)s;
}

/* A TCP port that nobody uses right now, below the ephemeral range (as launchers pick
 * MASTER_PORT): an ephemeral port could be taken meanwhile as the local port of some connection. */
static int free_port(void) {
  int lo = 32768, hi = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    fclose(f);
  }
  int base = lo > 12000 ? 10000 : 61000, span = lo > 12000 ? lo - 10000 : 4000;
  unsigned seed = (unsigned)getpid() ^ (unsigned)ta_now_ms();
  for (int attempt = 0; attempt < 200; attempt++) {
    int port = base + (int)(rand_r(&seed) % (unsigned)span);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) return port;
  }
  ck_abort_msg("no free TCP port found");
  return -1;
}

static const char *const launcher_vars[] = {
    "FLEXCOLL_RANK", "FLEXCOLL_NRANKS", "FLEXCOLL_ROOT", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    /* what goes into the magic: a test run inside a Slurm job or torchrun must not pick it up by chance */
    "FLEXCOLL_BOOTSTRAP_SECRET", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid",
    "OMPI_MCA_ess_base_jobid", "PMI_JOBID", "SLURM_JOB_ID"};

static void clear_launcher_env(void) {
  for (size_t i = 0; i < sizeof launcher_vars / sizeof launcher_vars[0]; i++) unsetenv(launcher_vars[i]);
}

/* ---- forked ranks ---------------------------------------------------------------------------- */

typedef struct {
  char msg[512]; /* why the rank failed */
  int done;      /* the rank reached its end */
  char phase[64]; /* what the rank is doing now: says where a hung rank hangs */
} rank_report_t;

static rank_report_t *rank_reports; /* shared with the forked ranks */
static int my_rank = -1;

__attribute__((format(printf, 1, 2))) static void rank_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rank_reports[my_rank].msg, sizeof rank_reports[my_rank].msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rank %d: %s\n", my_rank, rank_reports[my_rank].msg);
  _exit(1);
}

#define PHASE(what) snprintf(rank_reports[my_rank].phase, sizeof rank_reports[my_rank].phase, "%s", (what))

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

typedef void (*rank_fn_t)(int rank, int nranks, void *arg);

/* Fork nranks processes running fn, wait for them all at most deadline_ms (then kill them), and
 * fail the test if one of them failed. */
static void run_ranks(int nranks, rank_fn_t fn, void *arg, int deadline_ms) {
  rank_reports = mmap(NULL, (size_t)nranks * sizeof *rank_reports, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
  ck_assert_ptr_ne(rank_reports, MAP_FAILED);
  memset(rank_reports, 0, (size_t)nranks * sizeof *rank_reports);
  pid_t pids[16];
  ck_assert_int_le(nranks, 16);
  fflush(NULL);
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL); /* die with the test process (Check kills it on timeout) */
      my_rank = r;
      fn(r, nranks, arg);
      rank_reports[r].done = 1;
      _exit(0);
    }
  }
  int status[16], left = nranks;
  for (int r = 0; r < nranks; r++) status[r] = -1;
  double end = ta_now_ms() + deadline_ms;
  while (left > 0 && ta_now_ms() < end) {
    for (int r = 0; r < nranks; r++) {
      if (status[r] != -1) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) status[r] = st, left--;
    }
    if (left) ta_sleep_ms(5);
  }
  int timed_out = left > 0;
  for (int r = 0; r < nranks; r++)
    if (status[r] == -1) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      snprintf(rank_reports[r].msg, sizeof rank_reports[r].msg, "still running after %d ms, hung in %s: killed",
               deadline_ms, rank_reports[r].phase[0] ? rank_reports[r].phase : "?");
    }
  char why[2048] = "";
  size_t n = 0;
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    int ok = WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0 && rank_reports[r].done;
    if (ok) continue;
    failed = 1;
    if (!rank_reports[r].msg[0]) {
      if (WIFSIGNALED(status[r]))
        snprintf(rank_reports[r].msg, sizeof rank_reports[r].msg, "killed by signal %d in %s", WTERMSIG(status[r]),
                 rank_reports[r].phase[0] ? rank_reports[r].phase : "?");
      else
        snprintf(rank_reports[r].msg, sizeof rank_reports[r].msg, "exited with status %d", WEXITSTATUS(status[r]));
    }
    n += (size_t)snprintf(why + n, n < sizeof why ? sizeof why - n : 0, "[rank %d: %s] ", r, rank_reports[r].msg);
    if (n >= sizeof why) n = sizeof why - 1;
  }
  munmap(rank_reports, (size_t)nranks * sizeof *rank_reports);
  rank_reports = NULL;
  ck_assert_msg(!failed, "%s%s", timed_out ? "deadline passed: " : "", why);
}


/* ---- version and error strings ----------------------------------------------------------------- */

START_TEST(test_version) {
  EXPECT_ERR(flexcoll_get_version(NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "version");
  int v = -1;
  EXPECT_OK(flexcoll_get_version(&v));
  ck_assert_int_eq(v, FLEXCOLL_VERSION);
  ck_assert_int_eq(v, FLEXCOLL_MAJOR * 10000 + FLEXCOLL_MINOR * 100 + FLEXCOLL_PATCH);
}
END_TEST

START_TEST(test_error_strings) {
  const char *seen[FLEXCOLL_NUM_RESULTS];
  const char *unknown = flexcoll_get_error_string(FLEXCOLL_NUM_RESULTS);
  ck_assert_ptr_nonnull(unknown);
  ck_assert_int_gt(strlen(unknown), 0);
  for (int r = 0; r < FLEXCOLL_NUM_RESULTS; r++) {
    seen[r] = flexcoll_get_error_string((flexcoll_result_t)r);
    ck_assert_msg(seen[r] && seen[r][0], "no string for result %d", r);
    ck_assert_msg(strcmp(seen[r], unknown) != 0, "result %d has the string of an unknown code: %s", r, seen[r]);
    for (int q = 0; q < r; q++) ck_assert_msg(strcmp(seen[q], seen[r]) != 0, "results %d and %d share \"%s\"", q, r, seen[r]);
    ck_assert_str_eq(flexcoll_get_error_string((flexcoll_result_t)r), seen[r]);
  }
  ck_assert_str_eq(flexcoll_get_error_string(FLEXCOLL_SUCCESS), "no error");
  ck_assert_ptr_nonnull(strstr(flexcoll_get_error_string(FLEXCOLL_INVALID_ARGUMENT), "argument"));
  ck_assert_ptr_nonnull(strstr(flexcoll_get_error_string(FLEXCOLL_INVALID_USAGE), "usage"));
  ck_assert_ptr_nonnull(strstr(flexcoll_get_error_string(FLEXCOLL_TIMEOUT), "time"));
  ck_assert_ptr_nonnull(strstr(flexcoll_get_error_string(FLEXCOLL_REMOTE_ERROR), "remote"));
  ck_assert_ptr_nonnull(strstr(flexcoll_get_error_string(FLEXCOLL_UNHANDLED_CUDA_ERROR), "CUDA"));
  static const int bad[] = {-1, FLEXCOLL_NUM_RESULTS, 99, 1000000, -2147483647 - 1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *s = flexcoll_get_error_string((flexcoll_result_t)bad[i]);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, unknown);
  }
  /* Values line up with NCCL's ncclResult_t. */
  ck_assert_int_eq(FLEXCOLL_SUCCESS, 0);
  ck_assert_int_eq(FLEXCOLL_INVALID_ARGUMENT, 4);
  ck_assert_int_eq(FLEXCOLL_INVALID_USAGE, 5);
  ck_assert_int_eq(FLEXCOLL_REMOTE_ERROR, 6);
  ck_assert_int_eq(FLEXCOLL_IN_PROGRESS, 7);
}
END_TEST

static char other_thread_error[512];
static flexcoll_result_t other_thread_res;
static void *error_in_thread(void *arg) {
  (void)arg;
  const char *e = flexcoll_get_last_error(NULL);
  /* A new thread has a last error, empty: nothing failed in it yet. */
  snprintf(other_thread_error, sizeof other_thread_error, "%s", e ? e : "(null)");
  other_thread_res = flexcoll_comm_destroy(NULL);
  return NULL;
}

START_TEST(test_last_error_per_thread) {
  EXPECT_ERR(flexcoll_get_version(NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "version");
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, error_in_thread, NULL), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_str_eq(other_thread_error, "");
  ck_assert_int_eq(other_thread_res, FLEXCOLL_INVALID_ARGUMENT);
  /* This thread's message is still its own. */
  ck_assert_ptr_nonnull(strstr(flexcoll_get_last_error(NULL), "version"));
  ck_assert_ptr_null(strstr(flexcoll_get_last_error(NULL), "destroy"));
}
END_TEST

/* ---- unique id and init_rank ------------------------------------------------------------------- */

START_TEST(test_unique_id) {
  EXPECT_ERR(flexcoll_get_unique_id(NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "id");
  flexcoll_unique_id_t a, b;
  EXPECT_OK(flexcoll_get_unique_id(&a));
  EXPECT_OK(flexcoll_get_unique_id(&b));
  ck_assert_msg(memcmp(&a, &b, sizeof a) != 0, "two calls returned the same unique id");
}
END_TEST

START_TEST(test_init_rank_bad_args) {
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(2000);
  flexcoll_comm_t comm;

  EXPECT_ERR(flexcoll_comm_init_rank(NULL, 1, id, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");

  static const int bad_nranks[] = {0, -1, -2147483647 - 1, 65536, 2147483647};
  for (size_t i = 0; i < sizeof bad_nranks / sizeof bad_nranks[0]; i++) {
    CTX("nranks %d", bad_nranks[i]);
    comm = (flexcoll_comm_t)(uintptr_t)0x1;
    EXPECT_ERR(flexcoll_comm_init_rank(&comm, bad_nranks[i], id, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "nranks");
    ck_assert_ptr_null(comm);
  }
  static const int bad_rank[][2] = {{-1, 1}, {1, 1}, {2, 2}, {-2147483647 - 1, 4}, {5, 4}, {2147483647, 65535}};
  for (size_t i = 0; i < sizeof bad_rank / sizeof bad_rank[0]; i++) {
    CTX("rank %d of %d", bad_rank[i][0], bad_rank[i][1]);
    comm = (flexcoll_comm_t)(uintptr_t)0x1;
    EXPECT_ERR(flexcoll_comm_init_rank(&comm, bad_rank[i][1], id, bad_rank[i][0], &cfg), FLEXCOLL_INVALID_ARGUMENT,
               NULL, "rank");
    ck_assert_ptr_null(comm);
    ck_assert_ptr_null(strstr(flexcoll_get_last_error(NULL), "nranks"));
  }
}
END_TEST

START_TEST(test_init_rank_bad_config) {
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_comm_t comm = (flexcoll_comm_t)(uintptr_t)0x1;

  /* Not started from FLEXCOLL_CONFIG_INITIALIZER. */
  flexcoll_config_t zero;
  memset(&zero, 0, sizeof zero);
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, id, 0, &zero), FLEXCOLL_INVALID_ARGUMENT, NULL, "config");
  ck_assert_ptr_null(comm);

  flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
  cfg.version = 0;
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, id, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "config");
  cfg.version = FLEXCOLL_CONFIG_VERSION + 1; /* from a newer flexcoll.h than this library */
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, id, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "config");
  cfg.version = FLEXCOLL_CONFIG_VERSION;
  cfg.size = 3; /* not even the size and version fields */
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, id, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "config");

  flexcoll_config_t neg = FLEXCOLL_CONFIG_INITIALIZER;
  neg.timeout_ms = 0;
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, id, 0, &neg), FLEXCOLL_INVALID_ARGUMENT, NULL, "timeout_ms");
  neg.timeout_ms = -5;
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, id, 0, &neg), FLEXCOLL_INVALID_ARGUMENT, NULL, "timeout_ms");
  ck_assert_ptr_null(comm);
  flexcoll_config_t blk = FLEXCOLL_CONFIG_INITIALIZER;
  blk.blocking = 2; /* neither blocking nor not */
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, id, 0, &blk), FLEXCOLL_INVALID_ARGUMENT, NULL, "config.blocking");
  blk.blocking = -5;
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, id, 0, &blk), FLEXCOLL_INVALID_ARGUMENT, NULL, "config.blocking");
  ck_assert_ptr_null(comm);

  /* The failures did not use the id up: a good config still works with it. */
  flexcoll_config_t good = host_config(5000);
  EXPECT_OK(flexcoll_comm_init_rank(&comm, 1, id, 0, &good));
  EXPECT_OK(flexcoll_comm_destroy(comm));
}
END_TEST

START_TEST(test_init_rank_bad_cuda_device) {
  /* config.cuda_device is -1 (host only), FLEXCOLL_CONFIG_UNDEF (the current device) or a device
   * number; any other negative value is a mistake, with or without GPUs. */
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(2000);
  static const int bad[] = {-5, -2, -2147483647};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cfg.cuda_device = bad[i];
    flexcoll_comm_t comm = (flexcoll_comm_t)(uintptr_t)0x1;
    CTX("cuda_device %d", bad[i]);
    flexcoll_result_t res = flexcoll_comm_init_rank(&comm, 1, id, 0, &cfg);
    if (res == FLEXCOLL_SUCCESS) flexcoll_comm_destroy(comm);
    ck_assert_msg(res == FLEXCOLL_INVALID_ARGUMENT, "[%s] init_rank returned %d (%s), expected INVALID_ARGUMENT", ta_ctx,
                  res, flexcoll_get_error_string(res));
    ck_assert_msg(strstr(flexcoll_get_last_error(NULL), "cuda_device"), "[%s] last error \"%s\" does not name cuda_device",
                  ta_ctx, flexcoll_get_last_error(NULL));
    ck_assert_ptr_null(comm);
  }
}
END_TEST

START_TEST(test_init_rank_old_config) {
  /* A caller built against an older, shorter flexcoll_config_t (no timeout_ms, no blocking) is
   * valid: the fields it does not know take their defaults. */
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(-7); /* beyond the caller's struct: must be ignored */
  cfg.size = offsetof(flexcoll_config_t, timeout_ms);
  flexcoll_comm_t comm = NULL;
  EXPECT_OK(flexcoll_comm_init_rank(&comm, 1, id, 0, &cfg));
  int dev = 0;
  EXPECT_OK(flexcoll_comm_cu_device(comm, &dev));
  ck_assert_int_eq(dev, -1);
  EXPECT_OK(flexcoll_comm_destroy(comm));
}
END_TEST

START_TEST(test_init_rank_damaged_id) {
  flexcoll_config_t cfg = host_config(2000);
  flexcoll_comm_t comm = (flexcoll_comm_t)(uintptr_t)0x1;
  flexcoll_unique_id_t id, bad;
  EXPECT_OK(flexcoll_get_unique_id(&id));

  /* All zeros: never came from flexcoll_get_unique_id. */
  memset(&bad, 0, sizeof bad);
  double t0 = ta_now_ms();
  CTX("zero id");
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, bad, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "unique id");
  ck_assert_ptr_null(comm);

  /* A flipped magic byte, as if copied wrong between processes: the checksum catches it. */
  bad = id;
  bad.internal[ID_MAGIC_OFF + 3] ^= 0x5a;
  CTX("flipped magic byte");
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, bad, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "unique id");

  /* Garbage in the padding. */
  bad = id;
  bad.internal[FLEXCOLL_UNIQUE_ID_BYTES - 1] = 1;
  CTX("padding");
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, bad, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "unique id");
  ck_assert_msg(ta_now_ms() - t0 < 1000, "malformed ids must fail at once, took %.0f ms", ta_now_ms() - t0);

  /* A well-formed id with another magic, sent to the live root of id: the root answers nothing
   * (a stranger learns nothing about the job), so the rank retries until its timeout. */
  bad = id;
  for (int i = 0; i < 8; i++) bad.internal[ID_MAGIC_OFF + i] ^= (char)(0x11 * (i + 1));
  id_fix_checksum(&bad);
  t0 = ta_now_ms();
  CTX("other magic, live root");
  EXPECT_ERR(flexcoll_comm_init_rank(&comm, 1, bad, 0, &cfg), FLEXCOLL_INVALID_ARGUMENT, NULL, "unique id");
  ck_assert_ptr_null(comm);
  ck_assert_msg(ta_now_ms() - t0 < 2000 + 3000, "the rank must give up at its timeout, took %.0f ms", ta_now_ms() - t0);

  /* The stranger did not disturb the root: the real id still works. */
  CTX("real id");
  EXPECT_OK(flexcoll_comm_init_rank(&comm, 1, id, 0, &cfg));
  EXPECT_OK(flexcoll_comm_destroy(comm));
}
END_TEST

START_TEST(test_init_rank_dead_root) {
  /* An id whose root process has exited: nobody accepts; init gives up within its timeout. */
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    flexcoll_unique_id_t cid;
    memset(&cid, 0, sizeof cid);
    flexcoll_get_unique_id(&cid);
    ssize_t k = write(fds[1], &cid, sizeof cid);
    _exit(k == (ssize_t)sizeof cid ? 0 : 1);
  }
  flexcoll_unique_id_t id;
  ck_assert_int_eq(read(fds[0], &id, sizeof id), (ssize_t)sizeof id);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(fds[0]);
  close(fds[1]);

  const int timeout_ms = 2000;
  flexcoll_config_t cfg = host_config(timeout_ms);
  flexcoll_comm_t comm = (flexcoll_comm_t)(uintptr_t)0x1;
  double t0 = ta_now_ms();
  flexcoll_result_t res = flexcoll_comm_init_rank(&comm, 2, id, 1, &cfg);
  double took = ta_now_ms() - t0;
  const char *e = flexcoll_get_last_error(NULL);
  ck_assert_msg(res == FLEXCOLL_TIMEOUT || res == FLEXCOLL_REMOTE_ERROR, "init with a dead root returned %d (%s): %s",
                res, flexcoll_get_error_string(res), e);
  ck_assert_ptr_null(comm);
  ck_assert_msg(took < 3.0 * timeout_ms, "init with a dead root took %.0f ms (timeout %d ms)", took, timeout_ms);
  ck_assert_msg(e && strstr(e, "root"), "last error \"%s\" does not mention the root", e);
}
END_TEST

START_TEST(test_init_rank_nranks_mismatch) {
  /* Two ranks that disagree on the number of ranks: both fail at once, naming the problem. */
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(5000);
  flexcoll_comm_t a = NULL, b = NULL;
  double t0 = ta_now_ms();
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_comm_init_rank(&a, 2, id, 0, &cfg));
  EXPECT_OK(flexcoll_comm_init_rank(&b, 3, id, 1, &cfg));
  EXPECT_ERR(flexcoll_group_end(), FLEXCOLL_INVALID_ARGUMENT, NULL, "ranks");
  ck_assert_msg(ta_now_ms() - t0 < 4000, "mismatched nranks took %.0f ms to fail", ta_now_ms() - t0);
  /* Failed communicators handed out by a group: only destroy is allowed. */
  int n;
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(b);
  ck_assert_ptr_nonnull(strstr(flexcoll_get_last_error(a), "ranks"));
  ck_assert_ptr_nonnull(strstr(flexcoll_get_last_error(b), "ranks"));
  EXPECT_ERR(flexcoll_comm_count(a, &n), FLEXCOLL_INVALID_USAGE, NULL, "initialise");
  EXPECT_ERR(flexcoll_allreduce(&n, &n, 1, FLEXCOLL_INT32, FLEXCOLL_SUM, b, NULL), FLEXCOLL_INVALID_USAGE, NULL,
             "initialise");
  EXPECT_OK(flexcoll_comm_destroy(a));
  EXPECT_OK(flexcoll_comm_destroy(b));
}
END_TEST

/* ---- init_all ------------------------------------------------------------------------------------ */

START_TEST(test_init_all_bad_args) {
  flexcoll_comm_t comms[4];
  int devs[2] = {-1, 0};
  EXPECT_ERR(flexcoll_comm_init_all(NULL, 2, NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "comms");
  EXPECT_ERR(flexcoll_comm_init_all(comms, 0, NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "ndev");
  EXPECT_ERR(flexcoll_comm_init_all(comms, -3, NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "ndev");
  for (int i = 0; i < 4; i++) comms[i] = (flexcoll_comm_t)(uintptr_t)(0x10 + i);
  EXPECT_ERR(flexcoll_comm_init_all(comms, 2, devs), FLEXCOLL_INVALID_ARGUMENT, NULL, "devlist");
  /* Refused, the entries it was asked for hold no handle (a cleanup loop may destroy them). */
  ck_assert_ptr_null(comms[0]);
  ck_assert_ptr_null(comms[1]);
  devs[0] = 1 << 20;
  EXPECT_ERR(flexcoll_comm_init_all(comms, 1, devs), FLEXCOLL_INVALID_ARGUMENT, NULL, "devlist");
}
END_TEST

START_TEST(test_init_all_host) {
  /* No GPU visible: devlist NULL gives host ranks, device -1. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  flexcoll_comm_t comms[3] = {NULL, NULL, NULL};
  EXPECT_OK(flexcoll_comm_init_all(comms, 3, NULL));
  int in[3][5], out[3][5];
  for (int r = 0; r < 3; r++) {
    int v;
    EXPECT_OK(flexcoll_comm_count(comms[r], &v));
    ck_assert_int_eq(v, 3);
    EXPECT_OK(flexcoll_comm_user_rank(comms[r], &v));
    ck_assert_int_eq(v, r);
    EXPECT_OK(flexcoll_comm_cu_device(comms[r], &v));
    ck_assert_int_eq(v, -1);
    for (int i = 0; i < 5; i++) in[r][i] = (r + 1) * (i + 1), out[r][i] = 0;
  }
  EXPECT_OK(flexcoll_group_start());
  for (int r = 0; r < 3; r++) EXPECT_OK(flexcoll_allreduce(in[r], out[r], 5, FLEXCOLL_INT32, FLEXCOLL_SUM, comms[r], NULL));
  EXPECT_OK(flexcoll_group_end());
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < 5; i++) ck_assert_int_eq(out[r][i], 6 * (i + 1));
  destroy_concurrently(comms, 3);
}
END_TEST

START_TEST(test_destroy_sequential) {
  /* The usual clean-up after flexcoll_comm_init_all: destroy the communicators one after the other
   * from one thread.  Nothing is in flight (every collective has returned), so each destroy must be
   * prompt; it must not wait for a peer that nobody progresses until the timeout. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  setenv("FLEXCOLL_TIMEOUT_MS", "4000", 1); /* bounds the cost of a failure (the default is minutes) */
  flexcoll_comm_t comms[3] = {NULL, NULL, NULL};
  EXPECT_OK(flexcoll_comm_init_all(comms, 3, NULL));
  int in[3] = {1, 2, 3}, out[3] = {0};
  EXPECT_OK(flexcoll_group_start());
  for (int r = 0; r < 3; r++) EXPECT_OK(flexcoll_allreduce(&in[r], &out[r], 1, FLEXCOLL_INT32, FLEXCOLL_SUM, comms[r], NULL));
  EXPECT_OK(flexcoll_group_end());
  double took[3];
  for (int r = 0; r < 3; r++) {
    double t0 = ta_now_ms();
    EXPECT_OK(flexcoll_comm_destroy(comms[r]));
    took[r] = ta_now_ms() - t0;
  }
  for (int r = 0; r < 3; r++)
    ck_assert_msg(took[r] < 1000, "destroying rank %d of an init_all communicator took %.0f ms (%.0f / %.0f / %.0f ms)", r,
                  took[r], took[0], took[1], took[2]);
}
END_TEST

/* ---- collectives: argument checks ------------------------------------------------------------------ */

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_BROADCAST, C_REDUCE, C_NUM };
static const char *const coll_names[C_NUM] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"};

static flexcoll_result_t call_coll(int coll, const void *s, void *r, size_t count, int dtype, int op, int root,
                                   flexcoll_comm_t comm) {
  flexcoll_datatype_t d = (flexcoll_datatype_t)dtype;
  flexcoll_op_t o = (flexcoll_op_t)op;
  switch (coll) {
    case C_ALLREDUCE: return flexcoll_allreduce(s, r, count, d, o, comm, NULL);
    case C_ALLGATHER: return flexcoll_allgather(s, r, count, d, comm, NULL);
    case C_REDUCE_SCATTER: return flexcoll_reduce_scatter(s, r, count, d, o, comm, NULL);
    case C_BROADCAST: return flexcoll_broadcast(s, r, count, d, root, comm, NULL);
    default: return flexcoll_reduce(s, r, count, d, o, root, comm, NULL);
  }
}

static int coll_has_op(int coll) { return coll == C_ALLREDUCE || coll == C_REDUCE_SCATTER || coll == C_REDUCE; }

START_TEST(test_coll_null_comm) {
  float buf[4] = {0};
  for (int coll = 0; coll < C_NUM; coll++) {
    CTX("%s", coll_names[coll]);
    EXPECT_ERR(call_coll(coll, buf, buf, 4, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0, NULL), FLEXCOLL_INVALID_ARGUMENT, NULL,
               "comm");
    /* count 0 does not skip the check. */
    EXPECT_ERR(call_coll(coll, NULL, NULL, 0, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0, NULL), FLEXCOLL_INVALID_ARGUMENT,
               NULL, "comm");
  }
}
END_TEST

START_TEST(test_coll_bad_dtype_op) {
  flexcoll_comm_t comm = make_comm1();
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  static const int bad[] = {99, -1, FLEXCOLL_NUM_DATATYPES, 1 << 30, -2147483647 - 1};
  static const int bad_op[] = {99, -1, FLEXCOLL_NUM_OPS, 1 << 30};
  for (int coll = 0; coll < C_NUM; coll++) {
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      CTX("%s datatype %d", coll_names[coll], bad[i]);
      EXPECT_ERR(call_coll(coll, in, out, 4, bad[i], FLEXCOLL_SUM, 0, comm), FLEXCOLL_INVALID_ARGUMENT, comm,
                 "datatype");
      /* Even with count 0 the call is wrong. */
      EXPECT_ERR(call_coll(coll, NULL, NULL, 0, bad[i], FLEXCOLL_SUM, 0, comm), FLEXCOLL_INVALID_ARGUMENT, comm,
                 "datatype");
    }
    if (!coll_has_op(coll)) continue;
    for (size_t i = 0; i < sizeof bad_op / sizeof bad_op[0]; i++) {
      CTX("%s op %d", coll_names[coll], bad_op[i]);
      char want[32];
      snprintf(want, sizeof want, "op %d", bad_op[i]);
      EXPECT_ERR(call_coll(coll, in, out, 4, FLEXCOLL_FLOAT32, bad_op[i], 0, comm), FLEXCOLL_INVALID_ARGUMENT, comm,
                 want);
      EXPECT_ERR(call_coll(coll, NULL, NULL, 0, FLEXCOLL_FLOAT32, bad_op[i], 0, comm), FLEXCOLL_INVALID_ARGUMENT, comm,
                 want);
    }
  }
  /* Nothing was written. */
  for (int i = 0; i < 4; i++) ck_assert_float_eq(out[i], 0.0f);
  EXPECT_OK(flexcoll_comm_destroy(comm));
}
END_TEST

START_TEST(test_coll_bad_root) {
  flexcoll_comm_t pair[2];
  make_pair(pair);
  int in[8] = {0}, out[8] = {0};
  static const int bad[] = {-1, 2, 3, 1 << 20, -2147483647 - 1};
  for (int coll = C_BROADCAST; coll <= C_REDUCE; coll++)
    for (int k = 0; k < 2; k++)
      for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CTX("%s root %d on rank %d of 2", coll_names[coll], bad[i], k);
        EXPECT_ERR(call_coll(coll, in, out, 8, FLEXCOLL_INT32, FLEXCOLL_SUM, bad[i], pair[k]), FLEXCOLL_INVALID_ARGUMENT,
                   pair[k], "root");
        EXPECT_ERR(call_coll(coll, NULL, NULL, 0, FLEXCOLL_INT32, FLEXCOLL_SUM, bad[i], pair[k]),
                   FLEXCOLL_INVALID_ARGUMENT, pair[k], "root");
      }
  /* One rank: only root 0 exists. */
  flexcoll_comm_t one = make_comm1();
  for (int coll = C_BROADCAST; coll <= C_REDUCE; coll++) {
    CTX("%s on one rank", coll_names[coll]);
    EXPECT_ERR(call_coll(coll, in, out, 8, FLEXCOLL_INT32, FLEXCOLL_SUM, 1, one), FLEXCOLL_INVALID_ARGUMENT, one, "root");
    EXPECT_ERR(call_coll(coll, in, out, 8, FLEXCOLL_INT32, FLEXCOLL_SUM, -1, one), FLEXCOLL_INVALID_ARGUMENT, one, "root");
  }
  EXPECT_OK(flexcoll_comm_destroy(one));
  destroy_concurrently(pair, 2);
}
END_TEST

START_TEST(test_coll_null_buffers) {
  flexcoll_comm_t comm = make_comm1();
  double buf[4] = {1, 2, 3, 4}, out[4] = {0};
  for (int coll = 0; coll < C_NUM; coll++) {
    CTX("%s", coll_names[coll]);
    /* Root 0 is this rank: every collective needs both buffers. */
    EXPECT_ERR(call_coll(coll, NULL, out, 4, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, 0, comm), FLEXCOLL_INVALID_ARGUMENT, comm,
               "sendbuf");
    EXPECT_ERR(call_coll(coll, buf, NULL, 4, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, 0, comm), FLEXCOLL_INVALID_ARGUMENT, comm,
               "recvbuf");
    EXPECT_ERR(call_coll(coll, NULL, NULL, 1, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, 0, comm), FLEXCOLL_INVALID_ARGUMENT, comm,
               "buf");
    /* count 0 with NULL buffers is a valid no-op. */
    EXPECT_OK(call_coll(coll, NULL, NULL, 0, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, 0, comm));
    EXPECT_OK(call_coll(coll, buf, NULL, 0, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, 0, comm));
    EXPECT_OK(call_coll(coll, NULL, out, 0, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, 0, comm));
  }
  for (int i = 0; i < 4; i++) ck_assert_double_eq(out[i], 0.0);
  /* The communicator is still fine after all those refusals. */
  CTX("good call");
  EXPECT_OK(flexcoll_allreduce(buf, out, 4, FLEXCOLL_FLOAT64, FLEXCOLL_SUM, comm, NULL));
  for (int i = 0; i < 4; i++) ck_assert_double_eq(out[i], buf[i]);
  EXPECT_OK(flexcoll_comm_destroy(comm));
}
END_TEST

START_TEST(test_coll_null_buffers_nonroot) {
  /* A non-root rank needs no sendbuf for broadcast and no recvbuf for reduce; it still needs the
   * other one.  Run for real over two ranks with the unused buffer NULL. */
  flexcoll_comm_t c[2];
  make_pair(c);
  int in0[4] = {1, 2, 3, 4}, in1[4] = {10, 20, 30, 40}, out0[4] = {0}, out1[4] = {0};
  EXPECT_ERR(flexcoll_broadcast(in0, NULL, 4, FLEXCOLL_INT32, 0, c[1], NULL), FLEXCOLL_INVALID_ARGUMENT, c[1], "recvbuf");
  EXPECT_ERR(flexcoll_broadcast(NULL, out0, 4, FLEXCOLL_INT32, 0, c[0], NULL), FLEXCOLL_INVALID_ARGUMENT, c[0], "sendbuf");
  EXPECT_ERR(flexcoll_reduce(NULL, out1, 4, FLEXCOLL_INT32, FLEXCOLL_SUM, 0, c[1], NULL), FLEXCOLL_INVALID_ARGUMENT, c[1],
             "sendbuf");
  EXPECT_ERR(flexcoll_reduce(in0, NULL, 4, FLEXCOLL_INT32, FLEXCOLL_SUM, 0, c[0], NULL), FLEXCOLL_INVALID_ARGUMENT, c[0],
             "recvbuf");
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_broadcast(in0, out0, 4, FLEXCOLL_INT32, 0, c[0], NULL));
  EXPECT_OK(flexcoll_broadcast(NULL, out1, 4, FLEXCOLL_INT32, 0, c[1], NULL));
  EXPECT_OK(flexcoll_group_end());
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(out0[i], in0[i]);
    ck_assert_int_eq(out1[i], in0[i]);
  }
  memset(out0, 0, sizeof out0);
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_reduce(in0, out0, 4, FLEXCOLL_INT32, FLEXCOLL_SUM, 0, c[0], NULL));
  EXPECT_OK(flexcoll_reduce(in1, NULL, 4, FLEXCOLL_INT32, FLEXCOLL_SUM, 0, c[1], NULL));
  EXPECT_OK(flexcoll_group_end());
  for (int i = 0; i < 4; i++) ck_assert_int_eq(out0[i], in0[i] + in1[i]);
  destroy_concurrently(c, 2);
}
END_TEST

START_TEST(test_coll_count_overflow) {
  /* count × element size (× nranks for the gathered side) does not fit in a size_t or in the
   * signed 64-bit byte counts of the transports: refused before anything is touched. */
  flexcoll_comm_t one = make_comm1();
  flexcoll_comm_t pair[2];
  make_pair(pair);
  static char buf[64];
  struct {
    size_t count;
    int dtype;
  } one_cases[] = {
      {SIZE_MAX, FLEXCOLL_INT8},          {SIZE_MAX, FLEXCOLL_FLOAT32},      {SIZE_MAX / 2, FLEXCOLL_FLOAT32},
      {SIZE_MAX / 2, FLEXCOLL_FLOAT16},   {SIZE_MAX / 2, FLEXCOLL_BFLOAT16}, {SIZE_MAX / 2 + 1, FLEXCOLL_INT8},
      {SIZE_MAX / 4 + 1, FLEXCOLL_INT32}, {SIZE_MAX / 8 + 1, FLEXCOLL_FLOAT64}, {SIZE_MAX / 16 + 1, FLEXCOLL_UINT64},
      {(size_t)1 << 62, FLEXCOLL_UINT64},
  };
  for (int coll = 0; coll < C_NUM; coll++)
    for (size_t i = 0; i < sizeof one_cases / sizeof one_cases[0]; i++) {
      CTX("%s count %zu datatype %d on one rank", coll_names[coll], one_cases[i].count, one_cases[i].dtype);
      EXPECT_ERR(call_coll(coll, buf, buf + 32, one_cases[i].count, one_cases[i].dtype, FLEXCOLL_SUM, 0, one),
                 FLEXCOLL_INVALID_ARGUMENT, one, "count");
    }
  /* On two ranks, allgather's recvbuf and reduce_scatter's sendbuf hold 2 × count elements. */
  struct {
    int coll;
    size_t count;
    int dtype;
  } pair_cases[] = {
      {C_ALLGATHER, SIZE_MAX / 2 + 1, FLEXCOLL_INT8},      {C_ALLGATHER, (size_t)1 << 62, FLEXCOLL_INT8},
      {C_ALLGATHER, (size_t)1 << 61, FLEXCOLL_FLOAT16},    {C_REDUCE_SCATTER, SIZE_MAX / 2 + 1, FLEXCOLL_UINT8},
      {C_REDUCE_SCATTER, (size_t)1 << 62, FLEXCOLL_INT8},  {C_REDUCE_SCATTER, (size_t)1 << 60, FLEXCOLL_INT64},
      {C_ALLREDUCE, SIZE_MAX / 2, FLEXCOLL_FLOAT32},       {C_BROADCAST, SIZE_MAX, FLEXCOLL_INT8},
      {C_REDUCE, SIZE_MAX / 4 + 1, FLEXCOLL_FLOAT32},
  };
  for (size_t i = 0; i < sizeof pair_cases / sizeof pair_cases[0]; i++)
    for (int k = 0; k < 2; k++) {
      CTX("%s count %zu datatype %d on rank %d of 2", coll_names[pair_cases[i].coll], pair_cases[i].count,
          pair_cases[i].dtype, k);
      EXPECT_ERR(call_coll(pair_cases[i].coll, buf, buf + 32, pair_cases[i].count, pair_cases[i].dtype, FLEXCOLL_SUM, 0,
                           pair[k]),
                 FLEXCOLL_INVALID_ARGUMENT, pair[k], "count");
    }
  /* Still usable afterwards. */
  CTX("after overflow");
  int a = 5, b = 0;
  EXPECT_OK(flexcoll_allreduce(&a, &b, 1, FLEXCOLL_INT32, FLEXCOLL_MAX, one, NULL));
  ck_assert_int_eq(b, 5);
  EXPECT_OK(flexcoll_comm_destroy(one));
  destroy_concurrently(pair, 2);
}
END_TEST

START_TEST(test_coll_partial_overlap) {
  /* Buffers that overlap other than in NCCL's in-place forms used to return SUCCESS with wrong
   * data (different on each rank): refused now, naming the buffers, before anything moves.  The
   * in-place forms still run and give the right results, as do overlaps in a buffer the rank
   * ignores (a broadcast's non-root sendbuf, a reduce's non-root recvbuf).  Alltoall runs in
   * place when sendbuf == recvbuf exactly (as NCCL allows); any other overlap is refused. */
  flexcoll_comm_t c[2];
  make_pair(c);
  enum { N = 8 };
  int32_t buf[2][4 * N];
  memset(buf, 0, sizeof buf);
  struct {
    int coll, rank;
    ptrdiff_t send_off, recv_off; /* elements into buf[rank] */
  } bad[] = {
      {C_ALLREDUCE, 0, 0, 1},      {C_ALLREDUCE, 1, 1, 0},      {C_ALLREDUCE, 0, 0, N - 1},
      {C_ALLGATHER, 1, 0, 0},      /* slot 0 is rank 0's */
      {C_ALLGATHER, 0, N, 0},      {C_ALLGATHER, 1, N + 1, 0},  {C_ALLGATHER, 0, 2 * N - 1, 0},
      {C_REDUCE_SCATTER, 1, 0, 0}, {C_REDUCE_SCATTER, 0, 0, N}, {C_REDUCE_SCATTER, 0, 0, 1},
      {C_REDUCE_SCATTER, 1, 1, 0}, {C_BROADCAST, 0, 0, 1},      {C_BROADCAST, 0, 3, 0},
      {C_REDUCE, 0, 0, 1},         {C_REDUCE, 0, 1, 0},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int k = bad[i].rank;
    CTX("%s on rank %d: sendbuf at %td, recvbuf at %td", coll_names[bad[i].coll], k, bad[i].send_off, bad[i].recv_off);
    int32_t *s = buf[k] + bad[i].send_off, *r = buf[k] + bad[i].recv_off;
    EXPECT_ERR(call_coll(bad[i].coll, s, r, N, FLEXCOLL_INT32, FLEXCOLL_SUM, 0, c[k]), FLEXCOLL_INVALID_ARGUMENT, c[k],
               "sendbuf and recvbuf overlap");
    /* A count of 0 moves nothing, whatever the pointers. */
    EXPECT_OK(call_coll(bad[i].coll, s, r, 0, FLEXCOLL_INT32, FLEXCOLL_SUM, 0, c[k]));
  }
  /* Alltoall's buffers hold 2 x N elements each on 2 ranks. */
  static const struct {
    int rank;
    ptrdiff_t send_off, recv_off;
  } bad_a2a[] = {{0, 0, 1}, {1, 1, 0}, {0, N, 0}, {1, 0, 2 * N - 1}};
  for (size_t i = 0; i < sizeof bad_a2a / sizeof bad_a2a[0]; i++) {
    int k = bad_a2a[i].rank;
    CTX("alltoall on rank %d: sendbuf at %td, recvbuf at %td", k, bad_a2a[i].send_off, bad_a2a[i].recv_off);
    int32_t *s = buf[k] + bad_a2a[i].send_off, *r = buf[k] + bad_a2a[i].recv_off;
    EXPECT_ERR(flexcoll_alltoall(s, r, N, FLEXCOLL_INT32, c[k], NULL), FLEXCOLL_INVALID_ARGUMENT, c[k],
               "sendbuf and recvbuf overlap partially");
    EXPECT_OK(flexcoll_alltoall(s, r, 0, FLEXCOLL_INT32, c[k], NULL));
  }
  /* Nothing was written, and the ranks are still in step: what is allowed runs for real. */
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 4 * N; i++) ck_assert_int_eq(buf[k][i], 0);
  int32_t ag[2][2 * N], rs[2][2 * N], ar[2][N], bc[2][N + 1], rd[2][N + 1], a2a[2][2 * N];
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 2 * N; i++) ag[k][i] = i / N == k ? 100 * k + i % N : -1, rs[k][i] = 10 * k + i;
    for (int i = 0; i < 2 * N; i++) a2a[k][i] = 1000 * (k + 1) + i;
    for (int i = 0; i < N; i++) ar[k][i] = k + i;
    for (int i = 0; i <= N; i++) bc[k][i] = k == 0 ? 7 * (i - 1) : -1, rd[k][i] = k == 0 ? i : 1000 + i;
  }
  CTX("in-place forms");
  EXPECT_OK(flexcoll_group_start());
  for (int k = 0; k < 2; k++) {
    EXPECT_OK(flexcoll_allgather(ag[k] + k * N, ag[k], N, FLEXCOLL_INT32, c[k], NULL));
    EXPECT_OK(flexcoll_reduce_scatter(rs[k], rs[k] + k * N, N, FLEXCOLL_INT32, FLEXCOLL_SUM, c[k], NULL));
    EXPECT_OK(flexcoll_allreduce(ar[k], ar[k], N, FLEXCOLL_INT32, FLEXCOLL_SUM, c[k], NULL));
    /* The root runs in place; rank 1's sendbuf (broadcast) and recvbuf (reduce) are ignored, so
     * their overlap with the buffer it does use is no error. */
    EXPECT_OK(flexcoll_broadcast(k == 0 ? bc[0] + 1 : bc[1], bc[k] + 1, N, FLEXCOLL_INT32, 0, c[k], NULL));
    EXPECT_OK(flexcoll_reduce(k == 0 ? rd[0] : rd[1] + 1, rd[k], N, FLEXCOLL_INT32, FLEXCOLL_SUM, 0, c[k], NULL));
    EXPECT_OK(flexcoll_alltoall(a2a[k], a2a[k], N, FLEXCOLL_INT32, c[k], NULL));
  }
  EXPECT_OK(flexcoll_group_end());
  for (int k = 0; k < 2; k++) {
    CTX("in-place results on rank %d", k);
    for (int i = 0; i < 2 * N; i++) ck_assert_int_eq(ag[k][i], 100 * (i / N) + i % N);
    for (int i = 0; i < N; i++) ck_assert_int_eq(rs[k][k * N + i], (k * N + i) + (10 + k * N + i));
    for (int i = 0; i < N; i++) ck_assert_int_eq(ar[k][i], 2 * i + 1);
    for (int i = 0; i < N; i++) ck_assert_int_eq(bc[k][i + 1], 7 * i);
    /* Block q: what rank q's buffer held at block k, as out of place. */
    for (int i = 0; i < 2 * N; i++) ck_assert_int_eq(a2a[k][i], 1000 * (i / N + 1) + k * N + i % N);
  }
  for (int i = 0; i < N; i++) ck_assert_int_eq(rd[0][i], i + (1000 + i + 1));
  destroy_concurrently(c, 2);
}
END_TEST

/* Under ASan (./configure --enable-sanitizers) a malloc that cannot be satisfied must return NULL,
 * as it does in production, instead of aborting: test_coll_out_of_memory depends on it. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* Both ranks of c refused a call for memory it could not allocate: the last error says so with
 * the bytes, and the communicators are not failed (the call was refused before anything moved). */
static void expect_refused_allocation(flexcoll_comm_t *c) {
  for (int k = 0; k < 2; k++) {
    const char *e = flexcoll_get_last_error(c[k]);
    ck_assert_msg(strstr(e, "out of memory") && strstr(e, "bytes"), "[%s] rank %d: last error \"%s\"", ta_ctx, k, e);
    flexcoll_result_t ae = FLEXCOLL_INTERNAL_ERROR;
    EXPECT_OK(flexcoll_comm_get_async_error(c[k], &ae));
    ck_assert_msg(ae == FLEXCOLL_SUCCESS, "[%s] rank %d: async error %d after a refused allocation", ta_ctx, k, ae);
  }
}

START_TEST(test_coll_out_of_memory) {
  /* A count that passes every check but whose host scratch cannot be allocated: a 2-rank
   * allreduce of 2^58 int64 lands 2^60 bytes of received data, more than any address space.  Every
   * rank fails alike (they need the same sizes) with SYSTEM_ERROR before sending anything, and the
   * communicator stays usable; it used to be failed for good.  The buffers are small on purpose:
   * nothing may touch them before the allocation fails.  That allocation is the links'
   * executor's: the shared-memory path allocates nothing and would read the small buffers as
   * if they were that large, so it is off here (this test's own process). */
  setenv("FLEXCOLL_SHM_DIRECT", "0", 1);
  flexcoll_comm_t c[2];
  make_pair(c);
  static int64_t in[2][8], out[2][8];
  const size_t huge = (size_t)1 << 58;
  for (int coll = C_ALLREDUCE; coll <= C_REDUCE_SCATTER; coll++) {
    if (coll == C_ALLGATHER) continue; /* moves data without landing space */
    size_t count = coll == C_ALLREDUCE ? huge : huge / 2;
    CTX("%s of %zu int64 on 2 ranks", coll_names[coll], count);
    EXPECT_OK(flexcoll_group_start());
    /* In place, as ranges this large overlap whatever two small buffers they start at; rank 1's
     * reduce_scatter block lies far outside any mapping, which only a write would notice. */
    for (int k = 0; k < 2; k++) {
      void *recv = coll == C_ALLREDUCE ? (void *)in[k] : (void *)((uintptr_t)in[k] + (uintptr_t)k * count * 8);
      EXPECT_OK(call_coll(coll, in[k], recv, count, FLEXCOLL_INT64, FLEXCOLL_SUM, 0, c[k]));
    }
    EXPECT_ERR(flexcoll_group_end(), FLEXCOLL_SYSTEM_ERROR, c[0], "out of memory");
    expect_refused_allocation(c);
    /* The same communicators go on: a normal call succeeds with the right result. */
    CTX("allreduce after %s out of memory", coll_names[coll]);
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 8; i++) in[k][i] = 100 * k + i, out[k][i] = -1;
    EXPECT_OK(flexcoll_group_start());
    for (int k = 0; k < 2; k++) EXPECT_OK(flexcoll_allreduce(in[k], out[k], 8, FLEXCOLL_INT64, FLEXCOLL_SUM, c[k], NULL));
    EXPECT_OK(flexcoll_group_end());
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 8; i++) ck_assert_int_eq(out[k][i], 100 + 2 * i);
  }
  /* In-place alltoall: the copy of its input (2 x huge / 4 int64) cannot be allocated either. */
  CTX("in-place alltoall of %zu int64 on 2 ranks", huge / 4);
  EXPECT_OK(flexcoll_group_start());
  for (int k = 0; k < 2; k++) EXPECT_OK(flexcoll_alltoall(in[k], in[k], huge / 4, FLEXCOLL_INT64, c[k], NULL));
  EXPECT_ERR(flexcoll_group_end(), FLEXCOLL_SYSTEM_ERROR, c[0], "out of memory");
  expect_refused_allocation(c);
  CTX("in-place alltoall after in-place alltoall out of memory");
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 8; i++) in[k][i] = 100 * k + i;
  EXPECT_OK(flexcoll_group_start());
  for (int k = 0; k < 2; k++) EXPECT_OK(flexcoll_alltoall(in[k], in[k], 4, FLEXCOLL_INT64, c[k], NULL));
  EXPECT_OK(flexcoll_group_end());
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 8; i++) ck_assert_int_eq(in[k][i], 100 * (i / 4) + 4 * k + i % 4);
  destroy_concurrently(c, 2);
}
END_TEST

typedef struct {
  int coll;
  size_t count;
  flexcoll_comm_t comm;
  flexcoll_result_t res;
  double took;
  char err[512];
} mismatch_rank_t;

static void *mismatch_thread(void *arg) {
  mismatch_rank_t *m = arg;
  static _Thread_local int32_t in[64], out[64];
  for (int i = 0; i < 64; i++) in[i] = i, out[i] = -1;
  double t0 = ta_now_ms();
  m->res = call_coll(m->coll, in, out, m->count, FLEXCOLL_INT32, FLEXCOLL_SUM, 0, m->comm);
  m->took = ta_now_ms() - t0;
  snprintf(m->err, sizeof m->err, "%s", flexcoll_get_last_error(NULL));
  return NULL;
}

START_TEST(test_coll_count_mismatch) {
  /* Ranks that pass different counts: a rank that gets fewer elements than it asked for must not
   * report success (its buffer is only partly written); every such rank fails within the timeout. */
  struct {
    int coll;
    size_t count[2];
    int must_fail[2];
  } cases[] = {
      {C_ALLREDUCE, {4, 8}, {1, 1}},
      {C_ALLREDUCE, {8, 4}, {1, 1}},
      {C_BROADCAST, {4, 8}, {0, 1}}, /* rank 1 expects 8 elements from root 0, which sends 4 */
      {C_ALLGATHER, {4, 8}, {1, 1}},
  };
  const int timeout_ms = 1500;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    flexcoll_unique_id_t id;
    EXPECT_OK(flexcoll_get_unique_id(&id));
    flexcoll_config_t cfg = host_config(timeout_ms);
    flexcoll_comm_t c[2];
    EXPECT_OK(flexcoll_group_start());
    EXPECT_OK(flexcoll_comm_init_rank(&c[0], 2, id, 0, &cfg));
    EXPECT_OK(flexcoll_comm_init_rank(&c[1], 2, id, 1, &cfg));
    EXPECT_OK(flexcoll_group_end());
    mismatch_rank_t m[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
      memset(&m[r], 0, sizeof m[r]);
      m[r].coll = cases[i].coll;
      m[r].count = cases[i].count[r];
      m[r].comm = c[r];
      ck_assert_int_eq(pthread_create(&t[r], NULL, mismatch_thread, &m[r]), 0);
    }
    for (int r = 0; r < 2; r++) ck_assert_int_eq(pthread_join(t[r], NULL), 0);
    for (int r = 0; r < 2; r++) {
      CTX("%s counts %zu/%zu, rank %d", coll_names[cases[i].coll], cases[i].count[0], cases[i].count[1], r);
      if (cases[i].must_fail[r])
        ck_assert_msg(m[r].res != FLEXCOLL_SUCCESS, "[%s] returned SUCCESS with mismatched counts", ta_ctx);
      if (m[r].res != FLEXCOLL_SUCCESS)
        ck_assert_msg(m[r].res == FLEXCOLL_INVALID_USAGE || m[r].res == FLEXCOLL_TIMEOUT || m[r].res == FLEXCOLL_REMOTE_ERROR,
                      "[%s] returned %d (%s): %s", ta_ctx, m[r].res, flexcoll_get_error_string(m[r].res), m[r].err);
      ck_assert_msg(m[r].took < 3.0 * timeout_ms, "[%s] took %.0f ms", ta_ctx, m[r].took);
    }
    destroy_concurrently(c, 2);
  }
}
END_TEST

/* ---- communicator getters, destroy, abort ---------------------------------------------------------- */

START_TEST(test_comm_getters) {
  int v;
  flexcoll_result_t ae;
  EXPECT_ERR(flexcoll_comm_count(NULL, &v), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_user_rank(NULL, &v), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_cu_device(NULL, &v), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_get_async_error(NULL, &ae), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_abort(NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_destroy(NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");

  flexcoll_comm_t comm = make_comm1();
  EXPECT_ERR(flexcoll_comm_count(comm, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "count is NULL");
  EXPECT_ERR(flexcoll_comm_user_rank(comm, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "rank is NULL");
  EXPECT_ERR(flexcoll_comm_cu_device(comm, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "device is NULL");
  EXPECT_ERR(flexcoll_comm_get_async_error(comm, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "async_error");
  v = -5;
  EXPECT_OK(flexcoll_comm_count(comm, &v));
  ck_assert_int_eq(v, 1);
  v = -5;
  EXPECT_OK(flexcoll_comm_user_rank(comm, &v));
  ck_assert_int_eq(v, 0);
  v = -5;
  EXPECT_OK(flexcoll_comm_cu_device(comm, &v));
  ck_assert_int_eq(v, -1); /* config.cuda_device -1 */
  ae = FLEXCOLL_INTERNAL_ERROR;
  EXPECT_OK(flexcoll_comm_get_async_error(comm, &ae));
  ck_assert_int_eq(ae, FLEXCOLL_SUCCESS);
  EXPECT_OK(flexcoll_comm_destroy(comm));

  flexcoll_comm_t pair[2];
  make_pair(pair);
  for (int r = 0; r < 2; r++) {
    EXPECT_OK(flexcoll_comm_count(pair[r], &v));
    ck_assert_int_eq(v, 2);
    EXPECT_OK(flexcoll_comm_user_rank(pair[r], &v));
    ck_assert_int_eq(v, r);
    EXPECT_OK(flexcoll_comm_cu_device(pair[r], &v));
    ck_assert_int_eq(v, -1);
  }
  destroy_concurrently(pair, 2);
}
END_TEST

START_TEST(test_cu_device_host_only) {
  /* A process that sees no GPU (a host build, or CUDA_VISIBLE_DEVICES empty): the default config
   * (current device) gives a host-only communicator. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_comm_t comm = NULL;
  EXPECT_OK(flexcoll_comm_init_rank(&comm, 1, id, 0, NULL));
  int dev = -5;
  EXPECT_OK(flexcoll_comm_cu_device(comm, &dev));
  ck_assert_int_eq(dev, -1);
  float x = 2.5f, y = 0;
  EXPECT_OK(flexcoll_allreduce(&x, &y, 1, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL));
  ck_assert_float_eq(y, 2.5f);
  EXPECT_OK(flexcoll_comm_destroy(comm));
}
END_TEST

START_TEST(test_window_host_only) {
  /* On a host-only communicator windows hold host memory from flexcoll_host_alloc: other memory
   * is refused with a message, bad arguments are named; the communicator stays usable. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_comm_t comm = NULL;
  EXPECT_OK(flexcoll_comm_init_rank(&comm, 1, id, 0, NULL));
  float buf[16] = {0};
  flexcoll_window_t w = (flexcoll_window_t)buf;
  EXPECT_ERR(flexcoll_window_register(comm, buf, sizeof buf, &w), FLEXCOLL_INVALID_USAGE, comm, "flexcoll_host_alloc");
  ck_assert_ptr_null(w);
  EXPECT_ERR(flexcoll_window_register(NULL, buf, sizeof buf, &w), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");
  EXPECT_ERR(flexcoll_window_register(comm, NULL, sizeof buf, &w), FLEXCOLL_INVALID_ARGUMENT, comm, "buf");
  EXPECT_ERR(flexcoll_window_register(comm, buf, 0, &w), FLEXCOLL_INVALID_ARGUMENT, comm, "bytes");
  EXPECT_ERR(flexcoll_window_register(comm, buf, sizeof buf, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "window");
  EXPECT_ERR(flexcoll_window_deregister(comm, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "window");
  EXPECT_ERR(flexcoll_window_deregister(comm, (flexcoll_window_t)buf), FLEXCOLL_INVALID_ARGUMENT, comm, "not a registered window");
  float x = 1.5f, y = 0;
  EXPECT_OK(flexcoll_allreduce(&x, &y, 1, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL));
  ck_assert_float_eq(y, 1.5f);
  EXPECT_OK(flexcoll_comm_destroy(comm));
  EXPECT_ERR(flexcoll_window_register(comm, buf, sizeof buf, &w), FLEXCOLL_INVALID_USAGE, NULL, "comm");
}
END_TEST

START_TEST(test_use_after_destroy) {
  flexcoll_comm_t comm = make_comm1();
  EXPECT_OK(flexcoll_comm_destroy(comm));
  /* comm now dangles: every call must recognise it without touching it. */
  EXPECT_ERR(flexcoll_comm_destroy(comm), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  int v = 0;
  float buf[4] = {0};
  flexcoll_result_t ae;
  EXPECT_ERR(flexcoll_comm_count(comm, &v), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_user_rank(comm, &v), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_cu_device(comm, &v), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_get_async_error(comm, &ae), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_abort(comm), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  for (int coll = 0; coll < C_NUM; coll++) {
    CTX("%s on a destroyed comm", coll_names[coll]);
    EXPECT_ERR(call_coll(coll, buf, buf, 4, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0, comm), FLEXCOLL_INVALID_USAGE, NULL,
               "comm");
    EXPECT_ERR(call_coll(coll, NULL, NULL, 0, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0, comm), FLEXCOLL_INVALID_USAGE, NULL,
               "comm");
    /* Inside a group too: refused at once, not queued. */
    EXPECT_OK(flexcoll_group_start());
    EXPECT_ERR(call_coll(coll, buf, buf, 4, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, 0, comm), FLEXCOLL_INVALID_USAGE, NULL,
               "comm");
    EXPECT_OK(flexcoll_group_end());
  }
  const char *e = flexcoll_get_last_error(comm);
  ck_assert_ptr_nonnull(e);

  /* A handle that was never a communicator. */
  CTX("never created");
  flexcoll_comm_t fake = (flexcoll_comm_t)(void *)buf;
  EXPECT_ERR(flexcoll_allreduce(buf, buf, 1, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, fake, NULL), FLEXCOLL_INVALID_USAGE, NULL,
             "comm");
  EXPECT_ERR(flexcoll_comm_count(fake, &v), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_abort(fake), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_destroy(fake), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  ck_assert_ptr_nonnull(flexcoll_get_last_error(fake));
  for (int i = 0; i < 4; i++) ck_assert_float_eq(buf[i], 0.0f);
}
END_TEST

START_TEST(test_abort_then_use) {
  flexcoll_comm_t comm = make_comm1();
  EXPECT_OK(flexcoll_comm_abort(comm));
  int v, x = 1;
  EXPECT_ERR(flexcoll_allreduce(&x, &v, 1, FLEXCOLL_INT32, FLEXCOLL_SUM, comm, NULL), FLEXCOLL_INVALID_USAGE, comm,
             "abort");
  EXPECT_ERR(flexcoll_comm_count(comm, &v), FLEXCOLL_INVALID_USAGE, comm, "abort");
  flexcoll_result_t ae;
  EXPECT_OK(flexcoll_comm_get_async_error(comm, &ae));
  EXPECT_OK(flexcoll_comm_abort(comm)); /* twice is harmless while it lives */
  double t0 = ta_now_ms();
  EXPECT_OK(flexcoll_comm_destroy(comm));
  ck_assert_msg(ta_now_ms() - t0 < 2000, "destroy after abort took %.0f ms", ta_now_ms() - t0);
  EXPECT_ERR(flexcoll_comm_destroy(comm), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  EXPECT_ERR(flexcoll_comm_abort(comm), FLEXCOLL_INVALID_USAGE, NULL, "comm");
}
END_TEST

/* ---- groups -------------------------------------------------------------------------------------- */

static flexcoll_result_t thread_group_end_res;
static void *group_end_in_thread(void *arg) {
  (void)arg;
  thread_group_end_res = flexcoll_group_end();
  return NULL;
}

START_TEST(test_group_misuse) {
  EXPECT_ERR(flexcoll_group_end(), FLEXCOLL_INVALID_USAGE, NULL, "group_start");
  EXPECT_ERR(flexcoll_group_end(), FLEXCOLL_INVALID_USAGE, NULL, "group_start");
  /* Empty and nested groups are fine. */
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_group_end());
  for (int i = 0; i < 5; i++) EXPECT_OK(flexcoll_group_start());
  for (int i = 0; i < 5; i++) EXPECT_OK(flexcoll_group_end());
  EXPECT_ERR(flexcoll_group_end(), FLEXCOLL_INVALID_USAGE, NULL, "group_start");

  /* Groups belong to threads: another thread's group_end does not close this thread's group. */
  EXPECT_OK(flexcoll_group_start());
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, group_end_in_thread, NULL), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_int_eq(thread_group_end_res, FLEXCOLL_INVALID_USAGE);
  EXPECT_OK(flexcoll_group_end());
}
END_TEST

START_TEST(test_group_nested_deferred) {
  flexcoll_comm_t comm = make_comm1();
  int in[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0}, out2[6] = {0};
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_allreduce(in, out, 6, FLEXCOLL_INT32, FLEXCOLL_SUM, comm, NULL));
  /* A bad call inside a group is refused at once and does not spoil the group. */
  EXPECT_ERR(flexcoll_allreduce(in, out2, 6, (flexcoll_datatype_t)99, FLEXCOLL_SUM, comm, NULL),
             FLEXCOLL_INVALID_ARGUMENT, comm, "datatype");
  EXPECT_OK(flexcoll_group_end());
  /* Only the outermost end runs the queue. */
  for (int i = 0; i < 6; i++) ck_assert_int_eq(out[i], 0);
  EXPECT_OK(flexcoll_broadcast(in, out2, 6, FLEXCOLL_INT32, 0, comm, NULL));
  EXPECT_OK(flexcoll_group_end());
  for (int i = 0; i < 6; i++) {
    ck_assert_int_eq(out[i], in[i]);
    ck_assert_int_eq(out2[i], in[i]);
  }
  EXPECT_ERR(flexcoll_group_end(), FLEXCOLL_INVALID_USAGE, NULL, "group_start");
  EXPECT_OK(flexcoll_comm_destroy(comm));
}
END_TEST

START_TEST(test_group_init_and_calls) {
  /* One thread initialises two ranks and runs their collectives in one group; a communicator
   * whose initialisation is queued cannot be queried before the group ends. */
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(10000);
  flexcoll_comm_t c[2] = {NULL, NULL};
  float in[2][3] = {{1, 2, 3}, {10, 20, 30}}, out[2][3] = {{0}};
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_comm_init_rank(&c[0], 2, id, 0, &cfg));
  EXPECT_OK(flexcoll_comm_init_rank(&c[1], 2, id, 1, &cfg));
  int v;
  EXPECT_ERR(flexcoll_comm_count(c[0], &v), FLEXCOLL_INVALID_USAGE, c[0], "initialis");
  flexcoll_result_t ae = FLEXCOLL_SUCCESS;
  EXPECT_OK(flexcoll_comm_get_async_error(c[1], &ae));
  ck_assert_int_eq(ae, FLEXCOLL_IN_PROGRESS);
  for (int r = 0; r < 2; r++) EXPECT_OK(flexcoll_allreduce(in[r], out[r], 3, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, c[r], NULL));
  EXPECT_OK(flexcoll_group_end());
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 3; i++) ck_assert_float_eq(out[r][i], in[0][i] + in[1][i]);
  EXPECT_OK(flexcoll_comm_count(c[0], &v));
  ck_assert_int_eq(v, 2);
  destroy_concurrently(c, 2);
}
END_TEST

/* Non-blocking initialisation (config.blocking = 0), as ncclCommInitRankConfig's: init returns
 * IN_PROGRESS at once, get_async_error says IN_PROGRESS until the communicator is ready, then
 * SUCCESS; meanwhile calls on it are refused naming the initialisation. */
typedef struct {
  flexcoll_unique_id_t id;
  int rank;
  flexcoll_comm_t comm;
  flexcoll_result_t init, ready;
} nb_rank_t;

static void *nb_init_main(void *arg) {
  nb_rank_t *r = arg;
  flexcoll_config_t cfg = host_config(10000);
  cfg.blocking = 0;
  r->init = flexcoll_comm_init_rank(&r->comm, 2, r->id, r->rank, &cfg);
  r->ready = FLEXCOLL_IN_PROGRESS;
  for (int i = 0; i < 2000 && r->ready == FLEXCOLL_IN_PROGRESS && r->comm; i++) {
    if (flexcoll_comm_get_async_error(r->comm, &r->ready) != FLEXCOLL_SUCCESS) break;
    struct timespec ms = {0, 5000000};
    nanosleep(&ms, NULL);
  }
  return NULL;
}

START_TEST(test_init_nonblocking) {
  nb_rank_t r[2] = {{.rank = 0}, {.rank = 1}};
  EXPECT_OK(flexcoll_get_unique_id(&r[0].id));
  r[1].id = r[0].id;
  pthread_t t[2];
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, nb_init_main, &r[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++) {
    ck_assert_msg(r[i].init == FLEXCOLL_IN_PROGRESS, "rank %d: non-blocking init returned %d, not IN_PROGRESS", i,
                  r[i].init);
    ck_assert_msg(r[i].ready == FLEXCOLL_SUCCESS, "rank %d: get_async_error ended at %d (%s)", i, r[i].ready,
                  flexcoll_get_last_error(r[i].comm));
  }
  float in[2][3] = {{1, 2, 3}, {10, 20, 30}}, out[2][3] = {{0}};
  EXPECT_OK(flexcoll_group_start());
  for (int i = 0; i < 2; i++) EXPECT_OK(flexcoll_allreduce(in[i], out[i], 3, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, r[i].comm, NULL));
  EXPECT_OK(flexcoll_group_end());
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 3; k++) ck_assert_float_eq(out[i][k], in[0][k] + in[1][k]);
  flexcoll_comm_t c[2] = {r[0].comm, r[1].comm};
  destroy_concurrently(c, 2);
}
END_TEST

/* A non-blocking initialisation whose peer never comes: IN_PROGRESS meanwhile, calls and destroy
 * refused naming it; abort ends it and destroy then frees the communicator promptly. */
START_TEST(test_init_nonblocking_abandoned) {
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(20000);
  cfg.blocking = 0;
  flexcoll_comm_t comm = NULL;
  ck_assert_int_eq(flexcoll_comm_init_rank(&comm, 2, id, 0, &cfg), FLEXCOLL_IN_PROGRESS);
  ck_assert_ptr_nonnull(comm);
  flexcoll_result_t ae = FLEXCOLL_SUCCESS;
  EXPECT_OK(flexcoll_comm_get_async_error(comm, &ae));
  ck_assert_int_eq(ae, FLEXCOLL_IN_PROGRESS);
  float x = 1;
  EXPECT_ERR(flexcoll_allreduce(&x, &x, 1, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL), FLEXCOLL_INVALID_USAGE, comm,
             "non-blocking");
  EXPECT_ERR(flexcoll_comm_destroy(comm), FLEXCOLL_INVALID_USAGE, comm, "abort");
  double t0 = ta_now_ms();
  EXPECT_OK(flexcoll_comm_abort(comm));
  EXPECT_OK(flexcoll_comm_destroy(comm));
  ck_assert_msg(ta_now_ms() - t0 < 5000, "abort + destroy of an abandoned non-blocking init took %.0f ms", ta_now_ms() - t0);
}
END_TEST

START_TEST(test_group_destroy_pending) {
  /* Destroying a communicator whose initialisation is still queued in this thread's group: either
   * destroy refuses (INVALID_USAGE) and the group initialises it, or destroy takes it and the group
   * forgets it.  Never may group_end initialise freed memory. */
  flexcoll_unique_id_t id;
  EXPECT_OK(flexcoll_get_unique_id(&id));
  flexcoll_config_t cfg = host_config(2000);
  flexcoll_comm_t comm = NULL;
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_comm_init_rank(&comm, 1, id, 0, &cfg));
  flexcoll_result_t d = flexcoll_comm_destroy(comm);
  ck_assert_msg(d == FLEXCOLL_SUCCESS || d == FLEXCOLL_INVALID_USAGE, "destroy of a pending comm returned %d: %s", d,
                flexcoll_get_last_error(NULL));
  flexcoll_result_t end = flexcoll_group_end();
  ck_assert_msg(end == FLEXCOLL_SUCCESS, "group_end after destroying a pending comm (destroy returned %d) returned %d (%s): %s",
                d, end, flexcoll_get_error_string(end), flexcoll_get_last_error(NULL));
  int v;
  if (d == FLEXCOLL_SUCCESS) {
    EXPECT_ERR(flexcoll_comm_count(comm, &v), FLEXCOLL_INVALID_USAGE, NULL, "comm");
  } else {
    EXPECT_OK(flexcoll_comm_count(comm, &v));
    EXPECT_OK(flexcoll_comm_destroy(comm));
  }
}
END_TEST

START_TEST(test_group_destroy_queued) {
  /* A communicator destroyed while calls on it are queued: group_end reports it, nothing crashes. */
  flexcoll_comm_t comm = make_comm1();
  int x = 3, y = 0;
  EXPECT_OK(flexcoll_group_start());
  EXPECT_OK(flexcoll_allreduce(&x, &y, 1, FLEXCOLL_INT32, FLEXCOLL_SUM, comm, NULL));
  flexcoll_result_t d = flexcoll_comm_destroy(comm);
  flexcoll_result_t end = flexcoll_group_end();
  if (d == FLEXCOLL_SUCCESS) {
    ck_assert_msg(end == FLEXCOLL_INVALID_USAGE, "group_end ran a call on a destroyed comm: %d (%s)", end,
                  flexcoll_get_last_error(NULL));
    ck_assert_int_eq(y, 0);
  } else {
    ck_assert_int_eq(d, FLEXCOLL_INVALID_USAGE);
    EXPECT_OK(end);
    ck_assert_int_eq(y, 3);
    EXPECT_OK(flexcoll_comm_destroy(comm));
  }
}
END_TEST

/* ---- one-rank communicators: every collective, datatype and operator -------------------------------- */

static size_t dtype_size(int d) {
  switch (d) {
    case FLEXCOLL_INT8: case FLEXCOLL_UINT8: return 1;
    case FLEXCOLL_FLOAT16: case FLEXCOLL_BFLOAT16: return 2;
    case FLEXCOLL_INT32: case FLEXCOLL_UINT32: case FLEXCOLL_FLOAT32: return 4;
    default: return 8;
  }
}

/* Element i holds the small integer i % 7 + 1, exactly representable in every datatype. */
static void fill(void *buf, size_t count, int d) {
  static const uint16_t half[7] = {0x3C00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600, 0x4700};
  static const uint16_t bf16[7] = {0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};
  for (size_t i = 0; i < count; i++) {
    int v = (int)(i % 7) + 1;
    switch (d) {
      case FLEXCOLL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
      case FLEXCOLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
      case FLEXCOLL_INT32: ((int32_t *)buf)[i] = v; break;
      case FLEXCOLL_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
      case FLEXCOLL_INT64: ((int64_t *)buf)[i] = v; break;
      case FLEXCOLL_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
      case FLEXCOLL_FLOAT16: ((uint16_t *)buf)[i] = half[v - 1]; break;
      case FLEXCOLL_BFLOAT16: ((uint16_t *)buf)[i] = bf16[v - 1]; break;
      case FLEXCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
      default: ((double *)buf)[i] = v; break;
    }
  }
}

START_TEST(test_single_rank_all_collectives) {
  flexcoll_comm_t comm = make_comm1();
  static const size_t counts[] = {1, 7, 1000, 300000};
  size_t max = 300000 * 8;
  unsigned char *in = malloc(max), *out = malloc(max), *ref = malloc(max);
  ck_assert(in && out && ref);
  for (int coll = 0; coll < C_NUM; coll++)
    for (int d = 0; d < FLEXCOLL_NUM_DATATYPES; d++)
      for (int op = 0; op < (coll_has_op(coll) ? FLEXCOLL_NUM_OPS : 1); op++)
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
          size_t n = counts[ci], bytes = n * dtype_size(d);
          if (ci == 3 && (op != FLEXCOLL_SUM || (d != FLEXCOLL_FLOAT64 && d != FLEXCOLL_INT8))) continue;
          CTX("%s datatype %d op %d count %zu", coll_names[coll], d, op, n);
          fill(in, n, d);
          memcpy(ref, in, bytes);
          memset(out, 0xee, bytes);
          EXPECT_OK(call_coll(coll, in, out, n, d, op, 0, comm));
          ck_assert_msg(memcmp(out, ref, bytes) == 0, "[%s] out-of-place result differs from the input", ta_ctx);
          ck_assert_msg(memcmp(in, ref, bytes) == 0, "[%s] sendbuf was modified", ta_ctx);
          /* In place: sendbuf == recvbuf (the rank's own slot for allgather / reduce_scatter). */
          EXPECT_OK(call_coll(coll, in, in, n, d, op, 0, comm));
          ck_assert_msg(memcmp(in, ref, bytes) == 0, "[%s] in-place result differs from the input", ta_ctx);
        }
  free(in);
  free(out);
  free(ref);
  int rank = -1;
  EXPECT_OK(flexcoll_comm_user_rank(comm, &rank));
  ck_assert_int_eq(rank, 0);
  EXPECT_OK(flexcoll_comm_destroy(comm));
}
END_TEST

/* ---- init_from_env ------------------------------------------------------------------------------- */

START_TEST(test_init_from_env_errors) {
  clear_launcher_env();
  flexcoll_comm_t comm = (flexcoll_comm_t)(uintptr_t)0x1;
  EXPECT_ERR(flexcoll_comm_init_from_env(NULL, NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");

  CTX("no launcher");
  EXPECT_ERR(flexcoll_comm_init_from_env(&comm, NULL), FLEXCOLL_INVALID_USAGE, NULL, "FLEXCOLL_RANK");
  ck_assert_ptr_null(comm);

  struct {
    const char *vars[8]; /* name, value pairs */
    flexcoll_result_t code;
    const char *what;
  } cases[] = {
      {{"FLEXCOLL_RANK", "abc", "FLEXCOLL_NRANKS", "2"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RANK"},
      {{"FLEXCOLL_RANK", "0", "FLEXCOLL_NRANKS", "two"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_NRANKS"},
      {{"FLEXCOLL_RANK", "1x", "FLEXCOLL_NRANKS", "2"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RANK"},
      {{"FLEXCOLL_RANK", "-1", "FLEXCOLL_NRANKS", "2"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RANK"},
      {{"FLEXCOLL_RANK", "99999999999999999999", "FLEXCOLL_NRANKS", "2"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RANK"},
      {{"FLEXCOLL_RANK", "1"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_NRANKS"},
      {{"FLEXCOLL_NRANKS", "4"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RANK"},
      {{"FLEXCOLL_RANK", "2", "FLEXCOLL_NRANKS", "2"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RANK"},
      {{"FLEXCOLL_RANK", "0", "FLEXCOLL_NRANKS", "0"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_NRANKS"},
      /* flexcoll's variables come first: a broken FLEXCOLL_RANK is not papered over by torchrun's. */
      {{"FLEXCOLL_RANK", "abc", "RANK", "0", "WORLD_SIZE", "1"}, FLEXCOLL_INVALID_ARGUMENT, "FLEXCOLL_RANK"},
      {{"RANK", "abc", "WORLD_SIZE", "2"}, FLEXCOLL_INVALID_ARGUMENT, "RANK"},
      {{"RANK", "0"}, FLEXCOLL_INVALID_ARGUMENT, "WORLD_SIZE"},
      {{"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "-4"}, FLEXCOLL_INVALID_ARGUMENT, "OMPI_COMM_WORLD_SIZE"},
      {{"PMI_RANK", "", "PMI_SIZE", "x"}, FLEXCOLL_INVALID_ARGUMENT, "PMI_SIZE"},
      {{"SLURM_PROCID", "3", "SLURM_NTASKS", "3"}, FLEXCOLL_INVALID_ARGUMENT, "SLURM_PROCID"},
      /* A launcher but no root address. */
      {{"FLEXCOLL_RANK", "0", "FLEXCOLL_NRANKS", "1"}, FLEXCOLL_INVALID_USAGE, "FLEXCOLL_ROOT"},
      {{"RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1"}, FLEXCOLL_INVALID_USAGE, "MASTER_PORT"},
      {{"SLURM_PROCID", "0", "SLURM_NTASKS", "2"}, FLEXCOLL_INVALID_USAGE, "FLEXCOLL_ROOT"},
      /* Malformed root addresses. */
      {{"FLEXCOLL_RANK", "1", "FLEXCOLL_NRANKS", "2", "FLEXCOLL_ROOT", "127.0.0.1"}, FLEXCOLL_INVALID_ARGUMENT,
       "127.0.0.1"},
      {{"FLEXCOLL_RANK", "1", "FLEXCOLL_NRANKS", "2", "FLEXCOLL_ROOT", "127.0.0.1:0"}, FLEXCOLL_INVALID_ARGUMENT,
       "127.0.0.1:0"},
      {{"FLEXCOLL_RANK", "1", "FLEXCOLL_NRANKS", "2", "FLEXCOLL_ROOT", "127.0.0.1:70000"}, FLEXCOLL_INVALID_ARGUMENT,
       "127.0.0.1:70000"},
      {{"RANK", "1", "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "http"}, FLEXCOLL_INVALID_ARGUMENT,
       "http"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    clear_launcher_env();
    char desc[256] = "";
    size_t n = 0;
    for (int k = 0; k < 8 && cases[i].vars[k]; k += 2) {
      setenv(cases[i].vars[k], cases[i].vars[k + 1], 1);
      n += (size_t)snprintf(desc + n, sizeof desc - n, "%s=%s ", cases[i].vars[k], cases[i].vars[k + 1]);
      if (n >= sizeof desc) n = sizeof desc - 1;
    }
    CTX("%s", desc);
    comm = (flexcoll_comm_t)(uintptr_t)0x1;
    double t0 = ta_now_ms();
    EXPECT_ERR(flexcoll_comm_init_from_env(&comm, NULL), cases[i].code, NULL, cases[i].what);
    ck_assert_ptr_null(comm);
    ck_assert_msg(ta_now_ms() - t0 < 1000, "[%s] took %.0f ms to fail", ta_ctx, ta_now_ms() - t0);
  }

  /* A bad config is refused too (rank 1: no root is started). */
  clear_launcher_env();
  setenv("FLEXCOLL_RANK", "1", 1);
  setenv("FLEXCOLL_NRANKS", "2", 1);
  char root[64];
  snprintf(root, sizeof root, "127.0.0.1:%d", free_port());
  setenv("FLEXCOLL_ROOT", root, 1);
  flexcoll_config_t zero;
  memset(&zero, 0, sizeof zero);
  CTX("bad config");
  EXPECT_ERR(flexcoll_comm_init_from_env(&comm, &zero), FLEXCOLL_INVALID_ARGUMENT, NULL, "config");
  clear_launcher_env();
}
END_TEST

START_TEST(test_init_from_env_one_rank) {
  clear_launcher_env();
  char port[16];
  snprintf(port, sizeof port, "%d", free_port());
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  flexcoll_config_t cfg = host_config(5000);
  flexcoll_comm_t comm = NULL;
  EXPECT_OK(flexcoll_comm_init_from_env(&comm, &cfg));
  int v;
  EXPECT_OK(flexcoll_comm_count(comm, &v));
  ck_assert_int_eq(v, 1);
  long long x = 42, y = 0;
  EXPECT_OK(flexcoll_allreduce(&x, &y, 1, FLEXCOLL_INT64, FLEXCOLL_PROD, comm, NULL));
  ck_assert_int_eq(y, 42);
  EXPECT_OK(flexcoll_comm_destroy(comm));
  clear_launcher_env();
}
END_TEST

START_TEST(test_init_from_env_retry) {
  /* Rank 0 serves the rendezvous.  A call refused for a bad config must not leave that server
   * holding the port: the corrected call in the same process must work. */
  clear_launcher_env();
  char root[64];
  snprintf(root, sizeof root, "127.0.0.1:%d", free_port());
  setenv("FLEXCOLL_RANK", "0", 1);
  setenv("FLEXCOLL_NRANKS", "1", 1);
  setenv("FLEXCOLL_ROOT", root, 1);
  flexcoll_config_t zero;
  memset(&zero, 0, sizeof zero);
  flexcoll_comm_t comm = NULL;
  CTX("bad config");
  EXPECT_ERR(flexcoll_comm_init_from_env(&comm, &zero), FLEXCOLL_INVALID_ARGUMENT, NULL, "config");
  flexcoll_config_t cfg = host_config(3000);
  CTX("retry with a good config");
  EXPECT_OK(flexcoll_comm_init_from_env(&comm, &cfg));
  EXPECT_OK(flexcoll_comm_destroy(comm));
  /* And a second communicator from the same environment, after the first. */
  CTX("second communicator");
  EXPECT_OK(flexcoll_comm_init_from_env(&comm, &cfg));
  EXPECT_OK(flexcoll_comm_destroy(comm));
  clear_launcher_env();
}
END_TEST

START_TEST(test_init_from_env_failed_retry) {
  /* Rank 0 serves the rendezvous; when its initialisation fails (here: rank 1 never comes), the
   * root must be gone when the call returns, so that a retry in the same process gets the port. */
  clear_launcher_env();
  char root[64];
  snprintf(root, sizeof root, "127.0.0.1:%d", free_port());
  setenv("FLEXCOLL_RANK", "0", 1);
  setenv("FLEXCOLL_NRANKS", "2", 1);
  setenv("FLEXCOLL_ROOT", root, 1);
  flexcoll_config_t cfg = host_config(1000);
  flexcoll_comm_t comm = NULL;
  CTX("rank 1 never comes");
  EXPECT_ERR(flexcoll_comm_init_from_env(&comm, &cfg), FLEXCOLL_TIMEOUT, NULL, "bootstrap");
  ck_assert_ptr_null(comm);
  setenv("FLEXCOLL_NRANKS", "1", 1);
  CTX("retry on the same port");
  EXPECT_OK(flexcoll_comm_init_from_env(&comm, &cfg));
  EXPECT_OK(flexcoll_comm_destroy(comm));
  clear_launcher_env();
}
END_TEST

typedef struct {
  int torchrun; /* RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT instead of FLEXCOLL_* */
  int port;
} env_job_t;

static void env_rank(int rank, int nranks, void *arg) {
  const env_job_t *job = arg;
  char r[16], n[16], p[16], root[64];
  snprintf(r, sizeof r, "%d", rank);
  snprintf(n, sizeof n, "%d", nranks);
  snprintf(p, sizeof p, "%d", job->port);
  snprintf(root, sizeof root, "127.0.0.1:%d", job->port);
  clear_launcher_env();
  if (job->torchrun) {
    setenv("RANK", r, 1);
    setenv("WORLD_SIZE", n, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", p, 1);
    setenv("LOCAL_RANK", r, 1);
  } else {
    setenv("FLEXCOLL_RANK", r, 1);
    setenv("FLEXCOLL_NRANKS", n, 1);
    setenv("FLEXCOLL_ROOT", root, 1);
  }
  flexcoll_config_t cfg = host_config(10000);
  flexcoll_comm_t comm = NULL;
  PHASE("flexcoll_comm_init_from_env");
  RANK_OK(flexcoll_comm_init_from_env(&comm, &cfg));
  PHASE("allreduce");
  int v = -1;
  RANK_OK(flexcoll_comm_count(comm, &v));
  RANK_CHECK(v == nranks, "comm_count %d, expected %d", v, nranks);
  RANK_OK(flexcoll_comm_user_rank(comm, &v));
  RANK_CHECK(v == rank, "user_rank %d, expected %d", v, rank);
  enum { N = 4099 };
  static int32_t in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = (rank + 1) * i, out[i] = -1;
  RANK_OK(flexcoll_allreduce(in, out, N, FLEXCOLL_INT32, FLEXCOLL_SUM, comm, NULL));
  int sum = nranks * (nranks + 1) / 2;
  for (int i = 0; i < N; i++) RANK_CHECK(out[i] == sum * i, "allreduce out[%d] = %d, expected %d", i, out[i], sum * i);
  PHASE("flexcoll_comm_destroy");
  RANK_OK(flexcoll_comm_destroy(comm));
}

START_TEST(test_init_from_env_flexcoll_vars) {
  env_job_t job = {.torchrun = 0, .port = free_port()};
  run_ranks(2, env_rank, &job, 30000);
}
END_TEST

START_TEST(test_init_from_env_torchrun_vars) {
  env_job_t job = {.torchrun = 1, .port = free_port()};
  run_ranks(2, env_rank, &job, 30000);
}
END_TEST

/* ---- settings that ranks must share ------------------------------------------------------------- */

/* Rank 1 sets another transfer slice size than rank 0: both creations fail with INVALID_USAGE and
 * a message naming the variable, instead of hanging in the first collective. */
static flexcoll_unique_id_t settings_id;

static void settings_rank(int rank, int nranks, void *arg) {
  (void)arg;
  if (rank == 1) setenv("FLEXCOLL_CHUNK_SIZE", "65536", 1);
  flexcoll_config_t cfg = host_config(5000);
  flexcoll_comm_t c = NULL;
  PHASE("flexcoll_comm_init_rank");
  flexcoll_result_t res = flexcoll_comm_init_rank(&c, nranks, settings_id, rank, &cfg);
  RANK_CHECK(res == FLEXCOLL_INVALID_USAGE, "init with different FLEXCOLL_CHUNK_SIZE returned %d", (int)res);
  RANK_CHECK(strstr(flexcoll_get_last_error(NULL), "FLEXCOLL_CHUNK_SIZE") != NULL, "last error \"%s\" does not name it",
             flexcoll_get_last_error(NULL));
  RANK_CHECK(c == NULL, "a failed init handed out a communicator");
}

START_TEST(test_settings_must_agree) {
  ck_assert_int_eq(flexcoll_get_unique_id(&settings_id), FLEXCOLL_SUCCESS);
  run_ranks(2, settings_rank, NULL, 20000);
}
END_TEST

/* ---- flexcoll_comm_split ------------------------------------------------------------------------- */
/* Ranks as processes and as threads (tests/harness.c); the checks inside a rank report through
 * hx_fail, never ck_assert. */
#include "harness.h"

/* An expected failure of a split: code, *newcomm NULL, and a last error that mentions what. */
static void split_expect_err(hx_rank_t *r, flexcoll_comm_t parent, int color, int key, int null_out,
                             flexcoll_result_t code, const char *what) {
  flexcoll_comm_t out = (flexcoll_comm_t)(uintptr_t)0x1;
  flexcoll_result_t res = flexcoll_comm_split(parent, color, key, null_out ? NULL : &out, NULL);
  const char *e = flexcoll_get_last_error(NULL);
  if (res != code)
    hx_fail(r, "split returned %d (%s), expected %d; last error: %s", (int)res, flexcoll_get_error_string(res),
            (int)code, e ? e : "(null)");
  else if (!e || !strstr(e, what))
    hx_fail(r, "split's last error \"%s\" does not mention \"%s\"", e ? e : "(null)", what);
  if (!null_out && out != NULL) hx_fail(r, "a failed split left *newcomm = %p, not NULL", (void *)out);
}

/* Allreduce of int64 on sub, whose members are the parent ranks q with member(q): the sum must be
 * exactly over the members' inputs (q+1)*1000 + i*7 + tag. */
static void split_check_allreduce(hx_rank_t *r, flexcoll_comm_t sub, int (*member)(int q, void *), void *arg,
                                  int64_t tag) {
  enum { N = 37 };
  int64_t in[N], out[N];
  for (int i = 0; i < N; i++) {
    in[i] = (int64_t)(r->rank + 1) * 1000 + i * 7 + tag;
    out[i] = -1;
  }
  if (!hx_ok(r, flexcoll_allreduce(in, out, N, FLEXCOLL_INT64, FLEXCOLL_SUM, sub, NULL), sub, "flexcoll_allreduce")) return;
  for (int i = 0; i < N; i++) {
    int64_t want = 0;
    for (int q = 0; q < r->nranks; q++)
      if (member(q, arg)) want += (int64_t)(q + 1) * 1000 + i * 7 + tag;
    if (out[i] != want) {
      hx_fail(r, "allreduce on the split communicator: element %d is %lld, expected %lld", i, (long long)out[i],
              (long long)want);
      return;
    }
  }
}

static int same_parity(int q, void *arg) { return q % 2 == *(int *)arg; }
static int not_rank0(int q, void *arg) { (void)arg; return q != 0; }
static int every_rank(int q, void *arg) { (void)q, (void)arg; return 1; }

static int split_rank(hx_rank_t *r) {
  flexcoll_comm_t parent = r->comm;
  const int me = r->rank, n = r->nranks;

  /* color = rank % 2, key = -rank: each half in reversed order. */
  int color = me % 2;
  snprintf(r->what, sizeof r->what, "split(color %d, key %d)", color, -me);
  flexcoll_comm_t sub = NULL;
  if (!hx_ok(r, flexcoll_comm_split(parent, color, -me, &sub, NULL), parent, "flexcoll_comm_split")) return 1;
  if (!sub) return hx_fail(r, "newcomm is NULL after a split with color %d", color);
  int want_count = 0, want_rank = 0, v = -5;
  for (int q = 0; q < n; q++)
    if (q % 2 == color) {
      want_count++;
      if (q > me) want_rank++; /* key -q: higher parent ranks come first */
    }
  if (hx_ok(r, flexcoll_comm_count(sub, &v), sub, "flexcoll_comm_count") && v != want_count)
    hx_fail(r, "flexcoll_comm_count: %d, expected %d", v, want_count);
  if (hx_ok(r, flexcoll_comm_user_rank(sub, &v), sub, "flexcoll_comm_user_rank") && v != want_rank)
    hx_fail(r, "flexcoll_comm_user_rank: %d, expected %d", v, want_rank);
  int parent_device = -5;
  if (!hx_ok(r, flexcoll_comm_cu_device(parent, &parent_device), parent, "flexcoll_comm_cu_device")) return 1;
  if (hx_ok(r, flexcoll_comm_cu_device(sub, &v), sub, "flexcoll_comm_cu_device") && v != parent_device)
    hx_fail(r, "flexcoll_comm_cu_device: %d, expected the parent's %d", v, parent_device);
  snprintf(r->what, sizeof r->what, "allreduce on split(color %d)", color);
  split_check_allreduce(r, sub, same_parity, &color, 11);

  /* Rank 0 takes part without a color; the others, all one color with equal keys (ties: parent
   * order), a config that changes the timeout only (the device is still inherited). */
  snprintf(r->what, sizeof r->what, "split with rank 0 NOCOLOR");
  flexcoll_comm_t sub2 = (flexcoll_comm_t)(uintptr_t)0x1;
  flexcoll_config_t cfg = FLEXCOLL_CONFIG_INITIALIZER;
  cfg.timeout_ms = 45000;
  if (!hx_ok(r, flexcoll_comm_split(parent, me == 0 ? FLEXCOLL_SPLIT_NOCOLOR : 7, 3, &sub2, &cfg), parent,
             "flexcoll_comm_split"))
    return 1;
  if (me == 0) {
    if (sub2 != NULL) hx_fail(r, "NOCOLOR: newcomm is %p, expected NULL", (void *)sub2);
  } else if (!sub2) {
    hx_fail(r, "newcomm is NULL after a split with color 7");
  } else {
    if (hx_ok(r, flexcoll_comm_count(sub2, &v), sub2, "flexcoll_comm_count") && v != n - 1)
      hx_fail(r, "flexcoll_comm_count: %d, expected %d", v, n - 1);
    if (hx_ok(r, flexcoll_comm_user_rank(sub2, &v), sub2, "flexcoll_comm_user_rank") && v != me - 1)
      hx_fail(r, "flexcoll_comm_user_rank: %d, expected %d", v, me - 1);
    if (hx_ok(r, flexcoll_comm_cu_device(sub2, &v), sub2, "flexcoll_comm_cu_device") && v != parent_device)
      hx_fail(r, "flexcoll_comm_cu_device: %d, expected the parent's %d", v, parent_device);
    snprintf(r->what, sizeof r->what, "allreduce on split without rank 0");
    split_check_allreduce(r, sub2, not_rank0, NULL, 5);
  }

  /* Bad arguments on every rank: refused by name, nothing created. */
  snprintf(r->what, sizeof r->what, "split with color -2");
  split_expect_err(r, parent, -2, 0, 0, FLEXCOLL_INVALID_ARGUMENT, "color");
  snprintf(r->what, sizeof r->what, "split with newcomm NULL");
  split_expect_err(r, parent, 0, 0, 1, FLEXCOLL_INVALID_ARGUMENT, "newcomm");
  /* On one rank only: it names its argument, the others name it; nobody waits for a timeout. */
  snprintf(r->what, sizeof r->what, "split with color -5 on rank 1 only");
  if (me == 1) split_expect_err(r, parent, -5, 0, 0, FLEXCOLL_INVALID_ARGUMENT, "color");
  else split_expect_err(r, parent, 0, 0, 0, FLEXCOLL_INVALID_ARGUMENT, "rank 1");

  /* The parent and the new communicators still work after all that. */
  snprintf(r->what, sizeof r->what, "allreduce on the parent after the splits");
  split_check_allreduce(r, parent, every_rank, NULL, 0);
  snprintf(r->what, sizeof r->what, "allreduce on split(color %d) again", color);
  split_check_allreduce(r, sub, same_parity, &color, 2);
  if (!hx_ok(r, flexcoll_comm_destroy(sub), NULL, "flexcoll_comm_destroy(sub)")) return 1;
  if (me != 0 && sub2 && !hx_ok(r, flexcoll_comm_destroy(sub2), NULL, "flexcoll_comm_destroy(sub2)")) return 1;
  return 0;
}

START_TEST(test_split_procs) {
  hx_opts_t o = {.label = "split_procs", .deadline_s = 150};
  ck_assert_msg(hx_run_procs(4, &o, split_rank, NULL), "split, 4 ranks as processes: see stderr");
}
END_TEST

START_TEST(test_split_threads) {
  hx_opts_t o = {.label = "split_threads", .deadline_s = 150};
  ck_assert_msg(hx_run_threads(3, &o, split_rank, NULL), "split, 3 ranks as threads: see stderr");
}
END_TEST

/* The checks one rank can see alone: NULL and dead handles, groups, bad arguments, and a one-rank split. */
START_TEST(test_split_local) {
  flexcoll_comm_t out = (flexcoll_comm_t)(uintptr_t)0x1;
  EXPECT_ERR(flexcoll_comm_split(NULL, 0, 0, &out, NULL), FLEXCOLL_INVALID_ARGUMENT, NULL, "comm");
  ck_assert_ptr_null(out);
  flexcoll_comm_t comm = make_comm1();
  EXPECT_ERR(flexcoll_comm_split(comm, -2, 0, &out, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "color");
  EXPECT_ERR(flexcoll_comm_split(comm, -1000, 0, &out, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "NOCOLOR");
  EXPECT_ERR(flexcoll_comm_split(comm, 0, 0, NULL, NULL), FLEXCOLL_INVALID_ARGUMENT, comm, "newcomm");
  flexcoll_config_t bad = FLEXCOLL_CONFIG_INITIALIZER;
  bad.size = 0;
  EXPECT_ERR(flexcoll_comm_split(comm, 0, 0, &out, &bad), FLEXCOLL_INVALID_ARGUMENT, comm, "config");
  bad = (flexcoll_config_t)FLEXCOLL_CONFIG_INITIALIZER;
  bad.timeout_ms = -3;
  EXPECT_ERR(flexcoll_comm_split(comm, 0, 0, &out, &bad), FLEXCOLL_INVALID_ARGUMENT, comm, "timeout_ms");
  ck_assert_ptr_null(out);
  EXPECT_OK(flexcoll_group_start());
  EXPECT_ERR(flexcoll_comm_split(comm, 0, 0, &out, NULL), FLEXCOLL_INVALID_USAGE, comm, "group");
  EXPECT_OK(flexcoll_group_end());
  out = (flexcoll_comm_t)(uintptr_t)0x1;
  EXPECT_OK(flexcoll_comm_split(comm, FLEXCOLL_SPLIT_NOCOLOR, 0, &out, NULL));
  ck_assert_ptr_null(out);
  EXPECT_OK(flexcoll_comm_split(comm, 12345, -7, &out, NULL));
  ck_assert_ptr_nonnull(out);
  int v = -5;
  EXPECT_OK(flexcoll_comm_count(out, &v));
  ck_assert_int_eq(v, 1);
  EXPECT_OK(flexcoll_comm_user_rank(out, &v));
  ck_assert_int_eq(v, 0);
  int in[3] = {4, 5, 6}, res[3] = {0};
  EXPECT_OK(flexcoll_allreduce(in, res, 3, FLEXCOLL_INT32, FLEXCOLL_SUM, out, NULL));
  ck_assert_int_eq(res[0] + res[1] + res[2], 15);
  /* A split of a split. */
  flexcoll_comm_t out2 = NULL;
  EXPECT_OK(flexcoll_comm_split(out, 0, 0, &out2, NULL));
  ck_assert_ptr_nonnull(out2);
  EXPECT_OK(flexcoll_comm_destroy(out2));
  EXPECT_OK(flexcoll_comm_destroy(out));
  EXPECT_OK(flexcoll_comm_destroy(comm));
  EXPECT_ERR(flexcoll_comm_split(comm, 0, 0, &out, NULL), FLEXCOLL_INVALID_USAGE, NULL, "live");
}
END_TEST

/* ---- main ---------------------------------------------------------------------------------------- */

static Suite *api_suite(void) {
  Suite *s = suite_create("api");
  TCase *basic = tcase_create("basic");
  tcase_set_timeout(basic, 20);
  tcase_add_test(basic, test_version);
  tcase_add_test(basic, test_error_strings);
  tcase_add_test(basic, test_last_error_per_thread);
  tcase_add_test(basic, test_unique_id);
  suite_add_tcase(s, basic);

  TCase *init = tcase_create("init");
  tcase_set_timeout(init, 20);
  tcase_add_test(init, test_init_rank_bad_args);
  tcase_add_test(init, test_init_rank_bad_config);
  tcase_add_test(init, test_init_rank_bad_cuda_device);
  tcase_add_test(init, test_init_rank_old_config);
  tcase_add_test(init, test_init_rank_damaged_id);
  tcase_add_test(init, test_settings_must_agree);
  tcase_add_test(init, test_init_rank_dead_root);
  tcase_add_test(init, test_init_rank_nranks_mismatch);
  tcase_add_test(init, test_init_all_bad_args);
  tcase_add_test(init, test_init_all_host);
  tcase_add_test(init, test_destroy_sequential);
  suite_add_tcase(s, init);

  TCase *coll = tcase_create("collectives");
  tcase_set_timeout(coll, 30);
  tcase_add_test(coll, test_coll_null_comm);
  tcase_add_test(coll, test_window_host_only);
  tcase_add_test(coll, test_coll_bad_dtype_op);
  tcase_add_test(coll, test_coll_bad_root);
  tcase_add_test(coll, test_coll_null_buffers);
  tcase_add_test(coll, test_coll_null_buffers_nonroot);
  tcase_add_test(coll, test_coll_count_overflow);
  tcase_add_test(coll, test_coll_partial_overlap);
  tcase_add_test(coll, test_coll_out_of_memory);
  tcase_add_test(coll, test_single_rank_all_collectives);
  tcase_add_test(coll, test_coll_count_mismatch);
  suite_add_tcase(s, coll);

  TCase *life = tcase_create("lifecycle");
  tcase_set_timeout(life, 20);
  tcase_add_test(life, test_comm_getters);
  tcase_add_test(life, test_cu_device_host_only);
  tcase_add_test(life, test_use_after_destroy);
  tcase_add_test(life, test_abort_then_use);
  tcase_add_test(life, test_group_misuse);
  tcase_add_test(life, test_group_nested_deferred);
  tcase_add_test(life, test_group_init_and_calls);
  tcase_add_test(life, test_init_nonblocking);
  tcase_add_test(life, test_init_nonblocking_abandoned);
  tcase_add_test(life, test_group_destroy_pending);
  tcase_add_test(life, test_group_destroy_queued);
  suite_add_tcase(s, life);

  TCase *env = tcase_create("init_from_env");
  tcase_set_timeout(env, 40);
  tcase_add_test(env, test_init_from_env_errors);
  tcase_add_test(env, test_init_from_env_one_rank);
  tcase_add_test(env, test_init_from_env_retry);
  tcase_add_test(env, test_init_from_env_failed_retry);
  tcase_add_test(env, test_init_from_env_flexcoll_vars);
  tcase_add_test(env, test_init_from_env_torchrun_vars);
  suite_add_tcase(s, env);

  TCase *split = tcase_create("split");
  tcase_set_timeout(split, 180);
  tcase_add_test(split, test_split_local);
  tcase_add_test(split, test_split_procs);
  tcase_add_test(split, test_split_threads);
  suite_add_tcase(s, split);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(api_suite());
  /* Every test in its own process: tests change the environment and fork ranks, and a crash in the
   * library must fail one test, not the run. */
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
