"""Tools for multi-turn rollouts: the registry, and the sandbox cutting a tool that hangs, spins, floods
its output, eats memory or crashes, each with a recorded reason and within its limit."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from asp_npu.errors import UserError
from asp_npu.rollout import tools
from asp_npu.rollout.tools import SandboxLimits, call_tool, register, run_sandboxed

LIM = SandboxLimits(timeout_s=2.0, cpu_s=1, memory_mb=256, output_bytes=1000)


def run(coro):
    return asyncio.run(coro)


def test_calculator_is_exact_on_long_numbers():
    a, b = 123456789012345678901234567890, 987654321987654321
    r = run(call_tool("calculator", {"expression": f"{a}*{b} + 7"}, 10))
    assert r.ok and r.text == str(a * b + 7)
    assert run(call_tool("calculator", {"expression": "(7 - 10) // 2"}, 10)).text == "-2"


@pytest.mark.parametrize("expr", ["__import__('os').system('true')", "x + 1", "2**10**10", "open('f')"])
def test_calculator_refuses_anything_but_arithmetic(expr):
    r = run(call_tool("calculator", {"expression": expr}, 10))
    assert r.error == "bad_arguments" and r.text.startswith("error:")


def test_python_tool_returns_what_it_printed():
    r = run(call_tool("code_interpreter", {"code": "print(sum(range(101)))"}, 10))
    assert r.ok and r.text == "5050"


def test_a_hanging_tool_is_cut_at_its_wall_timeout():
    t0 = time.perf_counter()
    r = run(run_sandboxed("python", "import time; time.sleep(60)", LIM))
    assert r.error == "timeout" and "timed out" in r.text
    assert time.perf_counter() - t0 < LIM.timeout_s + 5


def test_a_spinning_tool_is_cut_at_its_cpu_limit():
    r = run(run_sandboxed("python", "while True: pass", SandboxLimits(120.0, 1, 256, 1000)))
    assert r.error == "timeout" and "CPU time limit" in r.text  # RLIMIT_CPU, long before the wall clock


def test_a_flooding_tool_is_cut_at_its_output_cap():
    r = run(run_sandboxed("python", "while True: print('x' * 100)", LIM))
    assert r.error == "output_cap" and len(r.text) < 100 and r.seconds < LIM.timeout_s


def test_memory_and_crashes_are_recorded_errors():
    assert run(run_sandboxed("python", "x = bytearray(10**9)", LIM)).text == "error: MemoryError"
    r = run(run_sandboxed("python", "1/0", LIM))
    assert r.error == "crash" and "ZeroDivisionError" in r.text


def test_a_child_started_by_a_tool_dies_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\ntime.sleep(60)")
    r = run(run_sandboxed("python", code, LIM))
    assert r.error == "timeout"
    stat = Path(f"/proc/{pid_file.read_text()}/stat")
    time.sleep(0.2)
    assert not stat.exists() or stat.read_text().split()[2] == "Z"  # gone, or a zombie awaiting reaping


def test_plain_callables_by_name_and_their_failures():
    register("t_echo", lambda text: text.upper(), "echo")

    async def slow(**_: object) -> str:
        await asyncio.sleep(5)
        return "late"

    register("t_slow", slow)
    register("t_boom", lambda: 1 / 0)
    assert run(call_tool("t_echo", {"text": "hi"}, 1)).text == "HI"
    assert run(call_tool("t_slow", {}, 0.2)).error == "timeout"
    assert run(call_tool("t_boom", {}, 1)).error == "crash"
    assert run(call_tool("t_echo", {"nope": 1}, 1)).error == "bad_arguments"
    assert run(call_tool("t_echo", ["x"], 1)).error == "bad_arguments"
    assert run(call_tool("missing", {}, 1)).error == "unknown_tool"
    assert tools.get_tool("t_echo").schema()["function"]["name"] == "t_echo"
    with pytest.raises(UserError):
        tools.get_tool("missing")
    with pytest.raises(UserError):
        register("bad name!", lambda: "")
