#!/bin/sh
# An agent that is a program (workflow.agent_cmd): one chat call with curl to the episode's
# endpoint, which areal hands it in OPENAI_BASE_URL and OPENAI_API_KEY. The problem comes as JSON
# ({"id", "prompt", "meta"}) on stdin and in $AREAL_PROBLEM_FILE; python3 only builds the request's
# JSON. The reply need not be read back: areal records it, and the task's reward scores it.
#
#   areal train workflow=agent workflow.agent_cmd="sh examples/agents/curl_agent.sh"
set -eu
body=$(python3 -c 'import json, sys
p = json.load(sys.stdin)
print(json.dumps({"model": "policy", "messages": [{"role": "user", "content": p["prompt"]}]}))')
curl -sS --fail-with-body --max-time 600 "$OPENAI_BASE_URL/chat/completions" \
  -H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" \
  -d "$body" > /dev/null
