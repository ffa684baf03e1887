"""Pulling the answer (or the code) out of a completion, leniently but never past the marker.

A small model often leaves out the "Answer: N" marker, so when the marker
is missing the last number in the completion is taken as the answer. When the marker is
there, the answer is what follows the last one; a marker with nothing after it is no answer
(never a number from before it).
"""

from __future__ import annotations

import re

ANSWER_MARKER = re.compile(r"answer\s*:", re.IGNORECASE)
NUMBER = re.compile(r"[-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-−]?\d+(?:\.\d+)?|[-−]?\.\d+")
CODE_BLOCK = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
WRAPPERS = "*$`\"' \t"


def extract_answer(text: str, multiline: bool = False) -> str | None:
    """After the last "Answer:": its first non-empty line (``multiline``: everything after it);
    without a marker the last number; else None."""
    markers = list(ANSWER_MARKER.finditer(text))
    if not markers:
        return last_number(text)
    after = text[markers[-1].end() :]
    if multiline:
        return clean(after.strip("\n")) or None
    lines = (clean(line) for line in after.split("\n"))
    return next((line for line in lines if line), None)


def clean(answer: str) -> str:
    """Strip markdown/LaTeX wrappers and a trailing full stop: " **$7$**." -> "7"."""
    answer = answer.strip().strip(WRAPPERS)
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", answer)
    if boxed:
        answer = boxed.group(1)
    return answer.rstrip(".").strip(WRAPPERS).replace("−", "-")


def last_number(text: str) -> str | None:
    """The last number in the text as written (thousands commas dropped, "−" as "-")."""
    numbers = NUMBER.findall(text)
    if not numbers:
        return None
    return numbers[-1].replace(",", "").replace("−", "-")


def extract_code(text: str) -> str:
    """The last ```python block of a completion, or the whole completion if it has none."""
    blocks = CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else text
