"""Tools a multi-turn rollout calls by name: plain Python callables in a registry, two of them shipped.

A tool is `fn(**arguments) -> str` (or a coroutine function returning `str`), registered under a name
with an optional OpenAI-style JSON schema of its arguments (`register`). `call_tool(name, arguments,
timeout_s)` runs it on the caller's event loop (a sync callable in a worker thread), never raises, and
returns a `ToolResult`: the text the model sees, and `error` -- "" on success, else one of `ERRORS` --
with a one-line reason in the text. A callable that outlives its timeout is abandoned (its thread cannot
be killed: register untrusted code through `run_sandboxed`).

Shipped, both in a sandbox (`run_sandboxed`): a fresh `python -I -S` process per call, its own process
group, `RLIMIT_CPU` / `RLIMIT_AS` / `RLIMIT_FSIZE` set in the child before the code runs (soft = hard,
so the code cannot raise them), stdout+stderr to a file capped at `output_bytes` (a flood ends the
write with EFBIG), the wall-clock timeout enforced by the parent, which kills the whole group:
- `calculator(expression)`: integer/float arithmetic (+ - * / // % ** and parentheses) through a
  whitelist over Python's AST -- exact on numbers of any length, no names, no calls;
- `code_interpreter(code)`: runs Python code, returns what it printed (MindSpeed-RL's ReTool name).
The sandbox bounds time, memory and output; it is not a security boundary against a hostile model
(no namespaces, the network is reachable): use it for CPU tasks and tests, a real sandbox service in
production.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asp_npu.errors import UserError

ToolFn = Callable[..., Any]  # -> str | ToolResult, or a coroutine of one
ERRORS = ("unknown_tool", "bad_arguments", "timeout", "crash", "output_cap")


@dataclass(frozen=True)
class Tool:
    name: str
    fn: ToolFn
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)  # JSON schema of the arguments

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (what a chat template's `tools=` takes)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model sees (output, or "error: <reason>")
    error: str = ""  # "" = success, else one of ERRORS
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error


REGISTRY: dict[str, Tool] = {}


def register(name: str, fn: ToolFn, description: str = "",
             parameters: Mapping[str, Any] | None = None) -> Tool:
    """Register `fn` as tool `name` (replacing one of that name); returns the Tool."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise UserError(f"tool name '{name}': use letters, digits, '_' and '-'")
    tool = Tool(name, fn, description, dict(parameters or {}))
    REGISTRY[name] = tool
    return tool


def get_tool(name: str) -> Tool:
    tool = REGISTRY.get(name)
    if tool is None:
        raise UserError(f"tool '{name}' is not registered (known: {', '.join(sorted(REGISTRY)) or 'none'})")
    return tool


async def call_tool(name: str, arguments: Any, timeout_s: float) -> ToolResult:
    """Run tool `name` with `arguments` (a dict) within `timeout_s`; every failure is a ToolResult."""
    t0 = time.perf_counter()

    def done(text: str, error: str = "") -> ToolResult:
        return ToolResult(text, error, time.perf_counter() - t0)

    tool = REGISTRY.get(name)
    if tool is None:
        return done(f"error: no tool named '{name}'", "unknown_tool")
    if not isinstance(arguments, Mapping):
        return done(f"error: arguments of '{name}' must be an object", "bad_arguments")
    try:
        if inspect.iscoroutinefunction(tool.fn):
            call: Awaitable[Any] = tool.fn(**arguments)
        else:
            call = asyncio.to_thread(tool.fn, **arguments)
        out = await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        return done(f"error: '{name}' timed out after {timeout_s:g}s", "timeout")
    except TypeError as exc:
        return done(f"error: bad arguments for '{name}': {exc}", "bad_arguments")
    except Exception as exc:
        return done(f"error: '{name}' failed: {type(exc).__name__}: {exc}", "crash")
    if isinstance(out, ToolResult):
        return ToolResult(out.text, out.error, time.perf_counter() - t0)
    return done(str(out))


# ------------------------------------------------------------------------------------------- sandbox
@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock, enforced by the parent (kills the process group)
    cpu_s: int = 5  # RLIMIT_CPU
    memory_mb: int = 512  # RLIMIT_AS
    output_bytes: int = 8192  # stdout + stderr; RLIMIT_FSIZE on the capture file


