#!/usr/bin/env python3
"""torch_shim.py -- PyTorch's NCCL backend running on flexcoll's NCCL shim, 2 processes on 2 GPUs.

Run it on a GPU node with the shim preloaded, so that PyTorch's libtorch_cuda.so binds to the
shim instead of NVIDIA's libnccl.so.2 (same soname: the dynamic linker takes the preloaded one):

    LD_PRELOAD=<build>/shim/.libs/libnccl.so.2 FLEXCOLL_DEBUG=INFO python3 tests/torch_shim.py

Two processes (torch.multiprocessing spawn, backend "nccl", env:// rendezvous on a free port) run
all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, send/recv,
batch_isend_irecv, all_to_all_single (equal and unequal splits) and barrier on CUDA tensors,
all_reduce on a new_group, 20 steps of DistributedDataParallel (losses against the same run on a
gloo group, to 1e-5) and an all_reduce captured with torch.cuda.graph and replayed 100 times with
new inputs, and check every answer.  To show that flexcoll did the work, each process also reports
  - where the process's global symbol lookup (the one that bound libtorch_cuda.so's NCCL imports)
    finds ncclAllReduce (dladdr): the shim (PyTorch may also map NVIDIA's libnccl from its wheel,
    listed from /proc/self/maps; with the shim preloaded its symbols are never the ones bound);
  - what ncclGetVersion found that way returns: 22800, i.e. NCCL (2, 28, 0);
and the parent collects the FLEXCOLL_DEBUG log of both processes (FLEXCOLL_DEBUG_FILE, one file
per process) and requires flexcoll's INFO lines for both ranks' communicators.
torch.cuda.nccl.version() is printed too, but PyTorch computes it from the NCCL headers it was
compiled with, not from the library it runs with, so it proves nothing about the shim.

FC_TORCH_SAME_GPU=1 puts both processes on GPU 0 (for a machine with one GPU).

Exit status: 0 pass, 1 fail, 77 skipped (no torch, or fewer than 2 GPUs).
"""
import ctypes
import datetime
import glob
import json
import os
import socket
import sys
import tempfile
import time
import traceback

