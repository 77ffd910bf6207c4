"""``thundersync``: train, check exactness, audit a step dump, simulate, bench."""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import os
import sys
from pathlib import Path

from learner import stopping
from learner.checkpoint import (CHECKPOINTS, RUN_CONFIG, CheckpointWriteError, latest_checkpoint, remove_uncommitted,
                                write_run_config)
from learner.checkpoint_integrity import damaged_dir, newest_intact
from learner.cli_args import choice_list, int_list
from learner.config import LEARNER_ENGINES, SCHEDULES, ConfigError, load_config
from learner.preflight import preflight
from learner.rollout.processes.boot import boot_fleet
from learner.timeline import EventsUnwritable, JsonlSink, Metric, claim_stdout


class UsageError(Exception):
    pass


def bar_to_step(bar, step: int) -> None:
    """Step ``step`` is done: the bar at step + 1 of train.steps. A resumed run's first step is the
    checkpoint's next one, not 0: the bar starts there (its rate counts this attempt's steps only)
    and ends at 100%."""
    if bar.n == 0 and step > 0:
        bar.n = bar.last_print_n = bar.initial = step
    bar.update(step + 1 - bar.n)


def _summary_line(m: dict) -> str:
    return (f"step {m['step']:>3}  reward {m[Metric.REWARD_MEAN]:.3f}  step {m[Metric.STEP_S]:.2f}s  "
            f"learner idle {100 * m[Metric.TRAINER_IDLE]:.1f}% (waiting {100 * m[Metric.TRAINER_WAIT]:.1f}%)  "
            f"rollout idle {100 * m[Metric.ROLLOUT_IDLE]:.1f}%  "
            f"staleness {m[Metric.STALENESS_MEAN]:.2f}/{m[Metric.STALENESS_MAX]:.0f}  tail {m[Metric.TAIL_S]:.2f}s")


def check_resolvable(cfg) -> None:
    """What the schema cannot see and needs the heavy imports: the environment is
    registered, a GPU asked for is there (model paths: ``learner.preflight``, before boot)."""
    from learner.placement import check_visible
    from learner.tasks.registry import make_env

    try:
        env = make_env(cfg.task)
        check = getattr(env, "check", None)
        if check is not None:  # data tasks: read the data now, so a bad row stops the run here
            check(cfg.seed, cfg.train.steps * cfg.train.prompts_per_step)
        if cfg.train.eval_every:
            from learner.evaluation import eval_tasks

            if not eval_tasks(env, cfg.seed, 1):
                raise ValueError("train.eval_every: the task has no held-out prompts (set task.eval_fraction)")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.model.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"model.device: 'cuda' needs a CUDA device, and torch {torch.__version__} sees none")
        try:  # a placement's GPU indices against this node's GPUs (learner.placement)
            check_visible(cfg, torch.cuda.device_count())
        except ValueError as err:
            raise ConfigError(str(err)) from None


def boot_phase(args, text: str) -> None:
    """A line the run page shows while the run starts (controller: the log's "boot: " lines);
    progress, like the bar: not with --quiet."""
    if not args.quiet:
        print(f"boot: {text}", file=sys.stderr, flush=True)


def report_failure(events: str | None, error: str) -> None:
    """Tell whoever reads the event stream why there is no (more) run."""
    if not events:
        return
    try:
        sink = JsonlSink(events)
        sink.emit({"type": "run", "status": "failed", "error": error})
        sink.close()
    except EventsUnwritable:
        pass


def validated_config(args):
    """The run's config, every check that needs no worker done (``learner.preflight``)."""
    overrides = {}
    if args.schedule:
        overrides["train.schedule"] = args.schedule
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    if args.engine:
        overrides["rollout.engine"] = args.engine
    if args.tensorboard:
        overrides["tracking.tensorboard"] = args.tensorboard
    if args.wandb:
        overrides["tracking.wandb"] = True
    if args.learner_world_size is not None:
        overrides["learner.world_size"] = args.learner_world_size
    if args.output:
        overrides["train.output_dir"] = args.output
    if args.checkpoint_every is not None:
        overrides["train.checkpoint_every"] = args.checkpoint_every
    source = args.config
    if args.resume:
        source = resume_source(args)
        overrides["train.output_dir"] = args.resume  # the continued run writes where it left off
    elif not args.config:
        raise ConfigError("--config: required (or --resume DIR)")
    cfg = load_config(source, overrides)
    if cfg.cluster is not None:
        raise ConfigError("cluster: thundersync train runs on this machine; for a Ray cluster, thundersync "
                          "cluster-check --config FILE places the run's roles there and checks a data-parallel "
                          "step (training on the cluster is not built yet)")
    preflight(cfg, dump_dir=args.dump_step, output_dir=cfg.train.output_dir, events=args.events)
    if args.dump_step and not 0 <= args.dump_at < max(cfg.train.steps, 1):
        raise ConfigError(f"--dump-at: step {args.dump_at} is not one of the run's {cfg.train.steps} steps")
    return cfg


