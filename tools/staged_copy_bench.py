#!/usr/bin/env python3
# staged_copy_bench.py -- the yardstick of the pcie link (docs/PERFORMANCE.md): run it on the GPU
# node (PyTorch there) beside flexcoll-perf --nranks 2 with FLEXCOLL_LINKS=pcie,shm,tcp.
# Raw staged copy through pinned host memory with the copy engines (device -> pinned host ->
# device, 4 MiB slices pipelined on two streams), 1 and 2 pipelines at once: the yardstick of
# the pcie link.  Prints GB/s of payload delivered (sum over pipelines).
# --hammer SECONDS: instead, keep 2 pipelines copying for that long (another process loading the
# PCIe port, for stage 2 of the ring kernels' lanes: docs/ARCHITECTURE.md, step 5), printing the
# wall clock (time.time()) at its start and end, as flexcoll's SCHED stage-2 lines print theirs.
import torch, sys, time
n = 256 << 20; sl = 4 << 20; nbuf = 8
def staged(k):
    srcs = [torch.empty(n, dtype=torch.uint8, device='cuda') for _ in range(k)]
    dsts = [torch.empty(n, dtype=torch.uint8, device='cuda') for _ in range(k)]
    hs = [torch.empty(nbuf * sl, dtype=torch.uint8).pin_memory() for _ in range(k)]
    st = [(torch.cuda.Stream(), torch.cuda.Stream()) for _ in range(k)]
    def run():
        for p in range(k):
            d2h, h2d = st[p]
            evs = []
            for i in range(n // sl):
                b = i % nbuf
                if i >= nbuf: d2h.wait_event(evs[i - nbuf][1])
                with torch.cuda.stream(d2h): hs[p][b*sl:(b+1)*sl].copy_(srcs[p][i*sl:(i+1)*sl], non_blocking=True)
                e1 = torch.cuda.Event(); e1.record(d2h); h2d.wait_event(e1)
                with torch.cuda.stream(h2d): dsts[p][i*sl:(i+1)*sl].copy_(hs[p][b*sl:(b+1)*sl], non_blocking=True)
                e2 = torch.cuda.Event(); e2.record(h2d); evs.append((e1, e2))
        torch.cuda.synchronize()
    return run
def pipes(k):
    run = staged(k)
    run()
    t0 = torch.cuda.Event(enable_timing=True); t1 = torch.cuda.Event(enable_timing=True)
    best = 1e9
    for _ in range(3):
        torch.cuda.synchronize(); t0.record(); run(); t1.record(); torch.cuda.synchronize(); best = min(best, t0.elapsed_time(t1))
    return k * n / (best * 1e-3) / 1e9
if len(sys.argv) == 3 and sys.argv[1] == "--hammer":
    run = staged(2)
    t0 = time.time()
    print("hammer: start wall %.3f s" % t0, flush=True)
    rounds = 0
    while time.time() - t0 < float(sys.argv[2]):
        run()
        rounds += 1
    t1 = time.time()
    print("hammer: end wall %.3f s: %.1f GB/s staged copies meanwhile" % (t1, rounds * 2 * n / (t1 - t0) / 1e9), flush=True)
    sys.exit(0)
for k in (1, 2):
    print("raw staged copy D->pinned H->D, %d pipeline(s): %.1f GB/s delivered" % (k, pipes(k)))
