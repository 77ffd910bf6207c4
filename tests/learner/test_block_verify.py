"""Block verification (learner/rollout/speculation/block_verify.py) is exact in distribution: by exhaustive
enumeration over a small vocabulary (every drafted block, every accept-flag outcome, every
correction token, each extended by the target to the block's length + 1), the output's
distribution equals the target's own, total variation < 1e-10; and it keeps at least as many
tokens in expectation as token-by-token speculative sampling."""

from __future__ import annotations

import itertools
import random

import pytest

from learner.rollout.speculation.block_verify import block_rule, block_verify

V = 3


def random_model(seed: int, sharp: float):
    """prefix (tuple) -> next-token distribution, a fixed random one per prefix."""
    rng, cache = random.Random(seed), {}

    def dist(prefix: tuple) -> list[float]:
        if prefix not in cache:
            w = [rng.random() ** sharp + 1e-3 for _ in range(V)]
            cache[prefix] = [x / sum(w) for x in w]
        return cache[prefix]
    return dist


def joint(model, seq: tuple, start: int = 0) -> float:
    out = 1.0
    for j in range(start, len(seq)):
        out *= model(seq[:j])[seq[j]]
    return out


def output_distribution(p_model, q_model, gamma: int) -> dict[tuple, float]:
    """Exact distribution of the first gamma + 1 tokens: draft, verify, then the target goes on."""
    out: dict[tuple, float] = {}
    for block in itertools.product(range(V), repeat=gamma):
        q = [q_model(block[:i]) for i in range(gamma)]
        p = [p_model(block[:i]) for i in range(gamma + 1)]
        rule = block_rule(list(block), q, p)
        for flags in itertools.product((0, 1), repeat=gamma):
            pf = joint(q_model, block)
            for i, f in enumerate(flags, start=1):
                pf *= rule.keep[i] if f else 1.0 - rule.keep[i]
            tau = max([i for i, f in enumerate(flags, start=1) if f], default=0)
            for y, py in enumerate(rule.correction[tau]):
                head = block[:tau] + (y,)
                for tail in itertools.product(range(V), repeat=gamma - tau):
                    seq = head + tail
                    out[seq] = out.get(seq, 0.0) + pf * py * joint(p_model, seq, tau + 1)
    return out


@pytest.mark.parametrize("gamma,seed,sharp", [(1, 0, 1.0), (2, 1, 2.0), (3, 2, 3.0), (3, 3, 0.5)])
def test_block_verification_samples_the_target_distribution(gamma: int, seed: int, sharp: float) -> None:
    p_model, q_model = random_model(seed, sharp), random_model(seed + 100, sharp)
    got = output_distribution(p_model, q_model, gamma)
    want = {seq: joint(p_model, seq) for seq in itertools.product(range(V), repeat=gamma + 1)}
    tv = 0.5 * sum(abs(got.get(s, 0.0) - want[s]) for s in want)
    assert tv < 1e-10, tv
    assert abs(sum(got.values()) - 1.0) < 1e-12


def expected_kept(p_model, q_model, gamma: int, rule_kept) -> float:
    total = 0.0
    for block in itertools.product(range(V), repeat=gamma):
        total += joint(q_model, block) * rule_kept(block)
    return total


def test_keeps_at_least_as_many_tokens_as_token_by_token_speculative_sampling() -> None:
    gamma, p_model, q_model = 3, random_model(5, 1.5), random_model(6, 1.5)

    def block_kept(block) -> float:  # E[tau | block]: tau is the last accepted flag
        q = [q_model(block[:i]) for i in range(gamma)]
        p = [p_model(block[:i]) for i in range(gamma + 1)]
        keep, e = block_rule(list(block), q, p).keep, 0.0
        for tau in range(1, gamma + 1):  # P(last flag set is tau)
            e += tau * keep[tau] * prod(1.0 - keep[j] for j in range(tau + 1, gamma + 1))
        return e

    def token_kept(block) -> float:  # accept x_i with min(1, p/q) until the first rejection
        e, alive = 0.0, 1.0
        for i in range(gamma):
            alive *= min(1.0, p_model(block[:i])[block[i]] / q_model(block[:i])[block[i]])
            e += alive
        return e

    assert expected_kept(p_model, q_model, gamma, block_kept) >= expected_kept(p_model, q_model, gamma, token_kept) - 1e-12


def prod(xs) -> float:
    out = 1.0
    for x in xs:
        out *= x
    return out


def test_block_verify_draws_by_the_rule_and_refuses_mismatched_lengths() -> None:
    p = [[0.2, 0.5, 0.3]] * 3
    q = [[0.4, 0.4, 0.2]] * 2
    tau, token = block_verify([1, 1], q, p, flags=[0.0, 0.0], correction_u=0.0)
    assert tau == 2 and token == 0  # every flag set, then the target's first token at u = 0
    rule = block_rule([0, 0], q, p)
    tau, token = block_verify([0, 0], q, p, flags=[0.999, 0.999], correction_u=0.999)
    assert tau == 0 and rule.correction[0][token] > 0
    with pytest.raises(ValueError, match="block_rule: 2 drafted tokens need 2 drafting and 3 target"):
        block_rule([0, 0], q, p[:2])
