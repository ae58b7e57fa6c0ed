/* test_p2p.c — flexcoll_send / flexcoll_recv / flexcoll_alltoall / flexcoll_gather /
 * flexcoll_scatter on host memory: forked ranks (over
 * TCP and over shared memory) and threads of one process, every datatype, counts 0, 1, odd and
 * large, fresh random data; ranks that take no part in a send keep their collectives in step;
 * bad input. */
#define _GNU_SOURCE
#include <check.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "flexcoll.h"
#include "group.h"
#include "harness.h"

static const size_t counts[] = {0, 1, 7, 100003};
#define NCOUNTS (sizeof counts / sizeof counts[0])

/* Ring exchange inside a group: send to next, receive from previous, plus a message to self. */
static int ring_exchange(hx_rank_t *r, flexcoll_datatype_t dt, size_t count, uint64_t call) {
  size_t es = fc_dtype_size(dt);
  int next = (r->rank + 1) % r->nranks, prev = (r->rank + r->nranks - 1) % r->nranks;
  hx_data_t d = {dt, HX_GEN_BITS, r->seed, call, r->nranks};
  hx_buf_t sb, rb, self_rb;
  char *send = hx_buf_new(r, &sb, count * es), *recv = hx_buf_new(r, &rb, count * es);
  char *self = hx_buf_new(r, &self_rb, count * es);
  if (!send || !recv || !self) return 1;
  hx_fill(&d, r->rank, send, 0, count);
  snprintf(r->what, sizeof r->what, "ring exchange %s count %zu", fc_dtype_name(dt), count);
  flexcoll_group_start();
  flexcoll_result_t a = flexcoll_send(send, count, dt, next, r->comm, NULL);
  flexcoll_result_t b = flexcoll_recv(recv, count, dt, prev, r->comm, NULL);
  flexcoll_result_t c = flexcoll_recv(self, count, dt, r->rank, r->comm, NULL); /* before its send */
  flexcoll_result_t e = flexcoll_send(send, count, dt, r->rank, r->comm, NULL);
  flexcoll_result_t end = flexcoll_group_end();
  if (hx_ok(r, a, r->comm, "send") && hx_ok(r, b, r->comm, "recv") && hx_ok(r, c, r->comm, "recv self") &&
      hx_ok(r, e, r->comm, "send self") && hx_ok(r, end, r->comm, "group_end")) {
    hx_check_input(r, "from prev", &d, prev, recv, 0, count);
    hx_check_input(r, "from self", &d, r->rank, self, 0, count);
  }
  hx_buf_check_guards(r, "recv", &rb);
  hx_buf_free(&sb);
  hx_buf_free(&rb);
  hx_buf_free(&self_rb);
  return 0;
}

static int alltoall_once(hx_rank_t *r, flexcoll_datatype_t dt, size_t count, uint64_t call) {
  size_t es = fc_dtype_size(dt), n = (size_t)r->nranks;
  hx_data_t d = {dt, HX_GEN_BITS, r->seed, call, r->nranks};
  hx_buf_t sb, rb;
  char *send = hx_buf_new(r, &sb, n * count * es), *recv = hx_buf_new(r, &rb, n * count * es);
  if (!send || !recv) return 1;
  hx_fill(&d, r->rank, send, 0, n * count);
  snprintf(r->what, sizeof r->what, "alltoall %s count %zu", fc_dtype_name(dt), count);
  if (hx_ok(r, flexcoll_alltoall(send, recv, count, dt, r->comm, NULL), r->comm, "alltoall"))
    for (int q = 0; q < r->nranks; q++)
      hx_check_input(r, "block", &d, q, recv + (size_t)q * count * es, (size_t)r->rank * count, count);
  hx_buf_check_guards(r, "recv", &rb);
  hx_buf_free(&sb);
  hx_buf_free(&rb);
  return 0;
}

/* Gather (or scatter) to (from) root, in place or not: the root's many-block buffer is checked
 * block by block against every rank's input, the others' buffers stay untouched. */
