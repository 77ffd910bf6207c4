"""Span latency in a real run: from a span's end in the learner to its receipt by N websocket viewers.

Everything is the production path: the real supervisor starts ``thundersync train --events -``
(rollout worker processes, torch), ingests its stdout into PostgreSQL, publishes through the
Redis channel layer to a separate daphne process, whose consumers send to N viewers
(``websockets`` clients in a process of their own, logged in with a session cookie, acking
as the run page does). A span's latency = the epoch time a viewer read the frame holding it
minus the epoch time of the span's end: the learner reports the epoch time of its run clock's
origin in its ``run started`` event, and spans carry ``t1`` on that clock (one machine, one
clock). ``rollout.tool`` spans are reported when the tool starts (their end is the modelled
latency, in the future), so they are left out of the percentiles.

Stages (per span): end -> read by the ingestor (worker and learner hold, pipe),
read -> published (ingestor batch, DB insert), published -> received (Redis, daphne, client).
Also: the run's median step time with these viewers, each component's CPU seconds, and
published -> first viewer / first -> last viewer (fan-out spread). Runs fork from a warm
runner (``--cold``: new processes). ``--compare-publish`` alternates the earlier publishing
(a new event loop, so a new Redis connection, per frame) with the kept loop. Environment:
``ACK_EVERY_S`` (the viewers' ack interval, default the page's 0.1 s), ``LIVE_LATENCY_NICE``
(a nice value for daphne and the viewers: to tell CPU-share delays from work),
``LIVE_LATENCY_DUMP`` (a file for per-span read/published/first/last receipt times).
Target: p95 <= 250 ms.

    .venv/bin/python -m bench.web.live_latency --viewers 1 30 [--steps 8] [--prompts 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import resource
import statistics
import sys
import subprocess
import tempfile
import time
from pathlib import Path

from learner.timeline import Kind
from tests.harness.web_harness import asgi_server, bench_database

TARGET_P95_MS = 250.0


def percentiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {q[49]:.0f} ms, p95 {q[94]:.0f} ms, p99 {q[98]:.0f} ms, max {max(values):.0f} ms"


def make_run(steps: int, prompts: int, group_size: int, workers: int):
    import yaml
    from django.contrib.auth import get_user_model
    from django.test import Client

    from controller.config_merge import run_config
    from controller.models import Experiment, Run, Schedule

    root = Path(__file__).resolve().parents[2]
    user = get_user_model().objects.create_user(f"bench{time.time_ns()}", password="x")
    config = yaml.safe_load((root / "configs" / "quickstart.yaml").read_text())
    config["train"].update(prompts_per_step=prompts, group_size=group_size)
    config["rollout"]["workers"] = workers
    experiment = Experiment.objects.create(owner=user, name="live latency", config=config)
    schedule, _ = Schedule.objects.get_or_create(owner=None, name="streaming", kind="streaming")
    run = Run.objects.create(experiment=experiment, schedule=schedule, steps=steps, status=Run.Status.STARTING,
                             config=run_config(config, schedule.overrides(), steps, "live latency"))
    client = Client()
    client.force_login(user)
    return run, client.cookies["sessionid"].value


class Probe:
    """Times each span where the ingestor reads it and where it is handed to the channel layer."""

    def __init__(self):
        from controller.ingest import ingestion

        self.origin_epoch: float | None = None
        self.read: dict[int, float] = {}
        self.published: dict[int, float] = {}
        take, publish = ingestion.RunIngestor._take, ingestion.live.publish
        probe = self

        def timed_take(ingestor, event):
            if event.get("type") == "span":
                probe.read[event["seq"]] = time.time()
            elif event.get("type") == "run" and event.get("status") == "started":
                probe.origin_epoch = event.get("origin_epoch")
            return take(ingestor, event)

        def timed_publish(run_id, frame):
            publish(run_id, frame)
            if frame["type"] == "spans":
                now = time.time()
                for span in frame["spans"]:
                    probe.published[span["seq"]] = now

        ingestion.RunIngestor._take = timed_take
        ingestion.live = type("TimedLive", (), {"publish": staticmethod(timed_publish)})


TERMINAL = ("succeeded", "failed", "cancelled")
ACK_EVERY_S = float(os.environ.get("ACK_EVERY_S", "0.1"))  # static/js/live.js ACK_EVERY_MS


async def viewer(ws_url: str, origin: str, cookie: str, frames: list, ready: asyncio.Event, counter: list) -> None:
    """One page's worth of websocket: keeps (receive time, raw text), acks as the page does
    (at once during the replay, then at most every ACK_EVERY_S), and stops after the run's final status."""
    from websockets.asyncio.client import connect

    async with connect(ws_url, origin=origin, additional_headers={"Cookie": f"sessionid={cookie}"},
                       max_size=None, open_timeout=60) as ws:
        acked_at = 0.0
        while True:
            raw = await asyncio.wait_for(ws.recv(decode=False), timeout=600)  # decoded after the run
            frames.append((time.time(), raw))
            text = raw[:40].decode(errors="replace")
            if not counter[0] or time.monotonic() - acked_at >= ACK_EVERY_S:
                acked_at = time.monotonic()
                await ws.send(json.dumps({"type": "ack", "frames": len(frames)}))
            if '"replay_done"' in text:
                counter[0] += 1
                if counter[0] == counter[1]:
                    ready.set()
            elif '"status"' in text and json.loads(raw)["status"] in TERMINAL:
                return


