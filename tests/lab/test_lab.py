"""Tests of the multi-host lab itself (scripts/anview-lab and lab_harness.Lab).

Skipped, with the reason, where the lab can't be made (not root, namespaces refused). No timing
or throughput assertions: the lab's throughput is a benchmark (README, "The multi-host lab").
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lab_harness import LAB_SCRIPT, Lab, lab_namespaces, skip_unless_lab_available  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def lab_available():
    skip_unless_lab_available()


def clean_env():
    """This process's environment without ANVIEW_* (so what a test sees was set by the lab)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ANVIEW_")}


def cli(*args, timeout=60):
    return subprocess.run([LAB_SCRIPT, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=clean_env(), stdin=subprocess.DEVNULL)


def root_links():
    out = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True, check=True).stdout
    return sorted(out.splitlines())


def wait_reachable(lab, src, dst, link, seconds=5):
    deadline = time.monotonic() + seconds
    while not lab.reachable(src, dst, link):
        if time.monotonic() > deadline:
            return False
    return True


def test_every_host_reaches_every_host_over_every_link():
    before = root_links()
    with Lab(hosts=3, links=2) as lab:
        for h in range(3):
            addrs = lab.run(h, ["ip", "-4", "-br", "addr"]).stdout
            routes = lab.run(h, ["ip", "-4", "route"]).stdout.splitlines()
            for k in range(2):
                own = rf"^l{k}@\S+\s+UP\s+{re.escape(lab.addr(h, k))}/24"
                assert re.search(own, addrs, re.M), addrs
            # One connected route per link, nothing else: no default route, no path between links.
            assert sorted(r.split()[0] for r in routes) == ["10.77.0.0/24", "10.77.1.0/24"], routes
        for k in range(2):
            for src in range(3):
                for dst in range(3):
                    if src != dst:
                        assert lab.reachable(src, dst, k), f"h{src} -> h{dst} over link {k}"
        assert root_links() == before, "the lab added something to the root namespace"


def test_link_down_stops_that_link_only_and_comes_back():
    with Lab(hosts=3, links=2) as lab:
        lab.link(1, 0, up=False)
        assert not lab.reachable(0, 1, 0)
        assert not lab.reachable(1, 0, 0)
        assert not lab.reachable(1, 2, 0)
        assert lab.reachable(0, 1, 1) and lab.reachable(1, 0, 1), "link 1 must still work"
        assert lab.reachable(0, 2, 0), "other hosts' link 0 must still work"
        assert "l0 10.77.0.2/24 down" in lab.status()
        lab.link(1, 0, up=True)
        assert wait_reachable(lab, 0, 1, 0) and wait_reachable(lab, 1, 0, 0)

        lab.all_links(2, up=False)
        for k in range(2):
            assert not lab.reachable(0, 2, k)
        assert lab.reachable(0, 1, 0)
        lab.all_links(2, up=True)
        for k in range(2):
            assert wait_reachable(lab, 0, 2, k) and wait_reachable(lab, 2, 0, k)


def test_rate_limits_are_tbf_qdiscs_on_both_ends():
    with Lab(hosts=2, links=2, rates={0: "1gbit"}, host_rates={(1, 1): "500mbit"}) as lab:
        for h in range(2):
            for switch_side in (False, True):
                out = lab.qdiscs(h, 0, switch_side=switch_side)
                assert re.search(r"qdisc tbf \S+ root .*rate 1Gbit", out), out
        for switch_side in (False, True):
            assert re.search(r"qdisc tbf \S+ root .*rate 500Mbit",
                             lab.qdiscs(1, 1, switch_side=switch_side))
            assert "tbf" not in lab.qdiscs(0, 1, switch_side=switch_side)
        status = lab.status()
        assert re.search(r"l0 10\.77\.0\.1/24 up .*rate out 1gbit, in 1gbit", status), status
        assert re.search(r"l1 10\.77\.1\.2/24 up .*rate out 500mbit, in 500mbit", status), status
        assert re.search(r"l1 10\.77\.1\.1/24 up .*unlimited", status), status
        assert lab.reachable(0, 1, 0) and lab.reachable(1, 0, 1)


def test_down_removes_everything_also_after_an_exception():
    with Lab(hosts=2, links=1) as lab:
        name = lab.name
        assert lab_namespaces(name) == [f"{name}-h0", f"{name}-h1", f"{name}-sw"]
        assert cli("up", "--name", name, "--hosts", 1, "--links", 1).returncode == 1
    assert lab_namespaces(name) == []

    with pytest.raises(RuntimeError, match="inside the with-block"):
        with Lab(hosts=2, links=2, rates={1: "100mbit"}) as lab:
            name = lab.name
            sleeper = lab.popen(1, ["sleep", "600"])
            stray = subprocess.Popen(["ip", "netns", "exec", lab.ns(0), "sleep", "600"])
            raise RuntimeError("inside the with-block")
    assert lab_namespaces(name) == []
    assert sleeper.poll() is not None
    assert stray.wait(timeout=10) is not None  # 'down' kills what still runs inside

    again = cli("down", "--name", name)
    assert again.returncode == 0 and "no namespace" in again.stdout


