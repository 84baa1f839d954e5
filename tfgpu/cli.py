"""The ``tfgpu`` command line: thin click commands; errors become exit codes.

Nothing heavy is imported at module level, so ``tfgpu --help`` is instant.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from typing import Any, Callable

import click

from . import __version__

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _debug_wanted(debug: bool) -> bool:
    return debug or os.environ.get("TFGPU_DEBUG", "") not in ("", "0")


def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Map tfgpu errors to their exit codes with a one-paragraph message (traceback with --debug)."""

    @functools.wraps(func)
    def wrapper(*args: Any, debug: bool = False, **kwargs: Any) -> Any:
        from .errors import TfgpuError  # noqa: PLC0415

        try:
            return func(*args, **kwargs)
        except TfgpuError as exc:
            if _debug_wanted(debug):
                traceback.print_exc()
            click.echo(exc.report(), err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            if _debug_wanted(debug):
                traceback.print_exc()
            click.echo("tfgpu: interrupted.", err=True)
            sys.exit(130)

    return click.option("--debug", is_flag=True, help="Print the traceback of errors (or set TFGPU_DEBUG=1).")(wrapper)


def _check_overrides(ctx: click.Context, param: Any, items: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse a malformed ``--set`` item before the command starts: exit 2 (a usage error) with tfgpu's message."""
    from .config.source import parse_override  # noqa: PLC0415
    from .errors import UsageError  # noqa: PLC0415

    for item in items:
        try:
            parse_override(item)
        except UsageError as exc:
            click.echo(exc.report(), err=True)
            ctx.exit(exc.exit_code)
    return items


def _set_option_with(example: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--set KEY=VALUE`` option (repeatable), its help giving ``example``: a key that fits the command."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", callback=_check_overrides,
                        help=f"Override a config key, e.g. --set {example} (value read as YAML; repeatable).")


_set_option = _set_option_with("train.epochs=3")  # run, plan
_set_device_option = _set_option_with("devices.cpu_logical_devices=2")  # devices, bench


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


_workers_option = click.option(
    "--workers", type=click.IntRange(1, 64), default=1, show_default=True,
    help="Start N local worker processes on 127.0.0.1 (MultiWorkerMirroredStrategy), each with its TF_CONFIG.")


#: ``tfgpu run --max-restarts`` default: how many times a failed worker group is restarted.
MAX_RESTARTS = 3


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_option
@click.option("--output-dir", metavar="DIR", help="Parent of the run directory (overrides output.dir).")
@_workers_option
@click.option("--resume", "resume", metavar="RUN_DIR",
              help="Continue the run in RUN_DIR from its last checkpoint (a RUN_DIR that does not exist yet gets "
                   "a new run: for job scripts that are requeued).")
@click.option("--max-restarts", type=click.IntRange(0, 1000), default=MAX_RESTARTS, show_default=True,
              help="With --workers N: restart the workers from the last checkpoint up to this many times when "
                   "one crashes or is killed.")
@click.option("--dry-run", is_flag=True,
              help="Do everything before training, then stop and write nothing: check the recipe, start "
                   "TensorFlow, load the data, build the model, optimizer, loss and metrics and run them on two "
                   "training samples (with --resume: check the run it would continue). Not with --workers N.")
@handle_errors
def run(recipe: str | None, overrides: tuple[str, ...], output_dir: str | None, workers: int, resume: str | None,
        max_restarts: int, dry_run: bool) -> None:
    """Train RECIPE's model under its tf.distribute strategy and write a run directory.

    \b
    tfgpu run recipes/mnist.yaml
    tfgpu run --resume runs/mnist-20261123-101500     continue a killed run
    tfgpu run recipes/mnist.yaml --workers 2          two local workers

    With --workers N (N > 1), N local workers train together under
    MultiWorkerMirroredStrategy; the chief writes the run directory and each
    worker's output is kept in RUN_DIR/workers/; a worker that crashes or is
    killed restarts the group from the last checkpoint (--max-restarts), and
    with no restart left the run exits with 10; a worker's own error code
    (3-8) is passed on. On a cluster (TF_CONFIG, Slurm, distribute.cluster),
    run it once per worker without --workers. SIGTERM and the requeue signal
    (train.checkpoint.requeue_signal, SIGUSR1) save a checkpoint and exit
    with 75; with --workers they are forwarded to the workers, which die
    with this process.

    --dry-run stops where the run directory would be written (exit 0) and
    writes nothing: it catches what 'tfgpu plan RECIPE' cannot, such as a
    model that does not fit the data's shape or a loss that does not fit its
    labels. It runs in one process: for --workers N, 'tfgpu plan RECIPE
    --workers N' checks the recipe and shows worker 0's plan.
    """
    from .errors import ConfigError  # noqa: PLC0415
    from .runner import dry_run as dry_run_recipe, run as run_recipe, run_workers  # noqa: PLC0415

    if recipe is None and resume is None:
        raise ConfigError("tfgpu run: no recipe was given (received neither RECIPE nor --resume RUN_DIR).",
                          "name a recipe (tfgpu run recipes/mnist.yaml) or a run to continue "
                          "(tfgpu run --resume runs/NAME).")
    if dry_run and workers > 1:
        raise click.UsageError(
            f"--dry-run checks one process and cannot start --workers {workers}; check the recipe and worker 0's "
            f"plan with 'tfgpu plan RECIPE --workers {workers}', or leave --workers out to dry-run the model "
            "against the data in one process.")
    if dry_run:
        for line in dry_run_recipe(recipe, overrides, output_dir, resume=resume):
            click.echo(line)
    elif workers > 1:
        run_workers(recipe, overrides, output_dir, workers, resume=resume, max_restarts=max_restarts)
    else:
        run_recipe(recipe, overrides, output_dir, resume=resume)


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_option_with("train.epochs=10")
@click.option("--trials", type=click.IntRange(1, 100_000), metavar="N",
              help="Trials in all (overrides sweep.trials; with several sweep processes on one storage: together).")
@click.option("--parallel", type=click.IntRange(1, 1024), metavar="K",
              help="Trials at a time: on a host without GPUs, K slots sharing the CPU cores (default 1); on a GPU "
                   "host, at most K of the slots sweep.per_trial gives (default all).")
@click.option("--storage", metavar="URL",
              help="The study's storage: a database URL Optuna supports (sqlite:///FILE, postgresql://...) or a "
                   "journal file, shared by sweep processes on several machines (default SWEEP_DIR/study.journal).")
@click.option("--study", "study_name", metavar="NAME", help="The study's name in the storage (default: the sweep "
              "directory's name; give the same NAME to every process that shares a storage).")
@click.option("--sweep", "sweep_file", metavar="FILE", help="Take the sweep: section from FILE instead of RECIPE.")
@click.option("--output-dir", metavar="DIR", help="Parent of the sweep directory (overrides output.dir).")
@click.option("--resume", "resume", metavar="SWEEP_DIR",
              help="Continue a stopped or killed sweep: finished trials are kept, interrupted ones continue from "
                   "their checkpoints.")
@handle_errors
def sweep(recipe: str | None, overrides: tuple[str, ...], trials: int | None, parallel: int | None,
          storage: str | None, study_name: str | None, sweep_file: str | None, output_dir: str | None,
          resume: str | None) -> None:
    """Search RECIPE's sweep: parameters with Optuna, one 'tfgpu run' per trial, packed onto the devices.

    \b
    tfgpu sweep recipes/breast_cancer_sweep.yaml --parallel 2
    tfgpu sweep --resume runs/breast_cancer_sweep-sweep-20261126-101500     after Ctrl-C or a kill

    'tfgpu run SWEEP_DIR/best.yaml' trains the best trial again.

    Each trial is an ordinary run (its own run directory under SWEEP_DIR/trials/,
    checkpoints, every check) in its own process, pinned to its slot: a GPU,
    a share of one (sweep.per_trial.gpus: 0.5), a MIG instance, or on a host
    without GPUs its share of the CPU cores (--parallel K). 'tfgpu plan RECIPE'
    shows the slots. The sweep directory holds the study (study.journal),
    results.csv (also printed) and best.yaml. Exit 12 when no trial completes;
    Ctrl-C and SIGTERM stop the trials with checkpoints (exit 130 / 75).
    """
    from .sweep import run_sweep  # noqa: PLC0415

    run_sweep(recipe, overrides, trials=trials, parallel=parallel, storage=storage, resume=resume,
              study_name=study_name, sweep_file=sweep_file, output_dir=output_dir)


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True})
@_set_option_with("devices.memory_growth=true")
@_workers_option
@click.option("--log-dir", metavar="DIR", help="Where each worker's log goes with --workers N "
              "(default: tfgpu-logs/launch-<time>).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def launch(overrides: tuple[str, ...], workers: int, log_dir: str | None, command: tuple[str, ...]) -> None:
    """Run an unmodified script with the config applied: tfgpu launch [RECIPE] [OPTIONS] -- SCRIPT [ARGS].

    \b
    tfgpu launch recipes/gpu.yaml -- recipes/scripts/train.py --epochs 1
    tfgpu launch --set devices.cpu_logical_devices=2 -- -m recipes.scripts.train
    tfgpu launch recipes/gpu.yaml --workers 2 -- recipes/scripts/train.py --steps 50

    RECIPE is a .yaml/.yml file (optional; else TFGPU_CONFIG, else the
    defaults). Settings TensorFlow reads from the environment travel that
    way; the rest are applied by tfgpu.setup() in the script's process before
    the script runs as __main__ ('tfgpu plan --launch' shows which). The exit
    code is the script's. With --workers N, N copies run as the workers of a
    MultiWorkerMirroredStrategy on 127.0.0.1 (TF_CONFIG set for each); when
    one fails the others are stopped, and its own exit code is passed on,
    but one killed by a signal or ended by an uncaught exception gives 10
    (as tfgpu run --workers). Ctrl-C, SIGTERM and the requeue signal are
    forwarded to the script; it dies with tfgpu launch.
    """
    from .launch import launch as run_launch  # noqa: PLC0415

    args = list(command)
    recipe = None
    if args and args[0].lower().endswith((".yaml", ".yml")):
        recipe = args.pop(0)
    if args and args[0] == "--":
        args.pop(0)
    sys.exit(run_launch(recipe, overrides, workers, args, log_dir))


@main.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path())
@_set_option_with("data.test_path=photos/new")
@click.option("--split", "splits", type=click.Choice(["validation", "test", "all"]), default="all", show_default=True,
              help="Which split to evaluate.")
