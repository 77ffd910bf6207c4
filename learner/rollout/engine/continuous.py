"""Continuous batching for the torch engine (``rollout.continuous_batching``, docs/architecture.md).

One generate call whose batch changes while it runs: a row that ends leaves it, and rows that
the caller's ``admit`` hook hands in between decode steps are prefilled and joined to it
(``rollout/engine/kv_rows.py``), so an agent loop whose tool answered mid-call starts its next turn
within a few decode steps instead of when the call's longest row ends. ``engine`` is the
``TorchEngine`` (its model, device, pad id, shared-prompt prefill and stats).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from transformers.cache_utils import DynamicCache

from learner.rollout.engine import kv_rows
from learner.rollout.engine.prefix_store import past_cache
from learner.rollout.engine.sampling import Admit, Completion, OnDone, SamplingParams, Stream, keyed_sample, row_keys, stream_of

ADMIT_WAIT_STEPS = 4  # a ready row joins at most this many decode steps after the last join
ADMIT_SHARE = 8  # ... or sooner, once the ready rows are 1/ADMIT_SHARE of the running batch


def generate_continuous(engine, prompts: list[list[int]], params: SamplingParams, seeds: list[int | Stream] | None,
                        on_done: OnDone | None, admit: Admit | None, keys: list | None = None,
                        cut: Callable[[], list[int]] | None = None) -> list[Completion]:
    """Each row is sampled exactly as in a fixed batch (keyed by its stream and position, its own
    positions and mask), so its tokens and behavior log-probs do not depend
    on which rows share the batch or when it joined (up to float round-off).

    What joining and leaving cost decides when they happen. Both copy the batch's whole KV
    cache (measured on the built-in policy, 256 rows x 100 columns: a copy 6 ms, a decode
    step 11 ms), and a join also runs a prefill forward (~2.5 ms for one row). So a row that
    ended stays in the batch as masked padding until a quarter of the batch has ended (or
    rows join: the join copies anyway), and ready rows join once they are an eighth of the
    running batch or ``ADMIT_WAIT_STEPS`` decode steps after the last join: a loop whose
    tool answered waits a few decode steps, not the rest of the call.

    ``cut()``, between decode steps: rows to end now (stopped False, a partial completion the
    caller continues later from its stream's position: a draft giving way, rollout/speculation/drafts.py)."""
    seeds = seeds if seeds is not None else [params.seed + b for b in range(len(prompts))]
    rows, run, store = _Rows(), _Running(), engine.prefixes

    def join(new_prompts: list[list[int]], new_seeds: list[int], new_keys: list) -> None:
        first = rows.add(new_prompts, new_seeds, new_keys)
        reuse = [None if store is None or k is None else store.take(k, p) for p, k in zip(new_prompts, new_keys)]
        _join(engine, run, new_prompts, list(range(first, first + len(new_prompts))), reuse)

    if prompts:
        join(prompts, seeds, keys if keys is not None else [None] * len(prompts))
    since_join = 0
    while run.alive:
        step_tok = _sample_step(engine, run, rows, params, on_done)
        new = []
        if admit is not None:  # loops that became ready meanwhile start their turn now
            since_join += 1
            new = admit(1 if since_join >= ADMIT_WAIT_STEPS or not run.alive else max(1, run.alive // ADMIT_SHARE))
        if cut is not None:
            _cut(engine, run, set(cut()), rows, on_done)
        ended = len(run.rows) - run.alive
        if ended and (new or not run.alive or ended * 4 >= len(run.rows)):
            keep = [j for j, i in enumerate(run.rows) if i >= 0]
            step_tok = [step_tok[j] for j in keep]
            _retire(run, keep)
        if run.alive:
            _decode_step(engine, run, step_tok)
        if new:
            join([r[0] for r in new], [r[1] for r in new], [r[2] if len(r) > 2 else None for r in new])
            since_join = 0
            engine.stats.extra["rows_admitted"] = engine.stats.extra.get("rows_admitted", 0) + len(new)
    engine.stats.calls += 1
    engine.stats.tokens_out += sum(len(t) for t in rows.tokens)
    return rows.results  # type: ignore[return-value]  (every row ended: none is None)


@dataclass
class _Rows:
    """Every row of one continuous-batching call, by the call's row index (rows that joined
    later come after the first prompts)."""

    tokens: list[list[int]] = field(default_factory=list)
    logps: list[list[float]] = field(default_factory=list)
    fed: list[list[int]] = field(default_factory=list)  # each row's prompt (its context so far)
    prefix_keys: list = field(default_factory=list)  # each row's key in engine.prefixes (None: not kept)
    streams: list[Stream] = field(default_factory=list)
    results: list[Completion | None] = field(default_factory=list)

    def add(self, prompts: list[list[int]], seeds: list[int], keys: list) -> int:
        """New rows; returns the index of the first."""
        first = len(self.tokens)
        for p, s, k in zip(prompts, seeds, keys, strict=True):
            self.tokens.append([])
            self.logps.append([])
            self.streams.append(stream_of(s))
            self.results.append(None)
            self.fed.append(p)
            self.prefix_keys.append(k)
        return first

    def end(self, i: int, stopped: bool, on_done: OnDone | None) -> None:
        self.results[i] = Completion(self.tokens[i], self.logps[i], stopped)
        if on_done is not None:  # final: the caller acts on it while the rest decodes
            on_done(i, self.results[i])


def _sample_step(engine, run: "_Running", rows: _Rows, params: SamplingParams, on_done: OnDone | None) -> list[int]:
    """One token for every live row; rows that stop or reach their length end (their keys and
    values kept where the prefix store wants them). Returns the next decode step's input
    tokens, the pad id for rows that ended."""
    store, stop_ids = engine.prefixes, set(params.stop_token_ids)
    live = [j for j, i in enumerate(run.rows) if i >= 0]
    logits = run.logits if len(live) == len(run.rows) else run.logits[live]
    # a row's draw depends on its key (stream, position) and its logits alone
    keys = row_keys([rows.streams[run.rows[j]] for j in live], [len(rows.tokens[run.rows[j]]) for j in live],
                    engine.device)
    tok = keyed_sample(logits, params.temperature, params.top_p, keys)  # (live,)
    logp = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)
    tok_row, logp_row = tok.tolist(), logp.tolist()  # one device read per token step
    step_tok = [engine.pad_id] * len(run.rows)
    ending: list[tuple[int, int, list[int]]] = []  # (row, batch row, context) of rows whose keys/values are kept
    ended: list[tuple[int, bool]] = []  # (row, stopped): told to on_done once their keys/values are kept
    for k, j in enumerate(live):
        i = run.rows[j]
        rows.tokens[i].append(tok_row[k])
        rows.logps[i].append(logp_row[k])
        hit = tok_row[k] in stop_ids
        if hit or rows.streams[i].start + len(rows.tokens[i]) >= params.max_new_tokens:
            if (store is not None and rows.prefix_keys[i] is not None
                    and len(rows.fed[i]) + len(rows.tokens[i]) - 1 >= store.min_tokens):
                # its next turn starts from these keys/values; taken before on_done, which may extend its prompt
                ending.append((i, j, rows.fed[i] + rows.tokens[i][:-1]))
            run.rows[j] = -1  # ended: masked padding from now on
            run.alive -= 1
            ended.append((i, hit))
        else:
            step_tok[j] = tok_row[k]
    if ending:  # copied before the batch changes: one copy per layer for all of them
        store.keep([rows.prefix_keys[i] for i, _, _ in ending], [c for *_, c in ending], run.cache,
                   [j for _, j, _ in ending], run.attn)
    for i, hit in ended:  # after the keep: a loop that ends here drops its entry (worker.forget_kv), none is left behind
        rows.end(i, hit, on_done)
    return step_tok


def _decode_step(engine, run: "_Running", step_tok: list[int]) -> None:
    """The batch's next forward: one token per row (ended rows masked), their logits; its time
    teaches the engine's cost model (``rollout/engine/step_cost.py``)."""
    t0 = time.perf_counter()
    tok_in = torch.tensor(step_tok, device=engine.device)[:, None]
    col = torch.tensor([[int(i >= 0)] for i in run.rows], device=engine.device)
    run.attn = torch.cat([run.attn, col], dim=1)
    out = engine.model(input_ids=tok_in, attention_mask=run.attn, position_ids=run.pos,
                       past_key_values=run.cache, use_cache=True)
    run.cache, run.logits = out.past_key_values, out.logits[:, -1].float()
    run.pos = run.pos + 1
    if getattr(engine, "step_cost", None) is not None:
        engine.step_cost.decode.add(len(run.rows), time.perf_counter() - t0)


def _cut(engine, run: "_Running", cut: set[int], rows: _Rows, on_done: OnDone | None) -> None:
    """End the rows in ``cut`` (partial completions). Their keys/values are kept as an ending row's
    are (``_sample_step``): the row resumes later with this context plus its partial turn as its
    prompt, and without them its whole context was prefilled again at every resume."""
    store, ending = engine.prefixes, []
    for j, i in enumerate(run.rows):
        if i >= 0 and i in cut:
            if (store is not None and rows.prefix_keys[i] is not None and rows.tokens[i]
                    and len(rows.fed[i]) + len(rows.tokens[i]) - 1 >= store.min_tokens):
                ending.append((i, j, rows.fed[i] + rows.tokens[i][:-1]))  # (the last token is not fed yet)
    if ending:  # copied before on_done extends a prompt and before the batch changes
        store.keep([rows.prefix_keys[i] for i, _, _ in ending], [c for *_, c in ending], run.cache,
                   [j for _, j, _ in ending], run.attn)
    for j, i in enumerate(run.rows):
        if i >= 0 and i in cut:
            run.rows[j] = -1
            run.alive -= 1
            rows.end(i, False, on_done)


def _join(engine, run: "_Running", prompts: list[list[int]], rows: list[int], reuse: list) -> None:
    """Prefill ``prompts`` (left-padded among themselves; after their kept prefix where ``reuse``
    has one, in a forward of their own) and join them to the running batch."""
    t0 = time.perf_counter()
    kept = [b for b, r in enumerate(reuse) if r is not None]
    if kept and len(kept) < len(prompts):
        # rows with a kept prefix forward only their new tokens, apart from the others: in one forward
        # every row would be as wide as the longest whole prompt (a draft's remainders join so, some
        # with verification's keys/values, some under the store's threshold: rollout/engine/kv_keep.py)
        whole = [b for b, r in enumerate(reuse) if r is None]
        cache, attn, next_pos, logits = _prefill_after(engine, [prompts[b] for b in kept], [reuse[b] for b in kept])
        cache_w, attn_w, pos_w, logits_w = _prefill_whole(engine, [prompts[b] for b in whole])
        kv_rows.check_joinable(cache_w)
        cache, attn = kv_rows.join(cache, attn, cache_w, attn_w)
        next_pos, logits = torch.cat([next_pos, pos_w]), torch.cat([logits, logits_w])
        prompts, rows = [prompts[b] for b in kept + whole], [rows[b] for b in kept + whole]
    elif kept:
        cache, attn, next_pos, logits = _prefill_after(engine, prompts, reuse)
    else:
        cache, attn, next_pos, logits = _prefill_whole(engine, prompts)
    kv_rows.check_joinable(cache)
    B = len(prompts)
    if getattr(engine, "step_cost", None) is not None:  # (the prefill's columns: what it forwarded, padding included)
        engine.step_cost.prefill.add(B * attn.shape[1], time.perf_counter() - t0)
    run.alive += B
    if not run.rows:
        run.cache, run.attn, run.pos, run.logits, run.rows = cache, attn, next_pos, logits, rows
        return
    run.cache, run.attn = kv_rows.join(run.cache, run.attn, cache, attn)
    run.pos = torch.cat([run.pos, next_pos])
    run.logits = torch.cat([run.logits, logits])
    run.rows = run.rows + rows


def _prefill_whole(engine, prompts: list[list[int]]):
    """Prefill ``prompts`` whole, left-padded among themselves (a group's shared prompt once)."""
    B, width, dev = len(prompts), max(len(p) for p in prompts), engine.device
    ids = torch.full((B, width), engine.pad_id, dtype=torch.long, device=dev)
    attn = torch.zeros((B, width), dtype=torch.long, device=dev)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p)
        attn[b, width - len(p):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache, logits = engine._prefill(prompts, ids, attn, pos)
    return cache, attn, pos[:, -1:] + 1, logits


def _prefill_after(engine, prompts: list[list[int]], reuse: list):
    """Forward only what follows each row's kept prefix (``rollout/engine/prefix_store.py``).

    The rows' kept keys/values form the first Wp columns (``past_cache``: each row right-aligned,
    its own padding masked), their new tokens right-aligned in the next Ws; what lies between is
    masked padding, and each token keeps its true position (prefix length + offset), so every row
    attends to exactly its own context, as in a prefill of the whole prompt. A row without a
    kept prefix is all new tokens."""
    dev, B = engine.device, len(prompts)
    kept = [0 if r is None else len(r.tokens) for r in reuse]
    new = [p[k:] for p, k in zip(prompts, kept)]
    Ws = max(len(x) for x in new)
    layers, past_mask = past_cache(reuse)
    cache = DynamicCache()
    for layer, (keys, values) in enumerate(layers):
        cache.update(keys, values, layer)
    ids = torch.full((B, Ws), engine.pad_id, dtype=torch.long, device=dev)
    new_mask = torch.zeros((B, Ws), dtype=torch.long, device=dev)
    pos = torch.zeros((B, Ws), dtype=torch.long, device=dev)
    for b, (x, k) in enumerate(zip(new, kept)):
        ids[b, Ws - len(x):] = torch.tensor(x)
        new_mask[b, Ws - len(x):] = 1
        pos[b, Ws - len(x):] = torch.arange(k, k + len(x))
    attn = torch.cat([past_mask.to(torch.long), new_mask], dim=1)
    out = engine.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True)
    engine.stats.extra["prefill_tokens_reused"] = engine.stats.extra.get("prefill_tokens_reused", 0) + sum(kept)
    return out.past_key_values, attn, pos[:, -1:] + 1, out.logits[:, -1].float()


def _retire(run: "_Running", keep: list[int]) -> None:
    """Rows that ended leave the batch: the next decode steps compute only the others."""
    run.rows = [run.rows[j] for j in keep]
    if not keep:
        run.cache = run.attn = run.pos = run.logits = None
        return
    idx = torch.tensor(keep, device=run.attn.device)
    run.attn = kv_rows.keep_rows(run.cache, run.attn, idx)
    run.pos, run.logits = run.pos[idx], run.logits[idx]


@dataclass
class _Running:
    """The rows decoding in a continuous-batching call, in batch order."""

    rows: list[int] = field(default_factory=list)  # the call's row index of each batch row (-1: ended)
    alive: int = 0  # rows still sampling
    cache: object = None  # their KV cache (B rows)
    attn: torch.Tensor | None = None  # (B, T) attention mask over the cache's columns
    pos: torch.Tensor | None = None  # (B, 1) position of each row's next token
    logits: torch.Tensor | None = None  # (B, V) next-token logits of each row
