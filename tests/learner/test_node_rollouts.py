"""Rollouts on every node of a run that spans nodes (docs/distributed-nodes.md, "Rollouts on every node"):
where groups are placed, and two real "nodes" on this machine (rank 0 through ``thundersync
train``, rank 1 through ``thundersync join-rank`` with its own rollout worker), one killed."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from multiprocessing import connection
from pathlib import Path

import pytest

from learner.config import parse_config
from learner.distributed.assignment import assign_owners
from learner.distributed.node_rollouts import WakeQueue, rollout_hosts
from learner.distributed.placed_fleet import place_groups

CLI = [sys.executable, "-m", "learner.cli"]
TWO_NODES = {"learner": {"world_size": 2, "nodes": ["a", "b"], "timeout_s": 120}}


def test_each_batch_group_is_sampled_on_the_node_of_the_rank_that_learns_it():
    cfg = parse_config({"learner": {"world_size": 4, "nodes": ["a", "b"]}})
    sizes = {g: 4 for g in range(10, 16)}
    placed = place_groups(sizes, cfg)
    owners = assign_owners(sizes, 4)  # what every rank computes at begin_batch
    assert placed == {g: "a" if owners[g] < 2 else "b" for g in sizes}
    assert set(placed.values()) == {"a", "b"}


def test_which_rank_hosts_a_nodes_rollouts():
    assert rollout_hosts(parse_config({"learner": {"world_size": 4, "nodes": ["a", "b"]}})) == {"b": 2}
    assert rollout_hosts(parse_config({"learner": {"world_size": 3, "nodes": ["a", "b", "c"]}})) == {"b": 1, "c": 2}
    assert rollout_hosts(parse_config({**TWO_NODES, "rollout": {"on_every_node": False}})) == {}
    assert rollout_hosts(parse_config({"learner": {"world_size": 2}})) == {}


def test_a_wake_queue_ends_a_wait_when_another_thread_puts():
    q = WakeQueue()
    try:
        assert connection.wait([q], 0.05) == [] and q.take_all() == []
        threading.Timer(0.1, q.put, args=(("fleet-msg", 1),)).start()
        t0 = time.monotonic()
        assert connection.wait([q], 30.0) == [q]
        assert time.monotonic() - t0 < 25.0
        q.put(("fleet-msg", 2))
        assert q.take_all() == [("fleet-msg", 1), ("fleet-msg", 2)]
        assert connection.wait([q], 0.05) == []  # its wake-ups were read with the messages
    finally:
        q.close()


# ------------------------------------------------------------------ two nodes on this machine


def _start_two_nodes(tmp_path: Path, steps: int, objective: str = "grpo", engine: str = "torch",
                     env_a: dict | None = None,
                     via_b: tuple[list[str], dict] = ([], {})) -> tuple[subprocess.Popen, subprocess.Popen]:
    """Rank 0 (``train``, node a) and, once it prints the command, rank 1 (``join-rank``, node b);
    ``env_a``: node a's extra environment; ``via_b``: node b's command prefix and environment."""
    cfg = {"name": "two-nodes", "seed": 0, "model": {"policy": "builtin:tiny"},
           "task": {"name": "arith-tool", "min_ops": 1, "max_ops": 2, "max_operand": 20,
                    "tool_latency": {"distribution": "lognormal", "median_s": 0.05, "sigma": 0.8}},
           "rollout": {"engine": engine, "workers": 1, "replicas": 1, "max_new_tokens": 24},
           "algorithm": {"objective": objective}, **TWO_NODES,
           "train": {"schedule": "streaming", "steps": steps, "prompts_per_step": 4, "group_size": 4, "lr": 5e-4}}
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if k != "THUNDERSYNC_RANK_KEY"}
    a = subprocess.Popen(CLI + ["train", "--config", str(tmp_path / "run.json"), "--events", str(tmp_path / "ev.jsonl"),
                                "--quiet"], stderr=subprocess.PIPE, text=True, env={**env, **(env_a or {})},
                         start_new_session=True)
    deadline, line = time.monotonic() + 300, ""
    while "join-rank" not in line:
        assert time.monotonic() < deadline and a.poll() is None, "rank 0 printed no join-rank command"
        line = a.stderr.readline()
    key, control = re.search(r"THUNDERSYNC_RANK_KEY=(\w+) .* --control (\S+)", line).groups()
    threading.Thread(target=a.stderr.read, daemon=True).start()  # keep its pipe drained
    b = subprocess.Popen(via_b[0] + CLI + ["join-rank", "--control", control, "--rank", "1", "--node", "b"],
                         env={**env, **via_b[1], "THUNDERSYNC_RANK_KEY": key}, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    return a, b


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.fixture
def network_namespace():
    """Node b's own network stack: a namespace joined to this one by a veth pair, each end with
    its own address (``ip netns``; needs root and iproute2, as on this project's machines).
    Yields (node a's address, node a's interface, node b's interface, the command prefix)."""
    tag = os.getpid() % 100_000
    ns, a_if, b_if, net = f"ts-b{tag}", f"tsa{tag}", f"tsb{tag}", f"10.77.{tag % 250}"
    setup = [["ip", "netns", "add", ns], ["ip", "link", "add", a_if, "type", "veth", "peer", "name", b_if],
             ["ip", "link", "set", b_if, "netns", ns], ["ip", "addr", "add", f"{net}.1/24", "dev", a_if],
             ["ip", "link", "set", a_if, "up"], ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", b_if],
             ["ip", "netns", "exec", ns, "ip", "link", "set", b_if, "up"],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    try:
        for cmd in setup:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            if r.returncode:
                pytest.skip(f"no network namespaces here ({' '.join(cmd)}: {r.stderr.strip()})")
        yield f"{net}.1", a_if, b_if, ["ip", "netns", "exec", ns]
    finally:
        subprocess.run(["ip", "link", "del", a_if], capture_output=True, timeout=30)  # its peer goes with it
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _run_to_the_end(a: subprocess.Popen, b: subprocess.Popen, tmp_path: Path) -> list[dict]:
    try:
        assert a.wait(timeout=400) == 0
        assert b.wait(timeout=60) == 0, b.stderr.read()
    finally:
        for p in (a, b):
            p.kill()
    return [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_node_b_samples_its_ranks_groups_with_its_own_published_weights_opd_on_loopback(tmp_path):
    """OPD (node b's teacher scores its turns on node b), both nodes on 127.0.0.1."""
    _check_two_node_run(_run_to_the_end(*_start_two_nodes(tmp_path, steps=2, objective="opd"), tmp_path))


@pytest.mark.slow
def test_each_node_runs_its_own_vllm_replica(tmp_path):
    """vLLM: one replica per node (node b's loads the weights node b's rank published), on loopback."""
    _check_two_node_run(_run_to_the_end(*_start_two_nodes(tmp_path, steps=2, engine="vllm"), tmp_path))


@pytest.mark.slow
def test_node_b_samples_its_ranks_groups_with_its_own_network_stack(tmp_path, network_namespace):
    """GRPO with node b in a network namespace: control port, TCP store, gloo and the rollout
    messages all cross a veth link between two addresses, not loopback (docs/distributed-nodes.md)."""
    addr_a, if_a, if_b, prefix = network_namespace
    run = _start_two_nodes(tmp_path, steps=2, env_a={"THUNDERSYNC_NODE_ADDR": addr_a, "GLOO_SOCKET_IFNAME": if_a},
                           via_b=(prefix, {"GLOO_SOCKET_IFNAME": if_b}))
    _check_two_node_run(_run_to_the_end(*run, tmp_path))


def _check_two_node_run(events: list[dict]) -> None:
    spans = [e for e in events if e["type"] == "span"]
    metrics = [e["values"] for e in events if e["type"] == "metrics"]
    assert len(metrics) == 2
    started = next(e for e in events if e["type"] == "run" and e["status"] == "started")
    assert started["workers"] == 2  # one per node
    for step in (0, 1):
        sampled = {w: {s["group"] for s in spans if s["step"] == step and s["kind"] == "rollout.verify"
                       and s["lane"].startswith(f"rollout/{w}/")} for w in (0, 1)}
        owners = assign_owners({g: 4 for g in sampled[0] | sampled[1]}, 2)
        # worker 0 is node a's, worker 1 node b's: each group on its owner rank's node
        assert sampled[0] == {g for g, r in owners.items() if r == 0} and len(sampled[0]) == 2
        assert sampled[1] == {g for g, r in owners.items() if r == 1} and len(sampled[1]) == 2
        # a group learnt on rank 1 (node b) was sampled there
        learnt_b = {s["group"] for s in spans if s["step"] == step and s["lane"] == "learner/1@b"
                    and s["kind"] == "learner.backward"}
        assert learnt_b <= sampled[1]
    # node b's replica loaded every version, published there from rank 1's own weights
    publishes = Counter(s["lane"] for s in spans if s["kind"] == "learner.publish" and s["lane"].startswith("replica/"))
    assert publishes == {"replica/0": 2, "replica/1": 2}
    for m in metrics:
        assert m["learner/ranks_in_sync"] == 1.0 and m["staleness/max"] == 0.0
        # rank 0 recomputes every behaviour log-prob: node b sampled with the same weights
        assert m["mismatch/tokens"] > 0 and m["mismatch/kl"] < 1e-9


@pytest.mark.slow
def test_killing_node_b_fails_rank_0_naming_it_and_leaves_no_worker(tmp_path):
    a, b = _start_two_nodes(tmp_path, steps=30)
    try:
        deadline = time.monotonic() + 300
        workers: list[int] = []
        while not workers or not (tmp_path / "ev.jsonl").exists() or '"rollout/1/' not in (tmp_path / "ev.jsonl").read_text():
            assert time.monotonic() < deadline and a.poll() is None and b.poll() is None, "node b never sampled"
            workers = _children(b.pid)
            time.sleep(0.5)  # polling the event file for node b's first span
        os.kill(b.pid, signal.SIGKILL)
        assert a.wait(timeout=150) != 0
        t_end = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < t_end:
            time.sleep(0.2)  # the parent-death signal reaches them at once; reaping takes a moment
        assert not [w for w in workers if _alive(w)], "node b's rollout worker outlived its rank"
    finally:
        for p in (a, b):
            p.kill()
    events = [json.loads(line) for line in (tmp_path / "ev.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["type"] == "run" and e["status"] == "failed"]
    assert failed and re.search(r"rank 1|node b", failed[-1].get("error", "")), failed
