#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests against a real
# Slurm cluster (munge, MariaDB, slurmdbd, slurmctld, 4 slurmd with fake
# GPUs) that this script brings up and stops again, then the README's main
# command (the demo) on a cluster of its own.
#
# Which Slurm releases: the arguments, else ONEPOOL_SLURM_RELEASE (both a
# list, run one after the other)
#   22.05  the host's (Debian 12), the default
#   24.11  Debian 13's, in a root from scripts/release-root.sh
#   26.05  Debian unstable's, likewise
#   all    the three
# For 24.11 and 26.05 everything is built on the host against that release's
# headers (target/slurm-RELEASE) and the cluster, the integration tests and
# the demo run inside the root (scripts/in-release.sh), with that release's
# daemons and commands.
#
# ONEPOOL_KEEP_CLUSTER=1 leaves the test cluster running for the next run;
# ONEPOOL_SKIP_VARIANTS=1 skips 22.05's timing variants (there the records
# program, its 5 s poll test included, and the demo run on nodes whose CPU
# is capped at ONEPOOL_THROTTLE_PERCENT of one core, 100 by default;
# records then runs with the others, the demo uncapped);
# ONEPOOL_SKIP_HOSTS=1 skips 22.05's hosts mode (the hosts test, then the
# serving, elastic, side-door, reclaim and report programs, instead of in
# the single-namespace pass, on a cluster whose hosts are network
# namespaces: onepool-devcluster up --hosts);
# slow variants run on one release: 24.11 and 26.05 leave out the hosts
# mode's programs, the two-instance ones (ha, two_actors) and the tests of
# onepool's own HTTP path (one_release_program, one_release_tests), and
# the demo runs on 22.05 and 26.05 (demo);
# ONEPOOL_SKIP_DEMO=1 skips the demo; ONEPOOL_SKIP_PACKAGES=1 skips the last
# stage of each release, its package (scripts/package.sh RELEASE, then
# scripts/package-test.sh RELEASE; for 22.05 scripts/deploy-test.sh, the
# runbook docs/deploy.md followed on a cluster that starts without onepool,
# for 24.11 scripts/upgrade-test.sh, its step 7 from onepool for 22.05).
# ONEPOOL_DROP_BUILDS=1 (CI sets it) removes each release's compiler output
# once its stage has passed, keeping the programs and plugins later stages
# use: three debug builds side by side need more disk than a small machine
# has (CI's linker died of a full disk in the third).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2206 # a list of words
asked=(${*:-${ONEPOOL_SLURM_RELEASE:-22.05}})
releases=()
for r in "${asked[@]}"; do
    case $r in
        all) releases+=(22.05 24.11 26.05) ;;
        22.05 | 24.11 | 26.05) releases+=("$r") ;;
        *) echo "test.sh: unknown Slurm release $r (22.05, 24.11, 26.05 or all)" >&2; exit 2 ;;
    esac
done
bash scripts/install-deps.sh

# CI's time: what later steps need is made in the background ("ahead"),
# at nice 19, while 22.05's integration tests wait on Slurm and leave the
# CPU mostly idle: the real model server and model (scripts/model-server.sh:
# about 7 minutes on 2 cores, once per machine; every release root sees the
# same files), the release programs and plugins the packages take, and the
# later releases' builds. A step that needs one waits for it (`need`), and
# a failed one stops the run with its log. ONEPOOL_AHEAD=0, or a run that
# does not begin with 22.05, makes each where it is needed instead.
ahead_dir=$PWD/target/ahead
ahead_pid=

# Whether this run makes packages.
packages() {
    [ "${ONEPOOL_SKIP_PACKAGES:-0}" != 1 ]
}

