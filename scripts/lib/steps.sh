# shellcheck shell=bash
# Timed step lines for the install tests (scripts/package-test.sh,
# deploy-test.sh, upgrade-test.sh): `steps_begin PREFIX [START]` once, then
# `say WHAT` after each step prints "PREFIX: WHAT (N s; total M s)".

now() { date +%s.%N; }
steps_begin() {
    step_prefix=$1
    t_start=${2:-$(now)}
    step_t=$(now)
}
say() {
    printf '%s: %s (%.1f s; total %.1f s)\n' "$step_prefix" "$1" \
        "$(echo "$(now) - $step_t" | bc)" "$(echo "$(now) - $t_start" | bc)"
    step_t=$(now)
}
fail() { echo "$step_prefix: FAILED: $*" >&2; exit 1; }
indent() { sed 's/^/    /'; }
