"""Rewards of data tasks: the built-ins and a user's ``module:function``.

``task.reward`` is one of
- ``exact-match``: 1.0 iff the answer text equals the reference after trimming whitespace
  and collapsing inner runs of it;
- ``regex``: ``task.reward_pattern`` is searched in the answer text; group 1 (or the whole
  match) is compared with the reference as exact-match does; no match scores 0;
- ``math-verify``: the ``math-verify`` library parses both (LaTeX, ``\\boxed{}``, plain
  numbers) and checks mathematical equivalence;
- ``path/to/file.py:function`` or ``package.module:function``: a user's function called as
  ``function(completion, answer, row)`` (the answer text, the reference text, the data row
  as a dict) returning a number.

A reward that raises, returns something that is not a finite number, or is still running
after ``task.reward_timeout_s`` (a SIGALRM timer in the worker's main thread interrupts it;
math-verify keeps its own timeouts, which use the same timer) is a ``RewardError``
naming the reward, the row and the reason; ``score`` turns it into a score of 0 when the task
says ``on_bad_data: score-zero`` (the caller counts it).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from learner.tasks.task_data import resolve_path

RewardFn = Callable[[str, str, dict], Any]
BUILTIN_REWARDS: tuple[str, ...] = ("exact-match", "regex", "math-verify")


class RewardError(ValueError):
    """A reward function that failed on one trajectory, or a reward spec that cannot load."""


def _normalise(text: str) -> str:
    return " ".join(text.split())


def exact_match(completion: str, answer: str, row: dict) -> float:
    return 1.0 if _normalise(completion) == _normalise(answer) else 0.0


def regex_reward(pattern: str) -> RewardFn:
    compiled = re.compile(pattern, re.DOTALL)

    def reward(completion: str, answer: str, row: dict) -> float:
        m = compiled.search(completion)
        if m is None:
            return 0.0
        return exact_match(m.group(1) if compiled.groups else m.group(0), answer, row)

    return reward


def math_verify_reward(completion: str, answer: str, row: dict) -> float:
    from math_verify import parse, verify

    # math-verify's own timeouts use SIGALRM, which only the main thread may set; the agent
    # loops run in their process's main thread
    gold = parse(answer if "$" in answer or "\\" in answer else f"${answer}$")
    return 1.0 if verify(gold, parse(completion)) else 0.0


def _load_user_function(spec: str) -> RewardFn:
    module_name, _, func_name = spec.rpartition(":")
    if not module_name or not func_name:
        raise RewardError(f"task.reward: {spec!r} is not a built-in ({', '.join(BUILTIN_REWARDS)}) "
                          "nor 'file.py:function' / 'module:function'")
    try:
        if module_name.endswith(".py"):
            path = resolve_path(module_name)
            if not path.is_file():
                raise RewardError(f"task.reward: {module_name} does not exist")
            unique = f"thundersync_reward_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(unique, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[unique] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except RewardError:
        raise
    except Exception as err:  # a user's module failing at import: its reason, named
        raise RewardError(f"task.reward: importing {module_name} failed: {type(err).__name__}: {err}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise RewardError(f"task.reward: {module_name} has no function {func_name!r}")
    return fn


def load_reward(spec: str, pattern: str | None = None) -> RewardFn:
    if spec == "exact-match":
        return exact_match
    if spec == "regex":
        try:
            return regex_reward(pattern or "")
        except re.error as err:
            raise RewardError(f"task.reward_pattern: not a valid regular expression ({err})") from None
    if spec == "math-verify":
        return math_verify_reward
    return _load_user_function(spec)


class RewardTimeout(BaseException):
    """Raised into a reward function still running at its deadline (not an Exception: the
    function's own ``except Exception`` cannot swallow it)."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Interrupt the block with RewardTimeout after ``seconds`` (main thread only: elsewhere,
    and for ``None``, the block runs unbounded)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise RewardTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def checked_score(fn: RewardFn, spec: str, completion: str, answer: str, row: dict, where: str,
                  timeout_s: float | None = None) -> float:
    """``fn``'s score as a finite float, or a ``RewardError`` naming ``where`` (the row);
    ``timeout_s``: the reward's deadline (``task.reward_timeout_s``; math-verify has its own)."""
    try:
        with time_limit(None if spec == "math-verify" else timeout_s):
            value = fn(completion, answer, row)
    except RewardTimeout:
        raise RewardError(f"task.reward: {spec} did not return within task.reward_timeout_s = {timeout_s:g}s "
                          f"({where})") from None
    except Exception as err:
        raise RewardError(f"task.reward: {spec} raised {type(err).__name__}: {err} ({where})") from None
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise RewardError(f"task.reward: {spec} returned {type(value).__name__} {value!r}, not a number ({where})") from None
    if not math.isfinite(score):
        raise RewardError(f"task.reward: {spec} returned {score} ({where})")
    return score