# ahead_start: the background chain, once, for the releases after 22.05.
ahead_start() {
    [ "${ONEPOOL_AHEAD:-1}" != 0 ] && [ -z "$ahead_pid" ] || return 0
    rm -rf "$ahead_dir"
    mkdir -p "$ahead_dir"
    local later=("${releases[@]:1}") parent=$$
    (
        # step NAME CMD...: CMD's output in NAME.log, its status in NAME.done.
        step() {
            local name=$1 t0=$SECONDS rc=0
            shift
            # Nothing more once the run is over.
            kill -0 "$parent" 2>/dev/null || exit 0
            nice -n 19 "$@" >"$ahead_dir/$name.log" 2>&1 || rc=$?
            echo "$rc $((SECONDS - t0))" >"$ahead_dir/$name.done"
        }
        step model-server bash scripts/model-server.sh
        # What scripts/package.sh builds, by its own commands, so that its
        # builds later find nothing left to do.
        if packages; then
            step release-22.05 env ONEPOOL_PACKAGE_BUILD_ONLY=1 bash scripts/package.sh 22.05
        fi
        for rel in "${later[@]}"; do
            # Its path, the script's last line on stdout, in a file of its own.
            step "root-$rel" bash -c 'bash scripts/release-root.sh "$1" >"$2"' _ "$rel" "$ahead_dir/root-$rel.path"
            root=$(tail -n 1 "$ahead_dir/root-$rel.path" 2>/dev/null || true)
            # What run_release builds, by the same functions.
            step "build-$rel" env SLURM_INCLUDE_DIR="$root/usr/include" CARGO_TARGET_DIR="$PWD/target/slurm-$rel" \
                bash -c "set -o pipefail; $(declare -f later_build test_executables); later_build && test_executables >/dev/null"
            if packages; then
                step "release-$rel" env ONEPOOL_PACKAGE_BUILD_ONLY=1 bash scripts/package.sh "$rel"
            fi
        done
    ) &
    ahead_pid=$!
    echo "== ahead: the model server, the packages' release builds and the builds of ${later[*]:-no later release}, in the background (logs: $ahead_dir)"
}

# need NAME: waits for a step of the chain, if it runs one; says how long.
need() {
    local name=$1 t0=$SECONDS
    [ -n "$ahead_pid" ] || return 0
    while [ ! -f "$ahead_dir/$name.done" ]; do
        if ! kill -0 "$ahead_pid" 2>/dev/null && [ ! -f "$ahead_dir/$name.done" ]; then
            echo "test.sh: the background chain ended without $name (log: $ahead_dir)" >&2
            exit 1
        fi
        sleep 2
    done
    local rc took
    read -r rc took <"$ahead_dir/$name.done"
    if [ "$rc" != 0 ]; then
        echo "test.sh: $name, made in the background, failed (exit $rc):" >&2
        tail -n 50 "$ahead_dir/$name.log" >&2
        exit 1
    fi
    echo "== ahead: $name ready (made in $took s; waited $((SECONDS - t0)) s)"
}

# The model server before anything that runs it, made here unless the
# chain makes it.
model_server() {
    if [ -n "$ahead_pid" ]; then
        need model-server
    else
        bash scripts/model-server.sh >/dev/null
    fi
}

# Every integration test, as the executables cargo built for onepool-tests.
test_executables() {
    cargo test -p onepool-tests --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] and "test" in m["target"]["kind"]:
        print(m["executable"])'
}

# A later release's build, or with `--run` its unit tests: the
# programs, plugins and libraries, and the unit tests of what depends on
# the release's headers (the rest is the same code). Every crate's unit
# tests and benchmarks (22.05's stage runs them) would be built and linked
# for nothing (CI's time); the test programs are built by the commands
# that run them (test_executables).
later_build() {
    if [ "${1:-}" = --run ]; then
        cargo test -p onepool-slurm-sys -p onepool-priority-plugin -p onepool-spank-plugin
    else
        cargo build --workspace --bins --lib &&
            cargo test --no-run -p onepool-slurm-sys -p onepool-priority-plugin -p onepool-spank-plugin
    fi
}

