"""Per-trajectory hand-off latency, worker -> driver: today's pipe vs a Ray actor's return.

    python -m bench.decisions.handoff_latency [--n 300] [--tokens 1024] [--json FILE]

Both sides on this machine. A message is a finished trajectory's payload (``--tokens`` token ids
and as many float log-probs, in Python lists, as the workers send them). For each of ``--n``
messages the driver asks for one and records ``recv - send`` on the one monotonic clock both
processes share (one way, the worker's send to the driver holding the decoded object):

- **pipe**: a spawned worker process puts the message into the project's ``Outbox`` (a feeder
  thread writing to the worker's own pipe, learner/rollout/processes/outbox.py); the driver waits on the
  pipe with ``multiprocessing.connection.wait`` and ``recv``s it, as ``Fleet`` does.
- **pipe-direct**: the same pipe written by the worker's own thread (``conn.send``), no feeder:
  what the feeder thread's wake-up adds.
- **ray**: a Ray actor's method returns the message; the driver's ``ray.get`` holds it (a local
  Ray instance, one node, loopback, no dashboard).

Prints the median, p90 and p99 in milliseconds per mode.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import time
from multiprocessing.connection import wait


def payload(tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    return {"tokens": [rng.randrange(32000) for _ in range(tokens)],
            "logprobs": [-rng.random() * 5 for _ in range(tokens)], "reward": rng.random()}


def _pipe_worker(out_conn, go_conn, n: int, tokens: int, direct: bool) -> None:
    from learner.rollout.processes.outbox import Outbox

    box = None if direct else Outbox(out_conn)
    for i in range(n):
        go_conn.recv()
        body = payload(tokens, i)
        if direct:
            out_conn.send((time.monotonic(), body))
        else:
            box.put((time.monotonic(), body))
    if box is not None:
        box.flush(10.0)


def measure_pipe(n: int, tokens: int, direct: bool = False) -> list[float]:
    ctx = mp.get_context("spawn")
    recv_end, send_end = ctx.Pipe(duplex=False)
    go_recv, go_send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_pipe_worker, args=(send_end, go_recv, n, tokens, direct), daemon=True)
    proc.start()
    send_end.close()
    go_recv.close()
    out = []
    try:
        for _ in range(n):
            go_send.send(1)
            if not wait([recv_end], timeout=60):
                raise TimeoutError("the pipe worker sent nothing within 60 s")
            sent, _body = recv_end.recv()
            out.append(time.monotonic() - sent)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return out


def measure_ray(n: int, tokens: int) -> list[float]:
    import ray

    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             _system_config={"enable_metrics_collection": False})
    try:
        @ray.remote(num_cpus=0)
        class Worker:
            def produce(self, i: int) -> tuple[float, dict]:
                body = payload(tokens, i)
                return time.monotonic(), body

        worker = Worker.remote()
        ray.get(worker.produce.remote(-1), timeout=120)  # started and imported
        out = []
        for i in range(n):
            sent, _body = ray.get(worker.produce.remote(i), timeout=60)
            out.append(time.monotonic() - sent)
        ray.kill(worker)
        return out
    finally:
        ray.shutdown()


def summary(samples: list[float]) -> dict:
    ms = sorted(s * 1000 for s in samples)
    return {"n": len(ms), "median_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))],
            "p99_ms": ms[int(0.99 * (len(ms) - 1))]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    result = {"tokens": args.tokens, "load": os.getloadavg()[0],
              "pipe": summary(measure_pipe(args.n, args.tokens)),
              "pipe-direct": summary(measure_pipe(args.n, args.tokens, direct=True)), "ray": summary(measure_ray(args.n, args.tokens))}
    for mode in ("pipe", "pipe-direct", "ray"):
        r = result[mode]
        print(f"{mode:11} median {r['median_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  (n={r['n']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
