"""Chat templates and tool calls: a multi-turn trajectory built by the real agent loop has
exactly the policy's tokens in its loss mask, for the built-in template and Qwen2.5's.

tests/fixtures/qwen2_5_chat_template.jinja is Qwen2.5-Instruct's template as shipped in its
tokenizer_config.json; the fixture tokenizer is character-level with Qwen's special tokens.
"""

from __future__ import annotations

import json
import queue
import string
import time
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from learner.config import RunConfig
from learner.tasks.chat import ChatFormat, parse_hermes, turn_stop_ids
from learner.rollout.engine.torch_engine import Completion, TorchEngine
from learner.tasks.env import ArithToolEnv, Task, ToolSpec, task_for_group, task_metrics
from learner.rollout.processes.messages import Finished, Work, WorkItem
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.processes.agent_worker import AgentWorker
from learner.trajectory import Trajectory

QWEN_TEMPLATE = (Path(__file__).parents[1] / "fixtures" / "qwen2_5_chat_template.jinja").read_text()
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
CALCULATOR = ArithToolEnv.TOOLS[0]


def qwen_like_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(QWEN_SPECIAL)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(QWEN_SPECIAL)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=QWEN_TEMPLATE, clean_up_tokenization_spaces=False)


class ScriptedPolicy:
    """An engine that answers each turn with the next of ``turns`` (text), so the test knows
    the policy's tokens exactly; the rest of the agent loop is the real one."""

    def __init__(self, tokenizer, turns: list[str]):
        self.turns = [tokenizer.encode(t, add_special_tokens=False) for t in turns]
        self.version = 0

    def generate(self, prompts, params, seeds=None, on_done=None):
        out = []
        for i, _ in enumerate(prompts):
            ids = self.turns.pop(0)
            out.append(Completion(ids, [-0.5] * len(ids), ids[-1] in params.stop_token_ids))
            on_done(i, out[-1])
        return out


def run_loop(worker: AgentWorker, tasks: list[Task]) -> list:
    worker.handle(Work(0, [WorkItem(i, i, task, 7 + i) for i, task in enumerate(tasks)]))
    worker.run_loops(timeout_s=120)
    msgs = []
    while not worker.out_q.empty():
        msgs.append(worker.out_q.get_nowait())
    return sorted((m.item for m in msgs if isinstance(m, Finished) and isinstance(m.item, Trajectory)),
                  key=lambda t: t.id)


def config(**task) -> RunConfig:
    return RunConfig.model_validate({"task": {"tool_latency": {"distribution": "none"}, **task}})


def assert_mask_is_exactly_the_turns(traj, tok):
    scored = [i for i, m in enumerate(traj.loss_mask) if m]
    assert scored == [i for start, end in traj.turn_spans for i in range(start, end)]
    return tok.decode([traj.input_ids[i] for i in scored], skip_special_tokens=False)


# ---------------------------------------------------------------- the built-in template


def test_builtin_template_renders_arith_prompts_as_before():
    tok = load_tokenizer(resolve_model_dir("builtin:tiny"))
    env = ArithToolEnv(config().task)
    task = env.sample_task(__import__("random").Random(3))
    assert tok.chat_template and ChatFormat(tok, env).prompt_text(task) == task.prompt_text


def test_builtin_model_multi_turn_mask_covers_only_its_tokens():
    """Real sampling with the built-in policy; each trajectory must equal its conversation
    rendered by the template, with mask 1 on the policy's turns only."""
    policy = resolve_model_dir("builtin:tiny")
    tok, cfg = load_tokenizer(policy), config()
    engine = TorchEngine(load_model(policy), tok.pad_token_id)
    worker = AgentWorker(0, cfg, engine, tok, None, None, queue.Queue(), time.monotonic(),
                         stop_ids=turn_stop_ids(tok, policy))
    env = ArithToolEnv(cfg.task)
    tasks = [env.sample_task(__import__("random").Random(s)) for s in range(12)]
    trajs = run_loop(worker, tasks)
    multi = [t for t in trajs if len(t.turn_spans) >= 2]
    assert len(multi) >= 2, "the built-in policy should call its calculator on some of 12 tasks"
    for traj in multi:
        turns = [tok.decode(traj.input_ids[s:e], skip_special_tokens=False) for s, e in traj.turn_spans]
        messages = list(tasks[traj.id].messages)
        for turn in turns:
            messages.append({"role": "assistant", "content": turn})
            call = env.parse_turn(tasks[traj.id], turn)
            if call.kind == "tool":
                messages.append({"role": "tool", "content": env.run_tool(call.payload)})
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert traj.input_ids == tok.encode(rendered, add_special_tokens=False)
        assert assert_mask_is_exactly_the_turns(traj, tok) == "".join(turns)
        assert all("<obs>" not in t for t in turns)  # observations are never scored


