"""A run's roles as one Ray placement group, and the node each learner rank lands on.

``run_plan(cfg)`` translates the ``placement`` section (or, without one, ``model.device``) into
one placement group per run. Each role's actor asks for:

- a learner rank: ``GPU 1, CPU cluster.cpus_per_learner`` (no GPU on a CPU run without placement);
- a rollout engine: ``1 / workers_per_gpu`` of a rollout GPU and ``cluster.cpus_per_engine`` CPUs
  (``workers_per_gpu`` engines share one GPU);
- the OPD teacher (``placement.teacher``): ``GPU 1, CPU 1`` per node.

One node (``cluster.nodes: 1``): a bundle per role (the engines sharing a GPU share one bundle),
strategy ``STRICT_PACK``. Several nodes: a bundle per node holding that node's roles (its
``world_size / nodes`` consecutive ranks, its engines and teacher), strategy ``STRICT_SPREAD``:
Ray puts each node's share on a node of its own, and a node's ranks are together, as the
placement says. (A bundle per role with ``PACK`` does not say which roles share a node: a run
smaller than a node is packed onto one.) Ray picks the nodes and, within a bundle, the GPUs;
the ranks' torchrun environment then comes from where each actor runs
(``learner.distributed.ranks.rank_layout``). Nothing here imports Ray or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from learner.registries.engines import process_count


@dataclass(frozen=True)
class Role:
    """One actor: ``kind`` learner | rollout | teacher, its index (rank before layout, worker id),
    the bundle it runs in and the share of that bundle's GPU it takes."""

    kind: str
    index: int
    bundle: int
    gpus: float
    cpus: float

    @property
    def name(self) -> str:
        return f"{self.kind}/{self.index}"


@dataclass(frozen=True)
class RunPlan:
    bundles: list[dict[str, float]]
    strategy: str
    roles: list[Role]
    nodes: int
    ranks_per_node: int

    def needs(self) -> tuple[str, float]:
        """("GPU", n) when the run reserves GPUs, else ("CPU", n): what a wait names."""
        gpus = sum(b.get("GPU", 0.0) for b in self.bundles)
        return ("GPU", gpus) if gpus else ("CPU", sum(b.get("CPU", 0.0) for b in self.bundles))

    def learners(self) -> list[Role]:
        return [r for r in self.roles if r.kind == "learner"]


def run_plan(cfg: Any) -> RunPlan:
    """The run's bundles, roles and strategy (``cfg``: a RunConfig with a ``cluster`` section)."""
    cl = cfg.cluster
    nodes = cl.nodes
    p = cfg.placement
    gpu = 1.0 if (p is not None or cfg.model.device.startswith("cuda")) else 0.0
    bundles: list[dict[str, float]] = []
    roles: list[Role] = []

    def bundle(gpus: float, cpus: float) -> int:
        if nodes > 1 and len(bundles) > node:  # several nodes: the node's one bundle grows
            grown = {k: bundles[node].get(k, 0.0) + v for k, v in (("GPU", gpus), ("CPU", cpus))}
            bundles[node] = {k: v for k, v in grown.items() if v > 0}
            return node
        bundles.append({k: v for k, v in (("GPU", gpus), ("CPU", cpus)) if v > 0} or {"CPU": 0.01})
        return len(bundles) - 1

    workers = process_count(cfg.rollout)
    per_gpu = p.workers_per_gpu if p is not None else 1
    per_node = cfg.ranks_per_node()
    wid = 0
    for node in range(nodes):
        for rank in range(node * per_node, (node + 1) * per_node):
            roles.append(Role("learner", rank, bundle(gpu, cl.cpus_per_learner), gpu, cl.cpus_per_learner))
        if node > 0 and not cfg.rollout.on_every_node:
            continue
        for _gpu in range(workers // per_gpu):
            b = bundle(gpu, per_gpu * cl.cpus_per_engine)
            for _ in range(per_gpu):
                roles.append(Role("rollout", wid, b, gpu / per_gpu, cl.cpus_per_engine))
                wid += 1
        if p is not None and p.teacher is not None:
            roles.append(Role("teacher", node, bundle(1.0, 1.0), 1.0, 1.0))
    return RunPlan(bundles, "STRICT_PACK" if nodes == 1 else "STRICT_SPREAD", roles, nodes, per_node)