static int rooted_once(hx_rank_t *r, int gather, flexcoll_datatype_t dt, size_t count, int root, int inplace,
                       uint64_t call) {
  size_t es = fc_dtype_size(dt), n = (size_t)r->nranks;
  const int me = r->rank, is_root = me == root;
  hx_data_t d = {dt, HX_GEN_BITS, r->seed, call, r->nranks};
  hx_buf_t mb, ob; /* the root's n blocks; a rank's own block */
  char *many = hx_buf_new(r, &mb, n * count * es), *own = hx_buf_new(r, &ob, count * es);
  if (!many || !own) return 1;
  char *mine = inplace && is_root ? many + (size_t)root * count * es : own;
  if (!is_root) hx_buf_poison(&mb, 0, n * count * es);
  if (gather) hx_fill(&d, me, mine, 0, count);
  else if (is_root)
    for (size_t q = 0; q < n; q++) hx_fill(&d, (int)q, many + q * count * es, 0, count);
  snprintf(r->what, sizeof r->what, "%s %s count %zu root %d%s", gather ? "gather" : "scatter", fc_dtype_name(dt), count,
           root, inplace ? " in place" : "");
  flexcoll_result_t res = gather ? flexcoll_gather(mine, is_root ? many : NULL, count, dt, root, r->comm, NULL)
                                 : flexcoll_scatter(is_root ? many : NULL, mine, count, dt, root, r->comm, NULL);
  if (hx_ok(r, res, r->comm, gather ? "gather" : "scatter")) {
    if (gather && is_root)
      for (size_t q = 0; q < n; q++) hx_check_input(r, "gathered block", &d, (int)q, many + q * count * es, 0, count);
    if (!gather) hx_check_input(r, "scattered block", &d, me, mine, 0, count);
    /* A non-root's many-block buffer is not the call's: it stays poison. */
    if (!is_root) hx_check_poisoned(r, "a non-root's unused buffer", many, n * count * es);
  }
  hx_buf_check_guards(r, "many", &mb);
  hx_buf_check_guards(r, "own", &ob);
  hx_buf_free(&mb);
  hx_buf_free(&ob);
  return 0;
}

/* Only ranks 0 and 1 exchange (outside a group, one direction each way in turn); then everybody
 * runs an allreduce, which must still match across ranks. */
static int bystanders(hx_rank_t *r, uint64_t call) {
  int64_t v = 0, sum = 0;
  if (r->rank == 0) v = 42, hx_ok(r, flexcoll_send(&v, 1, FLEXCOLL_INT64, 1, r->comm, NULL), r->comm, "send 0->1");
  if (r->rank == 1) {
    if (hx_ok(r, flexcoll_recv(&v, 1, FLEXCOLL_INT64, 0, r->comm, NULL), r->comm, "recv 1<-0") && v != 42)
      hx_fail(r, "rank 1 received %lld, expected 42", (long long)v);
  }
  int64_t mine = r->rank + (int64_t)call;
  if (hx_ok(r, flexcoll_allreduce(&mine, &sum, 1, FLEXCOLL_INT64, FLEXCOLL_SUM, r->comm, NULL), r->comm, "allreduce")) {
    int64_t want = (int64_t)r->nranks * (r->nranks - 1) / 2 + (int64_t)r->nranks * (int64_t)call;
    if (sum != want) hx_fail(r, "allreduce after send/recv: %lld, expected %lld", (long long)sum, (long long)want);
  }
  return 0;
}

static int p2p_rank(hx_rank_t *r) {
  uint64_t call = 0;
  for (int dt = 0; dt < FLEXCOLL_NUM_DATATYPES; dt++)
    for (size_t c = 0; c < NCOUNTS; c++) {
      if (counts[c] > 1000 && dt % 3) continue; /* the large count for a few types only */
      ring_exchange(r, (flexcoll_datatype_t)dt, counts[c], call++);
      alltoall_once(r, (flexcoll_datatype_t)dt, counts[c], call++);
      for (int g = 0; g < 2; g++) {
        const int root = (int)(call % (uint64_t)r->nranks);
        rooted_once(r, g, (flexcoll_datatype_t)dt, counts[c], root, (int)(call / 2 % 2), call);
        call++;
      }
    }
  if (r->nranks >= 2)
    for (int i = 0; i < 5; i++) bystanders(r, call++);
  return 0;
}

