# tfgpu on the official TensorFlow GPU image.
#
#   docker build -t tfgpu .
#   docker run --rm --gpus all \
#       -v "$PWD/data:/data" -v "$PWD/runs:/work/runs" \
#       tfgpu run /opt/tfgpu/recipes/mnist.yaml
#
# The host needs only the NVIDIA driver and the NVIDIA Container Toolkit.
# Files in the bind-mounted runs/ are written by the image's user `tfgpu` (uid 1000);
# add `--user "$(id -u):$(id -g)"` to write them as yourself instead.

# Base: TensorFlow 2.21.0, the release tfgpu is tested with (setup.cfg), from the official
# tensorflow/tensorflow repository on Docker Hub; pinned exactly, never `latest`.
# Its CUDA/cuDNN do NOT match TensorFlow 2.21 by themselves: the image is built from
# tensorflow/build's tensorflow_runtime_dockerfiles (nvidia/cuda:12.3.0-base-ubuntu22.04,
# system CUDA 12.3 and libcudnn8 8.9.6), while the TF 2.21 wheel needs cuDNN 9 (its
# `and-cuda` extra asks for nvidia-cudnn-cu12>=9.3,<10 and CUDA 12.5+ libraries); see
# tensorflow/build#221 and tensorflow/tensorflow#62412 (GPU invisible in the -gpu images
# since 2.18). The first RUN below fixes that with the CUDA/cuDNN wheels TF itself declares.
FROM tensorflow/tensorflow:2.21.0-gpu

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TFGPU_DATA_DIR=/data

WORKDIR /opt/tfgpu
COPY setup.cfg pyproject.toml README.md ./
COPY tfgpu/ ./tfgpu/
COPY recipes/ ./recipes/

# 1. Keep the base image's TensorFlow: a constraint file pins `tensorflow` to the version
#    already installed, so pip can satisfy setup.cfg's `tensorflow>=2.16` but never
#    replace it (it fails the build instead).
# 2. Install tfgpu with its [and-cuda] extra (setup.cfg: tensorflow[and-cuda]), i.e. the
#    nvidia-*-cu12 wheels (cuDNN 9, CUDA 12.5+) that this TensorFlow was built against.
# 3. Register every wheel's lib/ directory with the dynamic linker in a file that sorts
#    before the base image's CUDA 12.3 entries (000_cuda.conf, 988_cuda-12.conf), so all
#    CUDA libraries resolve to one consistent set: TF's RUNPATH covers only some of them.
# 4. Check: TensorFlow unchanged; the linker's first pick for cuDNN/cuBLAS/cuSOLVER/nvJitLink
#    is a wheel (ldconfig -p lists in lookup order); the `tfgpu` entry point runs.
# DL3013 (pin versions in pip): not pinned here on purpose. tfgpu's dependency ranges live
# in setup.cfg (the single source), TensorFlow's own metadata bounds the nvidia-*-cu12
# wheels, and the constraint file pins TensorFlow to the base image's version.
# hadolint ignore=DL3013
RUN tf_version="$(python3 -c 'import importlib.metadata as m; print(m.version("tensorflow"))')" \
 && echo "tensorflow==${tf_version}" > /tmp/keep-base-tensorflow.txt \
 && python3 -m pip install --no-cache-dir \
        --constraint /tmp/keep-base-tensorflow.txt "/opt/tfgpu[and-cuda]" \
 && python3 -c 'import nvidia, os; print("\n".join(sorted(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p) if os.path.isdir(os.path.join(p, d, "lib")))))' \
        > /etc/ld.so.conf.d/000-tfgpu-nvidia-wheels.conf \
 && ldconfig \
 && test "$(python3 -c 'import importlib.metadata as m; print(m.version("tensorflow"))')" = "${tf_version}" \
 && python3 -c 'import subprocess; out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout; first = {}; [first.setdefault(line.split()[0], line.split(" => ")[-1]) for line in out.splitlines() if " => " in line]; bad = {n: first.get(n) for n in ("libcudnn.so.9", "libcublas.so.12", "libcusolver.so.11", "libnvJitLink.so.12") if "/nvidia/" not in (first.get(n) or "")}; assert not bad, f"CUDA libraries not taken from the nvidia wheels: {bad}"' \
 && tfgpu --version \
 && rm -rf /tmp/keep-base-tensorflow.txt /opt/tfgpu/build /opt/tfgpu/*.egg-info

# A non-root user owns the working directory and the two mount points.
RUN useradd --create-home --no-log-init --uid 1000 --user-group --shell /bin/bash tfgpu \
 && mkdir -p /work/runs /data \
 && chown -R tfgpu:tfgpu /work /data

# Numeric (= tfgpu:tfgpu) so that Kubernetes runAsNonRoot and hosts without this user
# can verify it is not root.
USER 1000:1000
WORKDIR /work

# /data: datasets ($TFGPU_DATA_DIR/mnist/mnist.npz or IDX files);
# /work/runs: run directories (tfgpu writes runs/ relative to the working directory).
VOLUME ["/data", "/work/runs"]

ENTRYPOINT ["tfgpu"]
CMD ["--help"]
