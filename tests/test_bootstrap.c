/* test_bootstrap.c — the TCP bootstrap: unique ids, rendezvous of threads and of processes, a
 * root under garbage, wrong ids, dead roots, aborts and dead neighbours.
 *
 * Test cases (CK_RUN_CASE selects one): id, threads, procs, robust, errors.  Hostile input and
 * faults: test_bootstrap_hostile.c.  For valgrind run the
 * thread cases in one process:
 *   CK_FORK=no CK_RUN_CASE=threads valgrind --leak-check=full ./test_bootstrap
 */
#include <check.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "bootstrap/net.h" /* the wire format, for clients that speak it wrongly on purpose */
#include "error.h"

#define TMO_MS 10000

static const int sizes[] = {1, 2, 3, 8};

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int in_nofork_mode(void) {
  const char *f = getenv("CK_FORK");
  return f && strcmp(f, "no") == 0;
}

/* A port nobody listens on (for a moment: good enough on a test machine). */
static int free_port(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static void loopback_id(flexcoll_unique_id_t *id, int port, uint64_t magic) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  ck_assert_int_eq(fc_bootstrap_id_encode(id, magic, (struct sockaddr *)&a, sizeof a), FLEXCOLL_SUCCESS);
}

/* ---- what every rank does after init: returns 0, or the failing line ------------------------ */

static int exercise(fc_bootstrap_t *bs, int rank, int n) {
  int v[8 * 4];
  for (int i = 0; i < n * 4; i++) v[i] = (i / 4 == rank) ? rank * 100 + i % 4 : -1;
  if (fc_bootstrap_allgather(bs, v, 4 * sizeof(int)) != FLEXCOLL_SUCCESS) return __LINE__;
  for (int i = 0; i < n * 4; i++)
    if (v[i] != (i / 4) * 100 + i % 4) return __LINE__;
  if (fc_bootstrap_barrier(bs) != FLEXCOLL_SUCCESS) return __LINE__;
  /* Odd ranks come late, so that their previous rank's next message is already queued when they
   * peek: peer_lost must neither report it as a loss nor eat it (the all-gather would then fail). */
  if (fc_bootstrap_peer_lost(bs)) return __LINE__;
  if (rank % 2) sleep_ms(50);
  if (fc_bootstrap_peer_lost(bs)) return __LINE__;
  /* More than the socket buffers hold: both directions must move at once. */
  size_t big = 256 * 1024;
  unsigned char *d = malloc(big * (size_t)n);
  if (!d) return __LINE__;
  for (size_t i = 0; i < big; i++) d[(size_t)rank * big + i] = (unsigned char)(rank * 31 + i);
  int line = 0;
  if (fc_bootstrap_allgather(bs, d, big) != FLEXCOLL_SUCCESS) line = __LINE__;
  for (size_t i = 0; !line && i < big * (size_t)n; i++)
    if (d[i] != (unsigned char)((int)(i / big) * 31 + i % big)) line = __LINE__;
  free(d);
  if (!line && fc_bootstrap_allgather(bs, NULL, 0) != FLEXCOLL_SUCCESS) line = __LINE__;
  /* Not after the last collective: by then a neighbour may have finished and closed. */
  if (!line && fc_bootstrap_peer_lost(bs)) line = __LINE__;
  for (int i = 0; !line && i < 3; i++)
    if (fc_bootstrap_barrier(bs) != FLEXCOLL_SUCCESS) line = __LINE__;
  return line;
}

/* ---- ranks as threads ------------------------------------------------------------------------ */

typedef struct rank_s {
  const flexcoll_unique_id_t *id;
  int rank, nranks, timeout_ms;
  atomic_int *abort_flag;
  int (*body)(fc_bootstrap_t *bs, struct rank_s *a); /* NULL: exercise */
  fc_result_t res;
  int fail_line;
  int64_t elapsed_ms;
  char err[512];
} rank_t;

static void *rank_thread(void *arg) {
  rank_t *a = arg;
  fc_bootstrap_t *bs = NULL;
  int64_t t0 = now_ms();
  a->res = fc_bootstrap_init(&bs, a->id, a->rank, a->nranks, a->timeout_ms ? a->timeout_ms : TMO_MS, a->abort_flag);
  a->elapsed_ms = now_ms() - t0;
  snprintf(a->err, sizeof a->err, "%s", fc_thread_last_error());
  if (a->res == FLEXCOLL_SUCCESS) {
    if (bs == NULL) a->fail_line = __LINE__;
    else a->fail_line = a->body ? a->body(bs, a) : exercise(bs, a->rank, a->nranks);
  } else if (bs != NULL) {
    a->fail_line = __LINE__;
  }
  fc_bootstrap_close(bs);
  return NULL;
}

