#!/bin/sh
# measure-gpus.sh — the multi-GPU measurements of issues 18 and 19 in as few device calls as
# possible: flexcoll against NCCL in the same run, one process per GPU, every table into OUTDIR.
#
# Parts (PARTS, in this order by default; each bounded by TIMEOUT seconds per run):
#   topo     nvidia-smi topo -m, flexcoll-info
#   sweep    flexcoll-perf --baseline nccl for each collective of COLLS, MINBYTES..MAXBYTES:
#            -R 0 (flexcoll without windows against NCCL unregistered) and -R 1 (flexcoll windows
#            against NCCL symmetric windows); out of place and in place; one process per GPU
#            under $MPIRUN, else the GPUs as threads of one process (--nranks)
#   links    AllReduce and AllGather 64 MB..MAXBYTES with FLEXCOLL_LINKS=nvlink and with every
#            link (the shares printed per size)
#   stage2   the all-links AllGather sweep again while tools/staged_copy_bench.py copies through
#            host memory on GPU 0 (stage 2 must move the pcie share down)
#   graph    8 B..1 MB AllReduce from CUDA graphs (-G 20), flexcoll against NCCL, both modes
#   moe      MoE dispatch and combine (hidden 7168 bf16, top_k 8, 256 experts) eager and -G 10
#   algos    AllReduce and AllGather with FLEXCOLL_ALGO=ring and =tree forced, against the tuner
# Every output file is kept in OUTDIR; a one-line summary per run goes to stdout.
#
# usage: tools/measure-gpus.sh BUILD_DIR
# environment: NGPUS (all), PARTS, COLLS ("allreduce allgather reduce_scatter broadcast alltoall"),
#   MINBYTES (8), MAXBYTES (1G), ITERS (20), WARMUP (5), TIMEOUT (300), MPIRUN (mpirun if on PATH;
#   "none" for threads), OUTDIR (a new temporary folder).  NCCL_NVLS_ENABLE=0 is always set.
set -u
build=$(cd "${1:?usage: tools/measure-gpus.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
perf=$build/tools/flexcoll-perf
[ -x "$perf" ] || { echo "measure-gpus: no $perf" >&2; exit 2; }
ngpus=${NGPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
[ "$ngpus" -ge 2 ] 2>/dev/null || { echo "measure-gpus: needs 2 or more GPUs (found ${ngpus:-0})"; exit 77; }
parts=${PARTS:-topo sweep links stage2 graph moe algos}
colls=${COLLS:-allreduce allgather reduce_scatter broadcast alltoall}
minb=${MINBYTES:-8} maxb=${MAXBYTES:-1G} iters=${ITERS:-20} warm=${WARMUP:-5} limit=${TIMEOUT:-300}
out=${OUTDIR:-$(mktemp -d "${TMPDIR:-/tmp}/measure-gpus.XXXXXX")}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
mpirun=${MPIRUN:-$(command -v mpirun || echo none)}
port=$((22000 + $$ % 8000))

# One flexcoll-perf run over the GPUs: processes under $mpirun, else threads; output to $out/$1.
run() {
  name=$1
  shift
  port=$((port + 1))
  if [ "$mpirun" != none ]; then
    args=""
    [ "$(id -u)" -eq 0 ] && args="--allow-run-as-root"
    # shellcheck disable=SC2086
    FLEXCOLL_ROOT=127.0.0.1:$port timeout "$limit" "$mpirun" $args -np "$ngpus" "$perf" "$@" >"$out/$name.txt" 2>"$out/$name.err"
  else
    timeout "$limit" "$perf" --nranks "$ngpus" "$@" >"$out/$name.txt" 2>"$out/$name.err"
  fi
  rc=$?
  avg=$(grep -h "Avg bus bandwidth" "$out/$name.txt" | awk '{print $NF}')
  printf '%-40s rc=%d  avg busbw %s GB/s\n' "$name" "$rc" "${avg:-?}"
}

for part in $parts; do
  case $part in
    topo)
      nvidia-smi topo -m >"$out/topo.txt" 2>&1
      "$build/tools/flexcoll-info" >"$out/info.txt" 2>&1
      echo "topo: $out/topo.txt $out/info.txt" ;;
    sweep)
      for c in $colls; do
        for R in 0 1; do run "sweep-$c-R$R" --coll "$c" -b "$minb" -e "$maxb" -f 2 -n "$iters" -w "$warm" -R "$R" -c 1 --baseline nccl -J "$out/sweep-$c-R$R.json"; done
      done ;;
    links)
      for c in allreduce allgather; do
        FLEXCOLL_LINKS=nvlink run "links-$c-nvlink" --coll "$c" -b 64M -e "$maxb" -f 2 -n "$iters" -w "$warm" -c 1
        run "links-$c-all" --coll "$c" -b 64M -e "$maxb" -f 2 -n "$iters" -w "$warm" -c 1
      done ;;
    stage2)
      python3 "$here/staged_copy_bench.py" >"$out/stage2-copy.txt" 2>&1 &
      copy=$!
      FLEXCOLL_DEBUG=INFO FLEXCOLL_DEBUG_SUBSYS=SCHED run stage2-allgather-all --coll allgather -b 256M -e 256M -n 200 -w 5 -c 1
      kill "$copy" 2>/dev/null
      wait "$copy" 2>/dev/null ;;
    graph)
      for R in 0 1; do run "graph-allreduce-R$R" --coll allreduce -b 8 -e 1M -f 2 -n 20 -w 5 -G 20 -R "$R" -c 1 --baseline nccl; done ;;
    moe)
      for G in 0 10; do
        for c in moe_dispatch moe_combine; do run "moe-$c-G$G" --coll "$c" --tokens 4096 -f 2 -n "$iters" -w "$warm" -G "$G" -c 1; done
      done ;;
    algos)
      for c in allreduce allgather; do
        for a in ring tree; do FLEXCOLL_ALGO=$a run "algo-$c-$a" --coll "$c" -b "$minb" -e "$maxb" -f 4 -n "$iters" -w "$warm" -c 1; done
        run "algo-$c-auto" --coll "$c" -b "$minb" -e "$maxb" -f 4 -n "$iters" -w "$warm" -c 1
      done ;;
    *) echo "measure-gpus: unknown part $part" >&2; exit 2 ;;
  esac
done
echo "measure-gpus: outputs in $out"
