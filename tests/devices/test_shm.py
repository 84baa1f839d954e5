"""/dev/shm for NCCL (issue 21, fault 11): containers get 64 MiB, NCCL on 2+ GPUs needs more.

- ``tfgpu export tfjob`` mounts a memory-backed ``emptyDir`` at ``/dev/shm`` in every pod;
- ``tfgpu doctor`` warns when ``/dev/shm`` is small and NCCL would run (the probe's
  ``shm_mib`` is the seam: a test gives it 64 MiB and two GPUs);
- every documented GPU ``docker run`` / ``podman run`` gives the container more shared memory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tfgpu.config import Config, load_config
from tfgpu.devices.doctor import diagnose, report
from tfgpu.devices.probe import Facts, GpuInfo, Probe, cuda_visible, shm_size_mib

from ..conftest import ROOT, run_cli
from .test_doctor import PACKAGES, libraries, tf_facts


def gpu_machine(n: int, shm_mib: int | None, env=None, **kw) -> Probe:
    env = env or {}
    gpus = tuple(GpuInfo(i, "NVIDIA A100-SXM4-40GB", 40960, f"GPU-{i:04d}", i, 400, "8.0") for i in range(n))
    return Probe(gpus=tuple(cuda_visible(gpus, env.get("CUDA_VISIBLE_DEVICES"))), env=env, nvml_gpus=gpus,
                 driver_version="555.42.06", cuda_driver_version="12.5", shm_mib=shm_mib, **kw)


def shm_findings(probe: Probe, config: Config | None = None) -> list:
    return [f for f in diagnose(Facts(machine=probe), config) if f.check == "shm"]


# ------------------------------------------------------------------ tfgpu export tfjob


def _size_mib(quantity: str) -> float:
    """A Kubernetes quantity ('1Gi', '512Mi', '2G') in MiB."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(quantity)).groups()
    scale = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "": 1}[unit]
    return float(number) * scale / 2**20


