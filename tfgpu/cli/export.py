"""``tfgpu export``: a recipe as a Slurm script or TFJob manifest; a run's model as SavedModel, ONNX or LiteRT."""

from __future__ import annotations

from typing import Any, Callable

import click

from .common import CONTEXT, handle_errors, set_option_with


@click.group(context_settings=CONTEXT)
def export() -> None:
    """Write a recipe as a Slurm batch script or a Kubeflow TFJob manifest, or a run's model as an artifact.

    \b
    tfgpu export savedmodel runs/mnist-20261123-101500   TF Serving's NAME/VERSION/ layout
    tfgpu export onnx runs/mnist-20261123-101500 -o mnist.onnx
    tfgpu export litert runs/mnist-20261123-101500
    tfgpu export slurm recipes/mnist.yaml --workers 2 --gpus-per-worker 4 --time 4h -o mnist.sbatch
    tfgpu export tfjob recipes/mnist.yaml --image registry/tfgpu:1 --workers 2 --data-pvc tfgpu-data \\
        --runs-pvc tfgpu-runs -o mnist-tfjob.yaml

    'export slurm' and 'export tfjob' take --workers (one per Slurm node, one per
    pod) and --gpus-per-worker; 'export slurm' also reads them as --nodes and
    --gpus-per-node. 'export savedmodel|onnx|litert' verify the artifact in its
    own runtime and write export.json beside it (docs/export.md).
    """



def _write(text: str, output: str | None, command: str, recipe: str, cfg: Any) -> None:
    """Print ``text``, or write it to ``output``: never over the recipe, a file of a run directory or the data the
    recipe reads (exit 2, nothing written)."""
    if output is None:
        click.echo(text, nl=False)
        return
    from pathlib import Path  # noqa: PLC0415

    from ..errors import OutputError  # noqa: PLC0415
    from ..serving.inference import refuse_data_files, refuse_run_files  # noqa: PLC0415

    refuse_run_files(command, "--output", output, (Path(output),))
    refuse_data_files(command, "--output", output, (Path(output),), cfg, {"the recipe": recipe})
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"--output: cannot write '{output}': {exc.strerror or exc}.",
                          "give a writable file path, or leave --output out to print.") from None
    click.echo(f"tfgpu: wrote {output}", err=True)



class _Checked(click.ParamType):
    """A string checked (and perhaps rewritten) by a function of :mod:`tfgpu.cluster.manifests` that raises ``ValueError``."""

    def __init__(self, name: str, check: str, *args: str) -> None:
        self.name, self._check, self._args = name, check, args

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from ..cluster import manifests as export_lib  # noqa: PLC0415

        try:
            return getattr(export_lib, self._check)(str(value), *self._args)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)



_output_option = click.option("--output", "-o", metavar="FILE", help="Write to FILE instead of printing.")



_export_set_option = set_option_with("train.epochs=20")



_EXPORT_WORKERS = 2  # the default of --workers for both exports



@export.command("slurm", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path())
@_export_set_option
@click.option("--workers", "--nodes", "workers", type=click.IntRange(1, 4096), default=_EXPORT_WORKERS,
              show_default=True, help="Workers, one per node (#SBATCH --nodes).")
@click.option("--gpus-per-worker", "--gpus-per-node", "gpus_per_worker", type=click.IntRange(0, 64), default=1,
              show_default=True, help="GPUs of each worker's node (#SBATCH --gpus-per-node; 0: CPU nodes).")
@click.option("--time", "time_limit", type=_Checked("TIME", "slurm_time"),
              help="#SBATCH --time, in a form Slurm reads: minutes, minutes:seconds, hours:minutes:seconds, "
                   "days-hours, days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED. Durations such as "
                   "4h, 90m, 1d12h are converted to Slurm's form (4h: 04:00:00).  [default: the partition's]")
@click.option("--partition", type=_Checked("NAME", "slurm_partition"),
              help="#SBATCH --partition (names separated by commas).  [default: the cluster's]")
