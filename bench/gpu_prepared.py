"""The prepared GPU script: what only a GPU can confirm, in one call of a lent machine (docs/gpu.md,
"What only a GPU confirms"). Every part runs in its own process under its own timeout; a part
that fails or times out is recorded with its error and the rest still run. One JSON file.

    python -m bench.gpu_prepared --device cuda --out "$OUT"            # on the GPU machine
    python -m bench.gpu_prepared --device cpu --out /tmp/gp --size tiny --parts env,bf16    # a dry run

Parts (``--parts``, default all):
  env          torch / CUDA versions, /dev/shm size and free space; the warm runner's start-up leaves
               CUDA uninitialised in its process; a child forked from it allocates on the device
  fingerprint  ranks' weight check: SHA-256 digest vs on-device checksum at 10M and 100M parameters
  gpu_check    bench.gpu_check at ``--size`` with the sync / streaming / streaming-captured runs
  bf16         a bf16 engine beside an fp32 learner (quickstart, 2 steps): the mismatch figures
  ranks        W = 2 learner ranks sharing the device (quickstart, float32, 2 steps): in sync
  resume       3 checkpointed steps; the same run SIGKILLed after its step-1 checkpoint and resumed:
               final weights compared bit for bit
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTS = ("env", "fingerprint", "gpu_check", "bf16", "ranks", "resume")
ROOT = Path(__file__).resolve().parents[1]

# Runs inside a fresh interpreter: the warm runner's own start-up, then a fork that uses the device.
_ENV_PROBE = r"""
import json, os, sys
import torch
device = sys.argv[1]
from learner.warm import server
server.preload()
parent_initialised = torch.cuda.is_initialized()
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # what a run forked from the warm runner does first on a GPU
    try:
        x = torch.ones(1024, device=device) * 2
        msg = {"ok": float(x.sum()) == 2048.0, "device": str(x.device)}
    except BaseException as exc:
        msg = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    os.write(w, json.dumps(msg).encode())
    os._exit(0)
os.close(w)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(r, 65536) or b"{}")
print(json.dumps({"warm_parent_cuda_initialised": parent_initialised, "forked_child": child,
                  "child_exit": status}))
