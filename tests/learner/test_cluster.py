"""Runs placed on a Ray cluster, on CPU: one fake cluster for the module, two nodes on this
machine with 4 GPUs each as resources (Ray assigns their ids and sets CUDA_VISIBLE_DEVICES; the
roles compute on CPU, ``model.device: cpu`` standing in). Each test checks that no actor and no
placement group of the run remains afterwards (the GCS's own tables: the state API's HTTP
server is the dashboard, which the test cluster does not start)."""

import os
import time

import pytest

pytestmark = pytest.mark.slow  # starts a two-node Ray cluster on this machine (once for the module)
ray = pytest.importorskip("ray")

from learner.cluster.launcher import ClusterError, ClusterRun, reserve  # noqa: E402
from learner.cluster.plan import run_plan  # noqa: E402
from learner.config import load_config  # noqa: E402

LOCAL = "127.0.0.1"


def patient_get_node(get_node, wait_s: float = 150.0):
    """Ray gives a starting node a fixed 30 s (a local variable of ``Node.__init__``) to register
    with the GCS, asking ``services.get_node`` in a loop; on this shared 2-core machine under heavy
    load (load average 30 seen) registration can take longer. This ``get_node`` keeps asking for
    up to ``wait_s`` itself."""
    def ask(*args, **kwargs):
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return get_node(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)  # polling the GCS for a registration, bounded by wait_s
    return ask


def agent_ports() -> dict:
    """A node's agents' ports chosen here: with port 0 each agent picks one and writes it to a
    file the raylet waits for, and under heavy load that wait timed out and the raylet aborted
    ("Timed out waiting for file .../metrics_agent_port_...")."""
    from learner.distributed.ranks import free_port

    return {"metrics_agent_port": free_port(LOCAL), "runtime_env_agent_port": free_port(LOCAL),
            "dashboard_agent_listen_port": free_port(LOCAL)}


