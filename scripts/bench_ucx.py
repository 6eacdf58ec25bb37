#!/usr/bin/python3
"""Anview over UCX (ANVIEW_TRANSPORTS=ucx) next to raw UCX (ucx_perftest), in one run.

The question it answers: what does Anview's layer cost on top of UCX? Both sides use the same
UCX devices (UCX_TLS); each repeat measures every case of Anview right next to the same case of
ucx_perftest, and the table gives the medians of each side and the median of the per-pair
ratios (this machine is shared and noisy). 2 ranks on this host.

  8 B latency:     anview-perf pingpong p50    vs tag_lat and ucp_am_lat (typical)
  16 MiB bandwidth: anview-perf bw (window 16) vs tag_bw and ucp_am_bw
  16 MiB put:       anview-perf put            vs ucp_put_bw
  16 MiB put/get, the ranks on two emulated hosts (anview-run --emulate-hosts 2), UCX_TLS=tcp
  only (UCX's shared memory cannot serve other hosts): Anview's puts and gets through UCX's RMA
  (ANVIEW_UCX_RMA=native, the default with RDMA) vs ucp_put_bw and ucp_get; and through frames
  (ANVIEW_UCX_RMA=frames, the default without RDMA) vs the same.

  scripts/bench_ucx.py [--build build-rel] [--reps 5] [--tls sm,tcp]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_p2p import ROOT, anview, fmt, med, ucx_perftest  # noqa: E402


CASES = [
    # name, anview op, anview args, anview key, ucx tests, size, iters, warmup, lower is better
    ("8 B latency (us)", "pingpong", ["-b", "8", "-e", "8", "-n", "100000", "-w", "1000"],
     "lat_us_p50", ["tag_lat", "ucp_am_lat"], 8, 100000, 1000, True),
    ("16 MiB bandwidth (GB/s)", "bw", ["-b", "16M", "-e", "16M", "-n", "200", "-w", "10"],
     "bw_gbs", ["tag_bw", "ucp_am_bw"], 16 << 20, 200, 10, False),
    ("16 MiB put (GB/s)", "put", ["-b", "16M", "-e", "16M", "-n", "200", "-w", "10"],
     "bw_gbs", ["ucp_put_bw"], 16 << 20, 200, 10, False),
]
HOSTS = ["--emulate-hosts", "2"]
# name, anview op, ANVIEW_UCX_RMA, ucx test: the ranks on two emulated hosts, UCX_TLS=tcp only
OTHER_HOST = [
    ("16 MiB put, other host, UCX RMA (GB/s)", "put", "native", "ucp_put_bw"),
    ("16 MiB get, other host, UCX RMA (GB/s)", "get", "native", "ucp_get"),
    ("16 MiB put, other host, frames (GB/s)", "put", "frames", "ucp_put_bw"),
]
BIG = ["-b", "16M", "-e", "16M", "-n", "200", "-w", "10"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tls", default="sm,tcp")
    a = p.parse_args()
    rows = {}
    for _ in range(a.reps):
        for tls in a.tls.split(","):
            for name, op, args, key, tests, size, iters, warmup, lower in CASES:
                mine = anview(a.build, "ucx", op, args, env={"UCX_TLS": tls})[0][key]
                for test in tests:
                    peer = ucx_perftest(test, size, iters, warmup, tls=tls)
                    rows.setdefault((tls, name, test, lower), []).append((mine, peer))
            if tls != "tcp":
                continue
            for name, op, mode, test in OTHER_HOST:
                mine = anview(a.build, "ucx", op, BIG, env={"UCX_TLS": tls, "ANVIEW_UCX_RMA": mode},
                              launcher=HOSTS)[0]["bw_gbs"]
                peer = ucx_perftest(test, 16 << 20, 200, 10, tls=tls)
                rows.setdefault((tls, name, test, False), []).append((mine, peer))
    print(f"Anview over UCX next to ucx_perftest, {a.reps} pairs, 2 ranks on this host\n")
    print("| UCX_TLS | case | Anview median | ucx_perftest | UCX median | "
          "Anview / UCX, median of pairs [min-max] |")
    print("|---|---|---|---|---|---|")
    for (tls, name, test, lower), pairs in rows.items():
        ratios = sorted(m / u if u > 0 else float("inf") for m, u in pairs)
        note = " (lower is better)" if lower else ""
        print(f"| {tls} | {name} | {fmt(med([m for m, _ in pairs]))} | {test} | "
              f"{fmt(med([u for _, u in pairs]))} | {med(ratios)[0]:.2f}x "
              f"[{ratios[0]:.2f}-{ratios[-1]:.2f}]{note} |")


if __name__ == "__main__":
    main()
