/*
 * allreduce_env.c: an AllReduce among the processes of a job, on host memory.
 *
 * Every process creates its rank of the communicator from the launcher's environment with
 * flexcoll_comm_init_from_env(), sums a vector over all ranks, checks the result and prints it.
 * Host memory needs no GPU, and host-memory calls are complete when they return (stream NULL).
 *
 * Build:
 *   cc $(pkg-config --cflags flexcoll) allreduce_env.c $(pkg-config --libs flexcoll) -o allreduce_env
 *
 * Run two ranks by hand on one host:
 *   FLEXCOLL_RANK=0 FLEXCOLL_NRANKS=2 FLEXCOLL_ROOT=127.0.0.1:29500 ./allreduce_env &
 *   FLEXCOLL_RANK=1 FLEXCOLL_NRANKS=2 FLEXCOLL_ROOT=127.0.0.1:29500 ./allreduce_env
 *   wait
 * or under a launcher (FLEXCOLL_ROOT names rank 0's host and a free port there):
 *   FLEXCOLL_ROOT=127.0.0.1:29500 mpirun -n 2 -x FLEXCOLL_ROOT ./allreduce_env
 *   FLEXCOLL_ROOT=127.0.0.1:29500 srun -n 2 ./allreduce_env
 *   torchrun --nproc-per-node=2 --no-python ./allreduce_env
 * (torchrun provides MASTER_ADDR:MASTER_PORT; if its own store already holds that port, set
 * FLEXCOLL_ROOT to another one.)
 */
#include <stdio.h>
#include <stdlib.h>

#include <flexcoll.h>

#define COUNT ((size_t)1 << 20) /* 1 Mi floats, 4 MiB: several pipeline chunks */

static int failed(const char *what, flexcoll_result_t r, flexcoll_comm_t comm) {
  fprintf(stderr, "allreduce_env: %s: %s (%s)\n", what, flexcoll_get_error_string(r),
          flexcoll_get_last_error(comm));
  return 1;
}

int main(void) {
  flexcoll_comm_t comm = NULL;
  flexcoll_result_t r;
  int rank, nranks;

  r = flexcoll_comm_init_from_env(&comm, NULL);
  if (r != FLEXCOLL_SUCCESS) return failed("flexcoll_comm_init_from_env", r, NULL);
  if ((r = flexcoll_comm_user_rank(comm, &rank)) != FLEXCOLL_SUCCESS ||
      (r = flexcoll_comm_count(comm, &nranks)) != FLEXCOLL_SUCCESS) {
    failed("querying the communicator", r, comm);
    flexcoll_comm_destroy(comm);
    return 1;
  }

  float *sendbuf = malloc(COUNT * sizeof *sendbuf);
  float *recvbuf = malloc(COUNT * sizeof *recvbuf);
  if (!sendbuf || !recvbuf) {
    fprintf(stderr, "allreduce_env: out of memory\n");
    flexcoll_comm_destroy(comm);
    return 1;
  }
  /* Small integers, so that float sums are exact whatever the order of the additions. */
  for (size_t i = 0; i < COUNT; i++) sendbuf[i] = (float)((rank + 1) * (int)(i % 16 + 1));

  r = flexcoll_allreduce(sendbuf, recvbuf, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL);
  if (r != FLEXCOLL_SUCCESS) {
    failed("flexcoll_allreduce", r, comm);
    /* A failed collective leaves the communicator unusable: abort stops its work without
     * waiting for the peers, destroy frees it. */
    flexcoll_comm_abort(comm);
    flexcoll_comm_destroy(comm);
    free(sendbuf);
    free(recvbuf);
    return 1;
  }

  /* sum over r of (r + 1) * k = k * nranks * (nranks + 1) / 2 */
  const double ranks_sum = (double)nranks * (nranks + 1) / 2;
  size_t wrong = 0;
  for (size_t i = 0; i < COUNT; i++)
    if ((double)recvbuf[i] != ranks_sum * (double)(i % 16 + 1)) wrong++;

  printf("rank %d of %d: allreduce of %zu floats: recvbuf[0] = %g, recvbuf[15] = %g (expected %g, %g): %s\n",
         rank, nranks, COUNT, recvbuf[0], recvbuf[15], ranks_sum, ranks_sum * 16,
         wrong ? "WRONG" : "OK");
  if (wrong) fprintf(stderr, "rank %d: %zu wrong elements\n", rank, wrong);

  free(sendbuf);
  free(recvbuf);
  r = flexcoll_comm_destroy(comm);
  if (r != FLEXCOLL_SUCCESS) return failed("flexcoll_comm_destroy", r, NULL);
  return wrong ? 1 : 0;
}
