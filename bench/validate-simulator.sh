#!/usr/bin/env bash
# Validates the simulator's Slurm model (simulator/src/slurm.rs) against the
# real dev cluster (issue 7): one small batch scenario, bench/validate/jobs.csv,
# is run for real on its own 4-node x 4-GPU cluster (target/validate-cluster)
# and through `onepool simulate --job-log` with the same policy
# (bench/validate/policy.toml), and the two are set side by side: per job the
# start (seconds after the first submission), who was reclaimed, and the
# protected jobs' time to capacity (start - submit). Takes about 3 minutes.
#
#     bash bench/validate-simulator.sh            # as root, Debian 12
#
# Each jobs.csv row becomes
#     sbatch --workload=CLASS --gpus-per-node=G -N1 --wrap "sleep DURATION"
# submitted SUBMIT seconds after the first one (protected classes with
# --time=10:00, as root: entitled), in file order.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --quiet
dc=./target/debug/onepool-devcluster
dir=$PWD/target/validate-cluster
out=$dir/validate
mkdir -p "$out"
"$dc" --dir "$dir" down >/dev/null 2>&1 || true
"$dc" --dir "$dir" up --policy bench/validate/policy.toml
trap '"$dc" --dir "$dir" down >/dev/null 2>&1 || true' EXIT
eval "$("$dc" --dir "$dir" env)"

# --- the real run ---------------------------------------------------------
: > "$out/ids"
t0=
i=0
while IFS=, read -r submit duration gpus per_node class account; do
    case $submit in '#'*|submit|'') continue ;; esac
    if [ -z "$t0" ]; then t0=$(date +%s.%N); fi
    while [ "$(echo "$(date +%s.%N) < $t0 + $submit" | bc)" = 1 ]; do sleep 0.05; done
    extra=()
    case $class in critical-training|inference-baseline) extra=(--time=10:00) ;; esac
    id=$(sbatch --parsable --workload="$class" --gpus-per-node="$per_node" -N1 -J "v$i" -o /dev/null \
        "${extra[@]}" --wrap "sleep $duration")
    echo "$i $id $class" >> "$out/ids"
    i=$((i + 1))
done < bench/validate/jobs.csv
echo "submitted $i jobs; waiting for them to finish"
deadline=$(( $(date +%s) + 480 ))
while [ -n "$(squeue -h -o %i)" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 1; done
if [ -n "$(squeue -h -o %i)" ]; then
    echo "still queued after 480 s (listed, then cancelled):"
    squeue -o "%.6i %.6j %.22q %.8T %r"
    scancel $(squeue -h -o %i)
    sleep 2
fi
sleep 2   # let slurmdbd catch up
SLURM_TIME_FORMAT=%s sacct -P -n -X -D --format=JobID,JobName,QOS,Submit,Start,End,State,NodeList \
    -j "$(cut -d' ' -f2 "$out/ids" | paste -sd,)" > "$out/sacct.txt"

# --- the simulated run -------------------------------------------------------
./target/debug/onepool simulate bench/validate/scenario.toml --shared-only --job-log \
    > "$out/simulate.txt" 2> "$out/job-log.tsv"

# --- side by side --------------------------------------------------------------
python3 - "$out/ids" "$out/sacct.txt" "$out/job-log.tsv" bench/validate/jobs.csv <<'PY'
import sys, csv
ids_f, sacct_f, log_f, jobs_f = sys.argv[1:]
jobs = {}  # index -> dict
for line in open(ids_f):
    i, jid, cls = line.split()
    jobs[int(i)] = {"id": jid, "class": cls, "real": [], "sim": []}
rows = [r for r in csv.reader(l for l in open(jobs_f) if not l.startswith("#"))][1:]
for i, r in enumerate(rows):
    jobs[i]["submit_at"] = float(r[0])
by_id = {j["id"]: i for i, j in jobs.items()}
recs = []
for line in open(sacct_f):
    jid, name, qos, sub, start, end, state, node = line.rstrip("\n").split("|")
    num = lambda s: float(s) if s.isdigit() else None
    recs.append((jid, num(sub), num(start), num(end), state.split()[0] + ("@" + node if start.isdigit() else "")))
t0 = min(r[1] for r in recs if r[1] is not None)
for jid, sub, start, end, state in sorted(recs, key=lambda r: (r[2] or 1e18)):
    if jid in by_id:
        jobs[by_id[jid]]["real"].append((sub - t0, None if start is None else start - t0,
                                          None if end is None else end - t0, state))
for line in open(log_f):
    f = line.rstrip("\n").split("\t")
    if len(f) != 6 or not f[0].isdigit():
        continue
    jobs[int(f[0])]["sim"].append((float(f[2]), float(f[3]), float(f[4]), f[5] == "true"))
for j in jobs.values():
    j["sim"].sort(key=lambda s: s[1])
fmt = lambda x: "-" if x is None else f"{x:.1f}"
print()
print("| job | class | submit | real start | sim start | diff | real end | sim end | real: reclaimed? | sim: reclaimed? |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
diffs, enddiffs = [], []
for i in sorted(jobs):
    j = jobs[i]
    r, s = j["real"], j["sim"]
    rs = r[0][1] if r else None
    ss = s[0][1] if s else None
    re_ = r[-1][2] if r else None
    se = s[-1][2] if s else None
    d = None if rs is None or ss is None else ss - rs
    if d is not None:
        diffs.append(abs(d))
    if re_ is not None and se is not None:
        enddiffs.append(abs(se - re_))
    rstates = "/".join(x[3] for x in r) or "-"
    srecl = "/".join("reclaimed" if x[3] else "done" for x in s) or "-"
    print(f"| v{i} ({j['id']}) | {j['class']} | {j['submit_at']:.0f} | {fmt(rs)} | {fmt(ss)} | {'-' if d is None else f'{d:+.1f}'} | {fmt(re_)} | {fmt(se)} | {rstates} | {srecl} |")
print()
print("time to capacity (protected jobs, first start - submit, s):")
print("| job | class | real | simulated |")
print("| --- | --- | ---: | ---: |")
for i in sorted(jobs):
    j = jobs[i]
    if j["class"] in ("critical-training", "inference-baseline"):
        r, s = j["real"], j["sim"]
        rt = None if not r or r[0][1] is None else r[0][1] - r[0][0]
        st = None if not s else s[0][1] - s[0][0]
        print(f"| v{i} | {j['class']} | {fmt(rt)} | {fmt(st)} |")
print()
if diffs:
    print(f"mean |sim start - real start| = {sum(diffs)/len(diffs):.1f} s over {len(diffs)} jobs "
          f"(max {max(diffs):.1f} s); mean |sim end - real end| = "
          f"{(sum(enddiffs)/len(enddiffs)) if enddiffs else float('nan'):.1f} s")
PY
echo
echo "raw: $out/sacct.txt (sacct -P -D, epoch seconds), $out/job-log.tsv (onepool simulate --job-log)"