run_release() {
    local rel=$1 root run target
    if [ "$rel" = 22.05 ]; then
        root=/ run=() target=target
        unset SLURM_INCLUDE_DIR CARGO_TARGET_DIR
    else
        echo "== Slurm $rel: its root"
        root=$(bash scripts/release-root.sh "$rel" | tail -n 1)
        run=(bash "$PWD/scripts/in-release.sh" "$root")
        target=target/slurm-$rel
        export SLURM_INCLUDE_DIR=$root/usr/include CARGO_TARGET_DIR=$PWD/$target
        # Clusters made in an older root hold users and uids it no longer
        # has (slurmctld then refuses their jobs' accounts): start afresh.
        mkdir -p "$target"
        if ! cmp -s "$root/.onepool-root-stamp" "$target/root-stamp"; then
            rm -rf "$target/test-cluster" "$target/demo-cluster" "$target/second-cluster"
            cp "$root/.onepool-root-stamp" "$target/root-stamp"
        fi
    fi
    [ "$rel" = 22.05 ] || need "build-$rel"
    echo "== Slurm $rel: build (headers: ${SLURM_INCLUDE_DIR:-/usr/include})"
    if [ "$rel" = 22.05 ]; then
        cargo build --workspace --all-targets
    else
        later_build
    fi

    echo "== Slurm $rel: unit tests"
    if [ "$rel" = 22.05 ]; then
        cargo test --workspace --exclude onepool-tests
        # The harness's own unit tests (no cluster).
        cargo test -p onepool-tests --lib
    else
        later_build --run
        # The host's build is a plugin for another release here: loaded as
        # Slurm loads it, it must say so and what to do.
        local foreign=(target/debug/libjob_submit_onepool.so target/debug/libspank_onepool.so)
        if [ -f "${foreign[0]}" ] && [ -f "${foreign[1]}" ]; then
            echo "== Slurm $rel: plugins built for 22.05 are refused with what to do"
            "${run[@]}" python3 "$PWD/scripts/release-dlopen-check.py" --foreign "${foreign[@]/#/$PWD/}"
        else
            echo "== Slurm $rel: no 22.05 build of the plugins here; the refusal of a foreign release's plugin is not checked"
        fi
    fi

    if [ "$rel" = 22.05 ] && [ "${releases[0]}" = 22.05 ]; then
        ahead_start
    fi
    # 22.05's single-namespace programs do not run the real model server.
    [ "$rel" = 22.05 ] || model_server
    echo "== Slurm $rel: integration tests (real Slurm)"
    export ONEPOOL_TEST_CLUSTER_DIR=$PWD/$target/test-cluster
    local demo_dir=$PWD/$target/demo-cluster dc=$PWD/$target/debug/onepool-devcluster
    # shellcheck disable=SC2064 # the values of now
    trap "cleanup '$dc' '$demo_dir' ${run[*]:-}" EXIT
    # One test at a time: they share the cluster and each leaves it idle.
    # In tests/, as `cargo test` runs them.
    local exe exes
    mapfile -t exes < <(test_executables)
    # An empty list would pass silently.
    [ ${#exes[@]} -gt 0 ] || { echo "test.sh: cargo listed no integration-test programs" >&2; exit 1; }
    for exe in "${exes[@]}"; do
        # The hosts mode's own tests run in its stage (hosts_mode).
        case $(basename "$exe") in hosts-* | network-*) continue ;; esac
        # On 22.05 records.rs runs on the capped nodes, and the programs
        # whose hops onepoold makes on the hosts-mode cluster, instead of
        # here (below): CI's time. So do reclaim.rs and report.rs when the
        # hosts mode runs.
        if variants "$rel" && capped_program "$exe"; then
            continue
        fi
        if hosts "$rel" && hosts_program "$exe"; then
            continue
        fi
        if [ "$rel" != 22.05 ] && one_release_program "$exe"; then
            continue
        fi
        local skip=()
        [ "$rel" = 22.05 ] || mapfile -t skip < <(one_release_tests "$exe")
        # Serving runs the real model server (here when the hosts mode does not run it).
        case $(basename "$exe") in serving-* | reclaim-*) model_server ;; esac
        local t0=$SECONDS
        (cd tests && "${run[@]}" "$exe" --test-threads=1 "${skip[@]}")
        echo "== Slurm $rel: $(basename "${exe%-*}") passed in $((SECONDS - t0)) s"
    done

    if demo "$rel"; then
        model_server
        echo "== Slurm $rel: the demo (bash scripts/demo.sh), on its own cluster in $demo_dir"
        # Two clusters on a small machine would slow both: the test cluster goes first.
        if [ "${ONEPOOL_KEEP_CLUSTER:-0}" != 1 ]; then
            "${run[@]}" "$dc" --dir "$ONEPOOL_TEST_CLUSTER_DIR" down
        fi
        # The two demos shape their victim two ways, and 22.05's
        # polls at 5 s (issue #35: what onepoold counts must not depend on
        # the victim's load or on the poll catching a moment).
        # With the timing variants, 22.05's nodes are capped too
        # (throttled(): one demo for both, CI's time).
        local demo_env=()
        case $rel in
            22.05) demo_env=(ONEPOOL_POLL_INTERVAL=5s ONEPOOL_DEMO_VICTIM=idle) ;;
            26.05) demo_env=(ONEPOOL_DEMO_VICTIM=busy) ;;
        esac
        if variants "$rel"; then
            demo_env+=(ONEPOOL_NODE_CPU_PERCENT="${ONEPOOL_THROTTLE_PERCENT:-100}")
        fi
        # And on 22.05 in the hosts mode (issue #36): onepoold on the
        # service host, the load from the client host, every replica at its
        # node's address (passed here with the cap, the 5 s poll and the
        # idle victim together: 297 of 297 served, 206 s).
        if hosts "$rel"; then
            demo_env+=(ONEPOOL_DEMO_HOSTS=1)
        fi
        echo "== Slurm $rel: demo settings: ${demo_env[*]:-as shipped}"
        local t0=$SECONDS
        "${run[@]}" env ONEPOOL_DEVCLUSTER_DIR="$demo_dir" ONEPOOL_BIN_DIR="$PWD/$target/debug" "${demo_env[@]}" \
            bash scripts/demo.sh
        echo "== Slurm $rel: the demo passed in $((SECONDS - t0)) s"
    fi
    cleanup "$dc" "$demo_dir" "${run[@]}"
    trap - EXIT
    if variants "$rel"; then
        throttled "$rel" "$target" "$dc"
    fi
    if hosts "$rel"; then
        model_server
        hosts_mode "$rel" "$target" "$dc"
    fi

    # --- packages (issue #17) ---
    if packages; then
        need "release-$rel"
        echo "== Slurm $rel: packages (scripts/package.sh, then scripts/package-test.sh: dpkg -i into a throwaway copy, a cluster on the installed plugins)"
        local t0=$SECONDS
        bash scripts/package.sh "$rel"
        ONEPOOL_DEVCLUSTER=$PWD/$target/debug/onepool-devcluster bash scripts/package-test.sh "$rel"
        echo "== Slurm $rel: packages built and tested in $((SECONDS - t0)) s"
        if [ "$rel" = 22.05 ]; then
            echo "== Slurm $rel: docs/deploy.md followed on a cluster before onepool (scripts/deploy-test.sh)"
            t0=$SECONDS
            bash scripts/deploy-test.sh
            echo "== Slurm $rel: the runbook followed in $((SECONDS - t0)) s"
        elif [ "$rel" = 24.11 ]; then
            echo "== Slurm $rel: docs/deploy.md step 7, from onepool for 22.05 (scripts/upgrade-test.sh)"
            t0=$SECONDS
            ONEPOOL_DEVCLUSTER=$PWD/$target/debug/onepool-devcluster bash scripts/upgrade-test.sh
            echo "== Slurm $rel: the upgrade followed in $((SECONDS - t0)) s"
        fi
    fi
    # --- end of packages ---
    if [ "${ONEPOOL_DROP_BUILDS:-0}" = 1 ]; then
        drop_build "$rel" "$target"
    fi
}

