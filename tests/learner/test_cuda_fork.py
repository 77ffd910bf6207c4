"""CUDA and fork (docs/gpu.md, "CUDA and fork"): the warm runner's parent, which forks every run,
never initialises CUDA, not even through a module it imports; a CUDA run starts its rollout
workers by spawn even when forked from the warm runner."""

import subprocess
import sys
from pathlib import Path

from learner.config import parse_config
from learner.rollout.processes import boot

ROOT = Path(__file__).resolve().parents[2]

# Every entry point that initialises the CUDA driver or torch's CUDA state is replaced by a
# recorder right after torch is imported, before anything else of the runner's is; then the
# runner's own start-up runs: preload (every module a run imports), the page-cache warm-up, the
# listening socket. cudaGetDeviceCount alone (is_available, device_count) initialises the driver,
# after which a forked child cannot use CUDA, so those count too.
_PROBE = r"""
import json, sys, tempfile
from pathlib import Path
import torch
calls = []
def recorder(name, real):
    def call(*a, **k):
        calls.append(name)
        return real(*a, **k)
    return call
for name in ("_lazy_init", "init", "is_available", "device_count", "current_device", "set_device",
             "synchronize", "mem_get_info"):
    setattr(torch.cuda, name, recorder(f"torch.cuda.{name}", getattr(torch.cuda, name)))
for name in ("_cuda_getDeviceCount", "_cuda_init"):
    if hasattr(torch._C, name):
        setattr(torch._C, name, recorder(f"torch._C.{name}", getattr(torch._C, name)))
from learner.warm import server
server.preload()
from learner.models.loading import default_cache_dir
server.warm_page_cache([default_cache_dir() / "models"], limit=1 << 20)
sock = Path(tempfile.mkdtemp()) / "probe.sock"
listener = server.listen(sock)
server.Runner(listener)
import learner.cli, learner.driver.loop, learner.rollout.processes.agent_worker, learner.distributed.front  # noqa: F401
print(json.dumps({"calls": calls, "initialized": torch.cuda.is_initialized(), "modules": len(sys.modules)}))
"""


def test_the_warm_runners_parent_never_initialises_cuda():
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["modules"] > 500  # the probe did import the run's modules (torch, transformers, the driver)
    assert got["calls"] == [], f"the warm runner's parent touched CUDA: {got['calls']}"
    assert got["initialized"] is False


def test_a_cuda_run_spawns_its_workers_even_when_forked_from_the_warm_runner(monkeypatch):
    monkeypatch.setattr(boot, "START_METHOD", "fork")  # what learner/warm/server.py sets in a forked run
    assert boot.worker_start_method(parse_config({})) == "fork"  # CPU: fork, nothing to import
    assert boot.worker_start_method(parse_config({"model": {"device": "cuda"}})) == "spawn"
    monkeypatch.setattr(boot, "START_METHOD", "spawn")  # a cold run
    assert boot.worker_start_method(parse_config({})) == "spawn"
