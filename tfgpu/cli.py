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
            click.echo(f"tfgpu: {exc.kind}: {exc.message}", err=True)
            if exc.hint:
                click.echo(f"Fix: {exc.hint}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            if _debug_wanted(debug):
                traceback.print_exc()
            click.echo("tfgpu: interrupted.", err=True)
            sys.exit(130)

    return click.option("--debug", is_flag=True, help="Print the traceback of errors (or set TFGPU_DEBUG=1).")(wrapper)


_set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a config key, e.g. --set train.epochs=3 (value read as YAML; repeatable).",
)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="tfgpu")
def main() -> None:
    """TensorFlow/Keras on GPUs, correctly and fast, from one YAML file.

    \b
    tfgpu run recipes/mnist.yaml                      train a recipe
    tfgpu run recipes/mnist.yaml --set train.loop=custom
    tfgpu plan recipes/mnist.yaml                     show what would be applied
    tfgpu devices                                     GPUs (NVML) and TensorFlow's devices
    tfgpu doctor                                      why TensorFlow does not see the GPU

    Exit codes: 0 ok, 2 usage, 3 config, 4 device, 5 data, 6 TensorFlow already
    initialised, 7 training failed, 8 output not writable, 9 doctor found an
    error, 130 interrupted.
    """


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path())
@_set_option
@click.option("--output-dir", metavar="DIR", help="Parent of the run directory (overrides output.dir).")
@handle_errors
def run(recipe: str, overrides: tuple[str, ...], output_dir: str | None) -> None:
    """Train RECIPE's model under its tf.distribute strategy and write a run directory."""
    from .runner import run as run_recipe  # noqa: PLC0415

    run_recipe(recipe, overrides, output_dir)


_machine_option = click.option(
    "--machine", metavar="FILE",
    help="Plan for the machine described by FILE (written there by 'tfgpu devices --json') instead of this one.",
)


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_option
@_machine_option
@click.option("--json", "as_json", is_flag=True, help="Print the config and the plan as JSON.")
@handle_errors
def plan(recipe: str | None, overrides: tuple[str, ...], machine: str | None, as_json: bool) -> None:
    """Show what `run` / tfgpu.setup() would apply for RECIPE, without importing TensorFlow.

    Prints the resolved config's effect: environment variables, tf.config calls in
    order, the strategy, replicas, per-replica and global batch, and warnings.
    Without RECIPE: the file named by TFGPU_CONFIG, else the defaults.
    """
    from .config import load_config  # noqa: PLC0415
    from .plan import make_plan  # noqa: PLC0415
    from .probe import load_facts, probe  # noqa: PLC0415

    cfg = load_config(recipe, overrides=overrides)
    machine_probe = load_facts(machine).machine if machine else probe()
    result = make_plan(cfg, machine_probe)
    if as_json:
        click.echo(json.dumps({"config": cfg.to_dict(), "machine": machine_probe.to_dict(), "plan": result.to_dict()},
                              indent=2, default=str))
        return
    if machine:
        click.echo(f"Machine: {machine}")
    elif machine_probe.nvml_error:
        click.echo(f"NVML: {machine_probe.nvml_error} (planning for the CPU; 'tfgpu doctor' explains)")
    click.echo(result.describe())


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_option
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON (input for 'plan --machine').")
@click.option("--no-tensorflow", is_flag=True, help="Only NVML: do not start TensorFlow (instant).")
@handle_errors
def devices(recipe: str | None, overrides: tuple[str, ...], as_json: bool, no_tensorflow: bool) -> None:
    """List the GPUs (NVML: index, name, UUID, used/total MiB, compute capability,
    driver and its CUDA version) and TensorFlow's physical and logical devices.

    NVML is read without TensorFlow; TensorFlow is started in a child process, so
    this works with no GPU and with a TensorFlow that cannot start. With RECIPE
    (or --set), its device settings are applied first, so the logical devices
    show its splits.
    """
    from .config import load_config  # noqa: PLC0415
    from .doctor import describe_facts  # noqa: PLC0415
    from .probe import Facts, probe, probe_packages, probe_tensorflow  # noqa: PLC0415

    config = load_config(recipe, overrides=overrides).explicit_dict() if (recipe or overrides) else None
    facts = Facts(machine=probe(), packages=probe_packages(),
                  tensorflow=None if no_tensorflow else probe_tensorflow(config))
    if as_json:
        click.echo(json.dumps(facts.to_dict(), indent=2, default=str))
    else:
        click.echo(describe_facts(facts))


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(), required=False)
@_set_option
@click.option("--json", "as_json", is_flag=True, help="Print the findings and the facts as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors (for health checks).")
@click.option("--strict", is_flag=True, help="Exit 9 on warnings too.")
@click.option("--facts", "facts_file", metavar="FILE",
              help="Diagnose the facts in FILE (from 'tfgpu doctor --json' or 'tfgpu devices --json') "
                   "instead of this machine.")
@click.option("--no-tensorflow", is_flag=True, help="Do not start TensorFlow (skips the TensorFlow checks).")
@handle_errors
def doctor(recipe: str | None, overrides: tuple[str, ...], as_json: bool, quiet: bool, strict: bool,
           facts_file: str | None, no_tensorflow: bool) -> None:
    """Find out why TensorFlow does not see or use the GPU, and how to fix it.

    Checks the platform, the NVIDIA driver and NVML, CUDA_VISIBLE_DEVICES, the
    TensorFlow packages and build, each CUDA/cuDNN library TensorFlow loads, the
    driver's CUDA version, each GPU's compute capability, what TensorFlow sees,
    memory in use, and the tfgpu config (RECIPE, else TFGPU_CONFIG, else the
    defaults) against the GPUs. Exits 9 when it finds an error.
    """
    from .config import load_config  # noqa: PLC0415
    from .doctor import Finding, diagnose, report  # noqa: PLC0415
    from .errors import ConfigError  # noqa: PLC0415
    from .probe import gather_facts, load_facts  # noqa: PLC0415

    findings_pre: list = []
    try:
        config = load_config(recipe, overrides=overrides)
    except ConfigError as exc:
        config = None
        findings_pre.append(Finding("config", "error", "tfgpu config", exc.message, exc.hint))
    facts = load_facts(facts_file, "--facts") if facts_file else gather_facts(tensorflow=not no_tensorflow)
    findings = diagnose(facts, config) + findings_pre
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    if as_json:
        click.echo(json.dumps({"errors": errors, "warnings": warnings, "findings": [f.to_dict() for f in findings],
                               "facts": facts.to_dict()}, indent=2, default=str))
    else:
        text = report(findings, quiet=quiet)
        if text:
            click.echo(text)
    if errors or (strict and warnings):
        sys.exit(9)


if __name__ == "__main__":  # pragma: no cover
    main()
