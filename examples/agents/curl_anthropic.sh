#!/bin/sh
# An agent that is a program (workflow.agent_cmd) in Anthropic's dialect: one Messages API call with
# curl to the episode's endpoint, which areal hands it in ANTHROPIC_BASE_URL (the URL the anthropic
# client takes: /v1/messages is appended) and ANTHROPIC_API_KEY. The problem comes as JSON
# ({"id", "prompt", "meta"}) on stdin and in $AREAL_PROBLEM_FILE; python3 only builds the request's
# JSON. max_tokens is required by the API (the run's rollout.max_new_tokens caps it). The reply need
# not be read back: areal records it, and the task's reward scores it.
#
#   areal train workflow=agent workflow.agent_cmd="sh examples/agents/curl_anthropic.sh"
set -eu
body=$(python3 -c 'import json, sys
p = json.load(sys.stdin)
print(json.dumps({"model": "policy", "max_tokens": 1024,
                  "messages": [{"role": "user", "content": p["prompt"]}]}))')
curl -sS --fail-with-body --max-time 600 "$ANTHROPIC_BASE_URL/v1/messages" \
  -H "x-api-key: $ANTHROPIC_API_KEY" -H "anthropic-version: 2023-06-01" \
  -H "Content-Type: application/json" -d "$body" > /dev/null