# Whether this release's stage runs the timing variants: 22.05's, unless
# ONEPOOL_SKIP_VARIANTS=1 (CI's time: slow variants on one release).
variants() {
    [ "$1" = 22.05 ] && [ "${ONEPOOL_SKIP_VARIANTS:-0}" != 1 ]
}

# The program the capped stage runs instead of the single-namespace pass:
# records.rs makes onepoold's reclaims (idle, busy, immediate; 0.2 s and
# 5 s polls) and holds status, metrics and the report to them. The reclaim
# and report programs run on 22.05 in the hosts mode (hosts_mode), and
# both passed capped too (issue #35's note); CI's time keeps them to one
# extra run each.
capped_program() {
    case $(basename "$1") in
        records-*) return 0 ;;
        *) return 1 ;;
    esac
}

# The programs only 22.05's stage runs (CI's time: slow variants on one
# release): the hosts mode's own (hosts, network: a namespace per host);
# two_actors and ha (two onepoold instances and their lock in MariaDB;
# Slurm's singleton rule they rest on reads the same in 22.05, 24.11 and
# 26.05's sbatch manual); serving (onepool's own HTTP path with a real
# model server: the Slurm side of a graceful reclaim, GraceTime's notice
# and the GPUs handed over when the launcher ends, is reclaim.rs's and the
# elastic reclaims', which every release runs).
one_release_program() {
    case $(basename "$1") in
        hosts-* | network-* | two_actors-* | ha-* | serving-*) return 0 ;;
        *) return 1 ;;
    esac
}