static void launch(pthread_t *t, rank_t *a) { ck_assert_int_eq(pthread_create(t, NULL, rank_thread, a), 0); }

static void check_ok(const rank_t *a) {
  ck_assert_msg(a->res == FLEXCOLL_SUCCESS, "rank %d of %d: result %d: %s", a->rank, a->nranks, a->res, a->err);
  ck_assert_msg(a->fail_line == 0, "rank %d of %d failed at line %d", a->rank, a->nranks, a->fail_line);
}

/* All n ranks as threads, each with its own copy of the id; every one must succeed. */
static void run_thread_ranks(const flexcoll_unique_id_t *ids, int nids, int n, int (*body)(fc_bootstrap_t *, rank_t *)) {
  pthread_t t[8];
  rank_t a[8];
  for (int r = 0; r < n; r++) {
    a[r] = (rank_t){.id = &ids[r % nids], .rank = r, .nranks = n, .body = body};
    launch(&t[r], &a[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < n; r++) check_ok(&a[r]);
}

START_TEST(test_threads) {
  flexcoll_unique_id_t id;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  run_thread_ranks(&id, 1, sizes[_i], NULL);
}
END_TEST

/* A neighbour that closes its bootstrap (destroys its communicator) has left, not died: it says
 * goodbye, and peer_lost stays 0.  Dying without a goodbye is covered by the process tests. */
static int close_early(fc_bootstrap_t *bs, rank_t *a) {
  if (fc_bootstrap_barrier(bs) != FLEXCOLL_SUCCESS) return __LINE__;
  if (a->rank == 1) return 0; /* its bootstrap is closed on return */
  sleep_ms(200);
  for (int i = 0; i < 20; i++, sleep_ms(10))
    if (fc_bootstrap_peer_lost(bs)) return __LINE__;
  return 0;
}

START_TEST(test_threads_peer_closed) {
  flexcoll_unique_id_t id;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  run_thread_ranks(&id, 1, 2, close_early);
}
END_TEST

/* fc_bootstrap_set_progress: rank 0's waits call its progress function, which is what lets rank 1
 * reach the exchange at all (as a peer still in a collective needs this rank's transport to move
 * its last bytes); waits that only slept in poll would leave both ranks waiting for each other
 * until the timeout.  Cleared, the next exchanges wait as before. */
static atomic_int progress_calls, rank1_may_enter;

static int count_progress(void *arg) {
  if (atomic_fetch_add(&progress_calls, 1) + 1 == 100) atomic_store((atomic_int *)arg, 1);
  return 0;
}

static int progress_in_waits(fc_bootstrap_t *bs, rank_t *a) {
  int v[2] = {0, 0};
  v[a->rank] = a->rank + 1;
  if (a->rank == 0) {
    fc_bootstrap_set_progress(bs, count_progress, &rank1_may_enter);
    if (fc_bootstrap_allgather(bs, v, sizeof v[0]) != FLEXCOLL_SUCCESS) return __LINE__;
    fc_bootstrap_set_progress(bs, NULL, NULL);
  } else {
    for (int64_t end = now_ms() + TMO_MS; !atomic_load(&rank1_may_enter); sleep_ms(1))
      if (now_ms() > end) return __LINE__;
    if (fc_bootstrap_allgather(bs, v, sizeof v[0]) != FLEXCOLL_SUCCESS) return __LINE__;
  }
  if (v[0] != 1 || v[1] != 2) return __LINE__;
  const int calls = atomic_load(&progress_calls);
  if (fc_bootstrap_barrier(bs) != FLEXCOLL_SUCCESS) return __LINE__;
  if (a->rank == 0 && atomic_load(&progress_calls) != calls) return __LINE__; /* cleared: not called */
  return 0;
}

START_TEST(test_progress_in_waits) {
  flexcoll_unique_id_t id;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  atomic_store(&progress_calls, 0);
  atomic_store(&rank1_may_enter, 0);
  run_thread_ranks(&id, 1, 2, progress_in_waits);
  ck_assert_int_ge(atomic_load(&progress_calls), 100);
}
END_TEST

START_TEST(test_from_address) {
  char hp[64];
  snprintf(hp, sizeof hp, "127.0.0.1:%d", free_port());
  flexcoll_unique_id_t ids[3];
  /* Each rank computes its own id from the launcher's address: they must agree. */
  for (int r = 0; r < 3; r++) ck_assert_int_eq(fc_bootstrap_id_from_address(&ids[r], hp, 3, NULL), FLEXCOLL_SUCCESS);
  ck_assert_mem_eq(&ids[0], &ids[1], sizeof ids[0]);
  ck_assert_mem_eq(&ids[0], &ids[2], sizeof ids[0]);
  fc_bootstrap_root_t *root = NULL, *again = NULL;
  ck_assert_int_eq(fc_bootstrap_start_root(&ids[0], hp, &root), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_start_root(&ids[0], hp, &again), FLEXCOLL_SYSTEM_ERROR); /* the port is taken */
  ck_assert_ptr_null(again);
  run_thread_ranks(ids, 3, 3, NULL);
  fc_bootstrap_stop_root(root);
}
END_TEST

START_TEST(test_from_address_v6) {
  char hp[64];
  snprintf(hp, sizeof hp, "[::1]:%d", free_port());
  flexcoll_unique_id_t id;
  ck_assert_int_eq(fc_bootstrap_id_from_address(&id, hp, 2, NULL), FLEXCOLL_SUCCESS);
  fc_bootstrap_root_t *root = NULL;
  if (fc_bootstrap_start_root(&id, hp, &root) != FLEXCOLL_SUCCESS) return; /* no IPv6 on this host */
  run_thread_ranks(&id, 1, 2, NULL);
  fc_bootstrap_stop_root(root);
}
END_TEST

START_TEST(test_abort) {
  flexcoll_unique_id_t id;
  atomic_int flag = 0;
  pthread_t t;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  rank_t a = {.id = &id, .rank = 0, .nranks = 2, .abort_flag = &flag}; /* rank 1 does not come yet */
  launch(&t, &a);
  sleep_ms(200);
  int64_t t0 = now_ms();
  atomic_store(&flag, 1);
  pthread_join(t, NULL);
  ck_assert_int_eq(a.res, FLEXCOLL_REMOTE_ERROR);
  ck_assert_msg(now_ms() - t0 < 1000, "abort took %lld ms", (long long)(now_ms() - t0));
  ck_assert_ptr_nonnull(strstr(a.err, "aborted"));
  /* The aborted rank left the root, so its slot is free for a new attempt. */
  run_thread_ranks(&id, 1, 2, NULL);
}
END_TEST

/* ---- ranks as processes ------------------------------------------------------------------- */

typedef int (*proc_body_t)(const flexcoll_unique_id_t *id, int rank, int n, void *arg);

static int proc_exercise(const flexcoll_unique_id_t *id, int rank, int n, void *arg) {
  (void)arg;
  fc_bootstrap_t *bs;
  if (fc_bootstrap_init(&bs, id, rank, n, TMO_MS, NULL) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "rank %d: init: %s\n", rank, fc_thread_last_error());
    return 10;
  }
  int line = exercise(bs, rank, n);
  if (line) fprintf(stderr, "rank %d of %d failed at line %d\n", rank, n, line);
  fc_bootstrap_close(bs);
  return line ? 11 : 0;
}

/* Fork n ranks running body; the root thread stays in this process, as with a launcher that
 * creates the id before forking its workers. */
static void run_procs(const flexcoll_unique_id_t *id, int n, proc_body_t body, void *arg, pid_t *pids) {
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) _exit(body(id, r, n, arg));
  }
}

