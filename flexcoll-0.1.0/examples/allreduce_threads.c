/*
 * allreduce_threads.c: an AllReduce among N ranks that are threads of one process.
 *
 * flexcoll_comm_init_all(comms, N, NULL) creates all N ranks in this process, without any
 * launcher: rank i uses GPU i, or, on a host without a GPU, all ranks are host-only.  Each rank
 * is then driven by a thread of its own (a collective waits for its peers, so one thread could
 * drive them all only inside flexcoll_group_start()/flexcoll_group_end()).  Every thread sums a
 * vector in host memory over all ranks, checks the result and frees its communicator.
 *
 * Build:
 *   cc $(pkg-config --cflags flexcoll) allreduce_threads.c $(pkg-config --libs flexcoll) -pthread \
 *      -o allreduce_threads
 *
 * Run with N ranks (default 2; on a host with GPUs, at most one per GPU):
 *   ./allreduce_threads 4
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <flexcoll.h>

#define MAX_RANKS 64
#define COUNT ((size_t)1 << 20)

typedef struct {
  flexcoll_comm_t comm;
  int rank, nranks;
  flexcoll_result_t result; /* of the allreduce */
  size_t wrong;             /* elements that differ from the expected sum */
} rank_state_t;

/* The thread that drives a communicator frees it.  After a failure the communicator is unusable:
 * abort stops its work without waiting for the peers, then destroy frees it. */
static void free_comm(rank_state_t *st) {
  if (st->result != FLEXCOLL_SUCCESS) flexcoll_comm_abort(st->comm);
  flexcoll_result_t r = flexcoll_comm_destroy(st->comm);
  if (r != FLEXCOLL_SUCCESS)
    fprintf(stderr, "rank %d: flexcoll_comm_destroy: %s (%s)\n", st->rank, flexcoll_get_error_string(r),
            flexcoll_get_last_error(NULL));
}

static void *run_rank(void *arg) {
  rank_state_t *st = arg;
  int *sendbuf = malloc(COUNT * sizeof *sendbuf);
  int *recvbuf = malloc(COUNT * sizeof *recvbuf);
  if (!sendbuf || !recvbuf) {
    st->result = FLEXCOLL_SYSTEM_ERROR;
    st->wrong = COUNT;
    free(sendbuf);
    free(recvbuf);
    free_comm(st);
    return NULL;
  }
  for (size_t i = 0; i < COUNT; i++) sendbuf[i] = st->rank + (int)(i % 1000);

  /* Host memory: the call returns when the collective is complete on this rank; stream NULL. */
  st->result = flexcoll_allreduce(sendbuf, recvbuf, COUNT, FLEXCOLL_INT32, FLEXCOLL_SUM, st->comm, NULL);
  if (st->result != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "rank %d: flexcoll_allreduce: %s (%s)\n", st->rank, flexcoll_get_error_string(st->result),
            flexcoll_get_last_error(st->comm));
  } else {
    /* sum over r of (r + i % 1000) = nranks * (nranks - 1) / 2 + nranks * (i % 1000) */
    const int base = st->nranks * (st->nranks - 1) / 2;
    for (size_t i = 0; i < COUNT; i++)
      if (recvbuf[i] != base + st->nranks * (int)(i % 1000)) st->wrong++;
  }
  free(sendbuf);
  free(recvbuf);
  free_comm(st);
  return NULL;
}

int main(int argc, char **argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 2;
  if (nranks < 1 || nranks > MAX_RANKS) {
    fprintf(stderr, "usage: %s [nranks (1 to %d)]\n", argv[0], MAX_RANKS);
    return 2;
  }

  flexcoll_comm_t comms[MAX_RANKS];
  rank_state_t states[MAX_RANKS];
  pthread_t threads[MAX_RANKS];

  flexcoll_result_t r = flexcoll_comm_init_all(comms, nranks, NULL);
  if (r != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "flexcoll_comm_init_all: %s (%s)\n", flexcoll_get_error_string(r),
            flexcoll_get_last_error(NULL));
    return 1;
  }

  int started = 0;
  for (int i = 0; i < nranks; i++) {
    states[i] = (rank_state_t){.comm = comms[i], .rank = i, .nranks = nranks, .result = FLEXCOLL_SUCCESS};
    if (pthread_create(&threads[i], NULL, run_rank, &states[i]) != 0) {
      fprintf(stderr, "pthread_create failed for rank %d\n", i);
      break;
    }
    started++;
  }
  for (int i = started; i < nranks; i++) { /* ranks that never got a thread: their peers then fail */
    states[i].result = FLEXCOLL_INTERNAL_ERROR;
    free_comm(&states[i]);
  }
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);

  int ok = started == nranks;
  for (int i = 0; i < started; i++) {
    if (states[i].result != FLEXCOLL_SUCCESS || states[i].wrong) ok = 0;
    if (states[i].result == FLEXCOLL_SUCCESS)
      printf("rank %d of %d: allreduce of %zu ints: %s (%zu wrong)\n", i, nranks, COUNT,
             states[i].wrong ? "WRONG" : "OK", states[i].wrong);
  }

  printf("%s\n", ok ? "all ranks OK" : "FAILED");
  return ok ? 0 : 1;
}
