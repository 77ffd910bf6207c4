"""Rollout worker processes: concurrent multi-turn agent loops over one engine.

Each worker owns an engine (pinned to its own core, one torch thread) and runs every
trajectory it was handed as an agent loop: generate a turn -> (OPD: teacher scores it and
the scored turn goes to the learner at once) -> the tool runs while the other loops keep
generating -> observation -> next turn ... -> final answer -> verifier -> the finished
trajectory goes to the learner. Turns of all loops that are ready are batched into one
engine call; a row that stops is handled at once (its tool starts, or it is verified and
sent to the learner) while the rest of the call decodes, and with continuous batching
(``rollout.continuous_batching``, the torch engine) a loop that becomes ready while a call
runs joins it between two decode steps (``EngineCall.admit``) rather than waiting for
the call to end, so turns, and rewards, do not start in waves. Every phase is reported as a
span on the trajectory's slot lane; a turn's generate span starts when its row joins a call.

Messages to the driver (``out_q``: the worker's own pipe, ``rollout/outbox.py``) and commands
from it: ``rollout/messages.py``.
Commands from the driver: ("load", version), ("work", step, [(traj, group, Task, seed)]), ("stop",).
"""

from __future__ import annotations

import gc
import heapq
import math
import queue
import random
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from learner.config import RunConfig
from learner.rollout.cores import pin_process
from learner.rollout.engine import SamplingParams
from learner.rollout.chat import ChatFormat, turn_stop_ids
from learner.rollout.env import Task, score_final
from learner.rollout.tasks import make_env
from learner.rollout.messages import Ack, Failed, Finished, Load, Ready, Spans, Stop, Wake, Work
from learner.rollout.models import stop_token_ids
from learner.rollout.tool_calls import ToolCalls
from learner.timeline import Kind, Span
from learner.trajectory import ScoredTurn, Trajectory

IDLE_POLL_S = 0.05


@dataclass
class LoopState:
    """One agent loop in flight."""

    traj: int
    group: int
    step: int
    task: Task
    seed: int
    slot: int
    ids: list[int]
    mask: list[int]
    blogp: list[float]
    turn_versions: list[int] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    teacher: list[float | None] | None = None
    ready_at: float = 0.0  # run clock; the modelled tool latency ends here (inf: a tool call is running)


def pin_to_core(core: int | None) -> None:
    """This process on ``core`` (None: anywhere) with one torch thread."""
    pin_process(core)
    torch.set_num_threads(1)