@handle_errors
def evaluate(run_dir: str, overrides: tuple[str, ...], splits: str) -> None:
    """Reload RUN_DIR/model.keras and evaluate it on the run's validation and test data.

    The run's config.yaml is used again (same data, same validation_split and
    seed, same rescaling), with --set on top for other data, e.g.
    --set data.test_path=photos/new. Writes RUN_DIR/evaluation.json (an
    earlier one is kept as evaluation-<time>.json).
    """
    from .evaluate import evaluate_run  # noqa: PLC0415

    evaluate_run(run_dir, overrides, ("validation", "test") if splits == "all" else (splits,))


@main.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path())
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--output", "-o", metavar="FILE",
              help="Write the rows to FILE: .csv, .jsonl or .npy by its extension (none: CSV), and the record to "
                   "FILE.json. Default: CSV on stdout.")
@click.option("--top-k", type=click.IntRange(1, None), default=3, show_default=True,
              help="Classes listed per row, most probable first (classifiers).")
@click.option("--batch-size", type=click.IntRange(1, None), metavar="N",
              help="Samples per step over all replicas. Default: the run's batch_size_per_replica x replicas.")
@_set_option_with("devices.cpu_logical_devices=2")
@click.option("--skip-bad", is_flag=True,
              help="Leave out image files that cannot be read (listed in the record) instead of failing.")
