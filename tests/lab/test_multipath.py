"""Multi-path TCP between two emulated hosts with two links each (the lab, scripts/anview-lab).

Rank 0 on host 0 sends checked bulk data (anview_lab_transfer) to rank 1 on host 1 while links
go down and up. Each rank prints `RESULT {json}` with the per-path metrics. No timing is
asserted: throughput and failover stall are the benchmark's (scripts/bench_multipath.py).
"""

import json
import os
import subprocess
import time

import pytest

from lab_harness import Lab, skip_unless_lab_available

PROGRAM = os.environ.get("ANVIEW_LAB_TRANSFER", "")
INCAST = os.environ.get("ANVIEW_LAB_INCAST", "")


@pytest.fixture(autouse=True)
def _lab_available():
    skip_unless_lab_available()
    for variable, program in (("ANVIEW_LAB_TRANSFER", PROGRAM), ("ANVIEW_LAB_INCAST", INCAST)):
        if not os.path.exists(program):
            pytest.fail(f"{variable} ({program!r}) does not name the built program")


def run_transfer(lab, args, env=None, during=None, timeout=120):
    """Starts rank 0 on host 0 and rank 1 on host 1; `during(lab)` runs while they work.

    Returns [(exit code, stdout, stderr, result dict or None)] per rank.
    """
    base_env = {"ANVIEW_TIMEOUT": "30", "ANVIEW_LOG_LEVEL": "warn"}
    base_env.update(env or {})
    procs = lab.start_ranks([PROGRAM, *map(str, args)], placement=[0, 1], env=base_env,
                            stdout=-1, stderr=-1, text=True)
    if during:
        during(lab)
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            reports = [p.communicate()[1] for p in procs]
            raise AssertionError("the ranks did not finish in time:\n" +
                                 "\n".join(f"--- rank {r} stderr:\n{e}"
                                           for r, e in enumerate(reports)))
        result = None
        for line in stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        out.append((proc.returncode, stdout, stderr, result))
    return out


def path_value(result, name, index):
    for sample in result["paths"]:
        if sample["name"] == name and sample["labels"].get("path_index") == str(index):
            return sample["value"]
    raise AssertionError(f"no {name} for path {index} in {result['paths']}")


def flap(link):
    """Takes host 1's `link` down 1.5 s into the transfer (under way on both paths), and up 2 s later."""
    def during(lab):
        time.sleep(1.5)
        lab.link(1, link, up=False)
        time.sleep(2.0)
        lab.link(1, link, up=True)
    return during


def describe(ranks):
    return "\n".join(f"--- rank {r}: exit {code}\nstdout: {out}\nstderr: {err}"
                     for r, (code, out, err, _) in enumerate(ranks))


def test_a_gigabyte_survives_a_link_going_down_and_coming_back():
    with Lab(hosts=2, links=2, rates={0: "1gbit", 1: "1gbit"}) as lab:
        ranks = run_transfer(lab, ["--bytes", 64 << 20, "--messages", 16, "--settle", 20],
                             during=flap(1))
        assert [r[0] for r in ranks] == [0, 0], describe(ranks)
        sender, receiver = ranks[0][3], ranks[1][3]
        assert receiver["checked"] and receiver["bytes"] == 1 << 30, describe(ranks)
        assert "2 paths" in sender["peer"], sender["peer"]
        # Path 1 failed, its frames went over path 0, and it was re-admitted afterwards.
        assert path_value(sender, "anview_tcp_path_failures_total", 1) >= 1, describe(ranks)
        assert path_value(sender, "anview_tcp_path_failures_total", 0) == 0, describe(ranks)
        assert path_value(sender, "anview_tcp_path_up", 0) == 1
        assert path_value(sender, "anview_tcp_path_up", 1) == 1, describe(ranks)
        assert path_value(sender, "anview_tcp_path_sent_bytes_total", 1) > 64 << 20
        assert "path 1" in ranks[0][2] and "failed" in ranks[0][2], ranks[0][2]


def test_the_control_path_going_down_stops_nothing():
    """Path 0 carries the acknowledgements and the credit grants of both paths' data streams.

    When it fails, what it carried is lost with it: the acknowledgements and grants must go
    on over path 1, or the sends and path 1's data stream wait until the timeout.
    """
    with Lab(hosts=2, links=2, rates={0: "1gbit", 1: "1gbit"}) as lab:
        ranks = run_transfer(lab, ["--bytes", 64 << 20, "--messages", 16, "--settle", 20],
                             env={"ANVIEW_TIMEOUT": "20"}, during=flap(0))
        assert [r[0] for r in ranks] == [0, 0], describe(ranks)
        sender, receiver = ranks[0][3], ranks[1][3]
        assert receiver["checked"] and receiver["bytes"] == 1 << 30, describe(ranks)
        assert path_value(sender, "anview_tcp_path_failures_total", 0) >= 1, describe(ranks)


