#!/bin/sh
# flexcoll-perf --plot FILE.png on a small host-memory sweep writes a PNG: the signature, then an
# IHDR chunk with the image's size (1000 wide; 600 high, or 940 with the links panel).  Skipped
# (77) where flexcoll-perf was built without zlib, which it says.
set -u
perf=${PERF:-./tools/flexcoll-perf}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_perf_plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM

"$perf" -m host -t 2 -b 1K -e 64K -n 2 -w 1 --plot "$tmp/p.png" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && grep -q 'built without zlib' "$tmp/err"; then
  echo "test_perf_plot: skipped: $(cat "$tmp/err")"
  exit 77
fi
# The first 24 bytes: signature (8), IHDR length (4) and type (4), width (4), height (4).
head=$(od -An -tx1 -N24 "$tmp/p.png" 2>/dev/null | tr -d ' \n')
want="89504e470d0a1a0a0000000d49484452000003e800000258"
if [ $rc -eq 0 ] && [ "$head" = "$want" ] && grep -q '^# Avg bus bandwidth' "$tmp/out"; then
  echo "test_perf_plot: PNG written ($(wc -c <"$tmp/p.png") bytes)"
  exit 0
fi
echo "FAIL: flexcoll-perf --plot: exit $rc, first bytes $head (want $want)"
sed 's/^/    /' "$tmp/err" "$tmp/out"
exit 1
