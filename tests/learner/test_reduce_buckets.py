"""The torch engine's gradient reduction runs in place over buckets (learner.distributed.engines):
the same sums as one flat all-reduce, and at most one bucket of extra memory (measured at W = 2
over gloo, from the rank processes' peak resident memory)."""

import pytest
import torch

from learner.distributed.engines import TorchDataParallel, buckets
from learner.distributed.ranks import spawn_ranks

MB = 2**20
SIZES = [8 * MB // 4, 3 * MB // 4, 2 * MB // 4, 12 * MB // 4, 1000, 5 * MB // 4]  # float32 elements: 31 MB of gradients


def _rss(field: str) -> int:
    return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith(field))) * 1024


def _grads(rank: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(rank)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in SIZES] + [torch.nn.Parameter(torch.zeros(7))]
    for p in params[:-1]:  # the last one: no gradient on this rank (a parameter no loss touched)
        p.grad = torch.randn(p.shape)
    return params


def _reduce(rank: int, world: int, mode: str, bucket_bytes: int) -> dict:
    torch.set_num_threads(1)
    params = _grads(rank)
    engine = TorchDataParallel(params, torch.optim.SGD(params, lr=0.1), 1.0, bucket_bytes=bucket_bytes)
    addresses = [p.grad.data_ptr() for p in params[:-1]]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak resident size (VmHWM) to the current one
    before = _rss("VmRSS")
    if mode == "buckets":
        engine.reduce()
    else:  # the earlier reduction: one flat buffer of every gradient, then a clone of each part
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        for p, part in zip(params, torch.split(flat, [g.numel() for g in grads])):
            p.grad = part.view_as(p).clone()
        del flat, grads, part
    return {"extra": _rss("VmHWM") - before, "in_place": [p.grad.data_ptr() for p in params[:-1]] == addresses,
            # as numpy arrays, pickled by value: a tensor would travel as a shared-memory handle that the
            # parent can only open while this rank is alive (a rank exiting first: ConnectionResetError)
            "grads": [p.grad.numpy().copy() for p in params]}


@pytest.mark.slow
def test_bucketed_reduction_sums_in_place_within_one_bucket_of_extra_memory():
    bucket = 4 * MB
    total = sum(SIZES) * 4
    new = spawn_ranks(_reduce, 2, ("buckets", bucket), timeout_s=300)
    old = spawn_ranks(_reduce, 2, ("flat", bucket), timeout_s=300)
    expected = [torch.zeros_like(p) if p.grad is None else p.grad for p in _grads(0)]
    for e, p in zip(expected, _grads(1)):
        if p.grad is not None:
            e += p.grad
    for r in range(2):
        assert new[r]["in_place"]
        for got, flat, e in zip(new[r]["grads"], old[r]["grads"], expected):
            got, flat = torch.from_numpy(got), torch.from_numpy(flat)
            assert torch.equal(got, flat) and torch.equal(got, e)  # two ranks: the same sums, bit for bit
    print(f"extra peak memory per rank: buckets {[n['extra'] / MB for n in new]} MiB, flat {[o['extra'] / MB for o in old]} "
          f"MiB; gradients {total / MB:.1f} MiB, bucket {bucket / MB:.0f} MiB")
    for r in range(2):
        assert new[r]["extra"] <= bucket + 3 * MB  # allowance: page rounding and gloo's own transfer buffers (seen up to 1.9 MiB)
        assert old[r]["extra"] >= 1.5 * total  # the earlier form's copies show in the same measure


def test_buckets_keep_order_and_dtype_and_put_a_large_gradient_alone():
    gs = [torch.zeros(10), torch.zeros(10), torch.zeros(100), torch.zeros(10, dtype=torch.float64), torch.zeros(5)]
    got = buckets(gs, 100 * 4)
    assert [[g.numel() for g in b] for b in got] == [[10, 10], [100], [10], [5]]
    assert [g for b in got for g in b] == gs
