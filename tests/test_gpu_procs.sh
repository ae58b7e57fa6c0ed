#!/bin/sh
# test_gpu_procs.sh — device collectives with ranks as separate processes (tests/test_onegpu runs
# them as threads): every collective of flexcoll-perf (allreduce, allgather, reduce_scatter,
# broadcast, reduce, alltoall), three datatype/op pairs, 2, 3 and 4 ranks (2 and 3 without
# peer access), 8 B to 16 MiB by
# factors of 8 (the LL, one-shot, ring and alltoall kernels), out of place and in place, every
# result checked by flexcoll-perf (-c 1), once with the default links and once without peer
# access (FLEXCOLL_LINKS=pcie,shm,tcp: the ring kernels through host memory, the rest through
# host copies); then 3 and 4 ranks as if on two hosts (FLEXCOLL_HOSTID host-(rank mod 2): no peer
# access, shared memory or CUDA IPC between the "hosts", tcp between them, the schedules host by
# host), through host copies (tcp between processes takes host memory only, for UCX's peer-failure
# handling: the log says which link takes device buffers); then 4 ranks as two hosts with
# FLEXCOLL_UCX_PEER_FAILURE=0, which with a CUDA-enabled UCX runs every collective on the device
# buffers through the UCX links (shm's cuda_ipc within a host, tcp's cuda_copy between), float32
# sum only; then 2, 3 and 4 ranks as two hosts with the ring kernels' lane over rdma on the fake
# verbs provider (FLEXCOLL_RING_LANE=rdma: descriptors and acknowledgements over the link, in
# band, as between real hosts), where the build has the fake (FC_TEST_RDMA_REAL=1: on libibverbs
# instead, for a machine with a NIC), and the same with nvlink among the links: the ring by hops
# (NVLink between the processes of a "host", the rdma lane only between them: FLEXCOLL_RING_HOPS;
# a logged run checks each rank's two edges); then 2, 3 and 4 ranks of one host with three lanes
# (FLEXCOLL_RING_LANE=pcie,rdma at fixed shares 0.4/0.3/0.3 beside NVLink, every size through the
# ring kernels: the two side lanes' host areas mapped between processes; FC_GPU_PROCS_ONLY_LANE=1:
# the lane runs alone).  The ranks share the GPUs present
# (device = local rank modulo the GPUs), so the test runs on a one-GPU node; through CUDA IPC and shared host
# memory between processes, which threads of one process never use.  Exit 77 (automake's skip)
# where there is no GPU.
set -u
perf=${PERF:-./tools/flexcoll-perf}
[ -x "$perf" ] || { echo "test_gpu_procs: no $perf"; exit 99; }
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "test_gpu_procs: no GPU here: skipped"; exit 77; }
# One GPU test at a time (tests/gpu_serial.h): the same lock file, held until this script exits.
lock="${TMPDIR:-/tmp}/flexcoll-gpu-tests.$(id -u).lock"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$lock" && flock 9
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_gpu_procs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export NCCL_NVLS_ENABLE=0 FLEXCOLL_TIMEOUT_MS=20000
port=$((23000 + $$ % 8000)) pass=0 fail=0

