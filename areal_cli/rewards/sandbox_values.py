"""Plain values, and the messages between the test harness and the candidate's process.

The harness (sandbox_harness.py) sends each call's arguments to the candidate's process
(sandbox_child.py, mode "serve") as a marshal frame; the candidate answers with a JSON frame,
which the harness parses (loads) and decodes, never trusting it. A frame is a 4-byte length
and its bytes. Imports only os (loaded already) at load: it runs inside the sandbox, where every
import costs each call's start-up time.

Only exact builtin types travel (a subclass of int or list, or any other object, does not):
what the trusted side decodes can hold no code, so an object whose __eq__ always returns True
arrives, at best, as the name of its type. Scalars are JSON scalars (NaN and ±inf as JSON's
extensions); every container is a JSON array led by a tag.
"""

import os

MAX_DEPTH = 64
SCALARS = (type(None), bool, int, float, str)
CONTAINERS = {list: "L", tuple: "T", set: "S", frozenset: "F", dict: "D"}
BUILDERS = {"L": list, "T": tuple, "S": set, "F": frozenset}


class NotPlain(ValueError):
    """A value that is not made of builtin types only (its type name is the message)."""


def encode(value, lenient: bool = False, depth: int = 0):
    """`value` as JSON-able data; NotPlain for anything else, or ["?", type] when lenient."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise NotPlain(f"nesting deeper than {MAX_DEPTH}")
    if kind in SCALARS:
        return value
    if kind in CONTAINERS:
        items = value.items() if kind is dict else value
        if kind is dict:
            items = [
                [encode(k, lenient, depth + 1), encode(v, lenient, depth + 1)] for k, v in items
            ]
        else:
            items = [encode(v, lenient, depth + 1) for v in items]
        return [CONTAINERS[kind], items]
    if kind in (bytes, bytearray):
        return ["B" if kind is bytes else "A", value.hex()]
    if kind is complex:
        return ["C", value.real, value.imag]
    if kind is range:
        return ["R", value.start, value.stop, value.step]
    if lenient:
        return ["?", kind.__name__]
    raise NotPlain(kind.__name__)


def decode(data):
    """The builtin value `data` encodes; ValueError when it is not a valid encoding."""
    if type(data) in SCALARS:
        return data
    if type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError(f"not an encoded value: {data!r}")
    tag, rest = data[0], data[1:]
    if tag in BUILDERS and len(rest) == 1 and type(rest[0]) is list:
        return BUILDERS[tag](decode(v) for v in rest[0])
    if tag == "D" and len(rest) == 1 and type(rest[0]) is list:
        return {decode(k): decode(v) for k, v in rest[0]}
    if tag in ("B", "A") and len(rest) == 1 and type(rest[0]) is str:
        return (bytes if tag == "B" else bytearray).fromhex(rest[0])
    if tag == "C" and len(rest) == 2:
        return complex(float(rest[0]), float(rest[1]))
    if tag == "R" and len(rest) == 3 and all(type(v) is int for v in rest):
        return range(*rest)
    raise ValueError(f"not an encoded value: {data!r}")


def dumps(data) -> str:
    """JSON text of dicts (str keys), lists, str, int, float, bool and None."""
    kind = type(data)
    if kind is str:
        return '"' + data.translate(ESCAPES).encode("utf-8", "backslashreplace").decode() + '"'
    if kind is dict:
        return "{" + ",".join(dumps(k) + ":" + dumps(v) for k, v in data.items()) + "}"
    if kind is list:
        return "[" + ",".join(dumps(v) for v in data) + "]"
    if kind is float and data != data:
        return "NaN"
    if kind is float and data in (INF, -INF):
        return "Infinity" if data > 0 else "-Infinity"
    return LITERALS.get(data, None) if kind in (bool, type(None)) else repr(data)


INF = float("inf")
LITERALS = {None: "null", True: "true", False: "false"}
ESCAPES = {c: f"\\u{c:04x}" for c in range(32)}
ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def send(fd: int, data: bytes) -> None:
    """One frame: its length, then `data`."""
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def recv(fd: int, cap: int):
    """The next frame's bytes; None at the end of the stream; ValueError for a frame longer
    than `cap` bytes or one cut short."""
    head = _exactly(fd, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > cap:
        raise ValueError(f"a message of {size} bytes (at most {cap})")
    body = _exactly(fd, size)
    if body is None:
        raise ValueError("a message cut short")
    return bytes(body)


def _exactly(fd: int, size: int):
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return data


class _Strict:
    """What the json module's C scanner asks of its decoder: plain JSON and its NaN/±Infinity."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"NaN": float("nan"), "Infinity": INF, "-Infinity": -INF}.__getitem__
    memo = {}


def loads(text: str):
    """The JSON value `text` holds; ValueError when it is not exactly one. The C scanner that
    json.loads uses, without the json package's imports (re alone costs milliseconds per call)."""
    try:
        import _json

        scan = _json.make_scanner(_Strict)
    except ImportError:  # an interpreter built without the C scanner
        import json

        return json.loads(text)
    try:
        value, end = scan(text, 0)
    except (StopIteration, SystemError):  # SystemError: the scanner's error message needs
        raise ValueError("not JSON") from None  # json.decoder, which is not imported here
    if end != len(text):
        raise ValueError(f"extra data after position {end}")
    return value
