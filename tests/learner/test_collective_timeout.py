"""A collective whose peer never comes raises a named error within the process group's timeout
(``learner.timeout_s``) on the same code path for gloo and NCCL (learner.distributed.barrier_vote):
here over gloo, on CPU; NCCL is made to raise rather than abort the process by blocking wait."""

import os
import time
from datetime import timedelta

import pytest
import torch

from learner.distributed.barrier_vote import NCCL_RAISE_ENV, CollectiveTimeout, collectives_raise_on_timeout
from learner.distributed.ranks import spawn_ranks

TIMEOUT_S = 4.0


def _one_rank_absent(rank: int, world: int, what: str) -> dict:
    """Rank 1 never enters the collective (a hung or stuck peer); it waits on the rendezvous
    store until rank 0 has its error, bounded."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    from learner.distributed.barrier_vote import BatchCounts, exchange_counts
    from learner.distributed.engines import TorchDataParallel

    store = _get_default_store()
    if rank == 1:
        store.wait(["rank0-done"], timedelta(seconds=120))
        return {}
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    t0 = time.monotonic()
    try:
        if what == "reduce":
            TorchDataParallel([p], torch.optim.SGD([p], lr=0.1), 1.0).reduce()
        else:
            exchange_counts(BatchCounts(tokens=5), rank)
        error = None
    except CollectiveTimeout as exc:
        error = str(exc)
    finally:
        store.set("rank0-done", "1")
    assert dist.is_initialized()
    return {"error": error, "elapsed": time.monotonic() - t0}


@pytest.mark.parametrize("what, named", [("reduce", "the gradient all-reduce"),
                                         ("counts", "the barrier's count all-reduce")])
def test_a_collective_without_its_peer_raises_naming_the_rank_within_the_timeout(what, named):
    rank0, rank1 = spawn_ranks(_one_rank_absent, 2, (what,), timeout_s=300, collective_timeout_s=TIMEOUT_S)
    assert rank1 == {}
    assert rank0["error"] is not None, "the collective returned without its peer"
    assert rank0["error"].startswith(f"rank 0: {named} did not complete (learner.timeout_s = {TIMEOUT_S:g} s)")
    assert "a peer rank died, hung or never joined" in rank0["error"]
    assert TIMEOUT_S - 0.5 <= rank0["elapsed"] <= TIMEOUT_S + 30  # the process group's timeout, not forever


def test_nccl_is_told_to_raise_rather_than_abort_and_a_users_setting_wins(monkeypatch):
    for key in NCCL_RAISE_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")  # set by the user: kept
    collectives_raise_on_timeout()
    assert os.environ["TORCH_NCCL_BLOCKING_WAIT"] == "1"
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
