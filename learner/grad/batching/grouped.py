"""The grouped backward: one backward of a micro-batch mixing open groups' buckets and known rows,
each parameter's gradient reduced per destination inside it (docs/learner-drain.md, "The grouped backward").

A destination is G (known-advantage rows) or one (group, reward) bucket of an open group. Every
token belongs to one row, a row to one destination, and a token's activations influence only its
own row's losses (attention stays inside a row, packed or padded), so the gradient of the
micro-batch's loss at a module's output, δ_t, is the gradient of its own destination's loss alone.
Hence, for each destination d, with D_d its tokens:

    Linear:    ∂W_d = Σ_{t∈D_d} δ_t a_tᵀ   (one bmm over the destinations' gathered tokens)
               ∂b_d = Σ_{t∈D_d} δ_t
    Embedding: ∂E_d[v] = Σ_{t∈D_d, id_t=v} δ_t   (one index_add at d·V + id_t)
    RMSNorm:   ∂w_d = Σ_{t∈D_d} δ_t ⊙ x̂_t      (x̂ the normalised input)

Forward hooks keep each reducible module's input (a, the ids, x̂) and put a tensor hook on its
output that reduces δ as soon as the backward produces it (so no δ outlives its layer). The
backward is ``torch.autograd.grad`` of the loss with respect to one zero scalar ``anchor`` added
to the output of every reducible module whose inputs need no gradient (the embeddings; under LoRA
the first adapters): autograd then computes every activation gradient, each output's δ, and none
of the ordinary weight-gradient matmuls (no parameter is asked for). Adding 0 changes no value.

A model with a trainable parameter outside these modules (or an embedding with ``max_norm`` /
``scale_grad_by_freq``) is not reducible: ``GroupedGradients.for_model`` returns None and the
learner keeps its per-bucket path, never a wrong gradient. So does a module called on tensors whose
leading dimensions are not the micro-batch's grid (``NotReducible``, raised in the forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from types import SimpleNamespace

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

# norms whose forward is weight * normalised(x) (Gemma's (1 + weight) is not: not reducible)
_RMS_NORM_NAMES = {"LlamaRMSNorm", "WideRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"}


class NotReducible(RuntimeError):
    """A module saw tensors the grouped reduction cannot map onto the micro-batch's tokens."""


def _kind(module: nn.Module) -> str | None:
    if type(module).forward is nn.Linear.forward:
        return "linear"
    if type(module).forward is nn.Embedding.forward:
        ok = module.max_norm is None and not module.scale_grad_by_freq and not module.sparse
        return "embedding" if ok else None
    if isinstance(module, LlamaRMSNorm) or type(module).__name__ in _RMS_NORM_NAMES:
        return "rmsnorm"
    return None


