#!/bin/sh
# The rdma link's collective and bitwise cases (tests/test_rdma.c) with the real provider,
# libibverbs, instead of the fake: for machines with an RDMA NIC; and, in builds with CUDA, device
# buffers over it (tests/test_rdma_gpu.c: GPUDirect RDMA where the NIC takes them, then the ring
# kernels' lane over it: tests/test_gpu_procs.sh).  Exits 77
# (skip) where libibverbs has no device (and, for the second, where there is no GPU).
FC_TEST_RDMA_REAL=1 ./tests/test_rdma
host=$?
[ -x ./tests/test_rdma_gpu ] || exit $host
FC_TEST_RDMA_REAL=1 ./tests/test_rdma_gpu
dev=$?
# Where device buffers went over the NIC: the ring kernels' lane over it between two "hosts"
# (processes under FLEXCOLL_HOSTID), every ring collective checked.
if [ "$dev" = 0 ] && [ -f ./tests/test_gpu_procs.sh ]; then
  FC_TEST_RDMA_REAL=1 FC_GPU_PROCS_ONLY_LANE=1 sh ./tests/test_gpu_procs.sh
  dev=$?
fi
for rc in $host $dev; do
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || exit "$rc"
done
[ "$host" = 77 ] && [ "$dev" = 77 ] && exit 77
exit 0
