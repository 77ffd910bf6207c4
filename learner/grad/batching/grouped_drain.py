"""The adaptive learner's grouped pool: when it would idle, known rows and the open groups' waiting
members in one plan of micro-batches, each a grouped backward (learner/grad/batching/grouped.py), so an
open row costs about what a known one does and every arrival can be learnt before the groups close
(docs/learner-drain.md, "The grouped backward"). Which of the plan's micro-batches run now is the drain
policy's (``DrainPolicy.grouped_pays``); the rest wait, exactly as they were.

Not used (the per-bucket path instead, exact either way): OPD (no running sums), the deterministic
learner (its fixed-point sum is per micro-batch), the shared-prompt backward (a prompt's keys/values
are one leaf per group, whose cotangent two buckets of one group would share), a model the reduction
does not cover (``GroupedGradients.for_model`` is None) or that refuses it in a forward.
"""

from __future__ import annotations

from typing import Protocol

import torch

from learner.grad.batching.drain import Bucket
from learner.grad.batching.grouped import GroupedGradients, Key, NotReducible, destinations, grouped_into
from learner.grad.batching.microbatch import Forward, MicroBatchRows, Row, forward, grpo_row, plan_micro_batches
from learner.grad.objectives import pg_token_loss
from learner.grad.batching.packing import layout, segmented_layout
from learner.registries.objectives import objective as objective_of


class GroupedHost(Protocol):
    """What the pool needs of the on-policy learner's backward (``OnPolicyBackward``)."""

    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    algo: object
    options: object
    acc: object
    logprobs: object
    policy: object

    def _micro_batch(self, state, rows: MicroBatchRows, bucket: Bucket | None, on_phase,
                     keys: list[Key | None] | None = None) -> float: ...


