#!/usr/bin/python3
"""Collectives of Anview next to MPI, measured in one run, pair by pair.

On a shared, noisy machine minutes apart can differ by 50 %, so each repetition runs
`anview-perf OP` (2 ranks unless --ranks, float32 sum, out of place, --json) right next to the same sweep
of ../shared/peers/mpi_bench.c under Open MPI (ob1 + vader for shm, ob1 + tcp on loopback
for --transports tcp) and, for shm, MPICH; the best MPI of the pair is the bar. Printed:
medians [min-max] of each side and the median of the per-pair ratios (time, lower is better).

  scripts/bench_coll.py [--build build] [--reps 5] [--op allreduce|broadcast] [--transports shm]
                        [--ranks 2]
"""
import argparse
import json
import os
import subprocess
import sys

from bench_p2p import fmt, med  # the same summary statistics as the point-to-point report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_BIN = "/tmp/anview-peer-bin"
SIZES = [8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20]


def peer_program(name, compiler):
    path = os.path.join(PEER_BIN, name)
    if not os.path.exists(path):
        os.makedirs(PEER_BIN, exist_ok=True)
        source = os.path.join(ROOT, "..", "shared", "peers", "mpi_bench.c")
        subprocess.run([compiler, "-O2", "-o", path, source], check=True)
    return path


def mpi_iters(size):
    """mpi_bench's iteration count for a collective of `size` bytes (about 2 GiB of payload, at
    most 10000): anview-perf runs as many, after as many warm-up calls."""
    return max(5, min((2 << 30) // size, 10000))


def anview(build, transports, op, size, ranks):
    env = dict(os.environ, ANVIEW_TRANSPORTS=transports)
    iters = mpi_iters(size)
    cmd = [f"{build}/bin/anview-run", "-n", str(ranks), "--timeout", "300", f"{build}/bin/anview-perf",
           op, "-b", str(size), "-e", str(size), "-n", str(iters), "-w", str(iters // 10 + 2), "--json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True,
                         timeout=600).stdout
    row = [json.loads(line) for line in out.splitlines() if line.startswith("{")][0]
    return row["time_us"], row["algo"]


def mpi(kind, op, transports, ranks, sizes_list):
    """{bytes: time_us} of one mpi_bench sweep."""
    mpi_op = "bcast" if op == "broadcast" else op
    sizes = "sizes=" + ",".join(str(s) for s in sizes_list)
    if kind == "mpich":
        cmd = ["mpirun.mpich", "-np", str(ranks), peer_program("mpi_bench_mpich", "mpicc.mpich"), mpi_op,
               sizes]
    else:
        btl = "self,vader" if transports == "shm" else "self,tcp"
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "--mca", "pml", "ob1",
               "--mca", "btl", btl, "--mca", "btl_tcp_if_include", "lo",
               peer_program("mpi_bench_ompi", "mpicc.openmpi"), mpi_op, sizes]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900).stdout
    times = {}
    for line in out.splitlines():
        if line.startswith(mpi_op + " "):
            fields = dict(t.split("=", 1) for t in line.split()[1:])
            times[int(fields["bytes"])] = float(fields["time_us"])
    return times


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory")
    p.add_argument("--reps", type=int, default=5, help="pairs of runs")
    p.add_argument("--op", default="allreduce", choices=["allreduce", "broadcast"])
    p.add_argument("--transports", default="shm", choices=["shm", "tcp"])
    p.add_argument("--ranks", type=int, default=2, help="ranks (more than cores: oversubscribed)")
    p.add_argument("--sizes", default=",".join(str(s) for s in SIZES),
                   help="message sizes in bytes, comma-separated (K and M suffixes allowed)")
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    kinds = ["ompi", "mpich"] if a.transports == "shm" else ["ompi"]
    rows = {s: [] for s in sizes}  # (anview us, best MPI us, which MPI)
    algos = {}
    for _ in range(a.reps):
        peers = {k: mpi(k, a.op, a.transports, a.ranks, sizes) for k in kinds}
        for size in sizes:
            mine, algos[size] = anview(a.build, a.transports, a.op, size, a.ranks)
            best = min(kinds, key=lambda k: peers[k][size])
            rows[size].append((mine, peers[best][size], best))
    label = "vader" if a.transports == "shm" else "tcp BTL"
    print(f"{a.op}, {a.ranks} ranks over {a.transports}, float32 sum; {a.reps} pairs; peer: the faster of "
          f"{' and '.join(kinds)} ({label}) in each pair\n")
    print("| size | anview algorithm | anview us, median [min-max] | best MPI us | "
          "time ratio anview/MPI, median of pairs [min-max] | busbw anview GB/s |")
    print("|---|---|---|---|---|---|")
    bus = 2 * (a.ranks - 1) / a.ranks if a.op == "allreduce" else 1.0  # nccl-tests' factor
    for size, pairs in rows.items():
        ratios = [m / p for m, p, _ in pairs]
        mine = med([m for m, _, _ in pairs])
        print(f"| {size} | {algos[size]} | {fmt(mine)} | {fmt(med([p for _, p, _ in pairs]))} | "
              f"{fmt(med(ratios))}x | {size / mine[0] / 1e3 * bus:.3g} |")


if __name__ == "__main__":
    sys.exit(main())
