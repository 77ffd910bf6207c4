"""``python-sandbox``: arith-tool's tasks with a Python interpreter as the tool.

The policy's tool call is run by ``learner.tasks.sandbox.run_python`` (its own CPU,
memory and wall-clock limits, no network, every descendant killed): an expression's value
is printed, anything else runs as a program and its output (stdout, then stderr on a
failure) is the observation. The built-in policy's calls (``3*4``) are expressions, so it
trains on this task as it does on arith-tool; a chat model may write whole programs. The
worker runs the call off its agent loop's thread under ``task.tool_timeout_s``
(``learner/rollout/processes/tool_calls.py``).
"""

from __future__ import annotations

from learner.tasks.env import ArithToolEnv, ToolSpec
from learner.tasks.sandbox import run_python


def program_for(call: str) -> str:
    """``call`` as a program: an expression prints its value."""
    try:
        compile(call, "<call>", "eval")  # only parsed here; it runs in the sandbox
    except SyntaxError:
        return call
    return f"print({call})"


def sandbox_tool(program: str) -> str:
    """The observation of running ``program``: its output (stdout, then stderr on a failure),
    and why it was killed if it was (this task's and the data tasks' python-sandbox tool)."""
    result = run_python(program)
    text = result.stdout if result.exit_code == 0 else result.stdout + result.stderr
    return text.strip() + (f" [killed: {result.killed_reason}]" if result.killed_reason else "")


class PythonSandboxEnv(ArithToolEnv):
    name = "python-sandbox"
    pure_history = False  # a real process per call: expensive, and a program may read time, files or randomness
    TOOLS = (ToolSpec("python", "code", "Run a Python program (or evaluate an expression) in a sandbox"),)

    def run_tool(self, call: str) -> str:
        return sandbox_tool(program_for(call))
