"""Every loss formula against hand computations on hand-built batches, with finite gradients everywhere.

The references below are written per token with Python floats from the formulas of verl's
`core_algos.py` (clamps, dual clip, `agg_loss`, `kl_penalty`, `compute_grpo_outcome_advantage`,
`AdaptiveKLController`) and MindSpeed-RL's `compute_kl_penalty`; `policy_loss` must match them
and keep NaN / inf out of every gradient, whatever sits at a masked position.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asp_npu.config import Config, validate
from asp_npu.trainer.batching import Sample, agg_norm, batch_to_samples, make_micro_batches, shard_for_dp
from asp_npu.trainer.losses import (
    LOSS_AGG_MODES,
    AggNorm,
    KLController,
    LossConfig,
    group_advantages,
    kl_penalty,
    policy_loss,
    row_weights,
    sequence_kl,
    vocab_parallel_entropy,
)
from asp_npu.types import TrainBatch, Trajectory

E = math.exp
JUNK = (float("nan"), float("inf"), -float("inf"), 1e30, -1e30)


def _t(rows: list[list[float]], dtype: torch.dtype = torch.float32, grad: bool = False) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype, requires_grad=grad)


def _finite_grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(loss), loss
    assert torch.isfinite(g).all(), g
    return g


# ------------------------------------------------------------------ policy term: clips and dual clip
def test_both_clip_bounds_both_advantage_signs_and_the_dual_clip():
    lo, hi, c = 0.2, 0.28, 3.0
    cfg = LossConfig(clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c, importance_cap=0.0)
    # (log r, A): above 1+hi with A>0 (clipped), below 1-lo with A<0 (clipped), above with A<0
    # (unclipped), below with A>0 (unclipped), inside, r=5 with A=-1 (dual clip: 3, no gradient)
    cases = [(0.5, 1.0), (-0.5, -1.0), (0.5, -2.0), (-0.5, 0.5), (0.1, 1.5), (math.log(5.0), -1.0)]
    logp = _t([[lr for lr, _ in cases]], grad=True)
    adv = _t([[a for _, a in cases]])
    zeros = torch.zeros_like(adv)
    loss, stats = policy_loss(logp, zeros, zeros, adv, torch.ones_like(adv), cfg, norm=1.0)
    g = _finite_grad(loss, logp)
    r = [E(lr) for lr, _ in cases]
    want = [-1.0 * (1 + hi), 1.0 * (1 - lo), 2.0 * r[2], -0.5 * r[3], -1.5 * r[4], 3.0]
    want_g = [0.0, 0.0, 2.0 * r[2], -0.5 * r[3], -1.5 * r[4], 0.0]
    assert loss.item() == pytest.approx(sum(want), rel=1e-6)
    assert g[0].tolist() == pytest.approx(want_g, rel=1e-6, abs=1e-7)
    assert stats["clipped"].item() == 2  # the two tokens past a clip bound on their advantage's side
    assert stats["clipped_lower"].item() == 1  # the dual clip bound once (r=5 > 3 with A<0)


def test_the_issues_examples_log_ratio_30_and_ratio_5():
    """A log-ratio of 30 with A=-1 gave a loss of 1.07e13; r=5, A=-1 gave loss 5, gradient 5 (verl: 3, 0)."""
    adv = _t([[-1.0]])
    mask = torch.ones(1, 1)
    for lr, dual, want, want_g in ((30.0, 3.0, 3.0, 0.0), (math.log(5.0), 3.0, 3.0, 0.0),
                                   (30.0, 0.0, E(20.0), 0.0), (math.log(5.0), 0.0, 5.0, 5.0)):
        logp = _t([[lr]], grad=True)
        loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.zeros(1, 1), adv, mask,
                              LossConfig(clip_ratio_c=dual, importance_cap=0.0))
        g = _finite_grad(loss, logp)
        assert (loss.item(), g.item()) == pytest.approx((want, want_g), rel=1e-6)


def test_two_behaviour_versions_in_one_sample_weight_each_token_against_its_own():
    # tokens 0-1 sampled by version v-2 (far from the proximal policy), 2-3 by v-1 (close to it)
    prox = [-1.0, -2.0, -0.5, -1.5]
    behav = [-3.0, -2.5, -0.6, -1.4]
    cap = 2.0
    cfg = LossConfig(importance_cap=cap, clip_ratio_c=0.0)
    logp = _t([prox], grad=True)  # on-policy w.r.t. the proximal policy: r = 1
    adv = _t([[1.0, 1.0, -1.0, -1.0]])
    loss, stats = policy_loss(logp, _t([prox]), _t([behav]), adv, torch.ones(1, 4), cfg, norm=4.0)
    w = [min(E(p - b), cap) for p, b in zip(prox, behav, strict=True)]
    assert w[0] == cap and w[1] < cap  # the old version's first token is truncated
    assert loss.item() == pytest.approx((-w[0] - w[1] + w[2] + w[3]) / 4, rel=1e-6)
    g = _finite_grad(loss, logp)
    assert g[0].tolist() == pytest.approx([-w[0] / 4, -w[1] / 4, w[2] / 4, w[3] / 4], rel=1e-6)
    assert stats["iw_truncated"].item() == 1
    raw = sum(E(p - b) for p, b in zip(prox, behav, strict=True))
    assert stats["iw_sum"].item() == pytest.approx(raw, rel=1e-6)


def test_importance_cap_zero_means_no_correction_and_the_config_agrees():
    logp = _t([[-1.0, -2.0]], grad=True)
    loss, _ = policy_loss(logp, logp.detach(), logp.detach() - 5.0, _t([[1.0, 1.0]]), torch.ones(1, 2),
                          LossConfig(importance_cap=0.0), norm=2.0)
    assert loss.item() == pytest.approx(-1.0)  # w = 1 although pi_prox / pi_b = e^5
    cfg = Config()
    cfg.rl_config.importance_cap = 0.0
    assert not [p for p in validate(cfg) if "importance_cap" in p]
    cfg.rl_config.importance_cap = -1.0
    assert [p for p in validate(cfg) if "importance_cap" in p]


# ------------------------------------------------------------------ masked positions: nothing leaks
@pytest.mark.parametrize("junk", JUNK)
@pytest.mark.parametrize("kind", ["low_var_kl", "kl", "mse", "abs"])
def test_junk_at_masked_positions_changes_nothing(junk, kind):
    cfg = LossConfig(kl_coef=0.3, kl_penalty=kind, entropy_coeff=0.01, importance_cap=2.0)
    clean = {"logp": [[-1.0, -2.0, -0.7, 0.0]], "prox": [[-1.1, -1.8, -0.7, 0.0]],
             "behav": [[-1.3, -1.9, -0.9, 0.0]], "adv": [[0.7, -1.2, 0.4, 0.0]],
             "ref": [[-0.9, -2.5, -0.6, 0.0]], "ent": [[1.0, 2.0, 0.5, 0.0]]}
    mask = _t([[1.0, 1.0, 1.0, 0.0]])
    results = []
    for fill in (0.0, junk):
        data = {k: _t([[*v[0][:3], fill]]) for k, v in clean.items()}
        logp = data["logp"].clone().requires_grad_(True)
        loss, stats = policy_loss(logp, data["prox"], data["behav"], data["adv"], mask, cfg, 3.0, data["ref"],
                               entropy=data["ent"])
        g = _finite_grad(loss, logp)
        assert g[0, 3].item() == 0.0  # exactly 0 at the masked position, never 0 * inf
        results.append((loss.item(), g.tolist(), {k: float(v) for k, v in stats.items()}))
    assert results[0] == results[1]


def test_the_issues_masked_k3_gradient_is_zero_not_nan():
    """kl_penalty at d = 95 (fp32 exp overflows) on a masked position: gradient [-1, nan] before."""
    logp = _t([[-1.0, -100.0]], grad=True)
    ref = _t([[-1.0, -5.0]])  # d = ref - logp = 95 at the masked position
    loss, _ = policy_loss(logp, logp.detach(), logp.detach(), _t([[1.0, 1.0]]), _t([[1.0, 0.0]]),
                          LossConfig(kl_coef=1.0, importance_cap=0.0), 1.0, ref)
    g = _finite_grad(loss, logp)
    assert g[0].tolist() == [-1.0, 0.0]


# ------------------------------------------------------------------ KL estimators at any |d|
def _kl_ref(logp: float, ref: float, kind: str) -> tuple[float, float]:
    """(value, d value / d logp) by hand, verl's clamps included."""
    d = ref - logp
    if kind in ("low_var_kl", "k3"):
        dc = max(-20.0, min(20.0, d))
        raw = E(dc) - dc - 1.0
        inside = -20.0 < d < 20.0 and -10.0 < raw < 10.0
        return max(-10.0, min(10.0, raw)), (1.0 - E(dc)) if inside else 0.0
    if kind in ("kl", "k1"):
        return -d, 1.0
    if kind == "abs":
        return abs(d), -math.copysign(1.0, d) if d else 0.0
    return 0.5 * d * d, -d  # mse / k2


