"""A zero-latency OpenAI-compatible chat server for benches/compare.sh: the
first call of a turn asks for the `exec` tool (`true`), the call after the
tool result answers in text. Stateless: it looks at the request's messages
after the last user message. Streams (server-sent events) when asked to,
as nanobot does. With FAKE_LLM_RECORD=<file>, each request is appended to
that file as one line, {"path", "chars" (characters of the body as sent),
"body"} (the first-prompt-size measurement reads it)."""
import http.server, json, os, sys

RECORD = os.environ.get("FAKE_LLM_RECORD")

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; without TCP_NODELAY the body
    # waits for the client's delayed ACK (~40 ms a response, for both agents).
    # Real servers (uvicorn, llama.cpp, Ollama) set it.
    disable_nagle_algorithm = True
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.reply(body)
    def do_POST(self):
        n = int(self.headers.get("content-length", 0))
        raw = self.rfile.read(n)
        if RECORD:
            text = raw.decode("utf-8", "replace")
            line = {"path": self.path, "chars": len(text), "body": json.loads(raw or b"{}")}
            with open(RECORD, "ab") as f:
                f.write(json.dumps(line, ensure_ascii=False).encode() + b"\n")
        req = json.loads(raw or b"{}")
        msgs = req.get("messages", [])
        last_user = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=-1)
        if any(m.get("role") == "tool" for m in msgs[last_user + 1:]):
            msg = {"role": "assistant", "content": "done"}
            finish = "stop"
        else:
            msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "exec", "arguments": json.dumps({"command": "true"})}}]}
            finish = "tool_calls"
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        if req.get("stream"):
            # Server-sent events, as OpenAI streams (nanobot asks for a stream).
            delta = dict(msg)
            if "tool_calls" in delta:
                delta["tool_calls"] = [dict(c, index=0) for c in delta["tool_calls"]]
            chunk = lambda d, f, u=None: {"id": "x", "object": "chat.completion.chunk", "created": 0,
                                         "model": req.get("model", "m"),
                                         "choices": [{"index": 0, "delta": d, "finish_reason": f}],
                                         **({"usage": u} if u else {})}
            events = [chunk(delta, None), chunk({}, finish, usage)]
            data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": req.get("model", "m"),
                           "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                           "usage": usage}).encode()
        self.reply(body)
    def reply(self, body):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
srv.serve_forever()