@handle_errors
def predict(run_dir: str, inputs: tuple[str, ...], output: str | None, top_k: int, batch_size: int | None,
            overrides: tuple[str, ...], skip_bad: bool) -> None:
    """Run RUN_DIR's model on new INPUTs: image files or folders, CSV files, .npy/.npz arrays.

    Inputs are read as the run's data source read them (image size, colour
    mode, interpolation; CSV columns by name), checked before TensorFlow
    starts, and predicted on the run's devices (--set devices.* to change).
    One row per input: its id, the predicted class, its probability and the
    top-k (regression: the value); with labels (class sub-folders, the CSV's
    label column, y in an .npz) also the label, and the accuracy in the record.
    """
    from .predict import predict as predict_inputs  # noqa: PLC0415

    predict_inputs(run_dir, inputs, output, top_k, batch_size, overrides, skip_bad)


_machine_option = click.option(
    "--machine", metavar="FILE",
    help="Plan for the machine described by FILE (written there by 'tfgpu devices --json') instead of this one.",
)


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_option
@_machine_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the config, the plan and (with RECIPE) what the run trains as JSON.")
@click.option("--launch", "for_launch", is_flag=True,
              help="Also show how 'tfgpu launch' passes each setting: by environment or by its bootstrap.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Plan as worker 0 of N local workers ('tfgpu run --workers N'); starts nothing.")
