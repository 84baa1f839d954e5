"""Where the workers come from (distribute.cluster, TF_CONFIG, Slurm), the plan of a multi-worker run, the
children that `run --workers` / `launch` would start (as data), and `tfgpu export`. No TensorFlow here except
the one subprocess that asks TensorFlow's own SlurmClusterResolver."""

from __future__ import annotations

import json
import sys
import pytest
import yaml

from ..conftest import RECIPES, run_cli, run_python
from tfgpu import load_config
from tfgpu.cluster.spec import expand_hostlist, expand_tasks_per_node, resolve_cluster, tf_config
from tfgpu.devices.plan import make_plan
from tfgpu.devices.probe import Probe
from tfgpu.errors import ConfigError
from tfgpu.launch.workers import launch_env, launch_settings, prepare_launch, prepare_run

MWMS = {"distribute": {"strategy": "multi_worker_mirrored"}}
TF_CONFIG = json.dumps({"cluster": {"worker": ["h1:2000", "h2:2000", "h3:2000"]},
                        "task": {"type": "worker", "index": 1}})
SLURM = {"SLURM_PROCID": "3", "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
         "SLURM_STEP_NUM_TASKS": "4"}


def mwms(**distribute):
    return load_config({"distribute": {"strategy": "multi_worker_mirrored", **distribute}})


def test_order_config_then_tf_config_then_slurm_then_one_worker():
    explicit = mwms(cluster={"workers": ["a:1", "b:2"], "task_index": 1}).distribute
    both = {"TF_CONFIG": TF_CONFIG, **SLURM}
    assert resolve_cluster(explicit, both).jobs == {"worker": ("a:1", "b:2")}
    assert resolve_cluster(explicit, both).source == "distribute.cluster"
    plain = mwms().distribute
    from_tf = resolve_cluster(plain, both)
    assert (from_tf.source, from_tf.task_index, from_tf.num_workers, from_tf.is_chief) == ("TF_CONFIG", 1, 3, False)
    from_slurm = resolve_cluster(plain, SLURM)
    assert from_slurm.source == "Slurm"
    assert from_slurm.jobs["worker"] == ("gpu07:8888", "gpu07:8889", "gpu08:8888", "gpu08:8889")
    assert from_slurm.task_index == 3 and from_slurm.address == "gpu08:8889"
    alone = resolve_cluster(plain, {})
    assert (alone.num_workers, alone.is_chief, alone.source) == (1, True, "single worker")


