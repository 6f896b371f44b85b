#!/bin/bash
# The job bench/validate-simulator.sh submits for each row of jobs.csv:
#
#     job.sh WORK_S STATE LOG [NOTICE_S MODE]
#
# It "works" (sleeps) WORK_S seconds in all, across runs: the seconds done
# are kept in STATE, so a requeued run resumes with what is left. With
# NOTICE_S (the job is submitted with --signal=B:USR1@..., which Slurm
# sends at once when it picks the job as a reclaim victim, through
# SlurmctldParameters=preempt_send_user_signal), the reclaim notice makes
# it stop working, record what it has done, take NOTICE_S seconds (its
# checkpoint or drain), then: MODE=requeue, `scontrol requeue` itself
# (and wait for Slurm to end the run: a victim that exits ends COMPLETED,
# not requeued); MODE=exit, exit 0. Every event goes to LOG as
# "EPOCH event" (start, notice, requeue, exit, done).
set -u
work=$1 state=$2 log=$3 notice=${4:-} mode=${5:-exit}
done_s=$(cat "$state" 2>/dev/null || echo 0)
left=$(echo "$work - $done_s" | bc)
start=$(date +%s.%N)
echo "$start start ${SLURM_JOB_ID:-?} restart=${SLURM_RESTART_COUNT:-0} done=$done_s left=$left" >> "$log"

on_notice() {
    local now
    now=$(date +%s.%N)
    kill "$pid" 2>/dev/null
    echo "$done_s + $now - $start" | bc > "$state"
    echo "$now notice done=$(cat "$state")" >> "$log"
    sleep "$notice"
    if [ "$mode" = requeue ]; then
        echo "$(date +%s.%N) requeue" >> "$log"
        scontrol requeue "$SLURM_JOB_ID"
        sleep infinity
    fi
    echo "$(date +%s.%N) exit" >> "$log"
    exit 0
}
[ -n "$notice" ] && trap on_notice USR1

sleep "$left" &
pid=$!
wait "$pid"
echo "$(date +%s.%N) done" >> "$log"
