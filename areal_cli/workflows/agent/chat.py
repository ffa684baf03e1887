"""Chat messages → the prompt token ids an engine sees, without re-tokenising what the model wrote.

An episode's calls usually extend each other: call k+1 sends call k's messages, the assistant
message call k returned, then new messages (tool results, a user turn). Such a prompt is built as
call k's exact ids (its prompt and the sampled tokens) followed by the template's rendering of what
is new — the text the template puts after the assistant turn and the new messages with the
generation prompt — tokenised alone. So the ids the model saw, and the trainer trains on, are the
engine's own, and the earlier turns are never re-rendered into different tokens.

Where that cannot be done — the messages do not start with an earlier call's messages and reply, or
the template renders the earlier messages differently once more follow (template drift) — the
prompt is the whole rendering, tokenised, and the call starts a new trajectory (``Prompt.extends``
is None); the episode counts the split.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_cli.workflows.agent.toolcalls import (
    ToolStyle,
    arguments_value,
    call_text,
    tools_system_text,
)


@dataclass
class Reply:
    """One choice a call returned: the messages it answered plus the assistant message, and the
    ids."""

    messages: list[dict]  # normalised request messages + the assistant message returned
    # the call's prompt ids + the sampled ids, exactly as the engine saw and produced them
    ids: list[int]
    ended: bool  # the sampled ids end with the end-of-turn (EOS) token


@dataclass
class Prompt:
    ids: list[int]
    # the earlier reply these ids continue exactly, or None (a new trajectory)
    extends: Reply | None


def normalise(messages: list[dict]) -> list[dict]:
    """Messages as compared and rendered: role, text content (parts joined), tool calls as
    (name, arguments object), tool_call_id and name; every other field dropped."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        n = {"role": m["role"], "content": content or ""}
        if m.get("tool_calls"):
            n["tool_calls"] = [{"type": "function", "function": {
                "name": c["function"]["name"],
                "arguments": arguments_value(c["function"].get("arguments"))}}
                for c in m["tool_calls"]]
        for key in ("tool_call_id", "name"):
            if m.get(key):
                n[key] = m[key]
        out.append(n)
    return out


class ChatRenderer:
    """Renders an episode's requests with ``tokenizer``'s chat template in ``style``."""

    def __init__(self, tokenizer, style: ToolStyle):
        self.tok, self.style = tokenizer, style
        self.eos_text = tokenizer.eos_token or ""

    def text(self, messages: list[dict], tools: list[dict] | None, generation: bool) -> str:
        msgs = messages if self.style.native else self._as_text(messages, tools)
        kw = {"tools": tools} if (tools and self.style.native) else {}
        return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation,
                                            **kw)

    def _as_text(self, messages: list[dict], tools: list[dict] | None) -> list[dict]:
        """For a template that renders no tools: schemas in the system message, calls and results as
        text."""
        out = []
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                body = "\n".join(x for x in (m["content"], call_text(self.style, m["tool_calls"]))
                                 if x)
                out.append({"role": "assistant", "content": body})
            elif m["role"] == "tool":
                out.append({"role": "user",
                            "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
            else:
                out.append({"role": m["role"], "content": m["content"]})
        if tools:
            offer = tools_system_text(tools)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{offer}"}
            else:
                out.insert(0, {"role": "system", "content": offer})
        return out

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def prompt(self, messages: list[dict], tools: list[dict] | None,
               history: list[Reply]) -> Prompt:
        """The prompt ids of ``messages`` (normalised), continuing the longest earlier reply whose
        messages they start with, when the template renders that reply's messages as a prefix."""
        full = self.text(messages, tools, generation=True)
        for reply in sorted(history, key=lambda r: -len(r.messages)):
            k = len(reply.messages)
            if k >= len(messages) or messages[:k] != reply.messages:
                continue
            head = self.text(reply.messages, tools, generation=False)
            closer = self._closer(head, reply.ended)
            if closer is None or not full.startswith(head):
                break  # template drift: the earlier turns render differently now
            return Prompt(reply.ids + self.encode(closer + full[len(head):]), reply)
        return Prompt(self.encode(full), None)

    def _closer(self, head: str, ended: bool) -> str | None:
        """The template's text after the model's last turn in ``head``: what follows its end-of-turn
        token (that token too when the model did not write it: stopped by length or a stop
        string)."""
        if not self.eos_text:
            return ""
        at = head.rfind(self.eos_text)
        if at < 0:
            return None
        return head[at + len(self.eos_text):] if ended else head[at:]
