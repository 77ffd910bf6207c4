"""Prompts, tool observations and tool calls in the policy's own chat format.

A policy whose tokenizer has a chat template (every HF chat model; the built-in tiny models
ship one, ``BUILTIN_CHAT_TEMPLATE``) gets its prompt rendered by that template from the
task's messages, and each tool observation as the exact text its template puts between the
end of an assistant turn and the start of the next one (``ObservationFrame``). Only the
tokens the policy generated are scored; the template's text and the tool's output have
loss mask 0 (docs/tasks.md, "Chat models").

Tool calls are read in one of two formats:
- ``tags`` (the built-in models): ``<call>payload</call>``, answers ``<ans>...</ans>``;
  the task's own ``parse_turn`` reads them;
- ``hermes`` (Qwen, Hermes and most open chat models): ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>``; any turn without one is the final answer. A malformed
  call ends the trajectory with reward 0 and an error that says what was wrong.
``auto`` picks hermes when the tokenizer knows ``<tool_call>``, else tags.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from learner.tasks.env import Environment, Task, ToolSpec, TurnResult

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_CALL = re.compile(rf"{re.escape(TOOL_CALL_OPEN)}(.*?){re.escape(TOOL_CALL_CLOSE)}", re.DOTALL)
_ASSISTANT_MARK, _TOOL_MARK = "\x00assistant-content\x00", "\x00tool-output\x00"


def env_tools(env: Environment) -> list[ToolSpec]:
    return list(getattr(env, "tool_specs", lambda: [])())


def detect_tool_format(tokenizer, requested: str) -> str:
    if requested != "auto":
        return requested
    vocab = tokenizer.get_vocab()
    return "hermes" if TOOL_CALL_OPEN in vocab else "tags"


def turn_stop_ids(tokenizer, model_dir: str | Path | None) -> list[int]:
    """The tokens that end a turn: the model's ``generation_config.json`` ``eos_token_id``
    (one id or a list; chat models list their end-of-turn token there) and the tokenizer's
    eos token."""
    ids: list[int] = []
    path = Path(model_dir) / "generation_config.json" if model_dir else None
    if path is not None and path.is_file():
        eos = json.loads(path.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(int(i) for i in ids))


class ObservationFrame:
    """The text a chat template writes around a tool's output: what follows an assistant
    turn's content (e.g. ``<|im_end|>\\n``), the tool message's wrapping and the next turn's
    generation prompt. Found once by rendering a marked conversation."""

    def __init__(self, tokenizer, tools: list[dict] | None):
        base_msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _ASSISTANT_MARK}]
        render = lambda msgs, gen: tokenizer.apply_chat_template(  # noqa: E731
            msgs, tools=tools, add_generation_prompt=gen, tokenize=False)
        try:
            base = render(base_msgs, False)
            full = render([*base_msgs, {"role": "tool", "content": _TOOL_MARK}], True)
        except Exception as err:  # jinja's TemplateError, or the template's own raise_exception
            raise ValueError(f"model.policy: its chat template cannot render a tool message after an assistant "
                             f"turn ({type(err).__name__}: {err}); tools need one that can") from None
        if not full.startswith(base) or _TOOL_MARK not in full[len(base):]:
            raise ValueError("model.policy: its chat template does not render a tool message after an assistant "
                             "turn without changing the earlier text; multi-turn tool use needs one that does")
        self.after_content = base[base.rindex(_ASSISTANT_MARK) + len(_ASSISTANT_MARK):]
        self.before_output, self.after_output = full[len(base):].split(_TOOL_MARK)

    def text(self, turn_end: str, tool_output: str) -> str:
        """The observation after a turn whose text ends with ``turn_end`` (its stop token):
        the template's closing text is not repeated where the model wrote it itself."""
        closing = self.after_content
        if turn_end and closing.startswith(turn_end):
            closing = closing[len(turn_end):]
        return closing + self.before_output + tool_output + self.after_output


class ChatFormat:
    """What the agent loop asks of the policy's format: prompt ids, observation ids, turns."""

    def __init__(self, tokenizer, env: Environment, tool_format: str = "auto"):
        self.tok, self.env = tokenizer, env
        self.format = detect_tool_format(tokenizer, tool_format)
        self.tools = env_tools(env)
        schemas = [t.schema() for t in self.tools] or None
        self.schemas = schemas if self.format == "hermes" else None
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        self.frame = ObservationFrame(tokenizer, self.schemas) if self.templated and self.tools else None

    def prompt_text(self, task: Task) -> str:
        if self.templated and task.messages is not None:
            return self.tok.apply_chat_template(task.messages, tools=self.schemas, add_generation_prompt=True,
                                                tokenize=False)
        return task.prompt_text

    def observation_ids(self, turn_ids: list[int], tool_output: str) -> list[int]:
        if self.frame is None:
            text = self.env.observation_text(tool_output)
        else:
            end = self.tok.convert_ids_to_tokens(turn_ids[-1]) if turn_ids else ""
            text = self.frame.text(end, tool_output)
        return self.tok.encode(text, add_special_tokens=False)

    def parse_turn(self, task: Task, text: str, stop_text: str) -> TurnResult:
        """``text``: the decoded turn, special tokens kept; ``stop_text``: its stop token's
        text ('' when it ran out of tokens)."""
        if self.format == "tags":
            return self.env.parse_turn(task, text)
        return parse_hermes(text.removesuffix(stop_text) if stop_text else text, self.tools)


def parse_hermes(body: str, tools: list[ToolSpec]) -> TurnResult:
    """A turn in the Hermes/Qwen format: one ``<tool_call>`` JSON object -> a tool turn whose
    payload is the call's single argument; no tool call -> the final answer."""
    calls = _TOOL_CALL.findall(body)
    if not calls:
        if TOOL_CALL_OPEN in body:
            return TurnResult("invalid", body, error=f"{TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}")
        return TurnResult("final", body.strip())
    if len(calls) > 1:
        return TurnResult("invalid", body, error=f"{len(calls)} tool calls in one turn; one per turn is supported")
    try:
        call = json.loads(calls[0])
    except json.JSONDecodeError as err:
        return TurnResult("invalid", body, error=f"{TOOL_CALL_OPEN} is not valid JSON: {err.msg} at column {err.colno}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return TurnResult("invalid", body, error=f"{TOOL_CALL_OPEN} needs a JSON object with a string 'name'")
    by_name = {t.name: t for t in tools}
    if call["name"] not in by_name:
        known = ", ".join(sorted(by_name)) or "none"
        return TurnResult("invalid", body, error=f"unknown tool {call['name']!r} (tools: {known})")
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    spec = by_name[call["name"]]
    if not isinstance(args, dict) or not isinstance(args.get(spec.argument), str):
        return TurnResult("invalid", body, error=f"tool {spec.name!r} needs arguments {{{spec.argument!r}: string}}")
    return TurnResult("tool", args[spec.argument])