class AgentWorker:
    def __init__(self, wid: int, cfg: RunConfig, engine, tokenizer, teacher, store, out_q, origin: float,
                 stop_ids: list[int] | None = None):
        """``stop_ids``: the tokens that end a turn (``chat.turn_stop_ids``: the policy's
        generation config); default the built-in format's."""
        self.wid, self.cfg, self.engine, self.tok = wid, cfg, engine, tokenizer
        self.teacher, self.store, self.out_q, self.origin = teacher, store, out_q, origin
        self.env = make_env(cfg.task)
        self.chat = ChatFormat(tokenizer, self.env, cfg.task.tool_format)
        self.loops: dict[int, LoopState] = {}
        self.free_slots: list[int] = []  # heap of slot lanes given back; new ones are numbered on
        self.spans: list[Span] = []
        self.stop_ids = stop_ids if stop_ids is not None else stop_token_ids(tokenizer)
        model_config = getattr(getattr(engine, "model", None), "config", None)
        self.max_len = getattr(engine, "max_model_len", None) or getattr(model_config, "max_position_embeddings", 10**9)
        self.follow_latest = cfg.train.schedule == "fully-async"

    def now(self) -> float:
        return time.monotonic() - self.origin

    # -- spans ---------------------------------------------------------------------
    def span(self, kind: str, t0: float, t1: float, loop: LoopState | None, turn=None, tokens=0, lane=None):
        self.spans.append(Span(loop.step if loop else -1, kind, t0, t1, lane or f"rollout/{self.wid}/{loop.slot}",
                               loop.traj if loop else None, loop.group if loop else None, turn,
                               self.engine.version, tokens))

    def flush_spans(self) -> None:
        if self.spans:
            self.out_q.put(Spans(self.spans))
            self.spans = []

    def send(self, item: Trajectory | ScoredTurn) -> None:
        """A finished trajectory or scored turn, with the spans recorded since the last send:
        one pipe message instead of two (the learner's core reads every message)."""
        self.out_q.put(Finished(item, self.spans))
        self.spans = []

    # -- weights -------------------------------------------------------------------
    def load(self, want: int | None) -> tuple[float, float]:
        t0 = self.now()
        self.store.read_into(self.engine.load_weights, want=want)
        return t0, self.now()

    def maybe_follow_latest(self) -> None:
        """fully-async: pick up newly published weights between turns."""
        if self.follow_latest and self.store.version > self.engine.version:
            t0, t1 = self.load(None)
            self.span(Kind.PUBLISH, t0, t1, None, lane=f"replica/{self.wid}")

    def handle(self, cmd: Load | Work | Stop | Wake) -> bool:
        if isinstance(cmd, Stop):
            return False
        if isinstance(cmd, Load):
            t0, t1 = self.load(cmd.version)
            self.out_q.put(Ack(self.wid, self.engine.version, t0, t1))
        elif isinstance(cmd, Work):  # (Wake: a tool call returned; the loop steps next)
            step = cmd.step
            encoded: dict[str, list[int]] = {}  # a group's rows share their prompt: encode it once
            for traj, group, task, seed in cmd.items:
                prompt = self.chat.prompt_text(task)  # the policy's chat template, if it has one
                if prompt not in encoded:
                    encoded[prompt] = self.tok.encode(prompt, add_special_tokens=False)
                ids = list(encoded[prompt])
                # lowest free lane, so lanes stay few and dense on the Gantt
                slot = heapq.heappop(self.free_slots) if self.free_slots else len(self.loops)
                self.loops[traj] = LoopState(
                    traj, group, step, task, seed, slot, ids, [0] * len(ids), [0.0] * len(ids),
                    teacher=[None] * len(ids) if self.teacher is not None else None, ready_at=self.now(),
                )
        return True

    # -- the agent loop ------------------------------------------------------------
    def step_loops(self) -> None:
        now = self.now()
        ready = [lp for lp in self.loops.values() if lp.ready_at <= now]
        if not ready:
            return
        self.maybe_follow_latest()
        ro = self.cfg.rollout
        params = SamplingParams(ro.max_new_tokens, self.stop_ids, ro.temperature, ro.top_p)
        continuous = getattr(self.engine, "continuous_batching", False)
        call = EngineCall(self, ro.max_running_rows if continuous else None)
        first = call.take(call.first(ready))
        joining = {"admit": call.admit, "keys": [k for *_, k in first]} if continuous else {}
        self.engine.generate([p for p, *_ in first], params, seeds=[s for _, s, _ in first], on_done=call.turn_done,
                             **joining)
        self.flush_spans()

    def advance(self, lp: LoopState, out) -> None:
        start, end = lp.turn_spans[-1]
        text = self.tok.decode(lp.ids[start:end], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        stop_text = self.tok.convert_ids_to_tokens(lp.ids[end - 1]) if out.stopped else ""
        result = self.chat.parse_turn(lp.task, text, stop_text) if out.stopped else None
        out_of_room = len(lp.ids) + self.cfg.rollout.max_new_tokens + 16 > self.max_len
        if result is not None and result.kind == "tool" and len(lp.turn_spans) < lp.task.max_turns and not out_of_room:
            lp.ready_at = math.inf  # until the tool answers (learner/rollout/tool_calls.py)
            self.tools.start(lp.traj, result.payload)
            return
        t0 = self.now()
        reward, error = score_final(self.env, lp.task, result.payload) if result is not None and result.kind == "final" else (0.0, None)
        if result is not None and result.error:  # e.g. a malformed tool call: scored 0, counted, said why
            error = f"turn {len(lp.turn_spans) - 1}: {result.error}"
        t1 = self.now()
        self.span(Kind.VERIFY, t0, t1, lp, turn=len(lp.turn_spans) - 1)
        self.send(Trajectory(
            id=lp.traj, group=lp.group, step=lp.step, input_ids=lp.ids, loss_mask=lp.mask,
            behavior_logprobs=lp.blogp, reward=reward, turn_versions=lp.turn_versions,
            turn_spans=lp.turn_spans, teacher_logprobs=lp.teacher, t_reward=t1, error=error,
        ))
        del self.loops[lp.traj]
        heapq.heappush(self.free_slots, lp.slot)

    def run_loops(self, timeout_s: float) -> None:
        """Run the loops already handed out (``handle(Work(...))``) to their end in this
        thread, without a command queue: the learner's eval (learner.evaluation) and tests."""
        woken = threading.Event()
        self.tools = ToolCalls(self.env.run_tool, self.cfg.task.tool_timeout_s, self.now, wake=woken.set)
        deadline = self.now() + timeout_s
        try:
            while self.loops:
                if self.now() > deadline:
                    raise TimeoutError(f"{len(self.loops)} agent loops unfinished after {timeout_s:g}s")
                for traj, t0, t1, output in self.tools.finished():
                    observe(self, self.loops[traj], t0, t1, output)
                due = min(min(lp.ready_at for lp in self.loops.values()), self.tools.next_deadline())
                if due > self.now():  # every loop waits on a tool or its modelled latency
                    woken.wait(timeout=min(due - self.now(), deadline - self.now(), IDLE_POLL_S))
                    woken.clear()
                    continue
                self.step_loops()
        finally:
            self.tools.close()


class EngineCall:
    """The agent loops of one engine call: row i of the call is ``rows[i]``."""

    def __init__(self, worker: AgentWorker, cap: int | None = None):
        self.worker, self.cap = worker, cap  # cap: rollout.max_running_rows
        self.rows: list[LoopState] = []
        self.started: list[float] = []  # row i's admission: its turn's generate span starts there
        self.in_call: set[int] = set()

    def first(self, loops: list[LoopState]) -> list[LoopState]:
        """Under a cap, the loops in later turns first (nearest their reward), then by group, so
        trajectories and groups finish through the rollout instead of all near its end."""
        if self.cap is None:
            return loops
        free = self.cap - len(self.in_call)
        return sorted(loops, key=lambda lp: (-len(lp.turn_spans), lp.group, lp.traj))[:max(free, 0)]

    def take(self, loops: list[LoopState]) -> list[tuple[list[int], int, int]]:
        """(prompt, seed, key) per loop: the key (its trajectory) finds its last turn's kept keys/values."""
        t = self.worker.now()
        for lp in loops:
            self.rows.append(lp)
            self.started.append(t)
            self.in_call.add(lp.traj)
        return [(lp.ids, lp.seed * 1000 + len(lp.turn_spans), lp.traj) for lp in loops]

    def turn_done(self, i: int, out) -> None:
        # called the moment row i stops, while the rest of the batch still decodes: a direct
        # answer is verified and shipped (and a tool call starts) without waiting for the
        # batch's longest row
        w, lp = self.worker, self.rows[i]
        turn = len(lp.turn_spans)
        self.in_call.discard(lp.traj)
        w.span(Kind.GENERATE, self.started[i], w.now(), lp, turn=turn, tokens=len(out.token_ids))
        start = len(lp.ids)
        lp.ids += out.token_ids
        lp.mask += [1] * len(out.token_ids)
        lp.blogp += out.logprobs
        lp.turn_spans.append((start, len(lp.ids)))
        lp.turn_versions.append(w.engine.version)
        if w.teacher is not None:
            score_turn(w, lp, turn)
        w.advance(lp, out)

    def admit(self, min_rows: int) -> list[tuple[list[int], int, int]]:
        """Between decode steps (continuous batching): loops whose tool answered or whose
        modelled latency ended meanwhile join the running call instead of waiting for it to
        end, once at least ``min_rows`` are ready (the engine's batching rule)."""
        w = self.worker
        for traj, t0, t1, output in w.tools.finished():
            observe(w, w.loops[traj], t0, t1, output)
        if w.follow_latest and w.store.version > w.engine.version:
            return []  # fully-async: let the call drain, so the next turns start on the newer weights
        now = w.now()
        joining = self.first([lp for lp in w.loops.values() if lp.ready_at <= now and lp.traj not in self.in_call])
        return self.take(joining) if joining and len(joining) >= min_rows else []


def score_turn(worker: AgentWorker, lp: LoopState, turn: int) -> None:
    """OPD: the teacher scores the turn now; the learner can run its backward while the
    turn's tool call is still running."""
    start, end = lp.turn_spans[turn]
    t0 = worker.now()
    with torch.no_grad():
        ids = torch.tensor([lp.ids[:end]], device=next(worker.teacher.parameters()).device)
        logits = worker.teacher(input_ids=ids).logits[0, start - 1:end - 1].float()  # (n, V)
        tlp = torch.log_softmax(logits, -1).gather(-1, ids[0, start:end, None]).squeeze(-1).tolist()
    lp.teacher[start:end] = tlp
    t1 = worker.now()
    worker.span(Kind.TEACHER, t0, t1, lp, turn=turn, tokens=end - start)
    worker.send(ScoredTurn(
        traj=lp.traj, group=lp.group, step=lp.step, turn=turn, input_ids=lp.ids[:end],
        turn_span=(start, end), teacher_logprobs=tlp, behavior_logprobs=lp.blogp[start:end],
        policy_version=worker.engine.version, t_scored=t1,
    ))


def observe(worker: AgentWorker, lp: LoopState, t0: float, t1: float, output: str) -> None:
    """The tool's answer joins the trajectory; the loop generates again after the
    task's modelled latency. Spans: ``rollout.tool`` is the tool's real time,
    ``rollout.tool_wait`` the modelled wait after it (TaskConfig.tool_latency)."""
    start, end = lp.turn_spans[-1]
    turn = len(lp.turn_spans) - 1
    worker.span(Kind.TOOL, t0, t1, lp, turn=turn)
    latency = worker.env.tool_latency_s(random.Random(lp.seed * 1000 + len(lp.turn_spans)))
    obs_ids = worker.chat.observation_ids(lp.ids[start:end], output)  # loss mask 0: template and tool text
    lp.ids += obs_ids
    lp.mask += [0] * len(obs_ids)
    lp.blogp += [0.0] * len(obs_ids)
    if lp.teacher is not None:
        lp.teacher += [None] * len(obs_ids)
    lp.ready_at = t1 + latency
    if latency > 0:
        worker.span(Kind.TOOL_WAIT, t1, lp.ready_at, lp, turn=turn)


def serve(worker: AgentWorker, cmd_q) -> None:
    """The worker process's main loop: take the driver's commands, step the agent loops."""
    worker.out_q.put(Ready(worker.wid))
    worker.tools = ToolCalls(worker.env.run_tool, worker.cfg.task.tool_timeout_s, worker.now,
                             wake=lambda: cmd_q.put(Wake()))
    try:
        _serve(worker, cmd_q)
    finally:
        worker.tools.close()


def _serve(worker: AgentWorker, cmd_q) -> None:
    while True:
        for traj, t0, t1, output in worker.tools.finished():
            observe(worker, worker.loops[traj], t0, t1, output)
        if worker.loops:
            due = min(min(lp.ready_at for lp in worker.loops.values()), worker.tools.next_deadline())
            wait = max(0.0, due - worker.now())
        elif worker.follow_latest:
            wait = IDLE_POLL_S  # fully-async: an idle replica still picks up each publish
        else:
            wait = None  # idle: block until the driver says something
        try:
            cmd = cmd_q.get(timeout=wait) if wait != 0.0 else cmd_q.get_nowait()
            if not worker.handle(cmd):
                return
            while True:  # drain everything already queued before generating
                if not worker.handle(cmd_q.get_nowait()):
                    return
        except queue.Empty:
            pass
        if not worker.loops:
            worker.maybe_follow_latest()
            worker.flush_spans()
        worker.step_loops()


def worker_main(wid: int, cfg_json: str, policy_dir: str, teacher_dir: str | None, store, cmd_q, out_q,
                origin: float, core: int | None) -> None:
    """A rollout worker process from its init command on (``learner.rollout.boot``)."""
    try:
        pin_to_core(core)
        from learner.rollout.engine_factory import make_engine
        from learner.rollout.models import load_model, load_tokenizer

        cfg = RunConfig.model_validate_json(cfg_json)
        tok = load_tokenizer(policy_dir)
        engine = make_engine(cfg, policy_dir, tok, wid)
        teacher = load_model(teacher_dir).to(cfg.model.device) if teacher_dir else None
        if cfg.model.device == "cuda":
            store.pin()  # this process's view of the shared weights: DMA copies into the GPU engine
        store.read_into(engine.load_weights, want=0)
        worker = AgentWorker(wid, cfg, engine, tok, teacher, store, out_q, origin,
                             stop_ids=turn_stop_ids(tok, policy_dir))
        # torch, transformers and the model are ~10^6 long-lived objects; a full collection
        # walks them all (0.1-0.4 s, in the middle of a generate call): freeze them out of it
        gc.freeze()
        serve(worker, cmd_q)
        # the driver reads nothing more once it said stop: exit without flushing the outbox
        # (its feeder is a daemon thread; pushing into a full pipe would hang the exit)
        gc.unfreeze()  # let interpreter shutdown free them (extension modules report leaks otherwise)
        engine.close()
    except Exception as exc:  # the driver turns this into a failed run with this text
        out_q.put(Failed(wid, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
        out_q.flush(timeout_s=10.0)  # the process exits next: the driver must see why
