"""SIGTERM / SIGINT during `bench real`, `calibrate` and `sft` (issue 30), as
tests/test_bad_input_signals.py does for `train`: each command is cut short at three real signal points
(once its checks pass, before Ray or an engine; its engines or its trainer group starting; mid-work),
then it exits 128 + the signal with one line, no process it started is left, and its working folder is
as it was (no output, no half-written or empty folder).

SIGINT is sent to the whole process group, as Ctrl-C in a terminal does (the engine's own processes
get it too). One real start per case: slow, and kept to three per command.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.test_bad_input_commands import REPO, SMALL
from tests.test_bad_input_signals import BEFORE_RAY, RAY, Command, _title, assert_interrupted, snapshot

CONFIG = f"--config={REPO}/configs/cpu_tiny.yaml"
BENCH = ["bench", "real", CONFIG, "--modes", "asp", "--iterations", "1", "--out-dir", "{ws}/bench",
         "--json", "{ws}/bench.json", *SMALL]
CALIBRATE = ["calibrate", CONFIG, "--out", "{ws}/calib.json", "--quick", "trainer.device=cpu"]
SFT = ["sft", CONFIG, "--out", "{ws}/models/sft", "trainer.device=cpu", "data.num_prompts=4",
       "sft.eval_prompts=4"]
BEFORE_ENGINE = "; starting the engine"  # calibrate's line once its checks pass (pipeline/calibrate.py)

# (command, point) -> (its arguments in the working folder {ws}, what marks the point: a stderr line
# "line:<text>" or a process title under the command, the signal, to the group)
CASES = {
    ("bench real", "before-ray"): (BENCH, f"line:{BEFORE_RAY}", signal.SIGINT, True),
    ("bench real", "engines-starting"): (BENCH, "ray::RolloutInstance", signal.SIGTERM, False),
    ("bench real", "trainer-forming"): (BENCH, "ray::TrainerRank", signal.SIGTERM, False),
    ("calibrate", "before-engine"): (CALIBRATE, f"line:{BEFORE_ENGINE}", signal.SIGTERM, False),
    ("calibrate", "engine-starting"): (CALIBRATE, "VLLM::EngineCore", signal.SIGINT, True),
    # one repeat of the engine's probes at batches 1 and 4 only: the trainer's probe comes sooner
    ("calibrate", "trainer-probe"): ([*CALIBRATE, "--repeats", "1", "generate_config.max_num_seqs=4"],
                                     "ray::TrainerRank", signal.SIGTERM, False),
    ("sft", "before-ray"): ([*SFT, "sft.steps=2"], "line:sft: step 0 exact_match=", signal.SIGINT, True),
    ("sft", "trainer-forming"): ([*SFT, "sft.steps=2"], "ray::TrainerRank", signal.SIGTERM, False),
    ("sft", "training"): ([*SFT, "sft.steps=1000", "sft.batch_size=4", "sft.eval_every=0"],
                          "line:sft: step 10/", signal.SIGTERM, False),
}
NOTHING_BEFORE = {"before-ray": RAY, "before-engine": ("VLLM", *RAY)}  # not started yet at that point


@pytest.mark.slow
@pytest.mark.parametrize("name,point", list(CASES), ids=[f"{n}-{p}" for n, p in CASES])
def test_signal_during_start_up_ends_the_command_and_leaves_nothing(tmp_path: Path, tiny_model_dir: Path,
                                                                      name: str, point: str) -> None:
    args, mark, sig, group = CASES[name, point]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("the user's own file\n")
    before = snapshot(ws)
    cmd = Command([a.replace("{ws}", str(ws)) for a in args] + [f"model.path={tiny_model_dir}"], ws)
    cmd.wait_for(mark)
    if point in NOTHING_BEFORE:  # the line comes before ray.init / the engine: none of it is up yet
        up = [t for t in map(_title, cmd.kids()) if any(r in t for r in NOTHING_BEFORE[point])]
        assert up == [], cmd.stderr()
    rc = cmd.interrupt(sig, group=group)
    assert_interrupted(cmd, name, rc, sig)
    assert snapshot(ws) == before  # no output, no temp, no empty folder made


@pytest.fixture
def installed():
    """`interrupt.install()` in this process for one test; the previous handlers and state after it."""
    from asp_npu import interrupt

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    interrupt.install()
    try:
        yield interrupt
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        interrupt._received.clear()
        interrupt._children.clear()
        interrupt._deferred.clear()


def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.2)  # the handler runs at the next bytecode boundary of the main thread


def test_a_signal_in_a_held_step_lands_once_the_step_is_done(installed) -> None:
    done = []
    with pytest.raises(installed.Interrupted) as exc:
        with installed.held():
            _signal_self(signal.SIGINT)
            done.append("the step ran to its end")
    assert done and exc.value.exit_code == 130 and installed.received() == signal.SIGINT
    with pytest.raises(installed.Interrupted):  # outside a held step it lands at once
        _signal_self(signal.SIGTERM)
        done.append("not reached")
    assert len(done) == 1


def test_a_held_step_failing_on_its_own_keeps_its_error(installed) -> None:
    with pytest.raises(OSError):
        with installed.held():
            _signal_self(signal.SIGTERM)
            raise OSError("disk full")
    assert installed._deferred == []  # not raised later at some unrelated held step


def test_closing_a_loop_blocked_in_a_call_returns_without_raising() -> None:
    """`calibrate` interrupted while its engine is built: the loop thread is still in the engine's
    constructor, and closing it must neither raise nor wait for it."""
    from asp_npu.rollout.engine import LoopThread

    loop = LoopThread()
    loop.loop.call_soon_threadsafe(time.sleep, 3.0)
    t0 = time.time()
    loop.close(0.2)
    assert time.time() - t0 < 1.5
