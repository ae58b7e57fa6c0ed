#!/bin/sh
# test_hosts.sh — ranks on several "hosts" of one machine (issue 17, between nodes).
#
# Each host is a network + UTS + IPC + mount namespace: its own hostname (fch-1, fch-2, ...),
# loopback and one veth (eth0, 10.77.0.H/24) to a bridge in a "switch" namespace, and its own
# /dev/shm (a tmpfs mounted in its mount namespace) and System V IPC, so that shared memory
# cannot cross hosts, as between machines.  Nothing is added to the caller's namespaces.  Each
# host runs 2 ranks, processes started in it by nsenter in flexcoll's launcher mode
# (FLEXCOLL_RANK/NRANKS/ROOT; `test_coll --launcher MODE`).  Cases:
#   matrix3   3 hosts, ranks numbered round the hosts (rank r on host r mod 3): test_coll's full
#             matrix (every collective, datatype, op, odd counts, roots, in place and out,
#             send/recv) checked on every rank, then float32 sums that must be bitwise the same
#             on every rank, default links and algorithm choice; every rank's
#             link statistics must show no shm toward another host and bytes toward every peer of
#             another host over tcp, and the log (FLEXCOLL_DEBUG=INFO) the links between the hosts
#   matrix2   2 hosts, ranks in blocks (0,1 | 2,3), the full matrix under FLEXCOLL_ALGO=ring
#   uneven    3 hosts of 2, 2 and 1 ranks (blocks), the full matrix under FLEXCOLL_ALGO=ring: the
#             two-dimensional allreduce of unequal hosts
#   rdma      2 hosts over the fake verbs provider (FLEXCOLL_LINKS=shm,rdma,
#             FLEXCOLL_VERBS_PROVIDER=fake), each with its private /dev/shm like the others; the
#             fake's wire (its inboxes) is a folder of the test's that all hosts see
#             (FLEXCOLL_VERBS_FAKE_WIRE), as hosts share a network; rdma must carry the bytes
#             between the hosts and shm within them
#   device    2 hosts of 2 ranks (blocks), every rank's buffers on GPU 0 (GPU nodes here have
#             one): device buffers between hosts (no peer access across them: every call runs the
#             host schedule, on the device buffers where UCX has CUDA, else through host copies),
#             flexcoll-perf -m device checking each collective at 8 B-4 MiB; skipped without a GPU
#             or CUDA
#   shmonly   FLEXCOLL_LINKS=shm over 2 hosts: creation must fail on every rank, naming the ranks
#             that no link joins
#   down      2 hosts running allreduces until one fails; host 2's veth goes down: every rank
#             must return REMOTE_ERROR or TIMEOUT within FLEXCOLL_TIMEOUT_MS (8 s) + 5 s
#   slow      2 hosts of 2 ranks (round), each host's veth limited to 100 Mbit/s (tc tbf): an
#             allgather of 4 MiB and a reduce_scatter of 8 MiB, above the sizes where two
#             dimensions are taken on any machine, must run in two dimensions by the calibrated
#             models (`test_coll --launcher sent-per-call`: each rank sends exactly one block to
#             the other host; the flat ring sends 0 or 3); skipped without tc(8)
# FC_HOSTS_CASES="matrix3 down" runs some; FC_TEST_SEED fixes the data.  The namespaces need root
# and unshare(1), nsenter(1) and ip(8); where they cannot work (or FC_HOSTS_MODE=hostid) the
# hosts are names only: every rank runs in this machine's namespaces with FLEXCOLL_HOSTID=fch-H
# (flexcoll then takes ranks of other ids for other hosts: no shm, peer access or shared memory
# between them), the ranks meet on 127.0.0.1, and `down` (which needs a network to cut) is
# skipped.  FC_HOSTS_MODE=netns insists on the namespaces (exit 77 where they cannot work).
set -u

