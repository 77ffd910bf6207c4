"""A run that spans two nodes through two real Celery worker processes (docs/distributed-nodes.md,
"Runs that span nodes"): node a consumes ``runs.a``, node b consumes ``runs`` and ``runs.b``.
Node b claims the run and hands it to node a (rank 0, the driver and its rollout worker), whose
supervisor sends rank 1's task to ``runs.b``; both ranks rendezvous through rank 0's TCP store,
each node samples its own rank's groups, and the page's spans come from both nodes. Then node b's task is killed mid-run: the run fails
everywhere within the bound and nothing of either node is left running."""

import os
import signal
import time

import pytest

from controller.config_merge import run_config
from controller.supervision.launching import launch_run
from controller.models import Experiment, Run, RunNode, Span, StepMetric

from tests.harness.web_harness import browser_page, live_url  # noqa: F401 (fixtures)

from .conftest import QUICKSTART
from .test_browser_insight import open_run_page
from .faults import WorkerProcess, assert_nothing_left, children, proc_stat, wait_final, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
BOUND_S = 60.0
TWO_NODES = {**QUICKSTART, "learner": {"world_size": 2, "nodes": ["a", "b"], "timeout_s": 60}}


@pytest.fixture
def two_nodes(tmp_path):
    started = []
    try:
        started.append(WorkerProcess(tmp_path / "runs", tmp_path / "node-a.log", queues="runs.a", node="a"))
        started.append(WorkerProcess(tmp_path / "runs", tmp_path / "node-b.log", queues="runs,runs.b", node="b"))
        yield started
    finally:
        Run.objects.exclude(status__in=Run.FINISHED).update(cancel_requested=True)
        for w in started:
            w.stop()


def test_a_run_spans_two_nodes_and_fails_everywhere_when_one_node_dies(two_nodes, alice, alice_client,
                                                                      streaming_preset, live_url, browser_page):
    node_a, node_b = two_nodes
    experiment = Experiment.objects.create(owner=alice, name="two nodes", config=TWO_NODES)
    assert run_config(experiment.config, streaming_preset.overrides(), 1, "")["learner"]["nodes"] == ["a", "b"]

    run = wait_final(launch_run(experiment, streaming_preset, steps=1).pk, 300)
    assert run.status == "succeeded", run.error
    lanes = set(Span.objects.filter(run=run, kind="learner.backward").values_list("lane", flat=True))
    # each node's rank on its own lane (a rank whose groups all had equal rewards runs no backward:
    # the zero-variance skip, docs/learner.md); both ranks got trajectories
    assert lanes and lanes <= {"learner/0@a", "learner/1@b"}
    values = StepMetric.objects.get(run=run, step=0).values
    assert values["learner/0/trajectories"] > 0 and values["learner/1/trajectories"] > 0
    served = alice_client.get(f"/api/runs/{run.pk}/spans/?limit=5000").json()["spans"]  # what pages replay
    assert {s["lane"] for s in served if s["kind"] == "learner.backward"} == lanes
    # rollouts on both nodes (docs/distributed-nodes.md, "Rollouts on every node"): worker 1 is node b's
    generated = {s["lane"].split("/")[1] for s in served if s["kind"] == "rollout.generate"}
    assert generated == {"0", "1"}, generated
    assert {s["lane"] for s in served if s["kind"] == "learner.publish"} >= {"replica/0", "replica/1"}
    # and on the page: the Gantt's lanes hold both nodes' ranks and both nodes' rollout slots
    page, errors = browser_page
    open_run_page(page, live_url, run)
    shown = page.evaluate("document.getElementById('gantt').layout.yaxis.categoryarray")
    assert lanes <= set(shown) and {lane.split("/")[1] for lane in shown if lane.startswith("rollout/")} == {"0", "1"}
    assert errors == []
    assert run.summary["steps"] == 1
    # node b's task records its rank's end once join-rank has stopped its rollout worker too
    wait_until(lambda: RunNode.objects.get(run=run).status != "running", 30, "node b's task to finish")
    rank1 = RunNode.objects.get(run=run)
    assert (rank1.rank, rank1.node, rank1.status) == (1, "b", "succeeded")
    assert b"handed to node a" in node_b.log_path.read_bytes()  # claimed on b, rank 0 on a
    assert_nothing_left(run)

    # node b's task dies mid-run (its pool process, and with it the rank it runs)
    run_id = launch_run(experiment, streaming_preset, steps=200).pk
    wait_until(lambda: Span.objects.filter(run_id=run_id, lane="learner/1@b").exists(), 300, "rank 1 learning on b")
    pool_b = node_b.pool_child()
    rank_pids = children(pool_b)
    rank_pids += [w for p in rank_pids for w in children(p)]  # node b's rollout worker, the rank's child
    os.kill(pool_b, signal.SIGKILL)
    t0 = time.monotonic()
    run = wait_final(run_id, BOUND_S)
    assert time.monotonic() - t0 < BOUND_S
    assert run.status == "failed" and "rank 1" in run.error, run.error
    assert_nothing_left(run)  # node a: the driver's process group
    assert len(rank_pids) >= 2  # thundersync join-rank, started by the task, and its rollout worker
    wait_until(lambda: all((stat := proc_stat(p)) is None or stat[0] == "Z" for p in rank_pids), 30,
               "node b's rank process and its rollout worker are gone")
    assert not Run.objects.exclude(status__in=Run.FINISHED).exists()