/* Reap the ranks into status[] (wait statuses); ranks still running after 20 s are killed. */
static void wait_procs(int n, pid_t *pids, int *status) {
  int64_t end = now_ms() + 20000;
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; r++) {
      if (pids[r] <= 0) continue;
      if (waitpid(pids[r], &status[r], WNOHANG) == pids[r]) pids[r] = 0, left--;
      else if (now_ms() > end) kill(pids[r], SIGKILL);
    }
    if (left) sleep_ms(5);
  }
}

START_TEST(test_procs) {
  int n = sizes[_i], status[8];
  pid_t pids[8];
  flexcoll_unique_id_t id;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  run_procs(&id, n, proc_exercise, NULL, pids);
  wait_procs(n, pids, status);
  for (int r = 0; r < n; r++)
    ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d of %d: wait status 0x%x", r, n,
                  status[r]);
}
END_TEST

static int proc_lost(const flexcoll_unique_id_t *id, int rank, int n, void *arg) {
  int wfd = *(int *)arg;
  fc_bootstrap_t *bs;
  if (fc_bootstrap_init(&bs, id, rank, n, TMO_MS, NULL) != FLEXCOLL_SUCCESS) return 10;
  if (fc_bootstrap_barrier(bs) != FLEXCOLL_SUCCESS) return 11;
  if (rank != 1 && fc_bootstrap_peer_lost(bs)) return 12;
  /* After this barrier every rank has done its check above, so rank 1 may be killed. */
  if (fc_bootstrap_barrier(bs) != FLEXCOLL_SUCCESS) return 13;
  if (rank == 1) {
    if (write(wfd, "k", 1) != 1) return 14;
    sleep(30);
    return 15;
  }
  for (int i = 0; i < 500; i++, sleep_ms(10)) {
    if (fc_bootstrap_peer_lost(bs)) {
      fc_bootstrap_close(bs);
      return 0;
    }
  }
  return 16;
}

