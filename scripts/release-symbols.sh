#!/usr/bin/env bash
# release-symbols.sh ROOT
#
# Reports, for the Slurm installed in ROOT (/ for the host), what onepool's
# plugins rely on at run time: the version in slurm_version.h, which
# programs link libslurmfull.so, and whether slurmctld or libslurmfull.so
# export each symbol slurm-sys/src/host.rs resolves with dlsym. Read-only;
# no daemon is started. Output is Markdown-ish text for docs/slurm-releases.md.
set -euo pipefail
root=${1:?usage: $0 ROOT}
root=${root%/}
lib=$(find "$root/usr/lib/x86_64-linux-gnu/slurm-wlm" "$root/usr/lib/x86_64-linux-gnu/slurm" \
    -maxdepth 1 -name 'libslurmfull*.so*' 2>/dev/null | head -n1 || true)
ctld=$root/usr/sbin/slurmctld
symbols=(slurm_info slurm_error slurm_verbose slurm_debug slurm_xstrdup slurm_xfree
    spank_option_register spank_job_control_setenv spank_setenv spank_getenv spank_get_item
    spank_context spank_option_getopt slurm_init_update_node_msg slurm_update_node validate_operator)

hex=$(sed -n 's/^#define SLURM_VERSION_NUMBER[[:space:]]*0x\([0-9a-fA-F]*\).*/\1/p' "$root/usr/include/slurm/slurm_version.h")
printf 'SLURM_VERSION_NUMBER 0x%s = %d.%02d.%d\n' "$hex" $((0x$hex >> 16)) $(((0x$hex >> 8) & 0xff)) $((0x$hex & 0xff))
echo "libslurmfull: ${lib#"$root"}"

# ldd must run inside the root, so that the root's loader and libraries answer.
for prog in usr/sbin/slurmctld usr/sbin/slurmd usr/sbin/slurmstepd usr/bin/sbatch usr/bin/srun usr/bin/salloc; do
    [ -e "$root/$prog" ] || { echo "ldd /$prog: absent"; continue; }
    if [ "$root" = "" ]; then out=$(ldd "/$prog"); else out=$(chroot "$root" ldd "/$prog"); fi
    echo "ldd /$prog: $(grep -o 'libslurm[a-z]*[.-][^ ]*' <<<"$out" | sort -u | tr '\n' ' ')"
done

defined() { nm -D --defined-only "$1" 2>/dev/null | awk '{ print $NF }' | sed 's/@.*//' | sort -u; }
ctld_syms=$(defined "$ctld")
lib_syms=$(defined "$lib")
printf '| symbol | slurmctld | libslurmfull.so |\n|---|---|---|\n'
for s in "${symbols[@]}"; do
    a=absent; b=absent
    grep -qx "$s" <<<"$ctld_syms" && a=yes
    grep -qx "$s" <<<"$lib_syms" && b=yes
    echo "| $s | $a | $b |"
done
