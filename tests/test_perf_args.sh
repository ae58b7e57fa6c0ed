#!/bin/sh
# flexcoll-perf's command line, on host memory (no GPU needed): every bad value or option is refused
# with exit status 2 and a message that names the option; nccl-tests' flags that flexcoll-perf does
# not have are refused by name; and a good run with nccl-tests' flags (-t, -n, -w, -c, -i) checks its
# results and writes its JSON.
set -u
perf=${PERF:-./tools/flexcoll-perf}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_perf_args.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
pass=0 fail=0

# refuse WANTED ARGS...: exit status 2, and WANTED (the option's name) in what it printed.
refuse() {
  want=$1; shift
  "$perf" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 2 ] && grep -qF -e "$want" "$tmp/err"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: flexcoll-perf $*: exit $rc (want 2), stderr (want \"$want\"):"; sed 's/^/    /' "$tmp/err" "$tmp/out"
  fi
}

refuse "-b (--minbytes) 1X" -m host -b 1X
refuse "-e (--maxbytes)" -m host -e 0
refuse "-n (--iters) 0" -m host -n 0
refuse "-n (--iters) abc" -m host -n abc
refuse "-w (--warmup_iters) abc" -m host -w abc
refuse "-i (--stepbytes) 1x" -m host -i 1x
refuse "-i (--stepbytes) and -f" -m host -i 1K -f 2
refuse "-f (--stepfactor) 1" -m host -f 1
refuse "-b (--minbytes) 2048 is above -e" -m host -b 2K -e 1K
refuse "-m (--memory) gpu" -m gpu
refuse "aggregated iterations" -m 4
refuse "-C" -m host -C 2
refuse "-c allreduce" -m host -c allreduce
refuse "-c (--check) 5" -m host -c 5
refuse "-G 1: a CUDA graph captures device work" -m host -G 1
refuse "-G (--cudagraph) x" -m host -G x
refuse "-g (--ngpus)" -m host -g 2
refuse "-a (--algo) 1" -m host -a 1
refuse "-d (--datatype) all" -m host -d all
refuse "-o (--op) all" -m host -o all
refuse "--coll bcast" -m host --coll bcast
refuse "--baseline mpi" -m host --baseline mpi
refuse "--links shm,foo" -m host --links shm,foo
refuse "--links" -m host --links ""
refuse "--nranks replaces" -m host --nranks 2 -t 2
refuse "-t (--nthreads) 0" -m host -t 0
refuse "-z" -m host -z 1
refuse "unknown option --bogus" -m host --bogus
refuse "-n needs a value" -m host -n
refuse "unexpected argument 'stray'" -m host stray
refuse "unexpected argument 'allreduce'" -m host allreduce
refuse "-r (--root) 2: the root must be below the rank count, 2" -m host -t 2 -r 2
refuse "--plot $tmp/no/such/dir/p.png" -m host -t 2 -e 64 --plot "$tmp/no/such/dir/p.png"
refuse "-J (--json) $tmp/no/such/dir/r.json" -m host -t 2 -e 64 -J "$tmp/no/such/dir/r.json"
# MoE: device memory only, its own options checked by name.
refuse "--coll moe_dispatch: MoE dispatch and combine move device memory" -m host --coll moe_dispatch
refuse "--top_k 16" -m host --coll moe_dispatch --top_k 16
refuse "--tokens 0" -m host --coll moe_dispatch --tokens 0
refuse "--hidden x" -m host --coll moe_dispatch --hidden x
refuse "--moe_sync always" -m host --coll moe_dispatch --moe_sync always
refuse "-d (--datatype) int8: combine sums" -m host --coll moe_combine -d int8
refuse "-d (--datatype) float64: MoE payloads" -m host --coll moe_dispatch -d float64
refuse "--baseline nccl: --coll moe_dispatch" -m host --coll moe_dispatch --baseline nccl

# --help: a line for every option, short and long.
"$perf" --help >"$tmp/help" 2>&1 || { fail=$((fail + 1)); echo "FAIL: --help exited non-zero"; }
for opt in "-b, --minbytes" "-e, --maxbytes" "-f, --stepfactor" "-i, --stepbytes" "-n, --iters" "-w, --warmup_iters" \
           "-c, --check" "-d, --datatype" "-o, --op" "-r, --root" "-t, --nthreads" "-g, --ngpus" "-m, --memory" \
           "-a, --algo" "-R, --local_register" "-G, --cudagraph" "-J, --json" "--coll" "--nranks" "--baseline" "--links" "--plot" "--hidden" "--top_k" "--experts" "--tokens" "--moe_sync" "-h, --help"; do
  if grep -qF -e "$opt" "$tmp/help"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: --help lacks $opt"; fi
done