skip() { echo "SKIP: test_hosts.sh: $*"; exit 77; }
# Every failure is printed where it happens and again at the end, where a CI log's tail shows it.
FAILS=""
fail() { echo "FAIL: test_hosts.sh: $*"; FAILS="$FAILS
  $*"; }

B=$(pwd)
TC=$B/tests/test_coll
FAKE=$B/tests/.libs/libfakeverbs.so
IP=$(command -v ip 2>/dev/null || echo /usr/sbin/ip)
[ -x "$TC" ] || skip "$TC is not built (run it from the build directory under make check)"
# Why the namespaces cannot work here ("" where they can).
no_netns() {
  [ "$(id -u)" = 0 ] || { echo "needs root to create network namespaces (uid $(id -u))"; return; }
  for t in unshare nsenter; do command -v $t >/dev/null 2>&1 || { echo "$t(1) is not installed"; return; }; done
  [ -x "$IP" ] || { echo "ip(8) is not installed"; return; }
  unshare -n -u -i -m true 2>/dev/null || echo "unshare -n -u -i -m is refused here (a container without CAP_SYS_ADMIN?)"
}
MODE=${FC_HOSTS_MODE:-}
if [ "$MODE" != hostid ]; then
  why=$(no_netns)
  if [ -n "$why" ]; then
    [ "$MODE" = netns ] && skip "$why"
    echo "test_hosts.sh: no namespaces ($why): hosts by FLEXCOLL_HOSTID on this machine's network"
    MODE=hostid
  else
    MODE=netns
  fi
fi
# Ports of the rendezvous: each host has its own in namespaces; by host id they share this
# machine's, so each run takes a range of its own.
PORT0=29500
[ "$MODE" = hostid ] && PORT0=$((21000 + $$ % 20000))

W=$(mktemp -d /tmp/fc-hosts.XXXXXX)
PIDS=""
SEED=${FC_TEST_SEED:-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')}
case $SEED in 0x*) ;; *) SEED=0x$SEED ;; esac
echo "test_hosts.sh: FC_TEST_SEED=$SEED, work directory $W"

cleanup() {
  for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Start a process that holds new namespaces; HELD = its pid, once CHECK holds inside it.
HELD=""
hold() { # hold CHECK UNSHARE-ARGS...
  check=$1; shift
  unshare "$@" </dev/null >/dev/null 2>&1 &
  HELD=$!
  PIDS="$PIDS $HELD"
  i=0
  until nsenter -t "$HELD" -u -m sh -c "$check" >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 100 ] || return 1
    sleep 0.05
  done
}

# Build NH hosts behind one bridge.  PRIVATE_SHM=1: each host mounts its own /dev/shm.
SW=""
HOSTPID=""
make_hosts() { # make_hosts NH PRIVATE_SHM
  nh=$1 private=$2
  if [ "$MODE" = hostid ]; then
    HOSTPID=$(seq 1 "$nh" | tr '\n' ' ')
    return 0
  fi
  # Checked by its hostname: until unshare(2) has run, nsenter would reach this namespace.
  hold "test \$(hostname) = fch-switch" -n -u sh -c "hostname fch-switch && exec sleep 100000" ||
    skip "cannot start the switch namespace"
  SW=$HELD
  nsenter -t "$SW" -n "$IP" link add br0 type bridge 2>"$W/ip.err" || skip "no bridge device: $(cat "$W/ip.err")"
  nsenter -t "$SW" -n "$IP" link set br0 up
  HOSTPID=""
  h=1
  while [ $h -le "$nh" ]; do
    if [ "$private" = 1 ]; then
      hold "test \$(hostname) = fch-$h && grep -q '^fchost /dev/shm tmpfs' /proc/self/mounts" \
        -n -u -i -m --propagation private sh -c \
        "hostname fch-$h && mount -t tmpfs -o size=1g fchost /dev/shm && exec sleep 100000" ||
        skip "cannot make host $h (hostname and a private /dev/shm in new namespaces)"
    else
      hold "test \$(hostname) = fch-$h" -n -u -i sh -c "hostname fch-$h && exec sleep 100000" ||
        skip "cannot make host $h"
    fi
    pid=$HELD
    nsenter -t "$SW" -n "$IP" link add "vh$h" type veth peer name eth0 netns "$pid" 2>"$W/ip.err" ||
      skip "no veth pair: $(cat "$W/ip.err")"
    nsenter -t "$SW" -n "$IP" link set "vh$h" master br0 up
    nsenter -t "$pid" -n "$IP" addr add "10.77.0.$h/24" dev eth0
    nsenter -t "$pid" -n "$IP" link set eth0 up
    nsenter -t "$pid" -n "$IP" link set lo up
    HOSTPID="$HOSTPID $pid"
    h=$((h + 1))
  done
  # Every host reaches every other before any rank starts (where ping is installed).
  command -v ping >/dev/null 2>&1 || return 0
  for p in $HOSTPID; do
    h=1
    while [ $h -le "$nh" ]; do
      nsenter -t "$p" -n ping -c1 -W2 "10.77.0.$h" >/dev/null 2>&1 ||
        nsenter -t "$p" -n ping -c1 -W2 "10.77.0.$h" >/dev/null 2>&1 || fail "host pid $p cannot reach 10.77.0.$h"
      h=$((h + 1))
    done
  done
}

