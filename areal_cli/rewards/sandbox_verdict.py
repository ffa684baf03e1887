"""Decides a code reward: replays the problem's tests on the candidate's recorded calls.

Started by sandbox_launch.py (in a sandbox of its own), never imported. Stdlib only. No
candidate code ever runs here: the tests run against stand-ins for the candidate's functions
that return the plain values recorded by sandbox_child.py (call by call, in order, checking the
tests pass the same arguments). So a forged "passed" marker or an early exit leaves calls
missing, and an object whose __eq__ always says True arrives only as its type's name: both fail.
The records arrive parsed (sandbox.parse_records) as lists and dicts; the "end" record, which
says the program and its tests ran to their end, is checked there. Exit code 0 = every test
passed on the recorded values, 1 = failed (the reason is printed).
"""

import builtins
import marshal
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sandbox_child import seed_random, setup  # noqa: E402 - stdlib-only sibling modules
from sandbox_values import decode, dumps, encode  # noqa: E402


class Mismatch(BaseException):
    """The tests asked for a call the candidate did not answer (a BaseException, so that the
    tests' own `except Exception` cannot swallow it)."""


def main():
    spec = marshal.loads(sys.stdin.buffer.read())
    setup(spec)
    calls = Calls(spec["records"])
    g = {"__name__": "__main__"}
    exec_prefix(spec["prefix"], g)
    for name in spec["targets"]:
        g[name] = calls.stand_in(name)
    try:
        seed_random(spec["test"])
        exec(compile(spec["test"], "test.py", "exec"), g)
        if spec["entry"]:
            g["check"](g[spec["entry"]])
    except Mismatch as e:
        return fail(str(e))
    except BaseException as e:  # noqa: BLE001 - a failing test on the recorded values
        return fail(f"a test failed: {type(e).__name__}: {str(e)[:300]}")
    if calls.left():
        return fail(f"{calls.left()} recorded calls were never made by the tests")
    print(f"[verdict] passed: {calls.index} calls replayed")
    return 0


def exec_prefix(prefix, g):
    """The problem's own code before the completion (trusted: helpers the tests may call)."""
    for source in (prefix, prefix + "\n    pass\n"):
        try:
            code = compile(source, "prefix.py", "exec")
        except SyntaxError:
            continue
        exec(code, g)
        return


class Calls:
    def __init__(self, records):
        self.records, self.index = records, 0

    def left(self):
        return len(self.records) - self.index

    def stand_in(self, name):
        def call(*args, **kwargs):
            return self.answer(name, list(args), kwargs)

        call.__name__ = name
        return call

    def answer(self, name, args, kwargs):
        n = self.index + 1
        if self.index >= len(self.records):
            raise Mismatch(f"call {n} ({name}) was never recorded: the program stopped early")
        rec, self.index = self.records[self.index], n
        asked = {"fn": name, "args": encode(args, True), "kwargs": encode(kwargs, True)}
        if any(dumps(rec.get(k)) != dumps(v) for k, v in asked.items()):
            raise Mismatch(f"call {n}: the tests asked {asked}, the record says {rec}")
        if "raise" in rec:
            raise exception(*rec["raise"])
        if "not_plain" in rec:
            raise Mismatch(f"call {n} ({name}) returned a {rec['not_plain']}, not a plain value")
        try:
            result, after = decode(rec["out"]), decode(rec["after"])
        except (KeyError, ValueError, TypeError, RecursionError) as e:
            raise Mismatch(f"call {n}: a malformed record ({e})") from None
        for arg, new in zip(args, after, strict=False):  # e.g. a list sorted in place
            if type(arg) is type(new) and type(arg) in (list, dict, set, bytearray):
                replace_contents(arg, new)
        return result


def replace_contents(target, new):
    if type(target) in (dict, set):
        target.clear()
        target.update(new)
    else:
        target[:] = new


def exception(type_name, message):
    """The builtin exception of that name (the tests may expect a ValueError), else a new one."""
    kind = getattr(builtins, str(type_name), None)
    if not (isinstance(kind, type) and issubclass(kind, Exception)):
        kind = type(str(type_name), (Exception,), {})
    return kind(str(message))


def fail(reason):
    print(f"[verdict] failed: {reason}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