START_TEST(test_procs_peer_killed) {
  int p[2], status[3];
  pid_t pids[3], victim;
  flexcoll_unique_id_t id;
  ck_assert_int_eq(pipe(p), 0);
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  run_procs(&id, 3, proc_lost, &p[1], pids);
  victim = pids[1];
  struct pollfd pf = {p[0], POLLIN, 0};
  char c = 0;
  int ready = poll(&pf, 1, 10000) == 1 && read(p[0], &c, 1) == 1;
  kill(victim, SIGKILL);
  wait_procs(3, pids, status);
  close(p[0]);
  close(p[1]);
  ck_assert_msg(ready, "rank 1 never reached the point where it is killed");
  ck_assert(WIFSIGNALED(status[1]) && WTERMSIG(status[1]) == SIGKILL);
  /* Rank 0 sees it through its connection to rank+1, rank 2 through the one from rank-1. */
  for (int r = 0; r < 3; r += 2)
    ck_assert_msg(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d: wait status 0x%x", r, status[r]);
}
END_TEST

/* ---- unique ids ---------------------------------------------------------------------------- */

START_TEST(test_id_v4) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(4567)};
  inet_pton(AF_INET, "10.1.2.3", &a.sin_addr);
  flexcoll_unique_id_t id;
  uint64_t magic = 0;
  struct sockaddr_storage out;
  socklen_t len = 0;
  ck_assert_int_eq(fc_bootstrap_id_encode(&id, 0x0123456789abcdefULL, (struct sockaddr *)&a, sizeof a), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_id_decode(&id, &magic, &out, &len), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(magic, 0x0123456789abcdefULL);
  ck_assert_uint_eq(len, sizeof a);
  ck_assert_mem_eq(&out, &a, sizeof a);
}
END_TEST

START_TEST(test_id_v6) {
  struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(1234), .sin6_scope_id = 3};
  inet_pton(AF_INET6, "fe80::1:2:3", &a.sin6_addr);
  flexcoll_unique_id_t id;
  uint64_t magic = 0;
  struct sockaddr_storage out;
  socklen_t len = 0;
  ck_assert_int_eq(fc_bootstrap_id_encode(&id, ~0ULL, (struct sockaddr *)&a, sizeof a), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_id_decode(&id, &magic, &out, &len), FLEXCOLL_SUCCESS);
  ck_assert_uint_eq(magic, ~0ULL);
  ck_assert_uint_eq(len, sizeof a);
  ck_assert_mem_eq(&out, &a, sizeof a);
}
END_TEST