START_TEST(test_procs) {
  static const int sizes[] = {2, 3, 4};
  hx_opts_t o = {.label = "p2p procs"};
  ck_assert_msg(hx_run_procs(sizes[_i], &o, p2p_rank, NULL), "%d ranks: see stderr", sizes[_i]);
}
END_TEST

/* The same over UCX's shared-memory transports (the default peer-failure mode keeps UCX 1.13 on
 * TCP, which the cases above use): both transports carry every message kind. */
START_TEST(test_procs_shared_memory) {
  static const char *const env[] = {"FLEXCOLL_UCX_PEER_FAILURE=0", NULL};
  hx_opts_t o = {.label = "p2p procs shm", .env = env};
  ck_assert_msg(hx_run_procs(3, &o, p2p_rank, NULL), "3 ranks over shared memory: see stderr");
}
END_TEST

START_TEST(test_threads) {
  hx_opts_t o = {.label = "p2p threads"};
  ck_assert_msg(hx_run_threads(3, &o, p2p_rank, NULL), "3 thread ranks: see stderr");
}
END_TEST

/* The root's calls cut into groups (a group's batch holds FC_P2P_MAX_OPS, which only
 * communicators of 250 ranks or more exceed): here cut at 2, every root, in place and not. */
static int rooted_batches_rank(hx_rank_t *r) {
  fc_rooted_set_batch_ops(2);
  uint64_t call = 0;
  for (int root = 0; root < r->nranks; root++)
    for (int g = 0; g < 2; g++)
      for (int inplace = 0; inplace < 2; inplace++) {
        rooted_once(r, g, FLEXCOLL_INT32, 1001, root, inplace, call++);
        rooted_once(r, g, FLEXCOLL_FLOAT64, 3, root, inplace, call++);
      }
  return 0;
}

START_TEST(test_rooted_batches) {
  hx_opts_t o = {.label = "gather/scatter in batches of 2"};
  ck_assert_msg(hx_run_procs(5, &o, rooted_batches_rank, NULL), "see stderr");
}
END_TEST

/* Inside the caller's group, the root's calls must fit what the group's batch has room for: a
 * root whose group already holds FC_P2P_MAX_OPS - 2 sends and receives (to itself, matched) is
 * refused a gather that needs 3, naming the room, and nothing of it is queued: the group still
 * runs, and the communicator still works. */
static int rooted_full_group_rank(hx_rank_t *r) {
  enum { PAIRS = (FC_P2P_MAX_OPS - 2) / 2 };
  static int32_t out[PAIRS], in[PAIRS], many[4];
  int32_t mine = r->rank;
  if (r->rank == 0) {
    hx_ok(r, flexcoll_group_start(), NULL, "group_start");
    for (int i = 0; i < PAIRS; i++) {
      out[i] = i;
      in[i] = -1;
      hx_ok(r, flexcoll_send(&out[i], 1, FLEXCOLL_INT32, 0, r->comm, NULL), r->comm, "send to self");
      hx_ok(r, flexcoll_recv(&in[i], 1, FLEXCOLL_INT32, 0, r->comm, NULL), r->comm, "recv from self");
    }
    const flexcoll_result_t res = flexcoll_gather(&mine, many, 1, FLEXCOLL_INT32, 0, r->comm, NULL);
    if (res != FLEXCOLL_INVALID_USAGE || !strstr(flexcoll_get_last_error(r->comm), "room for 2"))
      hx_fail(r, "a gather that does not fit the group: %d (%s)", res, flexcoll_get_last_error(r->comm));
    hx_ok(r, flexcoll_group_end(), r->comm, "group_end");
    for (int i = 0; i < PAIRS; i++)
      if (in[i] != i) {
        hx_fail(r, "message %d to itself: %d", i, in[i]);
        break;
      }
  }
  int32_t sum = 0;
  if (hx_ok(r, flexcoll_allreduce(&mine, &sum, 1, FLEXCOLL_INT32, FLEXCOLL_SUM, r->comm, NULL), r->comm, "allreduce") &&
      sum != 1)
    hx_fail(r, "allreduce after the refused gather: %d", sum);
  return 0;
}

START_TEST(test_rooted_full_group) {
  hx_opts_t o = {.label = "gather refused by a full group"};
  ck_assert_msg(hx_run_procs(2, &o, rooted_full_group_rank, NULL), "see stderr");
}
END_TEST

