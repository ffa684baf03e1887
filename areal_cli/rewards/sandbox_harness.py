"""Decides a code reward: the problem's tests, calling the candidate through a pipe.

Started by sandbox_launch.py, in a sandbox of its own, beside the candidate's (sandbox_child.py,
mode "serve"); never imported. Stdlib only. No candidate code runs here: each function the tests
call is a stand-in that sends the call's arguments, as plain values, to the candidate's process
and returns the plain value that comes back (or raises the builtin exception it names). The
candidate never shares an interpreter, a frame or an object with the tests or their expected
values, so it cannot read them; and what it answers is decoded as exact builtin types only, so an
object whose __eq__ always says True arrives as the name of its type and fails.
Exit code 0 = every test passed, 1 = failed (the reason is printed).
"""

import builtins
import marshal
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sandbox_child import setup  # noqa: E402 - stdlib-only sibling modules
from sandbox_values import NotPlain, decode, encode, loads, recv, send  # noqa: E402

MUTABLE = (list, dict, set, bytearray)


class Broken(BaseException):
    """The candidate did not answer a call with plain values (a BaseException, so that the
    tests' own `except Exception` cannot swallow it; a bare `except` is caught by the sticky
    Candidate.broken instead)."""


def main():
    spec = marshal.loads(sys.stdin.buffer.read())
    setup(spec)
    limits = spec["limits"]
    candidate = Candidate(spec["requests_fd"], spec["answers_fd"], limits["fsize_mb"] << 20)
    g = {"__name__": "__main__"}
    exec_prefix(spec["prefix"], g)
    for name in spec["targets"]:
        g[name] = candidate.stand_in(name)
    try:
        exec(compile(spec["test"], "test.py", "exec"), g)
        if spec["entry"]:
            g["check"](g[spec["entry"]])
    except BaseException as e:  # noqa: BLE001 - a failing test, or a broken answer
        return fail(candidate.broken or f"a test failed: {type(e).__name__}: {str(e)[:300]}")
    if candidate.broken:  # the tests swallowed it
        return fail(candidate.broken)
    print(f"[verdict] passed: {candidate.calls} calls answered")
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


class Candidate:
    """The candidate's functions, in another process: one request frame per call, one answer."""

    def __init__(self, requests, answers, cap):
        self.requests, self.answers, self.cap = requests, answers, cap
        self.calls, self.broken = 0, ""

    def stand_in(self, name):
        def call(*args, **kwargs):
            return self.call(name, args, kwargs)

        call.__name__ = name
        return call

    def call(self, name, args, kwargs):
        if self.broken:
            raise Broken(self.broken)
        self.calls += 1
        n = self.calls
        try:
            request = {"fn": name, "args": encode(list(args)), "kwargs": encode(kwargs)}
        except NotPlain as e:
            self.fail(f"call {n} ({name}): the tests pass a {e}, which cannot cross to the "
                      "candidate")
        try:
            send(self.requests, marshal.dumps(request))
            frame = recv(self.answers, self.cap)
        except (OSError, ValueError) as e:  # the candidate's end closed, or a frame too long
            self.fail(f"call {n} ({name}): no answer ({type(e).__name__}: {e})")
        if frame is None:
            self.fail(f"call {n} ({name}): the candidate's program ended before answering")
        return self.result(name, n, frame, args)

    def result(self, name, n, frame, args):
        try:
            reply = loads(frame.decode("utf-8", "surrogatepass"))
            if type(reply) is not dict:
                raise TypeError(type(reply).__name__)
        except (ValueError, RecursionError, TypeError) as e:
            self.fail(f"call {n} ({name}): a malformed answer ({type(e).__name__})")
        if "raise" in reply:
            raise exception(reply["raise"])
        if "not_plain" in reply or "missing" in reply:
            what = reply.get("not_plain") or "nothing: the program defines no such function"
            self.fail(f"call {n} ({name}) returned {str(what)[:100]!r}, not a plain value")
        try:
            result, after = decode(reply["out"]), decode(reply["after"])
        except (KeyError, ValueError, TypeError, RecursionError) as e:
            self.fail(f"call {n} ({name}): a malformed answer ({type(e).__name__})")
        for arg, new in zip(args, after, strict=False):  # e.g. a list sorted in place
            if type(arg) is type(new) and type(arg) in MUTABLE:
                replace_contents(arg, new)
        return result

    def fail(self, reason):
        self.broken = reason
        raise Broken(reason)


def replace_contents(target, new):
    if type(target) in (dict, set):
        target.clear()
        target.update(new)
    else:
        target[:] = new


def exception(named):
    """The builtin exception the candidate raised (the tests may expect a ValueError), else a
    new Exception type of that name; never anything that is not an Exception, nor one that
    ends the iteration it is raised in (StopIteration would make `all(map(...))` true)."""
    type_name, message = (list(named) + ["", ""])[:2] if type(named) is list else ("", "")
    kind = getattr(builtins, str(type_name), None)
    ends_iteration = kind in (StopIteration, StopAsyncIteration)
    if ends_iteration or not (isinstance(kind, type) and issubclass(kind, Exception)):
        kind = type(str(type_name)[:100] or "Error", (Exception,), {})
    try:
        return kind(str(message)[:200])
    except TypeError:  # one that takes other arguments (ExceptionGroup, UnicodeDecodeError)
        return type(kind.__name__, (Exception,), {})(str(message)[:200])


def fail(reason):
    print(f"[verdict] failed: {reason}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
