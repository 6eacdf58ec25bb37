#!/usr/bin/python3
"""One-sided put/get of Anview next to UCX's (ucx_perftest ucp_put_bw / ucp_get), in one run.

Each repeat measures every case of Anview right next to the same case of UCX, and the table
gives the medians [min-max] of each side and the median of the per-pair ratios: this machine
is shared and noisy. Cases (2 ranks on this host, the target allocated by the library, as
ucx_perftest allocates its own):
  shm: anview-perf put/get (allocate_memory: peers map it) vs UCX_TLS=posix,self
  shm, registered user memory (--user-memory: cross-memory attach) vs the same UCX figure
  tcp: ANVIEW_TRANSPORTS=tcp (emulated: served by the target's progress) vs UCX_TLS=tcp,self
Sizes: 8 B (operations per second), 1 MiB and 16 MiB (bandwidth).

  scripts/bench_one_sided.py [--build build-rel] [--reps 5] [--cases shm,user,tcp]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_p2p import ROOT, anview, fmt, med, ucx_perftest  # noqa: E402

UCX_TEST = {"put": "ucp_put_bw", "get": "ucp_get"}  # ucp_get is the get bandwidth test


def one(build, case, op, size):
    transports = "tcp" if case == "tcp" else "shm"
    args = ["-b", str(size), "-e", str(size)] + (["--user-memory"] if case == "user" else [])
    return anview(build, transports, op, args)[0]["bw_gbs"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cases", default="shm,user,tcp")
    a = p.parse_args()
    sizes = [(8, 100000, 1000), (1 << 20, 2000, 100), (16 << 20, 200, 10)]
    rows = {}
    for _ in range(a.reps):
        for case in a.cases.split(","):
            tls = "tcp,self" if case == "tcp" else "posix,self"
            for op in ("put", "get"):
                for size, iters, warmup in sizes:
                    mine = one(a.build, case, op, size)
                    peer = ucx_perftest(UCX_TEST[op], size, iters, warmup, tls=tls)
                    rows.setdefault((case, op, size), []).append((mine, peer))
    names = {"shm": "shm, allocate_memory", "user": "shm, register_memory (CMA)",
             "tcp": "tcp (emulated)"}
    print(f"anview-perf put/get next to ucx_perftest, {a.reps} pairs; GB/s, higher is better\n")
    print("| case | op | bytes | anview median [min-max] | UCX | UCX median [min-max] "
          "| ratio: median of pairs [min-max] |")
    print("|---|---|---|---|---|---|---|")
    for (case, op, size), pairs in rows.items():
        ratios = [m / u if u > 0 else float("inf") for m, u in pairs]
        tls = "tcp" if case == "tcp" else "posix"
        print(f"| {names[case]} | {op} | {size} | {fmt(med([m for m, _ in pairs]))} | "
              f"{UCX_TEST[op]} {tls} | {fmt(med([u for _, u in pairs]))} | {fmt(med(ratios))}x |")


if __name__ == "__main__":
    main()
