#!/usr/bin/env bash
# Validates the simulator's Slurm model (simulator/src/slurm.rs) against the
# real dev cluster (issue 7), on a 4-node x 4-GPU cluster of its own
# (target/validate-cluster), with the policy bench/validate/policy.toml.
#
# Batch part: the scenario bench/validate/jobs.csv is run for real and
# through `onepool simulate --job-log` (bench/validate/scenario.toml), and
# the two are set side by side: every run of every job (start and end,
# seconds after the first submission; a requeued job runs twice), the
# protected jobs' time to capacity, and the reclaim timing of the victims
# that get a notice (notice, release, restart). About 9 minutes.
#
# Inference part: onepoold runs one endpoint whose replicas are Slurm jobs
# (the stand-in model server), bench/validate/load.py replays
# bench/validate/chat-trace.csv against it, and the same trace goes through
# the simulator (bench/validate/inference.toml): the replica jobs (class,
# start, end), each replica's time from its GPUs to ready, and the requests'
# queueing delay (p50/p90/p99/max) side by side. About 5 minutes.
#
#     bash bench/validate-simulator.sh [all|batch|inference]   # as root, Debian 12
#
# Each jobs.csv row becomes, SUBMIT seconds after the first one, in file order,
#     sbatch --workload=CLASS --gpus-per-node=G -N1 bench/validate/job.sh DURATION ...
# (protected classes with --time=10:00, as root: entitled). job.sh sleeps its
# duration; for a class reclaimed with a notice (graceful or requeue in the
# policy) it is also given --signal=B:USR1@1 (and --requeue), and on the
# notice takes the scenario's [victims] release_after for that class, then
# exits (graceful) or requeues itself (requeue), keeping the work it had
# done. The scenario says cancelled = "drop": on the cluster nobody
# resubmits a cancelled job.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
case $part in all|batch|inference) ;; *) echo "usage: $0 [all|batch|inference]" >&2; exit 2 ;; esac
cargo build --workspace --quiet
dc=./target/debug/onepool-devcluster
dir=$PWD/target/validate-cluster
out=$dir/validate
job=$PWD/bench/validate/job.sh
rm -rf "$out"
mkdir -p "$out"
"$dc" --dir "$dir" down >/dev/null 2>&1 || true
"$dc" --dir "$dir" up --policy bench/validate/policy.toml
onepoold_pid=
cleanup() {
    if [ -n "$onepoold_pid" ]; then kill "$onepoold_pid" 2>/dev/null || true; fi
    "$dc" --dir "$dir" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
eval "$("$dc" --dir "$dir" env)"

batch() {

# Per class: reclaim mode (policy) and seconds from notice to release (scenario).
python3 - bench/validate/policy.toml bench/validate/scenario.toml > "$out/classes" <<'PY'
import re, sys, tomllib
pol = tomllib.load(open(sys.argv[1], "rb"))
sc = tomllib.load(open(sys.argv[2], "rb"))
v = sc.get("victims", {})
def secs(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|m|h)?", s or "")
    if not m:
        sys.exit(f"{sys.argv[2]}: release_after {s!r}: this script reads only N, Ns, Nm, Nh")
    return float(m[1]) * {"s": 1, None: 1, "m": 60, "h": 3600}[m[2]]
for name, c in pol["classes"].items():
    mode = c.get("reclaim", "-")
    ra = v.get("class", {}).get(name, {}).get("release_after", v.get("release_after"))
    print(name, mode, secs(ra) if ra else "-")
PY

# --- the real run ---------------------------------------------------------
: > "$out/ids"
t0=
i=0
while IFS=, read -r submit duration gpus per_node class account; do
    case $submit in '#'*|submit|'') continue ;; esac
    read -r _ mode notice < <(grep "^$class " "$out/classes") || { echo "class $class: not in the policy" >&2; exit 1; }
    extra=()
    args=("$duration" "$out/state-$i" "$out/events-$i.log")
    case $class in critical-training|inference-baseline) extra=(--time=10:00) ;; esac
    case $mode in
        graceful|requeue)
            if [ "$notice" = - ]; then
                echo "class $class is reclaimed with a notice: give [victims.class.$class] release_after in the scenario" >&2
                exit 1
            fi
            extra+=(--signal=B:USR1@1)
            if [ "$mode" = requeue ]; then extra+=(--requeue); args+=("$notice" requeue); else args+=("$notice" exit); fi ;;
    esac
    if [ -z "$t0" ]; then t0=$(date +%s.%N); fi
    while [ "$(echo "$(date +%s.%N) < $t0 + $submit" | bc)" = 1 ]; do sleep 0.05; done
    id=$(sbatch --parsable --workload="$class" --gpus-per-node="$per_node" -N1 -J "v$i" \
        -o "$out/job-$i.out" --open-mode=append "${extra[@]}" "$job" "${args[@]}")
    echo "$i $id $class" >> "$out/ids"
    i=$((i + 1))
