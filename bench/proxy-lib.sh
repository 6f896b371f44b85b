# Shared by the benchmarks that put onepoold's router in front of local
# backends (router.sh, resume.sh, serving.sh, classes.sh); sourced, not run.

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

# start_llama_replica PORT SLOTS LOG: llama-server (SmolLM2-135M from
# scripts/model-server.sh, in $models; one thread, SLOTS slots) under
# `onepool replica` ($TARGET_DIR's release build), whose front listens on
# 127.0.0.1:PORT and the server on PORT + 1, with the replica key and the
# server's key from ONEPOOL_REPLICA_KEY and ONEPOOL_BACKEND_API_KEY; its
# pid goes to PIDS.
start_llama_replica() {
    "$TARGET_DIR/release/onepool" replica --report none --listen "127.0.0.1:$1" --backend "127.0.0.1:$(($1 + 1))" --drain-timeout 10s -- \
        sh -c "exec $models/bin/llama-server -m $models/models/SmolLM2-135M-Instruct.Q4_1.gguf --alias SmolLM2-135M-Instruct \
            --host 127.0.0.1 --port \$ONEPOOL_BACKEND_PORT -t 1 --parallel $2 -c $(($2 * 512)) --metrics" >"$3" 2>&1 &
    PIDS+=($!)
}

# stop_all PID...: ends the processes and waits for them.
stop_all() {
    for p in "$@"; do kill "$p" 2>/dev/null || true; done
    for p in "$@"; do wait "$p" 2>/dev/null || true; done
}