def resume_source(args) -> Path:
    """The config a run stored in its output directory (``learner/checkpoint.py``)."""
    if args.config:
        raise ConfigError("--resume: continues with the config stored in DIR; --config cannot change it")
    if args.output and Path(args.output) != Path(args.resume):
        raise ConfigError("--output: a resumed run writes to its --resume directory")
    source = Path(args.resume) / RUN_CONFIG
    if not source.is_file():
        raise ConfigError(f"--resume: {args.resume} holds no {RUN_CONFIG} (not the --output directory of a run)")
    if latest_checkpoint(args.resume) is None:
        raise ConfigError(f"--resume: no checkpoint under {Path(args.resume) / CHECKPOINTS}")
    args.resume_from = resume_checkpoint(args.resume)
    return source


def resume_checkpoint(out_dir: str) -> Path:
    """The checkpoint ``--resume`` continues from: the newest intact one, after removing the
    half-written ones a killed run left and setting the damaged ones aside (one line each on
    stderr; learner/checkpoint_integrity.py)."""
    for name in remove_uncommitted(out_dir):
        print(f"thundersync: removed {Path(out_dir) / CHECKPOINTS / name}: a checkpoint never committed "
              "(its run was killed while writing or deleting it)", file=sys.stderr)
    found = newest_intact(out_dir, lambda line: print(f"thundersync: {line}", file=sys.stderr))
    if found is None:
        raise ConfigError(f"--resume: no intact checkpoint under {Path(out_dir) / CHECKPOINTS} "
                          f"(the damaged ones are in {damaged_dir(out_dir)})")
    return found


def resume_point(args, point_type):
    """``--resume``: the checkpoint ``resume_checkpoint`` chose; None for a fresh run."""
    if not args.resume:
        return None
    return point_type(args.resume_from, args.seq_from, args.clock_from)


def cmd_train(args) -> int:
    if args.events == "-":
        claim_stdout()  # from here on only events reach stdout, from this process and its children
    stopping.install()  # SIGTERM/SIGINT: stop at a safe point (learner/stopping.py)
    stopping.tag_semaphores()
    stopping.sweep_semaphores()  # what runs killed with SIGKILL left in /dev/shm
    stopping.start_janitor()  # and what this one leaves, once its group is gone
    booted, extra_sinks = None, []
    try:
        cfg = validated_config(args)
        if cfg.train.steps > 0:
            # the rollout workers import torch beside this process from here on
            boot_phase(args, f"starting {cfg.rollout.workers if cfg.rollout.engine == 'torch' else cfg.rollout.replicas} "
                       f"rollout worker(s)")
            booted = boot_fleet(cfg)
        check_resolvable(cfg)
        if cfg.train.steps > 0:
            from learner.tracking import tracking_sinks

            extra_sinks = tracking_sinks(cfg)
    except ConfigError as err:
        if booted:
            booted.close()
        report_failure(args.events, f"invalid config: {err}")
        raise
    except BaseException:
        if booted:  # the workers must not outlive a failed start (the interpreter's exit would wait for them)
            booted.close()
        raise
    if cfg.train.steps == 0:
        print(f"config ok: {args.config} ({cfg.train.schedule}, {cfg.algorithm.objective})", file=sys.stderr)
        return 0
    try:
        return train_and_report(cfg, args, booted, extra_sinks)
    except EventsUnwritable as err:
        booted.close()
        gc.unfreeze()  # set-up may have frozen the heap; exit-time leak checks must see it freed
        if args.events == "-":  # nobody reads stdout any more: no complaint at exit either
            os.dup2(os.open(os.devnull, os.O_WRONLY), claim_stdout().fileno())
        print(f"thundersync: {err}", file=sys.stderr)
        return 1