SKIP = 77
TIMEOUT_S = 300


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mapped_nccl_libraries():
    """The libnccl files mapped into this process, by their real paths."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "libnccl" in os.path.basename(fields[5]):
                paths.add(os.path.realpath(fields[5]))
    return sorted(paths)


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def bound_nccl():
    """Where the process's global symbol lookup -- the one that bound libtorch_cuda.so's NCCL
    imports -- finds ncclAllReduce, and what ncclGetVersion found that way returns."""
    glob_ns = ctypes.CDLL(None)
    libc = ctypes.CDLL("libc.so.6")
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    info = DlInfo()
    addr = ctypes.cast(glob_ns.ncclAllReduce, ctypes.c_void_p).value
    path = os.path.realpath(info.dli_fname.decode()) if libc.dladdr(addr, ctypes.byref(info)) and info.dli_fname else None
    version = ctypes.c_int(-1)
    res = glob_ns.ncclGetVersion(ctypes.byref(version))
    return path, [res, version.value]


class Checks:
    def __init__(self, rank):
        self.rank = rank
        self.results = []

    def close(self, name, got, want, atol=0.0):
        import torch

        got = got.detach().to("cpu", torch.float64)
        want = want.detach().to("cpu", torch.float64)
        ok = got.shape == want.shape and bool(torch.allclose(got, want, rtol=0.0, atol=atol))
        detail = ""
        if not ok:
            bad = (got - want).abs() > atol if got.shape == want.shape else None
            first = int(bad.nonzero()[0][0]) if bad is not None and bad.any() else -1
            detail = "shape %s vs %s, first bad element %d: %s vs %s" % (
                tuple(got.shape), tuple(want.shape), first,
                got.flatten()[first].item() if first >= 0 else "-", want.flatten()[first].item() if first >= 0 else "-")
        self.results.append({"name": name, "ok": ok, "detail": detail})
        # As it goes, so that a run that hangs shows how far each rank got.
        print("rank %d: %s %s" % (self.rank, "ok" if ok else "FAIL", name), file=sys.stderr, flush=True)


def run_collectives(rank, world, checks):
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", gpu_of(rank))
    n = 1 << 16
    ar = torch.arange(n, dtype=torch.float64, device=dev)

    t = (ar + 1000 * rank).to(torch.float32)
    dist.all_reduce(t)
    checks.close("all_reduce float32 sum", t, world * ar + 1000 * sum(range(world)))

    t = ((ar % 7) + rank).to(torch.bfloat16)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    checks.close("all_reduce bfloat16 avg", t, (ar % 7) + (world - 1) / 2, atol=0.05)

    t = (ar.to(torch.int64) * (rank + 1)) % 1001
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    checks.close("all_reduce int64 max", t,
                 torch.stack([(ar.to(torch.int64) * (r + 1)) % 1001 for r in range(world)]).max(0).values)

    inp = (ar[:4099] * 3 + rank).to(torch.float16)
    out = torch.empty(world * 4099, dtype=torch.float16, device=dev)
    dist.all_gather_into_tensor(out, inp)
    checks.close("all_gather_into_tensor float16", out,
                 torch.cat([(ar[:4099] * 3 + r).to(torch.float16) for r in range(world)]))

    chunk = 5000
    inp = (torch.arange(world * chunk, dtype=torch.float64, device=dev) * (rank + 1)).to(torch.float32)
    out = torch.empty(chunk, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    base = torch.arange(rank * chunk, (rank + 1) * chunk, dtype=torch.float64, device=dev)
    checks.close("reduce_scatter_tensor float32 sum", out, base * sum(r + 1 for r in range(world)))

    gen = torch.Generator(device="cpu").manual_seed(1234)
    ref = torch.randn(77777, generator=gen, dtype=torch.float32).to(dev)
    t = ref.clone() if rank == 1 else torch.zeros_like(ref)
    dist.broadcast(t, src=1)
    checks.close("broadcast float32 from rank 1", t, ref)

    run_point_to_point(rank, world, checks, dev)
    run_all_to_all(rank, world, checks, dev)

    t = torch.ones(1, device=dev)
    dist.barrier()
    dist.all_reduce(t)
    checks.close("barrier, then all_reduce", t, torch.full((1,), float(world)))
    torch.cuda.synchronize(dev)

    run_new_group(rank, world, checks, dev)
    run_ddp(rank, world, checks, dev)
    run_graph(rank, world, checks, dev)


def run_new_group(rank, world, checks, dev):
    """A subgroup (PyTorch builds it with ncclCommSplit or a new communicator)."""
    import torch
    import torch.distributed as dist

    members = list(range(world - 1, -1, -1))  # every rank, in reverse order
    sub = dist.new_group(members)
    t = torch.full((4099,), float(rank + 1), device=dev)
    dist.all_reduce(t, group=sub)
    checks.close("new_group all_reduce", t, torch.full((4099,), float(sum(range(1, world + 1)))))


def run_ddp(rank, world, checks, dev):
    """20 steps of DistributedDataParallel on the shim against the same run on gloo (the reference
    where NCCL cannot have two ranks on one GPU): losses equal to 1e-5."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(list(range(world)), backend="gloo")

    def train(group):
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(dev)
        ddp = DDP(model, device_ids=[dev.index], process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator(device="cpu").manual_seed(100 + rank)
        losses = []
        for _ in range(20):
            x = torch.randn(16, 32, generator=gen).to(dev)
            y = x.sum(1, keepdim=True).sin()
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.tensor(losses, dtype=torch.float64)

    on_shim = train(None)
    on_gloo = train(gloo)
    checks.close("DDP 20 steps: losses on the shim = on gloo", on_shim, on_gloo, atol=1e-5)


def run_graph(rank, world, checks, dev):
    """all_reduce captured with torch.cuda.graph, replayed 100 times with new inputs."""
    import torch
    import torch.distributed as dist

    n = 1 << 14
    static = torch.zeros(n, device=dev)
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):  # warm up outside the capture, as PyTorch asks
        for _ in range(3):
            dist.all_reduce(static)
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
    ramp = torch.arange(n, dtype=torch.float32, device=dev)
    bad = 0
    for i in range(100):
        static.copy_(ramp * (rank + 1) + i)
        graph.replay()
        want = ramp * sum(range(1, world + 1)) + i * world
        bad += int((static != want).sum().item())
    checks.close("torch.cuda.graph all_reduce replayed 100 times: wrong elements", torch.tensor([float(bad)]),
                 torch.tensor([0.0]))


