#!/bin/sh
# bench-host-vs-mpi.sh — flexcoll's host-memory AllReduce against Open MPI's MPI_Allreduce.
#
# For each rank count (2 and 4 by default), float32 sum, sizes 8 B .. 64 MiB (factor 2, so that
# 64 MiB is one of them; FACTOR=4 halves the run but steps over it):
#   - MPI:      tools/mpi_allreduce_bench.c, compiled here with $MPICC, run with $MPIRUN -np N
#   - flexcoll: flexcoll-perf -m host, its default links, N processes started by the same $MPIRUN
#               (flexcoll-perf finds its rank from Open MPI's variables, the bootstrap root on
#               127.0.0.1), or with RANKS_AS=threads N ranks as threads of one process (-t N)
# and prints per size the time per call of each (out of place; the slowest rank's average) and
# flexcoll's speed relative to MPI (t_mpi / t_flexcoll: above 1, flexcoll is faster).
#
# Environment (all optional):
#   MPICC, MPIRUN      the MPI compiler wrapper and launcher (mpicc, mpirun); e.g. Open MPI 5
#                      from a wheel on the GPU node
#   MPIRUN_ARGS        extra launcher arguments (default: --oversubscribe when N exceeds the
#                      cores, --allow-run-as-root as root)
#   FLEXCOLL_PERF      the flexcoll-perf binary (default: tools/flexcoll-perf of the build
#                      directory given as $1, else of the current directory, else on PATH)
#   NRANKS             rank counts, e.g. "2 4 8" (default "2 4")
#   RANKS_AS           processes (default: like for like with MPI) or threads
#   WINDOWS            1: flexcoll's buffers from flexcoll_host_alloc, registered as windows
#                      (flexcoll-perf -R 1: the allreduce reads and writes the peers' buffers);
#                      0 (default): plain malloc'd buffers, as the MPI side has
#   MINBYTES MAXBYTES FACTOR ITERS WARMUP   (8, 64M, 2, 20, 5)
#   OUTDIR             where the raw outputs go (default: a new temporary directory); the
#                      flexcoll JSON files (-J) are kept there
# Anything else in the environment (FLEXCOLL_*, UCX_*) reaches flexcoll-perf as it is.
#
# usage: tools/bench-host-vs-mpi.sh [BUILD_DIR]
set -eu

here=$(cd "$(dirname "$0")" && pwd)
src="$here/mpi_allreduce_bench.c"
MPICC=${MPICC:-mpicc}
MPIRUN=${MPIRUN:-mpirun}
NRANKS=${NRANKS:-"2 4"}
MINBYTES=${MINBYTES:-8}
MAXBYTES=${MAXBYTES:-64M}
FACTOR=${FACTOR:-2}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
RANKS_AS=${RANKS_AS:-processes}
WINDOWS=${WINDOWS:-0}
case $RANKS_AS in processes|threads) ;; *) echo "bench-host-vs-mpi: RANKS_AS=$RANKS_AS: processes or threads" >&2; exit 2;; esac

if [ -n "${FLEXCOLL_PERF:-}" ]; then
  perf=$FLEXCOLL_PERF