def test_every_path_down_is_a_clear_error_on_both_sides():
    with Lab(hosts=2, links=2, rates={0: "1gbit", 1: "1gbit"}) as lab:
        def cut(lab):
            time.sleep(1.5)
            lab.all_links(1, up=False)

        started = time.monotonic()
        ranks = run_transfer(lab, ["--bytes", 64 << 20, "--messages", 64],
                             env={"ANVIEW_TCP_LINK_TIMEOUT": "2s"}, during=cut, timeout=60)
        assert time.monotonic() - started < 60
        for rank, (code, _, err, _) in enumerate(ranks):
            assert code == 3, describe(ranks)
            peer = 1 - rank
            assert f"every path to rank {peer} failed" in err, describe(ranks)
            # Both paths are named, with why each failed.
            assert "path 0 10.77.0." in err and "path 1 10.77.1." in err, err
            assert "no acknowledgement" in err, err


def test_paths_pair_interfaces_and_can_be_limited_to_one():
    with Lab(hosts=2, links=2) as lab:
        ranks = run_transfer(lab, ["--bytes", 8 << 20, "--messages", 4])
        assert [r[0] for r in ranks] == [0, 0], describe(ranks)
        peer = ranks[0][3]["peer"]
        assert "2 paths" in peer and "10.77.0.1 -> 10.77.0.2" in peer, peer
        assert "10.77.1.1 -> 10.77.1.2" in peer, peer

        ranks = run_transfer(lab, ["--bytes", 8 << 20, "--messages", 4],
                             env={"ANVIEW_TCP_PATHS": "1"})
        assert [r[0] for r in ranks] == [0, 0], describe(ranks)
        assert ranks[1][3]["checked"]
        assert "paths" not in ranks[0][3]["peer"] and "10.77.0.2" in ranks[0][3]["peer"]

        # Only interfaces named in ANVIEW_IFACES are paired.
        ranks = run_transfer(lab, ["--bytes", 8 << 20, "--messages", 2],
                             env={"ANVIEW_IFACES": "l1"})
        assert [r[0] for r in ranks] == [0, 0], describe(ranks)
        assert "10.77.1.2" in ranks[0][3]["peer"] and "paths" not in ranks[0][3]["peer"]


def test_a_slower_path_carries_less():
    with Lab(hosts=2, links=2, rates={0: "400mbit", 1: "100mbit"}) as lab:
        ranks = run_transfer(lab, ["--bytes", 16 << 20, "--messages", 8])
        assert [r[0] for r in ranks] == [0, 0], describe(ranks)
        sender = ranks[0][3]
        fast = path_value(sender, "anview_tcp_path_sent_bytes_total", 0)
        slow = path_value(sender, "anview_tcp_path_sent_bytes_total", 1)
        # 4:1 by rate; an even split would be 1:1.
        assert slow > 0 and fast > 2 * slow, (fast, slow)


def run_incast(lab, env):
    procs = lab.start_ranks([INCAST, "--bytes", 4 << 20, "--messages", 8],
                            placement=list(range(lab.hosts)),
                            env={"ANVIEW_TIMEOUT": "30", "ANVIEW_LOG_LEVEL": "warn", **env},
                            stdout=-1, stderr=-1, text=True)
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        result = next((json.loads(line[7:]) for line in stdout.splitlines()
                       if line.startswith("RESULT ")), None)
        out.append((proc.returncode, stdout, stderr, result))
    return out


def test_incast_four_into_one_delivers_everything_with_and_without_credit():
    # Four senders into rank 0, whose link is the bottleneck; rank 1 pings rank 0 meanwhile.
    with Lab(hosts=5, links=1, host_rates={(0, 0): "1gbit"}) as lab:
        for env in ({}, {"ANVIEW_TCP_CREDIT": "0"}, {"ANVIEW_TCP_CREDIT": "64K"}):
            ranks = run_incast(lab, env)
            assert [r[0] for r in ranks] == [0] * 5, (env, describe(ranks))
            assert ranks[0][3]["bytes"] == 4 * 8 * (4 << 20)  # rank 0 checked every byte
            assert ranks[1][3]["pings"] > 0, (env, describe(ranks))


def test_start_up_with_the_first_path_broken():
    # Host 1 drops everything it would send to host 0 over link 0 (a blackhole route: its
    # interface stays up, so the path is planned, but nothing answers on it) before the ranks
    # start; the store is reached over link 1. The link comes up on path 1, and path 0 joins
    # once it works.
    with Lab(hosts=2, links=2) as lab:
        blackhole = ["ip", "route", "add", "blackhole", f"{lab.addr(0, 0)}/32"]
        assert lab.run(1, blackhole).returncode == 0

        def repair(lab):
            time.sleep(4)
            lab.run(1, ["ip", "route", "del", "blackhole", f"{lab.addr(0, 0)}/32"])

        ranks = run_transfer(lab, ["--bytes", 8 << 20, "--messages", 4, "--settle", 20],
                             env={"ANVIEW_ROOT": f"{lab.addr(0, 1)}:29500"}, during=repair)
        assert [r[0] for r in ranks] == [0, 0], describe(ranks)
        sender = ranks[0][3]
        assert ranks[1][3]["checked"]
        assert "2 paths" in sender["peer"], sender["peer"]
        assert path_value(sender, "anview_tcp_path_up", 1) == 1
        assert path_value(sender, "anview_tcp_path_up", 0) == 1, describe(ranks)