# ---------------------------------------------------------------- Qwen2.5's template


CALL_TURN = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*4"}}\n</tool_call><|im_end|>'


def test_qwen_template_multi_turn_mask_covers_only_the_models_tokens():
    tok = qwen_like_tokenizer()
    cfg = config()
    turns = [CALL_TURN, "<ans>24</ans><|im_end|>"]
    worker = AgentWorker(0, cfg, ScriptedPolicy(tok, list(turns)), tok, None, None, queue.Queue(), time.monotonic(),
                         stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    assert worker.chat.format == "hermes"
    task = Task("", 24, "12+3*4", max_turns=3, messages=[{"role": "user", "content": "12+3*4=?"}])
    [traj] = run_loop(worker, [task])
    conversation = [
        {"role": "user", "content": "12+3*4=?"},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "calculator", "arguments": {"expression": "3*4"}}]},
        {"role": "tool", "content": "12"},
        {"role": "assistant", "content": "<ans>24</ans>"},
    ]
    rendered = tok.apply_chat_template(conversation, tools=[CALCULATOR.schema()], tokenize=False)
    assert rendered.endswith("<|im_end|>\n")  # the template's last newline comes after the model stopped
    assert traj.input_ids == tok.encode(rendered.removesuffix("\n"), add_special_tokens=False)
    assert assert_mask_is_exactly_the_turns(traj, tok) == "".join(turns)
    assert traj.reward == 1.0 and traj.error is None
    unscored = tok.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if not m], skip_special_tokens=False)
    assert "<tool_response>\n12\n</tool_response>" in unscored and '"name": "calculator"' in unscored  # tool schema


def test_a_malformed_tool_call_ends_the_trajectory_with_its_reason():
    tok = qwen_like_tokenizer()
    bad = '<tool_call>\n{"name": "calculator", "arguments": {expression: 3*4}}\n</tool_call><|im_end|>'
    worker = AgentWorker(0, config(), ScriptedPolicy(tok, [bad]), tok, None, None, queue.Queue(), time.monotonic(),
                         stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    [traj] = run_loop(worker, [Task("", 12, "3*4", max_turns=3, messages=[{"role": "user", "content": "3*4=?"}])])
    assert traj.reward == 0.0 and len(traj.turn_spans) == 1
    assert traj.error == "turn 0: <tool_call> is not valid JSON: Expecting property name enclosed in double quotes at column 38"
    assert task_metrics([traj]) == {"task/turn_errors": 1.0, "task/reward_errors": 0.0}


@pytest.mark.parametrize(("body", "kind", "payload", "error"), [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>', "tool", "1+2", None),
    ('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+2\\"}"}</tool_call>', "tool", "1+2", None),
    ("The answer is 3.", "final", "The answer is 3.", None),
    ('<tool_call>{"name": "web", "arguments": {}}</tool_call>', "invalid", None, "unknown tool 'web' (tools: calculator)"),
    ('<tool_call>{"name": "calculator", "arguments": {"x": "1"}}</tool_call>', "invalid", None,
     "tool 'calculator' needs arguments {'expression': string}"),
    ('<tool_call>{"name": "calculator"', "invalid", None, "<tool_call> without </tool_call>"),
    ("<tool_call>[1]</tool_call>", "invalid", None, "<tool_call> needs a JSON object with a string 'name'"),
    ("<tool_call>{}</tool_call><tool_call>{}</tool_call>", "invalid", None, "2 tool calls in one turn; one per turn is supported"),
])
def test_hermes_tool_calls(body, kind, payload, error):
    result = parse_hermes(body, [CALCULATOR, ToolSpec("python", "code", "run code")][:1])
    assert result.kind == kind and result.error == error
    if payload is not None:
        assert result.payload == payload


def test_stop_tokens_come_from_the_generation_config(tmp_path):
    tok = qwen_like_tokenizer()
    end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [end, eot]}))
    assert turn_stop_ids(tok, tmp_path) == sorted({end, eot})
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eot}))
    assert turn_stop_ids(tok, tmp_path) == sorted({end, eot})  # the tokenizer's eos (end of turn) too
    builtin = resolve_model_dir("builtin:tiny")
    assert turn_stop_ids(load_tokenizer(builtin), builtin) == sorted(
        load_tokenizer(builtin).convert_tokens_to_ids(["</call>", "<eos>"]))


