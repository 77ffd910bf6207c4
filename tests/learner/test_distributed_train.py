"""`thundersync train` with data-parallel learner ranks (docs/distributed.md): a step two ranks
learn is audited independently, equals the single-process step with clipping active, and
three steps keep staleness 0 with every rank's weights bit-identical (checked every step)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file


CLI = [sys.executable, "-m", "learner.cli"]


def thundersync(*args):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=900)


def config(tmp_path: Path, name: str, dtype: str = "float32", **train) -> Path:
    cfg = yaml.safe_load(Path("configs/quickstart.yaml").read_text())
    cfg["train"].update(train)
    cfg["model"]["dtype"] = dtype
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def weights(out_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out_dir / "model.safetensors"))


@pytest.mark.slow
def test_two_ranks_learn_a_step_that_audit_recomputes_and_equals_the_single_process_step(tmp_path):
    # float64 through the torch engine: round-off ~1e-16, so "equal" can be asserted tightly.
    # grad_clip far below the gradient's norm: the step is clipped, on the reduced gradient only
    lr = 5e-4
    cfg = config(tmp_path, "clip", "float64", grad_clip=0.01, lr=lr, output_dir=str(tmp_path / "w2"))
    r = thundersync("train", "--config", str(cfg), "--learner-world-size", "2", "--steps", "1", "--quiet",
                    "--dump-step", str(tmp_path / "dump"), "--events", str(tmp_path / "w2.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    audit = thundersync("audit", str(tmp_path / "dump"))
    assert audit.returncode == 0, audit.stdout + audit.stderr[-2000:]
    assert json.loads(audit.stdout)["passed"]

    evs = events(tmp_path / "w2.jsonl")
    backward_lanes = {e["lane"] for e in evs if e["type"] == "span" and e["kind"] == "learner.backward"}
    # each rank on its own lane; a rank whose groups all had equal rewards runs no backward at all
    # (the zero-variance skip, docs/learner.md), so the lanes are a non-empty subset
    assert backward_lanes and backward_lanes <= {"learner/0", "learner/1"}
    values = next(e for e in evs if e["type"] == "metrics")["values"]
    assert values["actor/grad_norm"] > 0.01  # clipping was active
    assert values["learner/ranks_in_sync"] == 1.0  # every rank's parameters hashed bit-identical
    assert {"learner/0/idle_ratio", "learner/1/idle_ratio"} <= set(values)
    assert values["learner/0/trajectories"] + values["learner/1/trajectories"] == 16
    assert values["learner/0/trajectories"] > 0 and values["learner/1/trajectories"] > 0  # both ranks got groups

    cfg1 = config(tmp_path, "clip1", "float64", grad_clip=0.01, lr=lr, output_dir=str(tmp_path / "w1"))
    r1 = thundersync("train", "--config", str(cfg1), "--steps", "1", "--quiet", "--events", str(tmp_path / "w1.jsonl"),
                     "--dump-step", str(tmp_path / "dump1"))
    assert r1.returncode == 0, r1.stderr[-3000:]
    values1 = next(e for e in events(tmp_path / "w1.jsonl") if e["type"] == "metrics")["values"]
    assert values1["reward/mean"] == values["reward/mean"]  # the same batch was sampled
    # the mismatch metric from every rank's own log-probs (rank 0 forwards none of rank 1's)
    assert values["mismatch/tokens"] == values1["mismatch/tokens"] > 0
    assert values["mismatch/max_abs"] == pytest.approx(values1["mismatch/max_abs"], abs=1e-12)
    # the reduced gradient is the single-process gradient up to float64 summation order ...
    g1, g2 = torch.load(tmp_path / "dump1" / "grad.pt"), torch.load(tmp_path / "dump" / "grad.pt")
    assert all(g1[n].dtype == torch.float64 for n in g1)
    num = sum(float((g1[n] - g2[n]).square().sum()) for n in g1) ** 0.5
    den = sum(float(g1[n].square().sum()) for n in g1) ** 0.5
    assert num <= 1e-12 * den, num / den
    # ... and so is the clipped step: the parameters after it differ by round-off, within the
    # bound of AdamW's first update (docs/distributed.md, "One step equals the single-process step")
    w1, w2 = weights(tmp_path / "w1"), weights(tmp_path / "w2")
    start = weights(Path(next(e for e in evs if e.get("status") == "started")["policy_dir"]))
    moved = max(float((w1[n].double() - start[n].double()).abs().max()) for n in w1)
    diff = max(float((w1[n] - w2[n]).abs().max()) for n in w1)
    clip_coef = 0.01 / values1["actor/grad_norm"]
    bound = adamw_first_step_bound(g1, g2, clip_coef, lr) + 4 * max(float(w.abs().max()) for w in w1.values()) * 2**-52
    assert moved == pytest.approx(lr, rel=1e-3) and diff <= bound and diff <= 1e-9 * lr, (diff, bound, moved)


def adamw_first_step_bound(g_a: dict, g_b: dict, clip_coef: float, lr: float, eps: float = 1e-8) -> float:
    """Largest change of AdamW's first update lr·ĝ/(|ĝ| + eps) when the clipped gradient ĝ moves
    by Δĝ: its slope in ĝ is eps/(|ĝ| + eps)² ≤ 1/eps, and it cannot move by more than 2·lr."""
    dg = max(float((g_a[n].double() - g_b[n].double()).abs().max()) for n in g_a) * clip_coef
    return lr * min(dg / eps, 2.0)


@pytest.mark.slow
def test_three_steps_on_two_ranks_keep_staleness_zero_identical_weights_and_resume_from_a_checkpoint(tmp_path):
    import shutil

    out = tmp_path / "out"
    cfg = config(tmp_path, "three", "float64")
    r = thundersync("train", "--config", str(cfg), "--learner-world-size", "2", "--steps", "3", "--quiet",
                    "--events", str(tmp_path / "ev.jsonl"), "--output", str(out), "--checkpoint-every", "1")
    assert r.returncode == 0, r.stderr[-3000:]  # the driver checks every rank's parameter digest each step
    metrics = [e["values"] for e in events(tmp_path / "ev.jsonl") if e["type"] == "metrics"]
    assert len(metrics) == 3
    for m in metrics:
        assert m["staleness/max"] == 0 and m["learner/ranks_in_sync"] == 1.0
    # resume from the checkpoint after step 1: rank 0 loads model and optimizer, every other rank
    # gets both from it (a broadcast); the digest check would fail the run if any rank's AdamW
    # moments differed from rank 0's
    final = weights(out)
    shutil.rmtree(out / "checkpoints" / "step-000002")
    (out / "model.safetensors").unlink()
    r = thundersync("train", "--resume", str(out), "--quiet", "--events", str(tmp_path / "resumed.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = [e["values"] for e in events(tmp_path / "resumed.jsonl") if e["type"] == "metrics"]
    assert [m["reward/mean"] for m in resumed] == [metrics[2]["reward/mean"]]
    assert resumed[0]["learner/ranks_in_sync"] == 1.0 and resumed[0]["policy/version"] == 3.0
    again = weights(out)
    # streaming sums in arrival order (docs/checkpoints.md); in float64 that is round-off
    assert max(float((final[n] - again[n]).abs().max()) for n in final) <= 1e-12


@pytest.mark.slow
def test_a_learner_rank_killed_mid_run_stops_the_run_with_a_clear_error_and_no_orphans(tmp_path):
    import os
    import signal
    import time

    cfg = config(tmp_path, "kill", steps=50)
    ev = tmp_path / "ev.jsonl"
    proc = subprocess.Popen(CLI + ["train", "--config", str(cfg), "--learner-world-size", "2", "--quiet",
                                   "--events", str(ev)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        pids = None
        while pids is None and time.monotonic() < deadline and proc.poll() is None:
            if ev.exists():  # the first step's metrics: the run trains, every rank is up
                evs = [json.loads(line) for line in ev.read_text().splitlines() if line.strip()]
                if any(e["type"] == "metrics" for e in evs):
                    pids = next(e["learner_rank_pids"] for e in evs if e.get("status") == "started")
            time.sleep(0.2)  # polling a file another process writes
        assert pids, "the run never reached its first step"
        os.kill(pids[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "learner rank 1" in err, err[-2000:]
    status = [json.loads(line) for line in ev.read_text().splitlines()][-1]
    assert status["status"] == "failed" and "learner rank 1" in status["error"]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.slow
def test_an_open_group_on_one_rank_fails_train_on_every_rank_with_a_clear_error(tmp_path):
    """Rank 1 loses one trajectory of a group it owns (tests/harness/open_group): at the barrier
    every rank raises, no optimizer step, the run fails naming the open group, nothing is left."""
    import os

    cfg = config(tmp_path, "open", steps=2)
    ev = tmp_path / "ev.jsonl"
    harness = Path(__file__).resolve().parents[1] / "harness" / "open_group"
    env = {**os.environ, "THUNDERSYNC_TEST_OPEN_GROUP_RANK": "1",
           "PYTHONPATH": os.pathsep.join([str(harness), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(CLI + ["train", "--config", str(cfg), "--learner-world-size", "2", "--quiet", "--events",
                              str(ev)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode != 0
    evs = events(ev)
    status = evs[-1]
    assert status["status"] == "failed", status
    # rank 0's own barrier error and rank 1's, which names the group it could not close
    assert "DistributedBatchError" in status["error"] and "still open" in status["error"], status["error"]
    assert "rank 1: groups not complete" in status["error"], status["error"]
    assert not any(e["type"] == "metrics" for e in evs)  # no optimizer step was taken
    pids = next(e["learner_rank_pids"] for e in evs if e.get("status") == "started")
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
