"""One generate call on vLLM's engine, step by step (``LLMEngine.add_request`` / ``step``), so the
vLLM engine batches continuously as the torch engine does (``rollout/continuous.py``): between
two engine steps rows that became ready join (``admit``) and draft rows give the engine back
(``cut``: aborted, their partial turn reported, continued later from its stream position). Every
step is timed into the engine's cost model (``rollout/step_cost.py``), the measure drafts are
scheduled by (``rollout/drafts.py``).
"""

from __future__ import annotations

import itertools
import time
from typing import Callable

from learner.rollout.sampling import Admit, Completion, OnDone
from learner.rollout.step_cost import StepCost

STEP_TIMEOUT_S = 600.0  # a call whose engine makes no progress for this long fails
_ids = itertools.count()


def _completion(out) -> Completion:
    c = out.outputs[0]
    # logprobs=0: one dict per sampled token holding exactly that token's log-prob
    logps = [float(step[tok].logprob) for tok, step in zip(c.token_ids, c.logprobs or [])]
    return Completion(list(c.token_ids), logps, c.finish_reason == "stop")


def run_requests(engine, rows: list[tuple[list[int], object]], request: Callable, on_done: OnDone | None,
                 admit: Admit | None, cut: Callable[[], list[int]] | None, cost: StepCost) -> list[Completion]:
    """``rows``: (prompt, seed); ``request(prompt, seed)`` -> vLLM SamplingParams. Row i's completion
    goes to ``on_done(i, ...)`` the moment it is final; returns them all, in row order."""
    rid: dict[str, int] = {}
    latest: dict[int, object] = {}
    results: list[Completion | None] = []
    prefill: dict[int, int] = {}  # rows not yet stepped: their prompt lengths (the cost model's prefill)

    def add(batch) -> None:
        for prompt, seed, *_ in batch:
            i = len(results)
            results.append(None)
            name = f"ts-{next(_ids)}"  # (outputs and aborts name a request by the id it was given)
            engine.add_request(name, {"prompt_token_ids": prompt}, request(prompt, seed))
            rid[name] = i
            prefill[i] = len(prompt)

    def finish(i: int, c: Completion) -> None:
        results[i] = c
        if on_done is not None:
            on_done(i, c)

    add(rows)
    try:
        while engine.has_unfinished_requests():
            running = sum(r is None for r in results)
            t0 = time.perf_counter()
            outs = engine.step()
            dt = time.perf_counter() - t0
            if dt > STEP_TIMEOUT_S:
                raise TimeoutError(f"vLLM engine step took {dt:.0f}s (> {STEP_TIMEOUT_S:g}s)")
            if prefill:
                cost.prefill.add(sum(prefill.values()), dt)
                prefill.clear()
            elif running:
                cost.decode.add(running, dt)
            for out in outs:
                i = rid[out.request_id]
                latest[i] = out
                if out.finished:
                    finish(i, _completion(out))
            if cut is not None:
                ending = [i for i in cut() if results[i] is None]
                engine.abort_request([r for r, i in rid.items() if i in ending])
                for i in ending:  # a partial turn: stopped False
                    c = _completion(latest[i]) if i in latest else Completion([], [], False)
                    finish(i, Completion(c.token_ids, c.logprobs, False))
            if admit is not None and engine.has_unfinished_requests():
                add(admit(1))  # vLLM schedules a joining row at no re-batching cost
    except BaseException:
        engine.abort_request([r for r, i in rid.items() if results[i] is None])
        raise
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        raise RuntimeError(f"vLLM ended {len(missing)} requests without a final output")
    return results  # type: ignore[return-value]