# One run: n processes in launcher mode; passes when every rank exits 0 (flexcoll-perf exits 1
# on a wrong element or a failed call).
run() {
  n=$1 links=$2
  shift 2
  port=$((port + 1))
  pids="" r=0
  while [ $r -lt "$n" ]; do
    hostid=""
    [ "$hosts" -gt 0 ] && hostid=host-$((r % hosts))
    env $extra FLEXCOLL_HOSTID=$hostid FLEXCOLL_LINKS=$links FLEXCOLL_ROOT=127.0.0.1:$port FLEXCOLL_NRANKS=$n FLEXCOLL_RANK=$r \
      FLEXCOLL_LOCAL_RANK=$r timeout 120 "$perf" "$@" -n 2 -w 1 -c 1 >"$tmp/out.$r" 2>&1 &
    pids="$pids $!"
    r=$((r + 1))
  done
  bad=0 codes="" r=0
  for p in $pids; do
    wait "$p"
    c=$?
    codes="$codes $c"
    [ $c = 0 ] || bad=1
  done
  if [ $bad = 0 ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $n ranks, FLEXCOLL_LINKS=${links:-(all)}${hostid:+, $hosts hosts}${extra:+, $extra}, $*: exit codes$codes (124: timeout)"
    r=0
    while [ $r -lt "$n" ]; do
      # Every size's row (a wrong count may sit in any) and any error, not only the end.
      grep -v '^#' "$tmp/out.$r" | tail -n 12 | sed "s/^/  rank $r: /"
      r=$((r + 1))
    done
  fi
}

fake=$PWD/tests/.libs/libfakeverbs.so
lane="FLEXCOLL_RING_LANE=rdma FLEXCOLL_VERBS_PROVIDER=fake FLEXCOLL_VERBS_FAKE_LIB=$fake"
lane_setup="rdma,shm,tcp:2:$lane"
if [ "${FC_TEST_RDMA_REAL:-0}" = 1 ]; then
  # The real provider (libibverbs), on a machine with a NIC: tests/test_rdma_real.sh.
  lane="FLEXCOLL_RING_LANE=rdma FLEXCOLL_VERBS_PROVIDER="
  lane_setup="rdma,shm,tcp:2:$lane"
elif [ ! -f "$fake" ]; then
  lane_setup=""
  echo "test_gpu_procs: no $fake: the ring lane over rdma between hosts not run"
fi
# With nvlink too: the ring by hops (NVLink between the processes of a "host", rdma between them).
hops_setup=${lane_setup:+"nvlink,$lane_setup"}
three="FLEXCOLL_RING_LANE=pcie,rdma FLEXCOLL_LINK_SHARES=nvlink:0.4,pcie:0.3,rdma:0.3 FLEXCOLL_ONESHOT_MAX_BYTES=0"
three="$three FLEXCOLL_VERBS_PROVIDER=fake FLEXCOLL_VERBS_FAKE_LIB=$fake"
three_setup="nvlink,pcie,rdma,shm,tcp:0:$three"
[ -f "$fake" ] || { three_setup=""; echo "test_gpu_procs: no $fake: three lanes not run"; }
# FC_GPU_PROCS_ONLY_LANE=1: the ring lane's runs alone (the node's time is short).
setups=":0 pcie,shm,tcp:0 :2 :2:FLEXCOLL_UCX_PEER_FAILURE=0"
[ "${FC_GPU_PROCS_ONLY_LANE:-0}" = 1 ] && setups=""
# FC_GPU_PROCS_ONLY_LANE=hops: the ring by hops alone.
[ "${FC_GPU_PROCS_ONLY_LANE:-0}" = hops ] && setups="" lane_setup="" three_setup=""
# FC_GPU_PROCS_ONLY="NAME ...": those setups alone, so that a run too long for one sitting can be
# cut into parts: default, nopeer, hosts, hosts-ucx, lane, hops, three.
if [ -n "${FC_GPU_PROCS_ONLY:-}" ]; then
  only() { case " $FC_GPU_PROCS_ONLY " in *" $1 "*) return 0 ;; esac; return 1; }
  setups=""
  only default && setups="$setups :0"
  only nopeer && setups="$setups pcie,shm,tcp:0"
  only hosts && setups="$setups :2"
  only hosts-ucx && setups="$setups :2:FLEXCOLL_UCX_PEER_FAILURE=0"
  only lane || lane_setup=""
  only hops || hops_setup=""
  only three || three_setup=""
