"""The rollout worker's OpenAI-compatible endpoint, driven by the real ``openai`` client against the
embedded engine (a tiny random-weight model): every recorded id is the engine's, with its version,
across a weight update in the middle of an episode; chat with tools, streaming, n > 1, the Responses
API and completions; and every way an agent or a request can be wrong."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time

import numpy as np
import openai
import pytest
from agent_harness import PROGRAM, agent_setup, drive, holds, item, serve_while

from areal_cli.runtime import SWITCH_INTERVAL_S
from areal_cli.workflows.agent.bridge import CallId

# the same three calls (chat with tools, a streamed follow-up, n=2) made each way an agent comes in
THREE_CALLS = {"async": {"agent": "three_calls"},
               "async_processes": {"agent": "three_calls", "agent_processes": 2},
               "sync": {"agent": "three_calls_sync"},
               "async_blocking": {"agent": "three_calls_blocking"},
               "program": {"agent_cmd": f"python3 {PROGRAM}"},
               "program_sandboxed": {"agent_cmd": f"python3 {PROGRAM}", "agent_sandbox": True}}


@pytest.fixture
def setup(tiny_model):
    yield from agent_setup(tiny_model)


def _in_flight_with_tokens(eng):
    return lambda seen: len(seen) >= 2 and any(len(s.output_ids) >= 2 for s in eng.seqs.values())


@pytest.mark.parametrize("way", THREE_CALLS)
def test_recorded_trajectories_are_the_engines_ids_across_a_weight_update(setup, way):
    """Each way an agent comes in (an async function, a synchronous one, an async one marked
    blocking, a program over plain HTTP, sandboxed or not) is recorded alike: token-exact, with each
    token's version."""
    eng, make = setup
    flow = make(**THREE_CALLS[way])
    assert sys.getswitchinterval() <= SWITCH_INTERVAL_S  # the endpoint's thread gets the GIL soon
    flow.start(item(0, mode="three_calls"))
    [g], seen = drive(flow, eng, 1, update_at=_in_flight_with_tokens(eng))
    assert not g.failed and g.counters["agent_calls"] == 6 and g.counters["agent_splits"] == 0
    # each episode: one trajectory through its three calls, and call 3's second choice on its own
    assert sorted(s.episode for s in g.samples) == [0, 0, 1, 1]
    if "program" not in way:  # a program's reward is the task's (agent_reward=task)
        assert g.counters["agent_extra_choices"] == 4
    assert all(isinstance(s.rid, CallId) for s in seen) and len(seen) == 8
    # every sequence the engine produced is in a trajectory, exactly, with its versions
    for seq in seen:
        assert any(holds(s, seq) for s in g.samples), f"{seq.rid} is not recorded as generated"
    versions = np.concatenate([s.versions[s.loss_mask.astype(bool)] for s in g.samples])
    assert set(versions.tolist()) == {0, 1}, "the update fell between tokens of the episodes"
    for s in g.samples:
        assert (s.versions[s.loss_mask == 0] == -1).all() and (s.logprobs[s.loss_mask == 0]
                                                               == 0).all()


@pytest.mark.parametrize("agent", ["three_calls", "three_calls_sync"])
def test_every_episode_of_a_worker_calls_through_the_workers_connection_pools(setup, agent):
    eng, make = setup
    flow = make(agent)
    for g in range(3):  # one group after the other: 2 episodes at once
        flow.start(item(g))
        [result], _ = drive(flow, eng, 1)
        assert not result.failed
    # 18 calls of 6 episodes: the 2 connections of the first group are kept and reused, where a
    # client of its own per episode opened one at least (and read the system's certificates). The
    # synchronous openai client closes a stream's connection when it reads [DONE] (before the
    # chunked body's end): one more per episode's streamed call
    assert flow.endpoint.connections_opened <= 2 + (6 if agent.endswith("sync") else 0)
    assert flow.runner.http is not None and not any(h.is_closed for h in flow.runner.http.pools)


def test_calls_that_do_not_extend_each_other_are_separate_trajectories_of_one_episode(setup):
    eng, make = setup
    flow = make("plan_then_answer")
    flow.start(item(0, size=3))
    [g], _ = drive(flow, eng, 1)
    assert sorted(s.episode for s in g.samples) == [0, 0, 1, 1, 2, 2]
    assert g.counters["agent_splits"] == 3 and all(s.reward == 0.5 for s in g.samples)


def test_an_episode_takes_calls_only_from_the_agent_given_its_client(setup):
    """The worker's key alone reaches no episode: a sibling's URL, guessed from the agent's own
    (group and index known), is refused, with or without the agent's own secret; from the agent's
    own code, a call to it is recorded into the agent's own episode."""
    eng, make = setup
    flow = make("writes_into_its_sibling")
    flow.start(item(0, size=2))
    [g], _ = drive(flow, eng, 1)
    assert not g.failed and all(s.reward == 1.0 for s in g.samples)
    # two calls each, both its own: nothing written across
    assert g.counters["agent_calls"] == 4 and g.counters["agent_rerouted_calls"] == 2
    assert sorted(s.episode for s in g.samples) == [0, 0, 1, 1]


