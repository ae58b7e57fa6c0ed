#!/bin/sh
# tests/fuzz/run.sh [SECONDS]: build the bootstrap fuzzer (tests/fuzz/fuzz_bootstrap.c, libFuzzer,
# with ASan and UBSan) and run it for SECONDS (default 60) from the corpus in the tree.
# Exit 0: no crash; 1: a crash (the input is in tests/fuzz/artifacts/ of the build directory:
# `tests/fuzz/fuzz_bootstrap FILE` replays it); 77: skipped, no clang that links -fsanitize=fuzzer
# (Debian: apt-get install clang, and libclang-rt-dev where it exists).  `make fuzz` runs it
# (FUZZ_TIME=SECONDS).  CLANG=... picks the compiler.  New inputs found go to a scratch corpus in
# the build directory (tests/fuzz/work); `-merge=1` them into the tree's corpus by hand when useful.
set -eu
secs=${1:-60}
here=$(cd "$(dirname "$0")" && pwd)          # the source tree's tests/fuzz
src=$(cd "$here/../.." && pwd)
out=tests/fuzz                               # in the current (build) directory
clang=${CLANG:-clang}
mkdir -p "$out/work" "$out/artifacts"
flags="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
# $flags is split into words on purpose (here and below).
# shellcheck disable=SC2086
if ! command -v "$clang" >/dev/null 2>&1 ||
   ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
     "$clang" $flags -x c - -o "$out/probe" >/dev/null 2>&1; then
  echo "fuzz: SKIP: no $clang that links -fsanitize=fuzzer (Debian: apt-get install clang libclang-rt-dev, or clang-NN's libclang-common-NN-dev)"
  rm -f "$out/probe"
  exit 77
fi
rm -f "$out/probe"
# shellcheck disable=SC2086
"$clang" $flags -I"$src/include" -I"$src/lib" \
  "$src/tests/fuzz/fuzz_bootstrap.c" "$src/lib/bootstrap/wire.c" -o "$out/fuzz_bootstrap"
echo "fuzz: running tests/fuzz/fuzz_bootstrap for $secs s (corpus: tests/fuzz/corpus/bootstrap)"
# -rss_limit_mb and -malloc_limit_mb: a length from the wire that sizes an allocation is a crash.
if ! "$out/fuzz_bootstrap" -max_total_time="$secs" -timeout=10 -rss_limit_mb=1024 -malloc_limit_mb=64 \
     -artifact_prefix="$out/artifacts/" -print_final_stats=1 "$out/work" "$here/corpus/bootstrap" \
     >"$out/fuzz.log" 2>&1; then
  tail -n 40 "$out/fuzz.log"
  echo "fuzz: FAILED: the crashing input is in $out/artifacts/ (replay: $out/fuzz_bootstrap FILE)"
  exit 1
fi
grep -E '^(Done|stat::new_units_added)' "$out/fuzz.log" | sed 's/^/fuzz: /'
echo "fuzz: passed"