drop_hosts() {
  [ "$MODE" = hostid ] || for p in $HOSTPID $SW; do kill -9 "$p" 2>/dev/null; done
  HOSTPID="" SW=""
}

nth() { # nth N WORDS...: the Nth word (1-based)
  n=$1; shift
  eval "echo \${$n}"
}

# Host (1-based) of rank r: LAYOUT=round (r mod NH + 1) or block (r / 2 + 1).
host_of() {
  if [ "$LAYOUT" = round ]; then echo $(($1 % NH + 1)); else echo $(($1 / 2 + 1)); fi
}

# Start NR ranks of test_coll --launcher MODE with the extra environment given; rank r's output
# goes to $W/$CASE.r.out (stdout) and .err (stderr).
RANKPIDS=""
# Each rank runs `$TC --launcher MODE`, or RANK_CMD (a sh -c script: $0 is RANK_PROG) when set.
# Run a command (env's VAR=VALUE... then the program) as host h (1-based) sees it: in its
# namespaces, or with its host id on this machine.  Only in the background (`in_host ... &`): it
# execs, so that $! is the rank itself (wait_ranks and cleanup kill it by that pid).
in_host() { # in_host H VAR=VALUE... PROGRAM ARGS...
  h=$1; shift
  if [ "$MODE" = hostid ]; then
    exec env FLEXCOLL_HOSTID="fch-$h" FLEXCOLL_ROOT="127.0.0.1:$PORT0" FLEXCOLL_SOCKET_IFNAME=lo "$@"
  else
    exec nsenter -t "$(nth "$h" $HOSTPID)" -n -u -i -m --wd="$B" env FLEXCOLL_ROOT="10.77.0.$(host_of 0):$PORT0" \
      FLEXCOLL_SOCKET_IFNAME=eth0 "$@"
  fi
}

start_ranks() { # start_ranks MODE VAR=VALUE...
  mode=$1; shift
  RANKPIDS=""
  r=0
  PORT0=$((PORT0 + 10)) # a case's ranks may take the next few ports (device)
  while [ $r -lt "$NR" ]; do
    in_host "$(host_of $r)" FLEXCOLL_RANK=$r FLEXCOLL_NRANKS="$NR" FLEXCOLL_BOOTSTRAP_SECRET=fc-hosts \
      FLEXCOLL_CACHE_DIR="$W/cache" FLEXCOLL_DEBUG=INFO FC_TEST_SEED="$SEED" FLEXCOLL_VERBS_FAKE_LIB="$FAKE" \
      UCX_MEM_EVENTS=no "$@" sh -c "${RANK_CMD:-exec \"\$0\" --launcher \"\$1\"}" "${RANK_PROG:-$TC}" "$mode" \
      >"$W/$CASE.$r.out" 2>"$W/$CASE.$r.err" &
    RANKPIDS="$RANKPIDS $!"
    PIDS="$PIDS $!"
    r=$((r + 1))
  done
}

