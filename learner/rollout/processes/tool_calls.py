"""Tool calls of a rollout worker's agent loops, off the loops' thread, each with a timeout.

A worker runs many agent loops over one engine in one thread. A tool's real work runs in
a small thread pool instead, so a slow call (a ``python-sandbox`` program near its wall
limit) stalls only its own trajectory while the other loops keep generating; a call still
running after ``task.tool_timeout_s`` is given up on and its loop gets a "timed out"
observation (the thread itself cannot be killed: it finishes in the background, and the
sandbox's own wall-clock limit bounds how long). The worker's command queue is woken when
a call returns, so an observation never waits for the next engine call.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Hashable

POOL_THREADS = 16  # calls beyond this wait for a free thread (their timeout runs meanwhile)


@dataclass
class Pending:
    future: Future
    t0: float  # run clock when the call was made


class ToolCalls:
    def __init__(self, run_tool: Callable[[str], str], timeout_s: float, now: Callable[[], float],
                 wake: Callable[[], None]):
        self.run_tool, self.timeout_s, self.now, self.wake = run_tool, timeout_s, now, wake
        self.pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="tool")
        self.pending: dict[Hashable, Pending] = {}

    def start(self, key: Hashable, call: str) -> None:
        future = self.pool.submit(self.run_tool, call)
        future.add_done_callback(lambda _: self.wake())
        self.pending[key] = Pending(future, self.now())

    def forget(self, key: Hashable) -> None:
        """The loop no longer waits for this call (a draft cut before it): its result is never reported."""
        self.pending.pop(key, None)

    def next_deadline(self) -> float:
        """Run-clock time at which the earliest pending call times out (inf: none pending)."""
        return min((p.t0 + self.timeout_s for p in self.pending.values()), default=math.inf)

    def finished(self) -> list[tuple[Hashable, float, float, str]]:
        """(key, t0, t1, output) of every call that returned, failed or timed out since the
        last look; t1 - t0 is the tool's real time."""
        now, done = self.now(), []
        for key, p in list(self.pending.items()):
            if p.future.done():
                try:
                    output = p.future.result()
                except Exception as exc:  # a tool that raises: the policy sees why, the run goes on
                    output = f"[tool error: {type(exc).__name__}: {exc}]"
            elif now - p.t0 >= self.timeout_s:
                p.future.cancel()  # not started yet: never runs
                output = f"[tool timed out after {self.timeout_s:g}s]"
            else:
                continue
            del self.pending[key]
            done.append((key, p.t0, now, output))
        return done

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
