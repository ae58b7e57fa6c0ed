#!/bin/sh
# run-drop-in.sh — the NCCL drop-in checked by real clients, in one command: PyTorch through the
# shim (tests/torch_shim.py: every collective, send/recv, all_to_all_single, new_group, 20 DDP
# steps against gloo, a CUDA graph replayed 100 times) and NVIDIA's nccl-tests, unmodified
# (tools/run-nccl-tests.sh: every benchmark with its result check, one rank, from a CUDA graph,
# and with MPI several ranks on GPU 0).
#
# usage: tools/run-drop-in.sh NCCL_TESTS_SRC [FLEXCOLL_BUILD]
#   NCCL_TESTS_SRC   a copy of https://github.com/NVIDIA/nccl-tests
#   FLEXCOLL_BUILD   a build configured with --enable-nccl-shim (default: .)
# environment: as tools/run-nccl-tests.sh (NRANKS, MPI_HOME, MAXBYTES, ...); PYTHON (python3).
# With fewer than 2 GPUs the PyTorch processes share GPU 0 (FC_TORCH_SAME_GPU=1).
# Exit status 0 only when both passed; 77 when there is no GPU or no PyTorch (and nothing failed).
set -u
src=${1:?usage: run-drop-in.sh NCCL_TESTS_SRC [FLEXCOLL_BUILD]}
build=$(cd "${2:-.}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
shim=$build/shim/.libs/libnccl.so.2
[ -f "$shim" ] || { echo "run-drop-in: no $shim: configure flexcoll with --enable-nccl-shim and make" >&2; exit 2; }
ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpus" -gt 0 ] || { echo "run-drop-in: no GPU here"; exit 77; }
export NCCL_NVLS_ENABLE=0

echo "run-drop-in: PyTorch through the shim ($ngpus GPU(s))"
same=0; [ "$ngpus" -lt 2 ] && same=1
FC_TORCH_SAME_GPU=$same LD_PRELOAD=$shim "$python" "$here/../tests/torch_shim.py"
torch=$?
echo "run-drop-in: nccl-tests"
sh "$here/run-nccl-tests.sh" "$src" "$build"
nt=$?
echo "run-drop-in: PyTorch $([ $torch = 0 ] && echo PASS || { [ $torch = 77 ] && echo SKIP || echo FAIL; }) (exit $torch), nccl-tests $([ $nt = 0 ] && echo PASS || echo FAIL) (exit $nt)"
[ $nt = 0 ] || exit 1
[ $torch = 77 ] && exit 77   # nccl-tests passed, PyTorch could not run here
[ $torch = 0 ] || exit 1
exit 0
