"""Hand-written (response, ground truth) pairs for the verifiers: LaTeX fractions, boxed answers, units,
`<think>/<answer>` formats, GSM8K `####` and DAPO `Answer:` lines, and wrong answers.

`EXPECTED` (in `reward_expected.py`) holds each verifier's score per case, taken from the reference
implementations (MindSpeed-RL's `rule_verifier.py`, verl's `reward_score/`) by
`benchmarks/reward_parity.py`; `math_verify_reward` is also checked against math-verify itself.
"""

from __future__ import annotations

T, A = "<think>", "<answer>"
TE, AE = "</think>", "</answer>"


def r1(think: str, answer: str) -> str:
    """A response in the qwen_r1 template's format."""
    return f"{T}{think}{TE}{A}{answer}{AE}"


CASES: list[tuple[str, str, str]] = [
    # --- R1 format, boxed answers
    ("r1_int_right", r1("7 times 6 is 42.", "The answer is \\boxed{42}."), "42"),
    ("r1_int_wrong", r1("7 times 6 is 41.", "The answer is \\boxed{41}."), "42"),
    ("r1_frac_vs_decimal", r1("Half of one.", "\\boxed{\\frac{1}{2}}"), "0.5"),
    ("r1_decimal_vs_frac", r1("Half of one.", "\\boxed{0.5}"), "\\frac{1}{2}"),
    ("r1_dfrac", r1("Three quarters.", "\\boxed{\\dfrac{3}{4}}"), "\\frac{3}{4}"),
    ("r1_frac_short", r1("Three quarters.", "\\boxed{\\frac34}"), "\\frac{3}{4}"),
    ("r1_slash_frac", r1("Three quarters.", "\\boxed{3/4}"), "\\frac{3}{4}"),
    ("r1_negative", r1("Below zero.", "\\boxed{-7}"), "-7"),
    ("r1_negative_wrong_sign", r1("Below zero.", "\\boxed{7}"), "-7"),
    ("r1_sqrt", r1("Diagonal of a unit square.", "\\boxed{\\sqrt{2}}"), "\\sqrt{2}"),
    ("r1_sqrt_short", r1("Diagonal of a unit square.", "\\boxed{\\sqrt2}"), "\\sqrt{2}"),
    ("r1_sqrt_over_2", r1("Half the diagonal.", "\\boxed{\\frac{\\sqrt{2}}{2}}"), "\\frac{1}{\\sqrt{2}}"),
    ("r1_pi", r1("Circumference of radius 1.", "\\boxed{2\\pi}"), "2\\pi"),
    ("r1_pi_decimal", r1("Circumference of radius 1.", "\\boxed{6.28}"), "2\\pi"),
    ("r1_units_text", r1("The side is 5 cm.", "\\boxed{5\\text{ cm}}"), "5"),
    ("r1_degrees", r1("Right angle.", "\\boxed{90^\\circ}"), "90"),
    ("r1_percent", r1("Half of it.", "\\boxed{50\\%}"), "50"),
    ("r1_dollars", r1("It costs 18 dollars.", "\\boxed{\\$18}"), "18"),
    ("r1_commas", r1("Ten hundreds.", "\\boxed{1,000}"), "1000"),
    ("r1_equation", r1("Solve x + 2 = 7.", "\\boxed{x = 5}"), "5"),
    ("r1_interval", r1("Between one and two.", "\\boxed{(1, 2]}"), "(1,2]"),
    ("r1_tuple", r1("The point.", "\\boxed{(3, -4)}"), "(3,-4)"),
    ("r1_set_order", r1("Both roots.", "\\boxed{\\{2, 1\\}}"), "\\{1,2\\}"),
    ("r1_left_right", r1("The pair.", "\\boxed{\\left(1, 2\\right)}"), "(1,2)"),
    ("r1_text_answer", r1("The letter.", "\\boxed{\\text{B}}"), "B"),
    ("r1_expression", r1("Expand it.", "\\boxed{x^2 + 2x + 1}"), "(x+1)^2"),
    ("r1_two_boxed_last_right", r1("First guess \\boxed{3}.", "\\boxed{4}"), "4"),
    ("r1_two_boxed_last_wrong", r1("First guess \\boxed{4}.", "\\boxed{3}"), "4"),
    ("r1_nested_braces", r1("Nested.", "\\boxed{\\frac{1}{\\frac{1}{3}}}"), "3"),
    ("r1_no_boxed", r1("7 times 6 is 42.", "42"), "42"),
    ("r1_empty_boxed", r1("Nothing.", "\\boxed{}"), "42"),
    ("r1_boxed_multiline", r1("Two lines.", "\\boxed{\n42\n}"), "42"),
    ("r1_space_after_think", "<think>ok</think>\n\n<answer>\\boxed{12}</answer>", "12"),
    ("r1_newline_after_answer", r1("ok", "\\boxed{12}") + "\n", "12"),
    ("r1_text_after_answer", r1("ok", "\\boxed{12}") + " Done.", "12"),
    ("r1_text_before_think", "Sure. " + r1("ok", "\\boxed{12}"), "12"),
    ("r1_trailing_line_after", r1("ok", "\\boxed{12}") + "\nextra words", "12"),
    ("r1_double_think", "<think>a</think><think>b</think><answer>\\boxed{12}</answer>", "12"),
    ("r1_boxed_outside_answer", "<think>a</think>\\boxed{12}<answer>12</answer>", "12"),
    ("r1_missing_answer_close", "<think>a</think><answer>\\boxed{12}", "12"),
    ("r1_answer_before_think", "<answer>\\boxed{12}</answer><think>a</think>", "12"),
    ("r1_think_only", "<think>The answer is \\boxed{12}</think>", "12"),
    ("r1_decimal_trailing_zero", r1("Two and a half.", "\\boxed{2.50}"), "2.5"),
    ("r1_large_number", r1("A million.", "\\boxed{1000000}"), "1,000,000"),
    # --- plain text, boxed or not
    ("plain_boxed_right", "We compute 3 + 4 = 7, so \\boxed{7}.", "7"),
    ("plain_boxed_wrong", "We compute 3 + 4 = 8, so \\boxed{8}.", "7"),
    ("plain_boxed_space", "Therefore the answer is $\\boxed 7$.", "7"),
    ("plain_fbox", "Therefore the answer is \\fbox{7}.", "7"),
    ("plain_no_answer", "I am not sure how to solve this.", "7"),
    ("plain_empty", "", "7"),
    ("plain_last_number", "First 3, then 5, finally 7", "7"),
    ("plain_the_answer_is", "The answer is 7", "7"),
    ("plain_boxed_unbalanced", "So \\boxed{7 and more", "7"),
    # --- GSM8K style
    ("gsm_right", "Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
    ("gsm_wrong", "Natalia sold 48 + 25 = 73 clips.\n#### 73", "72"),
    ("gsm_commas", "She earns 1,200 in total.\n#### 1,200", "1200"),
    ("gsm_no_space", "Total: 72\n####72", "72"),
    ("gsm_negative", "The change is -5.\n#### -5", "-5"),
    ("gsm_decimal", "Each costs 2.5 dollars.\n#### 2.5", "2.5"),
    ("gsm_two_marks", "#### 10 was wrong, recount.\n#### 12", "12"),
    ("gsm_dollar", "It costs $15.\n#### $15", "15"),
    # --- DAPO / Minerva `Answer:` lines
    ("dapo_right", "Let me add them up.\nAnswer: 34", "34"),
    ("dapo_wrong", "Let me add them up.\nAnswer: 35", "34"),
    ("dapo_lowercase", "so\nanswer: 34", "34"),
    ("dapo_dollar_math", "Thus\nAnswer: $\\frac{1}{2}$", "\\frac{1}{2}"),
    ("dapo_units", "The height is\nAnswer: 12 inches", "12"),
    ("dapo_equation", "Solving,\nAnswer: x = 9", "9"),
    ("dapo_boxed_in_answer", "Done.\nAnswer: \\boxed{21}", "21"),
    ("dapo_no_answer_line", "The result is 34.", "34"),
    ("dapo_commas", "Count them.\nAnswer: 12,000", "12000"),
    ("dapo_text_macro", "Hence\nAnswer: \\text{(C)}", "(C)"),
    # --- reasoning-step markers (MindSpeed-RL `step`)
    ("steps_three", "Step 1: add.\nStep 2: carry.\nStep 3: done, so \\boxed{10}.", "10"),
    ("steps_words", "First, split it. Next, add the parts. Finally, \\boxed{10}.", "10"),
    ("steps_list", "1. add\n- carry\n* done: \\boxed{9}", "10"),
]
