"""``tfgpu export slurm|tfjob``: the files it writes are ones the scheduler takes, as written.

The TFJob manifest is validated against real schemas, not read for strings: its
ConfigMap and its pod template (as a Pod) against Kubernetes' OpenAPI schemas
(``kubernetes-validate``, strict: unknown fields are errors, as for ``kubectl
apply``'s default field validation), and the TFJob against the OpenAPI v3
schema of Kubeflow's training-operator CRD (``tests/fixtures/kubeflow.org_tfjobs.yaml``,
made strict the same way) with ``jsonschema``. The Slurm script's ``--time``
is checked against the forms Slurm's parser reads, and the script shown in
docs/multiworker.md is compared with what the command writes.
"""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ..conftest import ROOT, one_paragraph, run_cli

#: The Kubernetes release whose schemas the pod is checked against (the CRD's was generated for 1.31).
KUBERNETES = "1.31"
IMAGE = "registry.local/tfgpu:1"


def _strict(schema):
    """The schema with unknown fields refused wherever Kubernetes would refuse them (strict field validation).

    A CRD's structural schema lists each object's fields; the API server drops or (``kubectl apply``'s
    default ``--validate=strict``) refuses others, which plain JSON Schema allows unless told.
    """
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def tfjob_schema():
    crd = yaml.safe_load((ROOT / "tests" / "fixtures" / "kubeflow.org_tfjobs.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strict(version["schema"]["openAPIV3Schema"])


def validate(documents, tfjob_schema):
    """Raise if any object of the manifest breaks its schema."""
    config_map, tfjob = documents
    kubernetes_validate.validate(config_map, KUBERNETES, strict=True)
    jsonschema.validate(tfjob, tfjob_schema, cls=jsonschema.Draft7Validator)
    for replica in tfjob["spec"]["tfReplicaSpecs"].values():
        template = replica["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker", **template.get("metadata", {})},
               "spec": template["spec"]}
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)


def export_tfjob(*args):
    result = run_cli("export", "tfjob", "recipes/mnist.yaml", "--image", IMAGE, *args)
    assert result.returncode == 0, result.stderr
    return result, list(yaml.safe_load_all(result.stdout))


