#!/usr/bin/env bash
# Builds the Debian package (`cargo deb`), checks what is in it, installs it on this machine with dpkg,
# runs the installed binaries, checks what its postinst made (the shardlog user, /var/lib/shardlog) and
# that it enabled nothing, then purges it and removes the user and data dir again if this run made them,
# so the machine is left as found. Needs root. Safe to run again, also after an interrupted run.
#
#   scripts/check-package.sh                 # the package users install: a release build (10-15 min here)
#   scripts/check-package.sh --profile dev   # the same package around debug binaries
#   ... --no-build                           # package that profile's binaries as they are in the target dir
#
# The release and dev packages differ only in the binaries' optimisation: assets, control fields and
# maintainer scripts come from the same [package.metadata.deb] of broker/Cargo.toml. CI runs
# `--profile dev --no-build` right after the tests, which built target/debug/shardlog and shardlog-bench
# from the same tree, so the check costs no compiling. cargo-deb warns that it is meant for release
# builds when given the dev profile; that warning is expected here.
#
# Left behind on purpose: nothing. The user and /var/lib/shardlog stay after `dpkg --purge` (the
# package never deletes them, and the check asserts that), so this script removes them itself when they
# were not there before it ran; an existing user or data dir is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
PACKAGE=shardlog
# What an interrupted run leaves for the next one: that it installed the package, and whether the user
# and the data dir were there before it.
STATE=/var/tmp/shardlog-package-check.state

profile=release
build=yes
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile="$2"; shift 2 ;;
        --no-build) build=no; shift ;;
        *) echo "usage: $0 [--profile release|dev] [--no-build]" >&2; exit 2 ;;
    esac
done
case "$profile" in
    release | dev) ;;
    *) echo "--profile: release or dev, not $profile" >&2; exit 2 ;;
esac

passed=0
pass() {
    passed=$((passed + 1))
    echo "ok: $*"
}
fail() {
    echo "check-package: FAILED: $*" >&2
    exit 1
}

[ "$(id -u)" -eq 0 ] || fail "needs root (dpkg -i, and the user postinst makes)"
for tool in dpkg dpkg-deb dpkg-shlibdeps; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is missing (Debian packages dpkg, dpkg-dev)"
done

