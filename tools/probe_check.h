/* probe_check.h — the development probes' CUDA check (tools/*.cu, built by hand with nvcc, not by
 * make): a failed runtime call prints where and why, and ends the probe. */
#ifndef FC_TOOLS_PROBE_CHECK_H
#define FC_TOOLS_PROBE_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));               \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#endif
