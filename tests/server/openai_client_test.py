#!/usr/bin/env python3
"""`ds41 serve` driven by real clients: the official `openai` Python package (chat with and
without streaming, a tool-call round trip, completions, models) and curl for the raw SSE stream.

Usage: openai_client_test.py DS41_BINARY SHARED_DIR
Exit 77 (CTest: skipped) when the `openai` package or curl is missing or the shared assets are
not there.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def main():
    ds41, shared = sys.argv[1], os.environ.get("DS41_SHARED_DIR", sys.argv[2])
    tokenizer = os.path.join(shared, "assets", "deepseek_v3_tokenizer", "tokenizer.json")
    try:
        import openai
    except ImportError:
        print("SKIP: the openai package is not installed (pip install openai)")
        return 77
    if not os.path.exists(tokenizer) or shutil.which("curl") is None:
        print("SKIP: shared assets or curl missing")
        return 77

    tmp = tempfile.mkdtemp(prefix="ds41-openai-")
    model = os.path.join(tmp, "tiny")
    subprocess.run([ds41, "mkmodel", "--preset", "tiny", "--out", model, "--tokenizer", tokenizer, "--quiet",
                    "--threads", "2"], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([ds41, "serve", "-m", model, "--port", str(port), "--model-name", "tiny", "--threads",
                               "2", "--temp", "0", "--api-key", "k"], stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                out = subprocess.run(["curl", "-sf", base + "/health"], capture_output=True, text=True)
                if out.returncode == 0:
                    break
            except OSError:
                pass
            if server.poll() is not None:
                print(server.stderr.read())
                return 1
            time.sleep(0.1)
        client = openai.OpenAI(base_url=base + "/v1", api_key="k")

        assert [m.id for m in client.models.list().data] == ["tiny"]

        msgs = [{"role": "user", "content": "Say hello"}]
        whole = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10)
        assert whole.choices[0].finish_reason in ("stop", "length"), whole
        assert whole.usage.completion_tokens <= 10
        text = whole.choices[0].message.content
        pieces = []
        usage = None
        for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                if ch.delta.content:
                    pieces.append(ch.delta.content)
        assert "".join(pieces) == text, ("".join(pieces), text)
        assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

        # Tool-call round trip: the tools, the assistant's call and the tool's result are accepted
        # and encoded (a random-weight model will not call tools on its own, so the call is given).
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        convo = [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
        r = client.chat.completions.create(model="tiny", messages=convo, tools=tools, max_tokens=8)
        assert r.choices[0].message.role == "assistant"
        assert r.usage.prompt_tokens > 100  # the tool schemas block is in the prompt

        # Thinking mode via reasoning_effort: the answer may carry reasoning_content.
        t = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, reasoning_effort="high")
        assert t.choices[0].finish_reason in ("stop", "length")

        comp = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5)
        assert comp.usage.completion_tokens == 5

        # Errors come back as the client's exception types.
        try:
            client.chat.completions.create(model="nope", messages=msgs)
            raise AssertionError("unknown model accepted")
        except openai.NotFoundError:
            pass
        try:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": 5}])
            raise AssertionError("bad content accepted")
        except openai.BadRequestError:
            pass
        try:
            openai.OpenAI(base_url=base + "/v1", api_key="wrong").models.list()
            raise AssertionError("wrong key accepted")
        except openai.AuthenticationError:
            pass

        # Raw SSE with curl.
        body = json.dumps({"model": "tiny", "messages": msgs, "max_tokens": 4, "stream": True})
        out = subprocess.run(["curl", "-sN", "-H", "Authorization: Bearer k", "-H", "Content-Type: application/json",
                              "-d", body, base + "/v1/chat/completions"], capture_output=True, text=True, check=True)
        events = [l[6:] for l in out.stdout.split("\n") if l.startswith("data: ")]
        assert events[-1] == "[DONE]", out.stdout
        assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])
        print("openai client + curl: all checks passed")
        return 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
