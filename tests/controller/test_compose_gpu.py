"""The GPU variant of the image and its compose profile (docs/gpu.md, "The GPU image"),
validated with Debian's docker-compose."""

from pathlib import Path

import pytest
import yaml

from tests.controller.test_settings import COMPOSE, compose_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(COMPOSE is None, reason="Debian's docker-compose is not installed")
def test_the_gpu_profile_reserves_the_gpus_and_shared_memory_from_the_cuda_image():
    out = compose_config(POSTGRES_PASSWORD="pw", DJANGO_SECRET_KEY="key")
    assert out.returncode == 0, out.stderr
    gpu = yaml.safe_load(out.stdout)["services"]["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["build"]["dockerfile"] == "Dockerfile.gpu" and gpu["image"] == "thundersync-lab-gpu"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert gpu["shm_size"] not in (None, "64m")  # docker's default /dev/shm cannot hold a weight store
    assert gpu["environment"]["DJANGO_SETTINGS_MODULE"] == "controller.settings.production"
    assert "-Q runs,runs.gpu " in gpu["command"] and gpu["restart"] == "unless-stopped"
    assert set(gpu["security_opt"]) == {"seccomp:unconfined", "apparmor:unconfined"}  # the sandbox, as `worker`


def test_the_cuda_image_pins_torch_and_vllm_in_one_install():
    text = (ROOT / "Dockerfile.gpu").read_text()
    project = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if '"torch==' in line)
    torch_version = project.split("==")[1].split('"')[0]
    assert f"ARG TORCH_VERSION={torch_version}" in text  # the project's torch, as a CUDA build
    install = next(line for line in text.splitlines() if line.startswith("RUN pip install"))
    body = text[text.index(install):]
    assert '"torch==${TORCH_VERSION}" "vllm==${VLLM_VERSION}"' in body  # one resolution: a mismatch fails the build
    assert "download.pytorch.org/whl/${CUDA_WHEELS}" in install and "assert torch.version.cuda" in body
