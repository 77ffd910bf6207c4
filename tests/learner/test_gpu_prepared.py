"""The prepared GPU script (bench/gpu_prepared.py) runs on CPU as a dry run, so it cannot rot
between GPU loans: its parts, each in its own process under its own timeout, write one JSON."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_prepared_gpu_script_dry_runs_on_cpu(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.gpu_prepared", "--device", "cpu", "--out", str(tmp_path),
                        "--parts", "env,fingerprint,bf16,resume", "--fingerprint-sizes", "1", "--timeout", "400"],
                       capture_output=True, text=True, timeout=1500)
    report = json.loads((tmp_path / "gpu_prepared.json").read_text())
    parts = report["parts"]
    assert r.returncode == 0, (r.stderr[-2000:], {k: v.get("error") or v.get("stderr") for k, v in parts.items()})
    env = parts["env"]
    assert env["probe"]["warm_parent_cuda_initialised"] is False and env["probe"]["forked_child"]["ok"] is True
    assert env["torch"] and env["shm"]["total_mib"] > 0
    rows = parts["fingerprint"]["rows"]
    assert rows[0]["params_m"] == 1.0 and rows[0]["digest_s"] > 0 and rows[0]["checksum_s"] > 0
    bf16 = parts["bf16"]["steps"]
    assert len(bf16) == 2 and all(s["mismatch/tokens"] > 0 and s["mismatch/max_abs"] > 1e-3 for s in bf16)
    resume = parts["resume"]
    assert resume["killed_after_step_1"] and resume["bitwise_equal"] and resume["max_abs_diff"] == 0.0


def test_unknown_parts_are_refused_naming_the_option(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench.gpu_prepared", "--device", "cpu", "--out", str(tmp_path),
                        "--parts", "env,nope"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--parts: unknown nope" in r.stderr
