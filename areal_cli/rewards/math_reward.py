"""Math scorers: math-verify equivalence, exact match and numeric tolerance."""

from __future__ import annotations

import math
import threading
from fractions import Fraction

from areal_cli.rewards.extract import clean, extract_answer


def math_verify_score(completion: str, answer: str) -> float:
    """1.0 when math-verify finds the completion's final/boxed answer equal to the reference.

    math-verify's own timeouts use signal.alarm, which only works on the main thread; off
    it they are disabled and the reward pool's per-call timeout is the only limit.
    """
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(answer, parsing_timeout=timeout) or parse(f"${answer}$", parsing_timeout=timeout)
    if not gold:
        return 0.0
    pred = parse(completion, parsing_timeout=timeout)
    if not pred:
        extracted = extract_answer(completion)
        pred = parse(f"${extracted}$", parsing_timeout=timeout) if extracted else []
    return 1.0 if pred and verify(gold, pred, timeout_seconds=timeout) else 0.0


def exact_score(completion: str, answer: str) -> float:
    """1.0 when the extracted answer equals the reference after trimming and casefolding."""
    extracted = extract_answer(completion)
    if extracted is None:
        return 0.0
    return 1.0 if _norm(extracted) == _norm(answer) else 0.0


def numeric_score(completion: str, answer: str, tol: float) -> float:
    """1.0 when the extracted number is within `tol` (absolute or relative) of the reference."""
    got, want = to_number(extract_answer(completion) or ""), to_number(answer)
    if got is None or want is None:
        return 0.0
    return 1.0 if math.isclose(got, want, rel_tol=tol, abs_tol=tol) else 0.0


def to_number(text: str) -> float | None:
    """ "0.5", "1/2", "1,000", "-3" as a float; None when it is not a number."""
    text = clean(text).replace(",", "")
    try:
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        return None


def _norm(text: str) -> str:
    return " ".join(clean(text).casefold().split())
