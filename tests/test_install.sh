#!/bin/sh
# `make install` gives a user what the README promises: a man3 page for every public function of
# flexcoll.h, the tools' man1 pages, the overview and NCCL-shim man7 pages, every page of man/, and
# tools that run.  It installs into a DESTDIR in the build tree, so it needs no rights and leaves
# the configured prefix alone (distcheck runs it in a VPATH build with a read-only source tree).
# The Makefile passes MAKE, prefix, bindir, libdir and mandir; srcdir comes from the test harness.
set -u
: "${srcdir:=.}" "${MAKE:=make}"
for v in bindir libdir mandir; do
  eval "test -n \"\${$v:-}\"" || { echo "test_install: \$$v not set (run through make check)"; exit 99; }
done

dest=$(pwd)/tests/install-root.$$
trap 'rm -rf "$dest" "$dest.log"' EXIT
trap 'exit 1' INT TERM
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# The test runs inside `make check`: a fresh make, not a job of the outer one's jobserver.
if ! env MAKEFLAGS= MFLAGS= $MAKE install DESTDIR="$dest" >"$dest.log" 2>&1; then
  cat "$dest.log"; echo "FAIL: make install DESTDIR=$dest"; exit 1
fi
man="$dest$mandir"

# Every function the header declares (a return type, then the name and its parenthesis).
funcs=$(grep -E '^[A-Za-z_][A-Za-z0-9_ ]*[ *]flexcoll_[a-z0-9_]+\(' "$srcdir/include/flexcoll.h" |
        sed -E 's/^[^(]*[ *](flexcoll_[a-z0-9_]+)\(.*/\1/' | sort -u)
n=$(echo "$funcs" | grep -c flexcoll_)
test "$n" -ge 20 || bad "found only $n functions in flexcoll.h: has its layout changed?"
# A page may be a `.so` link to the page that documents a family of functions: follow it.
resolve() { sed -n '1s/^\.so  *//p' "$1"; }
for f in $funcs; do
  page="$man/man3/$f.3"
  test -s "$page" || { bad "no man page for $f: $page"; continue; }
  target=$(resolve "$page")
  if test -n "$target"; then
    page="$man/$target"
    test -s "$page" || { bad "$f.3 links to $target, which is not installed"; continue; }
  fi
  grep -q "$f" "$page" || bad "$page does not name $f"
done

for page in man1/flexcoll-perf.1 man1/flexcoll-info.1 man7/flexcoll.7 man7/flexcoll-nccl.7; do
  test -s "$man/$page" || bad "$page not installed"
done
# A page added to man/ but not to Makefile.am's dist_man_MANS would be shipped nowhere.
for src in "$srcdir"/man/man*/*.[0-9]; do
  rel=${src#"$srcdir"/man/}
  test -s "$man/$rel" || bad "man/$rel is not installed (add it to dist_man_MANS)"
done
for page in "$man"/man*/*.[0-9]; do
  test -n "$(resolve "$page")" || head -n 20 "$page" | grep -q '^\.TH ' || bad "$page has no .TH line"
done

# The installed library must know where it was installed: a stale libdir (a reconfigure with another
# --prefix that did not relink) leaves tools that look for libflexcoll.so.0 in the old prefix.
la="$dest$libdir/libflexcoll.la"
test -f "$la" || bad "$la not installed"
test -f "$la" && ! grep -qx "libdir='$libdir'" "$la" && bad "$la records $(grep ^libdir= "$la"), not '$libdir'"
in_loader_path() {
  case "$1" in /lib|/usr/lib|/lib64|/usr/lib64) return 0 ;; esac
  cat /etc/ld.so.conf /etc/ld.so.conf.d/*.conf 2>/dev/null | grep -qx "$1"
}
perf="$dest$bindir/flexcoll-perf"
if command -v readelf >/dev/null && ! in_loader_path "$libdir"; then
  readelf -d "$perf" | grep -E 'R(UN)?PATH' | grep -q "[[:punct:]]$libdir[]:]" ||
    bad "installed flexcoll-perf has no run path to $libdir: $(readelf -d "$perf" | grep -E 'R(UN)?PATH')"
fi
# libibverbs is loaded at run time (lib/transports/verbs.h): neither the library nor its users'
# link lines (the .la, flexcoll.pc) may name it, or a machine without rdma-core could not load it.
if command -v readelf >/dev/null; then
  needs=$(find "$dest$libdir" -type f \( -name '*.so' -o -name '*.so.*' \) -exec sh -c \
    'readelf -d "$1" | grep NEEDED | grep -q ibverbs && echo "$1"' sh {} \;)
  test -z "$needs" || bad "needs libibverbs at load time: $needs"
fi
for f in "$la" "$dest$libdir/pkgconfig/flexcoll.pc"; do
  test -f "$f" && grep -q ibverbs "$f" && bad "$f links libibverbs: $(grep ibverbs "$f")"
done
# The tools run from the install, in a clean environment (the library from the DESTDIR copy).
for t in flexcoll-perf flexcoll-info; do
  out=$(env -i LD_LIBRARY_PATH="$dest$libdir" "$dest$bindir/$t" --help 2>&1) ||
    bad "installed $t --help failed: $out"
done

test $fail = 0 && echo "test_install: $n functions with pages, man1/man7 pages and tools installed"
exit $fail
