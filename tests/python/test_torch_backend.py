"""torch.distributed on the "anview" backend, 2 and 4 processes, against gloo (torch_worker.py)."""

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_operation_and_ddp_match_gloo(torchrun, ranks):
    job = torchrun(ranks, "torch_worker.py")
    assert job.codes == [0] * ranks, job.report()
    for r in range(ranks):
        assert f"rank {r}: all_reduce rooted gathers point_to_point async_ops groups errors ddp passed" in job.outputs[r], job.report()


def test_a_dead_rank_is_named_not_a_hang(torchrun):
    job = torchrun(3, "torch_worker.py", "peer_dies", timeout=120)
    assert job.codes == [0, 0, 3], job.report()
    for r in (0, 1):
        assert "peer_lost" in job.outputs[r] and "2" in job.outputs[r], job.report()