def test_chief_job_in_tf_config_comes_first():
    text = json.dumps({"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 0}})
    cluster = resolve_cluster(mwms().distribute, {"TF_CONFIG": text})
    assert (cluster.num_workers, cluster.worker_index, cluster.is_chief) == (3, 1, False)
    assert json.loads(tf_config(cluster)) == json.loads(text)


@pytest.mark.parametrize("text, fragment", [
    ("{not json", "not JSON"),
    ('{"task": {"type": "worker", "index": 0}}', "no 'cluster'"),
    ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}}', "'chief' or 'worker'"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "not one of the cluster's tasks"),
    ('{"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}', "not 'host:port'"),
])
def test_bad_tf_config_names_the_variable_and_value(text, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_cluster(mwms().distribute, {"TF_CONFIG": text})
    assert "TF_CONFIG" in info.value.message and fragment in info.value.message
    assert info.value.hint


def test_cluster_without_task_index_says_how_to_set_it():
    with pytest.raises(ConfigError) as info:
        resolve_cluster(mwms(cluster={"workers": ["a:1", "b:2"]}).distribute, {})
    assert "--set distribute.cluster.task_index=N" in info.value.hint


@pytest.mark.parametrize("env, fragment", [
    ({"SLURM_PROCID": "0"}, "SLURM_STEP_NODELIST"),
    ({"SLURM_PROCID": "5", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2"}, "SLURM_PROCID 5"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1"}, "2 node(s)"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-", "SLURM_STEP_TASKS_PER_NODE": "1"}, "cannot be read"),
])
def test_bad_slurm_environment_is_a_config_error(env, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_cluster(mwms().distribute, env)
    assert fragment in info.value.message


def test_hostlist_and_tasks_per_node_expansion():
    assert expand_hostlist("n[01-03],gpu7,rack[1,3-4]x") == ["n01", "n02", "n03", "gpu7", "rack1x", "rack3x", "rack4x"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError):
        expand_tasks_per_node("two")


SLURM_CASES = [
    {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_STEP_TASKS_PER_NODE": "2",
     "SLURM_STEP_NUM_TASKS": "2"},
    {"SLURM_PROCID": "4", "SLURM_STEP_NODELIST": "node[09-11]", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
     "SLURM_STEP_NUM_TASKS": "5"},
    {"SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "b-node,a-node", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
     "SLURM_STEP_NUM_TASKS": "2"},
]


@pytest.mark.slow
def test_slurm_resolution_agrees_with_tensorflows_slurm_cluster_resolver():
    """The same faked srun environments through TensorFlow's own resolver (auto_set_gpu off) and through tfgpu."""
    code = f"""
        import json, os
        import tensorflow as tf
        SlurmClusterResolver = tf.distribute.cluster_resolver.SlurmClusterResolver
        out = []
        for env in {SLURM_CASES!r}:
            os.environ.update(env)
            r = SlurmClusterResolver(port_base=23456, gpus_per_node=8, gpus_per_task=1, auto_set_gpu=False)
            spec = r.cluster_spec().as_dict()
            out.append([spec["worker"], r.get_task_info()[1]])
        print(json.dumps(out))
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = json.loads(result.stdout.strip().splitlines()[-1])
    for env, (workers, index) in zip(SLURM_CASES, theirs):
        ours = resolve_cluster(mwms(port=23456).distribute, env)
        assert list(ours.jobs["worker"]) == workers
        assert ours.task_index == index


def test_plan_counts_replicas_over_workers_and_scales_the_learning_rate():
    cfg = load_config("recipes/mnist.yaml", overrides=["distribute.strategy=multi_worker_mirrored"])
    plan = make_plan(cfg, Probe(env={"TF_CONFIG": TF_CONFIG}))
    assert (plan.num_workers, plan.num_replicas, plan.global_batch_size, plan.lr_scale) == (3, 3, 3 * 4096, 3.0)
    assert plan.strategy.devices == ("/cpu:0",)
    text = plan.describe()
    assert "Cluster: 3 worker(s) from TF_CONFIG: worker h1:2000, h2:2000, h3:2000; this process: worker 1 (non-chief)" \
        in text
    assert "Replicas: 1 per worker x 3 workers = 3; batch: 4096 per replica x 3 = 12288 global" in text
    assert plan.to_dict()["strategy"]["cluster"]["num_workers"] == 3


def test_plan_of_a_multi_worker_gpu_node_under_slurm_warns_instead_of_reassigning_gpus():
    from tfgpu.devices.probe import GpuInfo

    probe = Probe(gpus=(GpuInfo(0, "A100"), GpuInfo(1, "A100")), env=dict(SLURM))
    plan = make_plan(load_config(MWMS), probe)
    assert "CUDA_VISIBLE_DEVICES" not in plan.env
    assert plan.num_replicas == 2 * 4
    assert any("several tasks on this node" in w for w in plan.warnings)


def test_tfgpu_plan_shows_the_cluster_without_tensorflow():
    result = run_cli("plan", "recipes/mnist.yaml", "--set", "distribute.strategy=multi_worker_mirrored",
                     TF_CONFIG=TF_CONFIG)
    assert result.returncode == 0, result.stderr
    assert "this process: worker 1 (non-chief)" in result.stdout
    assert "Replicas: 1 per worker x 3 workers = 3" in result.stdout


def test_workers_with_a_single_device_strategy_is_refused():
    result = run_cli("run", "recipes/mnist.yaml", "--workers", "2", "--set", "distribute.strategy=one_device")
    assert result.returncode == 3
    assert "--workers 2 with distribute.strategy: one_device" in result.stderr


def test_prepare_run_gives_each_worker_its_tf_config_run_dir_and_log(tmp_path):
    children = prepare_run("recipes/mnist.yaml", ["train.epochs=2"], 2, [3001, 3002], tmp_path / "r",
                           {"PATH": "/bin", "SLURM_PROCID": "0"})
    assert [c.index for c in children] == [0, 1]
    for child in children:
        config = json.loads(child.env["TF_CONFIG"])
        assert config == {"cluster": {"worker": ["127.0.0.1:3001", "127.0.0.1:3002"]},
                          "task": {"type": "worker", "index": child.index}}
        assert child.env["TFGPU_RUN_DIR"] == str(tmp_path / "r")
        assert child.log == tmp_path / "r" / "workers" / f"worker-{child.index}.log"
        assert "SLURM_PROCID" not in child.env and child.env["PATH"] == "/bin"
        assert child.argv[:4] == (sys.executable, "-m", "tfgpu", "run")
        assert child.argv[-2:] == ("--set", "distribute.strategy=multi_worker_mirrored")
    assert children[0].stdin and not children[1].stdin


def test_prepare_launch_passes_environment_settings_and_the_config(tmp_path):
    cfg = load_config({"devices": {"cpu_logical_devices": 2}, "tensorflow": {"intra_op_threads": 3, "log_level": 1}})
    plan = make_plan(cfg, Probe())
    (one,) = prepare_launch(plan, ["train.py", "--lr", "0.1"], 1, [], tmp_path / "c.yaml", {"HOME": "/root"}, None)
    assert one.argv == (sys.executable, "-m", "tfgpu.launch.bootstrap", "train.py", "--lr", "0.1")
    assert one.env["TFGPU_CONFIG"] == str(tmp_path / "c.yaml")
    assert one.env["TF_NUM_INTRAOP_THREADS"] == "3" and one.env["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert "TF_CONFIG" not in one.env and one.log is None and one.stdin
    two = prepare_launch(plan, ["-m", "pkg.train"], 2, [4001, 4002], tmp_path / "c.yaml", {}, tmp_path / "logs")
    assert [json.loads(c.env["TF_CONFIG"])["task"]["index"] for c in two] == [0, 1]
    assert two[1].log == tmp_path / "logs" / "worker-1.log"


def test_launch_settings_say_what_travels_by_environment_and_by_bootstrap():
    cfg = load_config({"devices": {"cpu_logical_devices": 2, "log_device_placement": True},
                       "tensorflow": {"mixed_precision": "mixed_bfloat16"}})
    rows = {(r.key, r.how) for r in launch_settings(make_plan(cfg, Probe()))}
    assert ("TF_CPP_MIN_LOG_LEVEL", "environment") in rows
    assert ("devices.cpu_logical_devices", "bootstrap") in rows
    assert ("devices.soft_placement", "bootstrap") in rows
    assert ("devices.log_device_placement", "bootstrap") in rows
    assert ("tensorflow.mixed_precision", "bootstrap") in rows
    from tfgpu.devices.probe import GpuInfo

    gpu = make_plan(load_config({"devices": {"visible_gpus": [1]}}), Probe(gpus=(GpuInfo(0), GpuInfo(1))))
    env = launch_env(gpu)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"


def test_plan_launch_prints_both_groups():
    result = run_cli("plan", "--launch", "--set", "devices.cpu_logical_devices=2", "--workers", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "By environment" in out and "By the bootstrap" in out
    assert "TF_CONFIG: 2 local workers on 127.0.0.1" in out
    assert "does not add replicas under multi_worker_mirrored" in out
    assert "tfgpu.devices.keras_fixes.install()" in out


def test_export_slurm_script(tmp_path):
    out = tmp_path / "job.sbatch"
    result = run_cli("export", "slurm", "recipes/mnist.yaml", "--nodes", "3", "--gpus-per-node", "4", "--time",
                     "01:00:00", "--set", "train.epochs=2", "-o", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert text.startswith("#!/bin/bash\n")
    sbatch = dict((line[len("#SBATCH --"):] + "=").split("=")[:2] for line in text.splitlines()
                  if line.startswith("#SBATCH"))
    assert sbatch == {"job-name": "mnist", "nodes": "3", "ntasks-per-node": "1", "gpus-per-node": "4",
                      "time": "01:00:00", "output": "mnist-%j.out", "requeue": "", "open-mode": "append",
                      "signal": "B:USR1@120"}
    assert 'RUN_DIR=runs/mnist-"$SLURM_JOB_ID"\n' in text
    (srun,) = [line for line in text.splitlines() if line.startswith("srun ")]
    assert srun.split()[2:] == ["tfgpu", "run", "recipes/mnist.yaml", "--set", "train.epochs=2", "--set",
                                "distribute.strategy=multi_worker_mirrored", "--resume", '"$RUN_DIR"', "&"]
    # the batch shell passes the requeue signal and SIGTERM on to srun, and exits with its code
    assert "trap 'kill -USR1 \"$step\" 2>/dev/null || true' USR1\n" in text and text.endswith('exit "$code"\n')
    no_signal = run_cli("export", "slurm", "recipes/mnist.yaml", "--set", "train.checkpoint=false")
    assert "#SBATCH --signal" not in no_signal.stdout and "USR1" not in no_signal.stdout
    assert "trap 'kill -TERM \"$step\" 2>/dev/null || true' TERM\n" in no_signal.stdout


def test_export_tfjob_manifest():
    result = run_cli("export", "tfjob", "recipes/mnist.yaml", "--image", "registry.local/tfgpu:1", "--workers", "3")
    assert result.returncode == 0, result.stderr
    config_map, job = list(yaml.safe_load_all(result.stdout))
    assert (config_map["apiVersion"], config_map["kind"]) == ("v1", "ConfigMap")
    recipe = yaml.safe_load(config_map["data"]["recipe.yaml"])
    assert load_config(recipe).distribute.strategy == "multi_worker_mirrored"
    # the recipe as given, so the pods plan it alike (a default such as tensorflow.log_level stays unset)
    assert load_config(recipe) == load_config(RECIPES / "mnist.yaml", overrides=["distribute.strategy=multi_worker_mirrored"])
    assert "log_level" not in recipe["tensorflow"] and "soft_placement" not in recipe["devices"]
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("kubeflow.org/v1", "TFJob", "mnist")
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    (container,) = worker["template"]["spec"]["containers"]
    assert container["name"] == "tensorflow" and container["image"] == "registry.local/tfgpu:1"
    assert container["command"][:3] == ["tfgpu", "run", "/etc/tfgpu/recipe.yaml"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert worker["template"]["spec"]["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]


def test_export_needs_an_image():
    result = run_cli("export", "tfjob", "recipes/mnist.yaml")
    assert result.returncode == 2 and "--image" in result.stderr


@pytest.mark.slow
def test_keras_fixes_find_both_faulty_calls_in_the_installed_keras():
    """If a Keras upgrade fixes either call upstream, this says so (and the fix is then not applied)."""
    result = run_python("""
        import keras
        from tfgpu.devices import keras_fixes
        print(keras.__version__, keras_fixes.needed())
        print(keras_fixes.install(), keras_fixes.install())
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    version, *_ = result.stdout.split()
    if version == "3.15.1":
        assert "{'symbolic_build': True, 'reduce_per_replica': True}" in result.stdout
        assert result.stdout.count("{'symbolic_build': 'applied', 'reduce_per_replica': 'applied'}") == 2


def test_explicit_cluster_values_are_checked():
    result = run_cli("plan", "--set", "distribute.cluster={workers: ['a:1', 'b:99999']}")
    assert result.returncode == 3
    assert "'distribute.cluster.workers'" in result.stderr and "not 'host:port'" in result.stderr
