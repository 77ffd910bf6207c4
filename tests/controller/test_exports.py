"""Streamed exports: trace.json in the Trace Event format (flows, lane sort indexes) and
metrics.csv, through WSGI and ASGI, and a 1 M-span trace with flat memory."""

import json
import time
from collections import defaultdict

import psutil
import pytest
from django.db import connection
from django.test import AsyncClient

from controller.models import Span, StepMetric

from .conftest import make_run, store_metrics, store_spans

pytestmark = pytest.mark.django_db
METADATA_ARGS = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
                 "thread_sort_index": "sort_index"}


def body(response) -> bytes:
    return b"".join(response.streaming_content)


def validate_trace(doc: dict) -> dict:
    """Check ``doc`` against the Trace Event format (the JSON Object Format with complete "X",
    metadata "M" and flow "s"/"t"/"f" events) and return what it found."""
    assert set(doc) == {"traceEvents", "displayTimeUnit"} and doc["displayTimeUnit"] in ("ms", "ns")
    slices, flows, threads, sort_index = defaultdict(list), defaultdict(list), {}, {}
    for e in doc["traceEvents"]:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["name"], str) and isinstance(e["cat"], str) and isinstance(e["args"], dict)
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "M":
            value = e["args"][METADATA_ARGS[e["name"]]]
            assert isinstance(value, str if METADATA_ARGS[e["name"]] == "name" else int), e
            if e["name"] == "thread_name":
                threads[(e["pid"], e["tid"])] = value
            elif e["name"] == "thread_sort_index":
                sort_index[(e["pid"], e["tid"])] = value
        else:
            assert e["ph"] in ("s", "t", "f") and e["bp"] == "e", e
            assert isinstance(e["id"], int) and isinstance(e["cat"], str) and isinstance(e["name"], str)
            flows[(e["cat"], e["id"])].append(e)
    assert set(sort_index) == set(threads)  # every lane has its sort index ...
    for pid in {p for p, _ in threads}:  # ... distinct within its process
        indexes = [i for (p, _), i in sort_index.items() if p == pid]
        assert len(indexes) == len(set(indexes))
    for chain in flows.values():
        phases = [e["ph"] for e in chain]
        assert phases[0] == "s" and phases[-1] == "f" and set(phases[1:-1]) <= {"t"}, phases
        assert [e["ts"] for e in chain] == sorted(e["ts"] for e in chain)
        for e in chain:  # bound to the enclosing slice on its thread ("bp": "e")
            assert any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])]), e
    return {"slices": slices, "flows": list(flows.values()), "threads": threads, "sort_index": sort_index}


LANES = ["rollout/10/0", "rollout/2/1", "rollout/2/0", "replica/0"]


