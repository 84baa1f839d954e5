#!/usr/bin/env bash
# Build tfgpu's CPU image with podman from a local Debian base, without any container registry.
#
#   containers/build_cpu_image.sh [--clean] [--tag NAME] [--base NAME]
#
# 1. The base: if the image NAME given by --base (default localhost/tfgpu-bookworm) is not
#    in podman's storage yet (or --clean), `debootstrap --variant=minbase` makes a Debian
#    bookworm root file system with python3, python3-pip and ca-certificates from the
#    Debian mirror this machine's apt uses, and `podman import` turns it into an image.
# 2. The image: `podman build --build-arg BASE=<base>` of the repository's Dockerfile (the
#    same file that builds the GPU image), tagged NAME (default localhost/tfgpu-cpu). pip
#    inside the build reaches the package index through the host's network (--network host)
#    and the host's CA bundle (mounted read-only over the base's). The image the tag named
#    before is removed (unless a container uses it), so rebuilds leave no 2.4 GB behind.
# 3. Prints the seconds each step took and the image size (`podman image inspect`), then
#    runs `tfgpu --version` in the image.
#
# --clean removes both images first, so both are built from nothing, as on a clean CI machine.
# Needs root (debootstrap, podman's root storage), podman, runc and debootstrap:
#   apt-get install -y podman runc debootstrap catatonit
# Environment: CONTAINERS_CONF (default: containers/containers.conf beside this script, the
# settings a VM without systemd or with fixed ulimits needs: see docs/containers.md),
# TFGPU_PODMAN_RUNTIME (the OCI runtime, default runc), TFGPU_DEBIAN_MIRROR (default: the
# first Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
tag="localhost/tfgpu-cpu"
base="localhost/tfgpu-bookworm"
clean=0
while [ $# -gt 0 ]; do
    case "$1" in
        --clean) clean=1 ;;
        --tag) tag="${2:?--tag needs an image name}"; shift ;;
        --base) base="${2:?--base needs an image name}"; shift ;;
        -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build_cpu_image.sh: unknown argument '$1'; see --help." >&2; exit 2 ;;
    esac
    shift
done

export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
podman=(podman --runtime "${TFGPU_PODMAN_RUNTIME:-runc}")

die() { echo "build_cpu_image.sh: $1" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run it as root (debootstrap and podman's root storage need it), e.g. sudo $0"
for tool in podman debootstrap; do
    command -v "$tool" >/dev/null || die "$tool is not installed; apt-get install -y podman runc debootstrap catatonit"
done
"${podman[@]}" info >/dev/null || die "'${podman[*]} info' fails with CONTAINERS_CONF=$CONTAINERS_CONF: podman cannot run here"

# The Debian mirror this machine's apt uses (deb822 .sources first, then the one-line format).
debian_mirror() {
    local uri
    uri="$(awk '/^$/ {u=""} /^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ && u {print u; exit}' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
    [ -n "$uri" ] || uri="$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
    echo "$uri"
}

seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

if [ "$clean" -eq 1 ]; then
    "${podman[@]}" rmi --force "$tag" "$base" >/dev/null 2>&1 || true
fi

if "${podman[@]}" image exists "$base"; then
    echo "base: $base is already in podman's storage (--clean rebuilds it)"
else
    mirror="${TFGPU_DEBIAN_MIRROR:-$(debian_mirror)}"
    [ -n "$mirror" ] || die "no Debian bookworm mirror found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list; set TFGPU_DEBIAN_MIRROR=http://<mirror>/debian"
    rootfs="$(mktemp -d /var/tmp/tfgpu-rootfs.XXXXXX)"
    trap 'rm -rf "$rootfs"' EXIT
    start=$EPOCHREALTIME
    echo "base: debootstrap bookworm from $mirror"
    debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
        bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
        || { tail -n 30 "$rootfs.log" >&2; die "debootstrap failed (log above, all of it in $rootfs.log)"; }
    rm -f "$rootfs.log"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | "${podman[@]}" import --quiet - "$base" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
    echo "base: $base built in $(seconds_since "$start") s"
fi

ca=/etc/ssl/certs/ca-certificates.crt
mounts=()
[ -f "$ca" ] && mounts=(--volume "$ca:$ca:ro")
previous="$("${podman[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
start=$EPOCHREALTIME
# --format docker: the OCI image format has no SHELL and no HEALTHCHECK (podman drops both).
"${podman[@]}" build --format docker --network host "${mounts[@]}" --build-arg "BASE=$base" --tag "$tag" \
    --file "$repo/Dockerfile" "$repo"
echo "image: $tag built in $(seconds_since "$start") s"
# The image the tag named before (2.4 GB) would stay behind untagged: remove it unless in use.
if [ -n "$previous" ] && [ "$previous" != "$("${podman[@]}" image inspect --format '{{.Id}}' "$tag")" ]; then
    "${podman[@]}" rmi "$previous" >/dev/null 2>&1 || true
fi
size="$("${podman[@]}" image inspect --format '{{.Size}}' "$tag")"
awk -v s="$size" -v t="$tag" 'BEGIN {printf "image: %s is %.0f bytes (%.2f GB)\n", t, s, s / 1e9}'
"${podman[@]}" run --rm "$tag" --version
