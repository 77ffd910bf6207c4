"""The rollout engine's weights follow ``model.dtype`` unless ``rollout.dtype`` says otherwise
(a bf16 engine beside a float32 learner), and the barrier's mismatch metric reports that pair's
larger differences instead of failing the run."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from learner.config import parse_config
from learner.rollout.engine.factory import engine_dtype, make_engine
from learner.rollout.processes.weights import WeightStore
from tests.learner.test_engine import tiny_model


@pytest.mark.parametrize("model_dtype, rollout_dtype, want", [
    ("float32", None, torch.float32), ("float64", None, torch.float64), ("bfloat16", None, torch.bfloat16),
    ("float32", "bfloat16", torch.bfloat16)])
def test_the_engine_loads_the_dtype_the_config_asks_for(tmp_path, model_dtype, rollout_dtype, want):
    tiny_model().save_pretrained(tmp_path)
    body = {"model": {"dtype": model_dtype}, "rollout": {"continuous_batching": False}}
    if rollout_dtype:
        body["rollout"]["dtype"] = rollout_dtype
    cfg = parse_config(body)
    assert getattr(torch, engine_dtype(cfg)) == want
    engine = make_engine(cfg, str(tmp_path), SimpleNamespace(pad_token_id=0), 0)
    assert {p.dtype for p in engine.model.parameters()} == {want}
    # a float32 learner's published weights load into it, rounded to its dtype
    learner = tiny_model(1)
    store = WeightStore({n: p.detach() for n, p in learner.named_parameters()})
    store.publish({n: p.detach() for n, p in learner.named_parameters()}, 1)
    store.read_into(engine.load_weights, want=1)
    got = dict(engine.model.named_parameters())
    for n, p in learner.named_parameters():
        assert torch.equal(got[n], p.detach().to(want))


@pytest.mark.slow
def test_a_bf16_engine_beside_a_float32_learner_reports_the_mismatch_and_trains(tmp_path):
    cfg = yaml.safe_load(Path("configs/quickstart.yaml").read_text())
    cfg["rollout"]["dtype"] = "bfloat16"
    path = tmp_path / "bf16.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(path), "--steps", "2", "--quiet",
                        "--output", str(tmp_path / "out"), "--events", str(tmp_path / "ev.jsonl")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = [json.loads(line)["values"] for line in (tmp_path / "ev.jsonl").read_text().splitlines()
               if json.loads(line)["type"] == "metrics"]
    assert len(metrics) == 2
    for m in metrics:
        assert m["mismatch/tokens"] > 0
        # bf16 weights against float32: far beyond the same-dtype check's 1e-3, reported, not fatal
        assert 1e-3 < m["mismatch/max_abs"] < 5.0 and m["mismatch/kl"] > 0


def test_a_weight_store_larger_than_the_free_shared_memory_is_refused_naming_the_mount_and_size(monkeypatch):
    from learner.rollout.processes import weights

    params = {"w": torch.zeros(1_000_000), "v": torch.zeros(10, dtype=torch.float64)}  # 4 MB + 80 B on the wire
    with pytest.raises(weights.SharedMemoryTooSmall) as err:
        weights.check_shared_memory(4_000_080, mount="/dev/shm", free=16 * 2**20)  # 16 MiB free: under 4 MB + headroom
    assert "/dev/shm" in str(err.value) and "needs 4 MiB" in str(err.value) and "16 MiB free" in str(err.value)
    assert "--shm-size=1g" in str(err.value)
    weights.check_shared_memory(4_000_080, free=64 * 2**20)  # fits
    monkeypatch.setattr(weights, "shm_free_bytes", lambda mount=weights.SHM_MOUNT: 8 * 2**20)
    with pytest.raises(weights.SharedMemoryTooSmall, match=r"in /dev/shm, which has 8 MiB free"):
        weights.WeightStore(params)  # checked before any shared tensor is made
    monkeypatch.undo()
    assert weights.shm_free_bytes() is None or weights.shm_free_bytes() > 0
    weights.WeightStore(params)  # this machine's /dev/shm holds it
