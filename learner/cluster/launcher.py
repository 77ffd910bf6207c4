"""The driver's side of a run on a Ray cluster: join it, reserve the run's one placement group,
start every role as an actor on its bundle, give the learner ranks torchrun's environment,
surface any actor's death as an error naming its role and node, and remove the actors and the
placement group on every exit path (``ClusterRun`` is a context manager).

Imported only when a run has a ``cluster`` section (it imports Ray).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from learner.cluster.plan import Role, RunPlan, run_plan
from learner.distributed.ranks import RankEnv, rank_layout

RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class ClusterError(RuntimeError):
    """The cluster could not host the run, or one of its actors failed (the message names it)."""


def resolve_address(address: str) -> str:
    """The address ``ray.init`` gets for ``cluster.address``."""
    if address == "env":
        if not os.environ.get("RAY_ADDRESS"):
            raise ClusterError("cluster.address: env, but RAY_ADDRESS is not set")
        return os.environ["RAY_ADDRESS"]
    return address


def connect(address: str) -> bool:
    """Join the cluster unless this process already has; True when this call joined it."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=resolve_address(address), include_dashboard=False, log_to_driver=True,
                 configure_logging=False)
    except ConnectionError as err:
        raise ClusterError(f"cluster.address: cannot join the Ray cluster at {address}: {err}") from None
    return True


def waiting_sentence(plan: RunPlan) -> str | None:
    """"waiting for 8 GPUs on the cluster: 6 free" (free now; the total too when it never fits).
    None while Ray's view says enough is free: its resource report lags a reservation or a
    release by a report interval, so that view is the lag, not news to tell."""
    kind, needed = plan.needs()
    free = ray.available_resources().get(kind, 0.0)
    total = ray.cluster_resources().get(kind, 0.0)
    if free >= needed and total >= needed:
        return None
    text = f"waiting for {needed:g} {kind}s on the cluster: {free:g} free"
    return text + (f" (it has {total:g} in all)" if total < needed else "")


def reserve(plan: RunPlan, wait_s: float, say: Callable[[str], None], name: str = ""):
    """The run's placement group, once Ray has reserved every bundle; while it waits, ``say``s
    what it waits for each time that changes; after ``wait_s`` it removes the request and
    raises ``ClusterError`` with that sentence."""
    pg = placement_group(plan.bundles, strategy=plan.strategy, name=name)
    deadline = time.monotonic() + wait_s
    said = None
    try:
        while not pg.wait(timeout_seconds=max(0.1, min(1.0, deadline - time.monotonic()))):
            sentence = waiting_sentence(plan) or said
            if time.monotonic() >= deadline:
                kind, needed = plan.needs()
                sentence = sentence or f"waiting for {needed:g} {kind}s on the cluster"
                raise ClusterError(f"{sentence}; gave up after cluster.wait_s {wait_s:g} s")
            if sentence and sentence != said:
                say(sentence)
                said = sentence
    except BaseException:
        remove_placement_group(pg)
        raise
    return pg


