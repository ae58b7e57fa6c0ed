#!/bin/sh
# The rdma link's collective and bitwise cases (tests/test_rdma.c) with the real provider,
# libibverbs, instead of the fake: for machines with an RDMA NIC.  Exits 77 (skip) where
# libibverbs has no device.
FC_TEST_RDMA_REAL=1 exec ./tests/test_rdma
