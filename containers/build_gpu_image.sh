#!/usr/bin/env bash
# Build tfgpu's GPU image with podman from a local Debian base and TensorFlow's CUDA wheels,
# without any container registry and without an NVIDIA base image.
#
#   containers/build_gpu_image.sh [--clean] [--tag NAME] [--base NAME]
#
# 1. The base: the Debian bookworm of build_cpu_image.sh (--base, default
#    localhost/tfgpu-bookworm), made with debootstrap and `podman import` if podman does not
#    have it yet (or --clean); the CPU image and this one share it.
# 2. The image: `podman build --build-arg BASE=<base> --build-arg VARIANT=gpu` of the
#    repository's Dockerfile, tagged NAME (default localhost/tfgpu:gpu): TensorFlow 2.21.0, then
#    the CUDA 12 / cuDNN 9 libraries as pip wheels (`pip install tensorflow[and-cuda]==2.21.0`,
#    TensorFlow's own install guide; about 2.7 GB of wheels from the package index), then tfgpu.
#    The TensorFlow layer is the CPU image's (shared on disk); a change to tfgpu/ rebuilds only
#    the last layer, so the CUDA wheels are not downloaded again. The host needs only the NVIDIA
#    driver (and the NVIDIA Container Toolkit or podman's CDI to give it to the container).
#    The image the tag named before is removed (unless a container uses it).
# 3. Prints the seconds each step took and the image size (`podman image inspect`), then
#    runs `tfgpu --version` in the image. `podman run --rm localhost/tfgpu:gpu doctor` lists
#    the CUDA libraries even on a host without a GPU (the only error then: no driver).
#
# --clean removes the image and the base first, so both are built from nothing, as on a clean CI machine.
# Needs root (debootstrap, podman's root storage), podman, runc and debootstrap:
#   apt-get install -y podman runc debootstrap catatonit
# Environment: CONTAINERS_CONF (default: containers/containers.conf beside this script),
# TFGPU_PODMAN_RUNTIME (the OCI runtime, default runc), TFGPU_DEBIAN_MIRROR (default: the
# first Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list).
# The shell code shared with build_cpu_image.sh is in containers/common.sh; docs/containers.md.
set -euo pipefail

script=build_gpu_image.sh
tag="localhost/tfgpu:gpu"
variant=gpu
help_lines='2,28p'
# shellcheck source=containers/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
check_host
build_base
build_image
