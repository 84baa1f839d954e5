"""``tfgpu export``: a recipe as a Slurm batch script or a Kubeflow TFJob manifest (pure text, nothing started).

Both run ``tfgpu run`` once per worker under MultiWorkerMirroredStrategy and
let tfgpu find the cluster where the scheduler puts it: Slurm's environment
(:func:`tfgpu.cluster.spec.resolve_cluster`), or the ``TF_CONFIG`` that the TFJob
operator injects into each worker's pod. Both give every worker
``--resume RUN_DIR`` with a run directory named by the job, so a requeued job
or a restarted pod continues its run from the last checkpoint.

The option values a user types (``--time``, ``--partition``, ``--name``) are
checked here (:func:`slurm_time`, :func:`slurm_partition`, :func:`job_name`),
so a script or manifest never holds a value Slurm or Kubernetes rejects.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

#: Port of each TFJob worker (the operator's default ``tfjob-port``).
TFJOB_PORT = 2222

#: ``sizeLimit`` of the memory-backed ``emptyDir`` each TFJob pod mounts at ``/dev/shm``: a pod's own is
#: 64 MiB, and NCCL (the reduction across GPUs) fails at start-up without room for its segments there;
#: 1Gi is the ``--shm-size=1g`` NCCL's troubleshooting guide gives (``tfgpu doctor``'s shm check).
SHM_SIZE_LIMIT = "1Gi"

#: Where a TFJob pod mounts the data (``--data-pvc``, read-only): the tfgpu image's ``TFGPU_DATA_DIR``.
DATA_MOUNT = "/data"

#: Where a TFJob pod mounts the runs volume (``--runs-pvc``, else an ``emptyDir``): the tfgpu image's
#: ``output.dir`` (``runs`` in its working directory ``/work``, a declared volume).
RUNS_MOUNT = "/work/runs"

#: The tfgpu image's user and group (``Dockerfile``: uid/gid 1000): the pod's ``fsGroup``, so that it can
#: write a PersistentVolume that is owned by root.
IMAGE_GID = 1000

#: Seconds before the time limit at which Slurm sends ``train.checkpoint.requeue_signal`` (``--signal``),
#: and a TFJob pod's ``terminationGracePeriodSeconds`` (from SIGTERM to SIGKILL): the time a worker gets to
#: finish its call, save a checkpoint and exit 75.
SIGNAL_SECONDS = 120

#: Longest job name: a Kubernetes name is a DNS-1123 label of at most 63 characters, and the TFJob
#: operator appends ``-worker-<i>`` (the ConfigMap ``-recipe``).
MAX_NAME = 52

_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_K8S_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")

#: The forms ``sbatch --time`` reads (Slurm's ``time_str2secs``), each a whole number per field.
SLURM_TIME_FORMS = ("minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes",
                    "days-hours:minutes:seconds", "UNLIMITED", "INFINITE")
_SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}")
_FRIENDLY_TIME = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def slurm_time(value: str) -> str:
    """A time limit as ``#SBATCH --time`` takes it.

    Args:
        value: one of Slurm's forms (:data:`SLURM_TIME_FORMS`, written as
            given; ``unlimited``/``infinite`` in any case), or a duration such
            as ``4h``, ``90m``, ``1d12h``, ``2h30m``, ``45s`` (units d, h, m,
            s in that order), converted to ``HH:MM:SS`` or ``D-HH:MM:SS``.

    Returns:
        The value in one of Slurm's forms.

    Raises:
        ValueError: neither; the message names the value, the forms and an example.
    """
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return text.upper()
    if _SLURM_TIME.fullmatch(text):
        return text
    friendly = _FRIENDLY_TIME.fullmatch(text.lower())
    if text and friendly and any(friendly.groups()):
        d, h, m, s = (int(g or 0) for g in friendly.groups())
        total = ((d * 24 + h) * 60 + m) * 60 + s
        days, rest = divmod(total, 86400)
        clock = f"{rest // 3600:02d}:{rest // 60 % 60:02d}:{rest % 60:02d}"
        return f"{days}-{clock}" if days else clock
    raise ValueError(
        f"{value!r} is not a Slurm time limit. Slurm (#SBATCH --time) reads {', '.join(SLURM_TIME_FORMS[:-2])}, "
        f"or UNLIMITED/INFINITE, each field a whole number; tfgpu also converts durations such as 4h, 90m, "
        f"1d12h or 2h30m (units d, h, m, s in that order). Example: --time 04:00:00 (or --time 4h).")


def slurm_partition(value: str) -> str:
    """A ``#SBATCH --partition`` value: one partition name, or several separated by commas.

    Raises:
        ValueError: a character other than letters, digits, ``_``, ``.``, ``-`` (and the commas between names).
    """
    if _PARTITION.fullmatch(value):
        return value
    raise ValueError(f"{value!r} is not a Slurm partition name: use letters, digits, '_', '.' and '-', several "
                     f"partitions separated by commas without spaces, e.g. --partition gpu or --partition gpu,gpu-long.")


def job_name(value: str, kind: str) -> str:
    """A ``--name`` given by the user, checked for ``kind`` (``"slurm"`` or ``"tfjob"``).

    A Slurm job name (it also names the run directory and the log file) may
    hold letters, digits, ``_``, ``.`` and ``-``; a TFJob's is a Kubernetes
    name: lower-case letters, digits and ``-``, starting and ending with a
    letter or digit. Either at most :data:`MAX_NAME` characters.

    Raises:
        ValueError: the name breaks the rule; the message gives the rule and an example.
    """
    if kind == "tfjob":
        ok, rule = _K8S_NAME.fullmatch(value), ("lower-case letters, digits and '-', starting and ending with a "
                                                "letter or digit (a Kubernetes name)")
    else:
        ok, rule = _SLURM_NAME.fullmatch(value), "letters, digits, '_', '.' and '-', starting with a letter or digit"
    if ok and len(value) <= MAX_NAME:
        return value
    raise ValueError(f"{value!r} is not a job name for 'tfgpu export {kind}': use {rule}, at most {MAX_NAME} "
                     f"characters, e.g. --name mnist-4x8.")


def k8s_volume_claim(value: str, option: str) -> str:
    """A PersistentVolumeClaim's name (a Kubernetes DNS-1123 subdomain) given as ``option``.

    Raises:
        ValueError: not such a name; the message gives the rule and an example.
    """
    if _K8S_SUBDOMAIN.fullmatch(value) and len(value) <= 253:
        return value
    raise ValueError(f"{value!r} is not a PersistentVolumeClaim name: use lower-case letters, digits, '-' and '.', "
                     f"starting and ending with a letter or digit (kubectl get pvc lists them), e.g. {option} "
                     f"{'tfgpu-data' if 'data' in option else 'tfgpu-runs'}.")


def _job_name(recipe: str, name: Optional[str]) -> str:
    """``name`` (checked by :func:`job_name`), else the recipe's file name made a Kubernetes name."""
    if name:
        return name
    return re.sub(r"[^a-z0-9-]+", "-", Path(recipe).stem.lower()).strip("-")[:MAX_NAME].strip("-") or "tfgpu"