/* Bad input: the documented codes and a last error naming the problem. */
static void refused(hx_rank_t *r, flexcoll_result_t res, flexcoll_result_t code, const char *needle, const char *what) {
  const char *msg = flexcoll_get_last_error(NULL);
  if (res != code || !strstr(msg, needle)) hx_fail(r, "%s: %d (%s), expected %d naming %s", what, res, msg, code, needle);
}

static int bad_input_rank(hx_rank_t *r) {
  char buf[64] = {0};
  refused(r, flexcoll_send(buf, 1, FLEXCOLL_INT8, r->nranks, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "peer",
          "send to peer nranks");
  refused(r, flexcoll_recv(NULL, 4, FLEXCOLL_INT8, 0, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "recvbuf",
          "recv into NULL");
  refused(r, flexcoll_alltoall(buf, buf + 1, 1, FLEXCOLL_INT8, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "overlap",
          "overlapping alltoall");
  refused(r, flexcoll_gather(buf, buf, 1, FLEXCOLL_INT8, r->nranks, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "root",
          "gather to root nranks");
  refused(r, flexcoll_scatter(NULL, buf, 1, FLEXCOLL_INT8, r->rank, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT,
          "sendbuf", "scatter from NULL on the root");
  /* The root's own block not at its place in recvbuf, yet overlapping it. */
  refused(r, flexcoll_gather(buf + 1, buf, 4, FLEXCOLL_INT8, r->rank, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT,
          "overlap", "overlapping gather");
  refused(r, flexcoll_send(buf, 1, FLEXCOLL_INT8, -1, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "peer",
          "send to peer -1");
  refused(r, flexcoll_recv(buf, 1, FLEXCOLL_INT8, INT_MIN, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "peer",
          "recv from peer INT_MIN");
  refused(r, flexcoll_scatter(buf, buf + 8, 1, FLEXCOLL_INT8, -1, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "root",
          "scatter from root -1");
  refused(r, flexcoll_gather(buf, buf + 8, SIZE_MAX / 2, FLEXCOLL_INT32, 0, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT,
          "count", "gather of SIZE_MAX / 2 elements");
  refused(r, flexcoll_alltoall(buf, buf + 32, 1, (flexcoll_datatype_t)-3, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT,
          "datatype", "alltoall of datatype -3");
  refused(r, flexcoll_alltoall(NULL, buf, 1, FLEXCOLL_INT8, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "sendbuf",
          "alltoall from NULL");
  refused(r, flexcoll_send(buf, 1, FLEXCOLL_INT8, 0, NULL, NULL), FLEXCOLL_INVALID_ARGUMENT, "comm",
          "send on a NULL communicator");
  refused(r, flexcoll_send(buf, 1, (flexcoll_datatype_t)77, 0, r->comm, NULL), FLEXCOLL_INVALID_ARGUMENT, "datatype",
          "send of datatype 77");
  /* Sizes that disagree: rank 0 sends 8 bytes, rank 1 expects 16. */
  if (r->rank == 0) flexcoll_send(buf, 8, FLEXCOLL_UINT8, 1, r->comm, NULL);
  if (r->rank == 1) {
    const flexcoll_result_t res = flexcoll_recv(buf, 16, FLEXCOLL_UINT8, 0, r->comm, NULL);
    if (res != FLEXCOLL_INVALID_USAGE)
      hx_fail(r, "recv of 16 bytes from a send of 8: %d (%s)", res, flexcoll_get_last_error(r->comm));
  }
  return 0;
}

START_TEST(test_bad_input) {
  hx_opts_t o = {.label = "p2p bad input"};
  ck_assert_msg(hx_run_procs(2, &o, bad_input_rank, NULL), "see stderr");
}
END_TEST

int main(void) {
  Suite *s = suite_create("p2p");
  TCase *tc = tcase_create("p2p");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_procs, 0, 3);
  tcase_add_test(tc, test_procs_shared_memory);
  tcase_add_test(tc, test_threads);
  tcase_add_test(tc, test_bad_input);
  tcase_add_test(tc, test_rooted_batches);
  tcase_add_test(tc, test_rooted_full_group);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
