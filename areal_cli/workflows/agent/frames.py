"""The frames between a rollout worker and its agent processes (``agent_process.py``): a 4-byte
big-endian length, then a JSON object."""

from __future__ import annotations

import asyncio
import json
import struct

HEAD = struct.Struct(">I")
MAX_FRAME = 64 << 20
"""The largest frame either side accepts (a problem, an agent's return value)."""


async def read_frame(reader: asyncio.StreamReader) -> dict | None:
    """The next frame, or None at the end of the stream. ValueError for a frame past MAX_FRAME."""
    try:
        (n,) = HEAD.unpack(await reader.readexactly(HEAD.size))
        if n > MAX_FRAME:
            raise ValueError(f"an agent process frame of {n} bytes (at most {MAX_FRAME})")
        return json.loads(await reader.readexactly(n))
    except asyncio.IncompleteReadError:
        return None


def frame(msg: dict) -> bytes:
    body = json.dumps(msg).encode()
    return HEAD.pack(len(body)) + body
