"""The measurement scripts in bench/ as a package: the tools a user runs at its top
(``python -m bench.NAME``), the web app's probes in ``bench/web/`` and the one-off measurements
behind the docs in ``bench/decisions/`` (``python -m bench.web.NAME``, ``bench.decisions.NAME``);
none edits ``sys.path``, each imports as a module, each is listed under its part in
docs/bench-scripts.md, and the trainer never imports them."""

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("", "web", "decisions")  # the package's top, then its subpackages
SCRIPTS = sorted(p for p in (ROOT / "bench").rglob("*.py") if p.name != "__init__.py")
HEADINGS = {"": "## Tools you run (`bench/`)", "web": "## Web probes (`bench/web/`)",
            "decisions": "## Decisions (`bench/decisions/`)"}


def part_of(path: Path) -> str:
    return "/".join(path.relative_to(ROOT / "bench").parts[:-1])


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def touches_sys_path(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name)
               and n.value.id == "sys" for n in ast.walk(tree))


def imported_roots(tree: ast.AST) -> set[str]:
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return roots | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_there_are_scripts_in_each_part_and_none_edits_sys_path():
    assert len(SCRIPTS) >= 15
    assert {part_of(p) for p in SCRIPTS} == set(PARTS)  # nothing deeper, no other folder
    for part in PARTS[1:]:
        package = importlib.import_module(f"bench.{part}")
        assert package.__doc__, f"bench/{part}/__init__.py: one line on what the folder holds"
    edits = [str(p.relative_to(ROOT)) for p in SCRIPTS if touches_sys_path(ast.parse(p.read_text()))]
    assert edits == []


@pytest.mark.parametrize("module", [module_of(p) for p in SCRIPTS])
def test_each_script_imports_as_a_module_of_the_package(module):
    loaded = importlib.import_module(module)
    assert loaded.__doc__, f"{module}: its docstring says what it measures and how to run it"


def test_every_script_is_listed_in_docs_bench_scripts_under_its_part_with_what_it_answers():
    listed = (ROOT / "docs" / "bench-scripts.md").read_text()
    starts = [listed.index(HEADINGS[part]) for part in PARTS]
    assert starts == sorted(starts), "the three parts, in order"
    sections = dict(zip(PARTS, (listed[a:b] for a, b in zip(starts, [*starts[1:], len(listed)]))))
    missing = []
    for p in SCRIPTS:
        path = p.relative_to(ROOT).as_posix()
        row = next((line for line in sections[part_of(p)].splitlines() if line.startswith(f"| `{path}` |")), "")
        answer = row.rstrip(" |").rsplit("|", 1)[-1].strip()
        if not answer or (f"`{module_of(p)}`" not in row and "(imported)" not in row):
            missing.append(path)
    assert missing == []


def test_the_trainer_never_imports_the_scripts():
    importers = [str(p.relative_to(ROOT)) for p in (ROOT / "learner").rglob("*.py")
                 if "bench" in imported_roots(ast.parse(p.read_text()))]
    assert importers == []


@pytest.mark.parametrize("argv,field", [(["--schedules", "async"], "--schedules"), (["--lora", "0"], "--lora")])
def test_the_shared_prompt_bench_names_a_bad_argument(argv, field, monkeypatch, capsys):
    from bench.decisions import shared_prompt

    monkeypatch.setattr(sys, "argv", ["bench.decisions.shared_prompt", *argv])
    with pytest.raises(SystemExit) as exit_info:
        shared_prompt.main()
    assert exit_info.value.code == 2 and field in capsys.readouterr().err


def test_the_grouped_parts_bench_times_every_arm_and_puts_the_learner_back():
    import torch

    from bench.decisions.grouped_parts import ARMS, micro_batch_arms, variant
    from learner.config import AlgorithmConfig
    from learner.grad.batching.grouped import GroupedGradients
    from learner.grad.learners.common import LearnerOptions
    from learner.grad.learners.on_policy import StreamingLearner
    from learner.models.loading import load_model, resolve_model_dir

    model = load_model(resolve_model_dir("builtin:tiny"))
    learner = StreamingLearner(model, AlgorithmConfig(objective="grpo"), None,
                               LearnerOptions("adaptive", micro_batch_tokens=10**6, pack_rows=False))
    reduce_before = GroupedGradients._reduce
    size = micro_batch_arms(learner, 8, 1, model.config.vocab_size)
    assert set(size["median_s"]) == set(ARMS) and all(v > 0 for v in size["median_s"].values())
    assert set(size["reduction_s"]) == {"linear", "rmsnorm", "embedding"}
    assert GroupedGradients._reduce is reduce_before and "add_to_group" not in vars(learner.acc)
    with variant(learner, "no-reduction"):  # the floor really adds nothing to the sums
        learner.begin_batch({0: 8})
        learner.acc.open_group(0)
        assert learner.acc.add_to_group(0, 1.0, [None]) is None
        learner.abandon_batch()
    assert torch.get_num_threads() >= 1


def test_the_grouped_parts_matmul_arms_compute_the_same_per_destination_gradients():
    import torch

    from bench.decisions.grouped_parts import matmul_split, weight_gradient_arms

    torch.manual_seed(0)
    rows, width, parts = 8, 5, 4
    d, a = torch.randn(rows * width, 3, dtype=torch.float64), torch.randn(rows * width, 2, dtype=torch.float64)
    arms = weight_gradient_arms(d, a, rows, parts)
    split = arms["per-destination"]()
    assert split.shape == (parts, 3, 2) and torch.allclose(split.sum(0), arms["one"](), atol=1e-12)
    for name in ("per-destination-into-stack", "per-row-bmm"):
        assert torch.allclose(arms[name](), split, atol=1e-12), name
    out = matmul_split([(3, 2)], rows, width, parts, repeats=1)
    assert set(out[0]["over_split"]) == {"per-destination", "per-destination-into-stack", "per-row-bmm"}
