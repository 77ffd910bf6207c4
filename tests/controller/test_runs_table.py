"""The runs list as an analysis tool: any config field or the overrides as a column, search over
configs and overrides, natural sort by name, rows grouped by any column with each group's median
step and mean final reward and their 90% intervals, and a sync run in a comparison as the
speedups' reference rather than a ratio against its own repeats."""

import re

import pytest

from controller.models import Comparison, Run, StepMetric

from .conftest import make_run

pytestmark = pytest.mark.django_db


def store_steps(run, step_s: float, reward: float, steps: int = 4) -> None:
    for step in range(steps):
        StepMetric.objects.create(run=run, step=step, values={"timing_s/step": step_s, "reward/mean": reward})


def with_config(run, **paths) -> Run:
    for dotted, value in paths.items():
        section = run.config
        *parents, last = dotted.split("__")
        for p in parents:
            section = section.setdefault(p, {})
        section[last] = value
    run.save()
    return run


@pytest.fixture
def table(alice_experiment, sync_preset, streaming_preset):
    comparison = Comparison.objects.create(experiment=alice_experiment, steps=4, repeats=3)
    runs = []
    for k in range(3):
        for preset, step_s in ((sync_preset, 2.0 + 0.1 * k), (streaming_preset, 1.0 + 0.1 * k)):
            run = make_run(alice_experiment, preset, steps=4, name=f"run {10 ** k}", comparison=comparison,
                           overrides={"seed": k})
            with_config(run, seed=k, train__schedule=preset.kind, train__lr=3e-4)
            store_steps(run, step_s, reward=0.1 * (k + 1))
            runs.append(run)
    spec = make_run(alice_experiment, streaming_preset, steps=4, name="async1",
                    overrides={"rollout.speculation.enabled": True})
    with_config(spec, rollout__speculation={"enabled": True}, train__schedule="streaming", train__lr=1e-4)
    store_steps(spec, 0.9, reward=0.5)
    return comparison, runs, spec


def rows(page: str) -> list[str]:
    return re.findall(r'<tr data-run-id="(\d+)"', page)


def test_config_fields_and_overrides_are_columns_and_sort(alice_client, table):
    _, runs, spec = table
    page = alice_client.get("/runs/?col=train.lr+overrides&sort=col:train.lr").content.decode()
    assert 'data-column="col:train.lr"' in page and 'data-column="col:overrides"' in page
    assert rows(page)[0] == str(spec.pk)  # 1e-4 first
    cells = re.findall(r'data-column="col:overrides">([^<]*)<', page)
    assert "seed=0" in cells and "rollout.speculation.enabled=True" in cells
    bad = alice_client.get("/runs/?col=train.nope")
    assert bad.status_code == 400 and "“train.nope” is not a config field" in bad.content.decode()


def test_search_finds_config_and_overrides(alice_client, table):
    _, runs, spec = table
    assert rows(alice_client.get("/runs/?q=speculation").content.decode()) == [str(spec.pk)]  # its override
    assert rows(alice_client.get("/runs/?q=rollout.speculation.enabled%3Dtrue").content.decode()) == [str(spec.pk)]
    assert len(rows(alice_client.get("/runs/?q=seed%3D2").content.decode())) == 2  # a field's value
    assert len(rows(alice_client.get("/runs/?q=train.lr%3D0.0003").content.decode())) == 6


def test_names_sort_in_natural_order(alice_client, table):
    page = alice_client.get("/runs/?sort=name").content.decode()
    names = re.findall(r'<td><a href="/runs/\d+/">([^<]+)</a></td>', page)
    assert names[0] == "async1" and names.index("run 1") < names.index("run 10") < names.index("run 100")


def test_groups_by_a_config_column_with_medians_and_intervals(alice_client, table):
    page = alice_client.get("/runs/?col=train.schedule&group=col:train.schedule").content.decode()
    groups = re.findall(r'<tr class="group-row" data-group="([^"]+)">(.*?)</tr>', page, re.S)
    assert [g for g, _ in groups] == ["streaming", "sync"]
    streaming = groups[0][1]
    assert "4 runs" in streaming and 'data-stat="step_s">1.050 s' in streaming  # median of 0.9, 1.0, 1.1, 1.2
    low, high = map(float, re.search(r'data-stat="step_ci">\[([\d.]+), ([\d.]+)\]', streaming).groups())
    assert 0.9 <= low <= 1.05 <= high <= 1.2
    sync = groups[1][1]
    assert "3 runs" in sync and 'data-stat="reward">0.200' in sync  # mean of 0.1, 0.2, 0.3
    assert 'data-stat="reward_ci"' in sync


def test_a_sync_run_is_its_comparisons_reference_not_a_ratio(alice_client, table):
    _, runs, spec = table
    page = alice_client.get("/runs/").content.decode()
    for run in runs:
        cell = re.search(rf'<tr data-run-id="{run.pk}".*?data-field="speedup">(.*?)</td>', page, re.S).group(1)
        if run.schedule.kind == "sync":
            assert "reference" in cell
        else:
            assert "×" in cell
    spec_cell = re.search(rf'<tr data-run-id="{spec.pk}".*?data-field="speedup">(.*?)</td>', page, re.S).group(1)
    assert spec_cell == "—"
