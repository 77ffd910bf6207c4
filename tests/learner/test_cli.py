"""The thundersync console script: config validation and exit codes."""

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "learner.cli"]


def thundersync(*args, cwd=None):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd, timeout=300)


def test_steps_zero_only_validates_the_config():
    r = thundersync("train", "--config", "configs/quickstart.yaml", "--steps", "0")
    assert r.returncode == 0, r.stderr
    assert "config ok" in r.stderr


@pytest.mark.parametrize("body, field", [
    ("train: {group_size: -3}", "train.group_size"),
    ("train: {schedule: warp}", "train.schedule"),
    ("rollout: {temperature: hot}", "rollout.temperature"),
    ("algorithm: {loss_agg_mode: mean}", "algorithm.loss_agg_mode"),
    ("model: {polcy: x}", "model.polcy"),
    ("train: {schedule: streaming}\nalgorithm: {ppo_epochs: 2}", "algorithm.ppo_epochs"),
    ("train: {schedule: async}\nalgorithm: {mini_batches: 4}", "algorithm.mini_batches"),
    ("train: [1, 2", "not valid YAML"),
    ("- a list", "expected a mapping"),
    # what the schema cannot see: the env registry, the model dir, the turn budget
    ("task: {name: chess}", "task.name"),
    ("model: {policy: /nonexistent/model}", "model.policy"),
    ("task: {max_ops: 4, max_turns: 3}", "max_turns"),
    ("model: {device: tpu}", "model.device"),
])
def test_it_rejects_a_bad_config_with_exit_2_and_one_line(tmp_path, body, field):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(body)
    r = thundersync("train", "--config", str(cfg), "--steps", "0")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_it_rejects_a_gpu_it_does_not_have_before_any_run(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("model: {device: cuda}")
    events = tmp_path / "events.jsonl"
    r = thundersync("train", "--config", str(cfg), "--events", str(events))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "model.device: 'cuda' needs a CUDA device" in r.stderr.strip().splitlines()[-1]
    assert '"status":"failed"' in events.read_text()  # whoever reads the stream learns why


def test_it_rejects_a_missing_config_file(tmp_path):
    r = thundersync("train", "--config", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_it_rejects_a_negative_steps_override():
    r = thundersync("train", "--config", "configs/quickstart.yaml", "--steps", "-1")
    assert r.returncode == 2 and "train.steps" in r.stderr


@pytest.mark.parametrize("argv", [["bench", "--quick"], ["bench", "--help"]])
def test_a_subcommand_that_cannot_load_says_why_and_exits_1(monkeypatch, capsys, argv):
    from learner.cli import main

    monkeypatch.setitem(sys.modules, "learner.bench.run", None)  # its import now raises ImportError
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("thundersync: bench: cannot load learner.bench.run: ModuleNotFoundError")
    assert main(["train", "--config", "configs/quickstart.yaml", "--steps", "0"]) == 0  # the others still work


def wandb_records(path: Path):
    """The records of an offline W&B run file: a 7-byte header (":W&B", magic, version), then
    the LevelDB log format (32 KiB blocks; each chunk: crc32, length, type FULL/FIRST/MIDDLE/LAST)
    holding protobuf ``Record``s. wandb 0.30 has no Python reader of its own any more."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B", data[:8]
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(run_dir: Path) -> list[dict]:
    [run_file] = run_dir.glob("**/offline-run-*/run-*.wandb")
    return [{"step": record.history.step.num,
             **{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}}
            for record in wandb_records(run_file) if record.WhichOneof("record_type") == "history"]


def test_quickstart_trains_one_step_and_writes_events_tensorboard_and_wandb(tmp_path):
    """One tiny run with every sink: the JSONL stream, TensorBoard event files and an offline
    W&B run (no network), each read back and compared with the step's metrics."""
    events, board = tmp_path / "events.jsonl", tmp_path / "tb"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb-dir"),
           "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
           "WANDB_SILENT": "true"}
    r = subprocess.run(CLI + ["train", "--config", "configs/quickstart.yaml", "--events", str(events),
                              "--tensorboard", str(board), "--wandb"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr

    lines = [json.loads(x) for x in events.read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["status"] == "started"
    assert lines[-1]["type"] == "run" and lines[-1]["status"] == "finished"
    metrics = [e for e in lines if e["type"] == "metrics"]
    assert len(metrics) == 1
    assert sum(1 for e in lines if e["type"] == "span" and e["kind"] == "learner.optimizer") == 1
    backward = [e for e in lines if e["type"] == "span" and e["kind"] == "learner.backward"]
    assert backward and all(e["tokens"] > 0 for e in backward)  # the tokens each backward trained on
    # the boot phases the run page shows while the run starts, in order
    boot = [line for line in r.stderr.splitlines() if line.startswith("boot: ")]
    assert [b.split()[1] for b in boot] == ["starting", "loading"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board_events = EventAccumulator(str(board))
    board_events.Reload()
    for name, value in metrics[0]["values"].items():
        if isinstance(value, (int, float)):
            [scalar] = board_events.Scalars(name)
            assert scalar.step == 0 and scalar.value == pytest.approx(value, rel=1e-6, abs=1e-6)

    [logged] = wandb_history(board / "wandb")  # tracking.wandb writes beside tracking.tensorboard
    assert logged["step"] == 0, logged
    numeric = {k: v for k, v in metrics[0]["values"].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    assert numeric and set(numeric) <= set(logged)
    for name, value in numeric.items():
        assert logged[name] == pytest.approx(value, rel=1e-6, abs=1e-6), name


@pytest.mark.slow
def test_an_async_step_after_the_first_dumps_and_passes_the_audit(tmp_path):
    """Step 1 of async trains batch 1, sampled by version 0, at version 1: ratios != 1."""
    dump = tmp_path / "dump"
    r = thundersync("train", "--config", "configs/quickstart.yaml", "--schedule", "async", "--steps", "2",
                    "--dump-step", str(dump), "--dump-at", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    batch = json.loads((dump / "batch.json").read_text())
    assert batch["off_policy"] and batch["step"] == 1 and batch["trained_version"] == 1
    assert {v for t in batch["trajectories"] for v in t["turn_versions"]} == {0}
    audit = thundersync("audit", str(dump))
    result = json.loads(audit.stdout)
    assert audit.returncode == 0 and result["passed"] and result["max_abs_log_ratio"] > 0, audit.stdout + audit.stderr


def test_it_rejects_a_dump_step_outside_the_run(tmp_path):
    r = thundersync("train", "--config", "configs/quickstart.yaml", "--steps", "2",
                    "--dump-step", str(tmp_path / "dump"), "--dump-at", "5")
    assert r.returncode == 2 and "--dump-at" in r.stderr, r.stderr


def _model_dir(root: Path, config: dict) -> Path:
    """A directory the preflight takes for a Hugging Face model: config.json and a weights file."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    (root / "model.safetensors").write_bytes(b"")
    return root


@pytest.mark.parametrize("config", [{"vocab_size": 32000}, {"text_config": {"vocab_size": 151936}}])
def test_vllm_speculation_on_a_large_vocabulary_is_refused_before_any_worker_starts(tmp_path, config):
    model = _model_dir(tmp_path / "model", config)
    cfg = tmp_path / "spec.yaml"
    cfg.write_text(f"model: {{policy: {model}}}\nrollout: {{engine: vllm, speculation: {{enabled: true}}}}")
    r = thundersync("train", "--config", str(cfg), "--steps", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    assert len(lines) == 1 and "invalid config: rollout.speculation: " in lines[0] and f"has {size}" in lines[0], r.stderr


def test_vllm_speculation_on_a_small_vocabulary_and_torch_speculation_on_a_large_one_pass_the_preflight(tmp_path):
    from learner.config import parse_config
    from learner.preflight import MAX_VLLM_VERIFY_VOCAB, preflight

    small = _model_dir(tmp_path / "small", {"vocab_size": MAX_VLLM_VERIFY_VOCAB})
    large = _model_dir(tmp_path / "large", {"vocab_size": MAX_VLLM_VERIFY_VOCAB + 1})
    preflight(parse_config({"model": {"policy": str(small)},
                            "rollout": {"engine": "vllm", "speculation": {"enabled": True}}}))
    preflight(parse_config({"model": {"policy": str(large)},
                            "rollout": {"engine": "torch", "speculation": {"enabled": True}}}))
    preflight(parse_config({"model": {"policy": str(large)}, "rollout": {"engine": "vllm"}}))
