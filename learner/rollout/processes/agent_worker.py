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

Messages to the driver (``out_q``: the worker's own pipe, ``rollout/processes/outbox.py``) and commands
from it: ``rollout/processes/messages.py``.
Commands from the driver: ``Load``, ``Work``, ``Draft`` (speculation: a later batch's items to
draft under the weights the worker has, ``rollout/speculation/drafts.py``), ``Stop``.
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
from collections import deque

import torch

from learner.config import RunConfig
from learner.rollout.processes.cores import pin_process
from learner.rollout.speculation import drafts
from learner.rollout.engine.torch_engine import SamplingParams
from learner.tasks.chat import ChatFormat, turn_stop_ids
from learner.tasks.env import score_final
from learner.tasks.registry import make_env
from learner.rollout.processes.messages import Ack, Draft, Failed, Finished, Load, Ready, Spans, Stop, Wake, Work, WorkItem
from learner.models.loading import stop_token_ids
from learner.rollout.processes.tool_calls import ToolCalls
from learner.rollout.speculation.turns import LoopState, close_turn
from learner.timeline import Kind, Span
from learner.trajectory import Trajectory
from learner.registries.schedules import schedule_kind

IDLE_POLL_S = 0.05


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
        self.follow_latest = schedule_kind(cfg.train.schedule).follows_latest
        self.commands_waiting = lambda: False  # a driver command is queued (``Commands``: drafts yield then)
        # speculation (rollout/speculation/drafts.py): drafts wait from a Load to its step's Work; adopted ones are verified by chunk
        self.drafts_held, self.unverified, self.verifying = False, deque(), set()

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
            self.drafts_held = self.cfg.rollout.speculation.enabled
        elif isinstance(cmd, Draft):
            start_loops(self, cmd.step, cmd.items, draft=True)
        elif isinstance(cmd, Work):  # (Wake: a tool call returned; the loop steps next)
            self.drafts_held = False
            kept = drafts.adopt(self, cmd.step, [item.traj for item in cmd.items])
            start_loops(self, cmd.step, [item for item in cmd.items if item.traj not in kept])
        return True

    def release(self, lp: LoopState) -> None:  # the loop ended or its draft was dropped
        del self.loops[lp.traj]
        heapq.heappush(self.free_slots, lp.slot)
        forget_kv(self.engine, lp.traj)

    def next_due(self) -> float:
        """When the next loop may generate (drafts only within their budget) or a tool times out."""
        if self.unverified:  # adopted drafts to verify
            return self.now()
        runnable = [lp.ready_at for lp in self.loops.values() if not lp.draft] + drafts.runnable_due(self)
        return min(min(runnable, default=math.inf), self.tools.next_deadline())

    # -- the agent loop ------------------------------------------------------------
    def step_loops(self) -> None:
        """One engine call: the current steps' ready loops, or, when none is ready, one chunk of
        adopted drafts verified, or else drafts (which yield the engine again as soon as a current
        row or a driver command waits, or a current loop is due, ``rollout/speculation/drafts.py``)."""
        now = self.now()
        ready = [lp for lp in self.loops.values() if lp.ready_at <= now and not lp.draft]
        ro = self.cfg.rollout
        continuous = getattr(self.engine, "continuous_batching", False)
        call = EngineCall(self, ro.max_running_rows if continuous else None)
        if not ready and drafts.verify_next(self):  # adopted drafts before new drafts
            self.flush_spans()
            return
        rows = call.first(ready) if ready else drafts.pick(self, call.first)
        if not rows:
            return
        self.maybe_follow_latest()
        params = SamplingParams(ro.max_new_tokens, self.stop_ids, ro.temperature, ro.top_p)
        first = call.take(rows)
        joining = {"admit": call.admit, "keys": [k for *_, k in first], "cut": call.cut} if continuous else {}
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
            lp.ready_at = math.inf  # until the tool answers (learner/rollout/processes/tool_calls.py)
            self.tools.start(lp.traj, result.payload)
            return
        if lp.draft:  # verified (and rewarded) when its step's Work arrives
            lp.parked, lp.ready_at = out.stopped, math.inf
            return
        finish_loop(self, lp, result)

    def run_loops(self, timeout_s: float) -> None:
        """Run the loops already handed out (``handle(Work(...))``) to their end in this
        thread, without a command queue: the learner's eval (learner.evaluation) and tests."""
        woken = threading.Event()
        self.tools = ToolCalls(self.env.run_tool, self.cfg.task.tool_timeout_s, self.now, wake=woken.set)
        deadline = self.now() + timeout_s
        try:
            while self.next_due() < math.inf:  # (parked drafts wait for their step's Work)
                if self.now() > deadline:
                    raise TimeoutError(f"{len(self.loops)} agent loops unfinished after {timeout_s:g}s")
                for traj, t0, t1, output in self.tools.finished():
                    observe(self, self.loops[traj], t0, t1, output)
                due = self.next_due()
                if due > self.now():  # every loop waits on a tool or its modelled latency
                    woken.wait(timeout=min(due - self.now(), deadline - self.now(), IDLE_POLL_S))
                    woken.clear()
                    continue
                self.step_loops()
        finally:
            self.tools.close()


def finish_loop(worker: AgentWorker, lp: LoopState, result) -> None:
    """A current loop's last turn: score it, send the trajectory, give its slot back."""
    t0 = worker.now()
    reward, error = score_final(worker.env, lp.task, result.payload) if result is not None and result.kind == "final" else (0.0, None)
    if result is not None and result.error:  # e.g. a malformed tool call: scored 0, counted, said why
        error = f"turn {len(lp.turn_spans) - 1}: {result.error}"
    t1 = worker.now()
    worker.span(Kind.VERIFY, t0, t1, lp, turn=len(lp.turn_spans) - 1)
    unused = forget_kv(worker.engine, lp.traj)
    if unused is not None and unused.block.verified:  # a remainder that ended with its corrected token
        lp.verified_kv_tokens = 0  # ... never used the keys/values verification kept for it
    worker.send(Trajectory(
        id=lp.traj, group=lp.group, step=lp.step, input_ids=lp.ids, loss_mask=lp.mask,
        behavior_logprobs=lp.blogp, reward=reward, turn_versions=lp.turn_versions,
        turn_spans=lp.turn_spans, teacher_logprobs=lp.teacher, t_reward=t1, error=error,
        drafted_versions=lp.drafted_versions, drafted_tokens=lp.drafted_tokens, kept_tokens=lp.kept_tokens,
        verified_kv_tokens=lp.verified_kv_tokens,
    ))
    worker.release(lp)


def forget_kv(engine, traj: int):
    """A loop that ended (or a draft dropped) never asks for its kept keys/values again: they go
    now, not when ``PrefixStore.MAX_ENTRIES`` newer ones pushed them out. Returns the entry dropped."""
    if getattr(engine, "prefixes", None) is not None:
        return engine.prefixes.drop(traj)
    return None


def start_loops(worker: AgentWorker, step: int, items: list[WorkItem], draft: bool = False) -> None:
    """New agent loops (or drafts) for ``items`` of dispatch batch ``step``, ready now."""
    encoded: dict[str, list[int]] = {}  # a group's rows share their prompt: encode it once
    for traj, group, task, seed in items:
        prompt = worker.chat.prompt_text(task)  # the policy's chat template, if it has one
        if prompt not in encoded:
            encoded[prompt] = worker.tok.encode(prompt, add_special_tokens=False)
        ids = list(encoded[prompt])
        # lowest free lane, so lanes stay few and dense on the Gantt
        slot = heapq.heappop(worker.free_slots) if worker.free_slots else len(worker.loops)
        worker.loops[traj] = LoopState(
            traj, group, step, task, seed, slot, ids, [0] * len(ids), [0.0] * len(ids),
            teacher=[None] * len(ids) if worker.teacher is not None else None, ready_at=worker.now(), draft=draft,
        )


class EngineCall:
    """The agent loops of one engine call: row i of the call is ``rows[i]``."""

    def __init__(self, worker: AgentWorker, cap: int | None = None):
        self.worker, self.cap = worker, cap  # cap: rollout.max_running_rows
        self.rows: list[LoopState] = []
        self.started: list[float] = []  # row i's admission: its turn's generate span starts there
        self.in_call: set[int] = set()
        self.has_drafts = self.yield_drafts = False  # draft rows in the call; they must give way

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
            self.has_drafts |= lp.draft
            lp.begun |= lp.draft
            self.yield_drafts |= not lp.draft and self.has_drafts
            self.rows.append(lp)
            self.started.append(t)
            self.in_call.add(lp.traj)
        return [(lp.ids, lp.stream(), lp.traj) for lp in loops]

    def turn_done(self, i: int, out) -> None:
        # called the moment row i stops, while the rest of the batch still decodes: a direct
        # answer is verified and shipped (and a tool call starts) without waiting for the
        # batch's longest row
        w, lp = self.worker, self.rows[i]
        turn = len(lp.turn_spans)
        self.in_call.discard(lp.traj)
        w.span(Kind.DRAFT if lp.draft else Kind.GENERATE, self.started[i], w.now(), lp, turn=turn,
               tokens=len(out.token_ids))
        lp.ids += out.token_ids
        lp.mask += [1] * len(out.token_ids)
        lp.blogp += out.logprobs
        lp.open_turn += len(out.token_ids)
        if lp.draft:
            lp.open_drafted = w.engine.version
        if not out.stopped and lp.open_turn < w.cfg.rollout.max_new_tokens:
            return  # a draft cut to yield the engine: its turn goes on later, at this stream position
        close_turn(w, lp, out.stopped)

    def cut(self) -> list[int]:
        """Between decode steps: the draft rows to end now (partial turns, continued later from
        their stream's position), once a current row joined, a driver command waits or the next
        decode step would not end before a current loop is due (``drafts.step_fits``)."""
        w = self.worker
        if not self.has_drafts or not (self.yield_drafts or w.commands_waiting()
                                       or not drafts.step_fits(w, len(self.in_call))):
            return []
        self.has_drafts = self.yield_drafts = False
        return [i for i, lp in enumerate(self.rows) if lp.draft and lp.traj in self.in_call]

    def admit(self, min_rows: int) -> list[tuple[list[int], int, int]]:
        """Between decode steps (continuous batching): loops whose tool answered or whose
        modelled latency ended meanwhile join the running call instead of waiting for it to
        end, once at least ``min_rows`` are ready (the engine's batching rule)."""
        w = self.worker
        drafts.verify_next(w)  # one chunk of adopted drafts per decode step: its remainders join now
        for traj, t0, t1, output in w.tools.finished():
            observe(w, w.loops[traj], t0, t1, output)
        if w.follow_latest and w.store.version > w.engine.version:
            return []  # fully-async: let the call drain, so the next turns start on the newer weights
        now = w.now()
        joining = self.first([lp for lp in w.loops.values()
                              if lp.ready_at <= now and lp.traj not in self.in_call and not lp.draft])
        if all(lp.draft for lp in self.rows if lp.traj in self.in_call):  # a call of drafts only
            if joining and self.has_drafts:  # ... ends now (every draft cut): the current rows start their own
                self.yield_drafts = True
                return []
            joining = joining or drafts.pick(w, self.first, running=self.in_call)
        return self.take(joining) if joining and len(joining) >= min_rows else []


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


class Commands:
    """The worker's command queue with a look-ahead: a draft running in the engine yields it as
    soon as a driver command waits (``EngineCall.cut``), which is then taken from the backlog."""

    def __init__(self, cmd_q):
        self.q, self.backlog = cmd_q, deque()

    def waiting(self) -> bool:
        while True:
            try:
                cmd = self.q.get_nowait()
            except queue.Empty:
                return bool(self.backlog)
            if not isinstance(cmd, Wake):  # (a tool returned: the loops look at their tools anyway)
                self.backlog.append(cmd)

    def get(self, timeout: float | None):
        if self.backlog:
            return self.backlog.popleft()
        return self.q.get(timeout=timeout) if timeout != 0.0 else self.q.get_nowait()


def serve(worker: AgentWorker, cmd_q) -> None:
    """The worker process's main loop: take the driver's commands, step the agent loops."""
    worker.out_q.put(Ready(worker.wid))
    worker.tools = ToolCalls(worker.env.run_tool, worker.cfg.task.tool_timeout_s, worker.now,
                             wake=lambda: cmd_q.put(Wake()))
    commands = Commands(cmd_q)
    worker.commands_waiting = commands.waiting
    try:
        _serve(worker, commands)
    finally:
        worker.tools.close()


def _serve(worker: AgentWorker, cmd_q: Commands) -> None:
    while True:
        for traj, t0, t1, output in worker.tools.finished():
            observe(worker, worker.loops[traj], t0, t1, output)
        if worker.loops:
            due = worker.next_due()  # inf: only parked drafts, or drafts over their budget
            wait = None if due == math.inf else max(0.0, due - worker.now())
        elif worker.follow_latest:
            wait = IDLE_POLL_S  # fully-async: an idle replica still picks up each publish
        else:
            wait = None  # idle: block until the driver says something
        try:
            if not worker.handle(cmd_q.get(wait)):
                return
            while True:  # drain everything already queued before generating
                if not worker.handle(cmd_q.get(0.0)):
                    return
        except queue.Empty:
            pass
        if not worker.loops:
            worker.maybe_follow_latest()
            worker.flush_spans()
        worker.step_loops()


def worker_main(wid: int, cfg_json: str, policy_dir: str, teacher_dir: str | None, store, cmd_q, out_q,
                origin: float, core: int | None) -> None:
    """A rollout worker process from its init command on (``learner.rollout.processes.boot``)."""
    try:
        pin_to_core(core)
        from learner.rollout.engine.factory import make_engine
        from learner.placement import bind_device, rollout_device, teacher_device
        from learner.models.loading import load_model, load_tokenizer

        cfg = RunConfig.model_validate_json(cfg_json)
        bind_device(rollout_device(cfg, wid))  # the engine's GPU is current (streams, CUDA graphs)
        tok = load_tokenizer(policy_dir)
        engine = make_engine(cfg, policy_dir, tok, wid)
        teacher = load_model(teacher_dir).to(teacher_device(cfg, wid)) if teacher_dir else None
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