@click.option("--parallel", type=click.IntRange(1, 1024), metavar="K",
              help="With a sweep: section: plan the slots of 'tfgpu sweep --parallel K'.")
@handle_errors
def plan(recipe: str | None, overrides: tuple[str, ...], machine: str | None, as_json: bool, for_launch: bool,
         workers: int, parallel: int | None) -> None:
    """Check RECIPE and show what `run` / tfgpu.setup() would do, without importing TensorFlow.

    With RECIPE, first every check 'tfgpu run' makes before TensorFlow starts,
    with the same messages and exit codes (3 config, 5 data, 8 output): a
    model is defined, its layer, optimizer, loss and metric names exist in
    Keras, a model.builder's module can be found, and the data's local files
    are there and readable (--machine: the files are not checked). Then what
    the run trains (data, model, loss, optimizer, epochs, loop, batch) and the
    resolved config's effect: environment variables, tf.config calls in
    order, the strategy, replicas, per-replica and global batch, and
    warnings. Without RECIPE (or with --launch): only the plan of the file
    named by TFGPU_CONFIG, else the defaults. 'tfgpu run RECIPE --dry-run'
    goes further: it starts TensorFlow and runs the model on the data.
    With a sweep: section, also the sweep's slots: the devices each trial
    process gets ('tfgpu sweep').
    """
    from .plan import make_plan  # noqa: PLC0415
    from .preflight import check, describe_lines, describe_run  # noqa: PLC0415
    from .probe import load_facts, probe  # noqa: PLC0415

    from .launch import as_worker_zero, load_for_workers  # noqa: PLC0415

    cfg, _ = load_for_workers(recipe, overrides, workers)
    checked = recipe is not None and not for_launch  # what 'tfgpu run RECIPE' checks; a launched script has its own
    if checked:
        check(cfg, files=machine is None)
    machine_probe = load_facts(machine).machine if machine else probe()
    machine_probe = as_worker_zero(machine_probe, [12345 + i for i in range(workers)])  # example ports
    result = make_plan(cfg, machine_probe)
    run_block = {**describe_run(cfg, result), "files_checked": machine is None} if checked else None
    slots = None
    if cfg.sweep is not None:
        from .placement import plan_slots, slot_lines  # noqa: PLC0415
        from .sweep import prepare  # noqa: PLC0415

        if recipe:
            prepare(recipe, overrides, None, None)  # the parameters, as tfgpu sweep checks them
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        slots = plan_slots(cfg, machine_probe, parallel, cores)
    settings = None
    if for_launch:
        from .launch import launch_settings  # noqa: PLC0415

        settings = launch_settings(result, workers)
    if as_json:
        data = {"config": cfg.to_dict(), "machine": machine_probe.to_dict(), "plan": result.to_dict()}
        if run_block is not None:
            data["run"] = run_block
        if settings is not None:
            data["launch"] = [{"key": r.key, "how": r.how, "what": r.what} for r in settings]
        if slots is not None:
            data["sweep"] = {"trials": cfg.sweep.trials, "slots": [slot.to_dict() for slot in slots]}
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if machine:
        click.echo(f"Machine: {machine}")
    elif machine_probe.nvml_error:
        click.echo(f"NVML: {machine_probe.nvml_error} (planning for the CPU; 'tfgpu doctor' explains)")
    if run_block is not None:
        click.echo("\n".join(describe_lines(run_block)))
        if machine:
            click.echo("  (--machine: the output folder and the data files were not checked; they are that machine's)")
    click.echo(result.describe())
    if workers > 1:
        click.echo(f"(--workers {workers}: each worker gets its own TF_CONFIG with a free port; the ports above "
                   "are examples, and this is worker 0's plan)")
    if settings is not None:
        from .launch import describe_settings  # noqa: PLC0415

        click.echo(describe_settings(settings))
    if slots is not None:
        click.echo("\n".join(slot_lines(slots, cfg.sweep.trials)))


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_device_option
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON (input for 'plan --machine').")
@click.option("--no-tensorflow", is_flag=True,
              help="Do not start TensorFlow (instant: only NVML, and JAX with backend: jax).")
