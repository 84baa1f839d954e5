#!/usr/bin/env bash
# Build tfgpu's CPU image with podman from a local Debian base, without any container registry.
#
#   containers/build_cpu_image.sh [--clean] [--tag NAME] [--base NAME]
#
# 1. The base: if the image NAME given by --base (default localhost/tfgpu-bookworm) is not
#    in podman's storage yet (or --clean), `debootstrap --variant=minbase` makes a Debian
#    bookworm root file system with python3, python3-pip and ca-certificates from the
#    Debian mirror this machine's apt uses, and `podman import` turns it into an image.
# 2. The image: `podman build --build-arg BASE=<base> --build-arg VARIANT=cpu` of the
#    repository's Dockerfile (the same file that builds the GPU image: containers/build_gpu_image.sh),
#    tagged NAME (default localhost/tfgpu-cpu). pip inside the build reaches the package index
#    through the host's network (--network host) and the host's CA bundle (mounted read-only over
#    the base's). The image the tag named before is removed (unless a container uses it), so
#    rebuilds leave no 2.4 GB behind.
# 3. Prints the seconds each step took and the image size (`podman image inspect`), then
#    runs `tfgpu --version` in the image.
#
# --clean removes the image and the base first, so both are built from nothing, as on a clean CI machine.
# Needs root (debootstrap, podman's root storage), podman, runc and debootstrap:
#   apt-get install -y podman runc debootstrap catatonit
# Environment: CONTAINERS_CONF (default: containers/containers.conf beside this script, the
# settings a VM without systemd or with fixed ulimits needs: see docs/containers.md),
# TFGPU_PODMAN_RUNTIME (the OCI runtime, default runc), TFGPU_DEBIAN_MIRROR (default: the
# first Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list).
# The shell code shared with build_gpu_image.sh is in containers/common.sh.
set -euo pipefail

script=build_cpu_image.sh
tag="localhost/tfgpu-cpu"
variant=cpu
help_lines='2,26p'
# shellcheck source=containers/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
check_host
build_base
build_image