D_VALUES = [-1000.0, -95.0, -20.5, -3.0, -0.25, 0.0, 0.25, 3.0, 19.5, 95.0, 1000.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs"])
def test_every_kl_kind_up_to_1e3_is_finite_with_finite_gradients(kind, dtype):
    logp = torch.zeros(1, len(D_VALUES), dtype=dtype, requires_grad=True)
    ref = torch.tensor([D_VALUES], dtype=dtype)  # d = ref - logp; the reference uses the bf16-rounded d
    kl = kl_penalty(logp, ref, kind)
    g = _finite_grad(kl.sum(), logp)
    assert torch.isfinite(kl).all()
    for j, d in enumerate(ref[0].float().tolist()):
        want, want_g = _kl_ref(0.0, d, kind)
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        assert kl[0, j].float().item() == pytest.approx(want, rel=tol, abs=tol), (kind, d)
        assert g[0, j].float().item() == pytest.approx(want_g, rel=tol, abs=tol), (kind, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_policy_loss_gradients_are_finite_at_extreme_log_ratios(dtype):
    vals = [-1000.0, -95.0, -30.0, 0.0, 30.0, 95.0, 1000.0]
    logp = torch.tensor([vals], dtype=dtype, requires_grad=True)
    zeros = torch.zeros(1, len(vals), dtype=dtype)
    for adv in (1.0, -1.0):
        for c in (3.0, 0.0):
            cfg = LossConfig(kl_coef=0.5, clip_ratio_c=c)
            loss, stats = policy_loss(logp, zeros, -logp.detach(), torch.full_like(zeros, adv),
                                   torch.ones_like(zeros), cfg, 7.0, -logp.detach())
            _finite_grad(loss, logp)
            assert all(math.isfinite(float(v)) for v in stats.values())


# ------------------------------------------------------------------ group advantages
def test_group_advantages_verl_cases():
    # all-equal groups: zero advantage (no signal), both with and without std normalisation
    assert group_advantages([1.0, 1.0, 1.0], "aaa").tolist() == [0.0, 0.0, 0.0]
    assert group_advantages([2.0, 2.0], "bb", norm_by_std=False).tolist() == [0.0, 0.0]
    # a group of one: mean 0, std 1, so its advantage is its reward (verl), not 0
    assert group_advantages([0.7], ["x"]).tolist() == pytest.approx([0.7 / (1 + 1e-6)])
    assert group_advantages([0.7], ["x"], norm_by_std=False).tolist() == [0.7]
    # Dr.GRPO (norm_adv_by_std_in_grpo false): r - mean
    dr = group_advantages([1.0, 0.0, 0.5], "ggg", norm_by_std=False)
    assert dr.tolist() == pytest.approx([0.5, -0.5, 0.0])
    std = np.std([1.0, 0.0, 0.5], ddof=1)
    assert group_advantages([1.0, 0.0, 0.5], "ggg").tolist() == pytest.approx(
        [0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.0])


def test_all_equal_groups_give_no_policy_gradient():
    trajs = [Trajectory("p", i, [1, 2], [3, 4, 5], [-1.0, -1.0, -1.0], "stop", 1.0, 0) for i in range(4)]
    samples, _ = batch_to_samples(TrainBatch(trajs, 4), drop_equal_groups=False)
    mb = make_micro_batches(samples, 4)[0]
    logp = torch.full(mb["mask"].shape, -1.0, requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach(), mb["behav"], mb["adv"], mb["mask"], LossConfig(),
                          agg_norm(samples, Config()), resp_len=mb["resp_len"])
    assert loss.item() == 0.0 and _finite_grad(loss, logp).abs().max().item() == 0.0


# ------------------------------------------------------------------ aggregation over the minibatch
def _agg_ref(per_seq: list[list[float]], mode: str, scale: float) -> float:
    n = len(per_seq)
    if mode == "token-mean":
        return sum(map(sum, per_seq)) / sum(map(len, per_seq))
    if mode == "seq-mean-token-sum":
        return sum(map(sum, per_seq)) / n
    if mode == "seq-mean-token-mean":
        return sum(sum(x) / len(x) for x in per_seq) / n
    return sum(map(sum, per_seq)) / (n * scale)


def test_row_weights_by_hand():
    lens = torch.tensor([2, 3, 0])  # a padding row weighs nothing
    norm = AggNorm(tokens=5.0, seqs=2.0, scale=8.0)
    assert row_weights(lens, "token-mean", norm).tolist() == pytest.approx([1 / 5, 1 / 5, 0])
    assert row_weights(lens, "seq-mean-token-sum", norm).tolist() == pytest.approx([1 / 2, 1 / 2, 0])
    assert row_weights(lens, "seq-mean-token-mean", norm).tolist() == pytest.approx([1 / 4, 1 / 6, 0])
    assert row_weights(lens, "seq-mean-token-sum-norm", norm).tolist() == pytest.approx([1 / 16, 1 / 16, 0])
    with pytest.raises(ValueError, match="loss_agg_mode"):
        row_weights(lens, "seq-sum", norm)


def _batch(lengths: list[tuple[int, int]], group: int, rng: np.random.Generator) -> TrainBatch:
    trajs = [Trajectory(f"p{i // group}", i % group, [7] * p, [9] * r,
                        [float(np.float32(x)) for x in rng.uniform(-3, -0.1, r)], "stop",
                        float(rng.integers(0, 3)), 0) for i, (p, r) in enumerate(lengths)]
    return TrainBatch(trajs, group)


def _run_layout(samples: list[Sample], theta: torch.Tensor, cfg: LossConfig, norm: AggNorm, dp: int, mbs: int,
                budget: int) -> tuple[float, torch.Tensor]:
    """Loss and d loss / d theta summed over every rank's micro-batches; theta[i, t] is sample i's log-prob
    at sequence position t (a stand-in for the model), so every layout sees the same per-token values."""
    total = torch.zeros((), dtype=torch.float64)
    for rank in range(dp):
        for mb in make_micro_batches(shard_for_dp(samples, dp, rank), mbs, budget):
            seq = mb["mask"].shape[1]
            logp = theta[mb["index"], :seq]
            prox = logp.detach() - 0.15  # ratio e^0.15, inside the clip bounds
            ref = logp.detach() + 0.4
            loss, _ = policy_loss(logp, prox, mb["behav"].double(), mb["adv"].double(), mb["mask"], cfg, norm,
                                  ref, mb["resp_len"])
            total = total + loss
    (g,) = torch.autograd.grad(total, theta)
    return float(total), g


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(LOSS_AGG_MODES), st.integers(1, 3), st.data())
def test_every_aggregation_mode_is_the_whole_minibatch_whatever_the_layout(mode, group, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    n = group * data.draw(st.integers(1, 4))
    lengths = [(data.draw(st.integers(1, 5)), data.draw(st.integers(1, 9))) for _ in range(n)]
    samples, _ = batch_to_samples(_batch(lengths, group, rng), drop_equal_groups=False)
    cfg = LossConfig(loss_agg_mode=mode, kl_coef=0.2, clip_ratio_c=3.0, importance_cap=1.5)
    cfg_ = Config()
    cfg_.generate_config.sampling_config.max_tokens = 16
    norm = agg_norm(samples, cfg_)
    longest = max(s.length for s in samples)
    theta = torch.tensor(rng.uniform(-4, -0.1, (len(lengths), longest)), requires_grad=True)
    # the reference: per-token losses of each sample by hand, aggregated in one piece
    per_seq = []
    for s in samples:
        toks = []
        for t in range(s.prompt_len - 1, s.length):
            lp = float(theta[s.index, t].detach())
            r, a = E(0.15), float(np.float32(s.advantage))  # the micro-batch holds it in fp32
            pg = max(-a * r, -a * min(max(r, 0.8), 1.28))
            pg = min(pg, -a * 3.0) if a < 0 else pg
            w = min(E(lp - 0.15 - s.behaviour[t - s.prompt_len + 1]), 1.5)
            toks.append(w * pg + 0.2 * _kl_ref(lp, lp + 0.4, "low_var_kl")[0])
        per_seq.append(toks)
    want = _agg_ref(per_seq, mode, 16.0)
    layouts = [(1, 64, 0), (1, 1, 0), (2, 2, 0), (3, 1, 0), (2, 1, 24)]
    results = [_run_layout(samples, theta, cfg, norm, *lay) for lay in layouts]
    for loss, grad in results:
        assert loss == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert torch.allclose(grad, results[0][1], rtol=1e-9, atol=1e-13)
        assert torch.isfinite(grad).all()


# ------------------------------------------------------------------ KL in the reward, adaptive control
def test_sequence_kl_sums_each_rows_response_tokens():
    logp = _t([[-1.0, -2.0, 5.0], [-0.5, 0.0, 0.0]])
    ref = _t([[-1.5, -1.0, -99.0], [-0.5, 0.0, 0.0]])
    mask = _t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sequence_kl(logp, ref, mask, "kl").tolist() == pytest.approx([0.5 - 1.0, 0.0])
    k3 = [E(d) - d - 1 for d in (-0.5, 1.0)]
    assert sequence_kl(logp, ref, mask, "low_var_kl").tolist() == pytest.approx([sum(k3), 0.0], rel=1e-6)


def test_kl_in_the_reward_moves_advantages_as_verl_does():
    """verl: token_level_rewards = scores - beta * kld, GRPO on their sum: r_i - beta * sum_t kld_i,t."""
    from asp_npu.trainer.batching import batch_advantages

    trajs = [Trajectory("p", i, [1], [2, 3], [-1.0, -1.0], "stop", 1.0, 0) for i in range(3)]
    b = TrainBatch(trajs, 3)
    kl_sums = {0: 0.0, 1: 2.0, 2: 4.0}
    beta = 0.1
    adv = batch_advantages(b, penalties={i: [0.0, beta * v] for i, v in kl_sums.items()})  # per token
    shaped = [1.0, 0.8, 0.6]
    std = np.std(shaped, ddof=1)
    assert adv == pytest.approx([(x - 0.8) / (std + 1e-6) for x in shaped])
    # the equal raw rewards carry signal once the KL is in them; a KL-in-reward loss has no KL term
    logp = _t([[-1.0, -1.0]], grad=True)
    loss, stats = policy_loss(logp, logp.detach(), logp.detach(), _t([[0.0, 0.0]]), torch.ones(1, 2),
                           LossConfig(kl_coef=0.5, use_kl_in_reward=True), 2.0, _t([[-3.0, -3.0]]))
    assert loss.item() == 0.0 and stats["kl"].item() > 0  # measured, not in the loss


def test_adaptive_kl_controller_follows_its_formula_over_recorded_kl():
    recorded = [0.05, 0.2, 0.1, 1.0, 0.0, 0.11]  # per step: mean over sequences of per-token KL
    target, horizon, n = 0.1, 100.0, 16
    ctrl = KLController(0.5, "adaptive", target, horizon)
    value, got = 0.5, []
    for kl in recorded:
        err = min(0.2, max(-0.2, kl / target - 1))
        value *= 1 + err * n / horizon
        got.append(ctrl.update(kl, n))
    assert got == pytest.approx([value_k for value_k in _by_hand(0.5)], rel=1e-12)
    assert got[-1] == pytest.approx(value, rel=1e-12)
    fixed = KLController(0.5, "fixed")
    assert [fixed.update(kl, n) for kl in recorded] == [0.5] * len(recorded)


def _by_hand(v: float) -> list[float]:
    """The same trajectory written out: errors -0.5->-0.2, 1->0.2, 0, 9->0.2, -1->-0.2, 0.1; n/h = 0.16."""
    out = []
    for err in (-0.2, 0.2, 0.0, 0.2, -0.2, 0.1):
        v *= 1 + err * 0.16
        out.append(v)
    return out


# ------------------------------------------------------------------ entropy
def test_entropy_matches_torch_and_ignores_vocabulary_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11) * 4
    want = torch.distributions.Categorical(logits=logits[..., :9]).entropy()
    padded = logits.clone()
    padded[..., 9:] = torch.tensor([1e30, float("nan")])  # junk in the padding columns
    got = vocab_parallel_entropy(padded, pad_from=9)
    assert torch.allclose(got, want, atol=1e-5)
    x = logits.clone().requires_grad_(True)
    g = _finite_grad(vocab_parallel_entropy(x).sum(), x)
    x2 = logits.clone().requires_grad_(True)
    (g2,) = torch.autograd.grad(torch.distributions.Categorical(logits=x2).entropy().sum(), x2)
    assert torch.allclose(g, g2, atol=1e-5)
    extreme = torch.tensor([[[1e4, -1e4, 0.0]]], requires_grad=True)
    _finite_grad(vocab_parallel_entropy(extreme).sum(), extreme)


def test_entropy_coeff_rewards_entropy():
    logp = _t([[-1.0, -1.0]], grad=True)
    ent = _t([[2.0, 1.0]])
    loss, stats = policy_loss(logp, logp.detach(), logp.detach(), _t([[0.0, 0.0]]), torch.ones(1, 2),
                           LossConfig(entropy_coeff=0.1), 2.0, entropy=ent)
    assert loss.item() == pytest.approx(-0.1 * 1.5) and stats["entropy"].item() == pytest.approx(3.0)


# ------------------------------------------------------------ a padded extreme trains to the same weights
class _TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.emb = torch.nn.Embedding(13, 8)
        self.out = torch.nn.Linear(8, 13)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.out(torch.tanh(self.emb(ids)))
        logp = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return logp, vocab_parallel_entropy(logits)


def _train(batch: dict[str, torch.Tensor], junk: bool) -> dict[str, torch.Tensor]:
    model = _TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    cfg = LossConfig(kl_coef=0.2, entropy_coeff=0.01, loss_agg_mode="seq-mean-token-mean")
    norm = AggNorm(tokens=float(batch["mask"].sum()), seqs=2.0, scale=8.0)
    for _ in range(3):
        logp, ent = model(batch["ids"], batch["labels"])
        if junk:  # extreme values at the padded position: log-prob, entropy and every input
            pad = batch["mask"] == 0
            logp = torch.where(pad, torch.full_like(logp, -1e30), logp)
            ent = torch.where(pad, torch.full_like(ent, float("inf")), ent)
        loss, _ = policy_loss(logp, batch["prox"], batch["behav"], batch["adv"], batch["mask"], cfg, norm,
                              batch["ref"], batch["resp_len"], ent)
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_batch_with_an_extreme_padded_position_trains_to_the_same_weights():
    base: dict[str, Any] = {
        "ids": torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]]),
        "labels": torch.tensor([[2, 3, 4, 5], [6, 7, 8, 0]]),
        "mask": _t([[0, 1, 1, 1], [0, 1, 1, 0]]), "adv": _t([[0, 1.0, 1.0, 1.0], [0, -1.0, -1.0, 0]]),
        "prox": _t([[0, -2.6, -2.5, -2.7], [0, -2.4, -2.6, 0]]),
        "behav": _t([[0, -2.5, -2.6, -2.6], [0, -2.5, -2.7, 0]]),
        "ref": _t([[0, -2.5, -2.5, -2.5], [0, -2.5, -2.5, 0]]), "resp_len": torch.tensor([3, 2]),
    }
    junk = dict(base)
    for k, v in (("adv", float("nan")), ("prox", 1e30), ("behav", -float("inf")), ("ref", float("inf"))):
        junk[k] = base[k].clone()
        junk[k][1, 3] = v
    clean = _train(base, junk=False)
    dirty = _train(junk, junk=True)
    for name, w in clean.items():
        assert torch.equal(w, dirty[name]), name