def store_trajectories(run, count: int) -> None:
    """Each trajectory: two turns (generate, tool) on a rollout lane, then its backward."""
    spans, seq, t = [], 0, 0.0
    for traj in range(count):
        lane = LANES[traj % 3]
        for turn in range(2):
            for kind in ("rollout.generate", "rollout.tool"):
                spans.append(Span(run=run, seq=seq, step=traj // 4, kind=kind, t0=t, t1=t + 0.01, lane=lane,
                                  traj=traj, group=traj // 4, turn=turn, policy_version=0, tokens=5))
                seq, t = seq + 1, t + 0.01
        spans.append(Span(run=run, seq=seq, step=traj // 4, kind="learner.backward", t0=t, t1=t + 0.005,
                          lane="learner/0", traj=traj, group=traj // 4, policy_version=0))
        seq += 1
    spans.append(Span(run=run, seq=seq, step=0, kind="learner.publish", t0=t, t1=t + 0.01, lane="replica/0"))
    Span.objects.bulk_create(spans)


def test_the_trace_links_each_trajectory_to_its_backward_with_stable_lanes(alice_client, alice_run):
    store_trajectories(alice_run, 8)
    found = validate_trace(json.loads(body(alice_client.get(f"/api/runs/{alice_run.pk}/trace.json"))))
    assert len(found["flows"]) == 8
    for chain in found["flows"]:
        assert [e["ph"] for e in chain] == ["s", "t", "t", "t", "f"]
        assert chain[-1]["pid"] == 1 and chain[0]["pid"] == 2  # rollout fleet -> learner
    by_lane = {lane: found["sort_index"][key] for key, lane in found["threads"].items()}
    assert sorted(by_lane, key=lambda lane: (lane.startswith("rollout") + 2 * lane.startswith("replica"),
                                             by_lane[lane])) == ["learner/0", "rollout/2/0", "rollout/2/1",
                                                                 "rollout/10/0", "replica/0"]


def test_a_step_range_keeps_whole_chains(alice_client, alice_run):
    store_trajectories(alice_run, 8)
    response = alice_client.get(f"/api/runs/{alice_run.pk}/trace.json", {"step_from": 1, "step_to": 1})
    found = validate_trace(json.loads(body(response)))
    assert len(found["flows"]) == 4 and sum(len(s) for s in found["slices"].values()) == 20


@pytest.mark.django_db(transaction=True)  # the ASGI views read from their own threads
async def test_asgi_streams_the_same_documents(alice, alice_run):
    from channels.db import database_sync_to_async

    await database_sync_to_async(store_trajectories)(alice_run, 4)
    await database_sync_to_async(store_metrics)(alice_run, 3)
    client = AsyncClient()
    await client.aforce_login(alice)
    for path in ("trace.json", "metrics.csv"):
        response = await client.get(f"/api/runs/{alice_run.pk}/{path}")
        chunks = [chunk async for chunk in response.streaming_content]
        sync_body = await database_sync_to_async(lambda: body(sync_client_for(alice).get(
            f"/api/runs/{alice_run.pk}/{path}")))()
        assert b"".join(chunks) == sync_body


def sync_client_for(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_metrics_csv_streams_every_step(alice_client, alice_run):
    StepMetric.objects.bulk_create([StepMetric(run=alice_run, step=s, values={"a": s, **({"b": 1} if s % 2 else {})})
                                    for s in range(12_000)])
    response = alice_client.get(f"/api/runs/{alice_run.pk}/metrics.csv")
    assert response.streaming
    lines = body(response).decode().splitlines()
    assert lines[0] == "step,a,b" and lines[1] == "0,0," and lines[2] == "1,1,1" and len(lines) == 12_001


def store_million_spans(run, count: int) -> None:
    """``count`` spans written by PostgreSQL itself: trajectories of three rollout spans and a
    backward, 10,000 spans a step, on 8 rollout lanes and the learner's."""
    table = Span._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO {table} (run_id, seq, step, kind, t0, t1, lane, traj, "group", turn, policy_version, tokens)
            SELECT %s, i, i / 10000,
                   CASE WHEN i %% 4 = 3 THEN 'learner.backward' ELSE 'rollout.generate' END,
                   i * 0.001, i * 0.001 + 0.0005,
                   CASE WHEN i %% 4 = 3 THEN 'learner/0' ELSE 'rollout/' || ((i / 4) %% 8) || '/0' END,
                   i / 4, i / 64, i %% 4, i / 10000, 7
            FROM generate_series(0, %s) AS i""", [run.pk, count - 1])


def stream_measured(client, url: str, params: dict) -> dict:
    """Consume the streamed export as a client would, sampling this process's resident set
    (server and client share it here, so any buffering of the document would show)."""
    process = psutil.Process()
    rss0, rss_growth = process.memory_info().rss, 0
    started = time.perf_counter()
    size = slices = flows = chunks = 0
    for chunk in client.get(url, params).streaming_content:
        size, chunks = size + len(chunk), chunks + 1
        slices += chunk.count(b'"ph":"X"')
        flows += chunk.count(b'"ph":"f"')
        if chunks % 10 == 0:
            rss_growth = max(rss_growth, process.memory_info().rss - rss0)
    return {"bytes": size, "chunks": chunks, "slices": slices, "flows": flows, "rss_growth_mb": rss_growth / 1e6,
            "seconds": round(time.perf_counter() - started, 1)}


@pytest.mark.slow
def test_a_million_span_trace_streams_with_flat_memory(alice_client, alice_experiment, streaming_preset):
    run = make_run(alice_experiment, streaming_preset)
    store_million_spans(run, 1_000_000)
    url = f"/api/runs/{run.pk}/trace.json"
    tenth = stream_measured(alice_client, url, {"step_from": 0, "step_to": 9})
    whole = stream_measured(alice_client, url, {})
    print(f"\n100k spans: {tenth}\n1M spans: {whole}")
    assert (tenth["slices"], whole["slices"]) == (100_000, 1_000_000)
    assert whole["flows"] == 250_000 and whole["bytes"] > 250e6 and whole["chunks"] > 500
    # Flat: the whole run's ~300 MB document never sits in memory; ten times the spans of
    # the step range cost no more than a few chunks more.
    assert whole["rss_growth_mb"] < 64 and whole["rss_growth_mb"] < tenth["rss_growth_mb"] + 32


@pytest.mark.django_db(transaction=True)
def test_a_download_whose_connection_is_cut_reads_on_after_the_last_row(alice_run, monkeypatch):
    """The backend serving a download's server-side cursor is terminated between two fetches:
    the rows continue from a fresh connection after the last one sent, none lost or twice."""
    import psycopg

    from controller import exports

    store_spans(alice_run, 30)
    monkeypatch.setattr(exports, "EXPORT_CHUNK_ROWS", 4)  # several fetches
    rows = exports.rows_after(Span.objects.filter(run=alice_run).values("seq"), "seq")
    seqs = [next(rows)["seq"] for _ in range(6)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        victim = cursor.fetchone()[0]
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname="postgres",
                         autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [victim]).fetchone()[0]
    seqs += [row["seq"] for row in rows]
    assert seqs == list(range(30))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != victim  # it was cut, and replaced
