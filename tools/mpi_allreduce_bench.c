/* mpi_allreduce_bench.c — MPI_Allreduce timing for tools/bench-host-vs-mpi.sh (float32 sum).
 *
 * Not built by make: the script compiles it with $MPICC.  Sizes from MINBYTES to MAXBYTES,
 * multiplied by FACTOR, each rounded down to a multiple of 4 bytes x ranks as flexcoll-perf does
 * (so that the two tables line up); per size WARMUP untimed calls, then ITERS timed calls between two
 * barriers.  Prints one row per size: bytes, elements, the time per call in microseconds (the
 * slowest rank's average, as nccl-tests and flexcoll-perf report), and whether the result was
 * right (checked on the first call of each size).
 *
 * usage: mpi_allreduce_bench MINBYTES MAXBYTES FACTOR ITERS WARMUP   (sizes accept K, M, G)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return (size_t)v;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc != 6) {
    if (rank == 0) fprintf(stderr, "usage: %s MINBYTES MAXBYTES FACTOR ITERS WARMUP\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  size_t minb = parse_size(argv[1]), maxb = parse_size(argv[2]);
  double factor = atof(argv[3]);
  int iters = atoi(argv[4]), warmup = atoi(argv[5]);
  if (factor <= 1 || iters < 1 || warmup < 0) {
    if (rank == 0) fprintf(stderr, "FACTOR must be > 1, ITERS >= 1, WARMUP >= 0\n");
    MPI_Finalize();
    return 2;
  }
  size_t maxn = maxb / sizeof(float);
  float *in = malloc(maxn * sizeof *in), *out = malloc(maxn * sizeof *out);
  if (!in || !out) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < maxn; i++) in[i] = (float)(rank + 1) * (float)(i % 64);
  const float sum = (float)nranks * (float)(nranks + 1) / 2;
  if (rank == 0) {
    printf("# MPI_Allreduce float32 sum, %d processes, %d timed calls after %d warm-up calls per size\n", nranks,
           iters, warmup);
    printf("# %12s %12s %12s %7s\n", "bytes", "count", "time_us", "wrong");
  }
  /* The sizes flexcoll-perf runs: each step rounded down to a multiple of (element x ranks). */
  const size_t unit = sizeof(float) * (size_t)nranks;
  for (size_t step = minb; step <= maxb;) {
    size_t bytes = step / unit * unit;
    if (!bytes) bytes = unit;
    size_t next = (size_t)((double)step * factor);
    step = next > step ? next : step + 1;
    size_t n = bytes / sizeof(float);
    memset(out, 0, n * sizeof *out);
    MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += out[i] != sum * (float)(i % 64);
    for (int k = 1; k < warmup; k++) MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++) MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / iters * 1e6, tmax = 0;
    long wrong_all = 0;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("  %12zu %12zu %12.2f %7ld\n", bytes, n, tmax, wrong_all);
    fflush(stdout);
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
