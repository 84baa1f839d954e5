# tfgpu's image, one file for two variants: the GPU image users run (VARIANT=gpu, the default) and
# a CPU image (VARIANT=cpu), both on a Debian base with Python 3.10+ and pip (BASE).
#
#   docker build -t tfgpu .
#   docker run --rm --gpus all --shm-size=1g tfgpu doctor
#   docker run --rm --init --gpus all --shm-size=1g --user "$(id -u):$(id -g)" \
#       -v "$PWD/data:/data" -v "$PWD/runs:/work/runs" \
#       tfgpu run recipes/mnist.yaml
#
# The host needs only the NVIDIA driver and the NVIDIA Container Toolkit. The working
# directory is /work: recipes/ (the repository's recipes) and runs/ (a volume) are there,
# so paths are the same as in a checkout. Files in the bind-mounted runs/ are written by
# the image's user `tfgpu` (uid 1000) unless `--user "$(id -u):$(id -g)"` runs it as you.
# `--init` runs an init as PID 1 that passes signals on: SIGTERM then reaches tfgpu even
# while TensorFlow starts (docs/containers.md).
#
# The CPU image: containers/build_cpu_image.sh builds it with podman from a Debian bookworm
# made by debootstrap (no registry needed), with --build-arg BASE=localhost/tfgpu-bookworm,
# --build-arg VARIANT=cpu and --format docker (podman's default OCI format drops SHELL and HEALTHCHECK).
# The GPU image (the default, VARIANT=gpu): containers/build_gpu_image.sh builds it the same way,
# tagged localhost/tfgpu:gpu, with TensorFlow's CUDA libraries from pip (tensorflow[and-cuda]):
# no NVIDIA base image is needed, the host gives only the driver (--gpus all).
# CI builds both and runs them (tests/containers/test_container.py: doctor in the GPU image finds every CUDA
# library; the CPU image trains, predicts, exports and handles SIGINT/SIGTERM); tests/containers/test_docker.py
# lints this file with hadolint and checks the commands above.
# README.md, "GPU containers (Docker)", and docs/containers.md have the rest.

# BASE: a Debian (or Ubuntu) image with python3 (3.10+), pip and useradd, and no TensorFlow.
# The default is the official Python image on Debian bookworm, pinned (never `latest`) and
# fully qualified (podman asks which registry, or fails without a terminal, for a short name).
# The build scripts use a Debian bookworm made by debootstrap instead (no registry needed:
# localhost/tfgpu-bookworm), the same Debian release and Python minor version.
# No NVIDIA CUDA base image: TensorFlow's install guide puts the CUDA libraries in pip wheels
# (tensorflow[and-cuda]); the old tensorflow/tensorflow:2.21.0-gpu base shipped cuDNN 8.9, too
# old for TensorFlow 2.21 (it needs cuDNN 9; tensorflow/build#221, tensorflow/tensorflow#62412).
ARG BASE=docker.io/library/python:3.11-slim-bookworm
FROM ${BASE}
ARG BASE

LABEL org.opencontainers.image.title="tfgpu" \
      org.opencontainers.image.description="TensorFlow/Keras on GPUs from one YAML file: tfgpu on TensorFlow with the CUDA 12 / cuDNN 9 wheels TensorFlow declares (tensorflow[and-cuda]); VARIANT=cpu leaves them out" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TFGPU_DATA_DIR=/data

# The layers go from what changes least to what changes most, so that editing tfgpu/ rebuilds
# only the last small layer and never downloads TensorFlow or the CUDA wheels again:
#   1. TensorFlow ${TENSORFLOW_VERSION} alone (about 600 MB of wheels): the same layer in the GPU
#      and the CPU image, so the two share it on disk (it depends only on BASE and the version);
#   2. VARIANT=gpu: the CUDA libraries, `pip install tensorflow[and-cuda]==${TENSORFLOW_VERSION}`
#      (the nvidia-*-cu12 wheels TensorFlow 2.21.0's metadata bounds: cuDNN >=9.3,<10, CUDA
#      libraries >=12.5,<13; about 2.7 GB of wheels); VARIANT=cpu: nothing;
#   3. tfgpu itself with its other dependencies, TensorFlow pinned by a constraint file so
#      pip can never replace it (it fails the build instead).
# --break-system-packages: Debian's python3 is PEP 668 "externally managed"; the image is the
# environment, and pip run as root installs into /usr/local, beside Debian's own packages.
# TENSORFLOW_VERSION: the release tfgpu is tested with (setup.cfg); CPU and GPU in one wheel:
# without the CUDA wheels it runs on the CPU.
ARG TENSORFLOW_VERSION=2.21.0
RUN python3 -m pip install --no-cache-dir --break-system-packages "tensorflow==${TENSORFLOW_VERSION}" \
 && python3 -c 'import tensorflow as tf; print("TensorFlow", tf.__version__)'