# ---------------------------------------------------------------- a local HF chat model, end to end


def chat_model_dir(path: Path) -> Path:
    """A tiny random Llama with the Qwen-like tokenizer, saved as a local HF chat model."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = qwen_like_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                                         tie_word_embeddings=False))
    model.generation_config = GenerationConfig(eos_token_id=tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]),
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.slow
def test_a_local_chat_model_trains_on_data_with_its_own_template(tmp_path):
    import subprocess
    import sys

    import yaml

    policy = chat_model_dir(tmp_path / "chat-model")
    cfg = {"model": {"policy": str(policy)},
           "task": {"name": "dataset", "path": "configs/data/math.jsonl", "prompt_field": "question",
                    "reward": "math-verify", "tools": ["python-sandbox"], "tool_latency": {"distribution": "none"}},
           "rollout": {"max_new_tokens": 8},
           "train": {"steps": 1, "prompts_per_step": 2, "group_size": 2}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(tmp_path / "c.yaml"),
                        "--dump-step", str(tmp_path / "dump"), "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    tok = qwen_like_tokenizer()
    batch = json.loads((tmp_path / "dump" / "batch.json").read_text())
    for traj in batch["trajectories"]:
        text = tok.decode(traj["input_ids"], skip_special_tokens=False)
        assert text.startswith("<|im_start|>system\nYou are Qwen") and '"name": "python"' in text  # its template, our tool
        assert "<|im_start|>user\n" in text and text.count("<|im_start|>assistant\n") >= 1
        first_scored = traj["loss_mask"].index(1)
        assert tok.decode(traj["input_ids"][:first_scored], skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_a_dataset_task_calls_the_python_sandbox_in_the_hermes_format(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "What is 6*7?", "answer": "42"}\n')
    cfg = config(name="dataset", path=str(data), tools=["python-sandbox"], max_turns=3)
    tok = qwen_like_tokenizer()
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call><|im_end|>'
    worker = AgentWorker(0, cfg, ScriptedPolicy(tok, [call, "It is 42<|im_end|>"]), tok, None, None, queue.Queue(),
                         time.monotonic(), stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    [traj] = run_loop(worker, [task_for_group(worker.env, 0, seed=0)])
    observation = tok.decode(traj.input_ids[traj.turn_spans[0][1]:traj.turn_spans[1][0]], skip_special_tokens=False)
    assert observation == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert traj.reward == 0.0 and traj.error is None  # exact-match: "It is 42" is not "42"


def test_the_builtin_format_calls_the_python_sandbox_with_tags(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "6*7", "answer": "42"}\n')
    cfg = config(name="dataset", path=str(data), tools=["python-sandbox"], max_turns=3)
    tok = load_tokenizer(resolve_model_dir("builtin:tiny"))
    turns = ["<call>print(6*7)</call>", "<ans>42</ans><eos>"]
    worker = AgentWorker(0, cfg, ScriptedPolicy(tok, turns), tok, None, None, queue.Queue(), time.monotonic(),
                         stop_ids=tok.convert_tokens_to_ids(["</call>", "<eos>"]))
    [traj] = run_loop(worker, [task_for_group(worker.env, 0, seed=0)])
    assert tok.decode(traj.input_ids, skip_special_tokens=False) == (
        "<bos>Q:6*7\n<call>print(6*7)</call><obs>42</obs><ans>42</ans><eos>")
    assert traj.reward == 1.0


def test_a_template_without_tool_messages_is_named_before_any_rollout():
    tok = qwen_like_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}"
                         "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
                         "{% endif %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ValueError) as err:
        ChatFormat(tok, ArithToolEnv(config().task))
    assert str(err.value) == ("model.policy: its chat template cannot render a tool message after an assistant turn "
                              "(TemplateError: Conversation roles must alternate user/assistant); tools need one that can")
