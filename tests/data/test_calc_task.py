"""The calc task (issue 29): long products a tiny model can only answer through the calculator; its reward
reads what the model wrote after its last call, never the call or the tool's output."""

from __future__ import annotations

from asp_npu.data.rewards import compute_reward
from asp_npu.data.tasks import TASKS, calc_call, make_prompts
from asp_npu.data.tool_format import parse_tool_calls


def test_calc_prompts_and_their_call():
    items = make_prompts("calc", 20, seed=5)
    for it in items:
        a, b = it.text.removeprefix("Compute ").rstrip(".").split("*")
        assert str(int(a) * int(b)) == it.ground_truth and it.meta["data_source"] == "asp/calc"
        (call,) = parse_tool_calls(calc_call(it.text))
        assert (call.name, call.arguments) == ("calculator", {"expression": f"{a}*{b}"})
    assert "calc" not in TASKS and {p.meta["task"] for p in make_prompts("mix", 6)} == set(TASKS)


def test_calc_reward_reads_only_the_answer_after_the_last_call():
    it = make_prompts("calc", 1, seed=7)[0]
    truth, call = str(it.ground_truth), calc_call(it.text)
    assert compute_reward("asp/calc", f"{call}\n{truth}", truth) == 1.0
    assert compute_reward("asp/calc", truth, truth) == 1.0
    assert compute_reward("asp/calc", call, truth) == 0.0  # a call alone answers nothing
    assert compute_reward("asp/calc", f"{truth} {call}\n", truth, partial=False) == 0.0
    wrong = truth[:-1] + str((int(truth[-1]) + 1) % 10)
    assert 0 < compute_reward("asp/calc", f"{call}\n{wrong}", truth) < 1  # partial credit by digit
