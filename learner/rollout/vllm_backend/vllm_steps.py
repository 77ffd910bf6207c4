"""The vLLM engine's calls, step by step on vLLM's own engine (``LLMEngine.add_request`` /
``step``), so it batches continuously as the torch engine does (``rollout/engine/continuous.py``):
between two engine steps rows that became ready join (``admit``) and draft rows give the engine
back (``cut``: aborted, their partial turn reported, continued later from its stream position).
Every step is timed into the engine's cost model (``rollout/engine/step_cost.py``), the measure drafts
are scheduled by (``rollout/speculation/drafts.py``).

A prefill asked for while a call runs (verification of drafts, from ``admit``) joins the same
engine: its requests step with the running rows, whose outputs still reach the call (vLLM's
``LLM.generate`` cannot run inside a call: it would step, and then sort by id, our requests).
"""

from __future__ import annotations

import itertools
import time
from typing import Callable

from learner.rollout.engine.sampling import Admit, Completion, OnDone
from learner.rollout.engine.step_cost import StepCost

STEP_TIMEOUT_S = 600.0  # an engine step that takes longer fails the call (a stuck engine)


def completion(out) -> Completion:
    c = out.outputs[0]
    # logprobs=0: one dict per sampled token holding exactly that token's log-prob
    logps = [float(step[tok].logprob) for tok, step in zip(c.token_ids, c.logprobs or [])]
    return Completion(list(c.token_ids), logps, c.finish_reason == "stop")


class VllmSteps:
    """One vLLM ``LLMEngine`` driven step by step: at most one generate call at a time, and
    prefills (``prefill``) inside or outside it."""

    def __init__(self, engine, cost: StepCost):
        self.engine, self.cost = engine, cost
        self._names = itertools.count()
        self.call: dict[str, int] = {}  # the running call's requests -> its row
        self.results: list[Completion | None] = []
        self.latest: dict[int, object] = {}  # row -> its last (cumulative) output
        self.on_done: OnDone | None = None
        self.side: dict[str, object] = {}  # prefill requests -> their output (None until finished)
        self._unstepped = 0  # prompt tokens added since the last step (the cost model's prefill size)

    def _add(self, prompt: list[int], params) -> str:
        name = f"ts-{next(self._names)}"  # (outputs and aborts name a request by the id it was given)
        self.engine.add_request(name, {"prompt_token_ids": prompt}, params)
        self._unstepped += len(prompt)
        return name

    def _step(self) -> None:
        running = sum(r is None for r in self.results)
        t0 = time.perf_counter()
        outs = self.engine.step()
        dt = time.perf_counter() - t0
        if dt > STEP_TIMEOUT_S:
            raise TimeoutError(f"vLLM engine step took {dt:.0f}s (> {STEP_TIMEOUT_S:g}s)")
        if self._unstepped:
            self.cost.prefill.add(self._unstepped, dt)
            self._unstepped = 0
        elif running:
            self.cost.decode.add(running, dt)
        for out in outs:
            if out.request_id in self.side:
                if out.finished:
                    self.side[out.request_id] = out
                continue
            i = self.call[out.request_id]
            self.latest[i] = out
            if out.finished:
                self._finish(i, completion(out))

    def _finish(self, i: int, c: Completion) -> None:
        self.results[i] = c
        if self.on_done is not None:
            self.on_done(i, c)

    def generate(self, rows: list[tuple], request: Callable, on_done: OnDone | None, admit: Admit | None,
                 cut: Callable[[], list[int]] | None) -> list[Completion]:
        """``rows``: (prompt, seed, ...); ``request(prompt, seed)`` -> vLLM SamplingParams. Row i's
        completion goes to ``on_done(i, ...)`` the moment it is final; returns them all, in order."""
        self.call, self.results, self.latest, self.on_done = {}, [], {}, on_done
        try:
            self._join(rows, request)
            while any(r is None for r in self.results):
                self._step()
                if cut is not None:
                    ending = [i for i in cut() if self.results[i] is None]
                    self.engine.abort_request([r for r, i in self.call.items() if i in ending])
                    for i in ending:  # a partial turn: stopped False
                        c = completion(self.latest[i]) if i in self.latest else Completion([], [], False)
                        self._finish(i, Completion(c.token_ids, c.logprobs, False))
                if admit is not None and any(r is None for r in self.results):
                    self._join(admit(1), request)  # vLLM schedules a joining row at no re-batching cost
            return list(self.results)  # type: ignore[arg-type]
        finally:
            unfinished = [r for r, i in self.call.items() if self.results[i] is None]
            if unfinished:  # an error: nothing of this call stays in the engine
                self.engine.abort_request(unfinished)
            self.call, self.results, self.latest, self.on_done = {}, [], {}, None

    def _join(self, rows: list[tuple], request: Callable) -> None:
        params = [request(prompt, seed) for prompt, seed, *_ in rows]  # (a bad row fails before any joins)
        for (prompt, *_), p in zip(rows, params):
            self.call[self._add(prompt, p)] = len(self.results)
            self.results.append(None)

    def prefill(self, prompts: list[list[int]], params) -> list:
        """vLLM's outputs for ``prompts`` (one ``params`` for all), stepping any running call along."""
        names = [self._add(p, params) for p in prompts]
        self.side.update((n, None) for n in names)
        try:
            while any(self.side[n] is None for n in names):
                self._step()
            return [self.side[n] for n in names]
        finally:
            unfinished = [n for n in names if self.side.pop(n) is None]
            if unfinished:
                self.engine.abort_request(unfinished)
