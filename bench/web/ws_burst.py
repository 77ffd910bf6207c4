"""Websocket bursts against one production-settings daphne: its RSS with N sockets of one user
open, after they close, over several bursts; and how many of N the per-user cap lets in.

    .venv/bin/python -m bench.web.ws_burst [--sockets 200] [--bursts 3]

Phase 1 raises THUNDERSYNC_WS_PER_USER past N (every socket accepted: what N open sockets cost);
phase 2 runs daphne at the default cap (what a user opening N sockets gets). Each socket opens
/ws/runs/<id>/ (20 handshakes at a time), reads up to replay_done (a finished run with 2,000 stored spans), and stays open
until all N are open; then all close. RSS is VmRSS of the daphne process from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path



def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def burst(url: str, headers: dict, count: int, pid: int) -> dict:
    """Open ``count`` sockets, 20 handshakes at a time, each read to replay_done (or its close) and
    kept open; sample the RSS with all open, close them all, sample again 3 s later."""
    import websockets

    opened, codes = [], {}
    opening = asyncio.Semaphore(20)  # handshakes at once: 200 together time out daphne's on 2 loaded cores

    async def one():
        async with opening:
            await opened_one()

    async def opened_one():
        try:
            socket = await websockets.connect(url, additional_headers=headers, open_timeout=60, max_size=2**24)
        except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as err:
            key = f"{type(err).__name__}: {str(err)[:80]}"
            codes[key] = codes.get(key, 0) + 1
            return
        received = 0
        try:
            while True:
                frame = json.loads(await asyncio.wait_for(socket.recv(), 60))
                received += 1
                await socket.send(json.dumps({"type": "ack", "frames": received}))
                if frame["type"] == "replay_done":
                    opened.append(socket)
                    codes["open"] = codes.get("open", 0) + 1
                    return
        except websockets.ConnectionClosed as err:
            code = err.rcvd.code if err.rcvd else "closed"
            codes[code] = codes.get(code, 0) + 1

    await asyncio.gather(*(one() for _ in range(count)))
    peak = rss_mb(pid)
    await asyncio.gather(*(s.close() for s in opened))
    await asyncio.sleep(3.0)
    return {"codes": codes, "rss_open_mb": round(peak, 1), "rss_after_close_mb": round(rss_mb(pid), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--bursts", type=int, default=3)
    args = parser.parse_args()
    from tests.harness.web_harness import bench_database

    report: dict = {"sockets": args.sockets}
    with bench_database(), tempfile.TemporaryDirectory() as tmp:
        from django.conf import settings

        from controller.models import Run, Span
        from tests.controller.faults import ProductionWeb, RedisServer, production_password
        from tests.harness.web_harness import bench_run

        run = bench_run(Run.Status.SUCCEEDED)
        production_password(run.experiment.owner, "bench-password")
        Span.objects.bulk_create([Span(run=run, seq=i, step=i // 200, kind="learner.backward", t0=i * 0.01,
                                       t1=i * 0.01 + 0.005, lane="learner/0") for i in range(2000)])
        redis = RedisServer(Path(tmp) / "redis").start()
        try:
            for phase, cap in (("uncapped", args.sockets + 10), ("default_cap", settings.THUNDERSYNC_WS_PER_USER)):
                web = ProductionWeb(redis.url, Path(tmp) / "runs", Path(tmp) / f"{phase}.log",
                                    env={"THUNDERSYNC_WS_PER_USER": str(cap)})
                try:
                    session = web.login("bench", "bench-password")
                    cookies = session.cookies.get_dict()
                    headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()), "Origin": web.url}
                    url = f"{web.url.replace('http', 'ws', 1)}/ws/runs/{run.pk}/"
                    time.sleep(1.0)
                    rows = {"cap": cap, "rss_idle_mb": round(rss_mb(web.proc.pid), 1), "bursts": []}
                    for _ in range(args.bursts if phase == "uncapped" else 1):
                        rows["bursts"].append(asyncio.run(burst(url, headers, args.sockets, web.proc.pid)))
                    rows["tracebacks"] = web.log_path.read_text().count("Traceback")
                    report[phase] = rows
                finally:
                    web.stop()
        finally:
            redis.stop()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