@click.option("--facts", "facts_file", metavar="FILE",
              help="Show the facts in FILE (written by 'tfgpu devices --json' or 'tfgpu doctor --json' on another "
                   "machine) instead of this machine's.")
@handle_errors
def devices(recipe: str | None, overrides: tuple[str, ...], as_json: bool, no_tensorflow: bool,
            facts_file: str | None) -> None:
    """List the GPUs (NVML: index, name, UUID, used/total MiB, compute capability,
    MIG mode, driver and its CUDA version), the MIG instances and which of them
    this process can use, and TensorFlow's physical and logical devices.

    NVML is read without TensorFlow; TensorFlow is started in a child process, so
    this works with no GPU and with a TensorFlow that cannot start. With RECIPE
    (or --set), its device settings are applied first, so the logical devices
    show its splits. With backend: jax (--set backend=jax), JAX is started in a
    child process too, with the config's JAX environment, and its version,
    CUDA plugin and devices are listed; TensorFlow is then started with its
    defaults, and not at all where it is not installed.
    """
    from .config import load_config  # noqa: PLC0415
    from .doctor import describe_facts  # noqa: PLC0415
    from .probe import (  # noqa: PLC0415
        Facts, load_facts, probe, probe_jax, probe_packages, probe_tensorflow, tensorflow_installed,
    )

    cfg = load_config(recipe, overrides=overrides) if (recipe or overrides) else None
    config = cfg.explicit_dict() if cfg is not None else None
    jax = cfg is not None and cfg.backend == "jax"
    if facts_file:
        facts = load_facts(facts_file, "--facts")
    else:
        packages = probe_packages()
        skip_tf = no_tensorflow or (jax and not tensorflow_installed(packages))
        # On JAX the config's device settings are JAX's: TensorFlow (used for data only) keeps its defaults.
        facts = Facts(machine=probe(), packages=packages,
                      tensorflow=None if skip_tf else probe_tensorflow(None if jax else config),
                      jax=probe_jax(config) if jax else None)
    if as_json:
        click.echo(json.dumps(facts.to_dict(), indent=2, default=str))
    else:
        click.echo(describe_facts(facts))


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_option_with("devices.memory_growth=true")
@click.option("--json", "as_json", is_flag=True, help="Print the findings and the facts as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors (for health checks).")
@click.option("--strict", is_flag=True, help="Exit 9 on warnings too.")
@click.option("--facts", "facts_file", metavar="FILE",
              help="Diagnose the facts in FILE (from 'tfgpu doctor --json' or 'tfgpu devices --json') "
                   "instead of this machine.")
@click.option("--no-tensorflow", is_flag=True, help="Do not start TensorFlow (skips the TensorFlow checks).")
@click.option("--log", "show_log", is_flag=True,
              help="Also print TensorFlow's start-up log, each line with whether 'tfgpu run' shows it at the "
                   "config's tensorflow.log_level and why it is harmless where that is known.")
