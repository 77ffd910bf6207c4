"""``thundersync``: train, check exactness, audit a step dump, simulate, bench."""

from __future__ import annotations

import argparse
import json
import sys

from learner.config import SCHEDULES, ConfigError, load_config
from learner.rollout.boot import boot_fleet
from learner.timeline import JsonlSink


class UsageError(Exception):
    pass


def _summary_line(m: dict) -> str:
    return (f"step {m['step']:>3}  reward {m['reward/mean']:.3f}  step {m['timing_s/step']:.2f}s  "
            f"learner idle {100 * m['trainer/idle_ratio']:.1f}% (waiting {100 * m['trainer/wait_ratio']:.1f}%)  rollout idle {100 * m['rollouter/idle_ratio']:.1f}%  "
            f"staleness {m['staleness/mean']:.2f}/{m['staleness/max']:.0f}  tail {m['timing_s/tail']:.2f}s")


def check_resolvable(cfg) -> None:
    """What the schema cannot see: the environment is registered, local model dirs exist, a
    GPU asked for is there."""
    from pathlib import Path

    from learner.rollout.env import make_env
    from learner.rollout.models import BUILTIN_PREFIX, is_model_dir

    try:
        make_env(cfg.task)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    specs = {"model.policy": cfg.model.policy}
    if cfg.algorithm.objective == "opd":
        specs["model.teacher"] = cfg.model.teacher
    for field, spec in specs.items():
        if not spec.startswith(BUILTIN_PREFIX) and not is_model_dir(Path(spec).expanduser()):
            raise ConfigError(f"{field}: {spec!r} is not a Hugging Face model directory (config.json + weights)")
    if cfg.model.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"model.device: 'cuda' needs a CUDA device, and torch {torch.__version__} sees none")


def cmd_train(args) -> int:
    overrides = {}
    if args.schedule:
        overrides["train.schedule"] = args.schedule
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    if args.engine:
        overrides["rollout.engine"] = args.engine
    booted = None
    try:
        cfg = load_config(args.config, overrides)
        if cfg.train.steps > 0:
            # the rollout workers import torch beside this process from here on
            booted = boot_fleet(cfg)
        check_resolvable(cfg)
        if args.dump_step and not 0 <= args.dump_at < max(cfg.train.steps, 1):
            raise ConfigError(f"--dump-at: step {args.dump_at} is not one of the run's {cfg.train.steps} steps")
    except ConfigError as err:
        if booted:
            booted.close()
        if args.events:  # whoever reads the stream learns why there is no run
            JsonlSink(args.events).emit({"type": "run", "status": "failed", "error": f"invalid config: {err}"})
        raise
    if cfg.train.steps == 0:
        print(f"config ok: {args.config} ({cfg.train.schedule}, {cfg.algorithm.objective})", file=sys.stderr)
        return 0
    from tqdm import tqdm

    from learner.driver.loop import train
    from learner.timeline import FanoutSink, MemorySink

    sinks = [JsonlSink(args.events)] if args.events else []
    sink = FanoutSink(*sinks) if sinks else MemorySink()
    bar = tqdm(total=cfg.train.steps, desc=f"{cfg.train.schedule}", file=sys.stderr, disable=args.quiet)

    def on_step(m: dict) -> None:
        bar.update(1)
        bar.write(_summary_line(m), file=sys.stderr)

    try:
        _, summary = train(cfg, sink, dump_dir=args.dump_step, on_step=on_step, booted=booted, dump_at=args.dump_at)
    except Exception as exc:
        sink.emit({"type": "run", "status": "failed", "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
        raise
    finally:
        bar.close()
        sink.close()
    curve = " ".join(f"{r:.2f}" for r in summary["reward_curve"])
    print(f"done: {summary['steps']} steps in {summary['wall_s']:.1f}s; reward per step: {curve}", file=sys.stderr)
    return 0


def cmd_check_exactness(args) -> int:
    from learner.exactness import main

    return main(json_out=args.json)


def cmd_audit(args) -> int:
    from learner.audit import audit_dump

    result = audit_dump(args.dir)
    print(json.dumps(result))
    return 0 if result["passed"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thundersync", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a policy with one of the four schedules")
    p.add_argument("--config", required=True, help="run config (YAML/JSON), see configs/")
    p.add_argument("--schedule", choices=SCHEDULES, help="override train.schedule")
    p.add_argument("--steps", type=int, help="override train.steps (0: only validate the config)")
    p.add_argument("--engine", choices=("torch", "vllm"), help="override rollout.engine")
    p.add_argument("--events", help="write JSONL events (spans, metrics) to FILE, or '-' for stdout")
    p.add_argument("--dump-step", metavar="DIR", help="dump one step (model, batch, gradient) for audit")
    p.add_argument("--dump-at", metavar="STEP", type=int, default=0, help="the step --dump-step dumps [0]")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("check-exactness", help="streaming vs direct full-batch gradient on random batches")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check_exactness)

    p = sub.add_parser("audit", help="recompute a --dump-step gradient independently and compare")
    p.add_argument("dir")
    p.set_defaults(func=cmd_audit)

    for name, path in (("simulate", "learner.sim.cli"), ("bench", "learner.bench.run")):
        try:
            module = __import__(path, fromlist=["add_arguments", "run"])
        except ImportError:
            continue
        p = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def quiet_libraries() -> None:
    """Keep stderr for our progress bar: no per-load progress bars from transformers."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"thundersync: invalid config: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