def run_point_to_point(rank, world, checks, dev):
    import torch
    import torch.distributed as dist

    payload = lambda src: torch.arange(10007, dtype=torch.float64, device=dev) * (src + 2) - src
    if rank == 0:
        dist.send(payload(0).to(torch.float32), dst=1)
        t = torch.empty(10007, dtype=torch.float32, device=dev)
        dist.recv(t, src=1)
        checks.close("send/recv: rank 0 receives from 1", t, payload(1))
    elif rank == 1:
        t = torch.empty(10007, dtype=torch.float32, device=dev)
        dist.recv(t, src=0)
        checks.close("send/recv: rank 1 receives from 0", t, payload(0))
        dist.send(payload(1).to(torch.float32), dst=0)

    right, left = (rank + 1) % world, (rank - 1) % world
    send = (torch.arange(3001, device=dev, dtype=torch.int64) + 100 * rank).to(torch.int32)
    recv = torch.empty(3001, dtype=torch.int32, device=dev)
    ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    checks.close("batch_isend_irecv ring", recv, torch.arange(3001, device=dev, dtype=torch.int64) + 100 * left)


def run_all_to_all(rank, world, checks, dev):
    import torch
    import torch.distributed as dist

    count = 1000
    inp = torch.arange(world * count, dtype=torch.float32, device=dev) + 100000 * rank
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(rank * count, (rank + 1) * count, dtype=torch.float32, device=dev) + 100000 * r
                      for r in range(world)])
    checks.close("all_to_all_single equal splits", out, want)

    # rank s sends (s + 1) * (d + 2) elements to rank d.
    sizes = lambda s: [(s + 1) * (d + 2) for d in range(world)]
    send_splits = sizes(rank)
    recv_splits = [sizes(s)[rank] for s in range(world)]
    inp = torch.arange(sum(send_splits), dtype=torch.float64, device=dev) + 1000 * rank
    out = torch.empty(sum(recv_splits), dtype=torch.float64, device=dev)
    dist.all_to_all_single(out, inp, output_split_sizes=recv_splits, input_split_sizes=send_splits)
    pieces = []
    for s in range(world):
        offset = sum(sizes(s)[:rank])
        pieces.append(torch.arange(offset, offset + sizes(s)[rank], dtype=torch.float64, device=dev) + 1000 * s)
    checks.close("all_to_all_single unequal splits", out, torch.cat(pieces))


def same_gpu():
    """FC_TORCH_SAME_GPU=1: both ranks on GPU 0 (flexcoll lets ranks share a GPU; NCCL does not),
    so the test runs where only one GPU is lent."""
    return os.environ.get("FC_TORCH_SAME_GPU", "0") == "1"


def gpu_of(rank):
    return 0 if same_gpu() else rank


