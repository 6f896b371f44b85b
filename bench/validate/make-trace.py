#!/usr/bin/env python3
"""Writes bench/validate/chat-trace.csv, the inference part of
bench/validate-simulator.sh: the first 240 s of the Azure LLM inference
trace 2023, conversation (data/azure-llm-inference-2023-conv.csv, CC-BY 4.0,
see data/NOTICE.md), every request kept from 60 s to 150 s and every 4th
one before and after (light, heavy, light), timestamps in seconds from the
first request.

    python3 bench/validate/make-trace.py > bench/validate/chat-trace.csv
"""
import csv
import datetime
import os
import sys

src = os.path.join(os.path.dirname(__file__), "..", "..", "data", "azure-llm-inference-2023-conv.csv")
rows = list(csv.reader(open(src)))[1:]
t = [datetime.datetime.fromisoformat(r[0][:26]).replace(tzinfo=datetime.timezone.utc).timestamp() for r in rows]
out = csv.writer(sys.stdout, lineterminator="\n")
out.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
for i, (ts, r) in enumerate(zip(t, rows)):
    s = ts - t[0]
    if s >= 240:
        break
    if 60 <= s < 150 or i % 4 == 0:
        out.writerow([f"{s:.3f}", r[1], r[2]])