@click.option("--name", type=_Checked("NAME", "job_name", "slurm"),
              help="Job name: letters, digits, _ . -; it also names the run directory RUN_DIR=OUTPUT_DIR/NAME-JOBID "
                   "and the log NAME-JOBID.out.  [default: the recipe's file name]")
@_output_option
@handle_errors
def export_slurm(recipe: str, overrides: tuple[str, ...], workers: int, gpus_per_worker: int, time_limit: str | None,
                 partition: str | None, name: str | None, output: str | None) -> None:
    """An sbatch script that runs RECIPE on WORKERS nodes with srun (one worker per node).

    Each task runs 'tfgpu run RECIPE --resume RUN_DIR' with
    RUN_DIR=output.dir/NAME-$SLURM_JOB_ID, so a requeued job continues its run.
    """
    from ..config import load_config  # noqa: PLC0415
    from ..cluster.manifests import slurm_script  # noqa: PLC0415

    cfg = load_config(recipe, overrides=[*overrides, "distribute.strategy=multi_worker_mirrored"])
    signal = cfg.train.checkpoint.requeue_signal if cfg.train.checkpoint.enabled else None
    _write(slurm_script(recipe, overrides, workers, gpus_per_worker, cfg.distribute.port, time_limit, partition,
                        name, cfg.output.dir, signal), output, "export slurm", recipe, cfg)



@export.command("tfjob", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path())
@_export_set_option
@click.option("--image", required=True, metavar="IMAGE", help="Container image with tfgpu installed.")
@click.option("--workers", type=click.IntRange(1, 4096), default=_EXPORT_WORKERS, show_default=True,
              help="Worker pods (the TFJob's Worker replicas).")
@click.option("--gpus-per-worker", type=click.IntRange(0, 64), default=1, show_default=True,
              help="nvidia.com/gpu limit of each pod (0: CPU pods).")
@click.option("--data-pvc", type=_Checked("PVC", "k8s_volume_claim", "--data-pvc"),
              help="PersistentVolumeClaim with the data folders, mounted read-only at /data (TFGPU_DATA_DIR in "
                   "the tfgpu image).  [default: none; a warning says a recipe reading /data will stop]")
@click.option("--runs-pvc", type=_Checked("PVC", "k8s_volume_claim", "--runs-pvc"),
              help="PersistentVolumeClaim (ReadWriteMany with several workers) mounted at /work/runs for the run "
                   "directory.  [default: an emptyDir, lost with the pod]")
@click.option("--name", type=_Checked("NAME", "job_name", "tfjob"),
              help="Job name: lower-case letters, digits, -; it also names the run directory /work/runs/NAME.  "
                   "[default: the recipe's file name]")
@_output_option
@handle_errors
def export_tfjob(recipe: str, overrides: tuple[str, ...], image: str, workers: int, gpus_per_worker: int,
                 data_pvc: str | None, runs_pvc: str | None, name: str | None, output: str | None) -> None:
    """A Kubeflow TFJob (kubeflow.org/v1) with WORKERS pods and a ConfigMap holding RECIPE.

    Each pod runs 'tfgpu run /etc/tfgpu/recipe.yaml --resume /work/runs/NAME',
    so a restarted pod continues the run from its last checkpoint.
    """
    from ..config import load_config  # noqa: PLC0415
    from ..cluster.manifests import tfjob_manifest, tfjob_notes  # noqa: PLC0415
    from ..training.layout import given_yaml  # noqa: PLC0415

    cfg = load_config(recipe, overrides=[*overrides, "distribute.strategy=multi_worker_mirrored"])
    # The settings as given, not every default (as a run's config.yaml): the pods plan them as
    # `tfgpu run RECIPE` would here.
    recipe_yaml = given_yaml(cfg)
    _write(tfjob_manifest(recipe, recipe_yaml, overrides, image, workers, gpus_per_worker, name, data_pvc, runs_pvc),
           output, "export tfjob", recipe, cfg)
    for note in tfjob_notes(data_pvc, runs_pvc):
        if note.startswith("WARNING: "):
            click.echo(f"tfgpu: warning: {note[len('WARNING: '):]}", err=True)