def _run_args(recipe: str, overrides: Sequence[str]) -> list[str]:
    args = ["tfgpu", "run", recipe]
    for o in [*overrides, "distribute.strategy=multi_worker_mirrored"]:
        args += ["--set", o]
    return args


def _command(words: Sequence[Any]) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


def _options(overrides: Sequence[str], **options: Any) -> list[str]:
    """``--key value`` for each option given (``None`` left out), then ``--set`` each override."""
    words: list[str] = []
    for key, value in options.items():
        if value is not None:
            words += [f"--{key.replace('_', '-')}", str(value)]
    for o in overrides:
        words += ["--set", o]
    return words


def slurm_script(recipe: str, overrides: Sequence[str], workers: int, gpus_per_worker: int, port: int,
                 time_limit: Optional[str] = None, partition: Optional[str] = None,
                 name: Optional[str] = None, output_dir: str = "runs", requeue_signal: Optional[str] = None) -> str:
    """An ``sbatch`` script: ``workers`` nodes, one task (one worker) per node, ``srun tfgpu run RECIPE``.

    Each task's tfgpu resolves the cluster from ``SLURM_PROCID``,
    ``SLURM_STEP_NODELIST`` and ``SLURM_STEP_TASKS_PER_NODE`` (workers on
    ``port``); each uses its node's GPUs (``gpus_per_worker``: ``#SBATCH
    --gpus-per-node``), which tfgpu does not reassign. The run directory is
    ``output_dir/<job>-<job id>`` (``--resume``), so a requeued job continues
    its run from the checkpoint; with ``requeue_signal``
    (``train.checkpoint.requeue_signal``), Slurm sends it
    :data:`SIGNAL_SECONDS` before the time limit, and tfgpu saves, requeues
    the job and exits 75.

    Args:
        time_limit: ``#SBATCH --time``, already in Slurm's form (:func:`slurm_time`).
        partition: ``#SBATCH --partition`` (:func:`slurm_partition`).
        name: the job name (:func:`job_name`); default: the recipe's file name.
    """
    job = _job_name(recipe, name)
    forwarded = ["TERM"] + ([requeue_signal[3:]] if requeue_signal else [])
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job}",
             f"#SBATCH --nodes={workers}",
             "#SBATCH --ntasks-per-node=1"]
    if gpus_per_worker:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_worker}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines.append(f"#SBATCH --output={job}-%j.out")
    lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    if requeue_signal:
        lines.append(f"#SBATCH --signal=B:{requeue_signal[3:]}@{SIGNAL_SECONDS}")  # to the batch shell, which passes it on
    written_by = _command(["tfgpu", "export", "slurm", recipe, *_options(
        overrides, workers=workers, gpus_per_worker=gpus_per_worker, time=time_limit, partition=partition,
        name=name)])
    lines += ["",
              f"# Written by: {written_by}",
              "# One task per node; each is a worker of MultiWorkerMirroredStrategy. tfgpu reads the cluster",
              f"# from Slurm's environment (workers listen on port {port}: distribute.port); task 0 is the chief",
              "# and writes the run directory (output.dir should be on a shared file system). A requeued job",
              "# keeps its job id, so --resume continues the same run from its last checkpoint.",
              "set -euo pipefail",
              "",
              f"RUN_DIR={shlex.quote(output_dir)}/{job}-\"$SLURM_JOB_ID\"",
              "srun --kill-on-bad-exit=1 " + _command(_run_args(recipe, overrides)) + ' --resume "$RUN_DIR" &',
              *(["# This shell passes signals on to the tasks (srun forwards them): Slurm's --signal=B:, scancel",
                 "# --signal --batch and a requeue reach this shell; tfgpu saves, exits 75, and the chief requeues."]
                if requeue_signal else
                ["# This shell passes SIGTERM on to the tasks (srun forwards it): tfgpu saves and exits 75."]),
              "step=$!",
              *[f"trap 'kill -{sig} \"$step\" 2>/dev/null || true' {sig}" for sig in forwarded],
              'while :; do',
              '    wait "$step" && code=0 || code=$?',
              '    kill -0 "$step" 2>/dev/null || break  # else wait returned for a signal passed on: srun runs on',
              'done',
              'exit "$code"',
              ""]
    return "\n".join(lines)