def worker(rank, world, port, outdir):
    import torch
    import torch.distributed as dist

    report = {"rank": rank, "checks": [], "error": None}
    checks = Checks(rank)
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        torch.cuda.set_device(gpu_of(rank))
        dist.init_process_group("nccl", init_method="env://", timeout=datetime.timedelta(seconds=TIMEOUT_S // 2))
        run_collectives(rank, world, checks)
        dist.destroy_process_group()
    except Exception:
        report["error"] = traceback.format_exc()
    report["checks"] = checks.results
    libs = mapped_nccl_libraries()
    report["nccl_libraries"] = libs
    report["bound_to"], report["ncclGetVersion"] = bound_nccl()
    with open(os.path.join(outdir, "rank%d.json" % rank), "w") as f:
        json.dump(report, f)


def spawn(world, port, outdir):
    import torch.multiprocessing as mp

    ctx = mp.spawn(worker, args=(world, port, outdir), nprocs=world, join=False)
    deadline = time.time() + TIMEOUT_S
    try:
        while not ctx.join(timeout=5):
            if time.time() > deadline:
                for p in ctx.processes:
                    p.kill()
                return "the workers did not finish within %d s" % TIMEOUT_S
    except Exception as e:  # a worker died (its own errors are caught and reported in its JSON)
        return "a worker failed: %s" % e
    return None


def flexcoll_log(logdir):
    lines = []
    for path in sorted(glob.glob(os.path.join(logdir, "flexcoll.*.log"))):
        with open(path, errors="replace") as f:
            lines += [line.rstrip("\n") for line in f]
    return lines


def verify(world, outdir, logdir, preload):
    ok = True
    for rank in range(world):
        path = os.path.join(outdir, "rank%d.json" % rank)
        if not os.path.exists(path):
            print("FAIL rank %d left no report" % rank)
            ok = False
            continue
        with open(path) as f:
            rep = json.load(f)
        for c in rep["checks"]:
            print("%s rank %d %s%s" % ("ok  " if c["ok"] else "FAIL", rank, c["name"], ": " + c["detail"] if c["detail"] else ""))
            ok &= c["ok"]
        if rep["error"]:
            print("FAIL rank %d raised:\n%s" % (rank, rep["error"]))
            ok = False
        libs = rep["nccl_libraries"]
        # PyTorch's own loader may map NVIDIA's libnccl too; what matters is where the symbols bind.
        print("rank %d: libnccl files mapped: %s" % (rank, ", ".join(libs) or "none"))
        print("rank %d: ncclAllReduce binds to: %s" % (rank, rep["bound_to"]))
        if rep["bound_to"] != preload:
            print("FAIL rank %d: NCCL symbols must bind to the preloaded shim %s" % (rank, preload))
            ok = False
        version = rep["ncclGetVersion"]
        print("rank %d: ncclGetVersion as bound: %s" % (rank, version))
        if version != [0, 22800]:
            print("FAIL rank %d: ncclGetVersion must succeed with 22800 (NCCL 2.28.0)" % rank)
            ok = False
    return verify_log(world, logdir) and ok


def verify_log(world, logdir):
    lines = flexcoll_log(logdir)
    info = [l for l in lines if " flexcoll INFO " in l or " flexcoll WARN " in l or " flexcoll TRACE " in l]
    print("FLEXCOLL_DEBUG log: %d flexcoll lines from %d file(s) in %s" % (
        len(info), len(glob.glob(os.path.join(logdir, "flexcoll.*.log"))), logdir))
    for l in info[:40]:
        print("  | " + l)
    if len(info) > 40:
        print("  | ... %d more" % (len(info) - 40))
    ok = True
    for rank in range(world):
        ready = [l for l in info if "[%d]" % rank in l and "ready" in l and "cuda device %d" % gpu_of(rank) in l]
        if not ready:
            print("FAIL no flexcoll line says that rank %d's communicator is ready on CUDA device %d" % (rank, gpu_of(rank)))
            ok = False
    warns = [l for l in info if " flexcoll WARN " in l]
    if warns:
        print("note: %d flexcoll WARN line(s) above" % len(warns))
    return ok


def main():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print("SKIP: PyTorch is not installed (%s)" % e)
        return SKIP
    ngpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if ngpus < (1 if same_gpu() else 2) or not dist.is_available() or not dist.is_nccl_available():
        print("SKIP: needs 2 GPUs and PyTorch's NCCL backend (%d GPU(s), nccl %s)" % (
            ngpus, dist.is_available() and dist.is_nccl_available()))
        return SKIP
    preload = [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if "libnccl" in os.path.basename(p)]
    if not preload:
        print("FAIL: LD_PRELOAD must name the shim: LD_PRELOAD=<build>/shim/.libs/libnccl.so.2 %s" % sys.argv[0])
        return 1
    preload = os.path.realpath(preload[0])
    print("PyTorch %s, %d GPUs; torch.cuda.nccl.version() = %s (the NCCL headers PyTorch was built with)" % (
        torch.__version__, ngpus, torch.cuda.nccl.version()))
    print("LD_PRELOAD shim: %s" % preload)
    world = 2
    with tempfile.TemporaryDirectory(prefix="torch_shim.") as tmp:
        os.environ.setdefault("FLEXCOLL_DEBUG", "INFO")
        if os.environ["FLEXCOLL_DEBUG"].upper() not in ("INFO", "TRACE"):
            os.environ["FLEXCOLL_DEBUG"] = "INFO"
        os.environ["FLEXCOLL_DEBUG_FILE"] = os.path.join(tmp, "flexcoll.%h.%p.log")
        error = spawn(world, free_port(), tmp)
        if error:
            print("FAIL " + error)
        ok = verify(world, tmp, tmp, preload) and not error
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