if [ "$(cargo deb --version 2>/dev/null || true)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
    cargo install --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi

# Installed in any state dpkg knows (also only its config files left, or half-installed).
installed() {
    local status
    status=$(dpkg-query -W -f='${db:Status-Status}' "$PACKAGE" 2>/dev/null || true)
    [ -n "$status" ] && [ "$status" != not-installed ]
}

# Put back what this run (or an interrupted earlier one) changed: the package, and the user and data dir
# if they were not there before. The data dir is removed only while empty: data is never deleted.
restore() {
    [ -f "$STATE" ] || return 0
    # shellcheck source=/dev/null
    . "$STATE"
    if installed; then
        dpkg --purge "$PACKAGE" >/dev/null
    fi
    if [ "$user_before" = no ] && getent passwd shardlog >/dev/null; then
        userdel shardlog
    fi
    if [ "$user_before" = no ] && getent group shardlog >/dev/null; then
        groupdel shardlog
    fi
    if [ "$dir_before" = no ] && [ -d /var/lib/shardlog ]; then
        rmdir /var/lib/shardlog || echo "check-package: /var/lib/shardlog is not empty; left in place" >&2
    fi
    rm -f "$STATE"
}

# An interrupted run of this script installed the package: undo that first. Any other installation of
# it (or a binary put in /usr/bin by hand, which dpkg would overwrite and then delete) is someone's.
restore
if installed; then
    fail "package $PACKAGE is installed and not by this check; remove it first (dpkg --purge $PACKAGE)"
fi
for path in /usr/bin/shardlog /usr/bin/shardlog-bench; do
    [ ! -e "$path" ] || fail "$path exists outside any package; move it away first"
done

# --- build ---------------------------------------------------------------------------------------------
started=$SECONDS
# cargo deb builds the workspace (shardlog-bench is another crate's binary), then packages.
deb_flags=(-p shardlog-broker --locked --profile "$profile")
[ "$build" = yes ] || deb_flags+=(--no-build)
# The debug binaries are 230-260 MB of debug information: compressing it takes cargo deb 100 s, without
# 37 s. Where it goes and how the package is laid out stay the release package's.
[ "$profile" = release ] || deb_flags+=(--fast --no-compress-debug-symbols)
deb=$(cargo deb "${deb_flags[@]}" | tail -n 1)
[ -f "$deb" ] || fail "cargo deb printed no package path (got: $deb)"
echo "built $deb in $((SECONDS - started)) s"

# --- contents ------------------------------------------------------------------------------------------
expected=(
    ./usr/bin/shardlog
    ./usr/bin/shardlog-bench
    ./usr/lib/systemd/system/shardlog.service
    ./usr/lib/systemd/system/shardlog@.service
    ./usr/lib/sysusers.d/shardlog.conf
    ./usr/lib/tmpfiles.d/shardlog.conf
    ./etc/shardlog/shardlog.toml
    ./usr/share/doc/shardlog/README.md
    ./usr/share/shardlog/grafana/shardlog.json
    ./usr/share/doc/shardlog/copyright
)
contents=$(dpkg-deb --contents "$deb")
listed=$(awk '{ print $6 }' <<<"$contents")
missing=()
for path in "${expected[@]}"; do
    grep -qxF "$path" <<<"$listed" || missing+=("$path")
done
[ ${#missing[@]} -eq 0 ] || fail "missing from $deb: ${missing[*]}"$'\n'"it holds:"$'\n'"$contents"
pass "the package holds all ${#expected[@]} expected paths"
for path in ./usr/bin/shardlog ./usr/bin/shardlog-bench; do
    grep -qE "^-rwxr-xr-x (root/root|0/0) .* $path\$" <<<"$contents" || fail "$path is not mode 755, root-owned"
done
pass "both binaries are mode 755, owned by root"
debug_files=$(grep -c '^-.* \./usr/lib/debug/\.build-id/.*\.debug$' <<<"$contents" || true)
[ "$debug_files" -eq 2 ] || fail "expected the 2 binaries' debug symbols under /usr/lib/debug/.build-id, found $debug_files"
pass "both binaries' debug symbols are in /usr/lib/debug/.build-id"

# --- control fields ------------------------------------------------------------------------------------
version=$(cargo pkgid -p shardlog-broker | sed 's/.*@//')
field() { dpkg-deb --field "$deb" "$1"; }
[ "$(field Package)" = "$PACKAGE" ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version-1" ] || fail "Version: $(field Version), not $version-1"
[ "$(field Architecture)" = "$(dpkg --print-architecture)" ] || fail "Architecture: $(field Architecture)"
[ "$(field Section)" = net ] || fail "Section: $(field Section)"
[[ "$(field Maintainer)" =~ ^.+\ \<.+@.+\>$ ]] || fail "Maintainer: $(field Maintainer)"
[[ "$(field Depends)" == *libc6* ]] || fail "Depends lacks libc6: $(field Depends)"
# deploy/README.md (installed as the package's README) names each dependency dpkg-shlibdeps found.
for dependency in $(field Depends | tr ',|' '\n\n' | sed 's/(.*//; s/[[:space:]]//g'); do
    grep -qF "\`$dependency\`" deploy/README.md || fail "deploy/README.md does not name the dependency $dependency"
done
[ -n "$(field Description)" ] || fail "no Description"
pass "control fields: Package $PACKAGE, Version $version-1, Architecture $(field Architecture), Depends $(field Depends)"
[ "$(dpkg-deb --info "$deb" conffiles)" = /etc/shardlog/shardlog.toml ] ||
    fail "conffiles: $(dpkg-deb --info "$deb" conffiles)"
pass "/etc/shardlog/shardlog.toml is the one conffile"
for script in postinst prerm postrm; do
    dpkg-deb --info "$deb" "$script" | cmp -s - "deploy/debian/$script" || fail "$script is not deploy/debian/$script"
done
pass "maintainer scripts postinst, prerm, postrm are deploy/debian's"

# --- install -------------------------------------------------------------------------------------------
user_before=no
getent passwd shardlog >/dev/null && user_before=yes
dir_before=no
[ -e /var/lib/shardlog ] && dir_before=yes
printf 'user_before=%s\ndir_before=%s\n' "$user_before" "$dir_before" >"$STATE"
trap restore EXIT
trap 'exit 130' INT TERM
wants_before=$(find /etc/systemd/system -path '*.wants/*' 2>/dev/null | sort)

dpkg -i "$deb"
pass "dpkg -i installed it"

[[ "$(/usr/bin/shardlog --version)" == "shardlog $version "* ]] ||
    fail "/usr/bin/shardlog --version: $(/usr/bin/shardlog --version)"
pass "/usr/bin/shardlog --version: $(/usr/bin/shardlog --version)"
/usr/bin/shardlog-bench --help >/dev/null || fail "/usr/bin/shardlog-bench --help failed"
pass "/usr/bin/shardlog-bench --help"
/usr/bin/shardlog config sample | cmp -s - /etc/shardlog/shardlog.toml ||
    fail "/etc/shardlog/shardlog.toml is not what the installed shardlog config sample prints"
pass "/etc/shardlog/shardlog.toml is the installed binary's config sample"
for unit in /usr/lib/systemd/system/shardlog.service /usr/lib/systemd/system/shardlog@.service; do
    exec_start=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
    [ "$exec_start" = /usr/bin/shardlog ] || fail "$unit: ExecStart runs $exec_start"
done
[ -x /usr/bin/shardlog ] || fail "/usr/bin/shardlog is not executable"
pass "both units' ExecStart is /usr/bin/shardlog, which the package installs"

check_user_and_dir() {
    local passwd owner uid home shell
    passwd=$(getent passwd shardlog) || fail "$1: no shardlog user"
    IFS=: read -r _ _ uid _ _ home shell <<<"$passwd"
    [ "$uid" -lt 1000 ] || fail "$1: shardlog is not a system user (uid $uid)"
    [ "$home" = /var/lib/shardlog ] || fail "$1: shardlog's home is $home"
    [ "$shell" = /usr/sbin/nologin ] || fail "$1: shardlog's shell is $shell"
    getent group shardlog >/dev/null || fail "$1: no shardlog group"
    owner=$(stat -c '%U:%G %a' /var/lib/shardlog) || fail "$1: no /var/lib/shardlog"
    [ "$owner" = "shardlog:shardlog 750" ] || fail "$1: /var/lib/shardlog is $owner, not shardlog:shardlog 750"
    pass "$1: system user shardlog (uid $uid, nologin), /var/lib/shardlog shardlog:shardlog 750"
}
check_user_and_dir "postinst"

wants_after=$(find /etc/systemd/system -path '*.wants/*' 2>/dev/null | sort)
[ "$wants_after" = "$wants_before" ] || fail "installing enabled units: $(comm -13 <(echo "$wants_before") <(echo "$wants_after"))"
! find /etc/systemd/system -path '*.wants/shardlog*' 2>/dev/null | grep -q . || fail "a shardlog unit is enabled"
pass "nothing was enabled (no new link under /etc/systemd/system/*.wants)"

# Installing the same package again runs the upgrade path of the scripts (prerm upgrade, postinst
# configure with the user and the data dir already there).
dpkg -i "$deb" >/dev/null
check_user_and_dir "reinstall"

# --- purge ---------------------------------------------------------------------------------------------
dpkg --purge "$PACKAGE" >/dev/null
for path in /usr/bin/shardlog /usr/bin/shardlog-bench /usr/lib/systemd/system/shardlog.service /etc/shardlog/shardlog.toml; do
    [ ! -e "$path" ] || fail "$path is still there after dpkg --purge"
done
[ -d /var/lib/shardlog ] || fail "dpkg --purge deleted /var/lib/shardlog"
getent passwd shardlog >/dev/null || fail "dpkg --purge deleted the shardlog user"
pass "dpkg --purge removed the files and kept /var/lib/shardlog and the shardlog user"

# --- postinst without systemd-sysusers/-tmpfiles (a host without systemd) ------------------------------
# Only where this run can make the user from nothing: postinst run as dpkg would, with a PATH that has
# the tools of its fallback but not systemd's.
restore
if [ "$user_before" = no ] && [ "$dir_before" = no ]; then
    printf 'user_before=no\ndir_before=no\n' >"$STATE"
    bare=$(mktemp -d)
    for tool in getent useradd install; do
        ln -s "$(command -v "$tool")" "$bare/$tool"
    done
    dpkg-deb --info "$deb" postinst >"$bare/postinst"
    PATH=$bare /bin/sh "$bare/postinst" configure
    rm -r "$bare"
    check_user_and_dir "postinst without systemd"
    restore
fi
trap - EXIT

echo "check-package: built ($profile profile), checked, installed and purged in $((SECONDS - started)) s"
echo "check-package: $passed passed, 0 failed"