def train_and_report(cfg, args, booted, extra_sinks: list) -> int:
    # a run forked from the warm runner (learner/warm/server.py) has torch imported already
    if cfg.model.device == "cuda":  # which GPU each lane runs on (placement, docs/gpu.md)
        from learner.placement import describe, device_map

        boot_phase(args, f"devices: {describe(device_map(cfg))}")
    boot_phase(args, f"loading {'' if 'torch' in sys.modules else 'torch and '}the policy {cfg.model.policy}")
    from tqdm import tqdm

    from learner.driver.loop import train
    from learner.driver.resume import ResumePoint
    from learner.timeline import FanoutSink, MemorySink

    sinks = ([JsonlSink(args.events)] if args.events else []) + extra_sinks
    sink = FanoutSink(*sinks) if sinks else MemorySink()
    bar = tqdm(total=cfg.train.steps, desc=f"{cfg.train.schedule}", file=sys.stderr, disable=args.quiet)

    def on_step(m: dict) -> None:
        bar_to_step(bar, m["step"])
        bar.write(_summary_line(m), file=sys.stderr)

    from learner.rollout.processes.fleet import RolloutError
    from learner.rollout.processes.weights import SharedMemoryTooSmall

    if cfg.train.output_dir:
        write_run_config(cfg.train.output_dir, cfg.model_dump(mode="json"))
    resume = resume_point(args, ResumePoint)
    try:
        _, summary = train(cfg, sink, dump_dir=args.dump_step, on_step=on_step, booted=booted, dump_at=args.dump_at,
                           resume=resume)
    except stopping.Interrupted as stop:  # the workers are stopped by now (Trainer.run's finally)
        sink.emit({"type": "run", "status": "failed", "error": str(stop)})
        print(f"thundersync: {stop}", file=sys.stderr)
        return stop.exit_code
    except EventsUnwritable:
        raise
    except (CheckpointWriteError, SharedMemoryTooSmall) as exc:  # a full disk or /dev/shm: which and why, not a traceback
        sink.emit({"type": "run", "status": "failed", "error": str(exc)})
        print(f"thundersync: run failed: {exc}", file=sys.stderr)
        return 1
    except RolloutError as exc:  # e.g. a task's reward failed on a row: its reason, not our traceback
        reason = str(exc).splitlines()[0]
        sink.emit({"type": "run", "status": "failed", "error": f"RolloutError: {reason}"})
        print(f"thundersync: run failed: {reason}", file=sys.stderr)
        return 1
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
    if args.world_size:  # data-parallel ranks (docs/distributed.md)
        from learner.checks.distributed_exactness import main as distributed_main

        return distributed_main(args.world_size, args.engine or ["torch"], args.zero or [0], args.offload, args.json)
    if args.engine or args.zero or args.offload:
        raise UsageError("check-exactness: --engine, --zero and --offload need --world-size")
    from learner.checks.exactness import main

    return main(json_out=args.json)


def cmd_join_rank(args) -> int:
    from learner.distributed.remote import KEY_ENV, join_rank

    host, _, port = args.control.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"join-rank: --control: expected HOST:PORT, got {args.control!r}")
    key = os.environ.get(KEY_ENV, "")
    try:
        key_bytes = bytes.fromhex(key)
    except ValueError:
        key_bytes = b""
    if not key_bytes:
        raise UsageError(f"join-rank: {KEY_ENV}: the run's control key (hex) must be set in the environment")
    if args.rank < 1:
        raise UsageError("join-rank: --rank: rank 0 is the driver; another node runs ranks 1 and up")
    return join_rank((host, int(port)), args.rank, args.node, key_bytes, args.timeout)


