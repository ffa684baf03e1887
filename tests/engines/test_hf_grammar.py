"""The hf engine under a grammar (``Sequence.grammar``): on a random-weight model, which never
writes JSON by itself, every constrained sequence of the slot loop and of the paged path is JSON of
its schema and ends with the end-of-sequence token, also when a weight update interrupts it; its
logprobs are those of the masked distribution, while unconstrained rows beside it are untouched."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_engine

from areal_cli.engines.base import Sampling, Sequence
from areal_cli.workflows.agent.constraints import json_grammar

# bounded, so a random model's reply ends well inside its budget
SCHEMA = {"type": "object", "required": ["n", "mood", "ok"],
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "mood": {"enum": ["calm", "tense"]}, "ok": {"type": "boolean"}}}
PROMPT = [1, 9690, 198, 504, 3340, 28, 2]


def _valid(obj) -> bool:
    return (isinstance(obj, dict) and set(obj) == {"n", "mood", "ok"}
            and isinstance(obj["n"], int) and 0 <= obj["n"] <= 99
            and obj["mood"] in ("calm", "tense") and isinstance(obj["ok"], bool))


def _run(eng, seqs, update_after: int = -1) -> list:
    """Every sequence of ``seqs`` to its end; with ``update_after``, a weight update once a
    constrained sequence has that many tokens (by tokens, not polls: a poll's work depends on the
    machine's speed, and every reply must still be unfinished when the update comes)."""
    for s in seqs:
        eng.submit(s)
    done, steps, updated = [], 0, update_after < 0
    while len(done) < len(seqs) and steps < 4000:
        done += eng.poll(0.01)
        steps += 1
        if not updated and any(len(s.output_ids) >= update_after for s in seqs if s.grammar):
            updated = True
            with eng.paused(1), torch.no_grad():
                for p in eng.model.parameters():
                    p.mul_(1.1)
    assert len(done) == len(seqs)
    return done


def _check(tok, seqs) -> None:
    for s in seqs:
        if not s.grammar:
            continue
        assert s.finish_reason == "stop" and s.output_ids[-1] == tok.eos_token_id
        text = tok.decode(s.output_ids[:-1])
        assert _valid(json.loads(text)), text


@pytest.mark.parametrize("batching", ["slots", "paged"])
def test_constrained_sequences_are_json_of_their_schema_across_an_update(tiny_model, batching):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    eng = hf_engine(tiny_model, sequences=8, cpu_batching=batching)
    try:
        grammar = json_grammar(SCHEMA)
        seqs = [Sequence(f"c{i}", PROMPT + [i + 5], 48, grammar=grammar) for i in range(5)]
        free = [Sequence(f"f{i}", PROMPT + [i + 5], 24) for i in range(2)]
        _run(eng, seqs + free, update_after=3)
        _check(tok, seqs)
        assert {v for s in seqs for v in s.versions} == {0, 1}  # interrupted, and continued
        assert not eng.grammars.matchers  # forgotten with their sequences
    finally:
        eng.close()


def test_logprobs_are_of_the_masked_distribution_and_free_rows_are_untouched(tiny_model):
    """A teacher-forced forward, masked with a fresh matcher replaying the tokens, gives the
    constrained sequence's logprobs; the unconstrained sequence's are the plain log-softmax."""
    import llguidance
    import llguidance.hf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_cli.engines.hf.grammar import Grammars

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    eng = hf_engine(tiny_model, sequences=4)
    try:
        grammar = json_grammar(SCHEMA)
        c, f = Sequence("c", PROMPT, 48, grammar=grammar), Sequence("f", PROMPT, 12)
        _run(eng, [c, f])
    finally:
        eng.close()
    replay = Grammars(tiny_model, {tok.eos_token_id})
    replay.start("c", grammar)
    for seq in (c, f):
        ids = torch.tensor([PROMPT + seq.output_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(PROMPT) - 1: -1].float()
        want = []
        for k, (t, row) in enumerate(zip(seq.output_ids, logits, strict=True)):
            if seq.grammar:
                allowed = replay.allowed("c", row.shape[0], seq.max_new_tokens - k)
                row = row.masked_fill(~allowed, float("-inf"))
                replay.consume("c", t)
            want.append(torch.log_softmax(row, -1)[t].item())
        assert torch.allclose(torch.tensor(seq.logprobs), torch.tensor(want), atol=1e-4)
    assert llguidance and llguidance.hf  # the replay's matcher is llguidance's
    masked_mass = [lp for lp in c.logprobs if lp > -1e-6]
    assert masked_mass, "some constrained tokens are forced (probability 1 under the mask)"


def test_a_free_string_is_steered_to_close_before_the_budget_ends(tiny_model):
    """A random model inside a JSON string writes on (a closing quote is one token of 49k): near
    the end of its budget the engine keeps only the tokens that close, and every reply is whole."""
    import torch
    from transformers import AutoTokenizer

    from areal_cli.engines.hf.grammar import CLOSE_AT

    torch.manual_seed(0)  # the samples, not the property: a string may also close by chance
    tok = AutoTokenizer.from_pretrained(tiny_model)
    eng = hf_engine(tiny_model, sequences=4)
    try:
        grammar = json_grammar({"type": "object", "properties": {"s": {"type": "string"}},
                                "required": ["s"]})
        seqs = [Sequence(i, PROMPT + [i + 5], CLOSE_AT + 12, grammar=grammar) for i in range(4)]
        _run(eng, seqs)
    finally:
        eng.close()
    for s in seqs:
        assert s.finish_reason == "stop", tok.decode(s.output_ids)
        assert set(json.loads(tok.decode(s.output_ids[:-1]))) == {"s"}
    # a string ran on until the budget drew near (a random model closes one by chance at times)
    assert max(len(s.output_ids) for s in seqs) > 12


def test_a_grammar_that_does_not_compile_is_refused_at_submit(tiny_model):
    eng = hf_engine(tiny_model, sequences=2)
    try:
        with pytest.raises(ValueError, match="grammar is not valid"):
            eng.submit(Sequence("x", PROMPT, 8, grammar="start: %json {\"type\": 3}"))
        eng.configure(Sampling(1.0), 0)  # nothing was left in flight
    finally:
        eng.close()
