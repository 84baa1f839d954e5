# tfgpu's image, one file for two bases: the GPU image users run (the default BASE) and a CPU
# image (a BASE with Python 3.10+ and pip but no TensorFlow).
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
# made by debootstrap (no registry needed), with --build-arg BASE=localhost/tfgpu-bookworm
# and --format docker (podman's default OCI format drops SHELL and HEALTHCHECK).
# CI builds it and runs it (tests/test_container.py: doctor, plan, a training run, a missing
# data mount, SIGINT and SIGTERM). The GPU image is not built in CI (no registry, no GPU);
# tests/test_docker.py lints this file with hadolint and checks the commands above.
# README.md, "GPU containers (Docker)", and docs/containers.md have the rest.

# BASE, the GPU image (default): TensorFlow 2.21.0, the release tfgpu is tested with
# (setup.cfg), from the official tensorflow/tensorflow repository on Docker Hub; pinned
# exactly, never `latest`, and fully qualified (podman asks which registry, or fails without a
# terminal, for a short name).
# Its CUDA/cuDNN do NOT match TensorFlow 2.21 by themselves: the image is built from
# tensorflow/build's tensorflow_runtime_dockerfiles (nvidia/cuda:12.3.0-base-ubuntu22.04,
# system CUDA 12.3 and libcudnn8 8.9.6), while the TF 2.21 wheel needs cuDNN 9 (its
# `and-cuda` extra asks for nvidia-cudnn-cu12>=9.3,<10 and CUDA 12.5+ libraries); see
# tensorflow/build#221 and tensorflow/tensorflow#62412 (GPU invisible in the -gpu images
# since 2.18). The first RUN below fixes that with the CUDA/cuDNN wheels TF itself declares.
# BASE for a CPU image: any Debian or Ubuntu image with python3 (3.10+), pip and useradd,
# and no TensorFlow, e.g. the debootstrapped bookworm of containers/build_cpu_image.sh.
ARG BASE=docker.io/tensorflow/tensorflow:2.21.0-gpu
FROM ${BASE}
ARG BASE
# The TensorFlow a CPU base gets (a GPU base keeps its own): the release tfgpu is tested with.
ARG TENSORFLOW_VERSION=2.21.0

LABEL org.opencontainers.image.title="tfgpu" \
      org.opencontainers.image.description="TensorFlow/Keras on GPUs from one YAML file: tfgpu on TensorFlow (on the GPU base with the CUDA 12 / cuDNN 9 wheels TensorFlow declares)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TFGPU_DATA_DIR=/data

WORKDIR /opt/tfgpu
COPY setup.cfg pyproject.toml README.md ./
COPY tfgpu/ ./tfgpu/

# Which base this is, is read from the base itself: does it have TensorFlow?
# GPU base (TensorFlow installed: the default BASE):
#   1. Keep the base image's TensorFlow: a constraint file pins `tensorflow` to the version
#      already installed, so pip can satisfy setup.cfg's `tensorflow>=2.16` but never
#      replace it (it fails the build instead).
#   2. Install tfgpu with its [and-cuda] extra (setup.cfg: tensorflow[and-cuda]), i.e. the
#      nvidia-*-cu12 wheels (cuDNN 9, CUDA 12.5+) that this TensorFlow was built against,
#      into the same site-packages as TensorFlow (which looks for them beside itself).
#   3. Register every wheel's lib/ directory with the dynamic linker in a file that sorts
#      before the base image's CUDA 12.3 entries (000_cuda.conf, 988_cuda-12.conf), so all
#      CUDA libraries resolve to one consistent set: TF's RUNPATH covers only some of them.
#   4. Check: TensorFlow unchanged; the linker's first pick for cuDNN/cuBLAS/cuSOLVER/nvJitLink
#      is a wheel (ldconfig -p lists in lookup order).
# CPU base (no TensorFlow, e.g. Debian bookworm's python3):
#   Install tfgpu with TensorFlow ${TENSORFLOW_VERSION} (a constraint file, as above; CPU and
#   GPU in one wheel: without the CUDA wheels it runs on the CPU). --break-system-packages: Debian's
#   python3 is PEP 668 "externally managed"; the image is the environment, and pip run as
#   root installs into /usr/local, beside Debian's own packages in /usr/lib/python3.
# Both: TensorFlow imports and the `tfgpu` entry point runs.
# Other versions are not pinned here on purpose: tfgpu's dependency ranges live in setup.cfg
# (the single source), TensorFlow 2.21.0's own metadata bounds the nvidia-*-cu12 wheels
# (cuDNN >=9.3,<10, CUDA libraries >=12.5,<13), and the constraint file pins TensorFlow
# to the GPU base image's version or to TENSORFLOW_VERSION.
RUN base_tf="$(python3 -c 'import importlib.metadata as m; print(m.version("tensorflow"))' 2>/dev/null || true)" \
 && if [ -n "${base_tf}" ]; then \
        echo "GPU base: keeping its TensorFlow ${base_tf}, adding the CUDA wheels" \
     && echo "tensorflow==${base_tf}" > /tmp/keep-base-tensorflow.txt \
     && python3 -m pip install --no-cache-dir \
            --constraint /tmp/keep-base-tensorflow.txt "/opt/tfgpu[and-cuda]" \
     && python3 -c 'import nvidia, os; print("\n".join(sorted(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p) if os.path.isdir(os.path.join(p, d, "lib")))))' \
            > /etc/ld.so.conf.d/000-tfgpu-nvidia-wheels.conf \
     && ldconfig \
     && test "$(python3 -c 'import importlib.metadata as m; print(m.version("tensorflow"))')" = "${base_tf}" \
     && python3 -c 'import subprocess; out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout; first = {}; [first.setdefault(line.split()[0], line.split(" => ")[-1]) for line in out.splitlines() if " => " in line]; bad = {n: first.get(n) for n in ("libcudnn.so.9", "libcublas.so.12", "libcusolver.so.11", "libnvJitLink.so.12") if "/nvidia/" not in (first.get(n) or "")}; assert not bad, f"CUDA libraries not taken from the nvidia wheels: {bad}"'; \
    else \
        echo "CPU base: no TensorFlow in it, installing tfgpu with TensorFlow ${TENSORFLOW_VERSION}" \
     && echo "tensorflow==${TENSORFLOW_VERSION}" > /tmp/keep-base-tensorflow.txt \
     && python3 -m pip install --no-cache-dir --break-system-packages \
            --constraint /tmp/keep-base-tensorflow.txt /opt/tfgpu; \
    fi \
 && python3 -c 'import tensorflow as tf; print("TensorFlow", tf.__version__)' \
 && tfgpu --version \
 && rm -rf /tmp/keep-base-tensorflow.txt /opt/tfgpu/build /opt/tfgpu/*.egg-info

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