fi
# setup: LINKS:HOSTS[:VAR=VALUE ...]
for setup in $setups ${lane_setup:+"$lane_setup"} ${hops_setup:+"$hops_setup"} ${three_setup:+"$three_setup"}; do
  links=${setup%%:*} rest=${setup#*:}
  hosts=${rest%%:*} extra=""
  [ "$rest" != "$hosts" ] && extra=${rest#*:}
  ns="2 3 4"
  [ -n "$links" ] && ns="2 3"
  [ "$hosts" -gt 0 ] && ns="3 4"
  [ -n "$extra" ] && ns="4"
  [ "$extra" = "$lane" ] || [ "$extra" = "$three" ] && ns="2 3 4"
  setup_start=$(date +%s) setup_pass=$pass setup_fail=$fail
  for n in $ns; do
    for coll in allreduce allgather reduce_scatter broadcast reduce alltoall; do
      for dt_op in "float32 sum" "bfloat16 max" "int32 sum"; do
        [ -n "$extra" ] && [ "$extra" != "$lane" ] && [ "$extra" != "$three" ] && [ "$dt_op" != "float32 sum" ] && continue
        # shellcheck disable=SC2086
        set -- $dt_op
        case $coll in allgather|broadcast|alltoall) [ "$1" = float32 ] || continue ;; esac
        run "$n" "$links" --coll "$coll" -d "$1" -o "$2" -r $((n - 1)) -b 8 -e 16M -f 8
      done
    done
  done
  # Progress, so that a run cut short by a time limit still says how far it got and how fast.
  echo "test_gpu_procs: links ${links:-(all)}, ${hosts} hosts${extra:+, $extra}: $((pass - setup_pass)) runs passed," \
    "$((fail - setup_fail)) failed in $(($(date +%s) - setup_start)) s"
done
# Which links took the device buffers between the "hosts" (INFO, subsystem NET): by default tcp
# takes host memory only (peer-failure handling); with FLEXCOLL_UCX_PEER_FAILURE=0 it must take
# device buffers wherever UCX has its CUDA transports (the log then has such lines at all).
for extra in ${setups:+"" FLEXCOLL_UCX_PEER_FAILURE=0}; do
  port=$((port + 1)) pids=""
  for r in 0 1; do
    env $extra FLEXCOLL_DEBUG=INFO FLEXCOLL_DEBUG_SUBSYS=NET FLEXCOLL_HOSTID=host-$r FLEXCOLL_ROOT=127.0.0.1:$port \
      FLEXCOLL_NRANKS=2 FLEXCOLL_RANK=$r FLEXCOLL_LOCAL_RANK=$r timeout 120 "$perf" -b 1M -e 1M -n 1 -w 0 -c 1 \
      >"$tmp/log.$r" 2>&1 &
    pids="$pids $!"
  done
  for p in $pids; do wait "$p" || { fail=$((fail + 1)); echo "FAIL: the logged run over two hosts ${extra:-(defaults)}"; }; done
  grep -h "link .* takes" "$tmp/log.0" | sed "s/^/test_gpu_procs: ${extra:-defaults}: /"
  if [ -n "$extra" ] && grep -q "link .* takes" "$tmp/log.0" && ! grep -q "link tcp takes device buffers" "$tmp/log.0"; then
    fail=$((fail + 1))
    echo "FAIL: with $extra the tcp link between processes did not take device buffers"
  fi
done
# One 4 MiB allreduce of n ranks logged at INFO (subsystem SCHED) into $tmp/TAG.<rank>: logged TAG N
# HOSTS LINKS "WHAT" [VAR=VALUE ...] (HOSTS > 0: rank r on host-(r mod HOSTS)); a rank that fails
# counts as a failure of WHAT.
logged() {
  tag=$1 n=$2 h=$3 links=$4 what=$5
  shift 5
  port=$((port + 1)) pids="" r=0
  while [ $r -lt "$n" ]; do
    hostid=""
    [ "$h" -gt 0 ] && hostid=host-$((r % h))
    env "$@" FLEXCOLL_LINKS=$links FLEXCOLL_DEBUG=INFO FLEXCOLL_DEBUG_SUBSYS=SCHED FLEXCOLL_HOSTID=$hostid \
      FLEXCOLL_ROOT=127.0.0.1:$port FLEXCOLL_NRANKS=$n FLEXCOLL_RANK=$r FLEXCOLL_LOCAL_RANK=$r timeout 120 "$perf" \
      -b 4M -e 4M -n 1 -w 0 -c 1 >"$tmp/$tag.$r" 2>&1 &
    pids="$pids $!"
    r=$((r + 1))
  done
  for p in $pids; do wait "$p" || { fail=$((fail + 1)); echo "FAIL: the logged run of $what"; }; done
}
# The ring lane between the "hosts": on, in band, on every rank (INFO, subsystem SCHED).
if [ -n "$lane_setup" ]; then
  # shellcheck disable=SC2086
  logged lane 2 2 rdma,shm,tcp "the ring lane over rdma between hosts" $lane
  for r in 0 1; do
    if grep -q "ring lane rdma on: .*(in band)" "$tmp/lane.$r"; then
      grep -h "ring lane rdma on" "$tmp/lane.$r" | sed "s/^/test_gpu_procs: /"
    else
      fail=$((fail + 1))
      echo "FAIL: rank $r: the ring lane over rdma between hosts is not on:"
      grep -h "ring lane\|WARN" "$tmp/lane.$r" | sed "s/^/  rank $r: /"
    fi
  done
fi
# The ring by hops: 4 processes as two hosts, numbered round them (the ring visits 0 2 1 3): every
# rank runs by hops, NVLink on the edge within its host, rdma on the one to the other host.
if [ -n "$hops_setup" ]; then
  # shellcheck disable=SC2086
  logged hops 4 2 nvlink,rdma,shm,tcp "the ring by hops" $lane
  for r in 0 1 2 3; do
    case $r in 0) want="from rank 3 over rdma, to rank 2 over nvlink" ;; 1) want="from rank 2 over rdma, to rank 3 over nvlink" ;;
      2) want="from rank 0 over nvlink, to rank 1 over rdma" ;; *) want="from rank 1 over nvlink, to rank 0 over rdma" ;; esac
    if grep -q "ring kernels by hops, host by host: $want" "$tmp/hops.$r"; then
      grep -h "ring kernels by hops" "$tmp/hops.$r" | sed "s/^/test_gpu_procs: /"
    else
      fail=$((fail + 1))
      echo "FAIL: rank $r: not by hops ($want):"
      grep -h "ring lane\|ring kernels\|WARN" "$tmp/hops.$r" | sed "s/^/  rank $r: /"
    fi
  done
fi
# Three lanes between processes of one host: both side lanes on, on every rank (INFO, SCHED).
if [ -n "$three_setup" ]; then
  # shellcheck disable=SC2086
  logged three 2 0 nvlink,pcie,rdma,shm,tcp "three lanes" $three
  for r in 0 1; do
    if grep -q "ring lane pcie on: .*fixed share" "$tmp/three.$r" && grep -q "ring lane rdma on: .*fixed share" "$tmp/three.$r"; then
      grep -h "ring lane .* on" "$tmp/three.$r" | sed "s/^/test_gpu_procs: /"
    else
      fail=$((fail + 1))
      echo "FAIL: rank $r: not both side lanes are on:"
      grep -h "ring lane\|WARN" "$tmp/three.$r" | sed "s/^/  rank $r: /"
    fi
  done
fi
echo "test_gpu_procs: $pass runs passed, $fail failed"
[ $fail = 0 ]
