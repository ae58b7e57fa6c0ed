#!/bin/sh
# node-prebuilt.sh — run flexcoll's tools on the GPU node without building there.
#
# A cold start of the lent GPU machine spends about 100 s of its device time in node-build
# (configure, make) before anything is measured.  Benchmark runs need only the library and the
# tools, which this machine can build with CUDA itself (nvcc, no GPU needed): this script builds
# the `make dist` tarball here, installs it under .gpu/inst with that path as its prefix (the node
# runs the command from a copy of the repository at the same path), strips it and leaves out what
# a benchmark does not need (static library, headers, flexcoll-info: CUDA's static runtime makes
# each binary some 25 MB, and the carry limit is 64 MiB).  UCX with CUDA comes from .gpu/ucx,
# which ../shared/gpu-node/bundle makes.
#
#   tools/node-prebuilt.sh build          here, in the project root (after the bundle)
#   tools/node-prebuilt.sh run CMD...     on the node: CMD with the prebuilt tools on PATH and
#                                         their libraries found; FLEXCOLL_BUILD names a folder
#                                         whose tools/flexcoll-perf is the prebuilt one (for
#                                         scripts that take a build folder, e.g. ce-lane-modes.sh)
# device `run` with carry [".gpu/inst", ".gpu/ucx"] and command `sh tools/node-prebuilt.sh run CMD`.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
inst=$root/.gpu/inst
case "${1:-}" in
build)
  tarball=$(ls "$root"/.gpu/*.tar.gz 2>/dev/null | head -1)
  [ -n "$tarball" ] || { echo "node-prebuilt: no tarball in .gpu (run ../shared/gpu-node/bundle first)" >&2; exit 2; }
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || { echo "node-prebuilt: no nvcc here" >&2; exit 2; }
  work=$(mktemp -d "${TMPDIR:-/tmp}/node-prebuilt.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  tar xzf "$tarball" -C "$work"
  cd "$work"/*/
  ./configure --prefix="$inst" >"$work/configure.log" 2>&1 || { tail -20 "$work/configure.log"; exit 3; }
  grep -q 'define HAVE_CUDA 1' config.h || { echo "node-prebuilt: configure found no CUDA" >&2; exit 3; }
  make -j"$(nproc)" >"$work/make.log" 2>&1 || { grep -iE 'error' "$work/make.log" | head -20; exit 4; }
  rm -rf "$inst"
  make install >"$work/install.log" 2>&1 || { tail -20 "$work/install.log"; exit 4; }
  rm -rf "$inst/include" "$inst/share" "$inst/lib/pkgconfig" "$inst"/lib/*.a "$inst"/lib/*.la "$inst/bin/flexcoll-info"
  strip --strip-unneeded "$inst"/lib/libflexcoll.so.* "$inst"/bin/* 2>/dev/null || true
  echo "node-prebuilt: $(du -sh "$inst" | cut -f1) in $inst; carry [\".gpu/inst\", \".gpu/ucx\"]"
  ;;
run)
  shift
  [ -x "$inst/bin/flexcoll-perf" ] || { echo "node-prebuilt: no $inst/bin/flexcoll-perf (carry .gpu/inst)" >&2; exit 2; }
  ucx=$root/.gpu/ucx
  LD_LIBRARY_PATH=$ucx/libucx/lib:$ucx/libucx_cu13.libs:$inst/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  PATH=$inst/bin:$PATH
  FLEXCOLL_BUILD=$(mktemp -d "${TMPDIR:-/tmp}/node-prebuilt.XXXXXX")
  mkdir -p "$FLEXCOLL_BUILD/tools"
  ln -s "$inst/bin/flexcoll-perf" "$FLEXCOLL_BUILD/tools/flexcoll-perf"
  export LD_LIBRARY_PATH PATH FLEXCOLL_BUILD NCCL_NVLS_ENABLE=0
  "$@"
  ;;
*)
  echo "usage: tools/node-prebuilt.sh build | run CMD..." >&2
  exit 2
  ;;
esac