def start_cluster(Cluster, node: dict, system_config: dict, tries: int = 2):
    """The two-node cluster; a start that fails anyway is shut down and tried again."""
    for attempt in range(tries):
        c = Cluster()
        try:
            c.add_node(**node, **agent_ports(), include_dashboard=False, _system_config=system_config)
            c.add_node(**node, **agent_ports())
            c.wait_for_nodes()
            return c
        except Exception:
            c.shutdown()
            if attempt == tries - 1:
                raise


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    from ray._private import ray_constants

    # keep every address on loopback: ray.init would otherwise turn 127.0.0.1 into the host's address
    # (ray_constants read the variable when Ray was imported; the processes the cluster starts read it)
    saved = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    was = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    node = dict(num_cpus=2, num_gpus=4, node_ip_address=LOCAL, object_store_memory=80 * 1024 * 1024)
    # no idle workers started ahead (the machine is small); slow registrations are waited for
    quiet = {"enable_worker_prestart": False, "prestart_worker_first_driver": False,
             "enable_metrics_collection": False, "worker_register_timeout_seconds": 120}
    os.environ["RAY_raylet_start_wait_time_s"] = "150"  # the GCS's side of the same wait
    from ray._private import services

    get_node = services.get_node
    services.get_node = patient_get_node(get_node)
    c = None
    try:
        c = start_cluster(Cluster, node, quiet)
        ray.init(address=c.address, _node_ip_address=LOCAL, include_dashboard=False, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        if c is not None:
            c.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = was
        services.get_node = get_node
        if saved is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = saved


def left_over():
    from ray._private.state import actors
    from ray.util.placement_group import placement_group_table

    alive = [a["Name"] or a["ActorID"] for a in actors().values() if a["State"] != "DEAD"]
    groups = [g["name"] for g in placement_group_table().values() if g["state"] != "REMOVED"]
    return alive, groups


@pytest.fixture
def clean(cluster):
    yield cluster
    deadline = time.monotonic() + 30
    while (rest := left_over()) != ([], []) and time.monotonic() < deadline:
        time.sleep(0.2)  # ray.kill and removal are asynchronous: poll the GCS until they are done
    assert left_over() == ([], [])


def cfg_of(path, **overrides):
    base = {"model.device": "cpu", "learner.nodes": None, "cluster": {"cpus_per_learner": 0.25,
                                                                       "cpus_per_engine": 0.25, "wait_s": 60}}
    return load_config(path, {**base, **overrides})


def by_node(run):
    nodes = {}
    for name, info in run.infos.items():
        nodes.setdefault(info["node_id"], []).append(name)
    return nodes


def test_two_node_shape_places_ranks_by_node_and_a_streaming_step_equals_one_process(clean):
    from learner.cluster.check import streaming_step

    # configs/gpu-two-nodes.yaml on 4-GPU nodes: 2 ranks and 2 engines per node
    cfg = cfg_of("configs/gpu-two-nodes.yaml", **{"learner.world_size": 4, "rollout.workers": 2,
                 "placement.learner": [0, 1], "placement.rollout": [2, 3], "placement.gpus_per_node": 4,
                 "cluster.nodes": 2, "learner.timeout_s": 120})
    with ClusterRun(cfg) as run:
        assert run.plan.strategy == "STRICT_SPREAD"
        nodes = by_node(run)
        assert len(nodes) == 2
        for names in nodes.values():  # each node: two consecutive ranks and two engines, four GPUs
            assert sorted(n.split("/")[0] for n in names) == ["learner", "learner", "rollout", "rollout"]
            gpus = [g for n in names for g in run.infos[n]["gpu_ids"]]
            assert sorted(gpus) == ["0", "1", "2", "3"]
            assert all(run.infos[n]["cuda_visible_devices"] == ",".join(run.infos[n]["gpu_ids"]) for n in names)
        rank_node = [run.infos[f"learner/{r}"]["node_id"] for r in range(4)]
        assert rank_node[0] == rank_node[1] != rank_node[2] == rank_node[3]
        joined = run.join_process_group()
        envs = [info["env"] for info in joined]
        port = envs[0]["MASTER_PORT"]
        assert envs == [{"RANK": str(r), "LOCAL_RANK": str(r % 2), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                         "MASTER_ADDR": LOCAL, "MASTER_PORT": port} for r in range(4)]
        # one streaming step over the four ranks (gloo across the two nodes): the reduced gradient
        # equals the single-process gradient of the whole batch
        result = run.call_learners(streaming_step, 0)[0]
    assert result["world_size"] == 4 and result["dtype"] == "float32"
    assert result["rel_error"] <= 1e-6 and result["passed"], result
    assert sum(n > 0 for n in result["trajectories_per_rank"]) >= 3 and result["unused_param_grad_zero"]


def test_one_node_shape_packs_every_role_on_one_node_engines_sharing_gpus(clean):
    # configs/gpu-node.yaml on a 4-GPU node: 2 ranks, 4 engines two per GPU
    cfg = cfg_of("configs/gpu-node.yaml", **{"learner.world_size": 2, "rollout.workers": 4,
                 "placement.learner": [0, 1], "placement.rollout": [2, 3], "placement.workers_per_gpu": 2,
                 "placement.gpus_per_node": 4})
    with ClusterRun(cfg) as run:
        assert run.plan.strategy == "STRICT_PACK" and len(by_node(run)) == 1
        learner_gpus = [run.infos[f"learner/{r}"]["gpu_ids"] for r in range(2)]
        engine_gpus = [run.infos[f"rollout/{w}"]["gpu_ids"] for w in range(4)]
        assert engine_gpus[0] == engine_gpus[1] and engine_gpus[2] == engine_gpus[3] != engine_gpus[0]
        assert sorted(g for gs in learner_gpus + engine_gpus[::2] for g in gs) == ["0", "1", "2", "3"]
        assert [run.infos[f"rollout/{w}"]["cuda_visible_devices"] for w in range(4)] == [g[0] for g in engine_gpus]
        assert [e.local_rank for e in run.ranks] == [0, 1] and run.ranks[1].local_world_size == 2


def test_a_second_run_waits_for_its_gpus_and_says_so(clean):
    shape = {"learner.world_size": 4, "rollout.workers": 1, "placement.learner": [0, 1], "placement.rollout": [2],
             "placement.gpus_per_node": 4, "cluster.nodes": 2}
    first_cfg = cfg_of("configs/gpu-two-nodes.yaml", **shape)
    assert run_plan(first_cfg).needs() == ("GPU", 6.0)
    first = reserve(run_plan(first_cfg), 30, print)
    said = []
    try:
        second = cfg_of("configs/gpu-two-nodes.yaml", **shape, **{"cluster.wait_s": 3})
        started = time.monotonic()
        with pytest.raises(ClusterError) as err:
            with ClusterRun(second, say=said.append):
                pass
        assert str(err.value) == "waiting for 6 GPUs on the cluster: 2 free; gave up after cluster.wait_s 3 s"
        assert said == ["waiting for 6 GPUs on the cluster: 2 free"] and time.monotonic() - started < 20
        # a waiting run goes on as soon as the GPUs are free: the first run ends while it waits
        said.clear()

        def first_ends(text):
            said.append(text)
            ray.util.remove_placement_group(first)

        third = reserve(run_plan(first_cfg), 30, first_ends)
        ray.util.remove_placement_group(third)
        assert said == ["waiting for 6 GPUs on the cluster: 2 free"]
    finally:
        ray.util.remove_placement_group(first)


def test_an_actor_that_dies_ends_the_run_naming_its_role_and_node(clean):
    cfg = cfg_of("configs/gpu-node.yaml", **{"learner.world_size": 2, "rollout.workers": 1,
                 "placement.learner": [0, 1], "placement.rollout": [2], "placement.gpus_per_node": 4,
                 "learner.timeout_s": 30})
    started = time.monotonic()
    with pytest.raises(ClusterError) as err:
        with ClusterRun(cfg) as run:
            # an exception in a role's call names the role, its node and the error
            with pytest.raises(ClusterError, match=rf"^learner/0 on node {LOCAL} \(\w+\) failed: ValueError: "
                                                   "invalid literal for int"):
                run.gather({"learner/0": run.actors["learner/0"].call.remote(int, "x")})
            run.gather({"learner/1": run.actors["learner/1"].call.remote(os._exit, 1)})
    assert str(err.value).startswith(f"learner/1 on node {LOCAL} (") and " died" in str(err.value)
    assert time.monotonic() - started < 30 + 30
