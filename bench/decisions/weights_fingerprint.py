"""What data-parallel ranks' weight comparison costs per step (docs/gpu.md, "Ranks' weight check"):
``param_digest`` (every parameter copied to the host, SHA-256) against ``param_checksum`` (integer
sums of the bit patterns on the parameters' own device, 16 bytes per tensor to the host).

    python -m bench.decisions.weights_fingerprint --device cpu --sizes 10,100 [--json out.json]

A size is millions of float32 parameters, as 1M-element tensors (a model's many matrices)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from learner.distributed.rank_worker import param_checksum, param_digest


def _model(millions: float, device: str, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    n = int(millions * 1_000_000)
    chunk = 1_000_000
    params = torch.nn.ParameterList()
    for at in range(0, n, chunk):
        params.append(torch.nn.Parameter(torch.randn(min(chunk, n - at), device=device).to(dtype)))
    return params


def _time(fn, model, repeats: int, device: str) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of this thread (on a shared machine the
    latter is what the call costs; the former includes waiting for a core)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn(model)  # warm-up (the checksum's column weights are made once)
    wall, cpu = [], []
    for _ in range(repeats):
        sync()
        t0, c0 = time.perf_counter(), time.thread_time()
        fn(model)
        sync()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def measure(sizes: list[float], device: str, dtype: torch.dtype = torch.float32, repeats: int = 3) -> list[dict]:
    rows = []
    for m in sizes:
        model = _model(m, device, dtype)
        (d_wall, d_cpu), (c_wall, c_cpu) = (_time(f, model, repeats, device) for f in (param_digest, param_checksum))
        rows.append({"params_m": m, "device": device, "dtype": str(dtype).removeprefix("torch."),
                     "digest_s": d_wall, "digest_cpu_s": d_cpu, "checksum_s": c_wall, "checksum_cpu_s": c_cpu})
        del model
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="10,100", help="millions of parameters, comma-separated")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (a rank's one core on CPU)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure([float(s) for s in args.sizes.split(",")], args.device, getattr(torch, args.dtype), args.repeats)
    for r in rows:
        print(f"{r['params_m']:>7g}M {r['dtype']:>8} on {r['device']}: SHA-256 digest {r['digest_s'] * 1e3:9.1f} ms "
              f"(CPU {r['digest_cpu_s'] * 1e3:.1f}), checksum {r['checksum_s'] * 1e3:8.1f} ms "
              f"(CPU {r['checksum_cpu_s'] * 1e3:.1f}): {r['digest_cpu_s'] / max(r['checksum_cpu_s'], 1e-9):.1f}x less CPU")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
