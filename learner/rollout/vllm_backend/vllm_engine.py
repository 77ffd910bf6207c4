"""The vLLM rollout engine: vLLM's offline ``LLM`` behind the ``Engine`` protocol.

One engine lives inside one rollout worker process. vLLM's engine core runs in that same
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a weight publish hands the worker's
model the shared-memory tensors by reference: ``collective_rpc`` calls the model's own
``load_weights`` (which fuses q/k/v and gate/up as it does at start-up), then the prefix
cache is reset so no KV block computed with the old weights can serve a later request.

Sampling: one vLLM request per prompt, keyed by its stream (``rollout/vllm_backend/vllm_keyed.py``: the
logits processor draws the torch engine's keyed Gumbel-max, so a trajectory samples the same
tokens whatever batch it lands in and a draft can be verified), stop on the stop token ids
(the stop token is kept in the output, as the torch engine does), and ``logprobs=0`` with
``logprobs_mode='raw_logprobs'``: the log-prob of the sampled token under the model's own
distribution, log softmax(z)_y before temperature/top-p, which is what the learner
recomputes (engine.py's convention).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Mapping

import torch

from learner.config import RunConfig
from learner.preflight import MAX_VLLM_VERIFY_VOCAB
from learner.rollout.engine.torch_engine import Admit, Completion, EngineStats, OnDone, SamplingParams, Stream, stream_of
from learner.rollout.engine.step_cost import StepCost
from learner.rollout.vllm_backend.vllm_steps import VllmSteps
from learner.rollout.vllm_backend.vllm_layout import serving_dir

KV_CACHE_BYTES_MAX = 2**30  # vLLM's CPU default is 4 GiB per engine; ours fit their batch
BLOCK_SIZE = 32  # CPU attention kernels take multiples of 32
MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams range
# Verification reads each sampled position's whole distribution back from vLLM's prompt log-probs,
# one Python object per (position, token) (vllm_verify.py): bounded to small vocabularies. The
# trainer refuses a larger one before any worker starts (preflight); this guards direct use.
MAX_VERIFY_VOCAB = MAX_VLLM_VERIFY_VOCAB


class WeightPublishError(RuntimeError):
    """A publish did not update every parameter of the served model."""


class _RopeCacheReloadNotice(logging.Filter):
    """vLLM's layerwise reload warns that RotaryEmbedding 'failed to load weights' on every
    publish: its cos/sin cache is a derived buffer, never in a checkpoint, and is put back
    unchanged. Drop that one line; every other reload warning still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().startswith("RotaryEmbedding") and "Failed to load" in record.getMessage())


def _load_into_worker(worker, named: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Runs inside vLLM's worker: reload HF-named tensors in place (vLLM's layerwise reload,
    the path of ``GPUModelRunner.reload_weights``); returns the parameters it did not update."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    runner = worker.model_runner
    model = runner.get_model()
    expected = {name for name, _ in model.named_parameters()}
    initialize_layerwise_reload(model)
    loaded = model.load_weights(iter(named))
    finalize_layerwise_reload(model, runner.vllm_config.model_config)
    return sorted(expected - set(loaded))


