#!/usr/bin/env bash
# package.sh [RELEASE...]   (RELEASE: 22.05 | 24.11 | 26.05 | all; default 22.05)
#
# Builds onepool's packages, one per Slurm release (issue #17):
#   target/packages/onepool_<version>+slurm<release>_amd64.deb
#   target/packages/onepool-<version>-1.slurm<release>.x86_64.rpm  (when rpmbuild exists)
#
# Inside (docs/packages.md):
#   the two plugins, built against that release's headers, in its PluginDir
#   (/usr/lib/x86_64-linux-gnu/slurm-wlm on Debian, /usr/lib64/slurm in the
#   .rpm) as job_submit_onepool.so and spank_onepool.so; /usr/bin/onepool and
#   /usr/bin/onepoold; the systemd units; the sample policy and daemon config
#   as conffiles in /etc/slurm; README.md, docs/ and LICENSE in /usr/share/doc/onepool;
#   manual pages onepool(1) (and one per subcommand), onepoold(8),
#   onepool.toml(5), onepoold.toml(5) in /usr/share/man;
#   a postinst that creates the service user `onepool` (regular uid) and
#   enables or starts nothing.
#
# The CLI and the daemon do not use Slurm's headers (only the two plugin
# crates depend on onepool-slurm-sys): they are built once, in target/release,
# and go into every package. The plugins are built per release: 22.05 (the
# host's headers) in target/release, the others against their root's headers
# (scripts/release-root.sh) in target/slurm-RELEASE/release.
#
# The Debian package pins the release it was built for with
#   Pre-Depends: slurm-wlm-basic-plugins (>= R~), slurm-wlm-basic-plugins (<< R'~)
# (R' the next minor release): slurm-wlm-basic-plugins owns the PluginDir and
# is pinned to the exact version by slurmctld, slurmd and slurm-client. A
# Pre-Depends, not a Depends: with an unmet Depends `dpkg -i` still unpacks
# the package (leaving it unconfigured), which would put a wrong release's
# plugins into PluginDir; an unmet Pre-Depends refuses before unpacking.
#
# ONEPOOL_PACKAGE_NO_BUILD=1 packs what is already built (no cargo);
# ONEPOOL_PACKAGE_BUILD_ONLY=1 builds what the packages take and packs
# nothing (scripts/test.sh builds them ahead, in the background).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD

# shellcheck disable=SC2206 # a list of words
asked=(${*:-22.05})
releases=()
for r in "${asked[@]}"; do
    case $r in
        all) releases+=(22.05 24.11 26.05) ;;
        22.05 | 24.11 | 26.05) releases+=("$r") ;;
        *) echo "package.sh: unknown Slurm release $r (22.05, 24.11, 26.05 or all)" >&2; exit 2 ;;
    esac
done

say() { echo "package: $*" >&2; }
now() { date +%s.%N; }
since() { printf '%.1f s' "$(echo "$(now) - $1" | bc)"; }

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "package.sh: no [workspace.package] version in Cargo.toml" >&2; exit 1; }
maintainer=${ONEPOOL_MAINTAINER:-onepool maintainers <maintainers@users.noreply.a-seed-4901b94d.example>}
out=$here/target/packages
mkdir -p "$out"
cargo=(nice -n 19 cargo)