# ------------------------------------------------------------------ config validation
def test_validate_refuses_nucleus_sampling_with_the_correction_on_and_a_bad_dual_clip():
    cfg = Config()
    cfg.generate_config.sampling_config.top_p = 0.9
    problems = validate(cfg)
    assert any(p.startswith("generate_config.sampling_config.top_p: 0.9 < 1 with rl_config.importance_cap")
               for p in problems)
    cfg.rl_config.importance_cap = 0.0
    assert not [p for p in validate(cfg) if "top_p" in p]
    cfg.rl_config.clip_ratio_c = 1.0
    assert [p for p in validate(cfg) if p.startswith("rl_config.clip_ratio_c: must be > 1")]
    cfg.rl_config.clip_ratio_c = 0.0
    cfg.rl_config.loss_agg_mode, cfg.rl_config.kl_ctrl_type = "seq-sum", "pid"
    bad = validate(cfg)
    assert [p for p in bad if p.startswith("rl_config.loss_agg_mode: 'seq-sum' is not one of")]
    assert [p for p in bad if p.startswith("rl_config.kl_ctrl_type: 'pid' is not one of")]
    cfg.rl_config.loss_agg_mode, cfg.rl_config.kl_ctrl_type = "seq-mean-token-mean", "adaptive"
    cfg.rl_config.entropy_coeff, cfg.rl_config.kl_penalty = 0.01, "abs"
    assert validate(cfg) == []
