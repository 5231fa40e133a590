"""DAPO and validation end to end on CPU: real vLLM instance, megatron-core trainer, Ray queue, through
`asp-npu train` on a freshly built tiny model, in the asynchronous `asp` mode and the colocated
`mindspeed-sync` mode.

Dynamic sampling on (with overlong shaping, which makes the untrained model's groups equal: every
response runs into the buffer), `filter_groups_max_batches=2`: the run checks from what it recorded that
every trainer step took exactly `mini_batch_size` samples, no group was trained twice, no filtered
group was trained, every planned group is trained, filtered or was still unfinished at the end (none
lost), the filter cap held and every trained sample is within the lag bound. `trainer.test_freq=2`
writes validation reward and accuracy per data source into metrics.jsonl and `asp-npu report` (a
colocated run validates when its engines wake with new weights: after the iteration's last step).

Two more features ride on these runs (a real run is most of a test's cost). The `mindspeed-sync` run's
model is a tiny Qwen3-MoE (`model.architecture=qwen3-moe`, built by the run): vLLM generates with it and
megatron-core's MoE layers train it (their auxiliary loss in every step's metrics). The `asp` run trains
LoRA adapters (`actor_config.lora_r`) on every megatron linear layer instead of the whole model: its
steps and refreshes (instances move to new versions, merged weights) and its saved checkpoint (the
adapters and their optimizer state only, never the frozen base) are checked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from asp_npu.cli import main as cli_main
from asp_npu.core import run_dir as rd
from asp_npu.observe.metrics import read_metrics
from tests.pipeline.test_e2e import OVERRIDES

pytestmark = pytest.mark.slow

ITERS, WINDOW, G, MB = 2, 6, 4, 8  # 6 prompts x 4 samples per window = 3 steps of 8 samples
DAPO = ["rl_config.drop_equal_reward_groups=true", "rl_config.filter_groups_max_batches=2",
        "rl_config.overlong_buffer_enable=true", "rl_config.overlong_buffer=8",
        "rl_config.overlong_buffer_penalty_factor=1.0"]
VAL = ["trainer.test_freq=2", "data.val_num_prompts=4"]
LORA = ["actor_config.lora_r=4", "actor_config.lora_alpha=8",
        "actor_config.lora_target_modules=[linear_qkv,linear_proj,linear_fc1,linear_fc2]",
        "actor_config.lr=1e-3", f"trainer.save_freq={ITERS}"]


MOE = ["model.architecture=qwen3-moe", "trainer.save_freq=0"]
EXTRA = {"asp": LORA, "mindspeed-sync": MOE}


def dapo_run(root: Path, mode: str) -> Path:
    """`asp-npu train` with DAPO and validation on a fresh tiny model under `root` (LoRA in mode `asp`,
    a Qwen3-MoE model in mode `mindspeed-sync`); the run directory."""
    from asp_npu.data.init_model import build_model_dir

    model = root / "tiny"
    if mode != "mindspeed-sync":  # the MoE model is built by the run itself (`model.build_if_missing`)
        build_model_dir(model, "tiny", seed=0)
    run = root / "run"
    rc = cli_main(["train", "--config", "configs/cpu_tiny.yaml", *OVERRIDES, f"rl_config.mode={mode}",
                   "generate_config.num_instances=1", f"trainer.train_iters={ITERS}",
                   "trainer.logger=[jsonl]", f"model.path={model}",
                   f"trainer.run_dir={run}", *DAPO, *VAL, *EXTRA[mode]])
    assert rc == 0
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each mode's run, made once for this module when a test first asks for it."""
    made: dict[str, Path] = {}

    def get(mode: str) -> Path:
        if mode not in made:
            made[mode] = dapo_run(tmp_path_factory.mktemp("dapo"), mode)
        return made[mode]

    return get


@pytest.fixture(scope="module", params=["asp", "mindspeed-sync"])
def run(request, runs) -> Path:
    return runs(request.param)


def _planned(run: Path) -> list[str]:
    out = []
    for plan in sorted((run / rd.PLANS).glob("*.json")):
        for inst in json.loads(plan.read_text())["instances"]:
            for unit in inst["units"]:
                out += sorted({s["prompt_id"] for s in unit["samples"]})
    return out


