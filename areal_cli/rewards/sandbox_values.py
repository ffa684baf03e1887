"""Plain values as JSON, for the candidate's call records (sandbox_child.py writes them,
sandbox_verdict.py reads them with the json module). Imports nothing: it is loaded inside the
sandbox, where every import costs each call's start-up time.

Only exact builtin types travel (a subclass of int or list, or any other object, does not):
what the trusted side decodes can hold no code, so an object whose __eq__ always returns True
arrives, at best, as the name of its type. Scalars are JSON scalars (NaN and ±inf as JSON's
extensions); every container is a JSON array led by a tag.
"""

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
