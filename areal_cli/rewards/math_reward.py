"""Math scorers: math-verify equivalence, exact match and numeric tolerance.

Every scorer judges one final answer, never "any number in the completion": the answer after
the last "Answer:" (else a \\boxed{} or the last expression math-verify finds near the end).
An answer that is several values ("7 7 7 7", "7, 8", "7 or 8") or a false equation ("8 = 7")
is not the reference, whichever of its parts matches.
"""

from __future__ import annotations

import math
import re
import threading
from fractions import Fraction

from areal_cli.rewards.extract import ANSWER_MARKER, clean, extract_answer

TAIL_CHARS = 4000
"""Without an "Answer:" marker math-verify reads only this many final characters (its parser
is slow on a huge completion, and a final answer is at the end)."""
SIDE_BY_SIDE = re.compile(r"\d\s+[-+−]?\d")
"""Two numbers with only space between ("7 7"): several answers, not one."""


def math_verify_score(completion: str, answer: str) -> float:
    """1.0 when math-verify finds the completion's final answer equal to the reference.

    math-verify's own timeouts use signal.alarm, which only works on the main thread; off
    it they are disabled and the reward pool's per-call timeout is the only limit.
    """
    from math_verify import LatexExtractionConfig, parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(answer, parsing_timeout=timeout) or parse(f"${answer}$", parsing_timeout=timeout)
    if not gold:
        return 0.0
    if ANSWER_MARKER.search(completion):
        final = extract_answer(completion)
        if final is None or SIDE_BY_SIDE.search(final):
            return 0.0
        if "\\boxed" in final:
            pred = parse(final, parsing_timeout=timeout)
        else:
            pred = parse(f"${final}$", extraction_config=[LatexExtractionConfig()],
                         parsing_timeout=timeout)
    else:
        pred = parse(completion[-TAIL_CHARS:], parsing_timeout=timeout)
    if not pred or not _consistent(pred):
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0


def _consistent(pred: list) -> bool:
    """False for an equation between numbers that are not equal ("8 = 7"): math-verify would
    compare only its right-hand side."""
    from sympy import simplify
    from sympy.core.relational import Relational

    for value in pred:
        if isinstance(value,
                      Relational) and not value.lhs.free_symbols and not value.rhs.free_symbols:
            try:
                if simplify(value.lhs - value.rhs) != 0:
                    return False
            except (TypeError, ValueError):
                return False
    return True


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


def same_answer(extracted: str, reference: str) -> bool:
    """Equal after normalisation (trim, casefold, whitespace), or the same number exactly."""
    if _norm(extracted) == _norm(reference):
        return True
    got, want = to_fraction(extracted), to_fraction(reference)
    return got is not None and got == want


def to_number(text: str) -> float | None:
    """ "0.5", "1/2", "1,000", "-3" as a float; None when it is not a number."""
    value = to_fraction(text)
    return None if value is None else float(value)


def to_fraction(text: str) -> Fraction | None:
    """ "0.5", "1/2", "1,000", "-3" exactly; None when it is not a number."""
    text = clean(text).replace(",", "")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _norm(text: str) -> str:
    return " ".join(clean(text).casefold().split())