def test_dynamic_sampling_keeps_every_minibatch_whole(run):
    summary = json.loads((run / rd.SUMMARY).read_text())
    samples = [json.loads(line) for line in (run / rd.SAMPLES).read_text().splitlines()]
    steps = ITERS * WINDOW * G // MB
    assert summary["steps"] == steps
    per_step: dict[int, int] = {}
    for s in samples:
        per_step[s["trainer_step"]] = per_step.get(s["trainer_step"], 0) + 1
        assert 0 <= s["step"] - s["policy_version"] <= summary["max_lag"], s  # lag within its bound
    assert sorted(per_step) == list(range(steps)) and set(per_step.values()) == {MB}
    rows = [r for r in read_metrics(run / rd.METRICS) if "dynamic_sampling/minibatch_samples" in r]
    assert len(rows) == steps and {r["dynamic_sampling/minibatch_samples"] for r in rows} == {MB}
    consumed, filtered = summary["consumed_group_ids"], summary["filtered_group_ids"]
    assert len(consumed) == len(set(consumed)) == steps * MB // G  # none trained twice
    assert len(filtered) == len(set(filtered)) and not set(consumed) & set(filtered)
    trained = {f"{s['prompt_id']}@{s['epoch']}" for s in samples}
    assert trained == set(consumed)
    planned = _planned(run)
    assert len(planned) == len(set(planned)) and set(consumed) | set(filtered) <= set(planned)
    budget = (2 - 1) * WINDOW * ITERS
    assert 0 < len(filtered) <= budget  # the untrained model's groups are filtered, up to the cap
    assert len(planned) <= ITERS * WINDOW + budget  # replacements: at most max_batches windows each
    assert rows[-1]["dynamic_sampling/filtered_groups"] == len(filtered)
    assert rows[-1]["dynamic_sampling/filtered_fraction"] == pytest.approx(
        len(filtered) / (len(filtered) + len(consumed)))


def test_validation_per_data_source_in_metrics_and_report(run, capsys):
    val = [r for r in read_metrics(run / rd.METRICS) if "val/samples" in r]
    colocated = json.loads((run / rd.SUMMARY).read_text())["mode"] == "mindspeed-sync"
    # every test_freq (2) steps and after the last; a colocated run when its engines wake (3 steps a window)
    assert [r["step"] for r in val] == ([3, 6] if colocated else [2, 4, 6])
    if colocated:  # woken engines hold the newest weights
        assert [r["val/weights_step"] for r in val] == [3, 6]
    for r in val:
        assert r["val/samples"] == 4  # greedy, n=1: one sample per held-out prompt
        sources = [k for k in r if k.startswith("val/reward/") and k != "val/reward/all"]
        assert sources == ["val/reward/asp/count"]
        assert -1.0 <= r["val/reward/all"] <= 1.0 and 0.0 <= r["val/acc/all"] <= 1.0
    assert cli_main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count("validation: step") == 2 * len(val)  # asp/count and all, per validated step
    assert "asp/count  reward" in out and (run / rd.REPORT).stat().st_size > 0


def test_lora_run_trains_and_refreshes(runs):
    run = runs("asp")
    summary = json.loads((run / rd.SUMMARY).read_text())
    rows = [r for r in read_metrics(run / rd.METRICS) if "actor/grad_norm" in r]
    assert summary["steps"] >= 2 and len(rows) == summary["steps"]
    # the untrained tiny model's groups often score alike (zero advantages, zero gradient): the adapter
    # gradients themselves are checked in tests/trainer/test_lora.py
    assert all(math.isfinite(r["actor/grad_norm"]) and math.isfinite(r["actor/loss"]) for r in rows)
    samples = [json.loads(line) for line in (run / rd.SAMPLES).read_text().splitlines()]
    assert max(s["policy_version"] for s in samples) >= 1  # instances generated with refreshed weights


def test_lora_checkpoint_holds_only_the_adapters(runs):
    from torch.distributed.checkpoint import FileSystemReader

    run = runs("asp")
    dist = sorted((run / rd.CHECKPOINTS).glob("iter_*/dist"))
    assert dist, list((run / rd.CHECKPOINTS).iterdir())
    keys = list(FileSystemReader(str(dist[-1])).read_metadata().state_dict_metadata)
    model = [k for k in keys if not k.startswith("optimizer")]
    assert model and all("lora_" in k for k in model), model[:5]
    assert any("lora_" in k for k in keys if k.startswith("optimizer"))


def test_the_moe_model_generates_and_trains(runs):
    run = runs("mindspeed-sync")
    assert json.loads((run.parent / "tiny" / "config.json").read_text())["model_type"] == "qwen3_moe"
    aux = [r[k] for r in read_metrics(run / rd.METRICS) for k in r if k.endswith("moe_aux_loss")]
    assert aux and all(a > 0 for a in aux)