class VllmEngine:
    def __init__(self, cfg: RunConfig, policy_dir: str, tokenizer, replica: int,
                 enable_prefix_caching: bool = True):
        # Engine core in this process: publishes pass tensors by reference, no extra processes.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the worker is already pinned
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its CPU start-up warnings are benign here
        from vllm import LLM

        from learner.rollout.vllm_backend.vllm_keyed import KeyedGumbelProcessor

        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_RopeCacheReloadNotice())

        if cfg.rollout.temperature > MAX_TEMPERATURE:
            raise ValueError(f"rollout.temperature: the vllm engine samples at temperature <= {MAX_TEMPERATURE}, "
                             f"got {cfg.rollout.temperature}")
        self.replica, self.version, self.stats = replica, 0, EngineStats()
        self.continuous_batching = True  # rows join and drafts yield between engine steps (vllm_steps.py)
        self.step_cost = StepCost()  # learned from its steps: where a draft fits (rollout/speculation/drafts.py)
        self.pad_id = tokenizer.pad_token_id
        self._tmp = tempfile.TemporaryDirectory(prefix=f"thundersync-vllm-{replica}-")
        model_dir, self.layout = serving_dir(policy_dir, self._tmp.name)
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
        self.max_model_len = hf.max_position_embeddings
        if cfg.rollout.speculation.enabled and hf.vocab_size > MAX_VERIFY_VOCAB:
            self._tmp.cleanup()
            raise ValueError(f"rollout.speculation: the vllm engine verifies drafts from full-vocabulary prompt "
                             f"log-probs, for vocabularies up to {MAX_VERIFY_VOCAB} tokens; this model has "
                             f"{hf.vocab_size} (use engine: torch, or turn speculation off)")
        # vLLM has no float64: a bf16 engine when asked (rollout.dtype, else model.dtype), else float32
        dtype = "bfloat16" if (cfg.rollout.dtype or cfg.model.dtype) == "bfloat16" else "float32"
        max_seqs = max(8, cfg.train.prompts_per_step * cfg.train.group_size)
        # K and V of every layer for a full batch of full-length sequences, 16 MiB at least
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        per_token = 2 * hf.num_hidden_layers * kv_heads * head_dim * (2 if dtype == "bfloat16" else 4)
        kv_bytes = min(KV_CACHE_BYTES_MAX, max(16 * 2**20, per_token * max_seqs * self.max_model_len))
        t0 = time.monotonic()
        self.llm = LLM(
            model=str(model_dir), dtype=dtype, seed=cfg.seed, max_model_len=self.max_model_len,
            enforce_eager=True, enable_prefix_caching=enable_prefix_caching, block_size=BLOCK_SIZE,
            kv_cache_memory_bytes=kv_bytes, logprobs_mode="raw_logprobs", skip_tokenizer_init=True,
            generation_config="vllm",  # no sampling defaults from generation_config.json
            max_num_seqs=max_seqs, logits_processors=[KeyedGumbelProcessor],
            max_logprobs=-1,  # full-vocabulary prompt log-probs (``prompt_logprobs``: verification)
        )
        self.stats.extra["startup_s"] = time.monotonic() - t0
        self.steps = VllmSteps(self.llm.llm_engine, self.step_cost)

    def _vllm_params(self, params: SamplingParams, seed: "int | Stream", max_tokens: int):
        """vLLM greedy; at temperature > 0 the keyed processor has chosen the token it takes."""
        from vllm import SamplingParams as VSP

        from learner.rollout.vllm_backend.vllm_keyed import keyed_args

        keyed = keyed_args(stream_of(seed), params.temperature, params.top_p) if params.temperature > 0 else None
        return VSP(max_tokens=max_tokens, temperature=0.0, extra_args=keyed,
                   logprobs=0, stop_token_ids=list(params.stop_token_ids), ignore_eos=True,
                   detokenize=False)

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seeds: "list[int | Stream] | None" = None, on_done: OnDone | None = None,
                 admit: Admit | None = None, keys: list | None = None, cut=None) -> list[Completion]:
        """As the torch engine's (``Engine.generate``), continuously batched (``vllm_steps.py``);
        ``keys`` are not needed: vLLM's prefix cache finds a context's keys/values itself."""
        if not prompts:
            return []
        seeds = seeds if seeds is not None else [params.seed + b for b in range(len(prompts))]

        def request(prompt: list[int], seed):
            if len(prompt) >= self.max_model_len:
                raise ValueError(f"prompts: a prompt of {len(prompt)} tokens leaves no room in max_model_len "
                                 f"{self.max_model_len}")
            # a Stream that starts at n continues a turn: at most max_new_tokens - n more tokens
            room = min(params.max_new_tokens - stream_of(seed).start, self.max_model_len - len(prompt))
            return self._vllm_params(params, seed, room)

        result = self.steps.generate(list(zip(prompts, seeds)), request, on_done, admit, cut)
        self.stats.calls += 1
        self.stats.tokens_out += sum(len(c.token_ids) for c in result)
        return result

    def push_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy the tensors into the served model (no cache reset: ``load_weights`` is the
        public path; tests call this alone to show why the reset is needed)."""
        named = self.layout.transform(named_tensors) if self.layout else named_tensors.items()
        missing = self.llm.collective_rpc(_load_into_worker, args=(list(named),))[0]
        if missing:
            raise WeightPublishError(f"replica {self.replica}: publish left {len(missing)} parameters "
                                     f"unchanged, e.g. {missing[:3]}")

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        t0 = time.monotonic()
        self.push_weights(named_tensors)
        # KV blocks cached for a prefix were computed with the old weights: drop all of them.
        if not self.llm.reset_prefix_cache():
            raise WeightPublishError(f"replica {self.replica}: vLLM refused to reset the prefix cache "
                                     "(requests still running during a publish)")
        self.version = version
        self.stats.weight_loads += 1
        self.stats.seconds_loading += time.monotonic() - t0

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Prompt log-probs (raw) of every position; vLLM computes them without prefix-cache reuse."""
        from vllm import SamplingParams as VSP

        sp = VSP(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=0.0)
        outs = self.steps.prefill(sequences, sp)
        return [[0.0] + [float(d[tok].logprob) for tok, d in zip(seq[1:], o.prompt_logprobs[1:])]
                for seq, o in zip(sequences, outs)]

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """Full-vocabulary raw log-probs from one prefill of each sequence: row j - 1 is
        log softmax(z) of position j given the tokens before it, (len - 1, V) float32. The keyed
        sample of a row equals that of its logits up to the rounding of the shift by logsumexp;
        for the small vocabularies this is meant for (each entry comes back as a Python object)."""
        from vllm import SamplingParams as VSP

        sp = VSP(max_tokens=1, prompt_logprobs=-1, detokenize=False, temperature=0.0)
        outs = self.steps.prefill(sequences, sp)  # (inside a running call too: verification)
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        result = []
        for o in outs:
            rows = torch.full((len(o.prompt_logprobs) - 1, vocab), float("-inf"))
            for j, d in enumerate(o.prompt_logprobs[1:]):
                rows[j, list(d)] = torch.tensor([lp.logprob for lp in d.values()])
            result.append(rows)
        return result

    def verify_drafts(self, drafts: list, temperature: float, top_p: float, keep=None) -> list:
        """Drafts' verdicts under the loaded weights from a vLLM prefill (``vllm_verify.py``);
        ``keep`` is not needed: vLLM's prefix cache keeps the kept prefix's keys/values."""
        from learner.rollout.vllm_backend.vllm_verify import verify_on_vllm

        return verify_on_vllm(self, drafts, temperature, top_p)

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        self._tmp.cleanup()
