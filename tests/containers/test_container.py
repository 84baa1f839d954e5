"""The images built and run for real: the CPU image and the GPU image, from the one Dockerfile.

podman (Debian's, with runc) builds and runs them as root; no registry is needed: the base is a
Debian bookworm made by debootstrap (``containers/build_cpu_image.sh`` and
``containers/build_gpu_image.sh``, each called once for the module; they reuse that base when
podman already has it, and build the image from the Dockerfile with ``--build-arg BASE=...
--build-arg VARIANT=cpu|gpu``; the two images share the base and the TensorFlow layer).

The GPU image, on this GPU-less host: ``doctor --json`` finds and loads every CUDA library
TensorFlow 2.21 loads (from the tensorflow[and-cuda] wheels), with their versions and the CUDA
and cuDNN versions TensorFlow was built against, and its only error is the missing driver.

The CPU image, as the image's user (uid 1000) unless said
otherwise, with the real MNIST from ``TFGPU_DATA_DIR`` mounted read-only at ``/data`` and a
fresh host folder at ``/work/runs``:

- the image holds what the Dockerfile promises (user, entry point, volumes, health check);
- ``doctor`` and ``doctor --quiet`` (the health check's command) exit 0 on a CPU host;
- ``plan recipes/mnist.yaml`` shows the plan;
- ``run recipes/mnist.yaml --set train.epochs=1`` leaves its run directory on the host, owned
  by the container's user and readable by every host user; with ``--user`` by that user;
- after such a run, ``predict`` on the mounted MNIST's test split writes one row per digit and a
  record whose accuracy is the run's val_accuracy, and ``export savedmodel`` writes a SavedModel
  verified in TensorFlow's loader;
- without the data mount, exit 5 and the message shows the ``-v ...:/data`` to add;
- SIGINT (``podman kill --signal INT``) during training: exit 130, the run kept (interrupted);
  SIGTERM (``podman stop``): a checkpoint, exit 75 (preempted), and ``run --resume`` in a
  new container finishes it; the health check passes while it trains;
- SIGTERM while TensorFlow starts, with or without ``--init``: exit 75 once TensorFlow has
  started (tfgpu, even as PID 1, has a handler from the moment its config is read; docs/containers.md).

Marked ``container`` (and ``slow``: builds of about 2 and 3 minutes). Where no engine can run
(podman or debootstrap missing, not root, ``podman --runtime runc info`` failing) the module
is skipped with the reason; ``TFGPU_CONTAINER_TESTS=required`` (set by .ci/run) makes that a
failure instead. ``CONTAINERS_CONF`` defaults to containers/containers.conf (docs/containers.md).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Optional

import pytest

from ..conftest import ROOT, data_dir, one_paragraph, only_run_dir

pytestmark = [pytest.mark.container, pytest.mark.slow]

SCRIPT = ROOT / "containers" / "build_cpu_image.sh"
GPU_SCRIPT = ROOT / "containers" / "build_gpu_image.sh"
CONF = ROOT / "containers" / "containers.conf"
TAG = "localhost/tfgpu-cpu"
GPU_TAG = "localhost/tfgpu:gpu"
BASE = "localhost/tfgpu-bookworm"
RUNTIME = os.environ.get("TFGPU_PODMAN_RUNTIME", "runc")
IMAGE_USER = (1000, 1000)          # the Dockerfile's USER
EPOCH_ROW = "epoch,"               # metrics.csv's header starts with it


def engine_env() -> dict[str, str]:
    """This process's environment with CONTAINERS_CONF (the repository's unless set)."""
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF") or str(CONF)}


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``podman --runtime RUNTIME ARGS``, output captured."""
    return subprocess.run(["podman", "--runtime", RUNTIME, *args], capture_output=True, text=True,
                          timeout=timeout, env=engine_env())


def engine_problem() -> Optional[str]:
    """Why no container can be built or run here, or None."""
    if os.geteuid() != 0:
        return "not root: podman's root storage and debootstrap need it"
    missing = [tool for tool in ("podman", "debootstrap") if not shutil.which(tool)]
    if missing:
        return (f"{' and '.join(missing)} not installed "
                "(apt-get install -y podman runc debootstrap catatonit)")
    info = podman("info", timeout=60)
    if info.returncode != 0:
        return f"`podman --runtime {RUNTIME} info` fails (exit {info.returncode}): {info.stderr.strip()[-500:]}"
    return None


