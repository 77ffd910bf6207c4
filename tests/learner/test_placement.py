"""The placement section: its checks (one line naming the field), the process -> device map with a
faked device count, and the process group backend a rank's device selects."""

import pytest

from learner import cli
from learner.config import ConfigError, load_config, parse_config
from learner.distributed.ranks import process_group_backend
from learner.placement import check_visible, describe, device_map, learner_device, rollout_device, teacher_device

ONE_NODE = {"model": {"device": "cuda"}, "learner": {"world_size": 4}, "rollout": {"workers": 4},
            "placement": {"learner": [0, 1, 2, 3], "rollout": [4, 5, 6, 7], "gpus_per_node": 8}}


def config(**sections):
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in ONE_NODE.items()}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return parse_config(data)


def refused(**sections) -> str:
    with pytest.raises(ConfigError) as err:
        config(**sections)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_one_eight_gpu_node_maps_each_rank_and_worker_to_its_own_gpu():
    cfg = config()
    assert [learner_device(cfg, r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [rollout_device(cfg, w) for w in range(4)] == ["cuda:4", "cuda:5", "cuda:6", "cuda:7"]
    assert describe(device_map(cfg)) == ("learner/0 cuda:0, learner/1 cuda:1, learner/2 cuda:2, learner/3 cuda:3, "
                                         "rollout/0 cuda:4, rollout/1 cuda:5, rollout/2 cuda:6, rollout/3 cuda:7")


def test_two_nodes_place_each_node_by_its_local_rank_and_worker():
    cfg = config(learner={"world_size": 8, "nodes": ["a", "b"]})
    assert learner_device(cfg, 0) == learner_device(cfg, 4) == "cuda:0"  # rank 4: node b's first
    assert learner_device(cfg, 7) == "cuda:3"
    assert rollout_device(cfg, 6) == "cuda:6"  # worker ids are global: node b's third worker


def test_several_workers_share_a_rollout_gpu_and_an_opd_teacher_has_its_own():
    cfg = config(rollout={"workers": 4}, algorithm={"objective": "opd"},
                 placement={"rollout": [4, 5], "workers_per_gpu": 2, "teacher": 6})
    assert [rollout_device(cfg, w) for w in range(4)] == ["cuda:4", "cuda:4", "cuda:5", "cuda:5"]
    assert teacher_device(cfg, 3) == "cuda:6" and device_map(cfg)["teacher/0"] == "cuda:6"


def test_without_placement_every_process_uses_model_device():
    cfg = parse_config({"learner": {"world_size": 2}})
    assert learner_device(cfg, 1) == rollout_device(cfg, 0) == teacher_device(cfg, 0) == "cpu"


def test_a_shared_gpu_only_when_colocated_is_asked_for():
    assert "placement.rollout: GPU 3 is also a learner GPU" in refused(placement={"rollout": [3, 4, 5, 6]})
    one_gpu = config(learner={"world_size": 1}, rollout={"workers": 2},
                     placement={"learner": [0], "rollout": [0], "workers_per_gpu": 2, "colocated": True})
    assert rollout_device(one_gpu, 1) == learner_device(one_gpu, 0) == "cuda:0"


@pytest.mark.parametrize("sections, message", [
    ({"learner": {"world_size": 6}}, "placement.learner: 4 GPUs for 6 learner rank(s) per node"),
    ({"learner": {"world_size": 8, "nodes": ["a", "b", "c", "d"]}}, "placement.learner: 4 GPUs for 2 learner rank(s)"),
    ({"rollout": {"workers": 2}}, "placement.rollout: 4 GPUs x 1 workers_per_gpu = 4 rollout workers, but the run has 2"),
    ({"placement": {"learner": [0, 0, 1, 2]}}, "placement.learner: GPU 0 listed twice"),
    ({"placement": {"rollout": [4, 5, 5, 6]}}, "placement.rollout: GPU 5 listed twice (say workers_per_gpu"),
    ({"placement": {"rollout": [4, 5, 6, 9]}}, "placement.rollout: GPU 9 is not on the node (placement.gpus_per_node: 8"),
    ({"placement": {"learner": [-1, 1, 2, 3]}}, "placement.learner: GPU indices are >= 0, got -1"),
    ({"placement": {"teacher": 5}}, "placement.teacher: only algorithm.objective opd runs a teacher"),
    ({"algorithm": {"objective": "opd"}, "placement": {"teacher": 2}}, "placement.teacher: GPU 2 is a learner GPU"),
    ({"model": {"device": "cpu"}}, "placement: GPU placement needs model.device cuda, not cpu"),
    ({"rollout": {"engine": "vllm", "replicas": 4}}, "placement.rollout: places torch engines"),
    ({"placement": {"gpu": [1]}}, "placement.gpu: unknown field"),
])
def test_a_placement_that_does_not_fit_is_one_line_naming_the_field(sections, message):
    assert message in refused(**sections)


def test_a_gpu_the_node_lacks_stops_the_run_before_any_process_starts(monkeypatch):
    """A faked node of 4 GPUs: the 8-GPU placement is refused by the check the CLI runs before boot."""
    import torch

    cfg = config(placement={"gpus_per_node": None})
    check_visible(cfg, 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(ConfigError, match=r"^placement.rollout: GPU 4 is not on the node \(torch sees: 4 GPU\(s\), "
                                          r"indices 0-3\)$"):
        cli.check_resolvable(cfg)


def test_ranks_on_gpus_reduce_over_nccl_and_ranks_on_cpu_over_gloo():
    assert process_group_backend("cuda:3") == "cpu:gloo,cuda:nccl"  # the barrier's CPU counts stay on gloo
    assert process_group_backend("cuda") == "gloo"  # ranks sharing the node's first GPU: NCCL refuses that
    assert process_group_backend("cpu") == "gloo"


@pytest.mark.parametrize("path, ranks", [("configs/gpu-node.yaml", 4), ("configs/gpu-two-nodes.yaml", 8)])
def test_the_example_gpu_configs_place_learners_on_0_to_3_and_engines_on_4_to_7(path, ranks):
    cfg = load_config(path)
    assert {learner_device(cfg, r) for r in range(ranks)} == {"cuda:0", "cuda:1", "cuda:2", "cuda:3"}
    assert {rollout_device(cfg, w) for w in range(8)} == {"cuda:4", "cuda:5", "cuda:6", "cuda:7"}


def test_each_placed_gpu_reports_its_roles_memory_and_utilisation(monkeypatch):
    """NVML faked: one step's curves name each GPU by its roles."""
    import torch

    from learner.driver.system_metrics import placed_gpu_metrics

    monkeypatch.setattr(torch.cuda, "device_memory_used", lambda g: (g + 1) * 2**20)
    monkeypatch.setattr(torch.cuda, "utilization", lambda g: 10 * g)
    cfg = config(learner={"world_size": 1}, rollout={"workers": 2},
                 placement={"learner": [0], "rollout": [0, 1], "colocated": True})
    assert placed_gpu_metrics(cfg.placement) == {
        "system/gpu0_learner+rollout/gpu_memory_mb": 1.0, "system/gpu0_learner+rollout/gpu_util": 0.0,
        "system/gpu1_rollout/gpu_memory_mb": 2.0, "system/gpu1_rollout/gpu_util": 10.0}


def test_two_nodes_give_each_rank_torchruns_local_rank_not_its_global_rank():
    from learner.distributed.ranks import rank_layout
    from learner.placement import local_rank

    cfg = config(learner={"world_size": 8, "nodes": ["a", "b"]})
    assert [local_rank(cfg, r) for r in (0, 3, 4, 7)] == [(0, 4), (3, 4), (0, 4), (3, 4)]
    layout = rank_layout([cfg.learner.node_of(r) for r in range(8)], "10.0.0.1", 29500)
    assert [(e.rank, e.local_rank, e.node) for e in layout] == [(r, r % 4, "ab"[r // 4]) for r in range(8)]
    assert layout[4].environ() == {"RANK": "4", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                                   "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert learner_device(cfg, 4) == f"cuda:{cfg.placement.learner[layout[4].local_rank]}"
    # ranks of a node need not be contiguous for the semantics: each counts among its node's own
    assert [e.local_rank for e in rank_layout(["x", "y", "x", "y", "y"], "h", 1)] == [0, 0, 1, 1, 2]
    assert [e.local_world_size for e in rank_layout(["x", "y", "x", "y", "y"], "h", 1)] == [2, 3, 2, 3, 3]