START_TEST(test_id_garbage) {
  flexcoll_unique_id_t id, bad;
  uint64_t magic;
  struct sockaddr_storage out;
  socklen_t len;
  memset(&bad, 0, sizeof bad);
  ck_assert_int_eq(fc_bootstrap_id_decode(&bad, &magic, &out, &len), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fc_thread_last_error(), "not well formed"));
  unsigned seed = 12345;
  for (int k = 0; k < 1000; k++) {
    for (size_t i = 0; i < sizeof bad; i++) bad.internal[i] = (char)rand_r(&seed);
    ck_assert_int_eq(fc_bootstrap_id_decode(&bad, &magic, &out, &len), FLEXCOLL_INVALID_ARGUMENT);
  }
  loopback_id(&id, 5000, 42);
  for (size_t i = 0; i < sizeof id; i++) { /* any single changed byte is caught */
    bad = id;
    bad.internal[i] ^= 0x10;
    ck_assert_msg(fc_bootstrap_id_decode(&bad, &magic, &out, &len) == FLEXCOLL_INVALID_ARGUMENT, "byte %zu", i);
  }
  struct sockaddr_in noport = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct sockaddr unix_addr = {.sa_family = AF_UNIX};
  ck_assert_int_eq(fc_bootstrap_id_encode(&bad, 1, (struct sockaddr *)&noport, sizeof noport), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_bootstrap_id_encode(&bad, 1, &unix_addr, sizeof unix_addr), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_bootstrap_id_encode(&bad, 1, (struct sockaddr *)&noport, 4), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_bootstrap_id_decode(NULL, &magic, &out, &len), FLEXCOLL_INVALID_ARGUMENT);
  /* init refuses such an id before touching the network */
  fc_bootstrap_t *bs = (fc_bootstrap_t *)&bad;
  memset(&bad, 0, sizeof bad);
  ck_assert_int_eq(fc_bootstrap_init(&bs, &bad, 0, 1, 1000, NULL), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_ptr_null(bs);
  ck_assert_int_eq(fc_bootstrap_init(&bs, &id, 2, 2, 1000, NULL), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_bootstrap_init(&bs, &id, 0, 0, 1000, NULL), FLEXCOLL_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_id_from_address) {
  flexcoll_unique_id_t a, b;
  uint64_t m1, m2;
  struct sockaddr_storage out;
  socklen_t len;
  ck_assert_int_eq(fc_bootstrap_id_from_address(&a, "127.0.0.1:29500", 4, NULL), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_id_from_address(&b, "127.0.0.1:29500", 4, NULL), FLEXCOLL_SUCCESS);
  ck_assert_mem_eq(&a, &b, sizeof a);
  ck_assert_int_eq(fc_bootstrap_id_decode(&a, &m1, &out, &len), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(out.ss_family, AF_INET);
  ck_assert_int_eq(ntohs(((struct sockaddr_in *)&out)->sin_port), 29500);
  ck_assert_int_eq(fc_bootstrap_id_from_address(&b, "127.0.0.1:29500", 5, NULL), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_id_decode(&b, &m2, &out, &len), FLEXCOLL_SUCCESS);
  ck_assert_uint_ne(m1, m2); /* another rank count is another job */
  ck_assert_int_eq(fc_bootstrap_id_from_address(&b, "[::1]:1234", 2, NULL), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_id_decode(&b, &m2, &out, &len), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(out.ss_family, AF_INET6);
  ck_assert_int_eq(fc_bootstrap_id_from_address(&b, "localhost:1234", 2, NULL), FLEXCOLL_SUCCESS);
  static const char *const bad[] = {"", "127.0.0.1", "127.0.0.1:", ":29500", "127.0.0.1:0", "127.0.0.1:65536",
                                    "127.0.0.1:12a", "127.0.0.1:-1", "[::1", "[::1]29500", "[]:80", "1.2.3.4:123456"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_msg(fc_bootstrap_id_from_address(&b, bad[i], 2, NULL) == FLEXCOLL_INVALID_ARGUMENT, "\"%s\"", bad[i]);
    ck_assert_ptr_nonnull(strstr(fc_thread_last_error(), bad[i]));
  }
  ck_assert_int_eq(fc_bootstrap_id_from_address(&b, "127.0.0.1:1", 0, NULL), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_eq(fc_bootstrap_id_from_address(&b, NULL, 2, NULL), FLEXCOLL_INVALID_ARGUMENT);
}
END_TEST

/* ---- a root under attack ------------------------------------------------------------------- */

static int raw_connect(const flexcoll_unique_id_t *id) {
  uint64_t magic;
  struct sockaddr_storage a;
  socklen_t len;
  ck_assert_int_eq(fc_bootstrap_id_decode(id, &magic, &a, &len), FLEXCOLL_SUCCESS);
  int fd = socket(a.ss_family, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, len), 0);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/* 1 once connecting to the id's root is refused (its listener is closed). */
static int root_gone(const flexcoll_unique_id_t *id, int ms) {
  uint64_t magic;
  struct sockaddr_storage a;
  socklen_t len;
  ck_assert_int_eq(fc_bootstrap_id_decode(id, &magic, &a, &len), FLEXCOLL_SUCCESS);
  for (int64_t end = now_ms() + ms; now_ms() < end; sleep_ms(20)) {
    int fd = socket(a.ss_family, SOCK_STREAM, 0);
    int rc = connect(fd, (struct sockaddr *)&a, len), e = errno;
    close(fd);
    if (rc != 0 && e == ECONNREFUSED) return 1;
  }
  return 0;
}

static void wrong_magic_id(const flexcoll_unique_id_t *id, flexcoll_unique_id_t *bad) {
  uint64_t magic;
  struct sockaddr_storage a;
  socklen_t len;
  ck_assert_int_eq(fc_bootstrap_id_decode(id, &magic, &a, &len), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_id_encode(bad, magic ^ 1, (struct sockaddr *)&a, len), FLEXCOLL_SUCCESS);
}

START_TEST(test_root_survives_garbage) {
  flexcoll_unique_id_t id, bad;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  int fds[6];
  char junk[200];
  memset(junk, 0xab, sizeof junk);
  fds[0] = raw_connect(&id); /* sends nothing, stays open */
  fds[1] = raw_connect(&id); /* garbage, more than a hello */
  ck_assert_int_eq(send(fds[1], junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
  fds[2] = raw_connect(&id); /* a partial hello, then silence */
  ck_assert_int_eq(send(fds[2], "FCBH", 4, MSG_NOSIGNAL), 4);
  fds[3] = raw_connect(&id); /* something else's protocol */
  const char *http = "GET / HTTP/1.0\r\nHost: x\r\n\r\n";
  ck_assert_int_eq(send(fds[3], http, strlen(http), MSG_NOSIGNAL), (ssize_t)strlen(http));
  fds[4] = raw_connect(&id); /* connects and leaves at once */
  close(fds[4]);
  fds[4] = raw_connect(&id); /* garbage of exactly a hello's size */
  ck_assert_int_eq(send(fds[4], junk, 48, MSG_NOSIGNAL), 48);
  fds[5] = raw_connect(&id); /* a reset instead of a close */
  struct linger lg = {1, 0};
  setsockopt(fds[5], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(fds[5]);
  /* A well-formed hello with the wrong magic, while the others wait. */
  wrong_magic_id(&id, &bad);
  fc_bootstrap_t *bs = NULL;
  ck_assert_int_eq(fc_bootstrap_init(&bs, &bad, 1, 3, 1500, NULL), FLEXCOLL_INVALID_ARGUMENT);
  run_thread_ranks(&id, 1, 3, NULL);
  /* The root is gone and has closed every connection it held (a reset where it left data unread). */
  char c;
  for (int i = 0; i < 5; i++) {
    ssize_t k = recv(fds[i], &c, 1, 0);
    ck_assert_msg(k == 0 || (k < 0 && errno == ECONNRESET), "connection %d not closed by the root", i);
    close(fds[i]);
  }
}
END_TEST

START_TEST(test_wrong_magic) {
  flexcoll_unique_id_t id, bad;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  wrong_magic_id(&id, &bad);
  fc_bootstrap_t *bs = NULL;
  /* The root answers nothing; the rank retries until its timeout, then names the likely cause. */
  int64_t t0 = now_ms();
  ck_assert_int_eq(fc_bootstrap_init(&bs, &bad, 0, 2, 1500, NULL), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_ge(now_ms() - t0, 1400);
  ck_assert_ptr_null(bs);
  ck_assert_msg(strstr(fc_thread_last_error(), "unique id does not match the root's"), "%s", fc_thread_last_error());
  run_thread_ranks(&id, 1, 2, NULL);
}
END_TEST

/* A well-formed hello from rank r of n with magic; returns its size. */
static size_t make_hello(unsigned char *m, uint64_t magic, int r, int n) {
  struct sockaddr_in self = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  frame_put(m, TAG_HELLO, 0, HELLO_BYTES);
  put32(m + FRAME_BYTES, PROTO_VERSION);
  put64(m + FRAME_BYTES + 4, magic);
  put32(m + FRAME_BYTES + 12, (uint32_t)r);
  put32(m + FRAME_BYTES + 16, (uint32_t)n);
  fc_bs_addr_pack(m + FRAME_BYTES + 20, (struct sockaddr *)&self, sizeof self);
  return FRAME_BYTES + HELLO_BYTES;
}

/* 1 when the root closes fd without having sent a single byte. */
static int closed_silently(int fd) {
  unsigned char c;
  ssize_t k = recv(fd, &c, 1, 0); /* raw_connect set a 5 s receive timeout */
  return k == 0 || (k < 0 && errno == ECONNRESET);
}

START_TEST(test_wrong_magic_silent) {
  /* Issue 13 item 5: a hello with another magic learns nothing, not even the job's rank count. */
  flexcoll_unique_id_t id;
  uint64_t magic;
  struct sockaddr_storage a;
  socklen_t len;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_id_decode(&id, &magic, &a, &len), FLEXCOLL_SUCCESS);
  pthread_t t;
  rank_t first = {.id = &id, .rank = 0, .nranks = 2};
  launch(&t, &first);
  sleep_ms(200); /* the root now knows the rank count */
  unsigned char m[FRAME_BYTES + HELLO_BYTES];
  size_t n = make_hello(m, magic ^ 0x8000, 1, 2);
  int fd = raw_connect(&id);
  ck_assert_int_eq(send(fd, m, n, MSG_NOSIGNAL), (ssize_t)n);
  ck_assert_msg(closed_silently(fd), "the root answered a hello with the wrong magic");
  close(fd);
  /* An old protocol version and a wrong frame length are dropped the same way. */
  n = make_hello(m, magic, 1, 2);
  put32(m + FRAME_BYTES, 1);
  fd = raw_connect(&id);
  ck_assert_int_eq(send(fd, m, n, MSG_NOSIGNAL), (ssize_t)n);
  ck_assert(closed_silently(fd));
  close(fd);
  rank_t second = {.id = &id, .rank = 1, .nranks = 2};
  pthread_t t2;
  launch(&t2, &second);
  pthread_join(t, NULL);
  pthread_join(t2, NULL);
  check_ok(&first);
  check_ok(&second);
}
END_TEST

START_TEST(test_duplicate_rank) {
  flexcoll_unique_id_t id;
  pthread_t t;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  rank_t first = {.id = &id, .rank = 0, .nranks = 2};
  launch(&t, &first);
  sleep_ms(300); /* let it join */
  fc_bootstrap_t *bs = NULL;
  ck_assert_int_eq(fc_bootstrap_init(&bs, &id, 0, 2, 5000, NULL), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fc_thread_last_error(), "joined twice"), "%s", fc_thread_last_error());
  rank_t second = {.id = &id, .rank = 1, .nranks = 2};
  pthread_t t2;
  launch(&t2, &second);
  pthread_join(t, NULL);
  pthread_join(t2, NULL);
  check_ok(&first);
  check_ok(&second);
}
END_TEST

START_TEST(test_nranks_mismatch) {
  flexcoll_unique_id_t id;
  pthread_t t;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  rank_t first = {.id = &id, .rank = 0, .nranks = 2};
  launch(&t, &first);
  sleep_ms(300);
  fc_bootstrap_t *bs = NULL;
  ck_assert_int_eq(fc_bootstrap_init(&bs, &id, 1, 3, 5000, NULL), FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fc_thread_last_error(), "disagree"), "%s", fc_thread_last_error());
  pthread_join(t, NULL); /* the rank that was waiting is failed too, not left to time out */
  ck_assert_int_eq(first.res, FLEXCOLL_INVALID_ARGUMENT);
  ck_assert_int_lt(first.elapsed_ms, 3000);
  ck_assert_int_eq(fc_bootstrap_init(&bs, &id, 1, 2, 5000, NULL), FLEXCOLL_INVALID_ARGUMENT);
  /* As many ranks as the larger count have been told: the root is done and stops listening. */
  ck_assert(root_gone(&id, 2000));
}
END_TEST

/* ---- dead roots and interfaces ---------------------------------------------------------- */

START_TEST(test_no_root) {
  flexcoll_unique_id_t id;
  loopback_id(&id, free_port(), 7);
  fc_bootstrap_t *bs = NULL;
  int64_t t0 = now_ms();
  ck_assert_int_eq(fc_bootstrap_init(&bs, &id, 0, 2, 1000, NULL), FLEXCOLL_TIMEOUT);
  int64_t dt = now_ms() - t0;
  ck_assert_msg(dt >= 900 && dt < 2500, "took %lld ms", (long long)dt);
  ck_assert_ptr_null(bs);
  ck_assert_msg(strstr(fc_thread_last_error(), "bootstrap root"), "%s", fc_thread_last_error());
}
END_TEST

START_TEST(test_silent_root) {
  /* Something listens but never answers (a hung root): the wait for the reply times out. */
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_eq(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(listen(lfd, 8), 0);
  ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&a, &len), 0);
  flexcoll_unique_id_t id;
  loopback_id(&id, ntohs(a.sin_port), 7);
  fc_bootstrap_t *bs = NULL;
  int64_t t0 = now_ms();
  ck_assert_int_eq(fc_bootstrap_init(&bs, &id, 0, 2, 1000, NULL), FLEXCOLL_TIMEOUT);
  int64_t dt = now_ms() - t0;
  ck_assert_msg(dt >= 900 && dt < 2500, "took %lld ms", (long long)dt);
  close(lfd);
}
END_TEST

START_TEST(test_root_lifetime) {
  if (in_nofork_mode()) return; /* the parameter is read once per process */
  setenv("FLEXCOLL_BOOTSTRAP_TIMEOUT", "1", 1);
  flexcoll_unique_id_t id;
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  fc_bootstrap_t *bs = NULL;
  int64_t t0 = now_ms();
  fc_result_t res = fc_bootstrap_init(&bs, &id, 0, 2, 10000, NULL);
  ck_assert_msg(res == FLEXCOLL_REMOTE_ERROR, "result %d: %s", res, fc_thread_last_error());
  ck_assert_int_lt(now_ms() - t0, 4000);
}
END_TEST

START_TEST(test_ifname) {
  flexcoll_unique_id_t id;
  uint64_t magic;
  struct sockaddr_storage a;
  socklen_t len;
  setenv("FLEXCOLL_SOCKET_IFNAME", "=lo", 1);
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  ck_assert_int_eq(fc_bootstrap_id_decode(&id, &magic, &a, &len), FLEXCOLL_SUCCESS);
  ck_assert(a.ss_family == AF_INET ? ntohl(((struct sockaddr_in *)&a)->sin_addr.s_addr) >> 24 == 127
                                   : IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&a)->sin6_addr));
  run_thread_ranks(&id, 1, 2, NULL);
  setenv("FLEXCOLL_SOCKET_IFNAME", "^lo,eth,en,ib,ifb,docker,veth,wl,br,bond,virbr", 1);
  fc_result_t res = fc_bootstrap_create_root(&id); /* other interfaces may or may not exist here */
  if (res == FLEXCOLL_SUCCESS) run_thread_ranks(&id, 1, 2, NULL);
  setenv("FLEXCOLL_SOCKET_IFNAME", "nosuchinterface", 1);
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_INVALID_USAGE);
  ck_assert_msg(strstr(fc_thread_last_error(), "FLEXCOLL_SOCKET_IFNAME"), "%s", fc_thread_last_error());
  unsetenv("FLEXCOLL_SOCKET_IFNAME");
  /* The default is reachable from here whatever it chose. */
  ck_assert_int_eq(fc_bootstrap_create_root(&id), FLEXCOLL_SUCCESS);
  run_thread_ranks(&id, 1, 2, NULL);
}
END_TEST

static Suite *bootstrap_suite(void) {
  Suite *s = suite_create("bootstrap");
  TCase *tc = tcase_create("id");
  tcase_add_test(tc, test_id_v4);
  tcase_add_test(tc, test_id_v6);
  tcase_add_test(tc, test_id_garbage);
  tcase_add_test(tc, test_id_from_address);
  suite_add_tcase(s, tc);
  tc = tcase_create("threads");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_threads, 0, (int)(sizeof sizes / sizeof sizes[0]));
  tcase_add_test(tc, test_threads_peer_closed);
  tcase_add_test(tc, test_progress_in_waits);
  tcase_add_test(tc, test_from_address);
  tcase_add_test(tc, test_from_address_v6);
  tcase_add_test(tc, test_abort);
  suite_add_tcase(s, tc);
  tc = tcase_create("procs");
  tcase_set_timeout(tc, 30);
  tcase_add_loop_test(tc, test_procs, 0, (int)(sizeof sizes / sizeof sizes[0]));
  tcase_add_test(tc, test_procs_peer_killed);
  suite_add_tcase(s, tc);
  tc = tcase_create("robust");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_root_survives_garbage);
  tcase_add_test(tc, test_wrong_magic);
  tcase_add_test(tc, test_wrong_magic_silent);
  tcase_add_test(tc, test_duplicate_rank);
  tcase_add_test(tc, test_nranks_mismatch);
  suite_add_tcase(s, tc);
  tc = tcase_create("errors");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_no_root);
  tcase_add_test(tc, test_silent_root);
  tcase_add_test(tc, test_root_lifetime);
  tcase_add_test(tc, test_ifname);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(bootstrap_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
