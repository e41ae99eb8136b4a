#!/usr/bin/env python3
"""`ds41 serve` driven by real clients: the official `openai` Python package (chat with and
without streaming, a tool-call round trip, completions, models) and curl for the raw SSE stream.

Usage: openai_client_test.py DS41_BINARY SHARED_DIR
Exit 77 (CTest: skipped) when the `openai` package or curl is missing or the shared assets are
not there.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from server_process import start_server


def check_logprobs(client, msgs):
    """logprobs / top_logprobs in chat (whole and streamed: the same entries) and completions
    (logprobs with echo: the prompt's tokens first, the first without a value)."""
    whole = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, logprobs=True, top_logprobs=3)
    entries = whole.choices[0].logprobs.content
    assert len(entries) == whole.usage.completion_tokens or whole.choices[0].finish_reason == "stop", whole
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3, e
        # Greedy (the server's --temp 0): the chosen token is the likeliest, first among the alternatives.
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob, e
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob, e
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1.0 + 1e-6, e
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token, e
    # The entries spell the answer (a random model's answer is all content in chat mode).
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == whole.choices[0].message.content
    streamed = []
    for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, logprobs=True,
                                                top_logprobs=3, stream=True):
        for ch in chunk.choices:
            if ch.logprobs and ch.logprobs.content:
                streamed += ch.logprobs.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]
    plain = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content
    try:
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, top_logprobs=2)
        raise AssertionError("top_logprobs without logprobs accepted")
    except openai_module().BadRequestError:
        pass
    try:
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, logprobs=True, top_logprobs=21)
        raise AssertionError("top_logprobs 21 accepted")
    except openai_module().BadRequestError:
        pass
    comp = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=3, logprobs=2, echo=True)
    text, lp = comp.choices[0].text, comp.choices[0].logprobs
    assert text.startswith("Once upon a time"), text
    # The prompt's first token has a value: conditioned on the BOS the server puts first (not echoed).
    assert all(v <= 0 for v in lp.token_logprobs) and all(len(t) <= 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == text and lp.text_offset[0] == 0
    assert all(text[o:].startswith(t) for o, t in zip(lp.text_offset, lp.tokens) if "\ufffd" not in t)
    bos = client.completions.create(model="tiny", prompt="<｜begin▁of▁sentence｜>Once upon a time", max_tokens=1,
                                    logprobs=1, echo=True).choices[0].logprobs
    assert bos.tokens[0] == "<｜begin▁of▁sentence｜>" and bos.token_logprobs[0] is None and bos.top_logprobs[0] is None
    assert bos.token_logprobs[1:5] == lp.token_logprobs[:4], (bos.token_logprobs, lp.token_logprobs)
    gen = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=3, logprobs=2)
    assert gen.choices[0].logprobs.tokens == lp.tokens[-len(gen.choices[0].logprobs.tokens):]
    assert gen.choices[0].logprobs.token_logprobs == lp.token_logprobs[-3:]
    print("logprobs: chat (whole = streamed), completions with echo")


def check_choices(client, msgs):
    """n choices: one prefill, forked; choice i is the answer of the same request with seed + i."""
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, n=3, temperature=1.0, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for i in range(3):
        one = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, seed=5 + i)
        assert one.choices[0].message.content == r.choices[i].message.content, i
        assert one.choices[0].finish_reason == r.choices[i].finish_reason
    assert r.usage.completion_tokens == 3 * 6  # max_tokens each (a random model rarely ends by itself)
    parts, finished, usage = {}, {}, None
    for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, n=3, temperature=1.0, seed=5,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.setdefault(c.index, []).append(c.delta.content or "")
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert ["".join(parts[i]) for i in range(3)] == [c.message.content for c in r.choices]
    assert sorted(finished) == [0, 1, 2] and usage is not None and usage.completion_tokens == r.usage.completion_tokens
    comp = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=4, n=2, temperature=1.0, seed=9)
    assert [c.index for c in comp.choices] == [0, 1] and comp.usage.completion_tokens == 8
    try:
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, n=9)
        raise AssertionError("n = 9 accepted")
    except openai_module().BadRequestError:
        pass
    print("n: 3 choices = 3 requests with seeds 5, 6, 7 (whole and streamed)")


