"""Data-parallel ranks' weight comparison (learner.distributed.rank_worker): the on-device checksum
between full SHA-256 digests (``learner.digest_every``)."""

import torch

from learner.distributed.rank_worker import CHECKSUM_WIDTH, param_checksum, param_digest, weights_fingerprint


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    # a tensor of several full rows and a partial one, a small one, a scalar
    return torch.nn.ParameterList([torch.nn.Parameter(torch.randn(3 * CHECKSUM_WIDTH + 17).to(dtype)),
                                   torch.nn.Parameter(torch.randn(5, 7).to(dtype)),
                                   torch.nn.Parameter(torch.randn(()).to(dtype))])


def test_checksum_is_equal_for_equal_bits_and_changes_with_one_bit_or_a_swap():
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        a, b = _model(dtype), _model(dtype)
        assert param_checksum(a) == param_checksum(b) and param_checksum(a).startswith("sum:")
        base = param_checksum(a)
        for index in (0, CHECKSUM_WIDTH + 5, 3 * CHECKSUM_WIDTH + 16):  # full rows and the partial row
            with torch.no_grad():
                bits = a[0].data.view(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[a[0].element_size()])
                bits[index] ^= 1  # the lowest mantissa bit of one element
            assert param_checksum(a) != base, (dtype, index)
            with torch.no_grad():
                bits[index] ^= 1
            assert param_checksum(a) == base
        for i, j in ((0, 1), (2, CHECKSUM_WIDTH + 2), (5, 3 * CHECKSUM_WIDTH + 3), (3 * CHECKSUM_WIDTH, 3 * CHECKSUM_WIDTH + 9)):
            with torch.no_grad():  # two elements swapped: same multiset of values, other weights
                w = a[0].data
                w[i], w[j] = w[j].clone(), w[i].clone()
            assert param_checksum(a) != base, (dtype, i, j)
            with torch.no_grad():
                w[i], w[j] = w[j].clone(), w[i].clone()
            assert param_checksum(a) == base


def test_fingerprint_is_the_full_digest_on_the_first_and_every_nth_step():
    m = _model(torch.float32)
    kinds = ["sha" if not weights_fingerprint(m, batch, 3).startswith("sum:") else "sum" for batch in range(1, 9)]
    assert kinds == ["sha", "sum", "sum", "sha", "sum", "sum", "sha", "sum"]
    assert weights_fingerprint(m, 1, 3) == param_digest(m)
    assert all(not weights_fingerprint(m, b, 1).startswith("sum:") for b in range(1, 5))  # digest_every 1: always
