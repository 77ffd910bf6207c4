"""Chrome Trace Event JSON of a run's spans (opens in Perfetto and chrome://tracing), streamed.

Layout: pid 1 is the learner, pid 2 the rollout fleet (and any other lane); one thread per
lane. Lanes get ``M`` metadata events ``process_sort_index``/``thread_sort_index`` in the
order the run page draws them (learner, then the rest such as replica/<w>, then
rollout/<worker>/<slot> numerically: ``lane_sort_key``, the same rule as static/js/spans.js ``orderLanes``), so every viewer
shows the lanes in one stable order whatever order the spans come in.

Flow events (``ph`` "s", "t", "f" with a shared ``id``, bound to the enclosing slice) link a
trajectory's rollout spans, in order, to the ``learner.backward`` that trains on them: an
arrow from each turn to the next and into the backward. A trajectory whose turns are trained
one by one gets one chain per backward. A chain is written one point behind, so its last
point can be written as the "f" that closes it; at most ``MAX_OPEN_CHAINS`` chains are held
(trajectories dropped unfinished would otherwise accumulate), so memory stays flat.

``stream_trace`` yields the JSON text in chunks from any iterable of span dicts (the
controller feeds it from a server-side cursor); ``chrome_trace`` builds the same document in
memory for small span lists.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Iterable, Iterator

from learner.timeline import Kind

LEARNER_PID, FLEET_PID = 1, 2
ARG_FIELDS = ("seq", "step", "traj", "group", "turn", "policy_version", "tokens")
MAX_OPEN_CHAINS = 10_000
FLOW_CAT = "trajectory"
# a trajectory's chain: its rollout worker's spans (not the teacher's scoring), into its backward
CHAIN_KINDS = (Kind.GENERATE, Kind.TOOL, Kind.TOOL_WAIT, Kind.VERIFY)


def lane_sort_key(lane: str) -> tuple:
    """learner/* first, then the other lanes (replica/*, ...), rollout/* last: the lanes of which
    a run has few stay on top at any rollout lane count; numeric parts compare as numbers."""
    parts = lane.split("/")
    group = {"learner": 0, "rollout": 2}.get(parts[0], 1)
    rest = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts[1:])
    return (group, rest if group != 1 else ((1, 0, parts[0]), *rest))


def lane_threads(lanes: Iterable[str]) -> dict[str, tuple[int, int]]:
    """lane -> (pid, tid); tids count from 1 per pid in lane order (also the sort index)."""
    threads: dict[str, tuple[int, int]] = {}
    counts = {LEARNER_PID: 0, FLEET_PID: 0}
    for lane in sorted(set(lanes), key=lane_sort_key):
        pid = LEARNER_PID if lane.startswith("learner") else FLEET_PID
        counts[pid] += 1
        threads[lane] = (pid, counts[pid])
    return threads


def metadata_events(threads: dict[str, tuple[int, int]], run_name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for pid, what in ((LEARNER_PID, "learner"), (FLEET_PID, "rollout fleet")):
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": f"{run_name}: {what}"}})
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}})
    for lane, (pid, tid) in threads.items():
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": lane}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    return events


def us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


class SliceText:
    """The "X" event of a span as JSON text, formatted directly: the export writes millions
    of them, and this is about twice as fast as building a dict for json to encode. Names
    and categories go through json once per distinct kind."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}

    def __call__(self, span: dict[str, Any], pid: int, tid: int) -> str:
        kind = span["kind"]
        named = self.kinds.get(kind)
        if named is None:
            named = self.kinds[kind] = f'"name":{json.dumps(kind)},"cat":{json.dumps(kind.split(".")[0])}'
        args = ",".join(f'"{k}":{_number(span.get(k))}' for k in ARG_FIELDS)
        return (f'{{"ph":"X","pid":{pid},"tid":{tid},{named},"ts":{us(span["t0"])!r},'
                f'"dur":{us(max(span["t1"] - span["t0"], 0.0))!r},"args":{{{args}}}}}')


def _number(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return json.dumps(value)
    return repr(value)


class FlowChains:
    """Flow events (as JSON text) linking each trajectory's rollout spans to its learner.backward."""

    def __init__(self) -> None:
        # traj -> [flow id, points written so far, pending point (written when the next arrives)]
        self.open: OrderedDict[int, list] = OrderedDict()
        self.next_id = 1

    @staticmethod
    def point(ph: str, flow_id: int, traj: int, ts: float, pid: int, tid: int) -> str:
        """One flow event as JSON text (``traj`` is an integer: nothing to escape)."""
        return (f'{{"ph":"{ph}","id":{flow_id},"cat":"{FLOW_CAT}","name":"trajectory {traj}","ts":{ts!r},'
                f'"pid":{pid},"tid":{tid},"bp":"e"}}')

    def events(self, span: dict[str, Any], pid: int, tid: int) -> list[str]:
        traj, kind = span.get("traj"), span["kind"]
        if traj is None or not (kind in CHAIN_KINDS or kind == Kind.BACKWARD):
            return []
        out: list[str] = []
        here = (us(span["t0"]), pid, tid)
        chain = self.open.get(traj)
        if chain is None:
            if kind == Kind.BACKWARD:
                return []  # nothing of this trajectory was rolled out since its last backward
            if len(self.open) >= MAX_OPEN_CHAINS:
                out += self.close(next(iter(self.open)))
            self.open[traj] = [self.next_id, 0, here]
            self.next_id += 1
            return out
        flow_id, written, pending = chain
        out.append(self.point("s" if written == 0 else "t", flow_id, traj, *pending))
        if kind == Kind.BACKWARD:
            out.append(self.point("f", flow_id, traj, *here))
            del self.open[traj]
        else:
            chain[1], chain[2] = written + 1, here
        return out

    def close(self, traj: int) -> list[str]:
        """End a chain at its pending point (a lone point is no flow)."""
        flow_id, written, pending = self.open.pop(traj)
        return [self.point("f", flow_id, traj, *pending)] if written else []

    def close_all(self) -> list[str]:
        return [e for traj in list(self.open) for e in self.close(traj)]


def trace_text(spans: Iterable[dict[str, Any]], threads: dict[str, tuple[int, int]],
               run_name: str) -> Iterator[str]:
    """Every event of the trace as JSON text; ``threads`` must hold every lane of ``spans``."""
    encode = json.JSONEncoder(separators=(",", ":")).encode
    for event in metadata_events(threads, run_name):
        yield encode(event)
    flows, slice_text = FlowChains(), SliceText()
    for span in spans:
        pid, tid = threads[span["lane"]]
        yield slice_text(span, pid, tid)
        yield from flows.events(span, pid, tid)
    yield from flows.close_all()


def stream_trace(spans: Iterable[dict[str, Any]], lanes: Iterable[str], run_name: str,
                 events_per_chunk: int = 2000) -> Iterator[str]:
    """The trace document as text chunks of about ``events_per_chunk`` events each."""
    yield '{"displayTimeUnit":"ms","traceEvents":['
    batch: list[str] = []
    first = True
    for event in trace_text(spans, lane_threads(lanes), run_name):
        batch.append(event)
        if len(batch) >= events_per_chunk:
            yield ("" if first else ",") + ",".join(batch)
            first, batch = False, []
    if batch:
        yield ("" if first else ",") + ",".join(batch)
    yield "]}"


def chrome_trace(spans: Iterable[Any], run_name: str = "run") -> dict[str, Any]:
    """The whole trace as one dict (tests, small exports); spans are dicts or ``Span``s."""
    rows = [s if isinstance(s, dict) else vars(s) for s in spans]
    return json.loads("".join(stream_trace(rows, (s["lane"] for s in rows), run_name)))