def build(script: Path, tag: str) -> list[str]:
    """Build an image with one of the containers/ scripts; the lines it printed about times and sizes."""
    problem = engine_problem()
    if problem:
        if os.environ.get("TFGPU_CONTAINER_TESTS") == "required":
            pytest.fail(f"TFGPU_CONTAINER_TESTS=required, but no container engine can run here: {problem}")
        pytest.skip(f"no container engine can run here: {problem}")
    result = subprocess.run([str(script), "--tag", tag, "--base", BASE], capture_output=True, text=True,
                            timeout=1800, env=engine_env(), cwd=ROOT)
    assert result.returncode == 0, f"{script.name} failed (exit {result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    figures = [line for line in result.stdout.splitlines() if line.startswith(("base:", "image:"))]
    print("\n".join(figures))
    return figures


@pytest.fixture(scope="module")
def image() -> list[str]:
    """Build the CPU image with containers/build_cpu_image.sh; the lines it printed about times and sizes."""
    return build(SCRIPT, TAG)


@pytest.fixture(scope="module")
def gpu_image() -> list[str]:
    """Build the GPU image with containers/build_gpu_image.sh (after the CPU image when both are used: they share
    the base and the TensorFlow layer)."""
    return build(GPU_SCRIPT, GPU_TAG)


@pytest.fixture
def runs_dir(tmp_path) -> Path:
    """A fresh host folder for /work/runs, writable by the image's user (as the docs tell users)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chown(runs, *IMAGE_USER)
    return runs


def mnist_root() -> Path:
    root = data_dir()
    if not (root / "mnist").is_dir():
        pytest.fail(f"MNIST is not at {root / 'mnist'}; set TFGPU_DATA_DIR (CI sets it to ../shared/data)")
    return root


def mounts(runs: Optional[Path] = None, data: bool = True) -> list[str]:
    out = ["-v", f"{mnist_root()}:/data:ro"] if data else []
    return out + (["-v", f"{runs}:/work/runs"] if runs else [])


def run_image(*args: str, options: tuple[str, ...] = (), timeout: float = 300) -> subprocess.CompletedProcess:
    """``podman run --rm --init [OPTIONS] TAG ARGS``: a tfgpu command in a new container."""
    return podman("run", "--rm", "--init", *options, TAG, *args, timeout=timeout)


class Detached:
    """A container started with ``podman run -d``, removed on exit."""

    def __init__(self, *args: str, options: tuple[str, ...] = ()) -> None:
        self.name = f"tfgpu-test-{uuid.uuid4().hex[:8]}"
        started = podman("run", "-d", "--name", self.name, *options, TAG, *args)
        assert started.returncode == 0, started.stderr

    def wait(self, timeout: float = 180) -> int:
        """The container's exit code (``podman wait``)."""
        waited = podman("wait", self.name, timeout=timeout)
        assert waited.returncode == 0, waited.stderr
        return int(waited.stdout.split()[-1])

    def logs(self) -> str:
        result = podman("logs", self.name)
        return result.stdout + result.stderr

    def __enter__(self) -> "Detached":
        return self

    def __exit__(self, *exc: object) -> None:
        podman("rm", "--force", "--volumes", self.name)