class Destinations:
    """Each token's destination on the micro-batch's (lines, width) grid: −1 (padding, a free slot
    of a packed line: no loss, δ = 0 there) or 0..n−1; and the gather plan the Linear layers share."""

    def __init__(self, token_dest: torch.Tensor, count: int):
        self.flat = token_dest.reshape(-1)  # (N,)
        self.count, self.n = count, self.flat.numel()
        valid = self.flat >= 0
        self.tokens = valid.nonzero().squeeze(1)  # (M,) real tokens
        self.dest = self.flat[self.tokens]  # (M,)
        order = torch.argsort(self.dest, stable=True)
        sizes = torch.bincount(self.dest, minlength=count)
        longest = int(sizes.max()) if count else 0
        starts = torch.cumsum(sizes, 0) - sizes
        slot = torch.arange(len(order), device=order.device) - starts[self.dest[order]]
        # (count, longest): token index per destination, padded with token 0 (masked by ``keep``)
        self.gather = torch.zeros(count, max(longest, 1), dtype=torch.long, device=order.device)
        self.keep = torch.zeros(count, max(longest, 1), 1, dtype=torch.bool, device=order.device)
        self.gather[self.dest[order], slot] = self.tokens[order]
        self.keep[self.dest[order], slot] = True
        self.gather_flat = self.gather.reshape(-1)
        self.slices = self._slices()
        self._keep: dict[torch.dtype, torch.Tensor] = {}

    def _slices(self) -> list[tuple[int, int]] | None:
        """Each destination's [first, last] token range, when those ranges are disjoint: then a
        destination is one slice of the grid (the other tokens in it are padding, δ = 0 there), and
        its weight gradient one matmul of two views, no gather."""
        if not self.count or not len(self.tokens):
            return None
        device = self.tokens.device
        first = torch.full((self.count,), self.n, dtype=torch.long, device=device).scatter_reduce(
            0, self.dest, self.tokens, "amin")
        last = torch.full((self.count,), -1, dtype=torch.long, device=device).scatter_reduce(
            0, self.dest, self.tokens, "amax")
        ranges = sorted(zip(first.tolist(), last.tolist()))
        if any(b[0] <= a[1] for a, b in zip(ranges, ranges[1:])):
            return None
        return [(f, e + 1) for f, e in zip(first.tolist(), last.tolist())]

    def keep_as(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._keep:
            self._keep[dtype] = self.keep.to(dtype)
        return self._keep[dtype]


class GroupedGradients:
    """Hooks that reduce one backward's parameter gradients per destination (module docstring)."""

    def __init__(self, modules: list[tuple[nn.Module, str]], params: Sequence[nn.Parameter]):
        self.modules, self.params = modules, list(params)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._dest: Destinations | None = None
        self._grads: list[torch.Tensor | None] = []
        self._anchor: torch.Tensor | None = None
        self._recent: list[tuple[tuple, torch.Tensor]] = []
        self._active = False  # only ``backward``'s own pass reduces (a retained graph's later pass does not)

    @classmethod
    def for_model(cls, model: nn.Module, params: Sequence[nn.Parameter]) -> "GroupedGradients | None":
        """The reducible modules holding ``params``; None if some trainable parameter is elsewhere."""
        wanted = {id(p) for p in params}
        covered, modules = set(), []
        for module in model.modules():
            own = [p for p in module.parameters(recurse=False) if id(p) in wanted]
            if not own:
                continue
            kind = _kind(module)
            if kind is None:
                return None
            modules.append((module, kind))
            covered |= {id(p) for p in own}
        return cls(modules, params) if covered == wanted else None

    @contextmanager
    def capture(self, token_dest: torch.Tensor, count: int):
        """Within it, forwards of the model record what the reduction needs; ``backward`` then runs."""
        self._dest = Destinations(token_dest, count)
        self._grads = [None] * len(self.params)
        self._anchor = torch.zeros((), dtype=torch.float64, device=token_dest.device, requires_grad=True)
        handles = [m.register_forward_hook(self._hook(m, kind)) for m, kind in self.modules]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> list[list[torch.Tensor | None]]:
        """One backward of ``loss``; per destination, one gradient per parameter (None: untouched)."""
        if self._anchor is None:
            raise RuntimeError("backward: call it inside capture()")
        self._active = True
        try:
            torch.autograd.grad(loss, [self._anchor], retain_graph=retain_graph, allow_unused=True)
        finally:
            self._active = False
        out: list[list[torch.Tensor | None]] = [[None] * len(self.params) for _ in range(self._dest.count)]
        for i, g in enumerate(self._grads):
            if g is not None:
                for d in range(self._dest.count):
                    out[d][i] = g[d]
        self._grads, self._recent = [None] * len(self.params), []
        return out

    def segment_sums(self, values: torch.Tensor) -> torch.Tensor:
        """Per destination, the sum of a (lines, width) per-token tensor over its tokens (count,)."""
        dest = self._dest
        return torch.zeros(dest.count, dtype=values.dtype, device=values.device).index_add_(
            0, dest.dest, values.reshape(-1)[dest.tokens])

    # -- hooks ---------------------------------------------------------------------------------
    def _hook(self, module: nn.Module, kind: str):
        def forward_hook(mod, args, output):
            x = args[0]
            if x.shape[:2].numel() != self._dest.n or output.shape[:2].numel() != self._dest.n:
                raise NotReducible(f"{type(mod).__name__}: input {tuple(x.shape)} is not the micro-batch's "
                                   f"{self._dest.n} tokens")
            saved = self._saved(mod, kind, x)
            if not x.requires_grad:  # nothing upstream reaches the anchor: this output is where it enters
                output = output + self._anchor.to(output.dtype)
            output.register_hook(lambda delta: self._reduce(mod, kind, saved, delta))
            return output
        return forward_hook

    @staticmethod
    def _saved(mod: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
        if kind != "rmsnorm":
            return x.detach()
        with torch.no_grad():  # the normalised input x̂: the module's own forward code with weight 1
            unit = SimpleNamespace(weight=torch.ones_like(mod.weight), variance_epsilon=mod.variance_epsilon)
            return type(mod).forward(unit, x.detach())

    def _gathered(self, saved: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A Linear input's tokens per destination, (count, longest, in), zero in the padded slots;
        q/k/v (and gate/up) share one input and reach the backward one after another, so the
        last two are kept."""
        key = (saved.data_ptr(), tuple(saved.shape), saved.stride(), dtype)
        for k, value in self._recent:
            if k == key:
                return value
        dest = self._dest
        a = saved.reshape(dest.n, -1).index_select(0, dest.gather_flat).view(dest.count, -1, saved.shape[-1])
        value = a.to(dtype) * dest.keep_as(dtype)
        self._recent = [(key, value), *self._recent[:1]]
        return value

    def _add(self, param: nn.Parameter | None, grad: torch.Tensor) -> None:
        if param is None or id(param) not in self._index:
            return
        i = self._index[id(param)]
        self._grads[i] = grad if self._grads[i] is None else self._grads[i] + grad  # tied or reused

    def _reduce(self, mod: nn.Module, kind: str, saved: torch.Tensor, delta: torch.Tensor) -> None:
        if not self._active:
            return
        dest = self._dest
        d = delta.reshape(dest.n, -1)
        if kind == "embedding":
            weight = mod.weight
            at = dest.dest * weight.shape[0] + saved.reshape(-1)[dest.tokens]
            g = torch.zeros(dest.count * weight.shape[0], weight.shape[1], dtype=d.dtype, device=d.device)
            g.index_add_(0, at, d[dest.tokens])
            g = g.view(dest.count, *weight.shape)
            if mod.padding_idx is not None:
                g[:, mod.padding_idx] = 0  # as nn.Embedding's own backward
            self._add(weight, g)
            return
        if kind == "rmsnorm":
            prod = (d * saved.reshape(dest.n, -1).to(d.dtype))[dest.tokens]
            self._add(mod.weight, torch.zeros(dest.count, d.shape[1], dtype=d.dtype, device=d.device)
                      .index_add_(0, dest.dest, prod))
            return
        if mod.weight.requires_grad and dest.slices is not None:
            a = saved.reshape(dest.n, -1).to(d.dtype)
            self._add(mod.weight, torch.stack([d[s:e].t() @ a[s:e] for s, e in dest.slices]))
        elif mod.weight.requires_grad:
            da = d.index_select(0, dest.gather_flat).view(dest.count, -1, d.shape[1])  # (count, longest, out)
            self._add(mod.weight, torch.bmm(da.transpose(1, 2), self._gathered(saved, d.dtype)))
        if mod.bias is not None and mod.bias.requires_grad:
            self._add(mod.bias, torch.zeros(dest.count, d.shape[1], dtype=d.dtype, device=d.device)
                      .index_add_(0, dest.dest, d[dest.tokens]))


# ---------------------------------------------------------------- a mixed micro-batch into the sums

Key = tuple[int, float]  # an open bucket: (group, reward)


def destinations(keys: Sequence[Key | None], known_in_g: bool) -> tuple[list[int], list[Key | None]]:
    """Per row its destination index, and the destinations (None: G). ``known_in_g`` False: known
    rows take no destination (their gradient comes from a second, ordinary backward)."""
    order: dict[Key | None, int] = {}
    row_dest = []
    for key in keys:
        if key is None and not known_in_g:
            row_dest.append(-1)
            continue
        row_dest.append(order.setdefault(key, len(order)))
    return row_dest, list(order)


def grouped_into(acc, grouped: GroupedGradients, pg_terms: torch.Tensor, aux_terms: torch.Tensor | None,
                 open_tokens: torch.Tensor, dests: Sequence[Key | None]) -> None:
    """The mixed micro-batch's gradients into the accumulator: each bucket's ∇pg into its group's
    sums (``add_to_group``), the known rows' ∇(pg + aux) and every row's ∇aux into G (``add_direct``).
    Without KL/entropy one backward. With it the two do not separate inside one backward (a token's δ
    mixes its bucket's pg with its G-bound aux), so: the buckets' pg reduced by the hooks (graph
    kept), then one ordinary backward of what goes to G (docs/learner-drain.md measures the options)."""
    if aux_terms is None:
        per = grouped.backward(pg_terms.sum())
        direct = None
    else:
        per = grouped.backward((pg_terms * open_tokens).sum(), retain_graph=True)
        rest = (pg_terms * (1 - open_tokens)).sum() + aux_terms.sum()
        direct = list(torch.autograd.grad(rest, acc.params, allow_unused=True))
    for key, grads in zip(dests, per):
        if key is None:
            acc.add_direct(grads)
        else:
            acc.add_to_group(key[0], key[1], grads)
    if direct is not None:
        acc.add_direct(direct)