# VARIANT: gpu (the default) adds the CUDA wheels, cpu does not.
# GPU: each wheel's lib/ directory is registered with the dynamic linker (ldconfig), so every
# CUDA library resolves to one consistent set whoever loads it (TensorFlow also finds most of
# them beside itself through its RUNPATH; tfgpu doctor and other programs need not), and the
# linker's pick for cuDNN/cuBLAS/cuSOLVER/nvJitLink is checked to be a wheel's.
ARG VARIANT=gpu
RUN case "${VARIANT}" in \
      gpu) python3 -m pip install --no-cache-dir --break-system-packages "tensorflow[and-cuda]==${TENSORFLOW_VERSION}" \
        && python3 -c 'import nvidia, os; print("\n".join(sorted(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p) if os.path.isdir(os.path.join(p, d, "lib")))))' \
             > /etc/ld.so.conf.d/000-tfgpu-nvidia-wheels.conf \
        && ldconfig \
        && python3 -c 'import subprocess; out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout; first = {}; [first.setdefault(line.split()[0], line.split(" => ")[-1]) for line in out.splitlines() if " => " in line]; bad = {n: first.get(n) for n in ("libcudnn.so.9", "libcublas.so.12", "libcusolver.so.11", "libnvJitLink.so.12") if "/nvidia/" not in (first.get(n) or "")}; assert not bad, f"CUDA libraries not taken from the nvidia wheels: {bad}"' ;; \
      cpu) echo "VARIANT=cpu: no CUDA wheels" ;; \
      *) echo "VARIANT must be gpu or cpu, not '${VARIANT}'" >&2; exit 1 ;; \
    esac

WORKDIR /opt/tfgpu
COPY setup.cfg pyproject.toml README.md ./
COPY tfgpu/ ./tfgpu/
RUN echo "tensorflow==${TENSORFLOW_VERSION}" > /tmp/keep-tensorflow.txt \
 && python3 -m pip install --no-cache-dir --break-system-packages \
        --constraint /tmp/keep-tensorflow.txt /opt/tfgpu \
 && test "$(python3 -c 'import importlib.metadata as m; print(m.version("tensorflow"))')" = "${TENSORFLOW_VERSION}" \
 && tfgpu --version \
 && rm -rf /tmp/keep-tensorflow.txt /opt/tfgpu/build /opt/tfgpu/*.egg-info

# A non-root user owns the working directory, the two mount points and the recipes.
RUN useradd --create-home --no-log-init --uid 1000 --user-group --shell /bin/bash tfgpu \
 && mkdir -p /work/runs /data \
 && chown -R tfgpu:tfgpu /work /data

# The documented `tfgpu run recipes/mnist.yaml` is relative to WORKDIR /work.
COPY --chown=1000:1000 recipes/ /work/recipes/

# Numeric (= tfgpu:tfgpu) so that Kubernetes runAsNonRoot and hosts without this user
# can verify it is not root.
USER 1000:1000
WORKDIR /work

# /data: datasets ($TFGPU_DATA_DIR/mnist/mnist.npz or IDX files);
# /work/runs: run directories (tfgpu writes runs/ relative to the working directory).
VOLUME ["/data", "/work/runs"]

# Self-check: `tfgpu doctor --quiet` prints only the errors it finds and exits 0 when there
# are none, 9 when there are; Docker counts every non-zero exit status as a failed check.
# It starts TensorFlow in a subprocess (about 10 s, longer on a busy machine), hence the
# long timeout, and it runs rarely because it runs beside the training.
# `docker inspect --format '{{json .State.Health}}' CONTAINER` shows the last results;
# `docker run --no-healthcheck` turns it off.
HEALTHCHECK --interval=10m --timeout=2m --start-period=2m --retries=3 \
    CMD ["tfgpu", "doctor", "--quiet"]

ENTRYPOINT ["tfgpu"]
CMD ["--help"]