def test_a_request_whose_client_goes_away_is_stopped_in_the_engine(setup):
    """A client that disconnects while its call waits: the call is cancelled and its sequences
    leave the engine (nobody would read them), counted as agent_disconnected."""
    import httpx

    eng, make = setup
    flow = make("no_call")
    body = {"model": "m", "n": 3, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}

    def impatient():
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{flow.url}/chat/completions", json=body, timeout=0.5,
                       headers={"authorization": f"Bearer {flow.endpoint.token}"})

    t = threading.Thread(target=impatient)
    t.start()
    deadline = time.monotonic() + 10
    while len(eng.seqs) < 3 and time.monotonic() < deadline:  # submitted, never stepped
        flow.poll()
        time.sleep(0.01)
    assert len(eng.seqs) == 3
    t.join()
    deadline = time.monotonic() + 10
    while eng.seqs and time.monotonic() < deadline:  # the disconnect is seen within ~0.25 s
        flow.poll()
        time.sleep(0.05)
    assert not eng.seqs and flow.bridge.aborted == 3 and not flow.bridge.waiting
    assert flow.endpoint.counters["agent_disconnected"] == 1


def _still_serves(flow, eng) -> bool:
    """A plain call through the endpoint is answered (2 tokens, finish_reason length)."""
    out = {}

    def call():
        client = openai.OpenAI(base_url=flow.url, api_key=flow.endpoint.token, max_retries=0)
        out["reply"] = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        ).choices[0].finish_reason

    serve_while(flow, eng, call)
    return out == {"reply": "length"}


def test_idle_connections_past_the_cap_are_closed_and_the_endpoint_keeps_serving(setup, caplog):
    """Connections that send nothing: past workflow.agent_max_connections the oldest silent one is
    closed to make room, the others after workflow.agent_idle_timeout_s; calls go through as
    before."""
    import socket

    eng, make = setup
    flow = make("no_call", agent_max_connections=4, agent_idle_timeout_s=6.0)
    idle = [socket.create_connection(("127.0.0.1", flow.server.port)) for _ in range(5)]
    idle[0].settimeout(5)
    assert idle[0].recv(1) == b""  # the fifth made room: the oldest silent one, closed at once
    idle[1].settimeout(0.2)
    with pytest.raises(TimeoutError):
        idle[1].recv(1)  # the others still open, until the idle timeout
    for s in idle[1:]:
        s.settimeout(20)
    assert all(s.recv(1) == b"" for s in idle[1:])  # then closed
    for s in idle:
        s.close()
    assert _still_serves(flow, eng)
    assert flow.endpoint.counters["agent_refused_connections"] == 1
    assert "agent_refused_connections (1 since the worker started" in caplog.text


@pytest.mark.parametrize("sent", [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",  # headers never finished
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
    b"Authorization: Bearer {token}\r\n\r\n{\"m",  # the body never finished
], ids=["headers", "body"])
def test_a_request_trickled_in_is_closed_at_the_read_deadline(setup, sent):
    import socket

    eng, make = setup
    flow = make("no_call", agent_idle_timeout_s=1.0)
    slow = socket.create_connection(("127.0.0.1", flow.server.port))
    t0 = time.monotonic()
    slow.sendall(sent.replace(b"{token}", flow.endpoint.token.encode()))
    slow.settimeout(0.5)
    with pytest.raises(TimeoutError):  # a request on its way is not cut at once
        slow.recv(1)
    slow.sendall(b"X")  # one more byte: a trickle does not move the deadline
    slow.settimeout(5)
    assert slow.recv(1) == b""  # closed from the first byte's deadline on
    assert 0.9 < time.monotonic() - t0 < 3
    slow.close()
    assert flow.endpoint.counters["agent_slow_requests"] == 1
    assert _still_serves(flow, eng)  # a request that arrives whole, also past the deadline


