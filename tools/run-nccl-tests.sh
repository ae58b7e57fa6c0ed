#!/bin/sh
# run-nccl-tests.sh — NVIDIA's nccl-tests, unmodified, built against flexcoll's NCCL shim and run
# with their own result check (-c 1): every benchmark with one rank, the same from a CUDA graph
# (-G 10), and, with MPI, several ranks sharing GPU 0 (NCCL_TESTS_DEVICE=0).
#
# usage: tools/run-nccl-tests.sh NCCL_TESTS_SRC [FLEXCOLL_BUILD]
#   NCCL_TESTS_SRC   a copy of https://github.com/NVIDIA/nccl-tests (not part of flexcoll; it is
#                    copied, never changed)
#   FLEXCOLL_BUILD   a flexcoll build configured with --enable-nccl-shim (default: .), whose
#                    shim/nccl.h and shim/.libs/libnccl.so.2 the benchmarks are built and run with
# environment: NRANKS ("2 3 4": MPI rank counts; empty: none), MAXBYTES (8M), MPIRUN (mpirun),
#   MPI_HOME (with mpicc: build with MPI=1), NVCC_GENCODE (sm_90), OUTDIR (a new temporary folder),
#   BENCHMARKS (every *_perf that was built).
# Prints one line per benchmark and mode and a summary; exit status 0 only when every run exited
# 0 and reported "Out of bounds values : 0 OK".
set -u
src=${1:?usage: run-nccl-tests.sh NCCL_TESTS_SRC [FLEXCOLL_BUILD]}
build=$(cd "${2:-.}" && pwd)
src=$(cd "$src" && pwd)
out=${OUTDIR:-$(mktemp -d /tmp/nccl-tests-flexcoll.XXXXXX)}
maxbytes=${MAXBYTES:-8M}
nranks=${NRANKS-2 3 4}
mpirun=${MPIRUN:-mpirun}
gencode=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}

shim_lib=$build/shim/.libs/libnccl.so.2
[ -f "$shim_lib" ] || { echo "run-nccl-tests: no $shim_lib: configure flexcoll with --enable-nccl-shim and make" >&2; exit 2; }
# An NCCL_HOME of the shim's header and library, as nccl-tests' Makefile expects one.
home=$out/nccl-home
mkdir -p "$home/include" "$home/lib"
# The header: in the build folder (an in-tree build), else beside this script (the sources).
hdr=$build/shim/nccl.h
[ -f "$hdr" ] || hdr=$(cd "$(dirname "$0")/.." && pwd)/shim/nccl.h
cp "$hdr" "$home/include/nccl.h"
ln -sf "$shim_lib" "$home/lib/libnccl.so.2"
ln -sf "$shim_lib" "$home/lib/libnccl.so"

mpi=0
if [ -n "$nranks" ] && [ -n "${MPI_HOME:-}" ] && [ -x "$MPI_HOME/bin/mpicc" ]; then mpi=1; fi
if [ -n "$nranks" ] && [ $mpi = 0 ]; then
  echo "run-nccl-tests: no MPI_HOME with bin/mpicc: the multi-rank runs are left out" >&2
  nranks=
fi

echo "run-nccl-tests: building $src in $out/src (MPI=$mpi)"
cp -r "$src" "$out/src"
if ! make -C "$out/src" -j"$(nproc)" MPI=$mpi ${MPI_HOME:+MPI_HOME=$MPI_HOME} NCCL_HOME="$home" \
     NVCC_GENCODE="$gencode" > "$out/build.log" 2>&1; then
  echo "run-nccl-tests: the build failed (some benchmarks may still have been built); see $out/build.log" >&2
  grep -E "error|undefined" "$out/build.log" | head -20 >&2
fi
bins=$out/src/build
export LD_LIBRARY_PATH="$home/lib:$build/lib/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0

failed=0 runs=0
run() { # label, command...
  label=$1; shift
  log=$out/$(echo "$label" | tr ' /=' '___').log
  runs=$((runs + 1))
  if timeout 300 "$@" > "$log" 2>&1 && grep -q "Out of bounds values : 0 OK" "$log"; then
    printf '%-44s PASS\n' "$label"
  else
    failed=$((failed + 1))
    printf '%-44s FAIL  (%s)\n' "$label" "$log"
    tail -3 "$log" | sed 's/^/    /'
  fi
}

benches=${BENCHMARKS:-$(cd "$bins" 2>/dev/null && ls *_perf 2>/dev/null)}
for b in $benches; do
  [ -x "$bins/$b" ] || { echo "$b: not built"; failed=$((failed + 1)); continue; }
  run "$b 1 rank" "$bins/$b" -b 8 -e "$maxbytes" -f 8 -g 1 -c 1
  run "$b 1 rank -G 10" "$bins/$b" -b 8 -e "$maxbytes" -f 8 -g 1 -c 1 -G 10
  for n in $nranks; do
    run "$b $n ranks on GPU 0" env NCCL_TESTS_DEVICE=0 "$mpirun" --allow-run-as-root --oversubscribe -n "$n" \
      -x LD_LIBRARY_PATH -x NCCL_TESTS_DEVICE -x NCCL_NVLS_ENABLE "$bins/$b" -b 8 -e "$maxbytes" -f 8 -g 1 -c 1
  done
done
echo "run-nccl-tests: $((runs - failed)) of $runs runs passed; logs in $out"
[ $failed = 0 ]