def tfjob_manifest(recipe: str, config_yaml: str, overrides: Sequence[str], image: str, workers: int,
                   gpus_per_worker: int, name: Optional[str] = None, data_pvc: Optional[str] = None,
                   runs_pvc: Optional[str] = None) -> str:
    """A ConfigMap holding the resolved recipe and a Kubeflow ``TFJob`` (kubeflow.org/v1) of ``workers`` workers.

    The operator starts one pod per worker and injects its ``TF_CONFIG``;
    each runs ``tfgpu run /etc/tfgpu/recipe.yaml --resume /work/runs/<job>``
    from the ConfigMap: the run directory is named by the job, so a restarted
    pod continues the run from its last checkpoint. Worker 0 is the chief.
    Every pod mounts:

    - ``data_pvc`` (a PersistentVolumeClaim's name) read-only at
      :data:`DATA_MOUNT`, the image's ``TFGPU_DATA_DIR``; without it nothing
      is, and the header says what to do;
    - ``runs_pvc`` at :data:`RUNS_MOUNT`; without it an ``emptyDir``, whose
      files go with the pod (the header says so);
    - a memory-backed ``emptyDir`` (:data:`SHM_SIZE_LIMIT`) at ``/dev/shm``:
      the 64 MiB a pod gets is too small for NCCL's shared-memory segments.

    The pod shares its process namespace (``shareProcessNamespace``: tfgpu is
    then not PID 1, so SIGTERM reaches its handler), has
    :data:`SIGNAL_SECONDS` from SIGTERM to SIGKILL to save a checkpoint, and
    ``fsGroup`` :data:`IMAGE_GID` so the image's user can write the volumes.

    Args:
        config_yaml: the recipe's settings as given, ``--set`` included (the ConfigMap's ``recipe.yaml``).
        overrides: the ``--set`` values given (named in the header only: ``config_yaml`` holds them).
        name: the job name (:func:`job_name`); default: the recipe's file name.
    """
    job = _job_name(recipe, name)
    run_dir = f"{RUNS_MOUNT}/{job}"
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{job}-recipe"},
                  "data": {"recipe.yaml": config_yaml}}
    mounts: list[dict[str, Any]] = [{"name": "recipe", "mountPath": "/etc/tfgpu", "readOnly": True},
                                    {"name": "runs", "mountPath": RUNS_MOUNT},
                                    {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "recipe", "configMap": {"name": f"{job}-recipe"}},
        {"name": "runs", **({"persistentVolumeClaim": {"claimName": runs_pvc}} if runs_pvc else {"emptyDir": {}})},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE_LIMIT}},
    ]
    if data_pvc:
        mounts.insert(1, {"name": "data", "mountPath": DATA_MOUNT, "readOnly": True})
        volumes.insert(1, {"name": "data", "persistentVolumeClaim": {"claimName": data_pvc, "readOnly": True}})
    container: dict[str, Any] = {
        "name": "tensorflow",  # the TFJob operator finds the training container by this name
        "image": image,
        "command": [*_run_args("/etc/tfgpu/recipe.yaml", ()), "--resume", run_dir],
        "ports": [{"name": "tfjob-port", "containerPort": TFJOB_PORT}],
        "volumeMounts": mounts,
    }
    if gpus_per_worker:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus_per_worker}}
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": job},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"shareProcessNamespace": True,
                                          "terminationGracePeriodSeconds": SIGNAL_SECONDS,
                                          "securityContext": {"fsGroup": IMAGE_GID},
                                          "containers": [container],
                                          "volumes": volumes}},
                },
            },
        },
    }
    written_by = _command(["tfgpu", "export", "tfjob", recipe, *_options(
        overrides, image=image, workers=workers, gpus_per_worker=gpus_per_worker, data_pvc=data_pvc,
        runs_pvc=runs_pvc, name=name)])
    header = ["kubectl apply -f this file. The operator injects TF_CONFIG into each worker; worker 0 is the chief.",
              f"Each worker runs 'tfgpu run --resume {run_dir}': the run directory is named by the job, so a",
              "restarted pod continues the run from its last checkpoint (a completed run is not run again: delete",
              "the directory or give another --name).",
              *tfjob_notes(data_pvc, runs_pvc),
              f"/dev/shm is a memory-backed emptyDir of {SHM_SIZE_LIMIT} (a pod's own is 64 MiB, too small for NCCL);",
              "it counts toward the pod's memory. shareProcessNamespace: tfgpu is not PID 1, so SIGTERM reaches it,",
              f"and it has {SIGNAL_SECONDS} s (terminationGracePeriodSeconds) to save a checkpoint and exit 75."]
    return (f"# Written by: {written_by}\n"
            + "".join(f"# {part}\n" for line in header for part in textwrap.wrap(line, 100, break_on_hyphens=False))
            + yaml.dump_all([config_map, tfjob], Dumper=_BlockDumper, sort_keys=False))


