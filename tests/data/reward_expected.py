"""Each verifier's score on every case of `reward_cases.CASES`, as the reference implementations give it.

Produced by `benchmarks/reward_parity.py --equal math-verify --json` from MindSpeed-RL's
`mindspeed_rl/models/rule_verifier.py` and verl's `verl/utils/reward_score/` (MindSpeed-RL's answer
comparison swapped for math-verify, the one asp-npu uses: see asp_npu/data/verifiers.py), then read
through by hand. `DIFFERENCES` are the cases where asp-npu deliberately scores otherwise, with why.
"""

ORDER = ("acc", "format", "strict_format", "base_acc", "acc_for_dapo", "math_verify_reward", "math_17k_acc",
         "step", "gsm8k", "math", "math_dapo", "math_verify")

EXPECTED: dict[str, tuple[float, ...]] = {
    "r1_int_right": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_int_wrong": (-0.5, 1, 1, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "r1_frac_vs_decimal": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_decimal_vs_frac": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_dfrac": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_frac_short": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_slash_frac": (-0.5, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_negative": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_negative_wrong_sign": (-0.5, 1, 1, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "r1_sqrt": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_sqrt_short": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_sqrt_over_2": (1, 1, 1, 1, -1, 1, 1, 0, 0, 0, -1, 1),
    "r1_pi": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_pi_decimal": (-0.5, 1, 1, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "r1_units_text": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_degrees": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_percent": (1, 1, 1, 1, -1, 0, 1, 0, 0, 1, -1, 0),
    "r1_dollars": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_commas": (1, 1, 1, 1, -1, 1, 1, 0, 0, 0, -1, 1),
    "r1_equation": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_interval": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_tuple": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_set_order": (1, 1, 1, 1, -1, 1, 1, 0, 0, 0, -1, 1),
    "r1_left_right": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_text_answer": (1, 1, 1, 1, -1, 1, 1, 0, 0, 0, -1, 1),
    "r1_expression": (1, 1, 1, 1, -1, 1, 1, 0, 0, 0, -1, 1),
    "r1_two_boxed_last_right": (1, 1, -0.5, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_two_boxed_last_wrong": (-0.5, 1, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "r1_nested_braces": (1, 1, 1, 1, -1, 1, 1, 0, 0, 0, -1, 1),
    "r1_no_boxed": (-1, 1, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 1),
    "r1_empty_boxed": (-1, 1, 1, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "r1_boxed_multiline": (1, 1, -0.5, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_space_after_think": (1, 1, 1, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_newline_after_answer": (1, 1, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "r1_text_after_answer": (1, 0, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "r1_text_before_think": (1, 0, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "r1_trailing_line_after": (1, 1, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "r1_double_think": (1, 1, -0.5, 1, -1, 1, 1, 0, 0, 1, -1, 1),
    "r1_boxed_outside_answer": (1, 0, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "r1_missing_answer_close": (1, 0, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "r1_answer_before_think": (1, 0, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "r1_think_only": (1, 0, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "r1_decimal_trailing_zero": (1, 1, 1, 1, -1, 1, 1, 0, 0, 0, -1, 1),
    "r1_large_number": (1, 1, 1, 1, -1, 1, 1, 0, 0, 0, -1, 1),
    "plain_boxed_right": (1, 0, -0.5, 0, -1, 0, 1, 0, 0, 1, -1, 1),
    "plain_boxed_wrong": (-0.5, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "plain_boxed_space": (1, 0, -0.5, 0, -1, 0, 0, 0, 0, 1, -1, 1),
    "plain_fbox": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "plain_no_answer": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "plain_empty": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "plain_last_number": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 1),
    "plain_the_answer_is": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 1),
    "plain_boxed_unbalanced": (1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "gsm_right": (-1, 0, -0.5, 0, -1, 0, 0, 0, 1, 0, -1, 1),
    "gsm_wrong": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "gsm_commas": (-1, 0, -0.5, 0, -1, 0, 0, 0, 1, 0, -1, 1),
    "gsm_no_space": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 1),
    "gsm_negative": (-1, 0, -0.5, 0, -1, 0, 0, 0, 1, 0, -1, 1),
    "gsm_decimal": (-1, 0, -0.5, 0, -1, 0, 0, 0, 1, 0, -1, 1),
    "gsm_two_marks": (-1, 0, -0.5, 0, -1, 0, 0, 0, 1, 0, -1, 1),
    "gsm_dollar": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 1),
    "dapo_right": (-1, 0, -0.5, 0, 1, 0, 0, 0, 0, 0, 1, 1),
    "dapo_wrong": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 0),
    "dapo_lowercase": (-1, 0, -0.5, 0, 1, 0, 0, 0, 0, 0, 1, 1),
    "dapo_dollar_math": (-1, 0, -0.5, 0, 1, 0, 0, 0, 0, 0, 1, 1),
    "dapo_units": (-1, 0, -0.5, 0, 1, 0, 0, 0, 0, 0, 1, 1),
    "dapo_equation": (-1, 0, -0.5, 0, 1, 0, 0, 0, 0, 0, 1, 1),
    "dapo_boxed_in_answer": (1, 0, -0.5, 0, 1, 0, 1, 0, 0, 1, 1, 1),
    "dapo_no_answer_line": (-1, 0, -0.5, 0, -1, 0, 0, 0, 0, 0, -1, 1),
    "dapo_commas": (-1, 0, -0.5, 0, 1, 0, 0, 0, 0, 0, 1, 1),
    "dapo_text_macro": (-1, 0, -0.5, 0, 1, 0, 0, 0, 0, 0, 1, 0),
    "steps_three": (1, 0, -0.5, 0, -1, 0, 1, 1, 0, 1, -1, 1),
    "steps_words": (1, 0, -0.5, 0, -1, 0, 1, 1, 0, 1, -1, 1),
    "steps_list": (-0.5, 0, -0.5, 0, -1, 0, 0, 1, 0, 0, -1, 0),
}

DIFFERENCES: dict[tuple[str, str], tuple[float, str]] = {
    ("acc", "r1_slash_frac"): (
        1.0, "MindSpeed-RL's math-eval toolkit rewrites `3/4` as `\\x0crac{3}{4}` (a missing backslash: "
        "`\\f` is a form feed), so a right `3/4` scores -0.5 there"),
    ("acc", "plain_boxed_unbalanced"): (
        -0.5, "an unclosed `\\boxed{7 and more`: the toolkit deletes the word `and` and its unit words and "
        "reads `7`; asp-npu compares `7 and more`"),
}
