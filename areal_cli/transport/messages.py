"""The wire format shared by every role: typed messages, msgpack frames.

Arrays (token ids, logprobs, versions) travel as raw bytes with dtype and shape — never
pickled, never base64. Every message is a dataclass registered here; ``encode`` /
``decode`` are the only ways onto and off the wire. ``decode`` trusts nothing: a frame
that is not exactly one allowed message with every field of its declared type raises
``BadFrame`` (the receiving channel counts, logs and drops it).

One message type per event. ``CHANNELS`` says which message types each channel carries (each
channel decodes only those) and ``SENDERS`` which process may send each status message (the
controller drops the rest); docs/protocol.md draws the messages of one step. No message carries
a filesystem path or any other capability — a receiver derives what it acts on from plain
values (a version, a step).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import StrEnum

import msgpack
import numpy as np

_ND = "__nd__"
REGISTRY: dict[str, type] = {}
_ARRAY_KINDS = "biuf"  # bool, signed, unsigned, float: nothing else is ever on the wire
_SCALARS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "dict": (dict,),
            "np.ndarray": (np.ndarray,)}


class Phase(StrEnum):
    """What a process does, where the controller acts on it (``Heartbeat.phase``): something else |
    trainer rank 0 sending the weights of ``Heartbeat.version`` | a rollout worker receiving
    them."""

    other = "other"
    sending_weights = "sending_weights"
    receiving_weights = "receiving_weights"


# closed sets of words: travel as str, decoded to members
_ENUMS: dict[str, type[StrEnum]] = {"Phase": Phase}


class BadFrame(ValueError):
    """A frame that is not a well-formed message of a type its channel accepts."""


def message(cls):
    """Register a dataclass as a wire message under its class name (its fields' types must be
    ones ``decode`` checks: those in ``_SCALARS`` or ``_ENUMS``, or list[<an earlier message>])."""
    cls = dataclass(cls)
    for f in fields(cls):
        known = f.type in _SCALARS or f.type in _ENUMS or (f.type.startswith("list[")
                                                           and f.type[5:-1] in REGISTRY)
        assert known, f"{cls.__name__}.{f.name}: decode cannot check a field of type {f.type}"
    REGISTRY[cls.__name__] = cls
    return cls


def _default(obj):
    if isinstance(obj, np.ndarray):
        return {_ND: True, "dtype": obj.dtype.str, "shape": list(obj.shape), "data": obj.tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot put {type(obj).__name__} on the wire")


def _hook(obj):
    if obj.get(_ND):
        dtype = np.dtype(obj["dtype"])
        if dtype.kind not in _ARRAY_KINDS:
            raise BadFrame(f"array of dtype {dtype} on the wire")
        return np.frombuffer(obj["data"], dtype=dtype).reshape(obj["shape"]).copy()
    return obj


def encode(msg) -> bytes:
    body = {f.name: getattr(msg, f.name) for f in fields(msg)}
    body = {k: ([asdict(x) if hasattr(x, "__dataclass_fields__") else x for x in v]
                if isinstance(v, list) else v)
            for k, v in body.items()}
    return msgpack.packb({"type": type(msg).__name__, "body": body}, default=_default,
                         use_bin_type=True)


def decode(frame: bytes, allowed: tuple[type, ...] | None = None):
    """The message in ``frame``; ``BadFrame`` unless it is one of ``allowed`` (None: any
    registered type), well formed, with every field of its declared type."""
    try:
        raw = msgpack.unpackb(frame, object_hook=_hook, raw=False, strict_map_key=False)
    except BadFrame:
        raise
    except Exception as err:  # noqa: BLE001 — msgpack, numpy and codec errors alike: not a message
        raise BadFrame(f"not a msgpack message ({type(err).__name__}: {err})") from None
    if not isinstance(raw, dict) or set(raw) != {"type", "body"} or not isinstance(raw["body"],
                                                                                   dict):
        raise BadFrame("not a {type, body} map")
    cls = REGISTRY.get(raw["type"]) if isinstance(raw["type"], str) else None
    if cls is None:
        raise BadFrame(f"unknown message type {raw['type']!r}")
    if allowed is not None and cls not in allowed:
        raise BadFrame(f"a {cls.__name__} on a channel that carries "
                       f"{', '.join(c.__name__ for c in allowed)}")
    return _build(cls, raw["body"])


def _build(cls, body: dict):
    """``cls(**body)`` after checking every field against its annotation (nested messages too)."""
    declared = {f.name: f for f in fields(cls)}
    unknown = set(body) - set(declared)
    if unknown:
        raise BadFrame(f"{cls.__name__}: unknown field(s) {sorted(map(str, unknown))}")
    kw = {}
    for name, f in declared.items():
        if name not in body:
            if f.default is MISSING and f.default_factory is MISSING:
                raise BadFrame(f"{cls.__name__}: missing field {name!r}")
            continue
        kw[name] = _check(cls.__name__, name, f.type, body[name])
    msg = cls(**kw)
    problem = msg.invalid() if hasattr(msg, "invalid") else ""
    if problem:
        raise BadFrame(f"{cls.__name__}: {problem}")
    return msg


def _check(owner: str, name: str, annotation: str, value):
    if annotation.startswith("list[") and annotation.endswith("]"):
        item = REGISTRY[annotation[5:-1]]
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise BadFrame(f"{owner}.{name}: expected a list of {item.__name__}")
        return [_build(item, v) for v in value]
    if annotation in _ENUMS:
        words = _ENUMS[annotation]
        if not isinstance(value, str) or value not in {m.value for m in words}:
            raise BadFrame(f"{owner}.{name}: expected one of {', '.join(words)}")
        return words(value)
    types = _SCALARS[annotation]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise BadFrame(f"{owner}.{name}: expected {annotation}, got {type(value).__name__}")
    return value


# ---- controller → rollout (PUSH/PULL) -------------------------------------------------


@message
class WorkItem:
    group_id: int  # admission index of the group (0, 1, 2, ... over the run)
    prompt_id: str  # the problem's stable id
    prompt_ids: np.ndarray  # int32 [P] prompt tokens (chat template applied: tasks.prompt_ids)
    group_size: int  # samples to generate (G)
    max_new_tokens: int  # per turn
    problem: dict  # Problem.to_dict(): what the reward needs
    min_version: int  # do not start before the weights are at least this version


# ---- rollout → controller (PUSH/PULL) -------------------------------------------------


@message
class Sample:
    sample_index: int  # 0..G-1 within the group
    prompt_ids: np.ndarray  # int32 [P] the prompt
    # int32 [R] every token after the prompt (model and, multi-turn, env tokens)
    output_ids: np.ndarray
    logprobs: np.ndarray  # float32 [R] behaviour logprob per token (0 where loss_mask is 0)
    versions: np.ndarray  # int32 [R] policy version that produced each token (-1 for env tokens)
    loss_mask: np.ndarray  # uint8 [R] 1 = generated by the model (trained), 0 = env/tool/feedback
    reward: float  # scalar outcome reward
    reward_status: str  # "ok" | "timeout" | "error"
    finish_reason: str  # "stop" | "length"
    num_turns: int  # model turns
    completion: str  # decoded text (logs only; the trainer uses the ids)
    # workflow=agent: the episode (0..G-1) this trajectory is of; -1 = sample_index
    episode: int = -1
    # per part of a combined reward.fn: "<part>" → its
    reward_parts: dict = field(default_factory=dict)
    # score, "<part>_status" → ok | timeout | error | nonfinite | parse_error, "<part>_batch" → the
    # size of the reward-model batch it was scored in, "<part>_batch_workers" → the rollout workers
    # in that batch
    # MoE with routing replay: uint8/int16 [T, sparse layers, top-k] the experts the engine routed
    # each token to, T <= P + R positions of prompt then output (areal_cli/moe.py); empty = none
    routed_experts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))

    def invalid(self) -> str:
        """What makes this sample unusable ("" if nothing): the per-token arrays must agree."""
        if _flat("reward_parts", self.reward_parts):
            return _flat("reward_parts", self.reward_parts)
        arrays = (self.prompt_ids, self.output_ids, self.logprobs, self.versions, self.loss_mask)
        if any(a.ndim != 1 for a in arrays):
            return "token arrays must be one-dimensional"
        if not (len(self.output_ids) == len(self.logprobs) == len(self.versions)
                == len(self.loss_mask)):
            return "output_ids, logprobs, versions and loss_mask differ in length"
        if self.logprobs.dtype.kind != "f" or any(a.dtype.kind not in "iu" for a in arrays
                                                  if a is not self.logprobs):
            return "token ids, versions and loss_mask must be integers, logprobs floats"
        return _routing_problem(self.routed_experts, len(self.prompt_ids) + len(self.output_ids))


def _routing_problem(r: np.ndarray, tokens: int) -> str:
    """What is wrong with a ``Sample.routed_experts`` of a ``tokens``-token trajectory ("" if
    nothing; the trainer checks the ids against its model's experts)."""
    if not r.size:
        return ""
    if r.ndim != 3 or r.dtype.kind not in "iu":
        return "routed_experts must be integers [positions, layers, top-k]"
    if len(r) > tokens:
        return f"routed_experts covers {len(r)} positions of a {tokens}-token trajectory"
    if r.dtype.kind == "i" and bool((r < 0).any()):
        return "routed_experts holds a negative expert id"
    return ""


@message
class GroupResult:
    group_id: int  # as in WorkItem
    prompt_id: str  # as in WorkItem
    worker: int  # rollout worker index
    samples: list[Sample]  # G entries
    gen_time_s: float  # wall time from start to last sample finished
    gen_tokens: int  # tokens generated for this group (including re-prefill-free continuation)
    # workflow=agent: episodes that failed; such a group comes without samples, untrained
    failed: int = 0
    # workflow=agent: counts of the group's episodes (names → numbers)
    counters: dict = field(default_factory=dict)
    # stopped by its worker, no samples: its first token is too old for any batch to come
    stale: bool = False

    def episodes(self) -> int:
        """The episodes the samples come from: one each, or (workflow=agent) distinct
        ``Sample.episode``s."""
        if all(s.episode < 0 for s in self.samples):
            return len(self.samples)
        return len({s.episode for s in self.samples})

    def invalid(self) -> str:
        if self.stale and self.samples:
            return "a stale group with samples"
        if not self.samples and not self.failed and not self.stale:
            return "a group without samples"
        return _flat("counters", self.counters)


# ---- rollout → reward-model process (DEALER/ROUTER), and its reply ---------------------


@message
class RewardRequest:
    """Score one completion with a model-based part of reward.fn (the reward-model process
    binds)."""

    request_id: int  # unique per sending worker; the reply carries it back
    part: str  # "model" | "judge"
    problem: str  # the problem text the policy saw
    reference: str  # the problem's reference answer ("" if none)
    completion: str  # the decoded completion: only ever substituted into text, never evaluated


@message
class RewardTaken:
    """The reward-model process starts scoring this request now: its reward.timeout_s counts from
    here, not from its submission (time queued behind other requests is not the call's)."""

    request_id: int  # as in the RewardRequest


@message
class RewardReply:
    request_id: int  # as in the RewardRequest
    score: float  # 0 unless status is "ok" (or "parse_error" with reward.judge.on_parse_error=min)
    status: str  # "ok" | "parse_error" | "error"
    detail: str  # why, when status is not "ok"
    batch: int  # requests scored in the same forward
    batch_workers: int  # distinct rollout workers those requests came from


# ---- controller → trainer rank 0 (PUSH/PULL); rank 0 → the other ranks (``ranks.py``) ----


@message
class Batch:
    # the optimizer step (0-based) that trains these groups; the policy is then at version `step`
    step: int
    groups: list[GroupResult]  # B groups, oldest first


# ---- controller → rollout (PUB/SUB) ----------------------------------------------------


@message
class UpdateWeights:
    """Join trainer rank 0's weight broadcast now (generation pauses until the load is done)."""

    version: int  # the version the weights will have after the update


@message
class StaleBefore:
    """No batch to come can train a group whose first model token is older than ``version`` (the
    controller has sent every batch up to ``version + max_staleness - 1``): a rollout worker stops
    generating them."""

    version: int


@message
class Sleep:
    """cluster.share=alternate: batch ``step`` is ready; stop generating and let the engine sleep
    (free its memory) until the next weight update, then say ``Asleep``."""

    step: int


@message
class Stop:
    """No more work. Control channel: a rollout worker exits. Ranks channel: every trainer rank
    writes its part of a checkpoint (a stop signal reached rank 0 while it waited) and exits."""


# ---- everyone → controller (DEALER/ROUTER): one message per event ----------------------


@message
class Hello:
    """Up and ready (the trainer: ready for its first batch)."""

    sender: str  # process name: "trainer-0", "rollout-1", ...


@message
class Heartbeat:
    """Alive (sent every launcher.heartbeat_s by a thread of the process)."""

    sender: str
    doing: str  # what the process is busy with or waiting for (named when it stalls)
    # a counter its main loop advances: a busy peer whose counter stands still is stuck
    progress: int
    busy: int = -1  # work the process holds (groups); -1: it does not say (the trainer's is known)
    # ``doing`` as the controller reads it (liveness.culprits); older peers: other
    phase: Phase = Phase.other
    version: int = -1  # the weight version ``phase`` concerns (-1 with Phase.other)


@message
class WeightsReady:
    """The weights of ``version`` are in trainer rank 0's wire buffers: tell the workers to
    update."""

    sender: str
    version: int


@message
class StepDone:
    """Step ``version`` - 1 is trained and its weights were broadcast (the trainer wants the next
    batch)."""

    sender: str
    version: int  # the policy version now
    metrics: dict  # the trainer's metrics of the step (names → numbers or strings)
    checkpoint: bool = False  # the trainer wrote its part of checkpoints/step_<version>.partial

    def invalid(self) -> str:
        return _flat("metrics", self.metrics)


@message
class CheckpointWritten:
    """Trainer ranks wrote their part of checkpoints/step_<version>.partial on a stop signal,
    between steps."""

    sender: str
    version: int


@message
class Bye:
    """The trainer is done: the run ends."""

    sender: str
    finished: bool  # every step trained (False: stopped on a signal)


@message
class WeightsLoaded:
    """This rollout worker now generates with ``version``."""

    sender: str
    version: int
    timings: dict  # pause and load times (weight_updates.jsonl)

    def invalid(self) -> str:
        return _flat("timings", self.timings)


@message
class Asleep:
    """This rollout worker stopped generating and its engine sleeps, for batch ``step``
    (``Sleep``): the trainer may take the device."""

    sender: str
    step: int
    timings: dict  # sleep_s, freed_bytes where the engine says

    def invalid(self) -> str:
        return _flat("timings", self.timings)


def _flat(name: str, values: dict) -> str:
    if all(isinstance(k, str) and isinstance(v, (int, float, str, bool, type(None))) for k,
           v in values.items()):
        return ""
    return f"{name} must map names to numbers or strings"


# status message type → who sends it ("trainer-0", "rollout" for any rollout worker, "*" for every
# peer)
SENDERS: dict[type, str] = {
    Hello: "*",
    Heartbeat: "*",
    WeightsReady: "trainer-0",
    StepDone: "trainer-0",
    CheckpointWritten: "trainer-0",
    Bye: "trainer-0",
    WeightsLoaded: "rollout",
    Asleep: "rollout",
}


def may_send(msg_type: type, sender: str) -> bool:
    """Whether a process called ``sender`` ever sends a status message of ``msg_type``
    (``SENDERS``)."""
    who = SENDERS.get(msg_type)
    return who == "*" or who == sender or (who == "rollout" and sender.startswith("rollout-"))


# ---- which channel carries what (each channel decodes only these; anything else is dropped) ----

CHANNELS: dict[str, tuple[type, ...]] = {
    "work": (WorkItem,),  # controller PUSH → rollout PULL
    "results": (GroupResult,),  # rollout PUSH → controller PULL
    "batches": (Batch,),  # controller PUSH → trainer rank 0 PULL
    "control": (UpdateWeights, StaleBefore, Sleep, Stop),  # controller PUB → rollout SUB
    "status": tuple(SENDERS),  # every process DEALER → controller ROUTER
    "ranks": (Batch, Stop),
    # rollout DEALER → reward-model ROUTER, and the replies back  # trainer rank 0 → the other ranks
    # (torch broadcast of the frame, ranks.py)
    "reward": (RewardRequest, RewardTaken, RewardReply),
}