# Wait for the ranks at most LIMIT seconds; kill what is left.  Sets RCS (exit codes by rank).
wait_ranks() { # wait_ranks LIMIT
  end=$(($(date +%s) + $1))
  RCS=""
  for p in $RANKPIDS; do
    while kill -0 "$p" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 0.2; done
    if kill -0 "$p" 2>/dev/null; then
      kill -9 "$p" 2>/dev/null
      RCS="$RCS killed"
    else
      wait "$p"
      RCS="$RCS $?"
    fi
  done
}

show() { # the tail of every rank's output, after a failure
  r=0
  while [ $r -lt "$NR" ]; do
    echo "---- $CASE rank $r (host fch-$(host_of $r)) stdout:"
    tail -n 5 "$W/$CASE.$r.out"
    echo "---- stderr (warnings, errors, the last lines):"
    grep -E 'WARN|ERROR|FAIL' "$W/$CASE.$r.err" | head -n 20
    tail -n 5 "$W/$CASE.$r.err"
    r=$((r + 1))
  done
}

# Every rank exited 0; else bad=1, and which did not is said.
check_exits() {
  r=0
  for rc in $RCS; do
    [ "$rc" = 0 ] || { fail "$CASE: rank $r exited $rc"; bad=1; }
    r=$((r + 1))
  done
}

# Every rank passed; its link statistics keep shm (and, with FORBID, that link) within its host
# and show bytes to every peer of another host on link CROSS.
check_matrix() { # check_matrix CROSS
  bad=0
  check_exits
  r=0
  while [ $r -lt "$NR" ]; do
    hr=$(host_of $r)
    q=0
    while [ $q -lt "$NR" ]; do
      if [ $q != $r ]; then
        hq=$(host_of $q)
        if [ "$hq" != "$hr" ]; then
          grep -q "^rank $r: link shm peer $q " "$W/$CASE.$r.out" &&
            { fail "$CASE: rank $r lists shm toward rank $q on another host"; bad=1; }
          grep -Eq "^rank $r: link $1 peer $q bytes [1-9]" "$W/$CASE.$r.out" ||
            { fail "$CASE: rank $r sent nothing over $1 to rank $q (host fch-$hq)"; bad=1; }
        elif [ "$2" = shm ]; then
          grep -Eq "^rank $r: link shm peer $q bytes [1-9]" "$W/$CASE.$r.out" ||
            { fail "$CASE: rank $r sent nothing over shm to rank $q on its own host"; bad=1; }
        fi
      fi
      q=$((q + 1))
    done
    r=$((r + 1))
  done
  # The log names the links between each pair of hosts (lib/sched/links.c, "between hosts").
  grep -h "between hosts" "$W/$CASE".*.err | sort -u | head -n 10
  grep -q "between hosts fch-.* over $1" "$W/$CASE.0.err" ||
    { fail "$CASE: rank 0's log (FLEXCOLL_DEBUG=INFO) names no link $1 between hosts"; bad=1; }
  [ $bad = 0 ] && echo "PASS: $CASE" || show
}

want() { case " ${FC_HOSTS_CASES:-matrix3 matrix2 uneven rdma device shmonly down slow} " in *" $1 "*) return 0 ;; esac; return 1; }

# One matrix case: run_matrix PRIVATE_SHM INTER_LINK INTRA_LINK [VAR=VALUE...] (CASE, NH, NR and
# LAYOUT set): NH hosts, the full matrix on every rank, then the links' checks.
run_matrix() {
  private=$1 inter=$2 intra=$3
  shift 3
  make_hosts "$NH" "$private"
  t0=$(date +%s)
  start_ranks matrix FLEXCOLL_TIMEOUT_MS=60000 "$@"
  wait_ranks 900
  echo "$CASE: $(($(date +%s) - t0)) s"
  check_matrix "$inter" "$intra"
  drop_hosts
}

# ---- matrix3: 3 hosts, ranks round the hosts, default links -----------------------------------
if want matrix3; then
  CASE=matrix3 NH=3 NR=6 LAYOUT=round
  run_matrix 1 tcp shm
fi

# ---- matrix2: 2 hosts, ranks in blocks, the ring -------------------------------------------------
if want matrix2; then
  CASE=matrix2 NH=2 NR=4 LAYOUT=block
  run_matrix 1 tcp shm FLEXCOLL_ALGO=ring