def viewers_main(url: str, run_id: int, cookie: str, n: int, out: str) -> None:
    """The viewers' own process (no GIL shared with the supervisor): prints 'ready' once every
    viewer has its replay, writes [[recv, text], ...] per viewer to ``out`` at the end."""
    async def main():
        ready, counter = asyncio.Event(), [0, n]
        per_viewer = [[] for _ in range(n)]
        ws_url = url.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
        tasks = [asyncio.create_task(viewer(ws_url, url, cookie, per_viewer[i], ready, counter)) for i in range(n)]
        await asyncio.wait_for(ready.wait(), timeout=300)
        print("ready", flush=True)
        await asyncio.gather(*tasks)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        Path(out).write_text(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime,
                                         "frames": [[(t, raw.decode()) for t, raw in frames] for frames in per_viewer]}))

    asyncio.run(main())


def start_viewers(url: str, run_id: int, cookie: str, n: int, out: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "bench.web.live_latency", "--viewers-process", url, str(run_id), cookie, str(n),
                             str(out)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise SystemExit("the viewers did not connect")
    return proc


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process (supervisor, ingestor), its reaped children (the
    learner with its workers, the viewers' process) and the daphne process."""
    import psutil

    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    daphne = [p for p in psutil.Process().children() if "daphne" in " ".join(p.cmdline())]
    times = daphne[0].cpu_times() if daphne else None
    return {"self": me.ru_utime + me.ru_stime, "children": children.ru_utime + children.ru_stime,
            "daphne": times.user + times.system if times else float("nan")}


def measure(url: str, viewers: int, steps: int, prompts: int, group_size: int, workers: int) -> dict:
    from controller.models import Run, Span, StepMetric
    from controller.supervision.supervisor import supervise

    run, cookie = make_run(steps, prompts, group_size, workers)
    probe = Probe()
    out = Path(tempfile.mkdtemp()) / "frames.json"
    proc = start_viewers(url, run.pk, cookie, viewers, out)
    if os.environ.get("LIVE_LATENCY_NICE"):  # diagnosis: is the delivery CPU-share bound?
        import psutil

        for p in [psutil.Process(proc.pid), *[c for c in psutil.Process().children() if "daphne" in " ".join(c.cmdline())]]:
            p.nice(int(os.environ["LIVE_LATENCY_NICE"]))
    cpu0 = cpu_seconds()
    t0 = time.monotonic()
    final = supervise(Run.objects.select_related("experiment", "schedule").get(pk=run.pk))
    wall = time.monotonic() - t0
    try:
        proc.wait(timeout=120)
    finally:
        proc.kill()
    cpu1 = cpu_seconds()
    written = json.loads(out.read_text())
    per_viewer = written["frames"]
    cpu = {"viewers' client process": written["cpu_s"], "daphne": cpu1["daphne"] - cpu0["daphne"],
           "supervisor + ingestor": cpu1["self"] - cpu0["self"],
           "learner + rollout workers (cold starts only)": cpu1["children"] - cpu0["children"] - written["cpu_s"]}
    if final.status != Run.Status.SUCCEEDED:
        raise SystemExit(f"run {final.status}: {final.error}")
    kinds = dict(Span.objects.filter(run=run).values_list("seq", "kind"))
    t1 = dict(Span.objects.filter(run=run).values_list("seq", "t1"))
    step_s = [m["timing_s/step"] for m in StepMetric.objects.filter(run=run).values_list("values", flat=True)]
    latencies, stages = [], {"end -> read by the ingestor": [], "read -> published": [], "published -> received": []}
    counts, receipts = [], collections.defaultdict(list)
    for frames in per_viewer:
        seen = []
        for recv, text in frames:
            frame = json.loads(text)
            if frame["type"] != "spans":
                continue
            for span in frame["spans"]:
                seq = span["seq"]
                seen.append(seq)
                if kinds[seq] == Kind.TOOL:
                    continue
                end = probe.origin_epoch + t1[seq]
                latencies.append(1000 * (recv - end))
                stages["published -> received"].append(1000 * (recv - probe.published[seq]))
                receipts[seq].append(recv)
        counts.append(seen)
    stages["published -> first viewer"] = [1000 * (min(r) - probe.published[seq]) for seq, r in receipts.items()]
    stages["first -> last viewer"] = [1000 * (max(r) - min(r)) for r in receipts.values()]
    if os.environ.get("LIVE_LATENCY_DUMP"):
        Path(os.environ["LIVE_LATENCY_DUMP"]).write_text(json.dumps(
            [[seq, probe.read[seq], probe.published[seq], min(r), max(r)] for seq, r in sorted(receipts.items())]))
    for seq, kind in kinds.items():
        if kind != Kind.TOOL:
            stages["end -> read by the ingestor"].append(1000 * (probe.read[seq] - probe.origin_epoch - t1[seq]))
            stages["read -> published"].append(1000 * (probe.published[seq] - probe.read[seq]))
    expected = sorted(kinds)
    exact = all(seen == expected for seen in counts)
    span_frames = sum(1 for _, text in per_viewer[0] if text.startswith('{"type": "spans"'))
    frame_types = collections.Counter(json.loads(text)["type"] for _, text in per_viewer[0])
    return {"viewers": viewers, "spans": len(kinds), "wall_s": wall, "latencies": latencies, "stages": stages,
            "frames": span_frames, "cpu": cpu, "frame_types": dict(frame_types),
            "exactly_once": exact, "median_step_s": statistics.median(step_s) if step_s else float("nan")}


def per_call_loop(layer, group: str, message: dict) -> None:
    """How ``controller.live.broadcast`` published before it kept one event loop: a new loop (and so a
    new Redis connection) per frame. Only for ``--compare-publish``."""
    from asgiref.sync import async_to_sync

    async_to_sync(layer.group_send)(group, message)


def start_warm_runner() -> None:
    """Runs fork from a warm runner, as on the embedded default and the Celery workers
    (controller/supervision/warm.py): a run starts in ~2 s instead of ~40 s at this load, so more rounds fit."""
    from django.conf import settings

    from controller.supervision import warm

    settings.THUNDERSYNC_WARM_RUNNER = True
    runner = warm.start()
    deadline = time.monotonic() + 300
    while not warm.socket_path(os.getpid()).exists():
        if runner.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the warm runner did not start")
        time.sleep(0.1)


def report(arm: str, rs: list[dict]) -> bool:
    latencies = [x for r in rs for x in r["latencies"]]
    p95 = statistics.quantiles(latencies, n=100, method="inclusive")[94]
    exact = all(r["exactly_once"] for r in rs)
    spans, wall = sum(r["spans"] for r in rs), sum(r["wall_s"] for r in rs)
    loads = ", ".join(f"{r['load']:.1f}" for r in rs)
    print(f"\n{arm}: {len(rs)} run(s), {spans} spans in {wall:.1f} s ({spans / wall:.0f} spans/s incl. boot), "
          f"median step {statistics.median(r['median_step_s'] for r in rs):.2f} s, loads "
          f"{loads}; every viewer got every span once in order: {exact}")
    for name in rs[0]["stages"]:
        print(f"  {name:30s} {percentiles([x for r in rs for x in r['stages'][name]])}")
    print(f"  frames per viewer (last run): {rs[-1]['frame_types']}")
    cpu = {k: sum(r["cpu"][k] for r in rs) / len(rs) for k in rs[0]["cpu"]}
    print("  CPU seconds per run: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
    print(f"  {'span end -> received':30s} {percentiles(latencies)} "
          f"({'OK' if p95 <= TARGET_P95_MS else 'OVER'} target p95 <= {TARGET_P95_MS:.0f} ms)")
    return p95 <= TARGET_P95_MS and exact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 30])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16, help="train.prompts_per_step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1, help="rollout.workers")
    parser.add_argument("--rounds", type=int, default=1, help="each arm this often, alternating")
    parser.add_argument("--compare-publish", action="store_true",
                        help="also each viewer count with the earlier publishing (a new event loop per frame)")
    parser.add_argument("--cold", action="store_true", help="start each run as a new process (no warm runner)")
    parser.add_argument("--viewers-process", nargs=5, metavar=("URL", "RUN", "COOKIE", "N", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.viewers_process:
        url, run_id, cookie, n, out = args.viewers_process
        viewers_main(url, int(run_id), cookie, int(n), out)
        return 0
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    arms = [(n, mode) for n in args.viewers for mode in (["kept loop", "loop per frame"] if args.compare_publish
                                                             else ["kept loop"])]
    results: dict[tuple, list[dict]] = {arm: [] for arm in arms}
    with bench_database(), tempfile.TemporaryDirectory() as run_dir:
        from django.conf import settings

        from controller.live import broadcast as live
        from controller.supervision import warm

        settings.THUNDERSYNC_RUN_DIR = Path(run_dir)
        kept = live._group_send
        try:
            if not args.cold:
                start_warm_runner()
            with asgi_server() as url:
                for _ in range(args.rounds):
                    for n, mode in arms:
                        live._group_send = kept if mode == "kept loop" else per_call_loop
                        r = measure(url, n, args.steps, args.prompts, args.group_size, args.workers)
                        r["load"] = os.getloadavg()[0]
                        results[(n, mode)].append(r)
        finally:
            live._group_send = kept
            warm.stop()
    print(f"load average {os.getloadavg()[0]:.1f} / {os.getloadavg()[1]:.1f} (1/5 min) on {os.cpu_count()} CPUs; "
          f"streaming, {args.steps} steps x {args.prompts} prompts x {args.group_size}, {args.workers} worker(s); "
          f"{'cold' if args.cold else 'warm-runner'} starts; arms alternate, {args.rounds} round(s)")
    ok = True
    for (n, mode), rs in results.items():
        ok &= report(f"{n} viewer(s), publishing on a {mode}", rs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
