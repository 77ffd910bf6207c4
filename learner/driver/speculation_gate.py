"""Whether drafting pays (``rollout.speculation.gate: cost``, docs/speculation.md, "When drafting
pays"): the driver decides, before it hands a batch out as drafts, from what speculation itself
measured in the steps before, as the cost-aware drain does for early learning
(``learner/grad/batching/cost_model.py``).

Per drafted step it measures the drafts' tokens, the share verification kept and the seconds of
verification forwards; every step, the engine seconds per directly sampled token (the union of
each worker's ``rollout.generate`` spans over the tokens sampled outside kept drafts). A batch is
drafted when the expected engine seconds saved,

    gain = drafted tokens × (kept share × seconds per sampled token − verify seconds per drafted token),

are more than ``MARGIN_S`` (a draft's own forwards run in the engine's idle time by the worker's
rule, ``rollout/speculation/drafts.py``; what they cost the step is the wait of a publish's ``Load`` behind one,
at most ``IDLE_STEP_S``, counted here as that margin). Before anything was measured it drafts
one batch (a probe) and no other until that batch's step was measured; while it stands aside it drafts again every ``REPROBE_EVERY``-th batch, so a change
(the policy settling, the machine's load) can turn it back on. Estimates are decayed averages
(``DECAY``) so they follow the machine. Exactness is untouched: a batch not drafted is sampled
directly, as with speculation off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from learner.rollout.speculation.drafts import IDLE_STEP_S
from learner.timeline import Kind, Metric, _get, union_length
from learner.trajectory import Trajectory

DECAY = 0.5  # weight of the older estimate at each new measurement
REPROBE_EVERY = 4  # while standing aside, every this-many-th batch is drafted again to measure
MARGIN_S = IDLE_STEP_S  # a drafted step must be expected to save more than this


def _ema(old: float | None, new: float) -> float:
    return new if old is None else DECAY * old + (1 - DECAY) * new


@dataclass
class Measured:
    """One step's measurements (``observe``): None where the step had none of that kind."""
    drafted_tokens: int = 0
    kept_share: float | None = None
    verify_s_per_token: float | None = None
    decode_s_per_token: float | None = None


def measure(trajs: list[Trajectory], spans: list, t_start: float, t_end: float) -> Measured:
    """What the step's trajectories and spans say: the drafts' tokens and kept share, verification
    seconds per drafted token, and engine seconds per token sampled directly."""
    drafted = [t for t in trajs if t.drafted_tokens]
    tokens = sum(t.drafted_tokens for t in drafted)
    per_worker: dict[str, list] = {}
    verify = []
    for s in spans:
        kind = _get(s, "kind")
        if kind == Kind.GENERATE and _get(s, "lane").startswith("rollout/"):
            per_worker.setdefault(_get(s, "lane").split("/")[1], []).append((_get(s, "t0"), _get(s, "t1")))
        elif kind == Kind.DRAFT_VERIFY:
            verify.append((_get(s, "t0"), _get(s, "t1")))
    direct = sum(t.n_scored - t.kept_tokens for t in trajs)
    generate_s = sum(union_length(iv, t_start, t_end) for iv in per_worker.values())
    return Measured(
        drafted_tokens=tokens,
        kept_share=sum(t.kept_tokens for t in drafted) / tokens if tokens else None,
        verify_s_per_token=union_length(verify, t_start, t_end) / tokens if tokens else None,
        decode_s_per_token=generate_s / direct if direct > 0 and generate_s > 0 else None)


@dataclass
class SpeculationGate:
    """Decayed estimates and the per-batch decision (``decide``), its reasons kept per batch."""
    policy: str = "cost"  # "cost" or "always" (rollout.speculation.gate)
    kept_share: float | None = None
    verify_s_per_token: float | None = None
    decode_s_per_token: float | None = None
    drafted_tokens: float | None = None
    off_since: int | None = None  # the first batch not drafted, while standing aside
    probe: int | None = None  # the batch drafted before anything was measured, until its step is observed
    decided: dict[int, tuple[bool, float]] = field(default_factory=dict)  # batch -> (drafted, estimated gain s)

    def observe(self, m: Measured, step: int) -> None:
        if self.probe is not None and step >= self.probe:
            self.probe = None
        if m.decode_s_per_token is not None:
            self.decode_s_per_token = _ema(self.decode_s_per_token, m.decode_s_per_token)
        if m.drafted_tokens and m.kept_share is not None:
            self.kept_share = _ema(self.kept_share, m.kept_share)
            self.verify_s_per_token = _ema(self.verify_s_per_token, m.verify_s_per_token)
            self.drafted_tokens = _ema(self.drafted_tokens, float(m.drafted_tokens))

    def gain(self) -> float | None:
        """Expected engine seconds a drafted batch saves, or None before a drafted step was measured."""
        if None in (self.kept_share, self.verify_s_per_token, self.decode_s_per_token, self.drafted_tokens):
            return None
        return self.drafted_tokens * (self.kept_share * self.decode_s_per_token - self.verify_s_per_token)

    def decide(self, batch: int) -> bool:
        """Draft ``batch``? Always under ``always``; under ``cost``: when the gain exceeds the margin,
        before any measurement (a probe) and every ``REPROBE_EVERY``-th batch while standing aside."""
        if batch in self.decided:
            return self.decided[batch][0]
        gain = self.gain()
        if self.policy == "always":
            pays = True
        elif gain is None:  # nothing measured yet: one batch drafted to measure (the schedules hand a
            pays = self.probe is None  # batch out before the step ahead of it ends, so the next waits for it)
            self.probe = batch if pays else self.probe
        else:
            pays = gain > MARGIN_S
        if pays:
            self.off_since = None
        elif self.off_since is None:
            self.off_since = batch
        elif (batch - self.off_since) % REPROBE_EVERY == 0:
            pays = True  # re-probe: measure again (the estimates follow the newest measurement)
        self.decided[batch] = (pays, 0.0 if gain is None else gain)
        return pays

    def report(self, step: int) -> dict[str, float]:
        """``speculation/drafting`` (was this step's batch drafted) and ``speculation/est_gain_s``
        (the estimate it was decided on; 0 before any measurement)."""
        drafted, gain = self.decided.pop(step, (False, self.gain() or 0.0))
        return {Metric.SPEC_DRAFTING: float(drafted), Metric.SPEC_EST_GAIN_S: gain}