fi

# ---- uneven: 3 hosts of 2, 2 and 1 ranks, the ring (two dimensions on unequal hosts) ------------
if want uneven; then
  CASE=uneven NH=3 NR=5 LAYOUT=block
  run_matrix 1 tcp shm FLEXCOLL_ALGO=ring
fi

# ---- rdma: the fake provider between 2 hosts, its wire a folder they share -----------------------
if want rdma; then
  CASE=rdma NH=2 NR=4 LAYOUT=round
  if [ ! -e "$FAKE" ]; then
    echo "SKIP: $CASE: $FAKE is not built (configured without infiniband/verbs.h)"
  else
    mkdir -p "$W/wire"
    run_matrix 1 rdma shm FLEXCOLL_LINKS=shm,rdma FLEXCOLL_VERBS_PROVIDER=fake FLEXCOLL_VERBS_FAKE_WIRE="$W/wire"
    left=$(ls "$W/wire")
    [ -z "$left" ] || fail "$CASE: the fake's wire still holds $left after the ranks ended"
  fi
fi

# ---- device: device buffers between 2 hosts, every rank on GPU 0 ---------------------------------
if want device; then
  CASE=device NH=2 NR=4 LAYOUT=block
  COLLS="allreduce allgather reduce_scatter broadcast reduce alltoall"
  if ! grep -q 'define HAVE_CUDA 1' "$B/config.h" 2>/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "SKIP: $CASE: no GPU here, or flexcoll built without CUDA"
  else
    make_hosts 2 1
    # One communicator per collective, each on a port of its own (no wait for the last one's).
    RANK_PROG=$B/tools/flexcoll-perf
    RANK_CMD='p=${FLEXCOLL_ROOT##*:}; for c in '"$COLLS"'; do p=$((p + 1));
      FLEXCOLL_ROOT=${FLEXCOLL_ROOT%:*}:$p "$0" -m device --coll $c -b 8 -e 4M -f 32 -n 2 -w 1 -c 1 || exit 1; done'
    start_ranks device FLEXCOLL_TIMEOUT_MS=60000
    unset RANK_PROG RANK_CMD
    wait_ranks 600
    # Every rank checks its own results (exit 1 on a wrong value); rank 0 prints the table.
    bad=0
    check_exits
    ok=$(grep -c '^# Out of bounds values : 0 OK' "$W/$CASE.0.out")
    [ "$ok" = 6 ] || { fail "$CASE: rank 0 reports $ok of 6 collectives right"; bad=1; }
    [ $bad = 0 ] && echo "PASS: $CASE: $COLLS on device buffers between 2 hosts, every rank right" || show
    drop_hosts
  fi
fi

# ---- shmonly: no link joins the hosts -------------------------------------------------------------
if want shmonly; then
  CASE=shmonly NH=2 NR=4 LAYOUT=block
  make_hosts 2 1
  start_ranks init FLEXCOLL_TIMEOUT_MS=10000 FLEXCOLL_LINKS=shm
  wait_ranks 60
  r=0
  bad=0
  for rc in $RCS; do
    if [ "$rc" != 3 ] || ! grep -q "no link of FLEXCOLL_LINKS=shm joins rank" "$W/$CASE.$r.out"; then
      fail "$CASE: rank $r: exit $rc, wanted 3 and the ranks no link joins: $(cat "$W/$CASE.$r.out")"
      bad=1
    fi
    r=$((r + 1))
  done
  [ $bad = 0 ] && { echo "PASS: $CASE: $(head -n1 "$W/$CASE.0.out")"; } || show
  drop_hosts
fi

# ---- down: a host's veth goes down mid-run -----------------------------------------------------------
if want down && [ "$MODE" = hostid ]; then
  echo "SKIP: down: hosts by FLEXCOLL_HOSTID share one network, which cannot be cut for one of them"