def test_exec_sets_the_rank_environment_inside_the_host():
    show = ("import json, os, socket; socket.create_server(('10.77.0.2', 0)).close(); "
            "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('ANVIEW_')}))")
    with Lab(hosts=2, links=1) as lab:
        root = f"{lab.addr(0, 0)}:29500"
        out = cli("exec", "--name", lab.name, "--host", 1, "--rank", 1, "--world-size", 2,
                  "--root", root, "--", sys.executable, "-c", show)
        assert out.returncode == 0, out.stderr  # binding 10.77.0.2 works in host 1 only
        assert json.loads(out.stdout) == {
            "ANVIEW_HOST_ID": f"{lab.name}-h1", "ANVIEW_RANK": "1", "ANVIEW_WORLD_SIZE": "2",
            "ANVIEW_LOCAL_RANK": "0", "ANVIEW_LOCAL_WORLD_SIZE": "1", "ANVIEW_ROOT": root,
            "ANVIEW_TRANSPORTS": "tcp"}

        plain = cli("exec", "--name", lab.name, "--host", 0, "--", "sh", "-c",
                    "echo $ANVIEW_HOST_ID; exit 7")
        assert plain.returncode == 7 and plain.stdout.strip() == f"{lab.name}-h0"
        assert cli("exec", "--name", lab.name, "--host", 5, "--", "true").returncode == 1
        no_root = cli("exec", "--name", lab.name, "--host", 0, "--rank", 0, "--", "true")
        assert no_root.returncode == 1 and "--rank needs" in no_root.stderr
        addr = cli("addr", "--name", lab.name, "--host", 1, "--link", 0)
        assert addr.returncode == 0 and addr.stdout.strip() == "10.77.0.2"


RANK_PROGRAM = r"""
import json, os, socket, sys, time
me = {k: v for k, v in os.environ.items() if k.startswith("ANVIEW_")}
host, port = os.environ["ANVIEW_ROOT"].rsplit(":", 1)
if me["ANVIEW_RANK"] == "0":
    server = socket.create_server((host, int(port)))
    server.settimeout(20)
    ranks = [me]
    for _ in range(int(me["ANVIEW_WORLD_SIZE"]) - 1):
        conn, peer = server.accept()
        with conn:
            ranks.append(dict(json.loads(conn.makefile().read()), peer=peer[0]))
    print(json.dumps(sorted(ranks, key=lambda r: int(r["ANVIEW_RANK"]))))
else:
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with conn:
        conn.sendall(json.dumps(me).encode())
"""


def test_start_ranks_places_ranks_and_reaches_the_root():
    with Lab(hosts=2, links=2) as lab:
        procs = lab.start_ranks([sys.executable, "-c", RANK_PROGRAM], placement=[0, 1, 1],
                                root_port=29500, env={"ANVIEW_LOG_LEVEL": "info"},
                                stdout=subprocess.PIPE, text=True)
        outs = [p.communicate(timeout=40)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0]
        ranks = json.loads(outs[0])
        assert [(r["ANVIEW_RANK"], r["ANVIEW_HOST_ID"], r["ANVIEW_LOCAL_RANK"],
                 r["ANVIEW_LOCAL_WORLD_SIZE"]) for r in ranks] == [
            ("0", f"{lab.name}-h0", "0", "1"), ("1", f"{lab.name}-h1", "0", "2"),
            ("2", f"{lab.name}-h1", "1", "2")]
        assert {r["ANVIEW_ROOT"] for r in ranks} == {"10.77.0.1:29500"}
        assert {r["ANVIEW_WORLD_SIZE"] for r in ranks} == {"3"}
        assert {r["ANVIEW_TRANSPORTS"] for r in ranks} == {"tcp"}
        assert {r["ANVIEW_LOG_LEVEL"] for r in ranks} == {"info"}
        assert [r.get("peer") for r in ranks[1:]] == ["10.77.0.2", "10.77.0.2"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to drop to an unprivileged user")
def test_unprivileged_user_gets_77_with_the_reason():
    # The script goes in on stdin: the checkout may sit where that user can't read.
    with open(LAB_SCRIPT) as f:
        source = f.read()
    interpreter = source.splitlines()[0][2:].strip()
    for args in (["check"], ["up", "--name", "avnoroot", "--hosts", "1", "--links", "1"]):
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               interpreter, "-", *args], input=source, capture_output=True,
                              text=True, timeout=30, cwd="/")
        assert proc.returncode == 77, proc.stderr
        assert "needs root" in proc.stderr
    assert lab_namespaces("avnoroot") == []