# The child: limits first, then the request from stdin. `calc` walks a whitelist of AST nodes.
_CHILD = r"""
import ast, json, operator as op, resource, sys
lim = json.loads(sys.argv[1])
for key, v in (("RLIMIT_CPU", lim["cpu_s"]), ("RLIMIT_AS", lim["as_bytes"]), ("RLIMIT_FSIZE", lim["fsize"])):
    resource.setrlimit(getattr(resource, key), (v, v))
req = json.loads(sys.stdin.read())
if req["kind"] == "calc":
    ops = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.Div: op.truediv,
           ast.FloorDiv: op.floordiv, ast.Mod: op.mod, ast.Pow: op.pow, ast.USub: op.neg, ast.UAdd: op.pos}
    def ev(n):
        if isinstance(n, ast.Constant) and type(n.value) in (int, float):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Pow) and abs(b) > 4096:
                raise ValueError("exponent too large")
            return ops[type(n.op)](a, b)
        if isinstance(n, ast.UnaryOp) and type(n.op) in ops:
            return ops[type(n.op)](ev(n.operand))
        raise ValueError("only numbers and + - * / // % ** ( ) are allowed")
    try:
        print(ev(ast.parse(str(req["src"]).replace(",", "").strip(), mode="eval").body))
    except Exception as e:
        print("error: %s: %s" % (type(e).__name__, e))
        sys.exit(3)
else:
    exec(compile(req["src"], "<tool>", "exec"), {"__name__": "__main__"})
"""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_sandboxed(kind: str, src: str, limits: SandboxLimits = SandboxLimits()) -> ToolResult:
    """Run `src` (kind "python": code; "calc": an arithmetic expression) in a limited child process."""
    t0 = time.perf_counter()
    lim = {"cpu_s": max(1, int(limits.cpu_s)), "as_bytes": int(limits.memory_mb) << 20,
           "fsize": int(limits.output_bytes) + 1}
    with tempfile.TemporaryDirectory(prefix="asp-tool-") as tmp, open(os.path.join(tmp, "out"), "w+b") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", _CHILD, json.dumps(lim), stdin=asyncio.subprocess.PIPE,
            stdout=out, stderr=out, cwd=tmp, start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1"})
        timed_out = False
        try:
            await asyncio.wait_for(proc.communicate(json.dumps({"kind": kind, "src": src}).encode()),
                                   limits.timeout_s)
        except TimeoutError:
            timed_out = True
        finally:
            _kill_group(proc.pid)  # whatever it started goes with it
            if proc.returncode is None:
                await proc.wait()
        size = os.fstat(out.fileno()).st_size
        out.seek(0)
        text = out.read(limits.output_bytes).decode("utf-8", "replace")
    return _sandbox_result(text, size, proc.returncode, timed_out, limits, time.perf_counter() - t0)


def _sandbox_result(text: str, size: int, rc: int | None, timed_out: bool, limits: SandboxLimits,
                    seconds: float) -> ToolResult:
    if size > limits.output_bytes:
        return ToolResult(f"error: output exceeded {limits.output_bytes} bytes", "output_cap", seconds)
    if timed_out:
        return ToolResult(f"error: timed out after {limits.timeout_s:g}s", "timeout", seconds)
    if rc == -signal.SIGXCPU or rc == -signal.SIGKILL:
        return ToolResult(f"error: CPU time limit ({limits.cpu_s}s) exceeded", "timeout", seconds)
    if rc == 3 and text.startswith("error:"):  # the calculator refused the expression
        return ToolResult(text.strip(), "bad_arguments", seconds)
    if rc != 0:
        last = (text.strip().splitlines() or [f"exit status {rc}"])[-1]
        return ToolResult(last if last.startswith("error:") else f"error: {last}", "crash", seconds)
    return ToolResult(text.rstrip("\n"), "", seconds)


def sandbox_limits(timeout_s: float, memory_mb: int = 512, output_bytes: int = 8192) -> SandboxLimits:
    return SandboxLimits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s + 0.999)), memory_mb=memory_mb,
                         output_bytes=output_bytes)


async def calculator(expression: str) -> ToolResult:
    return await run_sandboxed("calc", str(expression), SANDBOX)


async def code_interpreter(code: str) -> ToolResult:
    return await run_sandboxed("python", str(code), SANDBOX)


SANDBOX = SandboxLimits()  # the shipped tools' limits (their call's timeout_s cuts earlier)

register("calculator", calculator, "Evaluate an arithmetic expression exactly (+ - * / // % ** and "
         "parentheses).", {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]})
register("code_interpreter", code_interpreter, "A tool for executing Python code; returns what it printed.",
         {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]})
