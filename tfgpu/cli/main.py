"""The ``tfgpu`` group: every command of the package registered on it. ``tfgpu = tfgpu.cli:main``."""

from __future__ import annotations

import click

from ..version import __version__
from .common import CONTEXT


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="tfgpu")
def main() -> None:
    """TensorFlow/Keras on GPUs, correctly and fast, from one YAML file.

    \b
    tfgpu run recipes/mnist.yaml                      train a recipe
    tfgpu run recipes/mnist.yaml --set train.loop=custom
    tfgpu evaluate runs/mnist-20261123-101500        evaluate a run's saved model
    tfgpu predict runs/mnist-20261123-101500 photos/ -o preds.csv   the model on new inputs
    tfgpu runs                                        the run directories under runs/: status, metrics, speed
    tfgpu compare runs/a runs/b --plot curves.png     settings that differ, metrics, learning curves
    tfgpu plan recipes/mnist.yaml                     show what would be applied
    tfgpu devices                                     GPUs (NVML) and TensorFlow's devices
    tfgpu doctor                                      why TensorFlow does not see the GPU
    tfgpu bench matmul|logging|devices                time your hardware (d2l's GPU exercises)
    tfgpu run recipes/mnist.yaml --workers 2          two local workers (MultiWorkerMirroredStrategy)
    tfgpu run --resume runs/mnist-20261123-101500     continue a killed run from its checkpoint
    tfgpu sweep recipes/breast_cancer_sweep.yaml --parallel 2   Optuna trials packed onto the devices
    tfgpu launch recipes/gpu.yaml -- recipes/scripts/train.py   your own script, the config applied
    tfgpu export slurm|tfjob recipes/mnist.yaml       a Slurm batch script or a Kubeflow TFJob
    tfgpu export onnx runs/mnist-20261123-101500      a run's model as SavedModel/ONNX/LiteRT, verified

    Exit codes: 0 ok, 2 usage, 3 config, 4 device, 5 data, 6 TensorFlow already
    initialised, 7 training failed, 8 output not writable, 9 doctor found an
    error, 10 a worker crashed or was killed, 11 MLflow unreachable, 12 no
    trial of a sweep completed, 75 preempted (a checkpoint was
    saved: run again with --resume), 130 interrupted.
    """


def _register() -> None:
    """Add each command module's command to :func:`main` (no module imports anything heavy when it loads)."""
    from .bench import bench  # noqa: PLC0415
    from .devices import devices  # noqa: PLC0415
    from .doctor import doctor  # noqa: PLC0415
    from .evaluate import evaluate  # noqa: PLC0415
    from .export import export  # noqa: PLC0415
    from .launch import launch  # noqa: PLC0415
    from .plan import plan  # noqa: PLC0415
    from .predict import predict  # noqa: PLC0415
    from .run import run  # noqa: PLC0415
    from .runs import compare, runs  # noqa: PLC0415
    from .sweep import sweep  # noqa: PLC0415

    for command in (run, sweep, launch, evaluate, predict, plan, devices, doctor, runs, compare, export, bench):
        main.add_command(command)


_register()
