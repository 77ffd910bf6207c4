"""The torch engine without a kernel launch per token: a static KV cache and a captured decode step.

The eager engine's decode step grows its cache and mask by a column per token and launches the
model's kernels one by one from Python: on a GPU that, not the arithmetic, bounds it (docs/gpu.md,
3.4-6.4k tokens/s at 220-550M parameters). ``CapturedEngine`` keeps the same fixed-batch token loop
(``TorchEngine.generate`` with ``continuous_batching`` off: the keyed sampler, the stop rules) and
swaps the decode step for ``StaticDecode``:
- the prefill (shared per prompt, as the eager engine's) is copied into a ``StaticCache`` of
  width + max_new_tokens columns, and the attention mask is a fixed (B, 1, 1, columns) additive
  mask whose next column is opened before each step: every decode step reads and writes tensors
  at fixed addresses, with fixed shapes;
- on CUDA that step is captured once per generate call (``torch.cuda.CUDAGraph``; its capture is
  part of the call's time) and replayed:
  one launch per token instead of one per kernel. On CPU the same static step runs eagerly, so
  its tokens can be compared with the eager engine's where CI runs (tests/learner/test_captured_engine.py).

Same tokens as the eager engine: a row's logits differ from the eager step's only by the
round-off of attending over masked zero columns, and the keyed sampler draws from the logits and
the row's key alone (rollout/sampling.py); the GPU check compares the two engines' tokens on the
same seeds (bench/gpu_check.py).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import StaticCache

from learner.rollout.engine import TorchEngine

WARMUP_STEPS = 2  # eager runs on a side stream before a capture (lazy inits, allocator, cuBLAS handles)


class StaticDecode:
    """The decode step over a static cache (``capture``: replayed as one CUDA graph)."""

    def __init__(self, model: torch.nn.Module, cache, attn: torch.Tensor, steps: int, capture: bool):
        self.model = model
        batch, width = attn.shape
        self.width, self.n = width, 0
        dtype = next(model.parameters()).dtype
        self.static = StaticCache(config=model.config, max_cache_len=width + steps)
        for i, layer in enumerate(cache.layers):  # the prompts' keys/values into columns [0, width)
            self.static.layers[i].update(layer.keys, layer.values)
        self.mask = torch.full((batch, 1, 1, width + steps), torch.finfo(dtype).min, dtype=dtype, device=attn.device)
        self.mask[:, 0, 0, :width].masked_fill_(attn.bool(), 0.0)
        self.tok = torch.zeros((batch, 1), dtype=torch.long, device=attn.device)
        self.pos = torch.zeros((batch, 1), dtype=torch.long, device=attn.device)
        self.capture = capture
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def _forward(self) -> torch.Tensor:
        out = self.model(input_ids=self.tok, attention_mask=self.mask, position_ids=self.pos,
                         past_key_values=self.static, use_cache=True)
        return out.logits[:, -1].float()

    def step(self, tok: torch.Tensor, done: torch.Tensor, next_pos: torch.Tensor) -> torch.Tensor:
        # a done row's column stays open: its later tokens are padding nobody reads (its own row only)
        self.mask[:, 0, 0, self.width + self.n] = 0.0
        self.tok.copy_(tok[:, None])
        self.pos.copy_(next_pos)
        self.n += 1
        if not self.capture:
            return self._forward()
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.logits

    def _capture(self) -> None:
        """Warm up on a side stream, capture one step, then rewind the cache's write position: the
        warm-up steps wrote this step's column (and the next), which the replays write again."""
        layers = self.static.layers
        at = [layer.cumulative_length.clone() for layer in layers]
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
        for layer, n in zip(layers, at):
            layer.cumulative_length.copy_(n)


class CapturedEngine(TorchEngine):
    """``TorchEngine`` with a fixed batch per call and ``StaticDecode`` steps (``rollout.captured_decode``).

    ``capture``: replay the step as a CUDA graph (default: when the model is on CUDA)."""

    def __init__(self, model: torch.nn.Module, pad_id: int, share_prefill: bool = True, capture: bool | None = None):
        super().__init__(model, pad_id, share_prefill=share_prefill, continuous_batching=False)
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError(f"capture: CUDA graphs need a CUDA model, this one is on {self.device}")

    def _decoder(self, cache, attn: torch.Tensor, steps: int) -> StaticDecode:
        return StaticDecode(self.model, cache, attn, steps, self.capture)
