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

    Exit codes: 0 ok, 2 usage, 3 config, 4 device, 5 data, 6 TensorFlow already
    initialised, 7 training failed, 8 output not writable, 130 interrupted.
    """


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(dir_okay=False))
@_set_option
@click.option("--output-dir", metavar="DIR", help="Parent of the run directory (overrides output.dir).")
@handle_errors
def run(recipe: str, overrides: tuple[str, ...], output_dir: str | None) -> None:
    """Train RECIPE's model under its tf.distribute strategy and write a run directory."""
    from .runner import run as run_recipe  # noqa: PLC0415

    run_recipe(recipe, overrides, output_dir)


@main.command(context_settings=CONTEXT)
@click.argument("recipe", type=click.Path(dir_okay=False), required=False)
@_set_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@handle_errors
def plan(recipe: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Show what `run` / tfgpu.setup() would apply for RECIPE, without importing TensorFlow.

    Without RECIPE: the file named by TFGPU_CONFIG, else the defaults.
    """
    from .config import load_config  # noqa: PLC0415
    from .plan import make_plan  # noqa: PLC0415
    from .probe import probe  # noqa: PLC0415

    cfg = load_config(recipe, overrides=overrides)
    result = make_plan(cfg, probe())
    if as_json:
        click.echo(json.dumps({"config": cfg.to_dict(), "plan": result.to_dict()}, indent=2, default=str))
    else:
        click.echo(result.describe())


if __name__ == "__main__":  # pragma: no cover
    main()