def pod_of(documents):
    return documents[1]["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]


@pytest.mark.parametrize("args", [
    [],
    ["--workers", "4", "--gpus-per-worker", "8", "--data-pvc", "tfgpu-data", "--runs-pvc", "tfgpu-runs",
     "--name", "mnist-4x8", "--set", "train.epochs=20"],
    ["--gpus-per-worker", "0", "--runs-pvc", "runs.shared"],
])
def test_tfjob_manifest_passes_the_kubernetes_and_kubeflow_schemas(args, tfjob_schema):
    _, documents = export_tfjob(*args)
    assert [(d["apiVersion"], d["kind"]) for d in documents] == [("v1", "ConfigMap"), ("kubeflow.org/v1", "TFJob")]
    validate(documents, tfjob_schema)


@pytest.mark.parametrize("where, breakage", [
    ("container", lambda c, p, j: c.update(volumeMount=c.pop("volumeMounts"))),      # misspelt pod field
    ("container", lambda c, p, j: c["ports"][0].update(containerPort="2222")),       # wrong type
    ("pod", lambda c, p, j: p.update(shareProcessNamespace="yes")),                  # wrong type
    ("pod", lambda c, p, j: p["volumes"][0].update(configmap=p["volumes"][0].pop("configMap"))),  # misspelt
    ("tfjob", lambda c, p, j: j["spec"].update(tfReplicaSpec=j["spec"].pop("tfReplicaSpecs"))),  # misspelt CRD field
    ("tfjob", lambda c, p, j: j["spec"]["tfReplicaSpecs"]["Worker"].update(replicas="2")),        # wrong type
    ("tfjob", lambda c, p, j: j["spec"]["runPolicy"].update(cleanPodPolicies="None")),           # misspelt CRD field
    ("tfjob", lambda c, p, j: j["spec"]["tfReplicaSpecs"]["Worker"].update(template=[])),         # wrong type
])
def test_the_schemas_reject_a_broken_manifest(where, breakage, tfjob_schema):
    """The validation above bites: each deliberate mistake is refused."""
    _, documents = export_tfjob("--data-pvc", "tfgpu-data")
    broken = copy.deepcopy(documents)
    pod = pod_of(broken)
    breakage(pod["containers"][0], pod, broken[1])
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(broken, tfjob_schema)


def test_tfjob_pods_mount_data_and_runs_and_resume_a_run_named_by_the_job():
    result, documents = export_tfjob("--data-pvc", "tfgpu-data", "--runs-pvc", "tfgpu-runs", "--name", "mnist-a")
    assert result.stderr == ""
    pod = pod_of(documents)
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/data"]["readOnly"] is True
    assert volumes[mounts["/data"]["name"]]["persistentVolumeClaim"] == {"claimName": "tfgpu-data", "readOnly": True}
    assert volumes[mounts["/work/runs"]["name"]]["persistentVolumeClaim"] == {"claimName": "tfgpu-runs"}
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert volumes[mounts["/etc/tfgpu"]["name"]]["configMap"]["name"] == documents[0]["metadata"]["name"]
    assert container["command"] == ["tfgpu", "run", "/etc/tfgpu/recipe.yaml", "--set",
                                    "distribute.strategy=multi_worker_mirrored", "--resume", "/work/runs/mnist-a"]
    assert pod["shareProcessNamespace"] is True and pod["terminationGracePeriodSeconds"] >= 30
    assert pod["securityContext"]["fsGroup"] == 1000  # the image's group, so it can write the runs volume
    assert documents[1]["metadata"]["name"] == "mnist-a"
    assert "WARNING" not in result.stdout


def test_tfjob_without_volumes_says_what_is_missing(tmp_path):
    out = tmp_path / "job.yaml"
    result = run_cli("export", "tfjob", "recipes/mnist.yaml", "--image", IMAGE, "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    pod = pod_of(list(yaml.safe_load_all(text)))
    (container,) = pod["containers"]
    assert "/data" not in [m["mountPath"] for m in container["volumeMounts"]]
    runs = [v for v in pod["volumes"] if v["name"] == "runs"]
    assert runs == [{"name": "runs", "emptyDir": {}}]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("tfgpu: warning:")]
    assert len(warnings) == 2, result.stderr
    assert "--data-pvc NAME" in warnings[0] and "exit 5" in warnings[0]
    assert "--runs-pvc NAME" in warnings[1] and "lost" in warnings[1]
    header = text[:text.index("apiVersion")]
    assert "# WARNING: nothing is mounted at /data" in header and "# WARNING: /work/runs is an emptyDir" in header


def test_the_manifest_recipe_and_command_plan_as_written(tmp_path):
    """The pod's command, less --resume (plan has none), plans the ConfigMap's recipe as a multi-worker run."""
    _, documents = export_tfjob("--set", "train.epochs=20")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(documents[0]["data"]["recipe.yaml"])
    command = pod_of(documents)["containers"][0]["command"]
    assert command[:3] == ["tfgpu", "run", "/etc/tfgpu/recipe.yaml"] and command[-2] == "--resume"
    result = run_cli("plan", str(recipe), *command[3:-2], "--json")
    assert result.returncode == 0, result.stderr
    config = result.stdout[result.stdout.index("{"):]
    assert '"multi_worker_mirrored"' in config and '"epochs": 20' in config


def test_tfjob_takes_no_slurm_names():
    """--nodes/--gpus-per-node are Slurm's words (a pod is not a node): only 'export slurm' takes them."""
    result = run_cli("export", "tfjob", "recipes/mnist.yaml", "--image", IMAGE, "--nodes", "2")
    assert result.returncode == 2 and "--nodes" in result.stderr


@pytest.mark.parametrize("option, value, words", [
    ("--name", "My_Job", ["'My_Job'", "lower-case", "--name mnist-4x8"]),
    ("--data-pvc", "Data PVC", ["'Data PVC'", "PersistentVolumeClaim", "--data-pvc tfgpu-data"]),
    ("--runs-pvc", "-runs", ["'-runs'", "PersistentVolumeClaim", "--runs-pvc tfgpu-runs"]),
])
def test_tfjob_refuses_names_kubernetes_refuses(option, value, words):
    result = run_cli("export", "tfjob", "recipes/mnist.yaml", "--image", IMAGE, option, value)
    assert result.returncode == 2, result.stdout
    error = result.stderr[result.stderr.index("Error:"):]
    one_paragraph(error)
    assert all(w in error for w in words), error


# ------------------------------------------------------------------ tfgpu export slurm


def sbatch_lines(text: str) -> dict[str, str]:
    return dict((line[len("#SBATCH --"):] + "=").split("=")[:2] for line in text.splitlines()
                if line.startswith("#SBATCH"))


def test_slurm_takes_the_tfjob_words_and_its_own():
    ours = run_cli("export", "slurm", "recipes/mnist.yaml", "--workers", "3", "--gpus-per-worker", "4")
    slurms = run_cli("export", "slurm", "recipes/mnist.yaml", "--nodes", "3", "--gpus-per-node", "4")
    assert ours.returncode == 0 and slurms.returncode == 0, ours.stderr + slurms.stderr
    assert ours.stdout == slurms.stdout
    assert sbatch_lines(ours.stdout)["nodes"] == "3" and sbatch_lines(ours.stdout)["gpus-per-node"] == "4"
    assert "# Written by: tfgpu export slurm recipes/mnist.yaml --workers 3 --gpus-per-worker 4\n" in ours.stdout


@pytest.mark.parametrize("given, written", [
    ("04:00:00", "04:00:00"), ("90", "90"), ("30:00", "30:00"), ("2-12", "2-12"), ("1-06:30", "1-06:30"),
    ("1-00:00:00", "1-00:00:00"), ("unlimited", "UNLIMITED"), ("INFINITE", "INFINITE"),
    ("4h", "04:00:00"), ("90m", "01:30:00"), ("1d12h", "1-12:00:00"), ("2h30m", "02:30:00"), ("36h", "1-12:00:00"),
])
def test_slurm_time_is_written_in_a_form_slurm_reads(given, written):
    result = run_cli("export", "slurm", "recipes/mnist.yaml", "--time", given)
    assert result.returncode == 0, result.stderr
    assert sbatch_lines(result.stdout)["time"] == written
    # Slurm's forms (src/common/parse_time.c time_str2secs): digits in 1-3 fields, an optional "days-" first.
    assert re.fullmatch(r"UNLIMITED|INFINITE|\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}", written)


@pytest.mark.parametrize("value", ["4x", "1.5h", "1:2:3:4", "1-2-3", "4 h", "", "h"])
def test_slurm_refuses_a_time_slurm_would_reject(value):
    result = run_cli("export", "slurm", "recipes/mnist.yaml", "--time", value)
    assert result.returncode == 2, result.stdout
    error = result.stderr[result.stderr.index("Error:"):]
    one_paragraph(error)
    for words in (repr(value), "hours:minutes:seconds", "days-hours:minutes:seconds", "UNLIMITED",
                  "Example: --time 04:00:00"):
        assert words in error, error
    assert "#SBATCH" not in result.stdout


@pytest.mark.parametrize("option, value", [("--partition", "gpu long"), ("--partition", "gpu;rm"),
                                           ("--name", "my job"), ("--name", "-x")])
def test_slurm_refuses_a_partition_or_name_it_cannot_write(option, value):
    result = run_cli("export", "slurm", "recipes/mnist.yaml", option, value)
    assert result.returncode == 2, result.stdout
    error = result.stderr[result.stderr.index("Error:"):]
    one_paragraph(error)
    assert repr(value) in error and f"e.g. {option} " in error


def test_slurm_script_is_valid_bash_and_names_its_run_directory_by_the_job(tmp_path):
    result = run_cli("export", "slurm", "recipes/mnist.yaml", "--name", "MNIST_run.1", "--partition", "gpu,gpu-long")
    assert result.returncode == 0, result.stderr
    lines = sbatch_lines(result.stdout)
    assert lines["job-name"] == "MNIST_run.1" and lines["partition"] == "gpu,gpu-long"
    assert 'RUN_DIR=runs/MNIST_run.1-"$SLURM_JOB_ID"\n' in result.stdout
    script = tmp_path / "job.sbatch"
    script.write_text(result.stdout)
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the script's syntax"
    check = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_slurm_script_in_the_docs_is_what_export_writes():
    """docs/multiworker.md shows the script of the command named in its marker, exactly."""
    text = (ROOT / "docs" / "multiworker.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- output of: (tfgpu export slurm [^>]*?) -->\n```\n(.*?)```", text, re.DOTALL)
    assert match, "docs/multiworker.md has no '<!-- output of: tfgpu export slurm ... -->' block"
    command, shown = match.groups()
    result = run_cli(*shlex.split(command)[1:])
    assert result.returncode == 0, result.stderr
    assert shown == result.stdout, (f"docs/multiworker.md's Slurm script differs from '{command}'; "
                                    f"paste its output into the block:\n{result.stdout}")


# ------------------------------------------------------------------ help texts


@pytest.mark.parametrize("command, example", [
    (["run"], "train.epochs=3"), (["plan"], "train.epochs=3"), (["evaluate"], "data.test_path=photos/new"),
    (["devices"], "devices.cpu_logical_devices=2"), (["doctor"], "devices.memory_growth=true"),
    (["bench", "matmul"], "devices.cpu_logical_devices=2"), (["bench", "logging"], "devices.cpu_logical_devices=2"),
    (["bench", "devices"], "devices.cpu_logical_devices=2"), (["launch"], "devices.memory_growth=true"),
    (["export", "slurm"], "train.epochs=20"), (["export", "tfjob"], "train.epochs=20"),
])
def test_each_commands_set_example_fits_it(command, example):
    result = run_cli(*command, "--help", COLUMNS="200")
    assert result.returncode == 0, result.stderr
    assert f"e.g. --set {example} (value read as YAML" in " ".join(result.stdout.split()), result.stdout


def test_export_help_shows_the_defaults():
    for kind in ("slurm", "tfjob"):
        result = run_cli("export", kind, "--help", COLUMNS="200")
        text = " ".join(result.stdout.split())
        assert "--workers" in text and "[default: 2; 1<=x<=4096]" in text and "[default: 1; 0<=x<=64]" in text
    assert "--workers, --nodes" in run_cli("export", "slurm", "--help").stdout
