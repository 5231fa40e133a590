"""What start-up derives lives in a `RunDerived` record, never in the config: the config the fleet and
every start of the controller hold is the one loaded (the same object, equal to a fresh load), while
the record holds the warm-started / converted policy, the trainer ranks' cores and threads and the
checkpoint a restart resumes from. Fast: no Ray, no engines."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from asp_npu.config import load_config, to_dict
from asp_npu.core import run_dir as rd
from asp_npu.core.modes import mode_spec
from asp_npu.pipeline.derived import CONVERTED, MODEL_PATH, WARM_STARTED, RunDerived
from asp_npu.trainer.start import RankStart

PKG = Path(__file__).resolve().parents[2] / "asp_npu"
# where `with_changes` means a different run (bench modes, calibrate's modes), not this run's derivation
DIFFERENT_RUN = {"pipeline/bench.py", "pipeline/calibrate.py"}


def _fleet(monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> tuple[Any, Any]:
    from asp_npu.pipeline.fleet import Fleet

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))  # an 8-core node
    cfg = load_config(None, overrides)
    return cfg, Fleet(cfg, "cpu", mode_spec(cfg.rl_config.mode, cfg.generate_config.admission))


def test_placement_is_derived_beside_the_config(monkeypatch):
    cfg, fleet = _fleet(monkeypatch, ["rl_config.mode=asp"])
    assert fleet.cfg is cfg and to_dict(fleet.cfg) == to_dict(load_config(None, ["rl_config.mode=asp"]))
    assert cfg.actor_config.cpu_cores == "" and cfg.actor_config.num_threads == 0
    assert fleet.placement.disjoint
    d = fleet.derived
    assert d.trainer_cores == tuple(fleet.placement.trainer_cores) and d.trainer_threads >= 1
    assert fleet.placement_summary()["trainer_cores"] == list(d.trainer_cores)
    assert d.rank_start() == RankStart(cfg.model.path, "", d.trainer_cores, d.trainer_threads)


def test_the_users_cores_and_threads_win(monkeypatch):
    cfg, fleet = _fleet(monkeypatch, ["rl_config.mode=asp", "actor_config.cpu_cores=5",
                                      "actor_config.num_threads=3"])
    assert (fleet.derived.trainer_cores, fleet.derived.trainer_threads) == ((5,), 3)
    assert fleet.cfg is cfg


def test_a_colocated_trainer_shares_every_core(monkeypatch):
    cfg, fleet = _fleet(monkeypatch, ["rl_config.mode=mindspeed-sync"])
    assert fleet.derived.trainer_cores == () and fleet.derived.trainer_threads == 8
    assert fleet.cfg is cfg and cfg.actor_config.num_threads == 0


def test_without_a_derivation_the_ranks_start_from_the_config():
    cfg = load_config(None, ["actor_config.cpu_cores=1,2", "actor_config.num_threads=2",
                             "model.load_megatron=/m"])
    assert RankStart.of(cfg) == RankStart(cfg.model.path, "/m", (1, 2), 2)
    assert RunDerived.at_start(cfg).rank_start() == RankStart.of(cfg)


class _Run:
    """The part of a RunDir `run_controller` touches."""

    def __init__(self, path: Path) -> None:
        self.path, self.checkpoints = path, path / rd.CHECKPOINTS
        self.continued: list[int] = []

    def continue_from(self, step: int) -> None:
        self.continued.append(step)


def test_warm_start_and_restart_never_touch_the_config(monkeypatch, tmp_path):
    """run_controller: a warm-started run whose trainer fails once restarts from its last checkpoint;
    both starts get the loaded config unchanged and the derived policy and resume point."""
    from asp_npu.pipeline import resume, train
    from asp_npu.trainer import sft

    cfg = load_config(None, ["model.warm_start_steps=3", "trainer.max_restarts=1"])
    loaded = to_dict(cfg)
    run = _Run(tmp_path)
    monkeypatch.setattr(sft, "warm_start", lambda c, out_dir, steps, start: {"evals": []})
    monkeypatch.setattr(resume, "last_checkpoint", lambda root: Path(root) / "iter_0000002")
    monkeypatch.setattr(train, "checkpoint_step", lambda load: 2 if load else 0)
    starts: list[tuple[Any, RunDerived]] = []

    def attempt(c: Any, derived: RunDerived, *_args: Any) -> dict[str, Any] | None:
        starts.append((c, derived))
        return None if len(starts) == 1 else {"ok": True}

    monkeypatch.setattr(train, "_attempt", attempt)
    assert train.run_controller(cfg, run, [], "cpu", False, "") == {"ok": True}  # type: ignore[arg-type]
    assert [c for c, _ in starts] == [cfg, cfg] and all(c is cfg for c, _ in starts)
    assert to_dict(cfg) == loaded and cfg.model.warm_start_steps == 3 and cfg.actor_config.load == ""
    first, again = starts[0][1], starts[1][1]
    assert (first.policy_path, first.policy_from, first.resume_from) == \
        (str(tmp_path / rd.WARM_START), WARM_STARTED, "")
    assert again.policy_path == first.policy_path and again.resume_from == str(run.checkpoints)
    assert run.continued == [2]


def test_converted_megatron_weights_are_the_policy(monkeypatch, tmp_path):
    from asp_npu.pipeline import train
    from asp_npu.trainer import hf_export

    cfg = load_config(None, ["model.load_megatron=/megatron"])
    monkeypatch.setattr(hf_export, "megatron_to_hf_folder", lambda src, hf, out: Path(out))
    d = train.initial_policy(_Run(tmp_path), RunDerived.at_start(cfg))  # type: ignore[arg-type]
    assert (d.policy_path, d.policy_from, d.megatron) == (str(tmp_path / "initial_policy"), CONVERTED, "")
    assert cfg.model.load_megatron == "/megatron"
    resumed = RunDerived.at_start(load_config(None, ["model.load_megatron=/m", "actor_config.load=/c"]))
    kept = train.initial_policy(_Run(tmp_path), resumed)  # type: ignore[arg-type]
    assert kept == resumed and kept.policy_from == MODEL_PATH  # a resumed run loads its checkpoint


def test_the_recorder_writes_the_record_beside_the_config(monkeypatch, tmp_path):
    from asp_npu.core.shape import RunShape
    from asp_npu.pipeline.recorder import Recorder
    from asp_npu.pipeline.train import config_yaml

    cfg = load_config(None, [f"trainer.run_dir={tmp_path / 'run'}", "trainer.logger=[]"])
    run = rd.RunDir.create(cfg.trainer.run_dir, config_yaml(cfg))
    derived = RunDerived.at_start(cfg).with_policy("/w", WARM_STARTED).placed((2, 3), 2)
    rec = Recorder(cfg, run, RunShape.from_config(cfg, 4, mode_spec(cfg.rl_config.mode)), "", False, derived)
    try:
        assert yaml.safe_load((run / rd.DERIVED).read_text()) == derived.to_dict()
        assert (run / rd.CONFIG).read_text() == config_yaml(load_config(None, [
            f"trainer.run_dir={tmp_path / 'run'}", "trainer.logger=[]"]))
    finally:
        rec.close()


def test_no_pipeline_module_derives_by_changing_the_config():
    """Only a different run (a bench mode, a calibration mode) may be a changed copy of the config."""
    offenders = []
    for p in sorted((PKG / "pipeline").glob("*.py")):
        rel = str(p.relative_to(PKG))
        tree = ast.parse(p.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if "with_changes" in names and rel not in DIFFERENT_RUN:
            offenders.append(rel)
    assert not offenders, f"derive into pipeline/derived.py's RunDerived instead: {offenders}"
