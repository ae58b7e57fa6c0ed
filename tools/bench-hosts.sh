#!/bin/sh
# bench-hosts.sh — flexcoll-perf on host memory with its ranks on several "hosts" of this
# machine, as tests/test_hosts.sh builds them: each host a network + UTS + IPC + mount namespace
# with its own hostname, its own /dev/shm, loopback and one veth (10.77.0.H) to a bridge in a
# switch namespace.  Nothing is added to the caller's namespaces; all is gone when it ends.
#
# usage: tools/bench-hosts.sh BUILD_DIR [VAR=VALUE ...] [-- flexcoll-perf options]
#   BUILD_DIR   its tools/flexcoll-perf runs every rank (e.g. a build of main for "before")
#   VAR=VALUE   environment for every rank (FLEXCOLL_HIERARCHY=0, FLEXCOLL_LINKS=tcp, ...)
# Environment (optional):
#   HOSTS       hosts (2)           PER    ranks per host (2)
#   LAYOUT      round: rank r on host r mod HOSTS (default: the numbering a launcher that
#               deals ranks out round the hosts gives); block: ranks 0..PER-1 on host 1, ...
#   RATE        a token-bucket limit on every host's veth (tc tbf), e.g. 1gbit: the link between
#               hosts as the bottleneck it is between machines; unset: none (veth at memory speed)
# Prints rank 0's flexcoll-perf output.  Needs root, unshare, nsenter, ip (and tc for RATE).
set -eu

[ $# -ge 1 ] || { sed -n '2,20p' "$0"; exit 2; }
BUILD=$(cd "$1" && pwd)
shift
PERF=$BUILD/tools/flexcoll-perf
[ -x "$PERF" ] || { echo "bench-hosts.sh: $PERF is not built" >&2; exit 2; }
ENVS=""
while [ $# -gt 0 ] && [ "$1" != -- ]; do ENVS="$ENVS $1"; shift; done
[ $# -gt 0 ] && shift
HOSTS=${HOSTS:-2} PER=${PER:-2} LAYOUT=${LAYOUT:-round} RATE=${RATE:-}
IP=$(command -v ip 2>/dev/null || echo /usr/sbin/ip)
TC=$(command -v tc 2>/dev/null || echo /usr/sbin/tc)
NR=$((HOSTS * PER))
W=$(mktemp -d /tmp/fc-bench-hosts.XXXXXX)
PIDS=""
cleanup() {
  for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

held() { # held CHECK UNSHARE-ARGS...: start a namespace holder, wait until CHECK holds in it
  check=$1; shift
  unshare "$@" </dev/null >/dev/null 2>&1 &
  HELD=$!
  PIDS="$PIDS $HELD"
  i=0
  until nsenter -t "$HELD" -u -m sh -c "$check" >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "bench-hosts.sh: cannot create namespaces" >&2; exit 1; }
    sleep 0.05
  done
}

# Checked by its hostname: until unshare(2) has run, nsenter would reach the caller's namespace.
held "test \$(hostname) = fch-switch" -n -u sh -c "hostname fch-switch && exec sleep 100000"
SW=$HELD
nsenter -t "$SW" -n "$IP" link add br0 type bridge
nsenter -t "$SW" -n "$IP" link set br0 up
HOSTPID=""
h=1
while [ $h -le "$HOSTS" ]; do
  held "test \$(hostname) = fch-$h && grep -q '^fchost /dev/shm tmpfs' /proc/self/mounts" -n -u -i -m \
    --propagation private sh -c "hostname fch-$h && mount -t tmpfs -o size=2g fchost /dev/shm && exec sleep 100000"
  nsenter -t "$SW" -n "$IP" link add "vh$h" type veth peer name eth0 netns "$HELD"
  nsenter -t "$SW" -n "$IP" link set "vh$h" master br0 up
  nsenter -t "$HELD" -n "$IP" addr add "10.77.0.$h/24" dev eth0
  nsenter -t "$HELD" -n "$IP" link set eth0 up
  nsenter -t "$HELD" -n "$IP" link set lo up
  # Traffic between ranks of one host goes over its loopback, which stays unlimited.
  [ -z "$RATE" ] || nsenter -t "$HELD" -n "$TC" qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
  HOSTPID="$HOSTPID $HELD"
  h=$((h + 1))
done

host_of() { if [ "$LAYOUT" = block ]; then echo $(($1 / PER + 1)); else echo $(($1 % HOSTS + 1)); fi; }
nth() { n=$1; shift; eval "echo \${$n}"; }
RANKS=""
r=0
while [ $r -lt $NR ]; do
  pid=$(nth "$(host_of $r)" $HOSTPID)
  # shellcheck disable=SC2086
  nsenter -t "$pid" -n -u -i -m --wd="$BUILD" env FLEXCOLL_RANK=$r FLEXCOLL_NRANKS=$NR \
    FLEXCOLL_ROOT="10.77.0.$(host_of 0):29500" FLEXCOLL_SOCKET_IFNAME=eth0 FLEXCOLL_BOOTSTRAP_SECRET=fc-bench \
    FLEXCOLL_CACHE_DIR="$W/cache" UCX_MEM_EVENTS=no $ENVS "$PERF" -m host "$@" >"$W/out.$r" 2>"$W/err.$r" &
  RANKS="$RANKS $!"
  PIDS="$PIDS $!"
  r=$((r + 1))
done
rc=0
for p in $RANKS; do wait "$p" || rc=$?; done
echo "# bench-hosts.sh: $HOSTS hosts x $PER ranks, layout $LAYOUT, rate ${RATE:-unlimited},${ENVS:- default environment}"
cat "$W/out.0"
[ $rc = 0 ] || { echo "bench-hosts.sh: a rank failed (exit $rc); rank 0's stderr:" >&2; tail -n 20 "$W/err.0" >&2; }
exit $rc
