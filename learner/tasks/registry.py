"""Which environment a run's ``task.name`` builds (``make_env``): the built-in tasks, and any
a user adds with ``register_env`` (a factory taking the ``TaskConfig``; it wins over a
built-in of the same name). docs/tasks.md is the user's guide.

The task modules only define their environments; this module knows them and imports one when
it is named (the data tasks import their libraries: datasets, reasoning-gym), so imports run
one way: tasks -> env, data_env, sandbox_task -> env.
"""

from __future__ import annotations

from typing import Callable

from learner.config import TaskConfig
from learner.tasks.env import ArithToolEnv, Environment

EnvFactory = Callable[[TaskConfig], Environment]
_REGISTRY: dict[str, EnvFactory] = {}
BUILTIN_TASKS: tuple[str, ...] = ("arith-tool", "dataset", "reasoning-gym", "python-sandbox")


def register_env(name: str, factory: EnvFactory) -> None:
    """Make ``make_env`` build ``factory(config)`` for tasks named ``name``."""
    _REGISTRY[name] = factory


def builtin_factory(name: str) -> EnvFactory | None:
    """The built-in task called ``name`` (its module imported now), or None."""
    if name == "arith-tool":
        return ArithToolEnv
    if name == "python-sandbox":
        from learner.tasks.sandbox_task import PythonSandboxEnv

        return PythonSandboxEnv
    if name in ("dataset", "reasoning-gym"):
        from learner.tasks.data_env import DatasetEnv, ReasoningGymEnv

        return {DatasetEnv.name: DatasetEnv, ReasoningGymEnv.name: ReasoningGymEnv}[name]
    return None


def make_env(config: TaskConfig) -> Environment:
    factory = _REGISTRY.get(config.name) or builtin_factory(config.name)
    if factory is None:
        known = ", ".join(sorted({*_REGISTRY, *BUILTIN_TASKS}))
        raise ValueError(f"task.name: unknown environment {config.name!r} (registered: {known})")
    return factory(config)
