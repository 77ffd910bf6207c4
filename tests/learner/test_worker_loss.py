"""A rollout worker killed with SIGKILL in the middle of a step of a real `thundersync train`
run: it is respawned and its trajectories are sampled again with the same seeds, so the step
trains the same tokens as an uninterrupted run; past ``rollout.max_worker_restarts`` failures
in one step the run fails naming it (docs/processes.md, "A rollout worker dies").

The three runs (uninterrupted, killed once, killed past the limit) run side by side to keep
the wall time near one run's."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from learner.stopping import SHM
from tests.harness.processes import rollout_workers

from .test_cli_faults import CLI, final_weights, group_members, tagged_semaphores, wait_gone

ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, name: str, max_worker_restarts: int) -> Path:
    cfg = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    # a constant modelled tool latency (labelled, configurable: task.tool_latency) keeps a
    # step's trajectories in flight for a while, so the kill finds some mid-way
    cfg["task"]["tool_latency"] = {"distribution": "constant", "median_s": 0.4}
    cfg["rollout"]["max_worker_restarts"] = max_worker_restarts
    cfg["train"].update(schedule="sync", steps=3)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(tmp_path: Path, name: str, max_worker_restarts: int = 1) -> tuple[subprocess.Popen, Path]:
    events = tmp_path / f"{name}.events.jsonl"
    args = ["train", "--config", str(config(tmp_path, name, max_worker_restarts)), "--quiet", "--events", str(events),
            "--dump-step", str(tmp_path / f"{name}.dump"), "--dump-at", "1", "--output", str(tmp_path / name)]
    proc = subprocess.Popen(CLI + args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, events


def kill_worker_in_step(proc: subprocess.Popen, events: Path, step: int, timeout: float = 300) -> int:
    """SIGKILL the rollout worker once a rollout span of ``step`` was written: the step's batch
    is being sampled."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"step {step} never started"
        lines = events.read_text().splitlines() if events.exists() else []
        if any('"rollout.' in line and json.loads(line).get("step") == step for line in lines if '"span"' in line):
            break
        time.sleep(0.05)
    victim, = rollout_workers(proc.pid)
    os.kill(victim, signal.SIGKILL)
    return victim


def trajectories(dump: Path) -> tuple[list[dict], list[list[float]]]:
    """The step's trajectories as trained (tokens, masks, rewards...) and, apart, their
    sampling log-probs: a row batched with other rows may round differently in float32."""
    batch = sorted(json.loads((dump / "batch.json").read_text())["trajectories"], key=lambda t: t["id"])
    return batch, [t.pop("behavior_logprobs") for t in batch]


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        return proc.wait(timeout=timeout), proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_a_killed_rollout_worker_is_respawned_and_its_trajectories_sampled_again(tmp_path):
    plain, _ = start(tmp_path, "plain")
    killed, killed_events = start(tmp_path, "killed")
    fatal, fatal_events = start(tmp_path, "fatal", max_worker_restarts=0)
    try:
        kill_worker_in_step(killed, killed_events, step=1)
        kill_worker_in_step(fatal, fatal_events, step=1)
        rc, err = finish(killed)
        assert rc == 0, err
        respawned = [line for line in err.splitlines() if "respawned" in line]
        assert len(respawned) == 1 and "was killed by SIGKILL in step 1" in respawned[0], err
        assert " 0 trajectories" not in respawned[0]  # the kill found work in flight
        rc_plain, err_plain = finish(plain)
        assert rc_plain == 0, err_plain
        # the step the worker died in trained the same tokens as the uninterrupted run ...
        (again, again_logp), (plain_batch, plain_logp) = (trajectories(tmp_path / f"{n}.dump") for n in ("killed", "plain"))
        assert again == plain_batch and len(again) == 16
        assert all(abs(x - y) < 1e-5 for a, b in zip(again_logp, plain_logp) for x, y in zip(a, b, strict=True))
        # ... and so every later step too: the final weights are equal bit for bit (sync)
        a, b = final_weights(tmp_path / "plain"), final_weights(tmp_path / "killed")
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
        rc_fatal, err_fatal = finish(fatal)
        assert rc_fatal == 1, err_fatal
        assert "more than rollout.max_worker_restarts (0)" in err_fatal and "Traceback" not in err_fatal, err_fatal
        last = json.loads(fatal_events.read_text().splitlines()[-1])
        assert last["type"] == "run" and last["status"] == "failed" and "rollout-0 was killed by SIGKILL" in last["error"]
        for proc in (plain, killed, fatal):  # nothing left: processes, semaphores
            wait_gone(proc.pid)
            assert tagged_semaphores(proc.pid) == [], list(SHM.iterdir())
    finally:
        for proc in (plain, killed, fatal):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.parametrize("value, reason", [(-1, "greater than or equal to 0"), ("many", "valid integer")])
def test_max_worker_restarts_is_validated_naming_the_field(value, reason):
    from learner.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as err:
        parse_config({"rollout": {"max_worker_restarts": value}})
    assert str(err.value).startswith("rollout.max_worker_restarts: ") and reason in str(err.value)


def test_a_scored_turn_sampled_again_is_not_learnt_twice():
    from learner.rollout.processes.in_flight import InFlight
    from learner.rollout.processes.messages import Finished, Spans, WorkItem
    from learner.trajectory import ScoredTurn

    flight = InFlight(workers=2)
    flight.add(flight.least_loaded(), 3, WorkItem(7, 1, None, 70))
    flight.add(flight.least_loaded(), 3, WorkItem(8, 1, None, 80))
    assert [len(items) for items in flight.items] == [1, 1]
    turn = ScoredTurn(traj=7, group=1, step=3, turn=0, input_ids=[1, 2], turn_span=(1, 2), teacher_logprobs=[-0.5],
                      behavior_logprobs=[-0.4], policy_version=0, t_scored=1.0)
    assert flight.arrived(Finished(turn, ["a"])).item is turn
    # worker 0 dies: trajectory 7 goes out again in its dispatch batch with its seed ...
    assert flight.take(0) == {3: [WorkItem(7, 1, None, 70)]}
    assert flight.items[0] == {} and flight.least_loaded(among=[1]) == 1
    flight.add(1, 3, WorkItem(7, 1, None, 70))
    # ... and its turn 0, sampled again (the same tokens), passes only its spans
    assert flight.arrived(Finished(turn, ["b"])) == Spans(["b"])
