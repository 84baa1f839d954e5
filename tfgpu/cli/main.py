"""The ``tfgpu`` group, whose commands (one module each) are imported when used. ``tfgpu = tfgpu.cli:main``."""

from __future__ import annotations

import gc
import importlib
from typing import Any, Optional

import click

from ..devices import lean_import
from ..version import __version__
from .common import CONTEXT


class LazyGroup(click.Group):
    """A group whose commands are imported on first use: click's documented pattern
    (https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module = importlib.import_module(f"{__package__}.{COMMANDS[cmd_name]}")
            self.add_command(getattr(module, cmd_name.replace("-", "_")))
        return super().get_command(ctx, cmd_name)

    def main(self, args: Optional[list[str]] = None, *rest: Any, **kwargs: Any) -> Any:
        """Run the command line; when it is this process's own (``args`` None: the ``tfgpu`` script, ``python -m
        tfgpu``), leave the objects it made to the process's end (:func:`gc.freeze`).

        A command that imported TensorFlow or JAX holds millions of Python objects, and the garbage collections
        of the interpreter's shutdown walked them all: about 0.8 CPU seconds after ``tfgpu run``'s last line
        (median of 5 on 2 cores: 7.4 CPU seconds for a one-epoch run, 6.6 frozen). Freezing skips only that
        walk: ``atexit`` handlers, the wait for non-daemon threads and every object freed by reference counting
        run as before, and every file tfgpu writes is closed by then. A caller that passes ``args`` (click's
        ``CliRunner``, a script calling ``main([...])``) goes on living, so nothing is frozen there.

        The process's own command line also imports TensorFlow and Keras without the optional packages they only
        probe for (:mod:`tfgpu.devices.lean_import`: about 5 CPU seconds fewer per command that starts
        TensorFlow); a caller's process is left as it is.
        """
        if args is None:
            lean_import.install()
        try:
            return super().main(args, *rest, **kwargs)
        finally:
            if args is None:
                gc.freeze()


@click.group(cls=LazyGroup, context_settings=CONTEXT)
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
    tfgpu lr-find recipes/mnist.yaml                  a learning rate from a range test (a PNG curve)
    tfgpu find-batch-size recipes/mnist.yaml          the largest batch that fits in memory (cached)
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


#: Each command's module and name: the module is imported when the command is run (or listed by ``--help``),
#: so ``tfgpu plan`` loads one command module, not twelve.
COMMANDS = {
    "run": "run", "sweep": "sweep", "launch": "launch", "evaluate": "evaluate", "predict": "predict",
    "plan": "plan", "devices": "devices", "doctor": "doctor", "runs": "runs", "compare": "runs",
    "export": "export", "bench": "bench", "lr-find": "lr_find",
    "find-batch-size": "find_batch_size",
}
