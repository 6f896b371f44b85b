#!/usr/bin/env bash
# Validates the simulator's Slurm model (simulator/src/slurm.rs) against the
# real dev cluster (issue 7): the batch scenario bench/validate/jobs.csv is
# run for real on its own 4-node x 4-GPU cluster (target/validate-cluster)
# and through `onepool simulate --job-log` with the same policy
# (bench/validate/policy.toml) and scenario (bench/validate/scenario.toml),
# and the two are set side by side: every run of every job (start and end,
# seconds after the first submission; a requeued job runs twice), the
# protected jobs' time to capacity, and the reclaim timing of the victims
# that get a notice (notice, release, restart). Takes about 9 minutes.
#
#     bash bench/validate-simulator.sh            # as root, Debian 12
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
cargo build --workspace --quiet
dc=./target/debug/onepool-devcluster
dir=$PWD/target/validate-cluster
out=$dir/validate
job=$PWD/bench/validate/job.sh
rm -rf "$out"
mkdir -p "$out"
"$dc" --dir "$dir" down >/dev/null 2>&1 || true
"$dc" --dir "$dir" up --policy bench/validate/policy.toml
trap '"$dc" --dir "$dir" down >/dev/null 2>&1 || true' EXIT
eval "$("$dc" --dir "$dir" env)"

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