def cmd_cluster_check(args) -> int:
    """Place a run's roles on its Ray cluster, print where each landed, run one data-parallel
    streaming step on its learner ranks against the single-process gradient, release everything."""
    import json

    cfg = load_config(args.config)
    if cfg.cluster is None:
        raise ConfigError("cluster: cluster-check needs the config's cluster section (cluster: {address: auto})")
    from learner.cluster.check import streaming_step
    from learner.cluster.launcher import ClusterError, ClusterRun

    try:
        with ClusterRun(cfg) as run:
            joined = run.join_process_group()
            result = run.call_learners(streaming_step, cfg.seed)[0]
            roles = [{**info, "env": {k: v for k, v in info["env"].items() if v is not None}}
                     for info in [*joined, *(run.infos[n] for n in run.infos if not n.startswith("learner/"))]]
    except ClusterError as err:
        print(f"thundersync: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"roles": roles, "step": result}))
    else:
        for info in roles:
            print(f"{info['role']:12} node {info['node_ip']} ({info['node_id'][:8]})  GPUs {','.join(info['gpu_ids']) or '-'}"
                  f"  CUDA_VISIBLE_DEVICES={info['cuda_visible_devices']}  "
                  + " ".join(f"{k}={v}" for k, v in info["env"].items()))
        print(f"streaming step on {result['world_size']} rank(s): rel_error {result['rel_error']:.2e} "
              f"(tolerance {result['tol']:.0e}) {'passed' if result['passed'] else 'FAILED'}")
    return 0 if result["passed"] else 1


def cmd_audit(args) -> int:
    from learner.audit import audit_dump

    result = audit_dump(args.dir)
    print(json.dumps(result))
    return 0 if result["passed"] else 1


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="run config (YAML/JSON), see configs/ (required unless --resume)")
    p.add_argument("--schedule", choices=SCHEDULES, help="override train.schedule")
    p.add_argument("--steps", type=int, help="override train.steps (0: only validate the config)")
    p.add_argument("--engine", choices=("torch", "vllm"), help="override rollout.engine")
    p.add_argument("--learner-world-size", type=int, metavar="W",
                   help="override learner.world_size: data-parallel learner ranks (docs/distributed.md)")
    p.add_argument("--events", help="write JSONL events (spans, metrics) to FILE, or '-' for stdout")
    p.add_argument("--dump-step", metavar="DIR", help="dump one step (model, batch, gradient) for audit")
    p.add_argument("--dump-at", metavar="STEP", type=int, default=0, help="the step --dump-step dumps [0]")
    p.add_argument("--tensorboard", metavar="DIR", help="also write step metrics as TensorBoard event files in DIR")
    p.add_argument("--wandb", action="store_true", help="also log step metrics to W&B in offline mode")
    p.add_argument("--output", metavar="DIR", help="the final model (Hugging Face directory), checkpoints and "
                                                   "the run's config go here (train.output_dir)")
    p.add_argument("--checkpoint-every", type=int, metavar="N", help="checkpoint every N steps (train.checkpoint_every)")
    p.add_argument("--resume", metavar="DIR",
                   help="continue the run of --output DIR from its newest committed checkpoint")
    p.add_argument("--seq-from", type=int, default=0, metavar="N",
                   help="number spans from at least N (the controller resumes a run whose spans it has stored)")
    p.add_argument("--clock-from", type=float, default=0.0, metavar="S",
                   help="run clock starts at at least S seconds (as --seq-from, for the timeline)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="thundersync", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    add_train_arguments(sub.add_parser("train", help="train a policy with one of the four schedules"))

    p = sub.add_parser("check-exactness", help="streaming vs direct full-batch gradient on random batches")
    p.add_argument("--json", action="store_true")
    p.add_argument("--world-size", type=int_list(1, 8), metavar="W[,W...]",
                   help="data-parallel ranks (spawned processes): streamed-and-reduced vs single-process gradient")
    p.add_argument("--engine", type=choice_list(LEARNER_ENGINES), metavar="torch,deepspeed",
                   help="with --world-size: engines (torch: float64; deepspeed: float32)")
    p.add_argument("--zero", type=int_list(0, 2), metavar="0,1,2", help="with --engine deepspeed: ZeRO stages")
    p.add_argument("--offload", action="store_true", help="with --zero 1/2: optimizer state offloaded to CPU")
    p.set_defaults(func=cmd_check_exactness)

    p = sub.add_parser("join-rank", help="be a learner rank, on this node, of a run whose rank 0 runs elsewhere")
    p.add_argument("--control", required=True, metavar="HOST:PORT", help="rank 0's control port")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--node", required=True, help="this node's name (learner.nodes)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="longest wait for rank 0 [300]")
    p.set_defaults(func=cmd_join_rank)

    p = sub.add_parser("cluster-check", help="place a run's roles on its Ray cluster (the cluster section) and "
                                             "check one data-parallel step there")
    p.add_argument("--config", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cluster_check)

    p = sub.add_parser("audit", help="recompute a --dump-step gradient independently and compare")
    p.add_argument("dir")
    p.set_defaults(func=cmd_audit)

    for name, path in (("simulate", "learner.sim.command"), ("bench", "learner.bench.run"), ("race", "learner.bench.race")):
        try:
            module = importlib.import_module(path)
        except ImportError as err:  # the other commands still work; this one says why it cannot
            # no option characters: every argument (--help too) reaches cannot_load, which exits 1
            p = sub.add_parser(name, help=f"unavailable: {err}", prefix_chars="\0", add_help=False)
            p.add_argument("ignored", nargs="*")
            p.set_defaults(func=functools.partial(cannot_load, name, path, err))
            continue
        p = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def cannot_load(name: str, path: str, err: ImportError, args) -> int:
    print(f"thundersync: {name}: cannot load {path}: {type(err).__name__}: {err}", file=sys.stderr)
    return 1


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
    except UsageError as err:
        print(f"thundersync: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, stopping.Interrupted):  # before a run started, or a second signal
        return 130 if stopping.requested() in (None, 2) else 128 + stopping.requested()


def entry() -> int:
    """The ``thundersync`` process: ``main``, then an exit that cannot hang (``stopping.exit_within``)."""
    code = main()
    stopping.exit_within(code)
    return code


if __name__ == "__main__":
    sys.exit(entry())
