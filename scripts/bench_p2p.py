#!/usr/bin/python3
"""Point-to-point benchmark of Anview against its peers, measured in one run.

Default: runs `anview-perf pingpong` (8 B) and `anview-perf bw` (1 MiB, 16 MiB) REPS times,
then the peers' script (../shared/peers/run_all.sh SECTIONS, same REPS), and prints medians
[min-max] and the ratio Anview / peer.

--paired: on a shared, noisy machine minutes apart can differ by 50 %, so this mode runs each
Anview measurement right next to the same measurement of UCX (ucx_perftest with exactly the
commands of run_all.sh, UCX_TLS=tcp,self) REPS times, and reports the median of the per-pair
ratios as well as the medians of each side.

--paired --transports shm: the same for shared memory, against UCX posix (tag_lat, tag_bw),
Open MPI's vader BTL (16 MiB ping-pong bandwidth, ../shared/peers/mpi_bench.c) and one-thread
memcpy of 16 MiB (../shared/peers/memcpy_bench.c); the peers' programs are built into
/tmp/anview-peer-bin on first use. The 16 MiB cases run three ways, next to the same peer
figures: payloads on the heap as anview-run starts the ranks (their malloc asks for 2 MiB
pages), on the heap in 4 KiB pages as the peers' are (anview-run --no-huge-pages), and in
anview::HostBuffers (anview-perf --huge-pages).

  scripts/bench_p2p.py [--build build] [--reps 3] [--transports tcp] [--sections "net ucx"]
  scripts/bench_p2p.py --paired [--reps 7] [--transports shm]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def anview(build, transports, op, args, env=None, launcher=()):
    env = dict(os.environ, ANVIEW_TRANSPORTS=transports, **(env or {}))
    cmd = [f"{build}/bin/anview-run", "-n", "2", "--timeout", "300", *launcher,
           f"{build}/bin/anview-perf", op, "--json"] + args
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def peers(sections, reps):
    work = tempfile.mkdtemp(prefix="anview-peers-")
    env = dict(os.environ, REPS=str(reps), PEERS_WORK=work)
    script = os.path.join(ROOT, "..", "shared", "peers", "run_all.sh")
    subprocess.run([script] + sections.split(), env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = {}
    for name in os.listdir(os.path.join(work, "out")):
        if not name.startswith("results_"):
            continue
        for line in open(os.path.join(work, "out", name)):
            if "|" not in line:
                continue
            series, rest = line.strip().split("|", 1)
            tokens = rest.split()
            fields = dict(t.split("=", 1) for t in tokens[1:] if "=" in t)
            key = (series, tokens[0], fields.get("bytes", ""))
            results.setdefault(key, []).append(fields)
    return results


def ucx_perftest(test, size, iters, warmup, port=15203, tls="tcp,self"):
    """One ucx_perftest run as in ../shared/peers/run_all.sh; latency in us or bandwidth in GB/s."""
    env = dict(os.environ, UCX_TLS=tls)
    server = subprocess.Popen(["ucx_perftest", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time
        time.sleep(1)
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test, "-s",
                              str(size), "-n", str(iters), "-w", str(warmup), "-f"],
                             env=env, check=True, capture_output=True, text=True, timeout=120).stdout
    finally:
        server.wait(timeout=120)
    fields = out.strip().splitlines()[-1].split()
    return float(fields[1]) if "lat" in test else float(fields[5]) * 1.048576 / 1000


PEER_BIN = "/tmp/anview-peer-bin"


def peer_program(name, compiler, libs=()):
    path = os.path.join(PEER_BIN, name)
    if not os.path.exists(path):
        os.makedirs(PEER_BIN, exist_ok=True)
        source = os.path.join(ROOT, "..", "shared", "peers", name.replace("_ompi", "") + ".c")
        subprocess.run([compiler, "-O2", "-o", path, source, *libs], check=True)
    return path


def ompi_vader_pingpong(size):
    """Open MPI ob1/vader ping-pong bandwidth (GB/s), as run_all.sh runs it."""
    prog = peer_program("mpi_bench_ompi", "mpicc")
    out = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                          "--mca", "pml", "ob1", "--mca", "btl", "self,vader", prog, "pingpong",
                          f"sizes={size}"], check=True, capture_output=True, text=True,
                         timeout=300).stdout
    line = [l for l in out.splitlines() if l.startswith("pingpong")][-1]
    return float(dict(t.split("=") for t in line.split()[1:])["bw_GBps"])


def memcpy_rate(size):
    out = subprocess.run([peer_program("memcpy_bench", "gcc", ["-lpthread"]), "1"], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    for line in out.splitlines():
        fields = dict(t.split("=") for t in line.split()[1:])
        if int(fields["bytes"]) == size:
            return float(fields["GBps"])
    raise RuntimeError("memcpy_bench printed no line for %d bytes" % size)


def paired_shm(a):
    keys = ("lat", "bw1", "bw16", "memcpy", "pp16", "bw16s", "memcpys", "pp16s", "bw16h",
            "memcpyh", "pp16h")
    pairs = {k: [] for k in keys}
    variants = {"heap": ((), []), "small": (("--no-huge-pages",), []),
                "huge": ((), ["--huge-pages"])}

    def three_ways(op, args, rep):
        """Anview's figure with heap payloads as anview-run starts the ranks (malloc asks for
        2 MiB pages), with heap payloads in 4 KiB pages (anview-run --no-huge-pages) and in
        HostBuffers, run back to back; the order rotates with the repeat."""
        order = list(variants)[rep % 3:] + list(variants)[:rep % 3]
        return {v: anview(a.build, "shm", op, args + variants[v][1], launcher=variants[v][0])[0]
                for v in order}

    for rep in range(a.reps):
        mine = anview(a.build, "shm", "pingpong", ["-b", "8", "-e", "8", "-n", "100000"])[0]
        pairs["lat"].append((mine["lat_us_p50"],
                             ucx_perftest("tag_lat", 8, 100000, 1000, tls="posix,self")))
        mine = anview(a.build, "shm", "bw", ["-b", "1M", "-e", "1M"])[0]
        pairs["bw1"].append((mine["bw_gbs"], ucx_perftest("tag_bw", 1 << 20, 2000, 100,
                                                          tls="posix,self")))
        # The 16 MiB cases three ways (the peers' payloads are malloc'd in 4 KiB pages), each
        # next to the same peer figures of this repeat.
        got = three_ways("bw", ["-b", "16M", "-e", "16M"], rep)
        ucx = ucx_perftest("tag_bw", 16 << 20, 200, 10, tls="posix,self")
        copy = memcpy_rate(16 << 20)
        for suffix, v in (("", "heap"), ("s", "small"), ("h", "huge")):
            pairs["bw16" + suffix].append((got[v]["bw_gbs"], ucx))
            pairs["memcpy" + suffix].append((got[v]["bw_gbs"], copy))
        got = three_ways("pingpong", ["-b", "16M", "-e", "16M", "-n", "100"], rep)
        vader = ompi_vader_pingpong(16 << 20)
        for suffix, v in (("", "heap"), ("s", "small"), ("h", "huge")):
            pairs["pp16" + suffix].append((got[v]["bw_gbs"], vader))
    heap, small, huge = ("heap, anview-run default", "heap, anview-run --no-huge-pages",
                         "anview-perf --huge-pages")
    names = {"lat": ("8 B one-way latency p50 (us), lower is better", "UCX posix tag_lat"),
             "bw1": ("1 MiB streaming bandwidth (GB/s)", "UCX posix tag_bw")}
    for suffix, how in (("", heap), ("s", small), ("h", huge)):
        names["bw16" + suffix] = (f"16 MiB streaming bandwidth, {how} (GB/s)", "UCX posix tag_bw")
        names["memcpy" + suffix] = (f"16 MiB streaming bandwidth, {how} (GB/s)",
                                    "memcpy 16 MiB, 1 thread")
        names["pp16" + suffix] = (f"16 MiB ping-pong bandwidth, {how} (GB/s)",
                                  "Open MPI vader pingpong")
    print(f"anview (shm) next to its peers, {a.reps} pairs\n")
    print("| metric | anview median [min-max] | peer | peer median [min-max] | ratio anview/peer: median of pairs [min-max] |")
    print("|---|---|---|---|---|")
    for key in keys:
        rows = pairs[key]
        ratios = [m / u for m, u in rows]
        name, peer = names[key]
        print(f"| {name} | {fmt(med([m for m, _ in rows]))} | {peer} | "
              f"{fmt(med([u for _, u in rows]))} | {fmt(med(ratios))}x |")


def paired(a):
    if a.transports == "shm":
        return paired_shm(a)
    pairs = {"lat": [], "bw1": [], "bw16": []}
    for _ in range(a.reps):
        mine = anview(a.build, a.transports, "pingpong", ["-b", "8", "-e", "8", "-n", "100000"])[0]
        pairs["lat"].append((mine["lat_us_p50"], ucx_perftest("tag_lat", 8, 100000, 1000)))
        for key, size, iters, warm in (("bw1", 1 << 20, 2000, 100), ("bw16", 16 << 20, 200, 10)):
            mine = anview(a.build, a.transports, "bw", ["-b", str(size), "-e", str(size)])[0]
            pairs[key].append((mine["bw_gbs"], ucx_perftest("tag_bw", size, iters, warm)))
    names = {"lat": "8 B one-way latency p50 (us), lower is better",
             "bw1": "1 MiB streaming bandwidth (GB/s)", "bw16": "16 MiB streaming bandwidth (GB/s)"}
    print(f"anview ({a.transports}) next to UCX tcp (ucx_perftest), {a.reps} pairs\n")
    print("| metric | anview median [min-max] | UCX median [min-max] | ratio anview/UCX: median of pairs [min-max] |")
    print("|---|---|---|---|")
    for key, rows in pairs.items():
        ratios = [m / u for m, u in rows]
        print(f"| {names[key]} | {fmt(med([m for m, _ in rows]))} | {fmt(med([u for _, u in rows]))} "
              f"| {fmt(med(ratios))}x |")


def med(values):
    return statistics.median(values), min(values), max(values)


def fmt(stat):
    m, lo, hi = stat
    return f"{m:.3g} [{lo:.3g}-{hi:.3g}]"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--transports", default="tcp")
    p.add_argument("--sections", default="net ucx")
    p.add_argument("--peer-series", default="ucx_tcp", help="ucx series to compare with")
    p.add_argument("--paired", action="store_true", help="interleave Anview and UCX runs")
    a = p.parse_args()
    if a.paired:
        return paired(a)

    lat, bw1, bw16 = [], [], []
    for _ in range(a.reps):
        lat += [r["lat_us_p50"] for r in anview(a.build, a.transports, "pingpong",
                                                 ["-b", "8", "-e", "8", "-n", "100000"])]
        for r in anview(a.build, a.transports, "bw", ["-b", "1M", "-e", "16M", "-f", "16"]):
            (bw1 if r["bytes"] == 1 << 20 else bw16).append(r["bw_gbs"])
    ref = peers(a.sections, a.reps)

    def peer_stat(series, kind, nbytes, field):
        rows = ref.get((series, kind, nbytes), [])
        return med([float(r[field]) for r in rows]) if rows else None

    rows = [
        ("8 B one-way latency p50 (µs)", med(lat),
         peer_stat(a.peer_series, "tag_lat", "8", "lat_p50_us"), f"{a.peer_series} tag_lat", True),
        ("1 MiB streaming bandwidth (GB/s)", med(bw1),
         peer_stat(a.peer_series, "tag_bw", "1048576", "GBps"), f"{a.peer_series} tag_bw", False),
        ("16 MiB streaming bandwidth (GB/s)", med(bw16),
         peer_stat(a.peer_series, "tag_bw", "16777216", "GBps"), f"{a.peer_series} tag_bw", False),
        ("16 MiB streaming bandwidth vs iperf3 (GB/s)", med(bw16),
         peer_stat("net", "iperf3", "", "GBps"), "iperf3 1 stream", False),
    ]
    print(f"anview ({a.transports}) vs peers, medians [min-max] over {a.reps} runs\n")
    print("| metric | anview | peer | peer value | ratio anview/peer |")
    print("|---|---|---|---|---|")
    for name, mine, theirs, who, lower_better in rows:
        ratio = f"{mine[0] / theirs[0]:.2f}x" if theirs else "n/a"
        note = " (lower is better)" if lower_better else ""
        print(f"| {name} | {fmt(mine)} | {who} | {fmt(theirs) if theirs else 'missing'} | {ratio}{note} |")


if __name__ == "__main__":
    sys.exit(main())
