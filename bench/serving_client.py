"""Streamed chat completions against several targets, interleaved, one at a
time: time to first token and total time per target (bench/serving.sh).

    python3 serving_client.py ROUNDS MAX_TOKENS NAME=PORT [NAME=PORT ...]

Round i sends one request to each target in turn, in a rotating order, with
a prompt of the same length that differs per request (the server's prompt
cache would otherwise favour whichever target comes second). Prints one
line per target: name, requests, TTFT p50/p99 and total p50/p99 in ms.
"""

import http.client
import json
import os
import statistics
import sys
import time

rounds, max_tokens = int(sys.argv[1]), int(sys.argv[2])
targets = [(a.split("=")[0], int(a.split("=")[1])) for a in sys.argv[3:]]
keys = dict(targets)
WORDS = "the pool shares its GPUs between training and serving so no island sits idle".split()


def one(port, prompt):
    body = json.dumps({
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    })
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    # Each hop's key (bench/serving.sh): the server's own, the launcher's.
    if port == keys.get("direct"):
        headers["Authorization"] = "Bearer " + os.environ["ONEPOOL_BACKEND_API_KEY"]
    elif port == keys.get("launcher"):
        headers["x-onepool-replica-key"] = os.environ["ONEPOOL_REPLICA_KEY"]
    c.request("POST", "/v1/chat/completions", body, headers)
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"port {port}: HTTP {r.status}: {r.read()[:200]!r}")
    first, done = None, False
    for line in r:
        if first is None and line.startswith(b"data: ") and b'"delta":{"content":"' in line:
            first = time.perf_counter()
        if line.strip() == b"data: [DONE]":
            done = True
    c.close()
    if not done or first is None:
        raise SystemExit(f"port {port}: the stream ended without text or [DONE]")
    return (first - t0) * 1000, (time.perf_counter() - t0) * 1000


seen = {name: ([], []) for name, _ in targets}
for i in range(rounds):
    order = targets[i % len(targets):] + targets[:i % len(targets)]
    for k, (name, port) in enumerate(order):
        words = [WORDS[(i * 7 + k * 3 + w) % len(WORDS)] for w in range(24)]
        ttft, total = one(port, f"{i}-{k}: " + " ".join(words))
        seen[name][0].append(ttft)
        seen[name][1].append(total)


def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]


for name, (ttft, total) in seen.items():
    print(f"{name} {len(ttft)} {statistics.median(ttft):.1f} {q(ttft, 0.99):.1f} "
          f"{statistics.median(total):.1f} {q(total, 0.99):.1f}")
