#!/usr/bin/env python3
"""Replays an inference trace against an endpoint, in real time, one thread
a request (bench/validate-simulator.sh, inference part).

    load.py URL TRACE.csv OUT.tsv

TRACE.csv: TIMESTAMP (seconds from the start),ContextTokens,GeneratedTokens.
Each request is `POST URL` with {"max_tokens": GeneratedTokens}, sent at its
timestamp after the start. OUT.tsv gets one line a request: index, the
trace's time, the epoch seconds sent and answered, the HTTP status (0: no
answer), the generated tokens. The first line is "# start EPOCH".
"""
import csv
import http.client
import json
import sys
import threading
import time
import urllib.parse

url, trace, out = sys.argv[1:]
u = urllib.parse.urlparse(url)
reqs = [(float(r[0]), int(r[2])) for r in list(csv.reader(open(trace)))[1:]]
results = [None] * len(reqs)


def send(i, tokens):
    sent = time.time()
    status = 0
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        body = json.dumps({"prompt": "x", "max_tokens": tokens})
        c.request("POST", u.path or "/", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        status = r.status
        c.close()
    except OSError as e:
        print(f"request {i}: {e}", file=sys.stderr)
    results[i] = (sent, time.time(), status)


start = time.time()
threads = []
for i, (t, tokens) in enumerate(reqs):
    delay = start + t - time.time()
    if delay > 0:
        time.sleep(delay)
    th = threading.Thread(target=send, args=(i, tokens), daemon=True)
    th.start()
    threads.append(th)
for th in threads:
    th.join(600)
with open(out, "w") as f:
    f.write(f"# start {start:.6f}\n")
    for i, ((t, tokens), r) in enumerate(zip(reqs, results)):
        sent, done, status = r or (0.0, 0.0, 0)
        f.write(f"{i}\t{t:.3f}\t{sent:.6f}\t{done:.6f}\t{status}\t{tokens}\n")
failed = sum(1 for r in results if not r or r[2] != 200)
print(f"load.py: {len(reqs)} requests, {failed} not answered 200")