@handle_errors
def doctor(recipe: str | None, overrides: tuple[str, ...], as_json: bool, quiet: bool, strict: bool,
           facts_file: str | None, no_tensorflow: bool, show_log: bool) -> None:
    """Find out why TensorFlow does not see or use the GPU, and how to fix it.

    Checks the platform, the NVIDIA driver and NVML, CUDA_VISIBLE_DEVICES, the
    TensorFlow packages and build, each CUDA/cuDNN library TensorFlow loads, the
    driver's CUDA version, each GPU's compute capability, what TensorFlow sees,
    memory in use, /dev/shm's size where NCCL would use it, and the tfgpu config (RECIPE, else TFGPU_CONFIG, else the
    defaults) against the GPUs. With backend: jax it also starts JAX (a child
    process) and checks jax, jaxlib, the CUDA plugin and JAX's devices;
    TensorFlow's GPU checks then stay silent (it only reads data), and so does
    a TensorFlow that is not installed. It names TensorFlow's start-up errors
    that are known to be harmless (--log: every start-up line, explained).
    Exits 9 when it finds an error.
    """
    from .config import load_config  # noqa: PLC0415
    from .doctor import Finding, describe_startup_log, diagnose, report, startup_lines  # noqa: PLC0415
    from .errors import ConfigError  # noqa: PLC0415
    from .probe import gather_facts, load_facts  # noqa: PLC0415

    findings_pre: list = []
    try:
        config = load_config(recipe, overrides=overrides)
    except ConfigError as exc:
        config = None
        findings_pre.append(Finding("config", "error", "tfgpu config", exc.message, exc.hint))
    jax = config is not None and config.backend == "jax"
    facts = (load_facts(facts_file, "--facts") if facts_file
             else gather_facts(tensorflow=not no_tensorflow, jax=jax))
    findings = diagnose(facts, config) + findings_pre
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    if as_json:
        data = {"errors": errors, "warnings": warnings, "findings": [f.to_dict() for f in findings],
                "facts": facts.to_dict()}
        if show_log:
            data["startup_log"] = startup_lines(facts, config)
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        text = report(findings, quiet=quiet)
        if text:
            click.echo(text)
        if show_log:
            click.echo(describe_startup_log(facts, config))
    if errors or (strict and warnings):
        sys.exit(9)


@main.command("runs", context_settings=CONTEXT)
@click.argument("directory", metavar="[DIR]", type=click.Path(), default="runs", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON (a list, oldest first).")
@handle_errors
def runs(directory: str, as_json: bool) -> None:
    """List the run directories under DIR (default: runs), oldest first.

    \b
    tfgpu runs                                        the runs under runs/
    tfgpu runs runs/ --json                           the same as JSON

    One line per run: status (a "running" whose process has ended shows as
    stale), recipe, start time, epochs done/planned, the main metric (its
    validation copy, e.g. val_accuracy) at its best epoch and at the last one,
    wall time, steady-state training samples/s and the devices. Run
    directories are found below DIR too (a sweep's trials/), without entering
    a run's own folders. Reads only the files; TensorFlow is not started.
    """
    from .compare import as_json as to_json, describe_runs, list_runs  # noqa: PLC0415

    rows = list_runs(directory)
    click.echo(to_json(rows) if as_json else describe_runs(rows, directory))


@main.command(context_settings=CONTEXT)
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN RUN...", type=click.Path())
@click.option("--plot", "plot_file", metavar="FILE.png",
              help="Also draw the learning curves (loss and the main metric per epoch, train solid, validation "
                   "dashed) into FILE (.png; .svg, .pdf). Needs pip install 'tfgpu[plots]'.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison (and the plot's curves) as JSON.")
@handle_errors
def compare(run_dirs: tuple[str, ...], plot_file: str | None, as_json: bool) -> None:
    """Compare two or more runs: the settings that differ, the metrics side by side, the learning curves.

    \b
    tfgpu compare runs/a runs/b                       settings and metrics as text
    tfgpu compare runs/a runs/b --plot curves.png     and the curves as a picture

    The settings are every key of each run's config.resolved.yaml, as dotted
    keys (model.optimizer.learning_rate); only those whose values differ are
    shown. Each metric's final value (the last epoch's; test_*: the test
    split's) and its best over the epochs (the highest, or the lowest for
    losses and errors) with its epoch. Reads only the files; TensorFlow is not
    started.
    """
    from .compare import as_json as to_json, check_plot_file, compare_runs, describe_comparison  # noqa: PLC0415
    from .compare import plot_curves  # noqa: PLC0415

    if plot_file is not None:
        check_plot_file(plot_file)
    comparison = compare_runs(run_dirs)
    plot = plot_curves(comparison["runs"], plot_file, comparison["main_metric"]) if plot_file else None
    if as_json:
        click.echo(to_json({**comparison, "plot": plot}))
    else:
        click.echo(describe_comparison(comparison, plot))


@main.group(context_settings=CONTEXT)
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


def _write(text: str, output: str | None) -> None:
    if output is None:
        click.echo(text, nl=False)
        return
    from pathlib import Path  # noqa: PLC0415

    from .errors import OutputError  # noqa: PLC0415

    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"--output: cannot write '{output}': {exc.strerror or exc}.",
                          "give a writable file path, or leave --output out to print.") from None
    click.echo(f"tfgpu: wrote {output}", err=True)


