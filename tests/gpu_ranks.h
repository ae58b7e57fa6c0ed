/* gpu_ranks.h — what the GPU tests whose ranks are threads of one process share.
 *
 * A test defines TEST_TAG (its name in brackets, as it prints it) before including this, and
 * starts its rank type with FC_TEST_RANK_MEMBERS.  EXPECT counts a rank's failed expectation in
 * its `failures`, printed with the tag, the rank and where; fc_test_run_ranks runs one thread per
 * rank and sums their failures. */
#ifndef FC_TESTS_GPU_RANKS_H
#define FC_TESTS_GPU_RANKS_H

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include "flexcoll.h"

#define FC_TEST_RANK_MEMBERS \
  int rank;                  \
  flexcoll_unique_id_t id;   \
  int failures

#define EXPECT(r, cond, ...)                                \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, TEST_TAG " rank %d: ", (r)->rank);    \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);    \
      (r)->failures++;                                      \
    }                                                       \
  } while (0)

typedef struct {
  FC_TEST_RANK_MEMBERS;
} fc_test_rank_head_t;

/* n ranks of `size` bytes each at `ranks` (numbered 0..n-1 here, all with id), fn on each in a
 * thread of its own; returns once all have ended, with the sum of their failures. */
static inline int fc_test_run_ranks(void *ranks, size_t size, int n, flexcoll_unique_id_t id, void *(*fn)(void *)) {
  pthread_t threads[64];
  int failures = 0;
  if (n > 64) return 1;
  for (int i = 0; i < n; i++) {
    fc_test_rank_head_t *r = (fc_test_rank_head_t *)((char *)ranks + (size_t)i * size);
    r->rank = i;
    r->id = id;
    pthread_create(&threads[i], NULL, fn, r);
  }
  for (int i = 0; i < n; i++) {
    pthread_join(threads[i], NULL);
    failures += ((fc_test_rank_head_t *)((char *)ranks + (size_t)i * size))->failures;
  }
  return failures;
}

#endif