done < bench/validate/jobs.csv
echo "submitted $i jobs; waiting for them to finish"
deadline=$(( $(date +%s) + 600 ))
while [ -n "$(squeue -h -o %i)" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 1; done
if [ -n "$(squeue -h -o %i)" ]; then
    echo "still queued after 600 s (listed, then cancelled):"
    squeue -o "%.6i %.6j %.22q %.8T %r"
    scancel $(squeue -h -o %i)
    sleep 2
fi
sleep 2   # let slurmdbd catch up
SLURM_TIME_FORMAT=%s sacct -P -n -X -D --format=JobID,JobName,QOS,Submit,Eligible,Start,End,State,NodeList \
    -j "$(cut -d' ' -f2 "$out/ids" | paste -sd,)" > "$out/sacct.txt"

# --- the simulated run -------------------------------------------------------
./target/debug/onepool simulate bench/validate/scenario.toml --shared-only --job-log \
    > "$out/simulate.txt" 2> "$out/job-log.tsv"

# --- side by side --------------------------------------------------------------
python3 - "$out" bench/validate/jobs.csv <<'PY'
import csv, glob, os, sys
out, jobs_f = sys.argv[1:]
classes = {}
for line in open(f"{out}/classes"):
    name, mode, notice = line.split()
    classes[name] = (mode, None if notice == "-" else float(notice))
jobs = {}
for line in open(f"{out}/ids"):
    i, jid, cls = line.split()
    jobs[int(i)] = {"id": jid, "class": cls, "real": [], "sim": [], "events": []}
rows = [r for r in csv.reader(l for l in open(jobs_f) if not l.startswith("#"))][1:]
for i, r in enumerate(rows):
    jobs[i]["submit_at"] = float(r[0])
by_id = {j["id"]: i for i, j in jobs.items()}
num = lambda s: float(s) if s.isdigit() else None
recs = []
for line in open(f"{out}/sacct.txt"):
    jid, name, qos, sub, elig, start, end, state, node = line.rstrip("\n").split("|")
    recs.append((jid, num(sub), num(start), num(end), state.split()[0] + ("@" + node if start.isdigit() else ""), num(elig)))
t0 = min(r[1] for r in recs if r[1] is not None)
rel = lambda x: None if x is None else x - t0
for jid, sub, start, end, state, elig in sorted(recs, key=lambda r: (r[2] or 1e18)):
    if jid in by_id:
        jobs[by_id[jid]]["real"].append((rel(start), rel(end), state, rel(elig)))
for line in open(f"{out}/job-log.tsv"):
    f = line.rstrip("\n").split("\t")
    if len(f) != 6 or not f[0].isdigit():
        continue
    jobs[int(f[0])]["sim"].append((float(f[3]), float(f[4]), "reclaimed" if f[5] == "true" else "done"))
for i, j in jobs.items():
    j["sim"].sort(key=lambda s: s[0])
    p = f"{out}/events-{i}.log"
    if os.path.exists(p):
        j["events"] = [(float(l.split()[0]) - t0, l.split()[1]) for l in open(p) if l.strip()]
fmt = lambda x: "-" if x is None else f"{x:.1f}"
sgn = lambda x: "-" if x is None else f"{x:+.1f}"
print()
print("Every run of every job (s after the first submission; real = sacct -D, 1 s resolution):")
print()
print("| job | class | submit | run | real start | sim start | diff | real end | sim end | diff | real state@node | sim |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
sd, ed, nruns = [], [], [0, 0]
for i in sorted(jobs):
    j = jobs[i]
    r, s = j["real"], j["sim"]
    nruns[0] += len(r)
    nruns[1] += len(s)
    for k in range(max(len(r), len(s), 1)):
        rr = r[k] if k < len(r) else (None, None, "-", None)
        ss = s[k] if k < len(s) else (None, None, "-")
        d1 = None if rr[0] is None or ss[0] is None else ss[0] - rr[0]
        d2 = None if rr[1] is None or ss[1] is None else ss[1] - rr[1]
        if d1 is not None:
            sd.append(abs(d1))
        if d2 is not None:
            ed.append(abs(d2))
        print(f"| v{i} ({j['id']}) | {j['class']} | {j['submit_at']:.0f} | {k + 1} | {fmt(rr[0])} | {fmt(ss[0])} | {sgn(d1)} "
              f"| {fmt(rr[1])} | {fmt(ss[1])} | {sgn(d2)} | {rr[2]} | {ss[2]} |")
print()
print("Time to capacity (protected jobs, first start - submit, s):")
print()
print("| job | class | real | simulated |")
print("| --- | --- | ---: | ---: |")
for i in sorted(jobs):
    j = jobs[i]
    if j["class"] in ("critical-training", "inference-baseline"):
        rt = j["real"][0][0] - j["submit_at"] if j["real"] and j["real"][0][0] is not None else None
        st = j["sim"][0][0] - j["submit_at"] if j["sim"] else None
        print(f"| v{i} | {j['class']} | {fmt(rt)} | {fmt(st)} |")
print()
print("Victims told in advance (graceful/requeue classes), from job.sh's own log (real notice), sacct (real;")
print("eligible again = the requeued run's Eligible, i.e. its BeginTime) and --job-log (simulated):")
print()
print("| job | class | mode | real notice | real release | sim release | real eligible again | real restart | sim restart | real hold (restart - release) | sim hold |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for i in sorted(jobs):
    j = jobs[i]
    mode, _ = classes.get(j["class"], ("-", None))
    notice = [t for t, e in j["events"] if e == "notice"]
    if mode not in ("graceful", "requeue") or not (notice or any(x[2] == "reclaimed" for x in j["sim"])):
        continue
    r, s = j["real"], j["sim"]
    rrel = r[0][1] if r else None
    srel = s[0][1] if s else None
    rres = r[1][0] if len(r) > 1 else None
    relig = r[1][3] if len(r) > 1 else None
    sres = s[1][0] if len(s) > 1 else None
    hold = lambda a, b: None if a is None or b is None else a - b
    print(f"| v{i} | {j['class']} | {mode} | {fmt(notice[0] if notice else None)} | {fmt(rrel)} | {fmt(srel)} "
          f"| {fmt(relig)} | {fmt(rres)} | {fmt(sres)} | {fmt(hold(rres, rrel))} | {fmt(hold(sres, srel))} |")
print()
print(f"runs: {nruns[0]} real, {nruns[1]} simulated; mean |sim start - real start| = "
      f"{sum(sd)/len(sd):.1f} s over {len(sd)} runs (max {max(sd):.1f} s); mean |sim end - real end| = "
      f"{sum(ed)/len(ed):.1f} s over {len(ed)} runs (max {max(ed):.1f} s)")
PY
echo
echo "raw: $out/sacct.txt (sacct -P -D, epoch seconds), $out/job-log.tsv (onepool simulate --job-log), $out/events-*.log (job.sh)"
}

inference() {
# onepoold's config from the scenario's endpoint (onepool-devcluster
# onepoold-config, dev-cluster/src/onepoold.rs); the stand-in server's
# model load (3 s) and onepoold's health checks (every 0.5 s, ready after
# one) are what the scenario's startup (4 s) stands for.
load_s=3
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$dc" onepoold-config bench/validate/inference.toml --listen "127.0.0.1:$port" --model-load-seconds "$load_s" \
    --server "$PWD/etc/dev-cluster/stand-in-model-server.py" --launcher "$PWD/target/debug/onepool" --out "$out" \
    > "$out/onepoold.toml"
started=$(date +%s)
ONEPOOLD_LOG=info NO_COLOR=1 ./target/debug/onepoold --config "$out/onepoold.toml" > "$out/onepoold.log" 2>&1 &
onepoold_pid=$!
echo "onepoold (pid $onepoold_pid) on 127.0.0.1:$port; waiting for the baseline replica to be ready"
for _ in $(seq 120); do
    grep -q 'replica health changed.*to=Ready' "$out/onepoold.log" && break
    kill -0 "$onepoold_pid" 2>/dev/null || { echo "onepoold exited:"; cat "$out/onepoold.log"; exit 1; }
    sleep 0.5
done
grep -q 'replica health changed.*to=Ready' "$out/onepoold.log" || { echo "no replica ready after 60 s:"; cat "$out/onepoold.log"; exit 1; }
python3 bench/validate/load.py "http://127.0.0.1:$port/v1/completions" bench/validate/chat-trace.csv "$out/requests.tsv"
# Let the scale-down happen (scale_down_delay, then the drain) before stopping.
for _ in $(seq 90); do
    [ "$(squeue -h -o %j | grep -c '^onepool-chat')" -le 1 ] && break
    sleep 1
done
kill "$onepoold_pid"; wait "$onepoold_pid" 2>/dev/null || true
onepoold_pid=
date +%s > "$out/stopped"
ids=$(squeue -h -o '%i %j' | awk '$2 ~ /^onepool-chat/ {print $1}')
[ -z "$ids" ] || scancel $ids
sleep 3
SLURM_TIME_FORMAT=%s sacct -P -n -X -D -S "$(date -d "@$started" +%Y-%m-%dT%H:%M:%S)" --format=JobID,JobName,QOS,Submit,Start,End,State,NodeList \
    | awk -F'|' '$2 ~ /^onepool-chat/' > "$out/replicas-sacct.txt"
./target/debug/onepool simulate bench/validate/inference.toml --shared-only --job-log --json \
    > "$out/inference.json" 2> "$out/inference-job-log.tsv"
python3 - "$out" bench/validate/inference.toml <<'PY'
import json, re, sys, tomllib, datetime
out, scen = sys.argv[1:]
e = tomllib.load(open(scen, "rb"))["endpoints"][0]
per_token = 1.0 / e["decode_tokens_per_s"]
lines = open(f"{out}/requests.tsv").read().splitlines()
t0 = float(lines[0].split()[2])
reqs = [l.split("\t") for l in lines[1:]]
stopped = float(open(f"{out}/stopped").read()) - t0
# Real queueing delay: the time to the answer less the stand-in server's own time for it.
delays, bad = [], 0
for i, t, sent, done, status, tokens in reqs:
    if status != "200":
        bad += 1
        continue
    delays.append(max(0.0, float(done) - float(sent) - int(tokens) * per_token))
def q(v, p):
    v = sorted(v)
    return v[max(0, min(len(v), -(-int(p * len(v) * 1000) // 1000)) - 1)] if v else 0.0
sends = [float(r[2]) - t0 - float(r[1]) for r in reqs if float(r[2]) > 0]
# onepoold's log: replica job submitted / running / ready / draining / cancelled.
ev = {}
addr_job = {}
ts_re = re.compile(r"^(\S+Z)\s+\w+\s+(.*)$")
for l in open(f"{out}/onepoold.log"):
    m = ts_re.match(l.strip())
    if not m:
        continue
    t = datetime.datetime.fromisoformat(m[1].replace("Z", "+00:00")).timestamp() - t0
    msg = m[2]
    job = re.search(r"\bjob=(\d+)", msg)
    addr = re.search(r"\baddress=(\S+)", msg)
    if "replica job running; in the router" in msg and job and addr:
        addr_job[addr[1]] = job[1]
    if "replica health changed" in msg and "to=Ready" in msg and addr and addr[1] in addr_job:
        ev.setdefault(addr_job[addr[1]], {}).setdefault("ready", t)
    for key, what in (("submitted a replica job", "submitted"), ("draining a replica job", "draining")):
        if key in msg and job:
            ev.setdefault(job[1], {}).setdefault(what, t)
real = []
for l in open(f"{out}/replicas-sacct.txt"):
    jid, name, qos, sub, start, end, state, node = l.rstrip("\n").split("|")
    f = lambda x: float(x) - t0 if x.isdigit() else None
    real.append((qos.replace("op-", ""), f(start), f(end), state, jid))
real.sort(key=lambda r: (r[1] is None, r[1] or 0))
sim = []
for l in open(f"{out}/inference-job-log.tsv"):
    f = l.rstrip("\n").split("\t")
    if len(f) == 6 and f[0].isdigit():
        sim.append((f[1], float(f[3]), float(f[4])))
sim.sort(key=lambda r: r[1])
trace_end = float(reqs[-1][1])
fmt = lambda x: "-" if x is None else f"{x:.1f}"
print()
dur = lambda v: float(v[:-1]) * {"s": 1, "m": 60, "h": 3600}[v[-1]] if v[-1] in "smh" else float(v)
startup = dur(e["startup"])
print(f"Replica jobs (s after the first request; real: submitted, ready and draining from onepoold's log, start and end")
print(f"from sacct (1 s resolution); simulated: --job-log, ready = start + startup ({e['startup']}), a warm replica at once).")
print(f"The trace ends at {trace_end:.0f} s; then the simulator retires every replica, and the real run stops onepoold")
print(f"(at {stopped:.0f} s) and cancels the replicas left. Matched by class, in the order they started:")
print()
print("| # | class | real submitted | sim submitted | real start | sim start | real ready | sim ready | real draining | real end | sim end | real state |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
by_class = {}
for r in real:
    by_class.setdefault(r[0], []).append(r)
sim_by_class = {}
for x in sim:
    sim_by_class.setdefault(x[0], []).append(x)
n = 0
for cls in sorted(set(by_class) | set(sim_by_class)):
    rs, ss = by_class.get(cls, []), sim_by_class.get(cls, [])
    for k in range(max(len(rs), len(ss))):
        r = rs[k] if k < len(rs) else None
        x = ss[k] if k < len(ss) else None
        evs = ev.get(r[4], {}) if r else {}
        sready = None if x is None else (x[1] if x[1] <= 0 else x[1] + startup)
        n += 1
        print(f"| {n} | {cls} | {fmt(evs.get('submitted'))} | {fmt(x[1] if x else None)} | {fmt(r[1] if r else None)} "
              f"| {fmt(x[1] if x else None)} | {fmt(evs.get('ready'))} | {fmt(sready)} | {fmt(evs.get('draining'))} "
              f"| {fmt(r[2] if r else None)} | {fmt(x[2] if x else None)} | {r[3] if r else '-'} |")
rdown = sorted(r[2] for r in real if r[2] is not None and r[2] < trace_end)
sdown = sorted(x[2] for x in sim if x[2] < trace_end)
print()
print("GPUs given back before the trace ended (scale-downs), in time order: real "
      + ", ".join(f"{t:.1f}" for t in rdown) + "; simulated " + ", ".join(f"{t:.1f}" for t in sdown))
ups = [ev.get(r[4], {}).get("ready", 0) - r[1] for r in real if r[1] is not None and "ready" in ev.get(r[4], {}) and r[1] > 0]
c = json.load(open(f"{out}/inference.json"))["comparison"]
sf = next(r["shared"] for r in c["classes"] if r["shared"]["requests"])
if ups:
    print(f"real time from GPUs (sacct start) to ready (onepoold), replicas started during the run: "
          + ", ".join(f"{u:.1f}" for u in ups) + f" s; the scenario's startup: {e['startup']}")
print(f"real send lag behind the trace: max {max(sends):.3f} s")
print()
print("Requests, queueing delay (s; real = answer time - sent - generated tokens x "
      f"{per_token} s):")
print()
print("| | requests | not served | p50 | p90 | p99 | max |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
print(f"| real (onepoold) | {len(reqs)} | {bad} | {q(delays, .5):.2f} | {q(delays, .9):.2f} | {q(delays, .99):.2f} | {max(delays) if delays else 0:.2f} |")
print(f"| simulated | {sf['requests']} | {sf['failed_requests'] + sf['unserved']} | {sf['p50_queue_delay_s']:.2f} | "
      f"{sf['p90_queue_delay_s']:.2f} | {sf['p99_queue_delay_s']:.2f} | - |")
PY
echo
echo "raw: $out/requests.tsv (load.py), $out/onepoold.log, $out/replicas-sacct.txt, $out/inference-job-log.tsv, $out/inference.json"
}

case $part in
    all) batch; inference ;;
    batch) batch ;;
    inference) inference ;;
esac
