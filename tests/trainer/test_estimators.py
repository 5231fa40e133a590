"""verl's critic-free advantage estimators (`rl_config.adv_estimator`): each against a hand computation,
their invariants as properties, the config / import refusals, and one run through the megatron worker
(reinforce_plus_plus with the KL in the reward at context parallel 2: per-token advantages end to
end, 2 steps)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from asp_npu.config import Config, validate
from asp_npu.trainer.advantages import (
    gpg,
    group_baseline,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    remax,
    rloo,
)
from asp_npu.trainer.batching import Estimator, batch_advantages, batch_to_samples
from asp_npu.trainer.losses import group_advantages
from asp_npu.types import TrainBatch, Trajectory

FIXTURE = Path(__file__).parents[1] / "deploy" / "fixtures" / "grpo_qwen25_7b_A3.yaml"


def _traj(pid: str, i: int, reward: float, n: int, mask: list[int] | None = None) -> Trajectory:
    return Trajectory(pid, i, [1, 2], [3] * n, [-1.0] * n, "stop", reward, 0, loss_mask=mask or [])


# ------------------------------------------------------------------ hand computations
def test_rloo_is_the_reward_less_the_mean_of_the_others() -> None:
    adv = rloo([1.0, 0.0, 0.5, 0.7], ["a", "a", "a", "b"])
    # a: 1 - (0 + 0.5)/2, 0 - (1 + 0.5)/2, 0.5 - (1 + 0)/2;  b: a group of one keeps its reward (verl)
    assert adv.tolist() == pytest.approx([0.75, -0.75, 0.0, 0.7])


def test_gpg_rescales_by_the_share_of_non_zero_rewards() -> None:
    adv = gpg([1.0, 0.0, 0.5, 0.0], ["a", "a", "b", "b"])
    alpha = 4 / 2  # 4 samples, 2 with a non-zero reward
    assert adv.tolist() == pytest.approx([alpha * 0.5, alpha * -0.5, alpha * 0.25, alpha * -0.25])
    assert gpg([0.0, 0.0], ["a", "a"]).tolist() == [0.0, 0.0]  # no non-zero reward: alpha = 2 / max(0, 1)


def test_reinforce_plus_plus_baseline_whitens_over_the_tokens() -> None:
    # a: rewards 1, 0 with 2 and 1 trained tokens -> 0.5, -0.5; b: 0.5, 0.5 (1 and 2 tokens) -> 0, 0
    # tokens: 0.5 0.5 -0.5 0 0 0: mean 1/12, deviations 5/12 (x2), -7/12, -1/12 (x3), 5 degrees of freedom
    var = (2 * (5 / 12) ** 2 + (7 / 12) ** 2 + 3 * (1 / 12) ** 2) / 5
    sd = math.sqrt(var)
    adv = reinforce_plus_plus_baseline([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"], [2, 1, 1, 2])
    assert adv.tolist() == pytest.approx([(5 / 12) / sd, (-7 / 12) / sd, (-1 / 12) / sd, (-1 / 12) / sd],
                                         rel=1e-6)


def test_reinforce_plus_plus_discounts_then_whitens_every_token() -> None:
    # gamma 0.5: returns [0.25, 0.5, 1] and [0.25, 0.5]; mean 0.5, unbiased variance 0.375 / 4
    a1, a2 = reinforce_plus_plus([[0.0, 0.0, 1.0], [0.0, 0.5]], [[1, 1, 1], [1, 1]], gamma=0.5)
    sd = math.sqrt(0.375 / 4)
    assert a1.tolist() == pytest.approx([-0.25 / sd, 0.0, 0.5 / sd], rel=1e-6)
    assert a2.tolist() == pytest.approx([-0.25 / sd, 0.0], rel=1e-6)


def test_reinforce_plus_plus_returns_run_through_untrained_tokens() -> None:
    # gamma 1: returns [1, 1, 1] and [2, 2]; the masked middle token is left out of the statistics and
    # gets 0, but the first token still sees the reward behind it
    a1, a2 = reinforce_plus_plus([[0.0, 0.0, 1.0], [0.0, 2.0]], [[1, 0, 1], [1, 1]])
    flat = np.array([1.0, 1.0, 2.0, 2.0])
    z = (flat - flat.mean()) / flat.std(ddof=1)
    assert a1.tolist() == pytest.approx([z[0], 0.0, z[1]], rel=1e-6)
    assert a2.tolist() == pytest.approx([z[2], z[3]], rel=1e-6)


def test_remax_is_the_return_less_the_greedy_baseline() -> None:
    a1, a2 = remax([[0.0, 0.0, 1.0], [0.1, 0.0, 0.5]], [0.4, 0.2])
    assert a1.tolist() == pytest.approx([0.6, 0.6, 0.6])
    assert a2.tolist() == pytest.approx([0.6 - 0.2, 0.3, 0.3])
    with pytest.raises(ValueError, match="2 samples and 1 baselines"):
        remax([[1.0], [1.0]], [0.0])


def test_batch_advantages_dispatches_with_the_kl_in_the_reward() -> None:
    trajs = [_traj("p", 0, 1.0, 2), _traj("p", 1, 0.0, 2), _traj("q", 0, 1.0, 1), _traj("q", 1, 1.0, 1)]
    batch = TrainBatch(trajs, 2)
    pen = {0: [0.1, 0.2], 1: [0.0, 0.4], 2: [0.3], 3: [0.0]}
    # outcome estimators see the summed token rewards: 0.7, -0.4, 0.7, 1.0
    assert batch_advantages(batch, Estimator("rloo"), pen) == pytest.approx([1.1, -1.1, -0.3, 0.3])
    # gpg: every score is non-zero, alpha 1: the group baseline
    assert batch_advantages(batch, Estimator("gpg"), pen) == pytest.approx([0.55, -0.55, -0.15, 0.15])
    # reinforce_plus_plus, gamma 1: each token's return = reward - the penalties from it on
    rows = batch_advantages(batch, Estimator("reinforce_plus_plus"), pen)
    rets = np.array([0.7, 0.8, -0.4, -0.4, 0.7, 1.0])
    z = (rets - rets.mean()) / rets.std(ddof=1)
    assert [x for r in rows for x in r] == pytest.approx(z.tolist(), rel=1e-6)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="trajectory p/0 has no reward_baseline: adv_estimator remax needs"):
        batch_advantages(batch, Estimator("remax"))


def test_remax_through_the_dispatch_is_each_token_return_less_its_prompt_greedy_reward() -> None:
    trajs = [_traj("p", 0, 1.0, 2), _traj("p", 1, 0.0, 2), _traj("q", 0, 0.5, 1), _traj("q", 1, 1.0, 3)]
    for t, b in zip(trajs, (0.25, 0.25, 1.0, 1.0), strict=True):
        t.reward_baseline = b
    batch = TrainBatch(trajs, 2)
    # no KL: the outcome reward sits on the last token, every token's return is the reward; minus b
    assert batch_advantages(batch, Estimator("remax")) == [[0.75, 0.75], [-0.25, -0.25], [-0.5], [0.0] * 3]
    # KL in the reward: token returns 1-0.1-0.2 = 0.7 | 1-0.2 = 0.8, 0-0.4 | 0, 0.5-0.3, 1-0.3 | 1-0.3 | 1
    pen = {0: [0.1, 0.2], 1: [0.0, 0.4], 2: [0.3], 3: [0.0, 0.3, 0.0]}
    got = batch_advantages(batch, Estimator("remax"), pen)
    want = [[0.7 - 0.25, 0.8 - 0.25], [-0.4 - 0.25, -0.4 - 0.25], [0.2 - 1.0], [0.7 - 1.0, 0.7 - 1.0, 0.0]]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w)
    samples, _ = batch_to_samples(batch, False, Estimator("remax"))
    assert [s.advantage for s in samples] == [[0.75, 0.75], [-0.25, -0.25], [-0.5], [0.0] * 3]


def test_remax_baseline_tokens_are_counted_once_per_group() -> None:
    from asp_npu.pipeline.recorder import baseline_metrics

    trajs = [_traj("p@0", 0, 1.0, 2), _traj("p@0", 1, 0.0, 3), _traj("q@0", 0, 0.5, 1)]
    assert baseline_metrics(trajs) == {}  # no remax: no metric
    for t, n in zip(trajs, (7, 7, 4), strict=True):
        t.reward_baseline, t.baseline_len = 0.5, n
    assert baseline_metrics(trajs) == {"rollout/baseline_tokens": 11.0}


def test_samples_carry_per_token_advantages_for_token_level_estimators() -> None:
    batch = TrainBatch([_traj("p", 0, 1.0, 3), _traj("p", 1, 0.0, 2)], 2)
    samples, _ = batch_to_samples(batch, False, Estimator("reinforce_plus_plus", gamma=0.5))
    assert [len(s.advantage) for s in samples] == [3, 2]  # type: ignore[arg-type]
    samples, _ = batch_to_samples(batch, False, Estimator("rloo"))
    assert [s.advantage for s in samples] == [1.0, -1.0]


# ------------------------------------------------------------------ invariants
groups = st.lists(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=6), min_size=1,
                  max_size=5)


def _flat(gs: list[list[float]]) -> tuple[list[float], list[int]]:
    return [r for g in gs for r in g], [k for k, g in enumerate(gs) for _ in g]


@settings(max_examples=150, deadline=None)
@given(groups)
def test_rloo_baselines_are_leave_one_out(gs: list[list[float]]) -> None:
    r, ids = _flat(gs)
    adv = rloo(r, ids)
    base = np.asarray(r) - adv
    for k, g in enumerate(gs):
        idx = [i for i, x in enumerate(ids) if x == k]
        if len(g) == 1:
            assert adv[idx[0]] == g[0]
            continue
        assert base[idx].sum() == pytest.approx(sum(g), abs=1e-9)  # every reward used n-1 times / (n-1)
        assert adv[idx].sum() == pytest.approx(0.0, abs=1e-9)
        n = len(g)
        dr = group_advantages(g, [0] * n, norm_by_std=False)  # Dr.GRPO's r - mean
        assert adv[idx] == pytest.approx(dr * n / (n - 1), abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(groups, st.data())
def test_whitened_estimators_have_token_mean_0_and_std_1(gs: list[list[float]], data: Any) -> None:
    r, ids = _flat(gs)
    tokens = data.draw(st.lists(st.integers(0, 5), min_size=len(r), max_size=len(r)))
    adv = reinforce_plus_plus_baseline(r, ids, tokens)
    flat = np.repeat(adv, tokens)
    base = np.repeat(group_baseline(r, ids), tokens)
    assert all(a == 0.0 for a, n in zip(adv, tokens, strict=True) if n == 0)
    if flat.size >= 2 and base.std() > 1e-2:  # well above the 1e-8 added to the std
        assert flat.mean() == pytest.approx(0.0, abs=1e-9)
        assert flat.std(ddof=1) == pytest.approx(1.0, rel=1e-6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=6), min_size=1, max_size=5),
       st.floats(0, 1), st.data())
def test_reinforce_plus_plus_whitens_the_trained_tokens(rows: list[list[float]], gamma: float,
                                                        data: Any) -> None:
    masks = [data.draw(st.lists(st.integers(0, 1), min_size=len(x), max_size=len(x))) for x in rows]
    adv = reinforce_plus_plus(rows, masks, gamma)
    on = np.concatenate([a[np.asarray(m, dtype=bool)] for a, m in zip(adv, masks, strict=True)])
    off = np.concatenate([a[~np.asarray(m, dtype=bool)] for a, m in zip(adv, masks, strict=True)])
    assert (off == 0).all()
    raw = [sum(gamma ** (s - t) * x[s] for s in range(t, len(x))) for x, m in zip(rows, masks, strict=True)
           for t in range(len(x)) if m[t]]
    if on.size >= 2 and np.std(raw) > 1e-2:  # well above the 1e-8 added to the std
        assert on.mean() == pytest.approx(0.0, abs=1e-7)
        assert on.std(ddof=1) == pytest.approx(1.0, rel=1e-5)


@settings(max_examples=150, deadline=None)
@given(groups)
def test_gpg_is_the_group_baseline_scaled_to_the_signal(gs: list[list[float]]) -> None:
    r, ids = _flat(gs)
    m = max(int(np.count_nonzero(r)), 1)
    assert (gpg(r, ids) * m / len(r)).tolist() == pytest.approx(group_baseline(r, ids).tolist(), abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(groups)
def test_group_norm_through_the_dispatch_is_grpo(gs: list[list[float]]) -> None:
    r, ids = _flat(gs)
    trajs = [_traj(f"p{k}", i, x, 2) for i, (x, k) in enumerate(zip(r, ids, strict=True))]
    got = batch_advantages(TrainBatch(trajs, 1), Estimator())
    assert got == pytest.approx(group_advantages(r, ids).tolist(), abs=1e-12)


# ------------------------------------------------------------------ config and import
@pytest.mark.parametrize(("rl", "line"), [
    ({"adv_estimator": "rlo"}, "rl_config.adv_estimator: 'rlo' is not one of group_norm, gae, rloo, "
     "reinforce_plus_plus, reinforce_plus_plus_baseline, gpg, remax (did you mean 'rloo'?)"),
    ({"adv_estimator": "grpo"}, "(did you mean 'group_norm'?)"),
    ({"adv_estimator": "remax", "gamma": 0.9}, "rl_config.gamma: 0.9 has no effect with adv_estimator remax"),
    ({"adv_estimator": "rloo", "gamma": 0.9}, "rl_config.gamma: 0.9 has no effect with adv_estimator rloo"),
    ({"adv_estimator": "gpg", "norm_adv_by_std_in_grpo": False},
     "rl_config.norm_adv_by_std_in_grpo: false has no effect with adv_estimator gpg"),
])
def test_config_refuses_an_estimator_it_cannot_honour_in_one_line(rl: dict[str, Any], line: str) -> None:
    cfg = Config()
    for k, v in rl.items():
        setattr(cfg.rl_config, k, v)
    found = [p for p in validate(cfg) if p.startswith("rl_config.")]
    assert len(found) == 1 and line in found[0], found


@pytest.mark.parametrize("name", ["rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg",
                                  "remax"])
def test_config_accepts_every_estimator(name: str) -> None:
    cfg = Config()
    cfg.rl_config.adv_estimator = name
    cfg.rl_config.gamma = 0.99 if name == "reinforce_plus_plus" else 1.0
    assert not [p for p in validate(cfg) if p.startswith("rl_config.")]


def _import(tmp_path: Path, value: str) -> tuple[int, Path]:
    from asp_npu.cli import main as cli_main

    ms = OmegaConf.to_container(OmegaConf.load(FIXTURE))
    ms["rl_config"]["adv_estimator"] = value  # type: ignore[index]
    src, out = tmp_path / FIXTURE.name, tmp_path / "ours.yaml"
    src.write_text(OmegaConf.to_yaml(OmegaConf.create(ms)))
    args = ["import-config", "mindspeed-rl", str(src), "--out", str(out), "--mode", "mindspeed-sync"]
    return cli_main(args), out


@pytest.mark.parametrize(("value", "ours"), [
    ("rloo", "rloo"), ("reinforce_plus_plus", "reinforce_plus_plus"),
    ("reinforce_plus_plus_baseline", "reinforce_plus_plus_baseline"), ("gpg", "gpg"), ("remax", "remax"),
    ("grpo", "group_norm"), ("group_norm", "group_norm")])
def test_import_maps_verl_and_mindspeed_estimator_names(tmp_path, capsys, value: str, ours: str) -> None:
    from asp_npu.config import load_config

    rc, out = _import(tmp_path, value)
    assert rc == 0
    assert load_config(str(out), check=False).rl_config.adv_estimator == ours
    assert "not mapped: rl_config.adv_estimator" not in capsys.readouterr().out


@pytest.mark.parametrize(("value", "says"), [("opo", "'opo' is not an estimator asp-npu runs")])
def test_import_refuses_an_estimator_asp_npu_cannot_run(tmp_path, capsys, value: str, says: str) -> None:
    rc, out = _import(tmp_path, value)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0] and "rl_config.adv_estimator" in err[0]
    assert not out.exists()


# ------------------------------------------------------------------ through the megatron worker (CPU)
RPP = {"adv_estimator": "reinforce_plus_plus", "gamma": 0.9, "use_kl_in_reward": True, "kl_coef": 0.05,
       "kl_penalty": "kl"}


def _rpp_job(rank: int, world: int, port: int, model_dir: str) -> dict[str, Any]:
    """Two reinforce_plus_plus steps with the KL in the reward, context parallel over `world` ranks;
    before the second, the per-token advantages the loss receives (every CP rank's chunks gathered back
    to whole sequences) and what a hand computation needs to redo them."""
    from asp_npu.trainer.context_parallel import gather_sequence
    from asp_npu.trainer.worker import TrainerWorker
    from tests.trainer.helpers import make_batch, trainer_config

    cfg = trainer_config(Path(model_dir), **RPP)
    cfg.actor_config.context_parallel_size = world
    w = TrainerWorker(cfg, rank, world, master_port=port)
    metrics = [w.train_step(make_batch(seed=0))]  # moves the policy off the reference: KL > 0
    batch = make_batch(seed=1)
    samples, _ = batch_to_samples(batch, False, w.estimator)
    micro, ref, prox, _ = w._update_inputs(batch, samples, w.kl_ctrl.value)
    seen: dict[int, dict[str, list[float]]] = {}
    for k, mb in enumerate(micro):
        adv, mask, logp, rf = (gather_sequence(x) for x in (mb["adv"], mb["mask"], prox[k], ref[k]))
        for j, idx in enumerate(mb["index"].tolist()):
            on = mask[j] > 0
            seen[idx] = {"adv": adv[j][on].tolist(), "logp": logp[j][on].tolist(), "ref": rf[j][on].tolist()}
    beta = w.kl_ctrl.value
    metrics.append(w.train_step(batch))
    return {"seen": seen, "beta": beta, "rewards": [t.reward for t in batch.trajectories],
            "metrics": metrics}


@pytest.mark.slow
def test_reinforce_plus_plus_with_the_kl_in_the_reward_trains_through_the_worker(tmp_path) -> None:
    from tests.trainer.helpers import make_hf_model, run_ranks

    model = str(make_hf_model(tmp_path / "m", tied=True))
    outs = run_ranks(2, _rpp_job, model, timeout=400)  # context parallel 2: the KL rows gathered
    for key in ("loss", "kl_reward_penalty", "grad_norm"):  # both CP ranks report the reduced step
        assert [m[key] for m in outs[0]["metrics"]] == [m[key] for m in outs[1]["metrics"]], key
    out = outs[0]
    seen, beta, rewards = out["seen"], out["beta"], out["rewards"]
    assert sorted(seen) == list(range(len(rewards)))
    # by hand: r_t = -beta (logp_t - ref_t), plus the reward on the last token; G_t = r_t + 0.9 G_{t+1};
    # whitened over every response token of the minibatch
    rets = {}
    for i, s in seen.items():
        g, row = 0.0, []
        last = len(s["logp"]) - 1
        for t in range(last, -1, -1):
            g = -beta * (s["logp"][t] - s["ref"][t]) + (rewards[i] if t == last else 0.0) + 0.9 * g
            row.insert(0, g)
        rets[i] = row
    flat = np.concatenate([rets[i] for i in sorted(rets)])
    mean, sd = flat.mean(), flat.std(ddof=1)
    kl_spread = max(abs(a - b) for s in seen.values() for a, b in zip(s["logp"], s["ref"], strict=True))
    assert kl_spread > 1e-4  # the penalty is there to see
    for i, s in seen.items():
        assert s["adv"] == pytest.approx(((np.asarray(rets[i]) - mean) / sd).tolist(), abs=2e-5), i
    m = out["metrics"]
    assert all(math.isfinite(x["loss"]) and math.isfinite(x["grad_norm"]) for x in m)
    assert abs(m[0]["kl_reward_penalty"]) < 1e-9 and abs(m[1]["kl_reward_penalty"]) > 1e-6
    assert len({x["loss"] for x in m}) == 2


def test_the_cli_refuses_a_misspelt_estimator_with_exit_2(tmp_path, monkeypatch, capsys) -> None:
    from asp_npu.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    assert cli_main(["train", "rl_config.adv_estimator=reinforce_plus_plus_baselin"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'reinforce_plus_plus_baseline'?" in err[0], err
    assert list(tmp_path.iterdir()) == []