class _Checked(click.ParamType):
    """A string checked (and perhaps rewritten) by a function of :mod:`tfgpu.export` that raises ``ValueError``."""

    def __init__(self, name: str, check: str, *args: str) -> None:
        self.name, self._check, self._args = name, check, args

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from . import export as export_lib  # noqa: PLC0415

        try:
            return getattr(export_lib, self._check)(str(value), *self._args)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


_output_option = click.option("--output", "-o", metavar="FILE", help="Write to FILE instead of printing.")
_export_set_option = _set_option_with("train.epochs=20")
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
    from .config import load_config  # noqa: PLC0415
    from .export import slurm_script  # noqa: PLC0415

    cfg = load_config(recipe, overrides=[*overrides, "distribute.strategy=multi_worker_mirrored"])
    signal = cfg.train.checkpoint.requeue_signal if cfg.train.checkpoint.enabled else None
    _write(slurm_script(recipe, overrides, workers, gpus_per_worker, cfg.distribute.port, time_limit, partition,
                        name, cfg.output.dir, signal), output)


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
    from .config import load_config  # noqa: PLC0415
    from .export import tfjob_manifest, tfjob_notes  # noqa: PLC0415
    from .results import given_yaml  # noqa: PLC0415

    cfg = load_config(recipe, overrides=[*overrides, "distribute.strategy=multi_worker_mirrored"])
    # The settings as given, not every default (as a run's config.yaml): the pods plan them as
    # `tfgpu run RECIPE` would here.
    recipe_yaml = given_yaml(cfg)
    _write(tfjob_manifest(recipe, recipe_yaml, overrides, image, workers, gpus_per_worker, name, data_pvc, runs_pvc),
           output)
    for note in tfjob_notes(data_pvc, runs_pvc):
        if note.startswith("WARNING: "):
            click.echo(f"tfgpu: warning: {note[len('WARNING: '):]}", err=True)


