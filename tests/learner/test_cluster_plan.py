"""The cluster section without a cluster: placement -> one placement group's bundles and
strategy, config errors naming the field, and a single-machine run that never imports Ray."""

import subprocess
import sys

import pytest

from learner.cluster.plan import run_plan
from learner.config import ConfigError, load_config


def test_one_eight_gpu_node_is_one_strict_pack_group_of_one_gpu_bundles():
    plan = run_plan(load_config("configs/gpu-node.yaml", {"cluster": {}}))
    assert plan.strategy == "STRICT_PACK" and plan.needs() == ("GPU", 8.0)
    assert plan.bundles == [{"GPU": 1.0, "CPU": 1.0}] * 8
    assert [r.name for r in plan.roles] == [f"learner/{r}" for r in range(4)] + [f"rollout/{w}" for w in range(4)]


def test_two_nodes_are_one_bundle_each_spread_over_distinct_nodes():
    cfg = load_config("configs/gpu-two-nodes.yaml", {"learner.nodes": None, "cluster": {"nodes": 2}})
    plan = run_plan(cfg)
    assert plan.strategy == "STRICT_SPREAD" and plan.needs() == ("GPU", 16.0) and plan.ranks_per_node == 4
    assert plan.bundles == [{"GPU": 8.0, "CPU": 8.0}] * 2
    assert [r.bundle for r in plan.learners()] == [0, 0, 0, 0, 1, 1, 1, 1]  # ranks 0-3 on one node, 4-7 on the other
    assert [(r.index, r.bundle) for r in plan.roles if r.kind == "rollout"] == [(w, w // 4) for w in range(8)]


def test_engines_share_a_gpu_bundle_and_the_teacher_has_its_own():
    cfg = load_config("configs/gpu-node.yaml", {"algorithm.objective": "opd", "rollout.workers": 4,
                                                "placement.rollout": [4, 5], "placement.workers_per_gpu": 2,
                                                "placement.teacher": 6, "cluster": {"cpus_per_engine": 0.5}})
    plan = run_plan(cfg)
    engines = [r for r in plan.roles if r.kind == "rollout"]
    assert [r.gpus for r in engines] == [0.5] * 4 and engines[0].bundle == engines[1].bundle != engines[2].bundle
    assert plan.bundles[engines[0].bundle] == {"GPU": 1.0, "CPU": 1.0}
    assert [r.name for r in plan.roles if r.kind == "teacher"] == ["teacher/0"] and plan.needs() == ("GPU", 7.0)


@pytest.mark.parametrize("overrides, message", [
    ({"cluster": {"nodes": 2}}, "learner.nodes: a run on a Ray cluster is placed by cluster.nodes"),
    ({"learner.nodes": None, "cluster": {"nodes": 3}}, "cluster.nodes: 3 nodes for learner.world_size 8"),
    ({"learner.nodes": None, "cluster": {"nodes": 2, "address": "http://x"}}, "cluster.address: auto, env"),
])
def test_cluster_config_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("configs/gpu-two-nodes.yaml", overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_placement_on_a_cluster_accepts_model_device_cpu_and_train_refuses_cluster_runs(tmp_path):
    cfg = load_config("configs/gpu-node.yaml", {"model.device": "cpu", "cluster": {}})
    assert cfg.placement.learner == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="placement: GPU placement needs model.device cuda"):
        load_config("configs/gpu-node.yaml", {"model.device": "cpu"})


def test_a_single_machine_run_never_imports_ray():
    code = ("import sys; from learner import cli; from learner.config import load_config; "
            "load_config('configs/quickstart.yaml'); load_config('configs/gpu-node.yaml', {'cluster': {}}); "
            "import learner.cluster.plan, learner.distributed.front; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_train_refuses_a_cluster_config_naming_the_command_that_places_it(tmp_path, capsys):
    from learner import cli

    path = tmp_path / "c.yaml"
    path.write_text("cluster: {address: auto}\n")
    assert cli.main(["train", "--config", str(path)]) == 2
    assert "invalid config: cluster: thundersync train runs on this machine" in capsys.readouterr().err
    assert cli.main(["cluster-check", "--config", "configs/quickstart.yaml"]) == 2
    assert "cluster: cluster-check needs the config's cluster section" in capsys.readouterr().err
