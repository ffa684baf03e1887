"""An agent program the endpoint tests run (workflow.agent_cmd="python3 <this file>"): the standard
library only, so it runs in the sandbox's bare system too. It reads the problem from stdin and does
what the problem's ``meta["mode"]`` says."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

TOOLS = [{"type": "function",
          "function": {"name": "calculate", "description": "Evaluate arithmetic.",
                       "parameters": {"type": "object", "properties": {}}}}]


def call(path, body):
    """POST ``body`` to the episode's ``path``: the reply's JSON, or a stream's chunks."""
    req = urllib.request.Request(f"{os.environ['OPENAI_BASE_URL']}/{path}",
                                 data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        raw = r.read().decode()
    if not body.get("stream"):
        return json.loads(raw)
    return [json.loads(line[6:]) for line in raw.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def chat(messages, **kw):
    return call("chat/completions", dict(model="policy", messages=messages, **kw))


def three_calls(problem):
    """agent_cases.three_calls over plain HTTP: chat with tools, a streamed follow-up, then n=2."""
    messages = [{"role": "user", "content": problem["prompt"]}]
    first = chat(messages, tools=TOOLS, max_tokens=6)["choices"][0]["message"]
    messages += [{k: v for k, v in first.items() if v is not None},
                 {"role": "user", "content": "Go on."}]
    chunks = chat(messages, max_tokens=6, stream=True)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Once more."}]
    assert len(chat(messages, max_tokens=6, n=2)["choices"]) == 2


def probe(meta):
    """In the sandbox: what else than the endpoint it can reach and write."""
    out = {"reward": 1.0, "reached_other": 0, "wrote_outside": 0}
    try:
        socket.create_connection(("127.0.0.1", meta["other_port"]), timeout=2).close()
        out["reached_other"] = 1
    except OSError:
        pass
    try:
        with open(meta["outside"], "w") as f:
            f.write("escaped")
        out["wrote_outside"] = 1
    except OSError:
        pass
    return out


def main():
    problem = json.load(sys.stdin)
    meta = problem["meta"]
    mode = meta.get("mode", "one_call")
    assert "answer" not in problem and json.load(open(os.environ["AREAL_PROBLEM_FILE"])) == problem
    if mode == "three_calls":
        return three_calls(problem)
    chat([{"role": "user", "content": problem["prompt"]}], max_tokens=2)
    if mode == "sleep":  # a child of its own too: the whole group must go
        child = subprocess.Popen(["sleep", "3600"])
        with open(meta["pid_file"], "w") as f:
            f.write(str(child.pid))
        time.sleep(3600)
    elif mode == "fail":
        print("working on it", file=sys.stderr)
        print("Traceback: the program's own bug", file=sys.stderr)
        sys.exit(1)
    elif mode == "hog":  # past workflow.agent_memory_mb
        bytearray(meta["mb"] << 20)
    elif mode == "flood":  # 20 MB of stderr, then a failure
        for _ in range(20):
            sys.stderr.write("x" * (1 << 20))
        sys.exit(3)
    elif mode == "reward":
        path = os.environ["AREAL_REWARD_FILE"]
        if meta.get("link"):
            os.symlink(meta["link"], path)
        else:
            with open(path, "w") as f:
                f.write(meta["reward_text"])
    elif mode == "probe":
        with open(os.environ["AREAL_REWARD_FILE"], "w") as f:
            json.dump(probe(meta), f)


if __name__ == "__main__":
    main()