def check_structured_output(client, base):
    """response_format json_object and json_schema (strict): 50 sampled answers on the tiny model
    (random weights: it would never write JSON by itself) parse and validate against their schema
    (the jsonschema package as the oracle); the constraint's cost per token from /metrics."""
    import jsonschema
    schemas = [
        None,  # json_object
        {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "why": {"type": "string"}},
         "required": ["answer", "why"], "additionalProperties": False},
        {"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": ["number", "null"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                        "required": ["city", "zip"], "additionalProperties": False}},
         "required": ["name", "age", "score", "tags", "address"], "additionalProperties": False},
        {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
            "id": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["id", "ok"], "additionalProperties": False}}},
         "required": ["items"], "additionalProperties": False},
    ]
    valid = 0
    for i in range(50):
        schema = schemas[i % len(schemas)]
        rf = {"type": "json_object"} if schema is None else \
            {"type": "json_schema", "json_schema": {"name": "s%d" % (i % len(schemas)), "strict": True, "schema": schema}}
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Answer in JSON. %d" % i}],
                                           max_tokens=80 + i, temperature=1.0, seed=i, response_format=rf)
        text = r.choices[0].message.content
        value = json.loads(text)  # raises on anything but one JSON document
        if schema is None:
            assert isinstance(value, dict), text
        else:
            jsonschema.validate(value, schema)
        assert r.choices[0].finish_reason == "stop", (r.choices[0].finish_reason, text)
        valid += 1
    # A forced tool call: its arguments held to the function's schema through the DSML parameters.
    params = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                               "units": {"enum": ["c", "f"]}},
              "required": ["city", "days"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": params}}]
    calls = 0
    for i in range(10):
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather? %d" % i}],
                                           tools=tools, max_tokens=120, temperature=1.0, seed=100 + i,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
        tc = r.choices[0].message.tool_calls
        assert tc and tc[0].function.name == "get_weather", r
        jsonschema.validate(json.loads(tc[0].function.arguments), params)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason
        calls += 1
    # tool_choice "required": a call of either tool, its arguments held to that tool's schema.
    search = {"type": "object", "properties": {"q": {"type": "string"}, "top": {"type": "integer"}}, "required": ["q"]}
    both = tools + [{"type": "function", "function": {"name": "search", "parameters": search}}]
    for i in range(5):
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Go %d" % i}],
                                           tools=both, max_tokens=120, temperature=1.0, seed=200 + i, tool_choice="required")
        tc = r.choices[0].message.tool_calls
        assert tc and tc[0].function.name in ("get_weather", "search"), r
        jsonschema.validate(json.loads(tc[0].function.arguments), params if tc[0].function.name == "get_weather" else search)
        calls += 1
    try:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {
                                           "type": "string", "pattern": "^a"}}})
        raise AssertionError("an unsupported schema keyword was accepted")
    except openai_module().BadRequestError:
        pass
    with urllib.request.urlopen(urllib.request.Request(base.replace("/v1", "") + "/metrics")) as m:
        lines = dict(l.split(" ", 1) for l in m.read().decode().splitlines() if l.startswith("ds41_structured"))
    masks, seconds = int(lines["ds41_structured_output_masks_total"]), float(lines["ds41_structured_output_mask_seconds_total"])
    print("structured output: %d/50 answers valid, %d/15 forced tool calls valid; %d token masks, %.2f ms each" %
          (valid, calls, masks, 1e3 * seconds / max(masks, 1)))


def check_models_tokenize_cors(client, base, openai):
    assert client.models.retrieve("tiny").id == "tiny"
    try:
        client.models.retrieve("other")
        raise AssertionError("an unknown model id was found")
    except openai.NotFoundError:
        pass

    def call(path, body=None, method=None, headers=None):
        h = {"Authorization": "Bearer k", "Content-Type": "application/json"}
        h.update(headers or {})
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(base + path, data=data, headers=h, method=method)
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    text = "Hello wörld 😀, tokens!"
    status, _, raw = call("/tokenize", {"content": text})
    ids = json.loads(raw)["tokens"]
    assert status == 200 and all(isinstance(i, int) for i in ids)
    status, _, raw = call("/detokenize", {"tokens": ids})
    assert status == 200 and json.loads(raw)["content"] == text
    status, _, raw = call("/tokenize", {"content": text, "with_pieces": True, "add_special": True})
    pieces = json.loads(raw)["tokens"]
    assert pieces[0]["id"] == 0 and [p["id"] for p in pieces[1:]] == ids
    spelled = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces[1:])
    assert spelled.decode() == text
    assert call("/detokenize", {"tokens": [10 ** 9]})[0] == 400
    assert call("/tokenize", {"content": 5})[0] == 400
    assert call("/tokenize", {"content": "x"}, headers={"Authorization": "Bearer wrong"})[0] == 401
    # A wrong method is 405 with Allow.
    status, headers, _ = call("/v1/chat/completions", method="GET")
    assert status == 405 and headers.get("Allow") == "POST", (status, headers)
    # CORS (--cors-origin http://page.test): preflight without credentials, then the header on answers.
    req = urllib.request.Request(base + "/v1/chat/completions", method="OPTIONS", headers={
        "Origin": "http://page.test", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    with urllib.request.urlopen(req) as r:
        assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "http://page.test"
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
    status, headers, _ = call("/v1/models", headers={"Origin": "http://page.test"})
    assert status == 200 and headers.get("Access-Control-Allow-Origin") == "http://page.test", headers
    status, headers, _ = call("/v1/models", headers={"Origin": "http://other.test"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers, headers
    print("models/{id}, tokenize/detokenize, 405, CORS")


def openai_module():
    import openai
    return openai


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
    server, port, log = start_server([ds41, "serve", "-m", model, "--port", "0", "--model-name", "tiny", "--threads",
                                      "2", "--temp", "0", "--api-key", "k", "--cors-origin", "http://page.test"])
    try:
        if port is None:
            server.wait()
            print("".join(log))
            return 1
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                out = subprocess.run(["curl", "-sf", base + "/health"], capture_output=True, text=True)
                if out.returncode == 0:
                    break
            except OSError:
                pass
            if server.poll() is not None:
                time.sleep(0.5)
                print("".join(log))
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

        check_choices(client, msgs)
        check_structured_output(client, base)
        check_logprobs(client, msgs)
        check_models_tokenize_cors(client, base, openai)

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