elif [ $# -ge 1 ] && [ -x "$1/tools/flexcoll-perf" ]; then
  perf="$1/tools/flexcoll-perf"
elif [ -x ./tools/flexcoll-perf ]; then
  perf=./tools/flexcoll-perf
elif command -v flexcoll-perf >/dev/null 2>&1; then
  perf=$(command -v flexcoll-perf)
else
  echo "bench-host-vs-mpi: no flexcoll-perf (set FLEXCOLL_PERF or give the build directory)" >&2
  exit 2
fi
[ -r "$src" ] || { echo "bench-host-vs-mpi: $src is missing" >&2; exit 2; }
command -v "$MPICC" >/dev/null 2>&1 || { echo "bench-host-vs-mpi: no $MPICC (set MPICC)" >&2; exit 2; }
command -v "$MPIRUN" >/dev/null 2>&1 || { echo "bench-host-vs-mpi: no $MPIRUN (set MPIRUN)" >&2; exit 2; }

OUTDIR=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/bench-host-vs-mpi.XXXXXX")}
mkdir -p "$OUTDIR"
bin="$OUTDIR/mpi_allreduce_bench"
"$MPICC" -O2 -o "$bin" "$src"

cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
echo "# host: $(uname -n), $cores cores, $(uname -sr)"
echo "# MPI:      $("$MPIRUN" --version 2>/dev/null | head -n 1)"
echo "# flexcoll: $perf, ranks as $RANKS_AS, buffers $([ "$WINDOWS" = 1 ] && echo "in host windows (-R 1)" || echo "from malloc (-R 0)")"
echo "# sizes $MINBYTES..$MAXBYTES x$FACTOR, $ITERS timed calls after $WARMUP warm-up calls; raw output in $OUTDIR"

for n in $NRANKS; do
  args=${MPIRUN_ARGS-}
  if [ -z "${MPIRUN_ARGS+x}" ]; then
    [ "$n" -gt "$cores" ] && args="$args --oversubscribe"
    [ "$(id -u)" -eq 0 ] && args="$args --allow-run-as-root"
  fi
  # shellcheck disable=SC2086
  "$MPIRUN" $args -np "$n" "$bin" "$MINBYTES" "$MAXBYTES" "$FACTOR" "$ITERS" "$WARMUP" >"$OUTDIR/mpi-$n.txt"
  set -- -m host -R "$WINDOWS" -b "$MINBYTES" -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -J "$OUTDIR/flexcoll-$n.json"
  if [ "$RANKS_AS" = threads ]; then
    "$perf" -t "$n" "$@"
  else
    # A root port of its own per run: the previous run's may still be in TIME_WAIT.
    # shellcheck disable=SC2086
    FLEXCOLL_ROOT=127.0.0.1:$((20000 + ($$ + n) % 20000)) "$MPIRUN" $args -np "$n" "$perf" "$@"
  fi >"$OUTDIR/flexcoll-$n.txt" 2>"$OUTDIR/flexcoll-$n.err" || {
    echo "bench-host-vs-mpi: flexcoll-perf failed for $n ranks:" >&2
    cat "$OUTDIR/flexcoll-$n.err" >&2
    exit 1
  }
  echo
  echo "# AllReduce float32 sum, $n ranks: time per call (us), out of place"
  printf '%12s %14s %14s %10s %s\n' bytes "MPI_Allreduce" flexcoll "MPI/flexcoll" "flexcoll links"
  # flexcoll-perf rows: size count type redop root time algbw busbw #wrong ...; the JSON gives
  # the links' shares per size.
  awk -v json="$OUTDIR/flexcoll-$n.json" '
    FNR == NR { if ($1 !~ /^#/ && NF >= 4) mpi[$1] = $3; next }
    $1 !~ /^#/ && NF >= 9 && ($1 in mpi) && !seen[$1]++ { fc[$1] = $6; order[++k] = $1 }
    END {
      while ((getline line < json) > 0)
        if (match(line, /"bytes": [0-9]+/)) {
          b = substr(line, RSTART + 9, RLENGTH - 9)
          l = ""
          if (match(line, /"links": \{[^}]*\}/)) { l = substr(line, RSTART + 10, RLENGTH - 11); gsub(/"| /, "", l) }
          links[b] = l
        }
      for (i = 1; i <= k; i++) {
        b = order[i]
        printf "%12s %14.2f %14.2f %10.2f %s\n", b, mpi[b], fc[b], (fc[b] > 0 ? mpi[b] / fc[b] : 0), links[b]
      }
    }' "$OUTDIR/mpi-$n.txt" "$OUTDIR/flexcoll-$n.txt"
done
