"""0/1 grading of a math reply against a ground-truth answer.

`grade(response, ground_truth, answer_format="any")` extracts the reply's answer
(envs.math.extract: `any` = box, final-answer phrase, last number; the strict `boxed` and
`final_line` formats) and returns 1.0 when it matches, else 0.0. The checks, in order:

1. normalised strings equal (envs.math.normalize) -> 1;
2. integer ground truth ("18", "-3", "1,000"): only an integer literal of the same value
   matches ("18", "18.0", "18 dollars"); any other form ("35/2", "17.9999999", "\\frac{36}{2}",
   an expression) is 0 and never reaches symbolic equivalence, so numeric tolerance can never
   turn a non-integer into a correct integer answer;
3. fractions: when both answers are fractions of integer literals (`a/b`, `\\frac{a}{b}`) they
   must be the same fraction as written (1/2 does not match 2/4, either way round); a ground
   truth written as an unreduced fraction (2/4, 4/2) is matched by that exact fraction only
   (not by 0.5); a reduced fraction ground truth still matches other forms (1/2 vs 0.5)
   through the checks below;
4. both plain decimal literals: exact value ("0.50" matches "0.5"; "0.333" not "1/3"'s 0.3333);
5. symbolic equivalence through math-verify (envs.math.symbolic), in a worker process with a
   hard timeout, safe from any thread; a timeout is 0. Without math-verify installed, step 5
   is skipped (string matching only, one logged warning).
"""

from __future__ import annotations

from envs.math.extract import extract_answer, last_boxed
from envs.math.normalize import (
    is_integer_literal,
    is_unreduced,
    normalize_answer,
    parse_fraction,
    parse_number,
)
from envs.math.symbolic import symbolic_equal


def ground_truth_text(ground_truth: object) -> str:
    """The ground-truth answer as a string: numbers as written, a boxed answer unwrapped, and
    GSM8K-style solutions reduced to the text after their last `####`."""
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        raise TypeError(f"ground_truth must be a str or a number, got {ground_truth!r}")
    text = str(ground_truth).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    boxed = last_boxed(text)
    return boxed if boxed is not None else text


def _dollar_free(text: str) -> str:
    return text.replace("$", "").strip()


def answers_match(pred: str, gold: str, *, timeout_s: float = 5.0) -> bool:
    """Whether the extracted answer `pred` matches the ground truth `gold` (rules above)."""
    pred_norm, gold_norm = normalize_answer(pred), normalize_answer(gold)
    if not pred_norm or not gold_norm:
        return False
    if pred_norm == gold_norm:
        return True
    pred_value, gold_value = parse_number(pred_norm), parse_number(gold_norm)
    if is_integer_literal(gold_norm):
        return pred_value is not None and pred_value == gold_value
    pred_fraction, gold_fraction = parse_fraction(pred_norm), parse_fraction(gold_norm)
    if gold_fraction is not None and pred_fraction is not None:
        return gold_fraction == pred_fraction
    if gold_fraction is not None and is_unreduced(gold_fraction):
        return False
    if pred_value is not None and gold_value is not None:
        return pred_value == gold_value
    if "\\" not in pred_norm + gold_norm and pred_norm.casefold() == gold_norm.casefold():
        return True
    verdict = symbolic_equal(_dollar_free(gold), _dollar_free(pred), timeout_s)
    return bool(verdict)


def grade(
    response: str, ground_truth: object, *, timeout_s: float = 5.0, answer_format: str = "any"
) -> float:
    """1.0 when the answer extracted from `response` (in `answer_format`: any | boxed |
    final_line, envs.math.extract) matches `ground_truth`, else 0.0.

    Thread-safe: symbolic checks run in worker processes bounded by `timeout_s` seconds."""
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    gold = ground_truth_text(ground_truth)
    if not gold:
        raise ValueError("ground_truth is empty")
    pred = extract_answer(response, answer_format)
    if pred is None:
        return 0.0
    return 1.0 if answers_match(pred, gold, timeout_s=timeout_s) else 0.0