def _artifact_command(fmt: str, default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The shared arguments of ``export savedmodel|onnx|litert`` (:mod:`tfgpu.artifacts`)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = handle_errors(func)
        func = click.option("--output", "-o", metavar="PATH",
                            help=f"Where to write.  [default: {default}]")(func)
        func = _set_option_with("data.path=new/place.csv")(func)
        func = click.argument("run_dir", type=click.Path())(func)
        return export.command(fmt, context_settings=CONTEXT)(func)

    return decorate


def _artifact(run_dir: str, fmt: str, output: str | None, overrides: tuple[str, ...],
              version: int | None = None) -> None:
    from .artifacts import export_artifact  # noqa: PLC0415

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


# bench.py imports only the standard library at module level (TensorFlow inside its functions).
from .bench import DEFAULT_SIZES as _DEFAULT_SIZES, MAX_SIZE as _MAX_SIZE  # noqa: E402


class _Sizes(click.ParamType):
    """Comma-separated matrix sides, e.g. ``256,512,1024``: each an integer from 1 to 65536."""

    name = "N,N,..."

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        sizes = []
        for part in parts:
            try:
                n = int(part)
            except ValueError:
                n = 0
            if not 1 <= n <= _MAX_SIZE or not part.isdigit():
                where = f" (in {value!r})" if len(parts) > 1 else ""
                self.fail(f"{part!r}{where} is not a matrix size; expected comma-separated integers "
                          f"from 1 to {_MAX_SIZE}, e.g. --sizes 256,512,1024.", param, ctx)
            sizes.append(n)
        return tuple(sizes)


_SIZE = click.IntRange(1, _MAX_SIZE)
_repeats_option = click.option(
    "--repeats", type=click.IntRange(min=1), default=5, show_default=True,
    help="Timed runs of each measurement, after one untimed warm-up; the median is reported.",
)
_bench_json_option = click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")


@main.group(context_settings=CONTEXT)
def bench() -> None:
    """Time your hardware: the timing exercises of the d2l.ai "GPUs" chapter.

    \b
    tfgpu bench matmul                    matmul ms and GFLOP/s per device and size
    tfgpu bench logging                   logging a norm to the host per step vs on the device
    tfgpu bench devices --set devices.cpu_logical_devices=2
                                          the same work on one device vs split across devices

    Each applies RECIPE's device settings (or --set; default: the defaults)
    first, so its logical devices are timed, and prints a table (--json: the
    data). All three work on a machine without a GPU.
    """


def _bench_setup(recipe: str | None, overrides: tuple[str, ...]) -> dict[str, Any]:
    from .bench import configure, environment  # noqa: PLC0415

    configure(recipe, overrides)
    return environment()


@bench.command("matmul", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_device_option
@click.option("--sizes", type=_Sizes(), default=",".join(map(str, _DEFAULT_SIZES)), show_default=True,
              help="Matrix sides n (comma-separated): (n, n) @ (n, n) float32.")
@_repeats_option
@_bench_json_option
@handle_errors
def bench_matmul(recipe: str | None, overrides: tuple[str, ...], sizes: tuple[int, ...], repeats: int,
                 as_json: bool) -> None:
    """Matmul time (ms) and GFLOP/s per device and size.

    Square float32 (n, n) @ (n, n) on each logical device (the CPUs, then the
    GPUs): median time per matmul in ms (min-max beside it) and GFLOP/s =
    2 n^3 / time.
    """
    from .bench import bench_matmul as measure, describe_environment, describe_matmul  # noqa: PLC0415

    env = _bench_setup(recipe, overrides)
    rows = measure(sizes, repeats)
    if as_json:
        click.echo(json.dumps({**env, "repeats": repeats, "rows": [r.to_dict() for r in rows]}, indent=2))
    else:
        click.echo(describe_environment(env))
        click.echo(describe_matmul(rows, repeats))


@bench.command("logging", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_device_option
@click.option("--steps", type=click.IntRange(min=1), default=1000, show_default=True, help="Matmuls per run.")
@click.option("--size", type=_SIZE, default=100, show_default=True, help="Matrix side n (float32).")
@_repeats_option
@_bench_json_option
@handle_errors
def bench_logging(recipe: str | None, overrides: tuple[str, ...], steps: int, size: int, repeats: int,
                  as_json: bool) -> None:
    """Log a norm per step to the host vs on the device.

    STEPS float32 (SIZE, SIZE) matmuls, logging each result's Frobenius norm:
    to the host every step (float(), one device-to-host transfer per step),
    or kept on the device and transferred once at the end. Runs on the first
    GPU, else the CPU.
    """
    from .bench import bench_logging as measure, describe_environment, describe_logging  # noqa: PLC0415

    env = _bench_setup(recipe, overrides)
    result = measure(steps, size, repeats)
    if as_json:
        click.echo(json.dumps({**env, "repeats": repeats, **result.to_dict()}, indent=2))
    else:
        click.echo(describe_environment(env))
        click.echo(describe_logging(result))


@bench.command("devices", context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_device_option
@click.option("--size", type=_SIZE, default=2048, show_default=True, help="Matrix side n (float32).")
@_repeats_option
@_bench_json_option
@handle_errors
def bench_devices(recipe: str | None, overrides: tuple[str, ...], size: int, repeats: int, as_json: bool) -> None:
    """Same matmuls on one device vs split across all.

    Independent float32 (SIZE, SIZE) matmul chains, one per device (at least
    two), run in sequence on the first device, then one per device launched
    together. Uses the logical GPUs if there are any, else the logical CPUs; split one
    with --set devices.cpu_logical_devices=2 (or devices.gpu_logical_devices).
    """
    from .bench import bench_devices as measure, describe_devices, describe_environment  # noqa: PLC0415

    env = _bench_setup(recipe, overrides)
    result = measure(size, repeats)
    if as_json:
        click.echo(json.dumps({**env, "repeats": repeats, **result.to_dict()}, indent=2))
    else:
        click.echo(describe_environment(env))
        click.echo(describe_devices(result))


if __name__ == "__main__":  # pragma: no cover
    main()
