#!/usr/bin/env python3
"""A stand-in for an OpenAI-compatible chat completions server, for
.ci/systemd-smoke: the daemon under test talks to it over 127.0.0.1.

Built from the published wire format (POST /v1/chat/completions, non-streaming,
`choices[0].message` with `content` or `tool_calls`, `usage`); it is a fake, not
a model. What it answers:

- a user message containing `SMOKE-EXEC <command>` (and no tool result yet):
  a call of the `exec` tool with that command;
- after a tool result: `tool said: <the result>`;
- anything else: `pong`.

Every request body is appended to the log file given as the second argument
(one JSON document per line), so the smoke test can read what the daemon sent,
tool results included.

Usage: fake-openai.py PORT LOGFILE
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
LOG = sys.argv[2]
COUNTER = [0]


def reply(body):
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    COUNTER[0] += 1
    n = COUNTER[0]
    if last.get("role") == "tool":
        message = {"role": "assistant", "content": "tool said: " + str(last.get("content", ""))}
        reason = "stop"
    else:
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        marker = "SMOKE-EXEC "
        if marker in text:
            command = text.split(marker, 1)[1].strip()
            call = {
                "id": "call_%d" % n,
                "type": "function",
                "function": {"name": "exec", "arguments": json.dumps({"command": command})},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            reason = "tool_calls"
        else:
            message = {"role": "assistant", "content": "pong"}
            reason = "stop"
    return {
        "id": "chatcmpl-smoke-%d" % n,
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "smoke"),
        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            self.send_error(400, "bad json")
            return
        with open(LOG, "a") as f:
            f.write(json.dumps(body) + "\n")
        if not self.path.endswith("/chat/completions"):
            self.send_error(404, "not found")
            return
        out = json.dumps(reply(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        # The model list, as OpenAI's GET /v1/models answers (bramble doctor asks for it).
        if not self.path.endswith("/models"):
            self.send_error(404, "not found")
            return
        out = json.dumps({"object": "list", "data": [{"id": "gpt-4.1-mini", "object": "model", "owned_by": "fake"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
