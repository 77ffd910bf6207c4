"""The driver's side of the rollout fleet: dispatching groups, receiving trajectories and
scored turns (their spans recorded on the way), weight loads acknowledged by every replica."""

from __future__ import annotations

from collections import deque

from learner.config import RunConfig
from learner.driver.recorder import Recorder
from learner.driver.speculation_gate import SpeculationGate
from learner.tasks.env import Environment, task_for_group
from learner.rollout.processes.fleet import Fleet, decode
from learner.rollout.processes.messages import WorkItem
from learner.trajectory import ScoredTurn, Trajectory


class Rollouts:
    def __init__(self, cfg: RunConfig, fleet: Fleet, env: Environment, rec: Recorder):
        self.cfg, self.fleet, self.env, self.rec = cfg, fleet, env, rec
        self.pending: deque = deque()  # trajectories/turns read early (while draining spans)
        self.next_traj = 0
        self.next_group = 0
        self.dispatch_versions: dict[int, int] = {}  # step -> fleet version its batch was sampled with
        self.planned: dict[int, list[WorkItem]] = {}  # later dispatch batches already handed out as drafts
        self.gate = SpeculationGate(cfg.rollout.speculation.gate)  # does drafting pay (speculation_gate.py)

    def new_groups(self, n: int, step: int, version: int) -> list[int]:
        """Dispatch ``n`` groups of ``group_size`` trajectories on one prompt each, for dispatch
        batch ``step`` (-1: fully-async, assigned when a step takes the group)."""
        items = self.planned.pop(step, None) or self._items(n)
        if step >= 0:
            self.dispatch_versions[step] = version
        self.fleet.dispatch(step, items)
        return list(dict.fromkeys(item.group for item in items))

    def _items(self, n: int) -> list[WorkItem]:
        """The next ``n`` groups' items: ids and seeds in dispatch order, each prompt a function of
        (run seed, group), so a later batch's items are known before it is dispatched."""
        G, items = self.cfg.train.group_size, []
        for _ in range(n):
            g = self.next_group
            self.next_group += 1
            task = task_for_group(self.env, g, self.cfg.seed)
            for _ in range(G):
                items.append(WorkItem(self.next_traj, g, task, self.cfg.seed * 10_000_019 + self.next_traj))
                self.next_traj += 1
        return items

    def draft_ahead(self, step: int) -> None:
        """``rollout.speculation``: batch ``step`` was dispatched; the next ``lookahead`` batches go to
        the fleet as drafts (each once), with the items their dispatch will have (docs/speculation.md),
        where ``self.gate`` says drafting pays; a batch not drafted is sampled directly on dispatch."""
        spec, t = self.cfg.rollout.speculation, self.cfg.train
        for later in range(step + 1, min(step + 1 + spec.lookahead, t.steps) if spec.enabled else 0):
            if later not in self.planned and self.gate.decide(later):
                self.planned[later] = self._items(t.prompts_per_step)
                self.fleet.draft(later, self.planned[later])

    def receive(self, timeout: float | None = None, on_idle=None) -> Trajectory | ScoredTurn:
        """Next trajectory or scored turn from the fleet; spans are emitted on the way.
        ``on_idle()``: called instead of blocking while it returns True (the learner's deferred work)."""
        if self.pending:
            return self.pending.popleft()
        while True:
            got = poll_data(self.fleet)
            if got is None and on_idle is not None and on_idle():
                continue
            if got is None:  # about to wait: the sink writes its queued events meanwhile
                self.rec.sink.idle(self.fleet.has_message)
                t0 = self.rec.now()
                got = decode(self.fleet.get(timeout))
                self.rec.waits.append((t0, self.rec.now()))
            item, spans = got
            self.rec.emit_spans(spans)
            if item is not None:
                return item

    def receive_waiting(self, on_idle=None, everything: bool = False) -> list[Trajectory | ScoredTurn]:
        """The next item (``receive``) and, with ``everything``, all already waiting behind it, for
        the learner to batch as it sees fit (their spans reach the page now, not after its work)."""
        items = [self.receive(on_idle=on_idle)]
        if everything:
            self.drain_spans()
            items += self.pending
            self.pending.clear()
        return items

    def drain_spans(self) -> None:
        """Emit every span the fleet has already sent (async rollouts run beside the learner:
        their spans belong in this step's metrics); keep trajectories for later."""
        while (got := poll_data(self.fleet)) is not None:
            item, spans = got
            self.rec.emit_spans(spans)
            if item is not None:
                self.pending.append(item)

    def ensure_version(self, version: int) -> None:
        """Every replica loads ``version`` and acknowledges it (one span each)."""
        def spans_only(item, spans) -> None:
            if item is not None:
                raise RuntimeError(f"rollout message {type(item).__name__} while replicas load weights")
            self.rec.emit_spans(spans)

        self.rec.replica_spans(self.fleet.load_all(version, on_other=spans_only), version)

    def settle(self, version: int) -> None:
        """End of an off-policy run (publishes there do not wait): every replica loads the
        final version and acknowledges it, so each publish reaches each replica and shows as
        its span; rollouts still in flight are discarded, no step would train them."""
        def late(item, spans) -> None:
            self.rec.emit_spans(spans)

        self.rec.replica_spans(self.fleet.load_all(version, on_other=late), version)


def poll_data(fleet: Fleet) -> tuple[Trajectory | ScoredTurn | None, list] | None:
    """The next data message already waiting, decoded (``fleet.decode``), or None (never blocks)."""
    msg = fleet.poll()
    return None if msg is None else decode(msg)