# Whether this release's stage runs the demo: 22.05's (idle victim, 5 s
# poll, capped nodes, the hosts mode) and the newest release's (busy
# victim). 24.11's plugins, reclaims and records are its integration
# tests' (CI's time).
demo() {
    [ "${ONEPOOL_SKIP_DEMO:-0}" != 1 ] && [ "$1" != 24.11 ]
}

# `--skip` arguments for the tests of a program that only 22.05's stage
# runs: those that exercise onepool's own HTTP path (router, launcher,
# client) or its own decisions (advisory mode, renewal before a time
# limit) and ask Slurm nothing another test does not ask too. Every
# release still runs the reclaims (graceful, immediate, per node, onepoold
# killed mid-drain), and its demo serves a real model through onepoold.
one_release_tests() {
    local t=()
    case $(basename "$1") in
        side_doors-*) t=(squatted_ports_and_keyless_or_administrative_requests) ;;
        elastic-*) t=(prefix_affinity_survives restarts_and_an_upgrade_of_the_binary a_min_zero_endpoint_wakes
            an_advisory_endpoint_submits_and_cancels_nothing replicas_are_renewed_before_their_time_limit) ;;
    esac
    local n
    for n in "${t[@]}"; do printf -- '--skip\n%s\n' "$n"; done
}

# Whether this release's stage runs the hosts mode: 22.05's, unless
# ONEPOOL_SKIP_HOSTS=1.
hosts() {
    [ "$1" = 22.05 ] && [ "${ONEPOOL_SKIP_HOSTS:-0}" != 1 ]
}

# The programs the hosts-mode stage runs instead of the single-namespace
# pass: its own test, those whose hops onepoold makes, and the reclaim and
# report programs (their launchers at their node's address).
hosts_program() {
    case $(basename "$1") in
        hosts-* | network-* | serving-* | elastic-* | side_doors-* | reclaim-* | report-*) return 0 ;;
        *) return 1 ;;
    esac
}

