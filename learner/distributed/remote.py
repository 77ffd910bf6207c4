"""Learner ranks on other nodes (``learner.nodes``; docs/distributed-nodes.md, "Runs that span nodes").

Rank 0 (the driver, on the first node) listens on a control port; a rank on another node
(``thundersync join-rank``, started there by the controller's task on queue ``runs.<node>``)
connects, authenticated by a shared key (HMAC, ``multiprocessing.connection``), and says
``("hello", rank, node, its monotonic clock)``. Rank 0 answers ``("init", config, world size,
init_method)``: the c10d rendezvous (a TCP store at rank 0's node address and a port rank 0
chose). From then on the connection carries what the local ranks' queues carry
(``learner.distributed.rank_worker``): commands down, phases / step results / errors up. Phases are
stamped with the remote node's ``time.monotonic()``; rank 0 shifts them by the offset seen at
the handshake (its error is the one-way latency of one message).

A lost connection is a failed rank: rank 0 reports ``("error", rank, ...)`` for it, a remote
rank whose rank 0 went away stops; every collective also carries ``learner.timeout_s``.
"""

from __future__ import annotations

import os
import queue
import secrets
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener

from learner.distributed.node_rollouts import FLEET_UP, NodeRollouts, WakeQueue, rollout_hosts

KEY_ENV = "THUNDERSYNC_RANK_KEY"  # hex; the control connection's shared key
ADDR_ENV = "THUNDERSYNC_NODE_ADDR"  # the address other nodes reach this node at
PORT_ENV = "THUNDERSYNC_CONTROL_PORT"  # rank 0's control port (0 or unset: a free one)


def run_key() -> bytes:
    """The control key from the environment (the controller sets it), else a new random one."""
    key = os.environ.get(KEY_ENV)
    return bytes.fromhex(key) if key else secrets.token_bytes(32)


