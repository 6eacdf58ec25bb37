"""The anview module on numpy arrays: 1, 2 and 4 ranks under anview-run (module_worker.py)."""

import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")
import anview  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# anview-run of the same build: build/python/anview -> build/bin/anview-run
RUN = os.environ.get("ANVIEW_RUN") or os.path.join(os.path.dirname(anview.__file__), "..", "..", "bin", "anview-run")


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_call_on_numpy_arrays(ranks, tmp_path):
    env = dict(os.environ, MODULE_TEST_DIR=str(tmp_path), ANVIEW_LOG_LEVEL="error")
    job = subprocess.run([RUN, "-n", str(ranks), "--timeout", "240", sys.executable,
                          os.path.join(HERE, "module_worker.py")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert job.returncode == 0, job.stdout
    for r in range(ranks):
        assert f"rank {r}: passed" in job.stdout, job.stdout


def test_errors_carry_the_context(tmp_path):
    store = anview.Store.file(str(tmp_path), timeout=1)
    with pytest.raises(anview.Error) as info:
        anview.Communicator.create(3, 2, store)
    e = info.value
    assert isinstance(e, RuntimeError) and e.kind == "usage" and e.operation and "3" in e.cause, e
    with pytest.raises(anview.Error) as info:
        store.get("never-set", timeout=0.1)
    assert info.value.kind == "timeout" and "never-set" in info.value.cause, info.value


def test_nothing_leaks_into_the_package_namespace():
    assert anview.__version__
    assert set(anview.__all__) >= {"Communicator", "Error", "HostBuffer", "Request", "Status",
                                   "Store"}


def test_a_host_buffer_is_zeroed_writable_memory_numpy_can_view():
    policy = anview.HostBuffer.huge_page_policy()
    assert policy in ("always", "madvise", "never", "unavailable"), policy
    buf = anview.HostBuffer(3 * (1 << 20) + 4)
    assert len(buf) == buf.nbytes == 3 * (1 << 20) + 4
    assert buf.huge_pages == (policy in ("always", "madvise"))
    view = np.frombuffer(buf, np.float32)
    assert view.size == buf.nbytes // 4 and not view.any()
    view[:] = 2.5
    del buf  # the view keeps the memory
    assert (view == 2.5).all() and view.flags.writeable
    empty = anview.HostBuffer(0)
    assert len(empty) == 0 and np.frombuffer(empty, np.uint8).size == 0