def tfjob_notes(data_pvc: Optional[str], runs_pvc: Optional[str]) -> list[str]:
    """What a TFJob manifest's volumes mean, one line each; the ones without a PVC are warnings for stderr too."""
    notes = []
    if data_pvc:
        notes.append(f"{DATA_MOUNT} (TFGPU_DATA_DIR in the tfgpu image) is PersistentVolumeClaim {data_pvc}, read-only.")
    else:
        notes.append(f"WARNING: nothing is mounted at {DATA_MOUNT} (TFGPU_DATA_DIR in the tfgpu image): a recipe that "
                     f"reads its data there stops with exit 5; pass --data-pvc NAME, a PersistentVolumeClaim holding "
                     f"the data folders (e.g. mnist/).")
    if runs_pvc:
        notes.append(f"{RUNS_MOUNT} is PersistentVolumeClaim {runs_pvc}: with more than one worker it must be "
                     f"ReadWriteMany (workers restore from the chief's checkpoint).")
    else:
        notes.append(f"WARNING: {RUNS_MOUNT} is an emptyDir: the run directory is lost with the pod, and the workers "
                     f"cannot restore the chief's checkpoint to resume; pass --runs-pvc NAME (a ReadWriteMany "
                     f"PersistentVolumeClaim) to keep it.")
    return notes


class _BlockDumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the recipe) as ``|`` blocks."""


_BlockDumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))
