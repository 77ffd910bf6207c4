"""Generate a few items of each reasoning-gym dataset before the run starts, in a child process
with a time and a memory limit (``probe_generators``, from ``learner.preflight``).

A generator whose settings make an item cost too much (hundreds of MB, minutes) would
otherwise be found in the middle of step 0 by the rollout workers, with a traceback; one
that raises on its options (a data file without a usable line) after the fleet has booted.
Here it is a one-line ``ConfigError`` naming the dataset, before any worker starts:

    task.datasets[0].config: tower_of_hanoi did not generate 2 items within 60s (max_disks=15, ...)
    task.datasets[0].config: spell_backward failed generating item 0: IndexError: ...

The child is forked (reasoning_gym is imported once, here) and runs under ``RLIMIT_AS`` of its
address space at the fork plus ``PROBE_MEMORY_MB``; the parent kills it after ``PROBE_S``.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import time

from learner.config import ConfigError, TaskConfig

PROBE_ITEMS = 2  # items of each dataset generated before the run
PROBE_S = 60.0  # for all of a dataset's items, its set-up included (knight_swap's defaults take up to 12 s an item)
PROBE_MEMORY_MB = 1024  # address space the child may add to what it had at the fork


def settings_text(config: dict) -> str:
    numbers = [f"{k}={v}" for k, v in config.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k not in ("seed", "size")]
    return f" ({', '.join(numbers)})" if numbers else ""


def address_space(key: str = "VmSize") -> int:
    """Bytes of this process's virtual address space now (VmSize), or at its peak (VmPeak)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return 0


def generate(name: str, config: dict, seed: int, items: int) -> dict:
    """In the child: build the dataset and make ``items`` items; what happened, as a dict."""
    from reasoning_gym.factory import create_dataset

    index = -1
    try:
        dataset = create_dataset(name, **{"seed": seed, **config, "size": items})
        for index in range(items):
            dataset[index]
    except MemoryError:
        return {"error": "memory"}
    except BaseException as err:  # noqa: BLE001 - anything a generator raises is its failure
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        what = "setting up" if index < 0 else f"generating item {index}"
        return {"error": "raised", "reason": f"{what}: {type(err).__name__}{': ' + text if text else ''}"}
    return {"ok": True}


def child(write_fd: int, name: str, config: dict, seed: int, items: int) -> None:
    try:
        limit = address_space() + PROBE_MEMORY_MB * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        result = generate(name, config, seed, items)
        if result.get("error") == "raised" and address_space("VmPeak") > limit - 2**26:
            result = {"error": "memory"}  # out of address space, whatever a C extension made of it
    except BaseException as err:  # noqa: BLE001
        result = {"error": "raised", "reason": f"{type(err).__name__}: {err}"}
    try:
        os.write(write_fd, json.dumps(result).encode()[:4000])
    finally:
        os._exit(0)


def run_child(name: str, config: dict, seed: int, items: int, seconds: float) -> dict:
    """Fork, generate in the child, read its one answer; {"error": "time"} past ``seconds``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        child(write_fd, name, config, seed, items)
    os.close(write_fd)
    deadline, data = time.monotonic() + seconds, b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"error": "time"}
            ready, _, _ = select.select([read_fd], [], [], left)
            if ready:
                chunk = os.read(read_fd, 4096)
                if not chunk:
                    break
                data += chunk
        return json.loads(data) if data else {"error": "died"}
    finally:
        os.close(read_fd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def probe_generators(task: TaskConfig, seed: int, items: int = PROBE_ITEMS, seconds: float = PROBE_S) -> None:
    """Raise ConfigError naming the first dataset that fails, is too slow or too large to generate."""
    if not task.datasets:
        return
    import reasoning_gym.factory  # noqa: F401 - imported once, before the forks

    for i, spec in enumerate(task.datasets):
        config = dict(spec.config)
        started = time.monotonic()
        result = run_child(spec.name, config, seed + i + 1, items, seconds)
        field = f"task.datasets[{i}].config: {spec.name}"
        if result.get("error") == "time":
            raise ConfigError(f"{field} did not generate {items} items within {seconds:g}s{settings_text(config)}: "
                              "an item costs too much work, lower its settings")
        if result.get("error") == "memory":
            raise ConfigError(f"{field} needed more than {PROBE_MEMORY_MB} MiB to generate {items} items"
                              f"{settings_text(config)}: lower its settings")
        if result.get("error") == "died":
            raise ConfigError(f"{field} died generating {items} items after {time.monotonic() - started:.1f}s"
                              f"{settings_text(config)}")
        if result.get("error"):
            raise ConfigError(f"{field} failed {result.get('reason', 'without a reason')}")