def _artifact_command(fmt: str, default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The shared arguments of ``export savedmodel|onnx|litert`` (:mod:`tfgpu.serving.export`)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = handle_errors(func)
        func = click.option("--output", "-o", metavar="PATH",
                            help=f"Where to write.  [default: {default}]")(func)
        func = set_option_with("data.path=new/place.csv")(func)
        func = click.argument("run_dir", type=click.Path())(func)
        return export.command(fmt, context_settings=CONTEXT)(func)

    return decorate



def _artifact(run_dir: str, fmt: str, output: str | None, overrides: tuple[str, ...],
              version: int | None = None) -> None:
    from ..serving.export import export_artifact  # noqa: PLC0415

    record = export_artifact(run_dir, fmt, output, overrides, version)
    check = record["verification"]
    classes = (f", predicted classes identical {check['classes_identical']}/{check['samples']}"
               if "classes_identical" in check else "")
    if check.get("near_ties"):
        classes += f" (the others at near ties: {check['near_ties']})"
    relative = ", relative above 1" if check.get("tolerance_rule", "absolute") != "absolute" else ""
    click.echo(f"tfgpu: verified in {check['runtime']} on {check['samples']} {check['split']} samples: "
               f"max abs difference {check['max_abs_diff']:.2e} (allowed {check['tolerance']:g}{relative}){classes}")
    seconds = record["seconds"]
    click.echo(f"tfgpu: exported in {seconds['export']:.2f}s (load {seconds['load']:.2f}s, "
               f"verify {seconds['verify']:.2f}s)")
    click.echo(f"tfgpu: wrote {record['path']} and {record['record']}")



@_artifact_command("savedmodel", "RUN_DIR/export/savedmodel/<recipe name>, version folder inside")
@click.option("--version", "version", type=click.IntRange(0, None), default=None,
              help="The version folder's number.  [default: the next free one, 1 in a new folder]")
def export_savedmodel(run_dir: str, overrides: tuple[str, ...], output: str | None, version: int | None) -> None:
    """RUN_DIR's model as a TensorFlow SavedModel in TF Serving's NAME/VERSION/ layout.

    -o names the model's base folder (NAME); the SavedModel goes in its folder
    VERSION with signature serving_default: 'inputs' (the raw inputs tfgpu
    predict takes, e.g. uint8 pixels) -> 'outputs' (float32 probabilities or
    values). Checked in TensorFlow's loader on the run's validation data;
    export.json in the version folder describes it (docs/export.md).
    """
    _artifact(run_dir, "savedmodel", output, overrides, version)



@_artifact_command("onnx", "RUN_DIR/export/model.onnx")
def export_onnx(run_dir: str, overrides: tuple[str, ...], output: str | None) -> None:
    """RUN_DIR's model as ONNX (needs pip install 'tfgpu[onnx]').

    Input 'inputs' (raw, as tfgpu predict takes them), output 'outputs'
    (float32); checked in ONNX Runtime on the run's validation data;
    described by PATH.export.json (docs/export.md).
    """
    _artifact(run_dir, "onnx", output, overrides)



@_artifact_command("litert", "RUN_DIR/export/model.tflite")
def export_litert(run_dir: str, overrides: tuple[str, ...], output: str | None) -> None:
    """RUN_DIR's model as LiteRT (TensorFlow Lite) .tflite (needs pip install 'tfgpu[litert]').

    Signature serving_default: 'inputs' -> 'outputs' (float32); checked in the
    LiteRT interpreter on the run's validation data; described by
    PATH.export.json (docs/export.md).
    """
    _artifact(run_dir, "litert", output, overrides)