def test_every_tfjob_pod_mounts_a_memory_backed_dev_shm():
    result = run_cli("export", "tfjob", "recipes/mnist.yaml", "--image", "registry.local/tfgpu:1",
                     "--workers", "3", "--gpus-per-worker", "4")
    assert result.returncode == 0, result.stderr
    job = [d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "TFJob"][0]
    replicas = job["spec"]["tfReplicaSpecs"]
    assert replicas
    for kind, replica in replicas.items():
        pod = replica["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            shm = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            assert len(shm) == 1, f"{kind}/{container['name']}: no volume mounted at /dev/shm: {container}"
            assert not shm[0].get("readOnly")
            volume = volumes[shm[0]["name"]]
            assert volume["emptyDir"]["medium"] == "Memory", volume
            assert _size_mib(volume["emptyDir"]["sizeLimit"]) >= 1024, volume


# ------------------------------------------------------------------ tfgpu doctor


def test_doctor_warns_on_a_containers_64_mib_with_two_gpus():
    for config in (None, Config()):
        (finding,) = shm_findings(gpu_machine(2, 64), config)
        assert finding.level == "warning", finding
        assert "/dev/shm is 64 MiB" in finding.seen and "NCCL" in finding.seen
        assert "--shm-size=1g" in finding.fix and "--ipc=host" in finding.fix and "emptyDir" in finding.fix
    text = report(diagnose(Facts(machine=gpu_machine(2, 64))))
    assert "[warning] /dev/shm for NCCL: /dev/shm is 64 MiB" in text


def test_doctor_is_content_with_one_gpu_or_a_large_dev_shm():
    assert shm_findings(gpu_machine(1, 64), Config()) == []  # one GPU: NCCL is not used
    assert shm_findings(gpu_machine(0, 64)) == []
    # two GPUs, the config narrows to one: no reduction across GPUs
    assert shm_findings(gpu_machine(2, 64), load_config(overrides=["devices.visible_gpus=[0]"])) == []
    (big,) = shm_findings(gpu_machine(2, 32768), Config())
    assert big.level == "ok" and "32768 MiB" in big.seen
    (docker_1g,) = shm_findings(gpu_machine(8, 1024))  # exactly --shm-size=1g
    assert docker_1g.level == "ok"
    assert shm_findings(gpu_machine(2, None)) == []  # not measured (facts from an older tfgpu)


def test_doctor_warns_for_multi_worker_on_gpus_and_not_for_virtual_gpus():
    tf_config = json.dumps({"cluster": {"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 0}})
    multi = load_config(overrides=["distribute.strategy=multi_worker_mirrored"])
    (finding,) = shm_findings(gpu_machine(1, 64, env={"TF_CONFIG": tf_config}), multi)
    assert finding.level == "warning" and "multi_worker_mirrored" in finding.seen
    # two logical GPUs on one physical GPU: reduce_to_one_device, not NCCL
    split = load_config(overrides=["devices.gpu_logical_devices=2", "devices.memory_limit_mib=8000"])
    assert shm_findings(gpu_machine(1, 64), split) == []


def test_doctor_command_on_saved_facts_with_a_small_dev_shm(tmp_path):
    """A healthy 2-GPU machine but for /dev/shm: a warning (exit 0, 9 with --strict); with room, no problem."""
    def saved(name: str, shm_mib: int) -> str:
        facts = Facts(machine=gpu_machine(2, shm_mib), packages=dict(PACKAGES), tensorflow=tf_facts(2),
                      libraries=libraries())
        path = tmp_path / name
        path.write_text(json.dumps({"facts": facts.to_dict()}))
        return str(path)

    small = saved("small.json", 64)
    plain = run_cli("doctor", "--facts", small)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "[warning] /dev/shm for NCCL: /dev/shm is 64 MiB" in plain.stdout and "--shm-size=1g" in plain.stdout
    assert plain.stdout.rstrip().endswith("0 error(s), 1 warning(s).")
    assert run_cli("doctor", "--facts", small, "--strict").returncode == 9
    roomy = run_cli("doctor", "--facts", saved("roomy.json", 65536), "--strict", "--json")
    assert roomy.returncode == 0, roomy.stdout
    (finding,) = [f for f in json.loads(roomy.stdout)["findings"] if f["check"] == "shm"]
    assert finding["level"] == "ok" and "65536 MiB" in finding["seen"]


def test_the_probe_measures_dev_shm(tmp_path):
    assert shm_size_mib(str(tmp_path / "missing")) is None
    if Path("/dev/shm").is_dir():
        size = shm_size_mib()
        assert isinstance(size, int) and size > 0
        assert Facts.from_dict(json.loads(json.dumps(Facts(machine=Probe(shm_mib=size)).to_dict()))).machine.shm_mib \
            == size


# ------------------------------------------------------------------ the documented commands

DOCS = [ROOT / "README.md", ROOT / "Dockerfile", *sorted((ROOT / "docs").glob("*.md"))]
GPU_MARKS = ("--gpus", "--device nvidia.com/gpu", "--device=nvidia.com/gpu", "--runtime=nvidia", "--runtime nvidia",
             "NVIDIA_VISIBLE_DEVICES=")


def _snippets(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each fenced-code line (backslash continuations joined), inline code span (wrapped
    spans joined), and, in the Dockerfile, each comment line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.name == "Dockerfile":
        lines = [line[1:] if line.startswith("#") else "" for line in lines]
    out, prose, fenced = [], [], False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or path.name == "Dockerfile":
            start, joined = i, line
            while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined.rstrip()[:-1] + " " + lines[i].strip()
            out.append((start + 1, joined))
        else:
            prose.append((i + 1, line))
        i += 1
    text = "\n".join(line for _, line in prose)
    for match in re.finditer(r"`([^`]+)`", text):
        out.append((prose[text.count("\n", 0, match.start())][0], " ".join(match.group(1).split())))
    return out


def documented_gpu_runs() -> list[tuple[str, str]]:
    runs = []
    for path in DOCS:
        for line, snippet in _snippets(path):
            for command in re.split(r"&&|\|\||;|\|", snippet.split(" # ")[0]):
                words = command.split()
                engine = [w for w in words[:4] if w in ("docker", "podman")]
                if engine and "run" in words[:4] and any(mark in command for mark in GPU_MARKS):
                    runs.append((f"{path.relative_to(ROOT)}:{line}", command.strip()))
    return runs


def test_every_documented_gpu_container_gets_shared_memory():
    runs = documented_gpu_runs()
    assert len(runs) >= 10, runs  # the README alone documents more
    assert any(where.startswith("README.md") for where, _ in runs) and any(c.startswith("podman") for _, c in runs)
    missing = [f"{where}: {command}" for where, command in runs
               if not re.search(r"(^|\s)--shm-size[=\s]|(^|\s)--ipc[=\s]host\b", command)]
    assert not missing, "GPU containers started with the 64 MB /dev/shm (add --shm-size=1g):\n" + "\n".join(missing)


def test_the_documented_pod_spec_matches_the_export():
    """docs/containers.md's emptyDir for a pod of one's own is the one 'tfgpu export tfjob' writes."""
    from tfgpu.cluster.manifests import SHM_SIZE_LIMIT

    text = (ROOT / "docs" / "containers.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", text[text.index("## Shared memory"):], re.DOTALL).group(1)
    spec = yaml.safe_load(block)
    (volume,) = spec["volumes"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": SHM_SIZE_LIMIT}
    assert {"name": volume["name"], "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
