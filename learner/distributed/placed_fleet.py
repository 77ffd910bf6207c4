"""Rank 0's rollout fleet when rollouts run on every node (docs/distributed-nodes.md, "Rollouts on every
node"): its own workers (``Fleet``) and each other node's, hosted there by the node's first rank
(``learner.distributed.node_rollouts``), behind the calls the driver makes of a ``Fleet``.

Placement: a group is sampled on the node of the rank that will learn it, the owner the ranks
compute from the dispatch batch's ``{group: size}`` (``assign_owners``: data-parallel ranks train
the on-policy schedules, whose driver begins each batch with exactly the groups of one dispatch
call). Placement only decides where a trajectory is sampled; which rank learns it is decided at
``begin_batch`` as before, so exactness does not depend on it.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from multiprocessing import connection

from learner import stopping
from learner.config import RunConfig
from learner.distributed.assignment import assign_owners
from learner.distributed.remote import RemoteRank
from learner.rollout.processes.fleet import POLL_S, READY_TIMEOUT_S, Fleet, RolloutError, decode
from learner.rollout.processes.messages import WorkItem


class PlacedFleet:
    def __init__(self, cfg: RunConfig, local: Fleet, hosts: dict[str, RemoteRank], origin: float, version: int):
        """``hosts``: {node: the rank that runs its workers}; ``origin``: the run clock's origin on
        this node (each host gets it on its own clock); ``version``: what the stores hold now."""
        self.cfg, self.local, self.hosts = cfg, local, hosts
        self.here = cfg.learner.node_of(0)
        self.receive_timeout_s = cfg.rollout.receive_timeout_s
        self._inbox: deque = deque()
        self._ready: set[str] = set()
        self._acks: dict[str, tuple[int, list]] = {}
        for host in hosts.values():
            host.put(("fleet", "start", origin - host.offset, version))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._ready != hosts.keys():
            stopping.check()
            if time.monotonic() > deadline:
                missing = sorted(hosts.keys() - self._ready)
                raise TimeoutError(f"rollout workers of node(s) {missing} not ready within {READY_TIMEOUT_S:g} s")
            self._pull(POLL_S)

    # -- receiving -----------------------------------------------------------------------------
    def _pull(self, timeout: float) -> None:
        """Wait at most ``timeout`` for a message from any node; take in what arrived."""
        connection.wait([*self.local.booted.conns, *(h.fleet_q for h in self.hosts.values())], timeout)
        while (msg := self.local.poll()) is not None:  # also notices this node's dead workers
            self._inbox.append(msg)
        for node, host in self.hosts.items():
            for msg in host.fleet_q.take_all():
                self._remote(node, msg)

    def _remote(self, node: str, msg: tuple) -> None:
        kind = msg[0]
        if kind == "fleet-msg":
            self._inbox.append(msg[1])
        elif kind == "fleet-acks":
            self._acks[node] = (msg[1], msg[2])
        elif kind == "fleet-ready":
            self._ready.add(node)
        elif kind == "fleet-error":
            raise RolloutError(f"rollout workers of node {node}: {msg[1]}")

    def get(self, timeout: float | None = None, interruptible: bool = True):
        """The next message from any node, within ``timeout`` (default ``rollout.receive_timeout_s``)."""
        limit = self.receive_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not self._inbox:
            if interruptible:
                stopping.check()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no message from the rollout fleet for {limit:g}s (rollout.receive_timeout_s)")
            self._pull(min(left, POLL_S))
        return self._inbox.popleft()

    def poll(self):
        """A message already waiting, or None (never blocks)."""
        if not self._inbox:
            self._pull(0)
        return self._inbox.popleft() if self._inbox else None

    def has_message(self) -> bool:
        return bool(self._inbox) or self.local.has_message() or any(not h.fleet_q.empty() for h in self.hosts.values())

    # -- sending -------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.local.begin_step(step)
        for host in self.hosts.values():
            host.put(("fleet", "begin_step", step))

    def place(self, items: list[WorkItem]) -> dict[str, list[WorkItem]]:
        """``{node: its items}``: a batch's groups on their owner rank's node."""
        node_of = place_groups(Counter(item.group for item in items), self.cfg)
        placed: dict[str, list[WorkItem]] = {}
        for item in items:
            placed.setdefault(node_of[item.group], []).append(item)
        return placed

    def dispatch(self, step: int, items: list[WorkItem]) -> None:
        for node, part in self.place(items).items():
            if node == self.here:
                self.local.dispatch(step, part)
            else:
                self.hosts[node].put(("fleet", "dispatch", step, part))

    def published(self, version: int) -> None:
        """Each other node's host publishes ``version`` from its own rank's weights (bit-identical
        to these after every step: no weights cross the network)."""
        for host in self.hosts.values():
            host.put(("publish", version))

    def load_all(self, version: int, on_other) -> list[tuple[int, float, float]]:
        """Every replica of every node loads ``version``; (worker, t0, t1) per ack."""
        self._acks = {}
        for host in self.hosts.values():
            host.put(("fleet", "load", version))
        acks = self.local.load_all(version, on_other)
        deadline = time.monotonic() + self.receive_timeout_s
        while any(self._acks.get(n, (None,))[0] != version for n in self.hosts):
            while self._inbox:  # what other nodes sent before their acks, in order
                on_other(*decode(self._inbox.popleft()))
            if time.monotonic() > deadline:
                late = sorted(n for n in self.hosts if self._acks.get(n, (None,))[0] != version)
                raise TimeoutError(f"the replicas of node(s) {late} did not load version {version} within "
                                   f"{self.receive_timeout_s:g}s (rollout.receive_timeout_s)")
            self._pull(POLL_S)
        while self._inbox:
            on_other(*decode(self._inbox.popleft()))
        return acks + [ack for n in self.hosts for ack in self._acks[n][1]]

    def close(self) -> None:
        """This node's workers; the other nodes' stop with their rank (``RankPeers.close``)."""
        self.local.close()



def place_groups(sizes: dict[int, int], cfg: RunConfig) -> dict[int, str]:
    """``{group: node}`` for one dispatch batch's ``{group: size}``: each group on the node of the
    rank the ranks will assign it to at ``begin_batch``."""
    lrn = cfg.learner
    owners = assign_owners(sizes, lrn.world_size)
    return {g: lrn.node_of(owners[g]) for g in sizes}
