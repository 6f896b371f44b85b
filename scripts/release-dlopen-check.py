#!/usr/bin/env python3
"""dlopen check of onepool's plugins inside a Slurm release's root.

Run inside the root (chroot ROOT python3 release-dlopen-check.py SO...):
loads each plugin with RTLD_LAZY twice, first alone (nothing of Slurm in
the process: the plugin must not need any Slurm symbol to load), then after
libslurmfull.so was loaded RTLD_GLOBAL as slurmctld/slurmd/srun have it, and
reads plugin_type and plugin_version; then looks up, through the process's
global scope (what dlsym(RTLD_DEFAULT, ..) sees), every libslurmfull symbol
slurm-sys/src/host.rs resolves. Exit status 1 on any failure.

With --foreign SO...: the plugins were built for another release; checks
that each one, loaded as Slurm loads it, logs the line telling the admin
what to do and carries a plugin_version Slurm refuses.
"""
import ctypes
import os
import re
import sys

LIBSLURMFULL = "/usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so"
HOST_SYMBOLS = [
    "slurm_info", "slurm_error", "slurm_verbose", "slurm_debug", "slurm_xstrdup", "slurm_xfree",
    "spank_option_register", "spank_job_control_setenv", "spank_setenv", "spank_getenv",
    "spank_get_item", "spank_context", "spank_option_getopt", "slurm_init_update_node_msg",
    "slurm_update_node",
]


def header_version():
    text = open("/usr/include/slurm/slurm_version.h").read()
    return int(re.search(r"#define SLURM_VERSION_NUMBER\s+0x([0-9a-fA-F]+)", text).group(1), 16)


def main(paths):
    ok = True
    want = header_version()
    for p in paths:
        # In a child, so that the load after libslurmfull below is a fresh one.
        pid = os.fork()
        if pid == 0:
            try:
                ctypes.CDLL(p, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
                print(f"{p}: dlopen(RTLD_LAZY) without libslurmfull: ok", flush=True)
                os._exit(0)
            except OSError as e:
                print(f"{p}: dlopen(RTLD_LAZY) without libslurmfull: FAILED: {e}", flush=True)
                os._exit(1)
        ok &= os.waitpid(pid, 0)[1] == 0
    ctypes.CDLL(LIBSLURMFULL, mode=os.RTLD_LAZY | os.RTLD_GLOBAL)
    for p in paths:
        try:
            h = ctypes.CDLL(p, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
        except OSError as e:
            ok = False
            print(f"{p}: dlopen(RTLD_LAZY) after libslurmfull: FAILED: {e}")
            continue
        version = ctypes.c_uint32.in_dll(h, "plugin_version").value
        ptype = ctypes.c_char_p(ctypes.addressof(ctypes.c_char.in_dll(h, "plugin_type"))).value.decode()
        match = "matches" if version == want else "DIFFERS from"
        ok &= version == want
        print(f"{p}: dlopen after libslurmfull: ok; plugin_type {ptype}, plugin_version "
              f"0x{version:06x} {match} slurm_version.h 0x{want:06x}")
    glob = ctypes.CDLL(None)
    missing = [s for s in HOST_SYMBOLS if not hasattr(glob, s)]
    print("dlsym(RTLD_DEFAULT) of host.rs symbols: " + ("all found" if not missing else "MISSING " + " ".join(missing)))
    ok &= not missing
    return 0 if ok else 1


def refused(paths):
    """--foreign: each plugin was built for another release. Loaded as Slurm
    loads it (libslurmfull already in the process), its constructor must
    log the line that tells the admin which releases differ and what to do,
    and its plugin_version must differ (Slurm then refuses it)."""
    ok = True
    want = header_version()
    ctypes.CDLL(LIBSLURMFULL, mode=os.RTLD_LAZY | os.RTLD_GLOBAL)
    for p in paths:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.dup2(w, 2)
            try:
                h = ctypes.CDLL(p, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
                version = ctypes.c_uint32.in_dll(h, "plugin_version").value
                os._exit(0 if version != want else 3)
            except OSError:
                os._exit(2)
        os.close(w)
        said = os.fdopen(r).read()
        status = os.waitpid(pid, 0)[1] >> 8
        line = next((l for l in said.splitlines() if "this onepool plugin was built for Slurm" in l), None)
        good = status == 0 and line is not None and "rebuild it against this release's headers" in line
        ok &= good
        print(f"{p} (built for another release): " + (f"refused as it should be: {line.strip()}" if good else
              f"FAILED (exit {status}; plugin_version {'differs' if status != 3 else 'is the same'}; said {said!r})"))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--foreign"]:
        sys.exit(refused(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