"""


def _run(cmd: list[str], timeout_s: float, env: dict | None = None) -> dict:
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                             env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        return {"ok": False, "error": f"timed out after {timeout_s:g} s", "stderr": (exc.stderr or "")[-2000:]
                if isinstance(exc.stderr, str) else "", "wall_s": time.monotonic() - t0}
    return {"ok": out.returncode == 0, "returncode": out.returncode, "stdout": out.stdout[-4000:],
            "stderr": out.stderr[-2000:], "wall_s": time.monotonic() - t0}


def _last_json(text: str):
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def _shm() -> dict:
    try:
        st = os.statvfs("/dev/shm")
        return {"total_mib": st.f_blocks * st.f_frsize / 2**20, "free_mib": st.f_bavail * st.f_frsize / 2**20}
    except OSError as exc:
        return {"error": str(exc)}


def part_env(args) -> dict:
    import torch

    got = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "shm": _shm(), "device": args.device}
    probe = _run([sys.executable, "-c", _ENV_PROBE, args.device], args.timeout)
    got["probe"] = _last_json(probe["stdout"]) or probe
    result = got["probe"] if isinstance(got["probe"], dict) else {}
    got["ok"] = result.get("warm_parent_cuda_initialised") is False and result.get("forked_child", {}).get("ok") is True
    if args.device.startswith("cuda"):  # versions as the device reports them
        got["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return got


def part_fingerprint(args) -> dict:
    path = Path(args.out) / "fingerprint.json"
    r = _run([sys.executable, "-m", "bench.decisions.weights_fingerprint", "--device", args.device, "--sizes",
              args.fingerprint_sizes, "--json", str(path)], args.timeout)
    if path.exists():
        r["rows"] = json.loads(path.read_text())
    return r


def part_gpu_check(args) -> dict:
    path = Path(args.out) / "gpu_check.json"
    cmd = [sys.executable, "-m", "bench.gpu_check", "--device", args.device, "--sizes", args.size, "--json", str(path)]
    if args.device == "cpu":  # a dry run: every part, smaller (as tests/learner/test_gpu_check.py)
        cmd += ["--groups", "2", "--group-size", "2", "--prompt-len", "8", "--new-tokens", "8", "--exact-groups", "1",
                "--run-steps", "2", "--run-prompts", "2", "--run-group-size", "2"]
    r = _run(cmd, args.timeout)
    if path.exists():
        r["result"] = json.loads(path.read_text())
    return r


def _config(args, tmp: Path, name: str, **overrides) -> Path:
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    cfg["model"]["device"] = "cuda" if args.device.startswith("cuda") else "cpu"
    for section, values in overrides.items():
        cfg.setdefault(section, {}).update(values)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(args, cfg: Path, out: Path, *extra: str) -> tuple[dict, list[dict]]:
    events = out.with_suffix(".jsonl")
    r = _run([sys.executable, "-m", "learner.cli", "train", "--config", str(cfg), "--quiet", "--output", str(out),
              "--events", str(events), *extra], args.timeout)
    metrics = [json.loads(line)["values"] for line in events.read_text().splitlines()
               if json.loads(line).get("type") == "metrics"] if events.exists() else []
    return r, metrics


def _pick(metrics: list[dict], prefix: tuple[str, ...]) -> list[dict]:
    return [{k: v for k, v in m.items() if k.startswith(prefix)} for m in metrics]


def part_bf16(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(args, Path(tmp), "bf16", rollout={"dtype": "bfloat16"}, train={"steps": 2})
        r, metrics = _train(args, cfg, Path(tmp) / "out")
    r["steps"] = _pick(metrics, ("mismatch/", "reward/mean"))
    r["ok"] = r["ok"] and len(metrics) == 2
    return r


def part_ranks(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(args, Path(tmp), "ranks", train={"steps": 2}, learner={"timeout_s": 60})
        r, metrics = _train(args, cfg, Path(tmp) / "out", "--learner-world-size", "2")
    r["steps"] = _pick(metrics, ("learner/ranks_in_sync", "mismatch/", "learner/0/", "learner/1/"))
    r["ok"] = r["ok"] and len(metrics) == 2 and all(m.get("learner/ranks_in_sync") == 1.0 for m in metrics)
    return r


def part_resume(args) -> dict:
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = _config(args, tmp, "resume", train={"steps": 3, "checkpoint_every": 1})
        whole, _ = _train(args, cfg, tmp / "whole")
        if not whole["ok"]:
            return {"ok": False, "error": "the uninterrupted run failed", "run": whole}
        out, events = tmp / "killed", tmp / "killed.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "learner.cli", "train", "--config", str(cfg), "--quiet",
                                 "--output", str(out), "--events", str(events)], cwd=ROOT, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline, killed = time.monotonic() + args.timeout, False
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "checkpoints" / "step-000001").is_dir():  # after step 1: kill mid-run
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.05)  # polling for a directory, not standing in for work
        proc.wait(timeout=30)
        resumed = _run([sys.executable, "-m", "learner.cli", "train", "--resume", str(out), "--quiet"], args.timeout)
        a, b = load_file(str(tmp / "whole" / "model.safetensors")), (
            load_file(str(out / "model.safetensors")) if (out / "model.safetensors").exists() else {})
        same = bool(b) and a.keys() == b.keys() and all(bool((a[n] == b[n]).all()) and a[n].dtype == b[n].dtype
                                                        for n in a)
        diff = max((float((a[n].double() - b[n].double()).abs().max()) for n in a if n in b), default=None)
    return {"ok": whole["ok"] and resumed["ok"] and same, "killed_after_step_1": killed, "bitwise_equal": same,
            "max_abs_diff": diff, "resumed": {k: resumed[k] for k in ("ok", "wall_s", "stderr")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT") or ".", help="directory for the JSON (default $OUT)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--size", default="s", help="bench.gpu_check size (tiny on CPU)")
    ap.add_argument("--fingerprint-sizes", default="10,100", help="millions of parameters")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds each part (each run in it) may take")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"--parts: unknown {', '.join(bad)} (known: {', '.join(PARTS)})")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report: dict = {"device": args.device, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "parts": {}}
    path = Path(args.out) / "gpu_prepared.json"
    for name in parts:
        t0 = time.monotonic()
        try:
            got = globals()[f"part_{name}"](args)
        except Exception as exc:  # recorded; the next part still runs
            got = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        got["part_s"] = round(time.monotonic() - t0, 2)
        report["parts"][name] = got
        path.write_text(json.dumps(report, indent=2, default=str))  # what is done survives a later timeout
        print(f"{name}: {'ok' if got.get('ok') else 'FAILED'} ({got['part_s']:.1f} s)", file=sys.stderr, flush=True)
    return 0 if all(p.get("ok") for p in report["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
