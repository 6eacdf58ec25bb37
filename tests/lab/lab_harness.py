"""The multi-host lab (scripts/anview-lab) for pytest tests.

    from lab_harness import Lab, skip_unless_lab_available

    skip_unless_lab_available()          # pytest.skip with the reason where it can't be made
    with Lab(hosts=2, links=2, rates={0: "1gbit"}) as lab:
        procs = lab.start_ranks([program], placement=[0, 1], root_port=29500)
        lab.link(1, 0, up=False)          # host 1's link 0 goes down (both directions)

Host h on link k is 10.77.k.(h+1); the lab (namespaces NAME-h0.., NAME-sw) is removed on exit,
whatever happened in the with-block, with every process still running inside it.
"""

import functools
import itertools
import os
import secrets
import subprocess
import sys

LAB_SCRIPT = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "anview-lab"))
EXIT_UNAVAILABLE = 77
_names = itertools.count()

# Run inside a host: exit 0 if ADDR answers a TCP connect from SRC (a refusal is an answer: the
# packet got there and back), 1 if not within the timeout. ping may not be installed.
_PROBE = r"""
import socket, sys
src, dst, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = socket.socket()
s.settimeout(timeout)
try:
    s.bind((src, 0))
    s.connect((dst, 9))
except ConnectionRefusedError:
    sys.exit(0)
except OSError as e:
    print(e, file=sys.stderr)
    sys.exit(1)
sys.exit(0)
"""