def test_a_megabyte_prompt_is_tokenized_off_the_loop_while_small_calls_are_served(setup):
    """A 2 MB message within a long context's pre-check: its tokenizing (seconds) runs in a thread
    of its own, and a small call made meanwhile is answered before it ends."""
    import httpx

    eng, make = setup
    flow = make("no_call")
    # a long-context model: the pre-check (bytes / the longest token's bytes) lets 2 MB through,
    # the 400k tokens they make are then past the context
    flow.endpoint.context = 2_000_000 // flow.endpoint.token_bytes + 1
    assert flow.endpoint.context < 400_000
    auth = {"authorization": f"Bearer {flow.endpoint.token}"}
    times = {}

    def big():
        body = {"model": "m", "max_tokens": 1,
                "messages": [{"role": "user", "content": "word " * 400_000}]}
        t0 = time.monotonic()
        r = httpx.post(f"{flow.url}/chat/completions", json=body, headers=auth, timeout=120)
        times["big"] = (t0, time.monotonic(), r.status_code)

    def calls():
        t = threading.Thread(target=big)
        t.start()
        deadline = time.monotonic() + 60
        while not any(th.name.startswith("agent-tokenize") for th in threading.enumerate()):
            assert time.monotonic() < deadline, "the big prompt never reached the tokenizing thread"
            time.sleep(0.01)
        t0 = time.monotonic()
        client = openai.OpenAI(base_url=flow.url, api_key=flow.endpoint.token, max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2)
        times["small"] = (t0, time.monotonic())
        t.join(120)

    serve_while(flow, eng, calls, timeout_s=120)
    assert times["big"][2] == 400  # 400k tokens: past the context after tokenizing
    assert times["small"][1] < times["big"][1], times  # answered while the big one tokenized


def test_calls_outside_an_episode_are_budgeted(setup):
    """Plain /v1 calls (no episode trains on them) get workflow.agent_unattributed_sequences
    sequences in flight at once; a call past it is a 429, and the episodes' engine stays theirs."""
    eng, make = setup
    flow = make("no_call", agent_unattributed_sequences=2)
    out = {}

    def calls():
        client = openai.OpenAI(base_url=flow.url, api_key=flow.endpoint.token, max_retries=0)
        msg = [{"role": "user", "content": "hi"}]
        try:
            client.chat.completions.create(model="m", messages=msg, max_tokens=2, n=3)
        except openai.RateLimitError as err:
            out["n3"] = (err.status_code, "workflow.agent_unattributed_sequences" in str(err))
        out["n2"] = len(client.chat.completions.create(model="m", messages=msg, max_tokens=2,
                                                       n=2).choices)

    serve_while(flow, eng, calls)
    assert out == {"n3": (429, True), "n2": 2}
    assert flow.endpoint.counters["agent_refused_unattributed"] == 1
    assert flow.endpoint.unattributed == 0  # released when the call ended


def test_responses_api_and_completions_and_the_task_reward(setup):
    eng, make = setup
    flow = make("responses_and_completions")
    flow.start(item(0))
    [g], _ = drive(flow, eng, 1)
    assert not g.failed and g.counters["agent_calls"] == 4
    assert all(s.reward_status == "ok" and s.reward in (0.0, 1.0) for s in g.samples)


def test_a_forced_tool_choice_is_decoded_as_a_call_and_an_unoffered_name_is_refused(setup):
    """A random model, which never writes a call by itself, returns a parsed call when tool_choice
    names the tool (decoded under the call's grammar); its tokens are the model's, trained."""
    eng, make = setup
    flow = make("forced_call", max_new_tokens=40)
    flow.start(item(0))
    [g], seen = drive(flow, eng, 1)
    assert len(g.samples) == 2 and g.counters["agent_calls"] == 2
    for s in g.samples:
        assert s.reward == 1.0 and any(holds(s, seq) for seq in seen)
    assert g.counters["tool_parse_errors"] == 0 and g.counters["agent_tool_calls"] == 2
    assert all(seq.grammar and seq.output_ids[-1] == 2 for seq in seen)  # ended by the grammar


@pytest.mark.parametrize("agent, why",
                         [("raises", "the agent's own bug"), ("hangs", "agent_timeout_s"),
                          ("no_call", "made no call"), ("bad_return", "return a finite float"),
                          ("raises_sync", "the agent's own bug"),
                          ("hangs_sync", "not counted): its thread cannot be killed")])
def test_a_failing_agent_drops_its_group_and_is_named_in_the_log(setup, caplog, agent, why):
    eng, make = setup
    # only the hanging agents meet the clock; the others' model calls may take any time on a
    # slow CPU
    flow = make(agent, agent_timeout_s=2.0 if agent.startswith("hangs") else 600.0)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0))
        [g], _ = drive(flow, eng, 1, timeout_s=60)
    assert g.failed == 2 and g.samples == [] and g.counters["agent_failed"] == 2
    assert why in caplog.text and f"agent_cases:{agent}" in caplog.text


@pytest.mark.parametrize("agent, why", [("raises", "the agent's own bug"),
                                        ("hangs", "agent_timeout_s"),
                                        ("bad_return", "return a finite float")])
