"""Runs that span nodes (``learner.nodes``; docs/distributed-nodes.md, "Runs that span nodes").

Every worker knows its node (THUNDERSYNC_NODE; it consumes queue ``runs.<node>``). A run's
first node runs rank 0: the learner driver with the rollout fleet, supervised as any run
(controller/supervision/supervisor.py). If the worker that claimed the run from ``runs`` is another node,
it hands the run to ``runs.<first node>`` (``supervise_on_node``). Rank 0's supervisor picks
the control port and a key, starts the driver with them, and sends one ``run_rank`` task per
rank of another node to ``runs.<node>``; that task runs ``thundersync join-rank`` (which
connects to rank 0, receives the rendezvous and the config), stamps its ``RunNode`` heartbeat
and stops its rank when the run ends. Rank 0's supervisor fails the run when a node's task
failed or stopped stamping (THUNDERSYNC_STALE_S); the driver fails it when a rank's
connection drops or a collective times out (``learner.timeout_s``).

The node registry (``WorkerNode``): every worker stamps the nodes it serves (its own
THUNDERSYNC_NODE and each ``runs.<node>`` queue it consumes) at start and on every reaper pass.
A launch or resume whose ``learner.nodes`` names a node no worker stamped within
THUNDERSYNC_NODE_TTL_S is refused (400 naming ``learner.nodes`` and the node) before anything is
sent, so a made-up name never creates a queue. When a run ends, the ``runs.<node>`` queue of each
of its nodes that no live worker serves (and no other unfinished run is placed on) is deleted
with its binding: a message left there would wait forever.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import subprocess
import time
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from learner.config import NODE_NAME, ConfigError, parse_config
from learner.distributed.ranks import free_port
from learner.distributed.remote import ADDR_ENV, KEY_ENV, PORT_ENV

from controller.supervision import runlog
from controller.broker import forget_queue, start_rank
from controller.models import Run, RunNode, WorkerNode
from controller.limits.outages import OUTAGE_ERRORS, first_line, what_is_down
from controller.supervision.processes import die_with_parent, me, signal_group
from controller.limits.quotas import QuotaExceeded

log = logging.getLogger(__name__)


def placement(config: dict) -> tuple[str | None, dict[int, str]]:
    """(rank 0's node, {rank: node} of the ranks on other nodes) of a run config; (None, {})
    for a run on one node."""
    try:
        learner = parse_config(config).learner
    except ConfigError:
        return None, {}  # the learner reports the config error itself
    first = learner.node_of(0)
    if first is None:
        return None, {}
    return first, {r: learner.node_of(r) for r in range(1, learner.world_size) if learner.node_of(r) != first}


def queue_of(node: str) -> str:
    return f"runs.{node}"


class UnknownNode(QuotaExceeded):
    """A launch naming a node no live worker serves (a 400 on ``learner.nodes``, as a quota's)."""

    def __init__(self, message: str):
        super().__init__("learner.nodes", message, status=400)


def served_nodes(queues) -> list[str]:
    """The nodes a worker consuming ``queues`` serves: its own and each ``runs.<node>`` one."""
    names = {settings.THUNDERSYNC_NODE} | {q.removeprefix("runs.") for q in queues if q.startswith("runs.")}
    return sorted(n for n in names if re.match(NODE_NAME, n))


def stamp(queues) -> list[str]:
    """Register (or refresh) the nodes this worker serves in the node registry."""
    now, names = timezone.now(), served_nodes(queues)
    for name in names:
        WorkerNode.objects.update_or_create(name=name, defaults={"seen": now, "worker": me()})
    return names


def stamp_quietly(queues) -> None:
    """``stamp`` from a worker's start or reaper pass: an outage is logged, not raised."""
    try:
        stamp(queues)
    except OUTAGE_ERRORS as err:
        log.warning("could not stamp this worker's nodes: the %s is unreachable (%s)", what_is_down(err),
                    first_line(err))
    finally:
        connection.close()  # this thread's own; a broken one is not reused


def live_nodes() -> set[str]:
    """Nodes some worker stamped within THUNDERSYNC_NODE_TTL_S."""
    since = timezone.now() - timedelta(seconds=settings.THUNDERSYNC_NODE_TTL_S)
    return set(WorkerNode.objects.filter(seen__gte=since).values_list("name", flat=True))


def check_nodes(config: dict) -> None:
    """Raise UnknownNode when the config's ``learner.nodes`` names a node no live worker serves."""
    try:
        wanted = parse_config(config).learner.nodes or []
    except ConfigError:
        return  # the config's own error is reported where it is validated
    if not wanted:
        return
    live = live_nodes()
    unknown = [n for n in wanted if n not in live]
    if unknown:
        served = ", ".join(sorted(live)) or "none"
        raise UnknownNode(
            f"learner.nodes: no worker serves node {unknown[0]!r} (none reported within "
            f"{settings.THUNDERSYNC_NODE_TTL_S:g}s; nodes served now: {served}): start a worker with "
            f"THUNDERSYNC_NODE={unknown[0]} consuming {queue_of(unknown[0])}, or name a served node")


def release_queues(run_id: int, config: dict) -> list[str]:
    """After the run ended: delete the ``runs.<node>`` queue and binding of each of its nodes that
    no live worker serves and no other unfinished run is placed on (its messages would wait
    forever, and the queue outlive every run). Returns the queues deleted."""
    first, remote = placement(config)
    if first is None:
        return []
    idle = {first, *remote.values()} - live_nodes()
    for nodes in Run.objects.exclude(status__in=Run.FINISHED).exclude(pk=run_id).values_list(
            "config__learner__nodes", flat=True):
        idle -= set(nodes or [])
    for node in sorted(idle):
        forget_queue(queue_of(node))
        log.info("run %s ended: deleted queue %s (no worker serves node %s)", run_id, queue_of(node), node)
    return [queue_of(n) for n in sorted(idle)]


def start_remote_ranks(run: Run, remote: dict[int, str]) -> dict[str, str]:
    """Send each remote rank's task to its node's queue; the environment for rank 0's driver
    (its control port and key, this node's address)."""
    key, port = secrets.token_hex(32), free_port(settings.THUNDERSYNC_NODE_ADDR)
    control = f"{settings.THUNDERSYNC_NODE_ADDR}:{port}"
    RunNode.objects.filter(run=run).delete()  # a resumed attempt starts its ranks afresh
    for rank, node in remote.items():
        RunNode.objects.create(run=run, rank=rank, node=node)  # no heartbeat until its task starts
        start_rank(run.pk, rank, node, control, key, queue_of(node))
    return {KEY_ENV: key, PORT_ENV: str(port), ADDR_ENV: settings.THUNDERSYNC_NODE_ADDR}


def node_failure(run_id: int) -> str | None:
    """Why a node of the run failed (its task reported a failure or stopped stamping), or None."""
    stale_before = timezone.now() - timedelta(seconds=settings.THUNDERSYNC_STALE_S)
    for n in RunNode.objects.filter(run_id=run_id):
        if n.status == RunNode.Status.FAILED:
            return f"learner rank {n.rank} on node {n.node} failed: {n.error}"
        if n.status == RunNode.Status.RUNNING and n.heartbeat is not None and n.heartbeat < stale_before:
            return (f"learner rank {n.rank} on node {n.node} stopped reporting for more than "
                    f"{settings.THUNDERSYNC_STALE_S:g}s (its task or worker died)")
    return None


def run_rank_on_this_node(run_id: int, rank: int, node: str, control: str, key: str) -> str:
    """The body of the ``run_rank`` task: ``thundersync join-rank`` in its own process group
    (dies with this task: parent-death signal), its log in the run directory, the heartbeat
    every THUNDERSYNC_HEARTBEAT_S; stopped when the run ends; returns the rank's final status."""
    if not RunNode.objects.filter(run_id=run_id, rank=rank, status=RunNode.Status.RUNNING).update(
            supervisor=me(), heartbeat=timezone.now()):
        return "skipped"  # the run no longer waits for this rank (a redelivery, a resumed attempt)
    timeout = parse_config(Run.objects.get(pk=run_id).config).learner.timeout_s
    log_path = runlog.run_dir(run_id) / f"rank-{rank}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        child = subprocess.Popen(
            [*settings.THUNDERSYNC_LEARNER_COMMAND, "join-rank", "--control", control, "--rank", str(rank),
             "--node", node, "--timeout", f"{timeout:g}"],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, KEY_ENV: key, "PYTHONUNBUFFERED": "1"}, preexec_fn=die_with_parent)
    try:
        code = _watch(child, run_id, rank)
    finally:  # whatever is left of the rank's process group, waited for
        signal_group(child.pid, signal.SIGKILL, 10.0)
    tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
    status = RunNode.Status.SUCCEEDED if code == 0 else RunNode.Status.FAILED
    error = "" if code == 0 else (f"exit code {code}: " + " | ".join(tail))[:2000]
    RunNode.objects.filter(run_id=run_id, rank=rank).update(status=status, error=error, heartbeat=timezone.now())
    return status


