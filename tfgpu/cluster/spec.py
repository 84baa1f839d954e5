"""Which workers train together, and which one this process is: a pure module, no TensorFlow.

``tf.distribute.MultiWorkerMirroredStrategy`` needs a cluster (every worker's
``host:port``) and this process's task in it. :func:`resolve_cluster` finds
them, in this order:

1. ``distribute.cluster`` in the recipe (``workers`` and ``task_index``);
2. ``TF_CONFIG`` (TensorFlow's own format, as Kubeflow's TFJob operator and
   ``tfgpu run --workers N`` set it);
3. Slurm's environment (``SLURM_PROCID``, ``SLURM_STEP_NODELIST``,
   ``SLURM_STEP_TASKS_PER_NODE``, ``SLURM_STEP_NUM_TASKS``) with
   ``tf.distribute.cluster_resolver.SlurmClusterResolver``'s semantics: hosts
   in sorted order, each host's tasks on ports ``distribute.port``,
   ``distribute.port + 1``, ...; but the visible GPUs are never changed (the
   resolver's ``auto_set_gpu`` would rewrite ``CUDA_VISIBLE_DEVICES``);
4. else one local worker.

:func:`tf_config` is the only function that writes a ``TF_CONFIG`` value.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from ..errors import ConfigError

#: Slurm variables the resolution reads (recorded by the probe).
SLURM_ENV = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS",
             "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID")


@dataclass(frozen=True)
class Cluster:
    """The workers of one training job and this process's place among them.

    Attributes:
        jobs: ``{"worker": ("host:port", ...)}``, with a ``"chief"`` job when the
            cluster names one (TF_CONFIG may).
        task_type: ``"worker"`` or ``"chief"``.
        task_index: this process's index in its job.
        source: where it came from: ``"distribute.cluster"``, ``"TF_CONFIG"``,
            ``"Slurm"``, ``"local workers"`` or ``"single worker"``.
    """

    jobs: dict[str, tuple[str, ...]]
    task_type: str = "worker"
    task_index: int = 0
    source: str = "single worker"

    @property
    def num_workers(self) -> int:
        """Machines (processes) that train: the chief and the workers."""
        return sum(len(hosts) for hosts in self.jobs.values())

    @property
    def worker_index(self) -> int:
        """This process's rank over all workers, the chief first (the input pipeline id)."""
        return self.task_index + (len(self.jobs.get("chief", ())) if self.task_type == "worker" else 0)

    @property
    def is_chief(self) -> bool:
        """The task that writes the run directory: ``chief``, else worker 0 (TensorFlow's rule)."""
        return self.task_type == "chief" or ("chief" not in self.jobs and self.task_index == 0)

    @property
    def address(self) -> str:
        """This process's ``host:port``."""
        return self.jobs[self.task_type][self.task_index]

    def describe(self) -> str:
        """One line for ``tfgpu plan`` and the run banner."""
        if self.source == "single worker":
            return "one worker, this process (no distribute.cluster, TF_CONFIG or Slurm environment)"
        hosts = ", ".join(f"{job} {', '.join(addresses)}" for job, addresses in self.jobs.items())
        role = "chief" if self.is_chief else "non-chief"
        return (f"{self.num_workers} worker(s) from {self.source}: {hosts}; this process: {self.task_type} "
                f"{self.task_index} ({role})")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(num_workers=self.num_workers, worker_index=self.worker_index, is_chief=self.is_chief)
        return data


def tf_config(cluster: Cluster) -> str:
    """The ``TF_CONFIG`` value for ``cluster``'s task (JSON, TensorFlow's layout).

    Wraps: https://www.tensorflow.org/guide/distributed_training#setting_up_the_tf_config_environment_variable
    """
    return json.dumps({"cluster": {job: list(hosts) for job, hosts in cluster.jobs.items()},
                       "task": {"type": cluster.task_type, "index": cluster.task_index}})


def local_cluster(ports: list[int], task_index: int) -> Cluster:
    """``len(ports)`` workers on 127.0.0.1, this process being ``task_index``."""
    return Cluster({"worker": tuple(f"127.0.0.1:{p}" for p in ports)}, "worker", task_index, "local workers")


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list -> host names: ``"n[01-03],gpu7"`` -> ``["n01", "n02", "n03", "gpu7"]``.

    Raises:
        ValueError: not a host list.
    """
    parts, depth, current = [], 0, ""
    for c in hostlist:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in {hostlist!r}")
    parts.append(current)
    hosts: list[str] = []
    for part in parts:
        m = re.fullmatch(r"([^\[\],]+)(?:\[([\d,-]+)\])?([^\[\],]*)", part)
        if not m:
            raise ValueError(f"{part!r} is not a host or a host range")
        prefix, ranges, suffix = m.groups()
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for r in ranges.split(","):
            first, _, last = r.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                raise ValueError(f"{r!r} in {part!r} is not a number range")
            for n in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{str(n).zfill(len(first))}{suffix}")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks per node -> one count per node: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises:
        ValueError: not in Slurm's format.
    """
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"{part!r} is not 'N' or 'N(xM)'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _bad(key: str, value: Any, why: str, fix: str) -> ConfigError:
    return ConfigError(f"{key}: {why} (received {value!r}).", fix)


