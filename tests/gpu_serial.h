/* gpu_serial.h — the GPU tests of one `make check -j` take the GPU one at a time.
 *
 * Their ranks' kernels spin while they wait for their peers, with grids sized so that one
 * test's ranks are resident together on the GPU; two tests at once on the same GPU can keep
 * each other's blocks from starting and turn into timeouts that say nothing about the code.
 * So each GPU test, once it knows there is a GPU, takes an exclusive lock on a file (per user,
 * in $TMPDIR or /tmp) and keeps it until it exits.  Best effort: without the file the test runs
 * anyway. */
#ifndef FC_TESTS_GPU_SERIAL_H
#define FC_TESTS_GPU_SERIAL_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

static inline void fc_test_gpu_serialize(const char *tag) {
  const char *dir = getenv("TMPDIR");
  char path[512];
  snprintf(path, sizeof path, "%s/flexcoll-gpu-tests.%u.lock", dir && *dir ? dir : "/tmp", (unsigned)getuid());
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (flock(fd, LOCK_EX) != 0) {
    close(fd);
    return;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  if (waited > 1.0) fprintf(stderr, "%s waited %.1f s for another GPU test to finish\n", tag, waited);
  /* fd stays open: the lock goes with the process. */
}

#endif
