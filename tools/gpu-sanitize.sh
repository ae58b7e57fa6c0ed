#!/bin/sh
# gpu-sanitize.sh — compute-sanitizer (memcheck, racecheck) over flexcoll's device kernels, with
# ranks as processes on the GPUs present.  Ranks may share one GPU: the tool runs one process's
# kernels one at a time, which deadlocks ranks that are threads of one process (every rank's
# kernel waits for its peers'), but the kernels of different processes time-slice the GPU, so a
# rank waiting under the tool still sees its peers progress.
#
# For each tool, rank count and collective, flexcoll-perf runs every size from 8 B up by factors
# of 8 to MAXBYTES (the one-shot, LL, ring and alltoall kernels; moe_dispatch and moe_combine
# sweep tokens instead) with its result check on, each rank under the tool.  A run passes when
# every rank exits 0 and the tool reports no error (memcheck) and no hazard (racecheck).
#
# usage: tools/gpu-sanitize.sh [FLEXCOLL_BUILD]   (default: .; its tools/flexcoll-perf)
# environment: NRANKS ("2 3"), TOOLS ("memcheck racecheck"), COLLS (every collective and the MoE
#   pair), MAXBYTES (4M), TIMEOUT (seconds per run, 300), OUTDIR (a new temporary folder),
#   COMPUTE_SANITIZER (compute-sanitizer on PATH, else /usr/local/cuda/bin's).
# Exit status: 0 all clean, 1 something failed, 77 no GPU or no compute-sanitizer.
set -u
build=$(cd "${1:-.}" && pwd)
perf=$build/tools/flexcoll-perf
[ -x "$perf" ] || { echo "gpu-sanitize: no $perf (build flexcoll with CUDA first)" >&2; exit 2; }
cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[ -x "$cs" ] || { echo "gpu-sanitize: no compute-sanitizer"; exit 77; }
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "gpu-sanitize: no GPU here"; exit 77; }
nranks=${NRANKS:-2 3}
tools=${TOOLS:-memcheck racecheck}
colls=${COLLS:-allreduce allgather reduce_scatter broadcast reduce alltoall moe_dispatch moe_combine}
maxbytes=${MAXBYTES:-4M}
limit=${TIMEOUT:-300}
out=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-sanitize.XXXXXX")}
mkdir -p "$out"
# CUDA calls that return an error are not counted (--report-api-errors no): UCX's cuda_copy module
# probes with calls that fail by design while an endpoint picks its protocols (cuMemCreate where
# the machine does not permit the handle type, cuMemRetainAllocationHandle on memory cuMemCreate
# did not make), and flexcoll checks every return code itself: a failure that matters fails the
# run's result check or its exit status.
export NCCL_NVLS_ENABLE=0 FLEXCOLL_TIMEOUT_MS=$((limit * 1000))

failed=0 runs=0 port=$((21000 + $$ % 9000))
for tool in $tools; do
  for n in $nranks; do
    for coll in $colls; do
      case $coll in
        moe_*) args="--coll $coll --tokens 512 --hidden 1024 --experts $((8 * n)) -f 8" ;;
        *) args="--coll $coll -b 8 -e $maxbytes -f 8" ;;
      esac
      port=$((port + 1)) runs=$((runs + 1)) pids=""
      log=$out/$tool-$n-$coll
      r=0
      while [ $r -lt "$n" ]; do
        # shellcheck disable=SC2086
        FLEXCOLL_ROOT=127.0.0.1:$port FLEXCOLL_NRANKS=$n FLEXCOLL_RANK=$r \
          timeout "$limit" "$cs" --tool "$tool" --report-api-errors no --error-exitcode 9 "$perf" $args -n 1 -w 1 -c 1 > "$log.$r" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
      done
      bad=0
      for p in $pids; do wait "$p" || bad=1; done
      # Each rank's summary: "ERROR SUMMARY: 0 errors" (memcheck), "0 errors, 0 warnings" (racecheck).
      for f in "$log".*; do
        grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards" "$f" || bad=1
      done
      if [ $bad = 0 ]; then
        printf '%-10s %d ranks %-15s clean\n' "$tool" "$n" "$coll"
      else
        printf '%-10s %d ranks %-15s FAIL  (%s.*)\n' "$tool" "$n" "$coll" "$log"
        grep -hE "SUMMARY|Invalid|Race|rror" "$log".* | sort | uniq -c | head -5 | sed 's/^/    /'
        failed=$((failed + 1))
      fi
    done
  done
done
echo "gpu-sanitize: $((runs - failed)) of $runs runs clean; logs in $out"
[ $failed = 0 ]
