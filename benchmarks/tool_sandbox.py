"""Tool sandbox costs and cuts (issue 29): `PYTHONPATH=. python benchmarks/tool_sandbox.py`."""

import asyncio
import statistics
import time

from asp_npu.rollout.tools import SandboxLimits, call_tool, run_sandboxed

CASES = [
    ("hang (sleep 60)", "import time; time.sleep(60)"),
    ("spin (while True)", "while True: pass"),
    ("flood (print loop)", "while True: print('x' * 100)"),
    ("memory (1 GB)", "x = bytearray(10**9)"),
    ("crash (1/0)", "1/0"),
]


async def main() -> None:
    a = 123456789012345678901234567890
    ts = []
    for i in range(20):
        r = await call_tool("calculator", {"expression": f"{a + i}*{a - i}"}, 10)
        assert r.ok
        ts.append(r.seconds)
    print(f"calculator: 20 calls, median {statistics.median(ts) * 1000:.0f} ms, max {max(ts) * 1000:.0f} ms")
    t0 = time.perf_counter()
    rs = await asyncio.gather(*(call_tool("calculator", {"expression": "2*3"}, 10) for _ in range(16)))
    wall = time.perf_counter() - t0
    print(f"16 concurrent calculator calls: {wall:.2f} s wall, all ok={all(r.ok for r in rs)}")
    lim = SandboxLimits(timeout_s=2.0, cpu_s=1, memory_mb=256, output_bytes=8192)
    for name, code in CASES:
        r = await run_sandboxed("python", code, lim)
        print(f"{name}: error={r.error} after {r.seconds:.2f} s: {r.text[:60]!r}")


if __name__ == "__main__":
    asyncio.run(main())
