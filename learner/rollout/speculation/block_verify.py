"""Block verification (Sun et al. 2024, "Block Verification Accelerates Speculative Decoding"):
the distribution-exact rule for a block of drafted tokens (docs/speculation.md, "Limits").

Keyed verification (``rollout/speculation/token_verify.py``) keeps a draft token for token where the new
weights' keyed sample agrees; this rule instead keeps a prefix with probabilities chosen so that
the kept prefix plus one correction token is distributed exactly as the new weights sample it,
keeping at least as many tokens in expectation as token-by-token speculative sampling. It is
exact in distribution, not in tokens, so it is not what the worker uses (a kept trajectory would
no longer equal the non-speculative run's); it is here, pure and tested by exhaustive
enumeration (``tests/learner/test_block_verify.py``), for a future low-acceptance mode.

Distributions are plain lists of probabilities over the vocabulary: ``q[i]`` the drafting
weights' and ``p[i]`` the new weights' next-token distribution after the first ``i`` drafted
tokens (``p`` has one more, after the whole block).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BlockRule:
    """What the rule decides for one drafted block, before any randomness: ``keep[i]`` the
    probability of the accept flag after position i (1-based, ``keep[0]`` unused), and, per
    possible kept length tau, the distribution the correction token is drawn from."""

    keep: list[float]
    correction: list[list[float]]


def block_rule(drafted: list[int], q: list[list[float]], p: list[list[float]]) -> BlockRule:
    gamma = len(drafted)
    if len(q) != gamma or len(p) != gamma + 1:
        raise ValueError(f"block_rule: {gamma} drafted tokens need {gamma} drafting and {gamma + 1} target "
                         f"distributions, got {len(q)} and {len(p)}")
    weight = [1.0]  # p_i: the running acceptance weight
    for i, x in enumerate(drafted):
        weight.append(min(weight[-1] * p[i][x] / q[i][x], 1.0) if q[i][x] > 0 else 0.0)
    keep, correction = [1.0], []
    for i in range(gamma + 1):
        if i == gamma:
            correction.append(list(p[gamma]))  # the whole block kept: the next token from the target
            break
        residual = [max(weight[i] * pv - qv, 0.0) for pv, qv in zip(p[i], q[i])]
        mass = sum(residual)
        correction.append([r / mass for r in residual] if mass > 0 else list(p[i]))
        if i:
            keep.append(mass / (mass + 1.0 - weight[i]) if mass + 1.0 - weight[i] > 0 else 1.0)
    keep.append(weight[gamma])
    return BlockRule(keep, correction)


def block_verify(drafted: list[int], q: list[list[float]], p: list[list[float]],
                 flags: list[float], correction_u: float) -> tuple[int, int]:
    """(tau, token): keep the first ``tau`` drafted tokens, then ``token``. ``flags[i-1]`` and
    ``correction_u`` are uniforms in [0, 1): flag i is set when its uniform is below ``keep[i]``,
    tau is the last position whose flag is set (0: none), and the token is the inverse-CDF draw
    of ``correction_u`` from ``correction[tau]``."""
    rule = block_rule(drafted, q, p)
    tau = 0
    for i in range(1, len(drafted) + 1):
        if flags[i - 1] < rule.keep[i]:
            tau = i
    dist, acc = rule.correction[tau], 0.0
    for token, prob in enumerate(dist):
        acc += prob
        if correction_u < acc:
            return tau, token
    return tau, max(range(len(dist)), key=lambda t: dist[t])  # round-off at the top of the CDF
