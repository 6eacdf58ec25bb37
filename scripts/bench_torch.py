#!/usr/bin/python3
"""torch.distributed all_reduce (float32, sum) on the "anview" backend next to torch's gloo
backend, both in the same processes and the same run: each repetition times anview then gloo
(then swaps the order) at every size; the table gives the median time per call over the
repetitions and the median of the per-repetition ratios gloo/anview (how many times faster
anview is).

  scripts/bench_torch.py [--build build] [--ranks 2] [--reps 5] [--sizes 1K,64K,1M,16M,64M]
                         [--transports shm,tcp]

It starts the ranks itself with torchrun's environment (MASTER_ADDR/PORT, RANK, WORLD_SIZE);
under that environment it runs as one rank. Needs Debian's /usr/bin/python3 (torch).
"""
import argparse
import datetime
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def label(size):
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def timed(dist, tensor, group, iters):
    """Seconds per all_reduce of `tensor` on `group`, after warm-up, started together."""
    for _ in range(2):
        dist.all_reduce(tensor, group=group)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    return (time.perf_counter() - start) / iters


def rank_main(a):
    import torch
    import torch.distributed as dist

    import anview.torch  # noqa: F401

    dist.init_process_group("anview", timeout=datetime.timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    anv = dist.group.WORLD
    rank = dist.get_rank()
    results = {}  # size -> [(anview s, gloo s) per repetition]
    for rep in range(a.reps):
        for size in a.sizes:
            t = torch.ones(size // 4, dtype=torch.float32)
            # about 0.3 s of gloo per measurement (gloo: ~1 ms latency, ~1 GB/s here)
            iters = max(3, min(300, int(0.3 / (1e-3 + size / 1e9))))
            order = [(anv, 0), (gloo, 1)] if rep % 2 == 0 else [(gloo, 1), (anv, 0)]
            pair = [0.0, 0.0]
            for group, slot in order:
                measured = torch.tensor([timed(dist, t, group, iters)], dtype=torch.float64)
                dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=gloo)  # the slowest rank
                pair[slot] = measured.item()
            results.setdefault(size, []).append(tuple(pair))
    if rank == 0:
        where = os.environ.get("ANVIEW_TRANSPORTS", "shm,tcp")
        print(f"torch {torch.__version__} all_reduce float32 sum, {dist.get_world_size()} ranks on one host "
              f"(anview transports: {where}); {a.reps} repetitions, medians\n")
        print("| size | anview | gloo | gloo/anview (x faster), median [min-max] |")
        print("|---|---|---|---|")
        for size, pairs in results.items():
            ratios = [g / x for x, g in pairs]
            print(f"| {label(size)} | {statistics.median(p[0] for p in pairs) * 1e6:.1f} us | "
                  f"{statistics.median(p[1] for p in pairs) * 1e6:.1f} us | "
                  f"{statistics.median(ratios):.1f}x [{min(ratios):.1f}-{max(ratios):.1f}] |")
    dist.destroy_process_group()


def launch(a):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(a.ranks),
               PYTHONPATH=os.path.join(a.build, "python"))
    if a.transports:
        env["ANVIEW_TRANSPORTS"] = a.transports
    procs = [subprocess.Popen([sys.executable] + sys.argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(a.ranks)]
    return max(p.wait() for p in procs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sizes", default="1K,64K,1M,16M,64M")
    p.add_argument("--transports", default="", help="ANVIEW_TRANSPORTS for the ranks")
    a = p.parse_args()
    a.sizes = [parse_size(s) for s in a.sizes.split(",")]
    return rank_main(a) if "RANK" in os.environ else launch(a)


if __name__ == "__main__":
    sys.exit(main())
