/* test_capture.c — device collectives on a stream that is being captured into a CUDA graph.
 *
 * Until every device path keeps its synchronisation state on the device (docs/ARCHITECTURE.md,
 * the graph rule), a captured call would replay with stale counters and give wrong results
 * without an error.  The library must refuse it with FLEXCOLL_INVALID_USAGE and a message that
 * says why, before enqueuing anything: the captured graph stays empty, the capture itself stays
 * valid, and the communicator keeps working for calls outside the capture.
 *
 * Ranks are threads of this process, all on device 0 (several ranks may share a GPU), so the
 * test runs on a one-GPU node.  Exit 77 (automake's skip) where there is no GPU. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flexcoll.h"

#define NRANKS 2
#define COUNT 1000

typedef struct {
  int rank;
  flexcoll_unique_id_t id;
  int failures;
} rank_t;

#define EXPECT(r, cond, ...)                                   \
  do {                                                         \
    if (!(cond)) {                                             \
      fprintf(stderr, "[test_capture] rank %d: ", (r)->rank);  \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);       \
      (r)->failures++;                                         \
    }                                                          \
  } while (0)

/* One AllReduce outside any capture, checked: the communicator still works. */
static void allreduce_checked(rank_t *r, flexcoll_comm_t comm, float *dev, cudaStream_t s, int round) {
  float host[COUNT];
  for (int i = 0; i < COUNT; i++) host[i] = (float)(r->rank + 1) * (float)(i % 7 + round);
  cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice);
  flexcoll_result_t res = flexcoll_allreduce(dev, dev, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "allreduce outside capture: %s", flexcoll_get_last_error(comm));
  cudaStreamSynchronize(s);
  cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost);
  float ranksum = NRANKS * (NRANKS + 1) / 2.0f;
  int bad = 0;
  for (int i = 0; i < COUNT; i++) bad += host[i] != ranksum * (float)(i % 7 + round);
  EXPECT(r, bad == 0, "allreduce outside capture (round %d): %d wrong elements", round, bad);
}

/* Capture on s in `mode`, try every kind of call, end the capture: all refused, graph empty. */
static void captured_calls(rank_t *r, flexcoll_comm_t comm, float *dev, cudaStream_t s, enum cudaStreamCaptureMode mode) {
  cudaError_t ce = cudaStreamBeginCapture(s, mode);
  EXPECT(r, ce == cudaSuccess, "cudaStreamBeginCapture: %s", cudaGetErrorString(ce));
  if (ce != cudaSuccess) return;
  struct {
    const char *name;
    flexcoll_result_t res;
  } calls[6];
  int n = 0;
  calls[n].name = "allreduce";
  calls[n++].res = flexcoll_allreduce(dev, dev, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
  calls[n].name = "allgather";
  calls[n++].res = flexcoll_allgather(dev, dev + COUNT, COUNT / NRANKS / 2, FLEXCOLL_FLOAT32, comm, s);
  calls[n].name = "broadcast";
  calls[n++].res = flexcoll_broadcast(dev, dev, COUNT, FLEXCOLL_FLOAT32, 0, comm, s);
  calls[n].name = "reduce_scatter";
  calls[n++].res = flexcoll_reduce_scatter(dev, dev + COUNT, COUNT / NRANKS, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
  calls[n].name = "send";
  calls[n++].res = flexcoll_send(dev, COUNT, FLEXCOLL_FLOAT32, (r->rank + 1) % NRANKS, comm, s);
  /* In a group the refusal comes at the call, so the group never holds half a collective. */
  flexcoll_group_start();
  calls[n].name = "allreduce in a group";
  calls[n++].res = flexcoll_allreduce(dev, dev, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, s);
  flexcoll_result_t end = flexcoll_group_end();
  EXPECT(r, end == FLEXCOLL_SUCCESS, "group_end after a refused call: %d", (int)end);
  for (int i = 0; i < n; i++) {
    EXPECT(r, calls[i].res == FLEXCOLL_INVALID_USAGE, "captured %s returned %d (%s), not FLEXCOLL_INVALID_USAGE",
           calls[i].name, (int)calls[i].res, flexcoll_get_error_string(calls[i].res));
  }
  const char *why = flexcoll_get_last_error(comm);
  EXPECT(r, why && strstr(why, "CUDA graph"), "last error does not name the CUDA graph capture: \"%s\"", why ? why : "");
  cudaGraph_t graph = NULL;
  ce = cudaStreamEndCapture(s, &graph);
  EXPECT(r, ce == cudaSuccess, "cudaStreamEndCapture (the capture must stay valid): %s", cudaGetErrorString(ce));
  if (graph) {
    size_t nodes = 99;
    cudaGraphGetNodes(graph, NULL, &nodes);
    EXPECT(r, nodes == 0, "the refused calls left %zu nodes in the captured graph", nodes);
    cudaGraphDestroy(graph);
  }
}

static void *rank_main(void *arg) {
  rank_t *r = arg;
  cudaSetDevice(0);
  flexcoll_config_t config = FLEXCOLL_CONFIG_INITIALIZER;
  config.cuda_device = 0;
  flexcoll_comm_t comm = NULL;
  flexcoll_result_t res = flexcoll_comm_init_rank(&comm, NRANKS, r->id, r->rank, &config);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "comm_init_rank: %s", flexcoll_get_last_error(NULL));
  if (res != FLEXCOLL_SUCCESS) return NULL;
  float *dev = NULL;
  cudaStream_t s;
  cudaMalloc((void **)&dev, 2 * COUNT * sizeof(float));
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  allreduce_checked(r, comm, dev, s, 1);
  captured_calls(r, comm, dev, s, cudaStreamCaptureModeThreadLocal);
  allreduce_checked(r, comm, dev, s, 2);
  captured_calls(r, comm, dev, s, cudaStreamCaptureModeRelaxed);
  allreduce_checked(r, comm, dev, s, 3);
  /* A NULL (legacy default) stream is never captured and stays accepted. */
  res = flexcoll_allreduce(dev, dev, COUNT, FLEXCOLL_FLOAT32, FLEXCOLL_SUM, comm, NULL);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "allreduce on the NULL stream: %s", flexcoll_get_last_error(comm));
  cudaDeviceSynchronize();
  cudaStreamDestroy(s);
  cudaFree(dev);
  res = flexcoll_comm_destroy(comm);
  EXPECT(r, res == FLEXCOLL_SUCCESS, "comm_destroy: %d", (int)res);
  return NULL;
}

int main(void) {
  int ngpus = 0;
  cudaError_t ce = cudaGetDeviceCount(&ngpus);
  if (ce != cudaSuccess || ngpus == 0) {
    fprintf(stderr, "[test_capture] no GPU (%s): skipped\n",
            ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device");
    return 77;
  }
  flexcoll_unique_id_t id;
  if (flexcoll_get_unique_id(&id) != FLEXCOLL_SUCCESS) {
    fprintf(stderr, "[test_capture] get_unique_id: %s\n", flexcoll_get_last_error(NULL));
    return 1;
  }
  rank_t ranks[NRANKS];
  pthread_t threads[NRANKS];
  for (int i = 0; i < NRANKS; i++) {
    ranks[i] = (rank_t){.rank = i, .id = id};
    pthread_create(&threads[i], NULL, rank_main, &ranks[i]);
  }
  int failures = 0;
  for (int i = 0; i < NRANKS; i++) {
    pthread_join(threads[i], NULL);
    failures += ranks[i].failures;
  }
  fprintf(stderr, "[test_capture] %s (%d ranks on device 0)\n", failures ? "FAILED" : "passed", NRANKS);
  return failures ? 1 : 0;
}