class RoleActor:
    """Every role's actor (a learner rank, a rollout engine, the teacher): it reports where it
    runs, joins the learner's process group with torchrun's environment, and runs functions."""

    def __init__(self, role: str):
        self.role = role

    def info(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"role": self.role, "node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "env": {k: os.environ.get(k) for k in RANK_VARS}}

    def free_port(self) -> int:
        from learner.distributed.ranks import free_port

        return free_port(ray.util.get_node_ip_address())

    def init_rank(self, env: dict, device: str, timeout_s: float) -> dict:
        """Join the process group as ``env`` says (gloo on CPU, NCCL beside gloo on a GPU)."""
        from learner.distributed.ranks import init_rank

        os.environ.update(env)
        init_rank(int(env["RANK"]), int(env["WORLD_SIZE"]), f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                  timeout_s, local_rank=int(env["LOCAL_RANK"]), device=device,
                  local_world_size=int(env["LOCAL_WORLD_SIZE"]))
        return self.info()

    def call(self, fn: Callable, *args: Any) -> Any:
        return fn(*args)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


RemoteRole = ray.remote(max_restarts=0, max_task_retries=0)(RoleActor)


def role_device(cfg) -> str:
    """A role's device inside its actor: Ray sets CUDA_VISIBLE_DEVICES to the GPU(s) it assigned,
    so the first visible GPU is the actor's own; ``model.device: cpu`` computes on CPU."""
    return "cuda:0" if cfg.model.device.startswith("cuda") else "cpu"


class ClusterRun:
    """One run's placement group and actors. ``with ClusterRun(cfg) as run:`` reserves and starts
    them; leaving the block (normally, by an error, by an actor's death) kills every actor and
    removes the placement group."""

    def __init__(self, cfg, say: Callable[[str], None] | None = None, name: str | None = None):
        self.cfg, self.plan = cfg, run_plan(cfg)
        self.say = say or (lambda text: print(f"thundersync: {text}", file=sys.stderr, flush=True))
        self.name = name or f"thundersync-{cfg.name}-{os.getpid()}-{time.monotonic_ns()}"
        self.pg = None
        self.actors: dict[str, Any] = {}  # role name -> actor handle
        self.roles: dict[str, Role] = {}
        self.infos: dict[str, dict] = {}
        self.ranks: list[RankEnv] = []
        self._joined = False

    def __enter__(self) -> "ClusterRun":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- start -------------------------------------------------------------------------------
    def start(self) -> None:
        self._joined = connect(self.cfg.cluster.address)
        self.pg = reserve(self.plan, self.cfg.cluster.wait_s, self.say, self.name)
        self.roles = {role.name: role for role in self.plan.roles}
        for name, role in self.roles.items():
            strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=role.bundle)
            self.actors[name] = RemoteRole.options(num_cpus=role.cpus, num_gpus=role.gpus, scheduling_strategy=strategy,
                                                   name=f"{self.name}/{name}").remote(name)
        self.infos = dict(zip(self.actors, self.gather({n: a.info.remote() for n, a in self.actors.items()})))
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        rank_node_ids = [self.infos[r.name]["node_id"] for r in self.plan.learners()]
        port = self.gather({"learner/0": self.actors["learner/0"].free_port.remote()})[0]
        self.ranks = rank_layout(rank_node_ids, ips[rank_node_ids[0]], port)

    def join_process_group(self) -> list[dict]:
        """Every learner rank joins one process group with torchrun's environment (rank 0's node
        holds the TCP store); returns each rank's report, in rank order."""
        device = role_device(self.cfg)
        calls = {f"learner/{e.rank}": self.actors[f"learner/{e.rank}"].init_rank.remote(e.environ(), device,
                                                                                         self.cfg.learner.timeout_s)
                 for e in self.ranks}
        return self.gather(calls)

    # -- calls -------------------------------------------------------------------------------
    def call_learners(self, fn: Callable, *args: Any) -> list:
        """``fn(*args)`` on every learner rank at once; results in rank order."""
        return self.gather({f"learner/{e.rank}": self.actors[f"learner/{e.rank}"].call.remote(fn, *args)
                            for e in self.ranks})

    def where(self, name: str) -> str:
        info = self.infos.get(name)
        return f"node {info['node_ip']} ({info['node_id'][:8]})" if info else "a node not yet known"

    def gather(self, calls: dict[str, Any], timeout_s: float | None = None) -> list:
        """The results of ``calls`` (role name -> object ref). An actor that dies or raises ends
        the wait at once with ``ClusterError`` naming its role and node; every wait is bounded by
        ``learner.timeout_s``."""
        timeout_s = self.cfg.learner.timeout_s if timeout_s is None else timeout_s
        by_ref = {ref: name for name, ref in calls.items()}
        results: dict[str, Any] = {}
        pending = list(by_ref)
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                names = ", ".join(by_ref[r] for r in pending)
                raise ClusterError(f"{names} did not answer within learner.timeout_s {timeout_s:g} s")
            done, pending = ray.wait(pending, num_returns=1, timeout=min(1.0, remaining))
            for ref in done:
                name = by_ref[ref]
                try:
                    results[name] = ray.get(ref, timeout=5)
                except RayActorError as err:
                    reason = str(err).strip().splitlines()
                    raise ClusterError(f"{name} on {self.where(name)} died"
                                       + (f": {reason[0][:300]}" if reason else "")) from None
                except RayTaskError as err:
                    cause = err.cause if err.cause is not None else err
                    raise ClusterError(f"{name} on {self.where(name)} failed: {type(cause).__name__}: "
                                       f"{str(cause).splitlines()[0] if str(cause) else ''}") from None
                except GetTimeoutError:
                    raise ClusterError(f"{name} did not answer within learner.timeout_s {timeout_s:g} s") from None
        return [results[name] for name in calls]

    # -- stop --------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every actor and remove the placement group (each step even if another fails)."""
        for actor in self.actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        self.actors.clear()
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:
                pass
            self.pg = None
        if self._joined:
            ray.shutdown()
            self._joined = False
