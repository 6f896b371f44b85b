# Shared by the benchmarks that put onepoold's router in front of local
# backends (router.sh, resume.sh); sourced, not run.

# wait_port PORT: returns once something listens on 127.0.0.1:PORT (5 s at
# most, then fails saying so).
wait_port() {
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "nothing listens on 127.0.0.1:$1" >&2
    return 1
}

# stop_all PID...: ends the processes and waits for them.
stop_all() {
    for p in "$@"; do kill "$p" 2>/dev/null || true; done
    for p in "$@"; do wait "$p" 2>/dev/null || true; done
}