def _watch(child: subprocess.Popen, run_id: int, rank: int) -> int:
    """Stamp the heartbeat until the rank exits; SIGTERM it (SIGKILL after the grace) once the
    run has ended or is being cancelled elsewhere. Returns its exit code."""
    stop_at = kill_at = None
    while True:
        try:
            return child.wait(timeout=settings.THUNDERSYNC_HEARTBEAT_S)
        except subprocess.TimeoutExpired:
            pass
        RunNode.objects.filter(run_id=run_id, rank=rank).update(heartbeat=timezone.now())
        run = Run.objects.only("status", "cancel_requested").get(pk=run_id)
        if stop_at is None and (run.status in Run.FINISHED or run.cancel_requested):
            # rank 0 of a run that succeeded told this rank to stop: it exits by itself once it has
            # stopped its node's rollout workers, so it gets the grace before any signal
            succeeded = run.status == Run.Status.SUCCEEDED and not run.cancel_requested
            stop_at = time.monotonic() + (settings.THUNDERSYNC_CANCEL_GRACE_S if succeeded else 0.0)
        if kill_at is None and stop_at is not None and time.monotonic() >= stop_at:
            log.info("run %s ended (%s): stopping learner rank %s", run_id, run.status, rank)
            signal_group(child.pid, signal.SIGTERM, 0.0)
            kill_at = time.monotonic() + settings.THUNDERSYNC_CANCEL_GRACE_S
        if kill_at is not None and time.monotonic() > kill_at:
            signal_group(child.pid, signal.SIGKILL, 0.0)