def lab_cli(*args, timeout=60, check=True):
    """Runs scripts/anview-lab ARGS; a RuntimeError with its message when it fails."""
    proc = subprocess.run([LAB_SCRIPT, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise RuntimeError(f"anview-lab {' '.join(map(str, args))} exited {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


@functools.lru_cache(maxsize=None)
def lab_check():
    """(exit code of 'anview-lab check', its message); checked once per process."""
    proc = lab_cli("check", check=False)
    return proc.returncode, (proc.stderr.strip() or proc.stdout.strip())


def skip_unless_lab_available():
    """pytest.skip(reason) where the lab can't be made here (exit 77: not root, namespaces
    refused); any other failure of the check is an error, not a skip."""
    code, message = lab_check()
    if code == EXIT_UNAVAILABLE:
        import pytest
        pytest.skip(message)
    if code != 0:
        raise RuntimeError(f"anview-lab check failed (exit {code}): {message}")


def lab_namespaces(name):
    """The namespaces of lab NAME that exist now."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(name + "-"))


class Lab:
    """A lab of HOSTS hosts with LINKS links each; a context manager that always removes it.

    rates: {link: rate} limits that link of every host; host_rates: {(host, link): rate} one
    host's link only (it wins over rates). Rates are tc's syntax: "1gbit", "500mbit".
    """

    def __init__(self, hosts=2, links=1, rates=None, host_rates=None, name=None):
        self.hosts, self.links = hosts, links
        self.rates, self.host_rates = dict(rates or {}), dict(host_rates or {})
        self.name = name or f"av{os.getpid()}x{next(_names)}"
        self._procs = []
        self._up = False

    # --- lifetime -------------------------------------------------------------------------

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except Exception:
            if exc_type is None:
                raise  # else the with-block's own exception is the one to see
        return False

    def up(self):
        args = ["up", "--name", self.name, "--hosts", self.hosts, "--links", self.links]
        for link, rate in sorted(self.rates.items()):
            args += ["--rate", f"{link}={rate}"]
        for (host, link), rate in sorted(self.host_rates.items()):
            args += ["--rate", f"{host}:{link}={rate}"]
        lab_cli(*args)
        self._up = True

    def close(self):
        """Stops what this lab started, then removes every namespace of the lab."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = []
        lab_cli("down", "--name", self.name)  # also kills whatever else still runs inside
        self._up = False

    # --- topology -------------------------------------------------------------------------

    def ns(self, host):
        self._check(host, 0)
        return f"{self.name}-h{host}"

    @property
    def switch_ns(self):
        return f"{self.name}-sw"

    def addr(self, host, link):
        self._check(host, link)
        return f"10.77.{link}.{host + 1}"

    def link(self, host, link, up):
        """Takes HOST's link LINK down (up=False) or brings it up: both directions."""
        self._check(host, link)
        lab_cli("link", "--name", self.name, "--host", host, "--link", link,
                "up" if up else "down")

    def all_links(self, host, up):
        self._check(host, 0)
        lab_cli("link", "--name", self.name, "--host", host, "--all-links", "up" if up else "down")

    def status(self):
        return lab_cli("status", "--name", self.name).stdout

    def qdiscs(self, host, link, switch_side=False):
        """'tc -s qdisc show' of HOST's end of LINK (or of the switch's end)."""
        self._check(host, link)
        ns, dev = ((self.switch_ns, f"h{host}l{link}") if switch_side
                   else (self.ns(host), f"l{link}"))
        return subprocess.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev],
                              capture_output=True, text=True, check=True, timeout=10).stdout

    def reachable(self, src, dst, link, timeout=1.0):
        """Whether host SRC reaches host DST over LINK (a TCP connect from SRC's address on it)."""
        proc = self.run(src, [sys.executable, "-c", _PROBE, self.addr(src, link),
                              self.addr(dst, link), str(timeout)], timeout=timeout + 10)
        return proc.returncode == 0

    # --- processes ------------------------------------------------------------------------

    def host_env(self, host, env=None):
        merged = dict(os.environ)
        merged["ANVIEW_HOST_ID"] = self.ns(host)
        merged.update({k: str(v) for k, v in (env or {}).items()})
        return merged

    def popen(self, host, cmd, env=None, **kw):
        """subprocess.Popen of CMD (a list, or a string for sh -c) inside HOST; stopped on exit."""
        if isinstance(cmd, str):
            cmd = ["sh", "-c", cmd]
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *map(str, cmd)],
                                env=self.host_env(host, env), **kw)
        self._procs.append(proc)
        return proc

    def run(self, host, cmd, timeout=60, env=None, capture_output=True, text=True, **kw):
        """subprocess.run of CMD inside HOST (output captured as text unless told otherwise)."""
        if isinstance(cmd, str):
            cmd = ["sh", "-c", cmd]
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(["ip", "netns", "exec", self.ns(host), *map(str, cmd)],
                              env=self.host_env(host, env), timeout=timeout,
                              capture_output=capture_output, text=text, **kw)

    @staticmethod
    def rank_env(rank, world_size, root, local_rank=0, local_world_size=1):
        """The ANVIEW_* variables of a rank, as 'anview-lab exec --rank' sets them."""
        return {"ANVIEW_RANK": str(rank), "ANVIEW_WORLD_SIZE": str(world_size),
                "ANVIEW_LOCAL_RANK": str(local_rank),
                "ANVIEW_LOCAL_WORLD_SIZE": str(local_world_size),
                "ANVIEW_ROOT": root, "ANVIEW_TRANSPORTS": "tcp"}

    def root(self, placement, root_port=29500):
        """The bootstrap store's address: rank 0's host on link 0."""
        return f"{self.addr(placement[0], 0)}:{root_port}"

    def start_ranks(self, cmd, placement, root_port=29500, env=None, **kw):
        """Starts len(placement) ranks of CMD, rank r inside host placement[r]; the Popen list.

        Ranks on one host get local ranks 0, 1, .. in rank order, and the job a fresh
        ANVIEW_SECRET (as anview-run gives its jobs). ENV goes over each rank's.
        """
        root = self.root(placement, root_port)
        secret = secrets.token_hex(32)
        procs = []
        for rank, host in enumerate(placement):
            rank_env = self.rank_env(rank, len(placement), root,
                                     local_rank=placement[:rank].count(host),
                                     local_world_size=placement.count(host))
            rank_env["ANVIEW_SECRET"] = secret
            rank_env.update(env or {})
            procs.append(self.popen(host, cmd, env=rank_env, **kw))
        return procs

    def _check(self, host, link):
        if not 0 <= host < self.hosts:
            raise ValueError(f"lab {self.name} has hosts 0..{self.hosts - 1}, not {host}")
        if not 0 <= link < self.links:
            raise ValueError(f"lab {self.name} has links 0..{self.links - 1}, not {link}")