# The next minor release after R (22.05 -> 22.06): the pin's upper bound.
next_release() { local major=${1%.*} minor=${1#*.}; printf '%s.%02d' "$major" $((10#$minor + 1)); }

# Host-independent binaries, once.
t=$(now)
if [ "${ONEPOOL_PACKAGE_NO_BUILD:-0}" != 1 ]; then
    say "building onepool and onepoold (release; no Slurm headers)"
    env -u SLURM_INCLUDE_DIR -u CARGO_TARGET_DIR "${cargo[@]}" build --release -q \
        -p onepool-cli -p onepool-elastic-daemon --bin onepool --bin onepoold
fi
say "CLI and daemon: $(since "$t")"
bins=$here/target/release

# stage_tree DIR PLUGINDIR PLUGIN_BUILD_DIR: the installed file tree.
stage_tree() {
    local d=$1 plugindir=$2 pbuild=$3
    rm -rf "$d"
    install -d "$d$plugindir" "$d/usr/bin" "$d/lib/systemd/system" "$d/etc/slurm" "$d/usr/share/doc/onepool"
    install -m 0644 "$pbuild/libjob_submit_onepool.so" "$d$plugindir/job_submit_onepool.so"
    install -m 0644 "$pbuild/libspank_onepool.so" "$d$plugindir/spank_onepool.so"
    install -m 0755 "$bins/onepool" "$bins/onepoold" "$d/usr/bin/"
    # Only the debug info goes: the plugins' exported symbols are dynamic.
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$d$plugindir"/*.so
    strip --remove-section=.comment --remove-section=.note "$d/usr/bin/onepool" "$d/usr/bin/onepoold"
    install -m 0644 etc/systemd/onepoold.service etc/systemd/onepoold.socket "$d/lib/systemd/system/"
    install -m 0644 etc/onepool.toml etc/onepoold.toml "$d/etc/slurm/"
    install -m 0644 README.md LICENSE "$d/usr/share/doc/onepool/"
    # The manuals the README points at (issue #27: the README is the front door).
    install -d "$d/usr/share/doc/onepool/docs"
    install -m 0644 docs/*.md "$d/usr/share/doc/onepool/docs/"
    # Manual pages, made by the binaries from their own definitions:
    # onepool(1) and its subcommands, onepoold(8), onepool.toml(5) and
    # onepoold.toml(5) (issue #27), so `man onepool` works after install.
    "$bins/onepool" man "$d/usr/share/man"
    "$bins/onepoold" --man "$d/usr/share/man"
    chmod 0644 "$d"/usr/share/man/man*/*
    gzip -9n "$d"/usr/share/man/man*/*
}

build_deb() {
    local rel=$1 pbuild=$2 upper d deb
    upper=$(next_release "$rel")
    d=$out/stage/deb-$rel
    stage_tree "$d" /usr/lib/x86_64-linux-gnu/slurm-wlm "$pbuild"
    sed "s/@VERSION@/$version/" packaging/debian/copyright >"$d/usr/share/doc/onepool/copyright"
    # A native package's changelog (policy 12.7), dated by the commit built.
    printf 'onepool (%s) unstable; urgency=medium\n\n  * Built for Slurm %s by scripts/package.sh from commit %s.\n\n -- %s  %s\n' \
        "$version+slurm$rel" "$rel" "$(git describe --always --dirty 2>/dev/null || echo unknown)" "$maintainer" \
        "$(git log -1 --format=%aD 2>/dev/null || date -R)" | gzip -9n >"$d/usr/share/doc/onepool/changelog.gz"
    install -d "$d/DEBIAN"
    install -m 0755 packaging/debian/postinst packaging/debian/postrm "$d/DEBIAN/"
    install -m 0644 packaging/debian/conffiles "$d/DEBIAN/"
    sed -e "s/@VERSION@/$version+slurm$rel/" \
        -e "s/@MAINTAINER@/$maintainer/" \
        -e "s/@RELEASE@/$rel/g" -e "s/@NEXT_RELEASE@/$upper/g" \
        -e "s/@INSTALLED_SIZE@/$(du -sk --exclude=DEBIAN "$d" | cut -f1)/" \
        packaging/debian/control.in >"$d/DEBIAN/control"
    (cd "$d" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$d/DEBIAN/md5sums"
    chmod 0644 "$d/DEBIAN/md5sums"
    deb=$out/onepool_${version}+slurm${rel}_amd64.deb
    dpkg-deb --root-owner-group -Zxz --build "$d" "$deb" >/dev/null
    say "$(basename "$deb"): $(du -h "$deb" | cut -f1)"
}

build_rpm() {
    local rel=$1 pbuild=$2 top upper
    command -v rpmbuild >/dev/null || { say "no rpmbuild (apt-get install rpm): no .rpm for $rel"; return 0; }
    upper=$(next_release "$rel")
    top=$out/stage/rpm-$rel
    rm -rf "$top"
    mkdir -p "$top"/{BUILD,RPMS,SRPMS,SPECS,SOURCES}
    stage_tree "$top/tree" /usr/lib64/slurm "$pbuild"
    # rpmbuild from Debian's `rpm`: no debuginfo package, no brp scripts
    # (the files are stripped above), no build-time dependency checks.
    rpmbuild -bb --quiet --nodeps --target x86_64 \
        --define "_topdir $top" \
        --define "_onepool_tree $top/tree" \
        --define "_onepool_version $version" \
        --define "_onepool_release $rel" \
        --define "_onepool_next_release $upper" \
        --define "_rpmfilename onepool-%{VERSION}-%{RELEASE}.%{ARCH}.rpm" \
        packaging/onepool.spec >/dev/null
    cp "$top"/RPMS/onepool-*.rpm "$out/"
    say "$(cd "$top/RPMS" && ls onepool-*.rpm): $(du -h "$top"/RPMS/onepool-*.rpm | cut -f1)"
}

for rel in "${releases[@]}"; do
    t=$(now)
    if [ "$rel" = 22.05 ]; then
        pbuild=$here/target/release
        if [ "${ONEPOOL_PACKAGE_NO_BUILD:-0}" != 1 ]; then
            say "Slurm $rel: building the plugins (host headers)"
            env -u SLURM_INCLUDE_DIR -u CARGO_TARGET_DIR "${cargo[@]}" build --release -q \
                -p onepool-priority-plugin -p onepool-spank-plugin
        fi
    else
        pbuild=$here/target/slurm-$rel/release
        if [ "${ONEPOOL_PACKAGE_NO_BUILD:-0}" != 1 ]; then
            root=$(bash scripts/release-root.sh "$rel" | tail -n 1)
            say "Slurm $rel: building the plugins (headers: $root/usr/include)"
            SLURM_INCLUDE_DIR=$root/usr/include CARGO_TARGET_DIR=$here/target/slurm-$rel \
                "${cargo[@]}" build --release -q -p onepool-priority-plugin -p onepool-spank-plugin
        fi
    fi
    say "Slurm $rel: plugins built in $(since "$t")"
    [ "${ONEPOOL_PACKAGE_BUILD_ONLY:-0}" != 1 ] || continue
    t=$(now)
    build_deb "$rel" "$pbuild"
    build_rpm "$rel" "$pbuild"
    say "Slurm $rel: packed in $(since "$t")"
done
