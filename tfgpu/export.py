"""``tfgpu export``: a recipe as a Slurm batch script or a Kubeflow TFJob manifest (pure text, nothing started).

Both run ``tfgpu run`` once per worker under MultiWorkerMirroredStrategy and
let tfgpu find the cluster where the scheduler puts it: Slurm's environment
(:func:`tfgpu.cluster.resolve_cluster`), or the ``TF_CONFIG`` that the TFJob
operator injects into each worker's pod.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

#: Port of each TFJob worker (the operator's default ``tfjob-port``).
TFJOB_PORT = 2222

#: ``sizeLimit`` of the memory-backed ``emptyDir`` each TFJob pod mounts at ``/dev/shm``: a pod's own is
#: 64 MiB, and NCCL (the reduction across GPUs) fails at start-up without room for its segments there;
#: 1Gi is the ``--shm-size=1g`` NCCL's troubleshooting guide gives (``tfgpu doctor``'s shm check).
SHM_SIZE_LIMIT = "1Gi"


def _job_name(recipe: str, name: Optional[str]) -> str:
    raw = name or Path(recipe).stem
    return re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:52] or "tfgpu"


def _run_args(recipe: str, overrides: Sequence[str]) -> list[str]:
    args = ["tfgpu", "run", recipe]
    for o in [*overrides, "distribute.strategy=multi_worker_mirrored"]:
        args += ["--set", o]
    return args


#: Seconds before the time limit at which Slurm sends ``train.checkpoint.requeue_signal`` (``--signal``).
SIGNAL_SECONDS = 120


def slurm_script(recipe: str, overrides: Sequence[str], nodes: int, gpus_per_node: int, port: int,
                 time_limit: Optional[str] = None, partition: Optional[str] = None,
                 name: Optional[str] = None, output_dir: str = "runs", requeue_signal: Optional[str] = None) -> str:
    """An ``sbatch`` script: ``nodes`` nodes, one task (one worker) per node, ``srun tfgpu run RECIPE``.

    Each task's tfgpu resolves the cluster from ``SLURM_PROCID``,
    ``SLURM_STEP_NODELIST`` and ``SLURM_STEP_TASKS_PER_NODE`` (workers on
    ``port``); each uses its node's GPUs (``--gpus-per-node``), which tfgpu
    does not reassign. The run directory is ``output_dir/<job>-<job id>``
    (``--resume``), so a requeued job continues its run from the checkpoint;
    with ``requeue_signal`` (``train.checkpoint.requeue_signal``), Slurm sends it
    120 s before the time limit, and tfgpu saves, requeues the job and exits 75.
    """
    job = _job_name(recipe, name)
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if time_limit:
        lines.append(f"#SBATCH --time={time_limit}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines.append(f"#SBATCH --output={job}-%j.out")
    lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    if requeue_signal:
        lines.append(f"#SBATCH --signal={requeue_signal[3:]}@{SIGNAL_SECONDS}")
    lines += ["",
              f"# Written by: tfgpu export slurm {recipe} --nodes {nodes} --gpus-per-node {gpus_per_node}",
              "# One task per node; each is a worker of MultiWorkerMirroredStrategy. tfgpu reads the cluster",
              f"# from Slurm's environment (workers listen on port {port}: distribute.port); task 0 is the chief",
              "# and writes the run directory (output.dir should be on a shared file system). A requeued job",
              "# keeps its job id, so --resume continues the same run from its last checkpoint.",
              "set -euo pipefail",
              "",
              f"RUN_DIR={shlex.quote(output_dir)}/{job}-\"$SLURM_JOB_ID\"",
              "srun --kill-on-bad-exit=1 " + " ".join(shlex.quote(a) for a in _run_args(recipe, overrides))
              + ' --resume "$RUN_DIR"',
              ""]
    return "\n".join(lines)


def tfjob_manifest(recipe: str, config_yaml: str, overrides: Sequence[str], image: str, workers: int,
                   gpus_per_worker: int, name: Optional[str] = None) -> str:
    """A ConfigMap holding the resolved recipe and a Kubeflow ``TFJob`` (kubeflow.org/v1) of ``workers`` workers.

    The operator starts one pod per worker and injects its ``TF_CONFIG``;
    each runs ``tfgpu run /etc/tfgpu/recipe.yaml`` from the ConfigMap.
    Worker 0 is the chief. Every pod mounts a memory-backed ``emptyDir``
    (:data:`SHM_SIZE_LIMIT`) at ``/dev/shm``: the 64 MiB a pod gets is too
    small for NCCL's shared-memory segments.
    """
    job = _job_name(recipe, name)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{job}-recipe"},
                  "data": {"recipe.yaml": config_yaml}}
    container: dict[str, Any] = {
        "name": "tensorflow",  # the TFJob operator finds the training container by this name
        "image": image,
        "command": _run_args("/etc/tfgpu/recipe.yaml", overrides),
        "ports": [{"name": "tfjob-port", "containerPort": TFJOB_PORT}],
        "volumeMounts": [{"name": "recipe", "mountPath": "/etc/tfgpu", "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
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
                    "template": {"spec": {"containers": [container],
                                          "volumes": [{"name": "recipe",
                                                       "configMap": {"name": f"{job}-recipe"}},
                                                      {"name": "dshm",
                                                       "emptyDir": {"medium": "Memory",
                                                                    "sizeLimit": SHM_SIZE_LIMIT}}]}},
                },
            },
        },
    }
    header = (f"# Written by: tfgpu export tfjob {recipe} --image {image} --workers {workers}\n"
              "# kubectl apply -f this file. The operator injects TF_CONFIG into each worker; worker 0 is the chief\n"
              "# and writes the run directory (mount a volume at output.dir to keep it). /dev/shm is a\n"
              f"# memory-backed emptyDir of {SHM_SIZE_LIMIT} (a pod's own is 64 MiB, too small for NCCL); it counts\n"
              "# toward the pod's memory.\n")
    return header + yaml.dump_all([config_map, tfjob], Dumper=_BlockDumper, sort_keys=False)


class _BlockDumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the recipe) as ``|`` blocks."""


_BlockDumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))
