"""The torch engine without a kernel launch per token: a static KV cache and a captured decode step.

The eager engine's decode step grows its cache and mask by a column per token and launches the
model's kernels one by one from Python: on a GPU that, not the arithmetic, bounds it (docs/gpu.md,
3.4-6.4k tokens/s at 220-550M parameters). ``CapturedEngine`` keeps the same fixed-batch token loop
(``TorchEngine.generate`` with ``continuous_batching`` off: the keyed sampler, the stop rules) and
swaps the decode step for ``StaticDecode``:
- the prefill (shared per prompt, as the eager engine's) is copied into a static cache
  (``StaticKV``) of width + max_new_tokens columns, and the attention mask is a fixed (B, 1, 1, columns) additive
  mask whose next column is opened before each step: every decode step reads and writes tensors
  at fixed addresses, with fixed shapes;
- on CUDA that step is captured once per generate call (``torch.cuda.CUDAGraph``; its capture is
  part of the call's time) and replayed:
  one launch per token instead of one per kernel. On CPU the same static step runs eagerly, so
  its tokens can be compared with the eager engine's where CI runs (tests/learner/test_captured_engine.py).

Same tokens as the eager engine: a row's logits differ from the eager step's only by the
round-off of attending over masked zero columns, and the keyed sampler draws from the logits and
the row's key alone (rollout/engine/sampling.py); the GPU check compares the two engines' tokens on the
same seeds (bench/gpu_check.py).
"""

from __future__ import annotations

from typing import Callable

import torch

from learner.rollout.engine.torch_engine import TorchEngine

WARMUP_STEPS = 2  # eager runs on a side stream before a capture (lazy inits, allocator, cuBLAS handles)


def _layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) of a transformers ``DynamicCache`` (its layout since 4.54, and the older one)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


class StaticKV:
    """The keys/values of every layer at fixed addresses: (B, heads, columns, dim) each, written at
    the column in ``at`` (a device tensor the caller sets before a step, so a captured graph reads
    it). Duck-types the one cache method a transformers model's forward calls with a 4D mask and
    explicit positions (``update``), whichever transformers version: its own ``StaticCache``
    changed how it tracks the write position between versions."""

    def __init__(self, prefill_kv: list[tuple[torch.Tensor, torch.Tensor]], columns: int):
        self.keys, self.values = [], []
        for k, v in prefill_kv:  # the prompts' keys/values into columns [0, width)
            width = k.shape[2]
            self.keys.append(k.new_zeros(k.shape[:2] + (columns, k.shape[3])))
            self.values.append(v.new_zeros(v.shape[:2] + (columns, v.shape[3])))
            self.keys[-1][:, :, :width] = k
            self.values[-1][:, :, :width] = v
        self.at = torch.zeros(1, dtype=torch.long, device=self.keys[0].device)
        self.seen = width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.keys[layer_idx].index_copy_(2, self.at, key_states)
        self.values[layer_idx].index_copy_(2, self.at, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen  # only read where positions are not given; a Python int: no device read

    is_compileable = True


class StaticDecode:
    """The decode step over a static cache (``capture``: replayed as one CUDA graph)."""

    def __init__(self, model: torch.nn.Module, cache, attn: torch.Tensor, steps: int, capture: bool,
                 on_error: Callable[[str], None] = lambda error: None):
        self.model = model
        batch, width = attn.shape
        self.width, self.n = width, 0
        dtype = next(model.parameters()).dtype
        self.static = StaticKV(_layer_kv(cache), width + steps)
        self.mask = torch.full((batch, 1, 1, width + steps), torch.finfo(dtype).min, dtype=dtype, device=attn.device)
        self.mask[:, 0, 0, :width].masked_fill_(attn.bool(), 0.0)
        self.tok = torch.zeros((batch, 1), dtype=torch.long, device=attn.device)
        self.pos = torch.zeros((batch, 1), dtype=torch.long, device=attn.device)
        self.capture, self.on_error = capture, on_error
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def _forward(self) -> torch.Tensor:
        out = self.model(input_ids=self.tok, attention_mask=self.mask, position_ids=self.pos,
                         past_key_values=self.static, use_cache=True)
        return out.logits[:, -1].float()

    def step(self, tok: torch.Tensor, done: torch.Tensor, next_pos: torch.Tensor) -> torch.Tensor:
        # a done row's column stays open: its later tokens are padding nobody reads (its own row only)
        column = self.width + self.n
        self.mask[:, 0, 0, column] = 0.0
        self.static.at.fill_(column)
        self.static.seen = column
        self.tok.copy_(tok[:, None])
        self.pos.copy_(next_pos)
        self.n += 1
        if not self.capture:
            return self._forward()
        if self.graph is None:
            try:
                self._capture()
            except RuntimeError as exc:  # a model or torch build whose step cannot be captured
                self.capture = False
                self.on_error(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
                return self._forward()
        self.graph.replay()
        return self.logits

    def _capture(self) -> None:
        """Warm up on a side stream, then capture one step. The warm-up steps write this step's
        column, which every replay writes again from the inputs set before it."""
        with torch.cuda.device(self.tok.device):  # streams and the graph on the model's GPU, whichever is current
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self._forward()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: a worker's other threads (tools, the outbox feeder) may touch CUDA meanwhile
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.logits = self._forward()


class CapturedEngine(TorchEngine):
    """``TorchEngine`` with a fixed batch per call and ``StaticDecode`` steps (``rollout.captured_decode``).

    ``capture``: replay the step as a CUDA graph (default: when the model is on CUDA)."""

    def __init__(self, model: torch.nn.Module, pad_id: int, share_prefill: bool = True, capture: bool | None = None):
        super().__init__(model, pad_id, share_prefill=share_prefill, continuous_batching=False)
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError(f"capture: CUDA graphs need a CUDA model, this one is on {self.device}")
        self.capture_error: str | None = None

    def _decoder(self, cache, attn: torch.Tensor, steps: int) -> StaticDecode:
        return StaticDecode(self.model, cache, attn, steps, self.capture and self.capture_error is None,
                            self._capture_failed)

    def _capture_failed(self, error: str) -> None:
        """A step that cannot be captured runs the static step eagerly from then on (the same tokens,
        launch-bound again); said in the stats, and by ``capture_error``, not silently."""
        self.capture_error = self.stats.extra["capture_error"] = error