class RemoteRank:
    """Rank 0's handle on one rank of another node: ``put`` like a rank's command queue; a
    reader thread passes what the rank says to ``up_q`` (phases shifted to rank 0's clock)."""

    def __init__(self, conn: Connection, rank: int, node: str, clock_offset: float, up_q):
        self.conn, self.rank, self.node, self.offset, self.up_q = conn, rank, node, clock_offset, up_q
        self.fleet_q = WakeQueue()  # what its node's rollout workers send, if it hosts them (node_rollouts)
        self.lost = False
        self._closing = False
        self._send = threading.Lock()
        threading.Thread(target=self._read, name=f"rank-{rank}-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] in FLEET_UP:
                    self.fleet_q.put(msg)
                    continue
                if msg[0] == "phase":  # ("phase", rank, kind, t0, t1, traj, group)
                    msg = (*msg[:3], msg[3] + self.offset, msg[4] + self.offset, *msg[5:])
                self.up_q.put(msg)
        except (EOFError, OSError):
            if not self._closing:
                self.lost = True
                lost = f"node {self.node}: the connection to rank {self.rank} was lost"
                self.up_q.put(("error", self.rank, lost))
                self.fleet_q.put(("fleet-error", lost))

    def put(self, msg) -> None:
        try:
            with self._send:
                self.conn.send(msg)
        except OSError as err:
            raise RuntimeError(f"learner rank {self.rank} (node {self.node}): cannot reach it: {err}") from None

    def close(self) -> None:
        self._closing = True
        try:
            self.put(("stop",))
        except RuntimeError:
            pass
        self.conn.close()
        self.fleet_q.close()


def accept_ranks(listener: Listener, expected: dict[int, str], init: tuple, up_q, timeout_s: float) -> dict[int, RemoteRank]:
    """Wait (at most ``timeout_s``) until every rank of ``expected`` ({rank: node}) has connected
    and said hello; each is sent ``("init", *init)``. Raises naming the ranks that did not join."""
    joined: dict[int, RemoteRank] = {}
    errors: list[str] = []
    closed = threading.Event()

    def accept() -> None:
        while len(joined) < len(expected) and not closed.is_set():
            try:
                conn = listener.accept()
                if not conn.poll(timeout_s):
                    conn.close()
                    continue
                _, rank, node, their_clock = conn.recv()
            except (OSError, EOFError, AuthenticationError):  # closed at the deadline, a wrong key
                continue
            if expected.get(rank) != node or rank in joined:
                errors.append(f"a rank {rank} on node {node!r} joined; expected {expected}")
                conn.close()
                continue
            offset = time.monotonic() - their_clock
            conn.send(("init", *init))
            joined[rank] = RemoteRank(conn, rank, node, offset, up_q)

    thread = threading.Thread(target=accept, name="rank-acceptor", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if len(joined) < len(expected):
        closed.set()
        listener.close()
        thread.join(5.0)
        for r in joined.values():
            r.close()
        missing = {r: n for r, n in expected.items() if r not in joined}
        raise TimeoutError("; ".join(errors + [
            f"learner rank {r} (node {n}) did not join within learner.timeout_s = {timeout_s:g} s "
            f"(is a worker consuming queue runs.{n}?)" for r, n in missing.items()]))
    return joined


_LOST = ("lost",)


class _Inbox:
    """A remote rank's command queue: ``get(timeout)``. A reader thread takes every message off
    the control connection at once, so the node's rollout commands (``("fleet", ...)``) reach
    its fleet thread even while the rank is inside a backward pass."""

    def __init__(self, conn: Connection, rollouts=None):
        self.conn, self.rollouts = conn, rollouts
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._read, name="control-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] == "fleet" and self.rollouts is not None:
                    self.rollouts.commands.put(msg[1:])
                else:
                    self._q.put(msg)
        except (EOFError, OSError):
            self._q.put(_LOST)

    def get(self, timeout: float):
        msg = self._q.get(timeout=timeout)  # queue.Empty past it
        if msg is _LOST:
            self._q.put(_LOST)  # every later get says so too
            raise RuntimeError("rank 0 closed the control connection (the run ended or its node failed)")
        return msg


class _Outbox:
    """Sends up the control connection; the rank's loop and its node's fleet thread share it."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def put(self, msg) -> None:
        try:
            with self._lock:
                self.conn.send(msg)
        except OSError:
            pass  # rank 0 is gone: the inbox says so


def connect(address: tuple[str, int], key: bytes, timeout_s: float) -> Connection:
    """Connect to rank 0's control port, retrying while it is not listening yet (its driver may
    still be starting), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client(address, authkey=key)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0's control port {address[0]}:{address[1]} did not answer within "
                                   f"{timeout_s:g} s") from None
            time.sleep(0.5)  # polling a port that is not open yet


def join_rank(address: tuple[str, int], rank: int, node: str, key: bytes, timeout_s: float) -> int:
    """``thundersync join-rank``: be learner rank ``rank`` of the run whose rank 0 listens at
    ``address``; returns the exit status (0: the run ended normally)."""
    from learner.config import RunConfig
    from learner.distributed.rank_worker import rank_main
    from learner.models.loading import resolve_model_dir

    conn = connect(address, key, timeout_s)
    conn.send(("hello", rank, node, time.monotonic()))
    if not conn.poll(timeout_s):
        print(f"thundersync: rank 0 at {address[0]}:{address[1]} sent no init within {timeout_s:g} s", file=sys.stderr)
        return 1
    _, cfg_dict, world, init_method = conn.recv()
    cfg = RunConfig.model_validate(cfg_dict)
    # this node's copy of the policy (every rank then starts from rank 0's weights: a broadcast)
    policy_dir = resolve_model_dir(cfg.model.policy, cfg.model.cache_dir, cfg.model.builtin_seed)
    outbox = _Outbox(conn)
    # the node's first rank runs its rollout workers; they import torch while the rank loads
    rollouts = (NodeRollouts(cfg, node, str(policy_dir), outbox.put)
                if rollout_hosts(cfg).get(node) == rank else None)
    try:
        error = rank_main(cfg_dict, str(policy_dir), rank, world, init_method, _Inbox(conn, rollouts), outbox,
                          rollouts)
    finally:
        if rollouts is not None:
            rollouts.close()
        conn.close()
    if error:
        print(f"thundersync: learner rank {rank} (node {node}): {error}", file=sys.stderr)
        return 1
    return 0
