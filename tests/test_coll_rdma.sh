#!/bin/sh
# The foundation's host test matrix (tests/test_coll: every collective x datatype x op x counts 0,
# 1, 7, 1001, 8003, in place and out of place, ring, tree, exchange and the default, checked
# against a reference) with the rdma link alone, over the fake verbs provider, for 2, 3, 4 and 8
# ranks as processes: what test_rdma's own matrix samples, run whole.  The communicator's
# shared-memory segment is off (FLEXCOLL_SHM_DIRECT=0), so every byte between ranks crosses the
# link; the 1000003-element calls are left out (FC_TEST_NO_BIG=1: they only add time here).
# Skips (77) where the fake is not built (configured without infiniband/verbs.h).
fake=$(pwd)/tests/.libs/libfakeverbs.so
[ -f "$fake" ] || { echo "test_coll_rdma: $fake is not built: skipped"; exit 77; }
rc=0
for case in procs2 procs3 procs4 procs8; do
  CK_RUN_CASE=$case FC_TEST_NO_BIG=1 FLEXCOLL_SHM_DIRECT=0 FLEXCOLL_LINKS=rdma FLEXCOLL_VERBS_PROVIDER=fake \
    FLEXCOLL_VERBS_FAKE_LIB="$fake" ./tests/test_coll || { echo "FAIL: test_coll $case over rdma (fake)"; rc=1; }
done
exit $rc