# A good run: 3 host ranks as threads, sizes by a fixed step, results checked and saved.
if "$perf" -m host -t 3 -b 1K -e 9K -i 4K -n 3 -w 1 -c 1 --coll allgather -J "$tmp/r.json" >"$tmp/out" 2>&1 &&
   grep -q '^# Out of bounds values : 0 OK' "$tmp/out" && [ "$(grep -c '^ ' "$tmp/out")" -eq 3 ] &&
   grep -q '"collective": "allgather", "nranks": 3' "$tmp/r.json"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: the good host-memory run:"; sed 's/^/    /' "$tmp/out"
fi
# ...with nccl-tests' header and footer: version, settings, ranks and devices, the column groups'
# labels, redop none where nothing reduces, the average bus bandwidth; the JSON has the same.
for line in '^# flexcoll-perf version [0-9]' \
            '^# nThread 3 nGpus 0 minBytes 1024 maxBytes 9216 step: 4096(bytes) warmup iters: 1 iters: 3 .*validation: 1' \
            '^#  Rank  0 Group  0 Pid *[0-9]* on .* host$' '^#  Rank  2 Group  0 Pid' \
            '^# .*out-of-place .*in-place' '^ *[0-9]* *[0-9]* *float32 *none *-1 ' '^# Avg bus bandwidth    : [0-9.e+-]* *$'; do
  grep -q -e "$line" "$tmp/out" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: the output lacks $line"; }
done
if grep -q '"settings": {"minbytes": 1024, "maxbytes": 9216, .*"iters": 3' "$tmp/r.json" &&
   grep -q '{"rank": 2, "pid": [0-9]*, "host": ".*", "device": -1' "$tmp/r.json" &&
   grep -q '"avg_busbw": ' "$tmp/r.json"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: the JSON lacks the settings or devices:"; sed 's/^/    /' "$tmp/r.json"
fi

# Two host links: the JSON carries each link's share of the bytes (shm needs peer-failure handling off;
# the links carry host collectives only with the shared-memory path off).
if FLEXCOLL_SHM_DIRECT=0 FLEXCOLL_UCX_PEER_FAILURE=0 FLEXCOLL_CACHE_DIR="$tmp/cache" "$perf" -m host -t 2 -b 4M -e 4M -n 3 -w 1 \
     --links shm,tcp -J "$tmp/l.json" >"$tmp/out" 2>&1 &&
   grep -q '^# Out of bounds values : 0 OK' "$tmp/out" && grep -q '"links": {"shm": [0-9.]*, "tcp": [0-9.]*}' "$tmp/l.json"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: the run over --links shm,tcp:"; sed 's/^/    /' "$tmp/out" "$tmp/l.json"
fi

# A rank started alone under a launcher says that it waits for the others (after ~2 s), and the
# error at the end names how many joined; all without FLEXCOLL_DEBUG.
port=$((20000 + $$ % 20000))
env -u FLEXCOLL_DEBUG FLEXCOLL_BOOTSTRAP_TIMEOUT=3 FLEXCOLL_RANK=0 FLEXCOLL_NRANKS=2 FLEXCOLL_ROOT=127.0.0.1:$port \
  "$perf" -m host -e 64 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] && grep -q 'waiting for the other ranks: 1 of 2 joined' "$tmp/err" &&
   grep -q 'init failed: .*with 1 of 2 ranks joined' "$tmp/err"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: rank 0 alone (exit $rc):"; sed 's/^/    /' "$tmp/err"
fi

# A rank killed during a size's calls: the survivor's row says "failed" where a time would be (its
# calls stopped early: a time and bandwidth would mean nothing), its JSON time is null, exit 1.
# The survivor under timeout(1) (it must not hang the suite); the victim without (SIGKILL of
# timeout would leave the rank running).
port=$((port + 1))
for r in 0 1; do
  limit=""
  [ $r = 0 ] && limit="timeout 120"
  FLEXCOLL_TIMEOUT_MS=8000 FLEXCOLL_RANK=$r FLEXCOLL_NRANKS=2 FLEXCOLL_ROOT=127.0.0.1:$port \
    $limit "$perf" -m host -b 16M -e 16M -n 1000000 -w 1 -c 0 -J "$tmp/k$r.json" >"$tmp/k$r.out" 2>&1 &
  eval pid$r=$!
done
# Killed once both are in the timed calls (the header is printed after init and before them).
n=0
while [ $n -lt 100 ] && ! grep -q '(us)' "$tmp/k0.out"; do sleep 0.2; n=$((n + 1)); done
sleep 1
kill -9 "$pid1"
wait "$pid0"
rc=$?
wait "$pid1" 2>/dev/null
if [ $rc -eq 1 ] && grep -Eq '^ +16777216 .* failed .* failed ' "$tmp/k0.out" && grep -q '"time_us": null' "$tmp/k0.json"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: the survivor of a killed rank (exit $rc, want 1):"; sed 's/^/    /' "$tmp/k0.out" "$tmp/k0.json"
fi

echo "test_perf_args: $pass passed, $fail failed"
[ $fail -eq 0 ]