def _from_tf_config(text: str) -> Cluster:
    fix = ('set TF_CONFIG to JSON like {"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
           '"task": {"type": "worker", "index": 0}}, or unset it.')
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad("TF_CONFIG", text[:200], f"not JSON ({exc.msg} at character {exc.pos})", fix) from None
    if not isinstance(data, dict) or not isinstance(data.get("cluster"), dict) or not data["cluster"]:
        raise _bad("TF_CONFIG", text[:200], "it has no 'cluster' mapping of jobs to 'host:port' lists", fix)
    jobs = {}
    for job, hosts in data["cluster"].items():
        if job not in ("chief", "worker") or not isinstance(hosts, list) or not hosts:
            raise _bad("TF_CONFIG", text[:200], f"job {job!r} is not a non-empty 'chief' or 'worker' list "
                       "(MultiWorkerMirroredStrategy trains with a chief and workers only)", fix)
        for host in hosts:
            _check_address(host, "TF_CONFIG")
        jobs[job] = tuple(hosts)
    task = data.get("task") or {}
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in jobs or not isinstance(index, int) or not 0 <= index < len(jobs[task_type]):
        raise _bad("TF_CONFIG", text[:200], f"its task {task!r} is not one of the cluster's tasks "
                   f"({', '.join(f'{j} 0-{len(h) - 1}' for j, h in jobs.items())})", fix)
    return Cluster(jobs, task_type, index, "TF_CONFIG")


def _check_address(address: Any, key: str) -> None:
    if not isinstance(address, str) or not re.fullmatch(r"[\w.-]+:\d{1,5}", address) or int(
            address.rsplit(":", 1)[1]) > 65535:
        raise _bad(key, address, "a worker address is not 'host:port' (port 1-65535)",
                   "write each worker as 'host:port', e.g. 'node1:12345'.")


def _from_slurm(env: Mapping[str, str], port: int) -> Cluster:
    def var(step: str, job: str) -> str:
        value = env.get(step, env.get(job))
        if value is None:
            raise ConfigError(
                f"Slurm: SLURM_PROCID is set but {step} (or {job}) is not, so the workers cannot be found.",
                "start the workers with srun inside an allocation (sbatch/salloc), as 'tfgpu export slurm' does, "
                "or unset SLURM_PROCID.")
        return value

    try:
        rank = int(env["SLURM_PROCID"])
        hosts = expand_hostlist(var("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
        counts = expand_tasks_per_node(var("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    except ValueError as exc:
        raise ConfigError(f"Slurm: the environment cannot be read: {exc}.",
                          "run under srun, which sets these variables, or unset the SLURM_* variables.") from None
    if len(counts) != len(hosts):
        raise ConfigError(f"Slurm: {len(hosts)} node(s) in the node list but {len(counts)} task count(s).",
                          "run under srun, which sets these variables consistently.")
    workers = tuple(f"{host}:{port + offset}" for host, count in sorted(zip(hosts, counts)) for offset in range(count))
    total = env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS"))
    if total is not None and total.isdigit() and int(total) != len(workers):
        raise ConfigError(f"Slurm: SLURM_STEP_NUM_TASKS is {total} but the nodes hold {len(workers)} tasks.",
                          "run under srun, which sets these variables consistently.")
    if not 0 <= rank < len(workers):
        raise ConfigError(f"Slurm: SLURM_PROCID {rank} is not one of the step's {len(workers)} tasks.",
                          "run under srun, which sets these variables consistently.")
    return Cluster({"worker": workers}, "worker", rank, "Slurm")


def resolve_cluster(distribute: Any, env: Mapping[str, str]) -> Cluster:
    """The cluster for ``distribute.strategy: multi_worker_mirrored`` (see the module's order).

    Args:
        distribute: the config's ``distribute`` section (``cluster``, ``port``).
        env: the environment to read (``TF_CONFIG``, ``SLURM_*``).

    Returns:
        :class:`Cluster`.

    Raises:
        ConfigError: a malformed ``distribute.cluster``, ``TF_CONFIG`` or Slurm
            environment (the message names the variable and the value).
    """
    explicit = distribute.cluster
    if explicit is not None:
        if explicit.task_index is None:
            raise ConfigError(
                f"distribute.cluster.task_index is not set; with {len(explicit.workers)} workers listed, each "
                "process must say which it is.",
                "start each worker with --set distribute.cluster.task_index=N (N from 0 to "
                f"{len(explicit.workers) - 1}).")
        return Cluster({"worker": tuple(explicit.workers)}, "worker", explicit.task_index, "distribute.cluster")
    if env.get("TF_CONFIG"):
        return _from_tf_config(env["TF_CONFIG"])
    if "SLURM_PROCID" in env:
        return _from_slurm(env, distribute.port)
    return Cluster({"worker": ("localhost",)}, "worker", 0, "single worker")
