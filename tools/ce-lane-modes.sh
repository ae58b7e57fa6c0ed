#!/bin/sh
# ce-lane-modes.sh — the pcie lane's copy-engine mover (FLEXCOLL_PCIE_ENGINE=ce) run after run:
# its speed is bimodal across process runs (docs/PERFORMANCE.md, sessions 15-18), so one run says
# nothing.  Each run is one process of two ranks on GPU 0 doing a 256 MB ring AllGather through
# the ce lane alone (no nvlink, no one-shot kernels), with the proxies' hop trace on (each prints,
# at destroy, how long each of its two streams was busy and at what rate, against the time the
# lane had bytes in flight).  One line per run: algbw out of place, then per rank and hop the rate
# while busy and the busy fraction.  A slow run whose rates while busy stay those of a fast run
# stalls between copies (the proxies, the kernel); lower rates mean slower copies.
#
# Runs are repeated under each CPU set of CPUSETS (taskset lists, "-" for none), to see whether
# the mode follows where the proxies run, and under each setting of VARIANTS (VAR=VALUE words,
# "-" for none: CUDA_DEVICE_MAX_CONNECTIONS=32 FLEXCOLL_PCIE_BLOCKS=2 ...), to see what moves it.  The staged copy yardstick (tools/staged_copy_bench.py)
# runs first and last when python3 with torch is there (YARDSTICK=0: not at all).
#
# usage: tools/ce-lane-modes.sh [FLEXCOLL_BUILD]   (default: .; its tools/flexcoll-perf)
# environment: RUNS (per CPU set and variant, 6), CPUSETS ("-"), VARIANTS ("-"), BYTES (256M),
# OUTDIR (a new temporary folder),
# YARDSTICK (1); the rest passes through (CUDA_DEVICE_MAX_CONNECTIONS, FLEXCOLL_PCIE_AREA_BYTES, ...)
# Exit status: 0 when every run gave a result, 1 otherwise, 77 without a GPU.
set -u
build=$(cd "${1:-.}" && pwd)
perf=$build/tools/flexcoll-perf
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$perf" ] || { echo "ce-lane-modes: no $perf (build flexcoll with CUDA first)" >&2; exit 2; }
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "ce-lane-modes: no GPU here"; exit 77; }
runs=${RUNS:-6}
cpusets=${CPUSETS:--}
variants=${VARIANTS:--}
bytes=${BYTES:-256M}
out=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/ce-lane-modes.XXXXXX")}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 FLEXCOLL_LINKS=pcie,shm,tcp FLEXCOLL_ONESHOT_MAX_BYTES=0 FLEXCOLL_PCIE_ENGINE=ce \
  FLEXCOLL_DEBUG=INFO FLEXCOLL_DEBUG_SUBSYS=SCHED

yardstick() {
  [ "${YARDSTICK:-1}" != 0 ] && command -v python3 >/dev/null 2>&1 && [ -f "$here/staged_copy_bench.py" ] &&
    timeout 60 python3 "$here/staged_copy_bench.py" 2>&1 | tail -1 | sed 's/^/staged copy yardstick: /'
}

yardstick
failed=0 k=0
for variant in $variants; do
for set in $cpusets; do
  i=0
  while [ $i -lt "$runs" ]; do
    i=$((i + 1)) k=$((k + 1))
    log=$out/run$k.log
    if [ "$set" = - ]; then pin=""; else pin="taskset -c $set"; fi
    if [ "$variant" = - ]; then with=""; else with=$variant; fi
    timeout 120 env $with $pin "$perf" --nranks 2 --coll allgather -b "$bytes" -e "$bytes" -n 5 -w 2 -c 1 >"$log" 2>&1
    rc=$?
    # The size's row: algbw out of place is its 7th field.
    bw=$(awk '$1 ~ /^[0-9]+$/ && $3 == "float32" {print $7; exit}' "$log")
    [ -n "$bw" ] && [ $rc = 0 ] || { failed=1; bw="none (exit $rc)"; }
    # The trace lines: "rank R: pcie lane (copy engines), HOP: ... (X GB/s while busy), Y% of ..."
    hops=$(sed -n 's/.*rank \([0-9]*\): pcie lane (copy engines), \(device -> host\|host -> device\): .*(\([0-9.]*\) GB\/s while busy), \([0-9]*\)% of .*/r\1 \2 \3 GB\/s \4%/p' "$log" |
      sed 's/device -> host/d2h/; s/host -> device/h2d/' | tr '\n' ';')
    echo "${with:+$with }cpus $set run $i: algbw $bw GB/s | $hops"
  done
done
done
yardstick
echo "ce-lane-modes: logs in $out"
exit $failed