# The nodes' CPU capped (issue #35, ONEPOOL_NODE_CPU_PERCENT: every slurmd
# and what it starts share that much of one core): the records program
# (with its slow variant, a 5 s poll) on a cluster of its own brought up
# capped, so that a timing assumption fails here rather than on a slower
# machine. 22.05's demo runs capped as well (run_release).
throttled() {
    local rel=$1 target=$2 dc=$3 percent=${ONEPOOL_THROTTLE_PERCENT:-100} t0=$SECONDS exe
    local tdir=$PWD/$target/throttled-cluster
    echo "== Slurm $rel: timing variant: the nodes' CPU capped at $percent% of one core"
    rm -rf "$tdir"
    # shellcheck disable=SC2064 # the values of now
    trap "'$dc' --dir '$tdir' down >/dev/null 2>&1" EXIT
    local ran=0
    for exe in $(test_executables); do
        if capped_program "$exe"; then
            (cd tests && ONEPOOL_NODE_CPU_PERCENT=$percent ONEPOOL_TEST_CLUSTER_DIR=$tdir \
                "$exe" --test-threads=1 --include-ignored)
            ran=$((ran + 1))
        fi
    done
    # None would pass silently (a test build that failed lists none).
    [ "$ran" -gt 0 ] || { echo "test.sh: the timing variant found no program to run" >&2; exit 1; }
    "$dc" --dir "$tdir" down
    trap - EXIT
    echo "== Slurm $rel: timing variant passed in $((SECONDS - t0)) s"
}

# The hosts mode (issue #36): each node, the head, the service and the
# client host in a network namespace of its own, so that every hop crosses
# an interface. The hosts test, then the programs whose hops onepoold
# makes (serving, elastic, reclaim, side doors, report) on a cluster of
# their own (ONEPOOL_TEST_HOSTS=1). 22.05 only (CI's time).
hosts_mode() {
    local rel=$1 target=$2 dc=$3 t0=$SECONDS exe
    local hdir=$PWD/$target/hosts-cluster
    echo "== Slurm $rel: the hosts mode (network namespaces), on its own cluster in $hdir"
    # shellcheck disable=SC2064 # the values of now
    trap "'$dc' --dir '$hdir' down >/dev/null 2>&1" EXIT
    local ran=0
    for exe in $(test_executables); do
        hosts_program "$exe" || continue
        local t1=$SECONDS
        (cd tests && ONEPOOL_TEST_HOSTS=1 ONEPOOL_TEST_CLUSTER_DIR=$hdir "$exe" --test-threads=1)
        echo "== Slurm $rel: $(basename "${exe%-*}") (hosts mode) passed in $((SECONDS - t1)) s"
        ran=$((ran + 1))
    done
    # None would pass silently (a test build that failed lists none).
    [ "$ran" -gt 0 ] || { echo "test.sh: the hosts mode found no program to run" >&2; exit 1; }
    "$dc" --dir "$hdir" down
    trap - EXIT
    echo "== Slurm $rel: the hosts mode passed in $((SECONDS - t0)) s"
}

# What a passed release's stage no longer needs: the test programs and
# intermediate files. The top-level programs and plugins stay (hard links
# into deps/, so their files survive): 24.11's stage loads 22.05's plugins
# to check they are refused. The host's target/release stays too, since
# every release's package takes its release-independent programs from it.
drop_build() {
    local rel=$1 target=$2 before
    before=$(du -sm "$target" | cut -f1)
    rm -rf "$target"/debug/{deps,build,.fingerprint,incremental,examples}
    if [ "$rel" != 22.05 ]; then
        rm -rf "$target/release"
    fi
    echo "== Slurm $rel: build output dropped, ${before} MiB -> $(du -sm "$target" | cut -f1) MiB; $(df -h --output=avail . | tail -n 1 | tr -d ' ') free"
}

# Stops what a run started (both clusters), inside the root it ran in, and
# in a release root whatever job processes outlived their slurmd.
cleanup() {
    local dc=$1 demo_dir=$2
    shift 2
    if [ "${ONEPOOL_KEEP_CLUSTER:-0}" != 1 ]; then
        "$@" "$dc" --dir "$ONEPOOL_TEST_CLUSTER_DIR" down >/dev/null 2>&1 || true
        if [ $# -ge 3 ]; then
            local p r
            for p in /proc/[0-9]*; do
                r=$(readlink "$p/root" 2>/dev/null) || continue
                [ "$r" = "$3" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
            done
        fi
    fi
    "$@" "$dc" --dir "$demo_dir" down >/dev/null 2>&1 || true
}

for r in "${releases[@]}"; do
    run_release "$r"
done