def test_an_agent_failing_in_an_agent_process_drops_its_group_alone(setup, caplog, agent, why):
    """In an agent process, as in the worker's loop: the failure is named, the group dropped, and
    the process serves the next group (a timed-out episode's task is cancelled there)."""
    eng, make = setup
    flow = make(agent, agent_processes=1,
                agent_timeout_s=2.0 if agent == "hangs" else 600.0)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0))
        [g], _ = drive(flow, eng, 1, timeout_s=60)
    assert g.failed == 2 and g.samples == [] and g.counters["agent_failed"] == 2
    assert why in caplog.text and f"agent_cases:{agent}" in caplog.text
    [proc] = flow.runner.procs
    assert not proc.dead and proc.pending == {}


def test_a_dead_agent_process_fails_its_episodes_and_the_next_group_gets_a_new_one(setup, caplog):
    eng, make = setup
    flow = make("exits_when_told", agent_processes=1, agent_concurrency=2)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0, exit=True))
        [g], _ = drive(flow, eng, 1, timeout_s=60)
    assert g.failed == 2 and "exited with code 3" in caplog.text
    first = flow.runner.procs[0]
    assert first.dead and first.popen.returncode == 3
    flow.start(item(1))
    [g], _ = drive(flow, eng, 1, timeout_s=60)
    assert not g.failed and all(s.reward == 1.0 for s in g.samples)
    assert flow.runner.procs[0] is not first and not flow.runner.procs[0].dead


def test_a_frame_that_is_not_an_answer_stops_its_agent_process(setup, caplog):
    eng, make = setup
    flow = make("writes_a_bad_frame", agent_processes=1, agent_concurrency=2)
    with caplog.at_level(logging.ERROR):
        flow.start(item(0))
        [g], _ = drive(flow, eng, 1, timeout_s=60)
    assert g.failed == 2 and "a frame that is not an answer" in caplog.text
    assert flow.runner.procs[0].dead and flow.runner.procs[0].popen.returncode is not None


def test_requests_without_the_token_or_beyond_the_context_get_openais_errors(setup):
    eng, make = setup
    flow = make("no_call")
    out = {}

    def client_calls():
        good = openai.OpenAI(base_url=flow.url, api_key=flow.endpoint.token, max_retries=0)
        bad = openai.OpenAI(base_url=flow.url, api_key="wrong", max_retries=0)
        try:
            bad.models.list()
        except openai.AuthenticationError as err:
            out["401"] = err.status_code
        try:
            good.chat.completions.create(model="m",
                                         messages=[{"role": "user", "content": "x " * 2000}])
        except openai.BadRequestError as err:
            out["context"] = err.code
        try:
            good.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
        except openai.BadRequestError as err:
            out["role"] = err.param
        vocab = len(flow.tok)
        try:  # an id past the tokenizer's (another tokenizer's, or an attacker's)
            good.completions.create(model="m", prompt=[1, 2, vocab], max_tokens=2)
        except openai.BadRequestError as err:
            out["vocab"] = (err.param, f"prompt[2] = {vocab} is not a token id" in str(err))
        out["ids"] = good.completions.create(model="m", prompt=[1, 2, vocab - 1],
                                             max_tokens=2).choices[0].finish_reason
        import httpx

        auth = {"authorization": f"Bearer {flow.endpoint.token}"}
        url = f"{flow.url}/chat/completions"
        # JSON nested 100,000 deep: an answer, not an unhandled RecursionError (500)
        out["deep"] = httpx.post(url, content=b"[" * 100_000 + b"]" * 100_000,
                                 headers=auth).status_code
        # past workflow.agent_max_body_mb (4): refused before it is parsed, declared or streamed
        out["large"] = httpx.post(url, content=b" " * (5 << 20), headers=auth).status_code
        chunks = (b" " * (1 << 20) for _ in range(5))  # no Content-Length: chunked
        out["large_streamed"] = httpx.post(url, content=chunks, headers=auth).status_code
        try:  # 3 MB of text: past the context before a token is counted (never tokenized)
            good.chat.completions.create(model="m",
                                         messages=[{"role": "user", "content": "word " * 600_000}])
        except openai.BadRequestError as err:
            out["huge"] = (err.code, "bytes, at least" in str(err))
        out["models"] = [m.id for m in good.models.list()]
        out["plain"] = good.chat.completions.create(model="m",
                                                    messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=3).choices[0].finish_reason

    serve_while(flow, eng, client_calls, timeout_s=60)
    assert out == {"401": 401, "context": "context_length_exceeded", "role": "messages[0]",
                   "vocab": ("prompt[2]", True), "ids": "length", "deep": 400, "large": 413,
                   "large_streamed": 413, "huge": ("context_length_exceeded", True),
                   "models": ["tiny"],
                   "plain": "length"}
    c = flow.endpoint.counters
    assert (c["agent_unauthorized"] == 1 and c["agent_bad_requests"] == 5
            and c["agent_unattributed_calls"] == 2 and c["agent_refused_large"] == 2)
    assert flow.server.sock.getsockname()[0] == "127.0.0.1"
