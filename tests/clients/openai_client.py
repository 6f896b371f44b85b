"""The official OpenAI Python client against an onepoold endpoint.

    python3 openai_client.py BASE_URL MODEL [NO_REPLICA_BASE_URL]

Lists the models, asks for a completion and a chat completion, streams a
chat completion, and, given a second endpoint with no replica, reads the
error the client raises there. Prints one JSON object with what it saw; the
Rust test (tests/cluster/serving.rs) checks it. Exits non-zero, with the
exception, when the client fails where it should not.
"""

import json
import sys

import openai

base, model = sys.argv[1], sys.argv[2]
# onepoold does no authentication by default; the client insists on a key.
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
seen = {"client_version": openai.__version__}

seen["models"] = [m.id for m in client.models.list().data]

c = client.completions.create(model=model, prompt="The shared GPU pool", max_tokens=8)
seen["completion"] = {"text": c.choices[0].text, "tokens": c.usage.completion_tokens}

r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
)
seen["chat"] = {"text": r.choices[0].message.content, "tokens": r.usage.completion_tokens}

chunks, text, finish = 0, "", None
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, stream=True
)
for chunk in stream:
    chunks += 1
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
seen["stream"] = {"chunks": chunks, "text": text, "finish_reason": finish}

if len(sys.argv) > 3:
    idle = openai.OpenAI(base_url=sys.argv[3], api_key="unused", max_retries=0, timeout=60)
    try:
        idle.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        seen["no_replica"] = {"raised": None}
    except openai.APIStatusError as e:
        seen["no_replica"] = {
            "raised": type(e).__name__,
            "status": e.status_code,
            "message": e.message,
            "body": e.body,
            "retry_after": e.response.headers.get("retry-after"),
        }

print(json.dumps(seen))
