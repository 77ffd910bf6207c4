"""Keyed sampling inside vLLM: a V1 logits processor that makes vLLM draw every token with the
rule of ``rollout/engine/sampling.py`` (``keyed_sample``: the Gumbel-max keyed by (turn seed, position
in the turn's stream, token), temperature, top-p), so a token vLLM sampled can be recomputed from
logits alone (verification, docs/speculation.md).

How: a keyed request goes to vLLM greedy (temperature 0) with its key in
``SamplingParams.extra_args``. vLLM applies logits processors that are not argmax-invariant before
its greedy argmax (``vllm/v1/sample/sampler.py``: ``apply_logits_processors`` then ``sample``;
the CPU runner, ``CPUModelRunner``, subclasses ``GPUModelRunner`` and builds the same
processors), so this one replaces each keyed row by a one-hot of ``keyed_sample``'s token on that
row's logits: the argmax is then exactly the keyed sample, in float64 as the torch engine draws
it, not a float32 rounding of the perturbed scores. Behaviour log-probs are untouched: vLLM's
``raw_logprobs`` are computed from the logits before any processor (log softmax(z), the torch
engine's convention, rollout/engine/torch_engine.py).

The position of a row's next token in its stream is the key's ``start`` plus the tokens the
request has produced so far (vLLM hands the processor a live reference to that list).
"""

from __future__ import annotations

import torch
from vllm import SamplingParams as VllmSamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from learner.rollout.engine.sampling import Stream, keyed_sample, row_keys

EXTRA_KEY = "thundersync_keyed"  # extra_args entry: [seed, start, temperature, top_p]


def keyed_args(stream: Stream, temperature: float, top_p: float) -> dict:
    """The ``extra_args`` of a keyed request (vLLM's own temperature must be 0: greedy)."""
    return {EXTRA_KEY: [int(stream.seed), int(stream.start), float(temperature), float(top_p)]}


class _Row:
    __slots__ = ("stream", "temperature", "top_p", "out")

    def __init__(self, stream: Stream, temperature: float, top_p: float, out: list[int]):
        self.stream, self.temperature, self.top_p, self.out = stream, temperature, top_p, out


class KeyedGumbelProcessor(LogitsProcessor):
    """vLLM V1 logits processor: the keyed Gumbel-max of ``rollout/engine/sampling.py`` per keyed row."""

    @classmethod
    def validate_params(cls, sampling_params: VllmSamplingParams):
        key = (sampling_params.extra_args or {}).get(EXTRA_KEY)
        if key is None:
            return
        if len(key) != 4 or sampling_params.temperature != 0.0:
            raise ValueError(f"extra_args.{EXTRA_KEY}: needs [seed, start, temperature, top_p] and vLLM "
                             "temperature 0 (the processor picks the token, greedy argmax takes it)")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.rows: dict[int, _Row] = {}  # persistent-batch index -> its key

    def is_argmax_invariant(self) -> bool:
        return False  # it chooses the token: it must run before greedy sampling

    @staticmethod
    def _new_row(params: VllmSamplingParams, prompt: list[int] | None, out: list[int]) -> _Row | None:
        key = (params.extra_args or {}).get(EXTRA_KEY)
        if key is None:
            return None
        seed, start, temperature, top_p = key
        return _Row(Stream(int(seed), int(start)), float(temperature), float(top_p), out)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        groups: dict[tuple[float, float], list[int]] = {}
        for index, row in self.rows.items():
            if index < logits.shape[0]:
                groups.setdefault((row.temperature, row.top_p), []).append(index)
        for (temperature, top_p), index in groups.items():
            rows = [self.rows[i] for i in index]
            keys = row_keys([r.stream for r in rows], [len(r.out) for r in rows], logits.device)
            at = torch.tensor(index, device=logits.device)
            token = keyed_sample(logits[at], temperature, top_p, keys)
            onehot = torch.full((len(index), logits.shape[1]), float("-inf"), dtype=logits.dtype, device=logits.device)
            onehot.scatter_(1, token[:, None], 0.0)
            logits[at] = onehot
        return logits
