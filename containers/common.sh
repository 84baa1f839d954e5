# Shared by containers/build_cpu_image.sh and containers/build_gpu_image.sh (sourced, not run).
#
# The caller sets: script (its name, for messages), tag (the default --tag), variant (cpu or gpu,
# the Dockerfile's VARIANT) and help_lines (the sed range of its own header to print for --help),
# then calls `parse_args "$@"`, `check_host`, `build_base` and `build_image`.
# Environment: CONTAINERS_CONF (default: containers/containers.conf), TFGPU_PODMAN_RUNTIME
# (default runc), TFGPU_DEBIAN_MIRROR (default: the first Debian bookworm mirror apt uses).

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
base="localhost/tfgpu-bookworm"
clean=0

die() { echo "$script: $1" >&2; exit 1; }

parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --clean) clean=1 ;;
            --tag) tag="${2:?--tag needs an image name}"; shift ;;
            --base) base="${2:?--base needs an image name}"; shift ;;
            -h|--help) sed -n "$help_lines" "$here/$script" | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) echo "$script: unknown argument '$1'; see --help." >&2; exit 2 ;;
        esac
        shift
    done
    export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
    podman=(podman --runtime "${TFGPU_PODMAN_RUNTIME:-runc}")
}

check_host() {
    [ "$(id -u)" -eq 0 ] || die "run it as root (debootstrap and podman's root storage need it), e.g. sudo $here/$script"
    local tool
    for tool in podman debootstrap; do
        command -v "$tool" >/dev/null || die "$tool is not installed; apt-get install -y podman runc debootstrap catatonit"
    done
    "${podman[@]}" info >/dev/null || die "'${podman[*]} info' fails with CONTAINERS_CONF=$CONTAINERS_CONF: podman cannot run here"
}

# The Debian mirror this machine's apt uses (deb822 .sources first, then the one-line format).
debian_mirror() {
    local uri
    uri="$(awk '/^$/ {u=""} /^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ && u {print u; exit}' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
    [ -n "$uri" ] || uri="$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
    echo "$uri"
}

seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

# --clean removes the image and the base first (the base is rebuilt); then the base is made with
# debootstrap and `podman import` unless podman already has it.
build_base() {
    if [ "$clean" -eq 1 ]; then
        "${podman[@]}" rmi --force "$tag" "$base" >/dev/null 2>&1 || true
    fi
    if "${podman[@]}" image exists "$base"; then
        echo "base: $base is already in podman's storage (--clean rebuilds it)"
        return
    fi
    local mirror start
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
}

# `podman build` of the repository's Dockerfile with BASE=$base and VARIANT=$variant, tagged $tag;
# the image the tag named before is removed (unless a container uses it); prints the seconds,
# the size and `tfgpu --version` from the image.
build_image() {
    local ca=/etc/ssl/certs/ca-certificates.crt mounts=() previous start size
    [ -f "$ca" ] && mounts=(--volume "$ca:$ca:ro")
    previous="$("${podman[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
    start=$EPOCHREALTIME
    # --format docker: the OCI image format has no SHELL and no HEALTHCHECK (podman drops both).
    "${podman[@]}" build --format docker --network host "${mounts[@]}" \
        --build-arg "BASE=$base" --build-arg "VARIANT=$variant" --tag "$tag" \
        --file "$repo/Dockerfile" "$repo"
    echo "image: $tag built in $(seconds_since "$start") s"
    # The image the tag named before (GBs) would stay behind untagged: remove it unless in use.
    if [ -n "$previous" ] && [ "$previous" != "$("${podman[@]}" image inspect --format '{{.Id}}' "$tag")" ]; then
        "${podman[@]}" rmi "$previous" >/dev/null 2>&1 || true
    fi
    size="$("${podman[@]}" image inspect --format '{{.Size}}' "$tag")"
    awk -v s="$size" -v t="$tag" 'BEGIN {printf "image: %s is %.0f bytes (%.2f GB)\n", t, s, s / 1e9}'
    "${podman[@]}" run --rm "$tag" --version
}
