#!/usr/bin/env bash
# Runs a command on a lavapipe that has cooperative matrices, which Debian 12's Mesa (22.3) does
# not: Mesa from Debian 13's backports does (8×8 f16 tiles, subgroups of 8). Sets up once, as
# root, a minimal Debian 13 root (debootstrap) with that Mesa under $MGN_COOP_ROOT (default
# /var/cache/mgn/coop-root, 693 MB, 1–2 minutes), then runs the command chrooted there with
# this repository mounted at its own path, so test binaries built here run unchanged.
#
#   bash scripts/coop_lavapipe.sh target/debug/mgnc info
#
# Exits 77 (and says why) when it cannot: not root, or no apt-get to install debootstrap with.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${MGN_COOP_ROOT:-/var/cache/mgn/coop-root}

if [ "$(id -u)" != 0 ]; then
    echo "scripts/coop_lavapipe.sh: needs root (debootstrap and chroot)" >&2
    exit 77
fi

mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mount_into() {
    mkdir -p "$root$2"
    mountpoint -q "$root$2" || { mount --bind "$1" "$root$2" && mounted+=("$root$2"); }
}

# Setting up: any failure means this machine cannot have such a device (77), not a failed test.
unavailable() {
    echo "scripts/coop_lavapipe.sh: $1" >&2
    exit 77
}
if [ ! -f "$root/.mgn-ready" ]; then
    # Said before it happens, on stderr (callers read the command's stdout): this changes the
    # machine outside the repository.
    if ! command -v debootstrap >/dev/null; then
        command -v apt-get >/dev/null || unavailable "no debootstrap, and no apt-get to install it"
        echo "scripts/coop_lavapipe.sh: installing debootstrap with apt-get (a system package)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
            unavailable "debootstrap could not be installed"
    fi
    echo "scripts/coop_lavapipe.sh: writing a Debian 13 root with Mesa 26.1 to $root" \
        "(693 MB, 1-2 minutes, once; delete it to undo)" >&2
    rm -rf "$root"
    mkdir -p "$root"
    debootstrap --variant=minbase trixie "$root" http://deb.debian.org/debian >/dev/null ||
        unavailable "debootstrap of Debian 13 failed"
    echo "deb http://deb.debian.org/debian trixie-backports main" >"$root/etc/apt/sources.list.d/backports.list"
    mount_into /proc /proc || unavailable "cannot bind-mount /proc"
    mount_into /dev /dev || unavailable "cannot bind-mount /dev"
    chroot "$root" apt-get update -qq || unavailable "apt-get update in the new root failed"
    chroot "$root" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq -t trixie-backports mesa-vulkan-drivers libvulkan1 >/dev/null ||
        unavailable "Mesa from trixie-backports could not be installed"
    touch "$root/.mgn-ready"
fi
mount_into /proc /proc || unavailable "cannot bind-mount /proc"
mount_into /dev /dev || unavailable "cannot bind-mount /dev"
mount_into "$repo" "$repo" || unavailable "cannot bind-mount the repository"
# The command's environment as given, its working directory this one (inside the repository).
chroot "$root" env -C "$PWD" "$@"
