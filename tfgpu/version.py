"""tfgpu's version (``tfgpu.__version__``; setup.cfg reads it from here)."""

__version__ = "0.1.0"