elif want down; then
  CASE=down NH=2 NR=4 LAYOUT=round
  TMO=8
  make_hosts 2 1
  rm -f "$W/ready"
  start_ranks until-error FLEXCOLL_TIMEOUT_MS=$((TMO * 1000)) FC_TEST_LOOP_S=200 FC_TEST_READY="$W/ready"
  # A rank that ran 20 allreduces creates the file: all ranks are in the loop by then.
  i=0
  while [ ! -e "$W/ready" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
  [ -e "$W/ready" ] || fail "$CASE: no rank ran 20 allreduces within 120 s"
  sleep 1
  t_down=$(date +%s.%N)
  nsenter -t "$(nth 2 $HOSTPID)" -n "$IP" link set eth0 down
  echo "$CASE: host fch-2's eth0 down at $t_down"
  wait_ranks $((TMO + 30))
  r=0
  bad=0
  for rc in $RCS; do
    line=$(grep "error" "$W/$CASE.$r.out" | head -n1)
    at=$(echo "$line" | sed -n 's/.* at \([0-9.]*\):.*/\1/p')
    late=$(awk -v a="${at:-0}" -v d="$t_down" -v t=$TMO 'BEGIN { print (a - d > t + 5) ? 1 : 0 }')
    echo "$CASE: rank $r (host fch-$(host_of $r)): exit $rc: $line"
    if [ "$rc" != 0 ] || [ -z "$at" ] || [ "$late" != 0 ]; then
      fail "$CASE: rank $r did not return REMOTE_ERROR or TIMEOUT within ${TMO} s + 5 s of the link going down"
      bad=1
    fi
    r=$((r + 1))
  done
  [ $bad = 0 ] && echo "PASS: $CASE" || show
  drop_hosts
fi

# ---- slow: hosts joined by 100 Mbit/s take two dimensions beyond the measured limits ------------
TCBIN=$(command -v tc 2>/dev/null || echo /usr/sbin/tc)
if want slow && [ "$MODE" = hostid ]; then
  echo "SKIP: slow: hosts by FLEXCOLL_HOSTID share one network, which cannot be slowed for them"
elif want slow && [ ! -x "$TCBIN" ]; then
  echo "SKIP: slow: tc(8) is not installed"
elif want slow; then
  CASE=slow NH=2 NR=4 LAYOUT=round
  make_hosts 2 1
  bad=0
  for p in $HOSTPID; do
    nsenter -t "$p" -n "$TCBIN" qdisc add dev eth0 root tbf rate 100mbit burst 256kb latency 200ms 2>"$W/tc.err" ||
      { echo "SKIP: slow: tc cannot limit a veth here: $(cat "$W/tc.err")"; bad=skip; }
  done
  if [ $bad = 0 ]; then
    # A cache of its own: the other 2-host cases cached models of the same shape unthrottled.
    start_ranks sent-per-call FLEXCOLL_TIMEOUT_MS=60000 FLEXCOLL_DEBUG_SUBSYS=SCHED FLEXCOLL_CACHE_DIR="$W/cache-slow"
    wait_ranks 180
    check_exits
    grep -h "predict" "$W/$CASE.0.err" | sed 's/^[^]]*] //' | sort -u
    r=0
    while [ $r -lt "$NR" ]; do
      for coll in allgather:1048576 reduce_scatter:2097152; do
        name=${coll%:*} block=${coll#*:}
        cross=0
        q=0
        while [ $q -lt "$NR" ]; do
          if [ "$(host_of $q)" != "$(host_of $r)" ]; then
            b=$(sed -n "s/^rank $r: $name peer $q bytes \([0-9]*\)$/\1/p" "$W/$CASE.$r.out")
            cross=$((cross + ${b:-0}))
          fi
          q=$((q + 1))
        done
        echo "$CASE: rank $r: $name sent $cross bytes to the other host (one block: $block)"
        [ "$cross" = "$block" ] || { fail "$CASE: rank $r's $name sent $cross bytes to the other host, not one block ($block): not in two dimensions"; bad=1; }
      done
      r=$((r + 1))
    done
    [ $bad = 0 ] && echo "PASS: $CASE" || show
  fi
  drop_hosts
fi

if [ -n "$FAILS" ]; then
  echo "FAIL: test_hosts.sh (FC_TEST_SEED=$SEED):$FAILS"
  exit 1
fi
echo "PASS: test_hosts.sh"
exit 0
