#!/bin/sh
# The one registry of parameters (lib/param.c): every FLEXCOLL_* variable the library reads is in
# it and in flexcoll(7); flexcoll-info lists it, flags invalid values and refuses unknown options;
# FLEXCOLL_DEBUG=VERSION prints the version once per process.
set -u
src=${srcdir:-.}
info=${INFO:-./tools/flexcoll-info}
perf=${PERF:-./tools/flexcoll-perf}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_params.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# The variables named in lib/: "FLEXCOLL_X" string literals and FC_PARAM_INT(name, "X", ...).
{
  grep -rhoE --include='*.c' --include='*.h' --include='*.cu' '"FLEXCOLL_[A-Z0-9_]+' "$src/lib" | tr -d '"'
  grep -rhoE --include='*.c' --include='*.h' --include='*.cu' 'FC_PARAM_INT\([a-z0-9_]+, *"[A-Z0-9_]+"' "$src/lib" |
    sed 's/.*"\([A-Z0-9_]*\)"/FLEXCOLL_\1/'
} | grep -vx 'FLEXCOLL_ENV' | sort -u >"$tmp/vars"
[ "$(wc -l <"$tmp/vars")" -gt 20 ] && ok || bad "found only $(wc -l <"$tmp/vars") variables in $src/lib"
"$info" >"$tmp/info" 2>&1 || bad "flexcoll-info exited non-zero with a clean environment"
while read -r v; do
  grep -q "{\"$v\"," "$src/lib/param.c" && ok || bad "$v is read in lib/ but not in the registry (lib/param.c)"
  grep -qE "^\\.(B|BR|RB) .*\\<$v\\>" "$src/man/man7/flexcoll.7" && ok || bad "$v is read in lib/ but not in man/man7/flexcoll.7"
  grep -q "^  $v " "$tmp/info" && ok || bad "flexcoll-info does not list $v"
done <"$tmp/vars"

# The defaults: each FC_PARAM_INT's (the value the code uses) is the registry's where the registry
# gives a number (a default that depends on the run, such as "8M|1M", is text there).
grep -rhoE --include='*.c' --include='*.h' 'FC_PARAM_INT\([a-z0-9_]+, *"[A-Z0-9_]+", *[^)]+\)' "$src/lib" |
  sed 's/FC_PARAM_INT([a-z0-9_]*, *"\([A-Z0-9_]*\)", *\(.*\))$/\1 \2/' >"$tmp/defaults"
while read -r name expr; do
  [ "$name" = ENV ] && continue
  case $expr in [A-Z]*) expr=$(grep -rhE --include='*.h' "^#define $expr " "$src/lib" | awk '{print $3}' | head -n 1) ;; esac
  code=$(($expr))
  reg=$(sed -n "s/.*{\"FLEXCOLL_$name\", FC_PK_INT, \"\([^\"]*\)\".*/\1/p" "$src/lib/param.c")
  case $reg in
    '' ) bad "FLEXCOLL_$name: no FC_PK_INT entry in the registry" ;;
    *[!0-9-]*) ok ;;
    *) [ "$reg" -eq "$code" ] && ok || bad "FLEXCOLL_$name: the registry says $reg, the code $expr = $code" ;;
  esac
done <"$tmp/defaults"
[ "$(wc -l <"$tmp/defaults")" -gt 15 ] && ok || bad "found only $(wc -l <"$tmp/defaults") FC_PARAM_INT definitions"

# Invalid values are flagged (exit 1), the secret never printed, unknown options refused (exit 2).
env -i PATH="$PATH" FLEXCOLL_ALGO=foo FLEXCOLL_TIMEOUT_MS=abc FLEXCOLL_BOOTSTRAP_SECRET=hush "$info" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] && ok || bad "flexcoll-info with invalid values: exit $rc, want 1"
grep -q 'FLEXCOLL_ALGO .*foo.*INVALID' "$tmp/out" && ok || bad "FLEXCOLL_ALGO=foo not flagged invalid"
grep -q 'FLEXCOLL_TIMEOUT_MS .*abc.*INVALID' "$tmp/out" && ok || bad "FLEXCOLL_TIMEOUT_MS=abc not flagged invalid"
grep -q hush "$tmp/out" && bad "the secret was printed" || ok
grep -q '^Bootstrap interface: ' "$tmp/out" && ok || bad "no bootstrap interface line"
grep -q 'no GPU: \|^GPUs: [1-9]' "$tmp/out" && ok || bad "no GPU, and no reason why"
# A list of distinct words (FLEXCOLL_RING_LANE): each one a choice, none twice, at least one.
for v in pcie rdma pcie,rdma rdma,pcie; do
  env -i PATH="$PATH" FLEXCOLL_RING_LANE=$v "$info" >"$tmp/out" 2>&1
  grep -q 'FLEXCOLL_RING_LANE .*INVALID' "$tmp/out" && bad "FLEXCOLL_RING_LANE=$v flagged invalid" || ok
done
for v in nvlink pcie,pcie pcie,tcp ,; do
  env -i PATH="$PATH" FLEXCOLL_RING_LANE=$v "$info" >"$tmp/out" 2>&1
  grep -q 'FLEXCOLL_RING_LANE .*INVALID' "$tmp/out" && ok || bad "FLEXCOLL_RING_LANE=$v not flagged invalid"
done
"$info" --bogus >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "unknown option '--bogus'" "$tmp/out" && ok || bad "flexcoll-info --bogus: exit $rc, want 2 and a message"

# FLEXCOLL_DEBUG=VERSION: one version line per process, however many communicators.
FLEXCOLL_DEBUG=VERSION "$perf" -m host -t 3 -e 64 -n 1 -w 0 >"$tmp/out" 2>"$tmp/err"
n=$(grep -c 'flexcoll INFO flexcoll version [0-9]' "$tmp/err")
[ "$n" -eq 1 ] && ok || { bad "FLEXCOLL_DEBUG=VERSION printed $n version lines, want 1:"; cat "$tmp/err"; }

echo "test_params: $pass passed, $fail failed"
[ $fail -eq 0 ]
