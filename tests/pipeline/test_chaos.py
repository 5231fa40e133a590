"""Chaos on CPU with the real engines and trainer: a rollout instance is killed mid-window.

Two vLLM instances, one megatron-core rank, the ASP mode, weights through vLLM's weight-transfer engine
(the default; the object-store path loses and replaces an instance in `test_multinode.py`, where a node
is removed); once the first group arrived, instance 0 is killed (`ray.kill`) while it generates. Its
replacement rejoins during the run or, when the survivor finished the work first, before the run ends
(`Supervisor.settle`), so the recovery is always measured. The run must complete, with every planned
(prompt, sample) generated and consumed exactly once (from `samples.jsonl`), the lag bound held, and
the loss and the recovery in the summary and in `run_log.jsonl`.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from asp_npu.config import load_config
from asp_npu.core import run_dir as rd
from asp_npu.pipeline.recorder import RUN_LOG
from asp_npu.pipeline.train import config_yaml
from tests.pipeline.test_e2e import OVERRIDES, _planned

pytestmark = pytest.mark.slow


def _kill_mid_window(ctl, out: dict) -> None:
    """Kill instance 0 once a group arrived and the instance holds work (at most 300 s)."""
    import ray

    deadline = time.time() + 300
    while time.time() < deadline:
        if ctl.arrivals_seen >= 1 and ctl.policy.inflight[0] and 0 not in ctl.policy.down:
            out["t_kill"] = time.time()
            ray.kill(ctl.fleet.instances[0], no_restart=True)
            return
        time.sleep(0.02)


def test_an_instance_killed_mid_window_is_replaced_and_nothing_is_lost(tmp_path):
    """The weight group is re-formed without the lost instance and again with its replacement."""
    from asp_npu.data.datasets import config_prompts
    from asp_npu.data.init_model import build_model_dir
    from asp_npu.pipeline.controller import Controller

    model = build_model_dir(tmp_path / "tiny", "tiny", seed=0)
    cfg = load_config("configs/cpu_tiny.yaml", [f"model.path={model}", *OVERRIDES, "trainer.train_iters=8",
                                                "generate_config.num_instances=2", "trainer.logger=[jsonl]",
                                                f"trainer.run_dir={tmp_path / 'run'}",
                                                "generate_config.weight_transfer=auto"])
    run = rd.RunDir.create(cfg.trainer.run_dir, config_yaml(cfg))
    ctl = Controller(cfg, run, config_prompts(cfg.data), kind="cpu", console=False)
    killed: dict = {}
    try:
        ctl.start()
        killer = threading.Thread(target=_kill_mid_window, args=(ctl, killed), daemon=True)
        killer.start()
        summary = ctl.run()
    finally:
        ctl.close()
    assert "t_kill" in killed, "instance 0 never held work after the first step"
    fail = summary["failures"]
    log = [json.loads(line) for line in (run / RUN_LOG).read_text().splitlines()]
    assert fail["instances_lost"] == 1 and len(fail["recoveries"]) == 1 and fail["requests_given_up"] == 0, (
        fail, log, killed, summary["wall_s"])
    assert summary["steps"] == 24  # 8 iterations x 6 prompts x 4 samples in steps of 8
    samples = [json.loads(line) for line in (run / rd.SAMPLES).read_text().splitlines()]
    consumed = [(f"{s['prompt_id']}@{s['epoch']}", s["sample_idx"]) for s in samples]
    planned = _planned(run.path)
    assert len(consumed) == len(set(consumed)) == len(planned) == 192
    assert sorted(consumed) == sorted(planned)
    assert all(0 <= s["step"] - s["policy_version"] <= summary["max_lag"] for s in samples)
    lost, back = (next(r for r in log if r["event"] == e) for e in ("instance_lost", "instance_recovered"))
    assert lost["instance"] == back["instance"] == 0 and lost["t"] >= killed["t_kill"]
    assert back["recovery_s"] > 0
    path = summary["weight_transfer"]  # re-formed for the replacement, which then held new weights
    assert path["path"] == "transfer-engine" and path["backend"] == "gloo", path
    assert any(0 in g["members"] for g in path["regroups"]), path
    assert not any(e["event"] == "instance_lost" and e["instance"] != 0 for e in log), log
    up = next(r for r in log if r["event"] == "instance_restarted")
    print(f"\nchaos: detected {lost['t'] - killed['t_kill']:.2f}s after the kill, "
          f"{lost['groups_redispatched']} group(s) re-dispatched, engine up after {up['restart_s']:.1f}s, "
          f"back (current weights in) after {back['recovery_s']:.1f}s, "
          f"run {summary['wall_s']:.1f}s, "
          f"weight-group re-forms {summary['weight_transfer'].get('regroups', [])}")