def wait_for_training(runs: Path, container: Detached, epochs_done: int = 0, timeout: float = 120) -> Path:
    """The run directory once its metrics.csv exists (Keras opened it: training started) and holds
    ``epochs_done`` epoch rows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for metrics in runs.glob("*/metrics.csv"):
            rows = [line for line in metrics.read_text().splitlines() if line and not line.startswith(EPOCH_ROW)]
            if len(rows) >= epochs_done:
                return metrics.parent
        time.sleep(0.2)
    pytest.fail(f"training did not start within {timeout} s:\n{container.logs()[-3000:]}")


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# --------------------------------------------------------------------------- the image


def test_the_image_holds_what_the_dockerfile_promises(image):
    result = podman("image", "inspect", TAG)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)[0]
    config = info["Config"]
    assert config["User"] == f"{IMAGE_USER[0]}:{IMAGE_USER[1]}"
    assert config["Entrypoint"] == ["tfgpu"] and config["WorkingDir"] == "/work"
    assert {"/data", "/work/runs"} <= set(config["Volumes"])
    assert "TFGPU_DATA_DIR=/data" in config["Env"]
    # The OCI format has no HEALTHCHECK: the script builds with --format docker to keep it.
    assert (info.get("Healthcheck") or {}).get("Test") == ["CMD", "tfgpu", "doctor", "--quiet"], info.get("Healthcheck")
    assert config["Labels"]["org.opencontainers.image.base.name"] == BASE
    versions = podman("run", "--rm", "--entrypoint", "python3", TAG, "-c",
                      "import importlib.metadata as m; print(m.version('tensorflow'), m.version('tfgpu'))")
    assert versions.returncode == 0, versions.stderr
    print(f"image {TAG}: {info['Size'] / 1e9:.2f} GB; tensorflow, tfgpu: {versions.stdout.strip()}")


# --------------------------------------------------------------------------- the GPU image

#: What TensorFlow 2.21's CUDA build loads, by soname, and the wheel of tensorflow[and-cuda] that has it.
CUDA_WHEEL_LIBRARIES = {
    "libcudart.so.12": "nvidia-cuda-runtime-cu12", "libcublas.so.12": "nvidia-cublas-cu12",
    "libcublasLt.so.12": "nvidia-cublas-cu12", "libcudnn.so.9": "nvidia-cudnn-cu12",
    "libcufft.so.11": "nvidia-cufft-cu12", "libcusparse.so.12": "nvidia-cusparse-cu12",
    "libcusolver.so.11": "nvidia-cusolver-cu12", "libcurand.so.10": "nvidia-curand-cu12",
    "libnccl.so.2": "nvidia-nccl-cu12", "libnvJitLink.so.12": "nvidia-nvjitlink-cu12",
    "libcupti.so.12": "nvidia-cuda-cupti-cu12",
}


def test_gpu_image_doctor_finds_every_cuda_library_and_only_misses_the_driver(image, gpu_image):
    """``doctor --json`` in the GPU image without a GPU: every CUDA library loads from its wheel, with the wheel's
    version; TensorFlow is a CUDA build and says which CUDA/cuDNN; the one error is libcuda.so.1 (the driver)."""
    result = podman("run", "--rm", GPU_TAG, "doctor", "--json", timeout=300)
    assert result.returncode == 9, f"exit {result.returncode} (9: errors found)\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout)
    facts = report["facts"]
    build = facts["tensorflow"]["build_info"]
    assert facts["tensorflow"]["version"] == "2.21.0" and build["is_cuda_build"], build
    assert build["cuda_version"] and build["cudnn_version"], build
    libraries = {lib["name"]: lib for lib in facts["libraries"]}
    assert set(CUDA_WHEEL_LIBRARIES) <= set(libraries), sorted(libraries)
    for name, package in CUDA_WHEEL_LIBRARIES.items():
        lib = libraries[name]
        assert lib["path"] and "/nvidia/" in lib["path"] and lib["error"] is None, lib
        assert lib["package"] == package and lib["version"], lib
    assert libraries["libcuda.so.1"]["path"] is None, libraries["libcuda.so.1"]
    findings = {f["check"]: f for f in report["findings"]}
    seen = findings["cuda-libraries"]["seen"]
    assert findings["cuda-libraries"]["level"] == "ok", findings["cuda-libraries"]
    assert f"built against CUDA {build['cuda_version']} and cuDNN {build['cudnn_version']}" in seen, seen
    errors = [f for f in report["findings"] if f["level"] == "error"]
    assert [f["check"] for f in errors] == ["cuda-driver-library"], errors
    assert "libcuda.so.1" in errors[0]["seen"]
    info = json.loads(podman("image", "inspect", GPU_TAG).stdout)[0]
    print(f"image {GPU_TAG}: {info['Size'] / 1e9:.2f} GB; {seen}")


# --------------------------------------------------------------------------- commands


def test_doctor_exits_0_on_a_cpu_host(image):
    result = run_image("doctor")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-3000:]}"
    assert "Platform: Linux in a container" in result.stdout
    assert "tfgpu doctor: 0 error(s)" in result.stdout
    quiet = run_image("doctor", "--quiet")          # the HEALTHCHECK's command
    assert quiet.returncode == 0 and quiet.stdout.strip() == "", f"{quiet.stdout}\n{quiet.stderr[-3000:]}"


def test_plan_shows_the_plan(image):
    result = run_image("plan", "recipes/mnist.yaml", "--set", "train.epochs=3", options=tuple(mounts()))
    assert result.returncode == 0, result.stderr[-3000:]
    for line in ("Physical GPUs: none (CPU only)", "Strategy: ", "Replicas: 1; batch: ", "epochs: 3; loop: fit"):
        assert line in result.stdout, result.stdout
    # plan checks the data files as run does: without the data mount it names the mount (exit 5), as run does
    unmounted = run_image("plan", "recipes/mnist.yaml")
    assert unmounted.returncode == 5, f"exit {unmounted.returncode}\n{unmounted.stdout}\n{unmounted.stderr[-3000:]}"
    assert "/data is empty" in unmounted.stderr and "-v /path/to/data:/data" in unmounted.stderr, unmounted.stderr


@pytest.mark.parametrize("user", [None, "4321:4321"], ids=["image-user", "--user"])
def test_run_leaves_its_run_directory_on_the_host(image, runs_dir, user):
    """``run`` in the container leaves a completed run directory on the host, owned by the image's user (or
    --user's) and readable by every host user. Trains its own run: the files of a run trained inside the container
    are the subject, and the shared runs are trained on the host."""
    options = mounts(runs_dir)
    owner = IMAGE_USER
    if user:
        owner = tuple(int(n) for n in user.split(":"))
        os.chown(runs_dir, *owner)
        options += ["--user", user]
    result = run_image("run", "recipes/mnist.yaml", "--set", "train.epochs=1", options=tuple(options))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-3000:]}"
    assert "tfgpu: done in" in result.stdout + result.stderr
    run_dir = only_run_dir(runs_dir)
    assert run_dir.name.startswith("mnist-")
    for name in ("summary.json", "metrics.csv", "config.yaml", "model.keras"):
        assert (run_dir / name).is_file(), f"{name} missing from {sorted(p.name for p in run_dir.iterdir())}"
    done = summary(run_dir)
    assert done["status"] == "completed", done
    for path in [run_dir, *run_dir.rglob("*")]:
        info = path.stat()
        assert (info.st_uid, info.st_gid) == owner, f"{path} is owned by {info.st_uid}:{info.st_gid}, not {owner}"
        readable = stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)
        assert info.st_mode & readable == readable, f"{path} is {stat.filemode(info.st_mode)}: other host users cannot read it"


def test_predict_and_export_a_run_in_the_container(image, runs_dir):
    """A run trained in the container, then ``predict`` on the mounted MNIST's test split (its validation data: the
    accuracy must be the run's val_accuracy, to one sample of 10,000) and ``export savedmodel`` (TF Serving's layout,
    verified in TensorFlow's loader), each in a new container. Trains its own run: the shared runs are trained on the
    host, and this checks training, predict and export inside the image."""
    options = tuple(mounts(runs_dir))
    trained = run_image("run", "recipes/mnist.yaml", "--set", "train.epochs=1", options=options)
    assert trained.returncode == 0, f"{trained.stdout}\n{trained.stderr[-3000:]}"
    run_dir = only_run_dir(runs_dir)
    metrics = (run_dir / "metrics.csv").read_text().splitlines()
    val_accuracy = float(dict(zip(metrics[0].split(","), metrics[-1].split(",")))["val_accuracy"])
    predicted = run_image("predict", f"runs/{run_dir.name}", "/data/mnist/mnist.npz", "--output", "runs/preds.csv",
                          options=options)
    assert predicted.returncode == 0, f"{predicted.stdout}\n{predicted.stderr[-3000:]}"
    rows = (runs_dir / "preds.csv").read_text().splitlines()
    assert len(rows) == 1 + 10_000, rows[:3]
    record = json.loads((runs_dir / "preds.csv.json").read_text())
    assert record["count"] == 10_000 and record["labelled"] == 10_000, record
    assert abs(record["accuracy"] - val_accuracy) <= 1.5e-4, (record["accuracy"], val_accuracy)
    exported = run_image("export", "savedmodel", f"runs/{run_dir.name}", "-o", "runs/served/mnist", options=options)
    assert exported.returncode == 0, f"{exported.stdout}\n{exported.stderr[-3000:]}"
    version = runs_dir / "served" / "mnist" / "1"
    assert (version / "saved_model.pb").is_file(), sorted(p.name for p in (runs_dir / "served").rglob("*"))
    described = json.loads((version / "export.json").read_text())
    assert described["verification"]["passed"] and described["verification"]["max_abs_diff"] <= 1e-4, described
    print(f"predict in the container: accuracy {record['accuracy']:.4f} (the run's val_accuracy {val_accuracy:.4f}); "
          f"export savedmodel: max abs difference {described['verification']['max_abs_diff']:.2g}")


def test_run_without_the_data_mount_names_the_mount(image, runs_dir):
    result = run_image("run", "recipes/mnist.yaml", "--set", "train.epochs=1", options=tuple(mounts(runs_dir, data=False)))
    assert result.returncode == 5, f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    assert "tfgpu: data error:" in result.stderr, result.stderr[-3000:]
    message = "\n".join(line for line in result.stderr[result.stderr.index("tfgpu: data error:"):].splitlines()
                        if not line.startswith("time="))           # podman's own log lines
    one_paragraph(message)
    assert "/data is empty" in message and "-v /path/to/data:/data" in message, message
    assert list(runs_dir.iterdir()) == [], "nothing should be written before the data is found"


# --------------------------------------------------------------------------- signals


def test_sigint_stops_the_run_with_130_and_keeps_it(image, runs_dir):
    """SIGINT during training in the container: exit 130 and the run kept (interrupted); the health check passes
    beside the training. Trains its own run: it interrupts the training, which a shared run must not suffer."""
    with Detached("run", "recipes/mnist.yaml", "--set", "train.epochs=50",
                  options=("--init", *mounts(runs_dir))) as container:
        run_dir = wait_for_training(runs_dir, container)
        health = podman("healthcheck", "run", container.name, timeout=150)   # doctor --quiet beside the training
        assert health.returncode == 0 and "unhealthy" not in health.stdout, f"{health.stdout}\n{health.stderr}"
        assert podman("kill", "--signal", "INT", container.name).returncode == 0
        code = container.wait()
        logs = container.logs()
    assert code == 130, f"exit {code}\n{logs[-3000:]}"
    assert "tfgpu: interrupted" in logs
    assert summary(run_dir)["status"] == "interrupted"


def test_sigterm_saves_a_checkpoint_exits_75_and_the_run_resumes(image, runs_dir):
    """``podman stop`` (SIGTERM) after an epoch: a checkpoint, exit 75 (preempted), and ``run --resume`` in a new
    container completes the run. Trains its own run: it stops the training with SIGTERM and resumes it, which a
    shared run must not suffer."""
    with Detached("run", "recipes/mnist.yaml", "--set", "train.epochs=4",
                  options=("--init", *mounts(runs_dir))) as container:
        run_dir = wait_for_training(runs_dir, container, epochs_done=1)
        started = time.monotonic()
        stopped = podman("stop", "--time", "60", container.name, timeout=90)   # SIGTERM, SIGKILL after 60 s
        seconds = time.monotonic() - started
        assert stopped.returncode == 0, stopped.stderr
        code = container.wait()
        logs = container.logs()
    print(f"podman stop: exit {code} after {seconds:.1f} s")
    assert code == 75, f"exit {code} after {seconds:.1f} s\n{logs[-3000:]}"
    assert "tfgpu: preempted: SIGTERM arrived" in logs
    assert summary(run_dir)["status"] == "preempted"
    assert summary(run_dir)["checkpoint"]["committed"]["global_step"] >= 1
    resumed = run_image("run", "--resume", f"runs/{run_dir.name}", options=tuple(mounts(runs_dir)))
    assert resumed.returncode == 0, f"{resumed.stdout}\n{resumed.stderr[-3000:]}"
    assert summary(run_dir)["status"] == "completed"


@pytest.mark.parametrize("init", [True, False], ids=["--init", "no-init"])
def test_sigterm_while_tensorflow_starts(image, runs_dir, init):
    """SIGTERM before training, with or without --init (PID 1 or not): tfgpu handles it from the moment its config
    is read (the kernel would drop a signal without a handler to PID 1, and kill another process at once), holds
    it while TensorFlow starts, then stops with 75 naming the phase. docs/containers.md."""
    grace = 30
    with Detached("run", "recipes/mnist.yaml", "--set", "train.epochs=50",
                  options=(*(["--init"] if init else []), *mounts(runs_dir))) as container:
        time.sleep(1)  # TensorFlow is starting (it took 2-3 s here; the handlers are set at 0.15 s)
        started = time.monotonic()
        assert podman("stop", "--time", str(grace), container.name, timeout=90).returncode == 0
        seconds = time.monotonic() - started
        code = container.wait()
        logs = container.logs()
    print(f"SIGTERM while TensorFlow starts, {'with' if init else 'without'} --init: exit {code} after {seconds:.1f} s")
    assert code == 75 and seconds < grace, f"exit {code} after {seconds:.1f} s\n{logs[-2000:]}"
    assert "tfgpu: preempted: SIGTERM arrived" in logs and "Traceback" not in logs
    print("   ", [line for line in logs.splitlines() if line.startswith("tfgpu: preempted:")][0])
