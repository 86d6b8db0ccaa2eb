"""A local OpenAI-compatible server for tests: the real OpenAI SDK talks to it over HTTP
on 127.0.0.1 (no patched client, no network)."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def completion(content: Any = None, tool_calls: list[tuple[str, Any]] | None = None,
               usage: tuple[int, int] = (10, 5), model: str = "gpt-test") -> dict[str, Any]:
    """A canned ``chat.completion`` body."""
    text = json.dumps(content) if isinstance(content, dict | list) else content
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate(tool_calls)]
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion",
            "created": 1_700_000_000, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                      "total_tokens": usage[0] + usage[1]}}


class FakeOpenAI:
    """Serves ``POST /v1/chat/completions`` on 127.0.0.1 and records every request.

    Replies come from a queue of canned (status, body) pairs (`reply`, `fail`), or, when
    the queue is empty and ``answer`` is given, ``answer(request body)`` is the
    assistant's content (usage 100 + 20 tokens).

    A request with ``stream: true`` gets the reply as server-sent ``chat.completion.chunk``
    events, a word at a time; with ``stream_gate`` set, the server sends the first word,
    then waits (up to 30 s) for the gate before it sends the rest (``gate_waited`` says
    whether the gate opened in time): a test can see the first word arrive live."""

    def __init__(self, answer: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.queue: deque[tuple[int, dict[str, Any]]] = deque()
        self.requests: list[dict[str, Any]] = []
        self.stream_gate: threading.Event | None = None
        self.gate_waited: bool | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "body": body,
                                      "auth": self.headers.get("Authorization")})
                if self.path != "/v1/chat/completions":
                    status, payload = 404, {"error": {"message": f"no route {self.path}"}}
                elif fake.queue:
                    status, payload = fake.queue.popleft()
                elif answer is not None:
                    status, payload = 200, completion(answer(body), usage=(100, 20),
                                                      model=str(body.get("model")))
                else:
                    status, payload = 500, {"error": {"message": "the test queued no reply"}}
                if body.get("stream") and status == 200:
                    self._stream(payload)
                    return
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

            def _stream(self, payload: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                message = payload["choices"][0]["message"]
                base = {"id": payload["id"], "object": "chat.completion.chunk",
                        "created": payload["created"], "model": payload["model"]}

                def send(choices: list[Any], usage: Any = None) -> None:
                    chunk = {**base, "choices": choices}
                    if usage is not None:
                        chunk["usage"] = usage
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()

                words = re.findall(r"\S+\s*", message.get("content") or "")
                for i, word in enumerate(words):
                    send([{"index": 0, "delta": {"role": "assistant", "content": word},
                           "finish_reason": None}])
                    if i == 0 and fake.stream_gate is not None:
                        fake.gate_waited = fake.stream_gate.wait(30)
                for i, call in enumerate(message.get("tool_calls") or []):
                    send([{"index": 0, "delta": {"tool_calls": [{
                        "index": i, "id": call["id"], "type": "function",
                        "function": call["function"]}]}, "finish_reason": None}])
                send([{"index": 0, "delta": {},
                       "finish_reason": payload["choices"][0]["finish_reason"]}])
                send([], payload["usage"])
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def reply(self, content: Any = None, tool_calls: list[tuple[str, Any]] | None = None,
              usage: tuple[int, int] = (10, 5)) -> FakeOpenAI:
        self.queue.append((200, completion(content, tool_calls, usage)))
        return self

    def fail(self, status: int, message: str) -> FakeOpenAI:
        self.queue.append((status, {"error": {"message": message, "type": "error",
                                              "code": str(status)}}))
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
