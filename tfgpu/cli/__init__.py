"""The ``tfgpu`` command line: one thin module per command or command group, over the library.

Each module parses its options, calls one library function and prints what it returns
(:mod:`.run`, :mod:`.sweep`, :mod:`.launch`, :mod:`.evaluate`, :mod:`.predict`, :mod:`.plan`,
:mod:`.devices`, :mod:`.doctor`, :mod:`.runs` (runs, compare), :mod:`.export`, :mod:`.bench`);
:mod:`.main` is the group they are registered on, and :mod:`.common` maps tfgpu's errors to their
exit codes with a one-paragraph message (a traceback only with ``--debug``). Nothing heavy is imported
when a command module loads, so ``tfgpu --help`` and ``tfgpu plan`` stay fast. This package is the
top of the import order: nothing in tfgpu imports it.
"""

from .main import main

__all__ = ["main"]
