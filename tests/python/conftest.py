"""Launching multi-process jobs for the Python tests: each rank is a /usr/bin/python3 process
with the package built in build/python on its path."""

import os
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, procs):
        self.procs = procs
        self.outputs = [p.communicate()[0] for p in procs]
        self.codes = [p.returncode for p in procs]

    def report(self):
        return "\n".join(f"--- rank {r} (exit {c}):\n{o}" for r, (c, o) in enumerate(zip(self.codes, self.outputs)))


def run_ranks(n, argv, env_for_rank, timeout):
    """Starts n processes, waits up to `timeout` seconds for all of them (then kills them)."""
    procs = []
    for r in range(n):
        env = dict(os.environ)
        env.update(env_for_rank(r))
        env.setdefault("ANVIEW_LOG_LEVEL", "error")
        procs.append(subprocess.Popen([sys.executable] + argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            job = Job(procs)
            pytest.fail(f"the job ran past {timeout} s:\n{job.report()}")
    return Job(procs)


@pytest.fixture
def torchrun():
    """torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK)."""
    def launch(n, script, *args, timeout=240):
        port = free_port()
        return run_ranks(n, [os.path.join(HERE, script), *args],
                         lambda r: {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                                    "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n)},
                         timeout)
    return launch