class GroupedPool:
    """The grouped backward of one learner: the hooks, and the idle-time pool."""

    def __init__(self, host: GroupedHost):
        self.host = host
        opts = host.options
        usable = (opts.grouped_backward and opts.path == "adaptive" and not opts.deterministic
                  and not opts.shared_prompt_backward and objective_of(host.algo.objective).group_advantage)
        self.grouped = GroupedGradients.for_model(host.model, host.acc.params) if usable else None

    @property
    def enabled(self) -> bool:
        return self.grouped is not None and self.host.policy.name != "closed-groups"

    def forward_backward(self, rows: MicroBatchRows, keys: list[Key | None], tally) -> tuple[Forward, None]:
        """One forward and one grouped backward of ``rows`` (``keys``: each row's bucket, None: known)
        into the accumulator; raises ``NotReducible`` before anything is added."""
        host, algo = self.host, self.host.algo
        with_aux = algo.kl_coef > 0 or algo.entropy_coef > 0
        row_dest, dests = destinations(keys, known_in_g=not with_aux)
        rows, keys, row_dest, grid = self._by_destination(rows, keys, row_dest)
        device = host.acc.params[0].device
        token_dest = grid.place([[d + 1] * len(r.ids) for r, d in zip(rows, row_dest)], torch.long, device) - 1
        with self.grouped.capture(token_dest, len(dests)):
            fwd = forward(host.model, host.ref_model, algo, rows, rows.line_width, stats=True, grid=grid)
            pg_terms = fwd.w * pg_token_loss(fwd.logp, fwd.per_row("adv"))
            open_tokens = grid.place([[float(k is not None)] * len(r.ids) for r, k in zip(rows, keys)],
                                     fwd.logp.dtype, device)
            aux = None if fwd.aux is None else fwd.w * fwd.aux
            grouped_into(host.acc, self.grouped, pg_terms, aux, open_tokens, dests)
            with torch.no_grad():  # the loss curve: G's part now, each bucket's at its group's close
                tally.add(fwd, (pg_terms * (1 - open_tokens)).sum())
                for key, value in zip(dests, self.grouped.segment_sums(pg_terms.detach())):
                    if key is not None:
                        tally.add_bucket(key[0], key[1], value)
        for b, row in enumerate(fwd.rows):
            host.logprobs.keep(row.traj, fwd.row_logp(b))
        return fwd, None

    def _by_destination(self, rows: MicroBatchRows, keys: list, row_dest: list[int]):
        """The rows in destination order, so that each destination's tokens are one slice of the grid
        (a padded grid; a packed one whose lines hold one destination each, where that fits the token
        budget): the grouped reduction then needs no gather (``Destinations.slices``)."""
        order = sorted(range(len(rows)), key=lambda i: row_dest[i])
        ordered = MicroBatchRows([rows[i] for i in order], rows.line_width)
        keys, row_dest = [keys[i] for i in order], [row_dest[i] for i in order]
        lengths = [len(r.ids) for r in ordered]
        grid = layout(lengths, rows.line_width)
        if rows.line_width is not None:
            apart = segmented_layout(lengths, row_dest, rows.line_width)
            if apart.slots <= max(self.host.options.budget, grid.slots):
                grid = apart
        return ordered, keys, row_dest, grid

    def idle(self, state, on_phase) -> bool:
        """Nothing waits: plan the known rows and the open members (within K) together and run the
        micro-batches the policy accepts; True if one ran."""
        host = self.host
        buckets = state.planner.open_waiting()
        keyed: list[tuple[Row, Bucket | None]] = [(row, None) for row in state.ready]
        keyed += [(grpo_row(t, 1.0), b) for b in buckets for t in b.trajs]
        if not any(b is not None for _, b in keyed):
            return False
        of = {id(row): b for row, b in keyed}
        parts = plan_micro_batches([row for row, _ in keyed], host.options.budget, host.options.pack_rows)
        waiting = sum(len(r.ids) for r, _ in keyed)
        ran = False
        for k, part in enumerate(parts):
            open_rows = sum(of[id(r)] is not None for r in part)
            slots = layout([len(r.ids) for r in part], part.line_width).slots
            if not host.policy.grouped_pays(state.budget, slots, len(part), open_rows, k + 1 < len(parts), waiting):
                break
            self._run(state, part, of, slots, on_phase)
            waiting -= sum(len(r.ids) for r in part)
            ran = True
        return ran

    def _run(self, state, part: MicroBatchRows, of: dict, slots: int, on_phase) -> None:
        host = self.host
        taken = {id(r) for r in part}
        state.ready = [r for r in state.ready if id(r) not in taken]
        by_bucket: dict[int, tuple[Bucket, list]] = {}
        for row in part:
            bucket = of[id(row)]
            if bucket is not None:
                by_bucket.setdefault(id(bucket), (bucket, []))[1].append(row.traj)
        for bucket, ids in by_bucket.values():
            trajs = [t for t in bucket.trajs if t.id in set(ids)]
            state.planner.take(bucket.group, trajs)
            if bucket.group not in state.opened:
                host.acc.open_group(bucket.group)
                state.opened.add(bucket.group)
                state.peak_buffers = max(state.peak_buffers, host.acc.buffer_count())
            state.speculative += len(trajs) if bucket.speculative else 0
        keys = [None if of[id(r)] is None else (of[id(r)].group, of[id(r)].reward) for r in part]
        if not by_bucket:  # known rows only: the ordinary backward
            host._micro_batch(state, part, None, on_phase)
            return
        try:
            seconds = host._micro_batch(state, part, None, on_phase, keys=keys)
        except NotReducible:  # a module saw other shapes: the per-bucket path from now on, nothing added yet
            self.grouped = None
            host._micro_batch(state, MicroBatchRows([r for r, k in zip(part, keys) if k is None]), None, on_phase) \
                if any(k is None for k in keys) else None
            for bucket, ids in by_bucket.values():
                rows = MicroBatchRows([r for r in part if of[id(r)] is bucket])
                host._micro_batch(state, rows, bucket, on_phase)
            return
        state.grouped_micro_batches += 1
        host.policy.charge_grouped(state.budget, slots, seconds)
