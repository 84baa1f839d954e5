"""What every ``tfgpu`` command shares: errors to exit codes (``--debug``), ``--set`` and the common options."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from typing import Any, Callable

import click



CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}



def _debug_wanted(debug: bool) -> bool:
    return debug or os.environ.get("TFGPU_DEBUG", "") not in ("", "0")



def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Map tfgpu errors to their exit codes with a one-paragraph message (traceback with --debug)."""

    @functools.wraps(func)
    def wrapper(*args: Any, debug: bool = False, **kwargs: Any) -> Any:
        from ..errors import TfgpuError  # noqa: PLC0415

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
        except BrokenPipeError:
            # the reader of stdout went away (``tfgpu predict RUN x.npy | head -3``): stop quietly with 141, as a
            # command that SIGPIPE ends would, and send what is still buffered nowhere (Python's recipe:
            # https://docs.python.org/3/library/signal.html#note-on-sigpipe)
            from ..errors import BROKEN_PIPE  # noqa: PLC0415

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(BROKEN_PIPE)

    return click.option("--debug", is_flag=True, help="Print the traceback of errors (or set TFGPU_DEBUG=1).")(wrapper)



def _check_overrides(ctx: click.Context, param: Any, items: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse a malformed ``--set`` item before the command starts: exit 2 (a usage error) with tfgpu's message."""
    from ..config.source import parse_override  # noqa: PLC0415
    from ..errors import UsageError  # noqa: PLC0415

    for item in items:
        try:
            parse_override(item)
        except UsageError as exc:
            click.echo(exc.report(), err=True)
            ctx.exit(exc.exit_code)
    return items



def set_option_with(example: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--set KEY=VALUE`` option (repeatable), its help giving ``example``: a key that fits the command."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", callback=_check_overrides,
                        help=f"Override a config key, e.g. --set {example} (value read as YAML; repeatable).")



set_option = set_option_with("train.epochs=3")  # run, plan



set_device_option = set_option_with("devices.cpu_logical_devices=2")  # devices, bench



workers_option = click.option(
    "--workers", type=click.IntRange(1, 64), default=1, show_default=True,
    help="Start N local worker processes on 127.0.0.1 (MultiWorkerMirroredStrategy), each with its TF_CONFIG.")



machine_option = click.option(
    "--machine", metavar="FILE",
    help="Plan for the machine described by FILE (written there by 'tfgpu devices --json') instead of this one.",
)
