"""STUDY"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Optional
from ..config import Config
from ..config.schema import PRUNERS, SAMPLERS
from ..errors import ConfigError, SweepError
from ..utils.console import say
from ..utils.urls import masked, redact


#: The trial process's link to its study: JSON ``{"storage", "study", "trial_id", "number", "metric", "pruner"}``.
TRIAL_ENV = "TFGPU_SWEEP_TRIAL"


def import_optuna() -> Any:
    try:
        import optuna  # noqa: PLC0415
    except ImportError:
        raise ConfigError(
            "tfgpu sweep runs its study with Optuna, which is not installed (received a recipe with a sweep: "
            "section).", "install it: pip install 'tfgpu[sweep]'.") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distribution(kind: str, args: Any) -> Any:
    """One ``sweep.parameters`` entry as an Optuna distribution (``optuna.distributions``)."""
    d = import_optuna().distributions
    if kind == "choice":
        return d.CategoricalDistribution(list(args))
    if kind in ("int", "log_int"):
        return d.IntDistribution(int(args[0]), int(args[1]), log=kind == "log_int")
    return d.FloatDistribution(float(args[0]), float(args[1]), log=kind == "log_uniform")


def distributions(cfg: Config) -> dict[str, Any]:
    """``sweep.parameters`` -> ``{key: optuna distribution}``."""
    return {key: distribution(*next(iter(spec.items()))) for key, spec in cfg.sweep.parameters.items()}


def _spec(value: Any) -> tuple[str, dict[str, Any]]:
    return (value, {}) if isinstance(value, str) else (next(iter(value)), dict(next(iter(value.values())) or {}))


def _construct(module: Any, names: dict[str, str], value: Any, key: str, **extra: Any) -> Any:
    name, args = _spec(value)
    cls = getattr(module, names[name])
    try:
        return cls(**{**extra, **args})
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{key}: optuna.{module.__name__.split('.')[-1]}.{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in args.items())}) "
            f"was refused: {exc}.",
            f"give {name} only the arguments its Optuna class takes "
            f"(https://optuna.readthedocs.io/en/stable/reference/{module.__name__.split('.')[-1]}.html).") from None


def session_seed(cfg: Config, trials_before: int, salt: str = "") -> Optional[int]:
    """The seed one sweep process gives its sampler (``sweep.json``'s ``sampler_seed``).

    Optuna's samplers (https://optuna.readthedocs.io/en/stable/reference/samplers/index.html) keep their random
    state in memory only: ``optuna.samplers.RandomSampler(seed)``, and ``TPESampler(seed)`` whose startup trials
    are a ``RandomSampler``'s, draw the same sequence from the same seed, so a resumed sweep whose sampler got
    ``sweep.seed`` again would draw the points already tried, in the same order. The seed is therefore
    ``sweep.seed`` plus ``trials_before``, the study's trials (of every state) when this process opened it,
    plus, for a process that shares the study with others (``salt``: its sweep directory), the CRC-32 of
    ``salt``; modulo 2**32. A new study gets ``sweep.seed`` itself, and a resumed one a seed that only its
    history decides: it draws new points, the same ones each time the same history is resumed.

    ``grid`` gets ``sweep.seed`` unchanged: ``optuna.samplers.GridSampler`` gives trial N the N-th point of the
    grid shuffled with its seed, so every process and session must shuffle alike (then no point is drawn twice).
    ``None`` when ``sweep.seed`` is null: Optuna seeds from the system.
    """
    seed = cfg.sweep.seed
    if seed is None or cfg.sweep.sampler_name == "grid":
        return seed
    if salt:  # processes sharing a study must not all draw the same points
        import zlib  # noqa: PLC0415

        seed += zlib.crc32(salt.encode())
    return (seed + trials_before) % 2**32


def sampler(cfg: Config, seed: Optional[int] = None) -> Any:
    """``sweep.sampler`` as an ``optuna.samplers`` object, seeded with ``seed`` (default ``sweep.seed``; a
    sweep gives :func:`session_seed`).

    ``grid``: ``optuna.samplers.GridSampler`` without its stop: Optuna's ``after_trial`` calls
    ``Study.stop()`` when the grid is used up, which raises outside ``Study.optimize`` (the sweep asks and
    tells, and stops at the grid's size itself, :func:`grid_size`).
    """
    optuna = import_optuna()
    name, _ = _spec(cfg.sweep.sampler)
    seed = cfg.sweep.seed if seed is None else seed
    if name == "grid":
        space = {}
        for key, spec in cfg.sweep.parameters.items():
            kind, args = next(iter(spec.items()))
            if kind != "choice":
                raise ConfigError(
                    f"sweep.sampler: grid tries every combination of listed values, but sweep.parameters.{key} is "
                    f"{kind} {args} (a range).", f"write {key} as choice: [...], or use sampler: tpe or random.")
            space[key] = list(args)
        return _construct(_GridModule(optuna.samplers), SAMPLERS, cfg.sweep.sampler, "sweep.sampler",
                          search_space=space, seed=seed)
    return _construct(optuna.samplers, SAMPLERS, cfg.sweep.sampler, "sweep.sampler", seed=seed)


class _GridModule:
    """``optuna.samplers`` with ``GridSampler`` replaced by one whose ``after_trial`` does not stop the study."""

    def __init__(self, module: Any) -> None:
        self.__name__ = module.__name__

        class GridSampler(module.GridSampler):
            def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
                pass  # (GridSampler's own calls study.stop(), which raises outside Study.optimize)

        self.GridSampler = GridSampler


def pruner(spec: Any) -> Any:
    """``sweep.pruner`` (``name`` or ``{name: {arguments}}``) as an ``optuna.pruners`` object."""
    return _construct(import_optuna().pruners, PRUNERS, spec, "sweep.pruner")


def grid_size(cfg: Config) -> Optional[int]:
    """The number of combinations of a grid sweep, else ``None``."""
    if cfg.sweep.sampler_name != "grid":
        return None
    return math.prod(len(next(iter(spec.values()))) for spec in cfg.sweep.parameters.values())


#: Where ``tfgpu sweep --resume`` finds a database URL with credentials (``sweep.json`` keeps it masked).
STORAGE_ENV = "TFGPU_SWEEP_STORAGE"


def open_storage(spec: str) -> Any:
    """A storage for ``spec``: a database URL (``sqlite:///``, ``postgresql://``, ``mysql://``: Optuna's
    ``RDBStorage``) or a journal file's path (``JournalStorage(JournalFileBackend(path))``).

    Raises:
        SweepError: the storage cannot be opened.
    """
    optuna = import_optuna()
    try:
        if "://" in spec:
            return optuna.storages.RDBStorage(spec)
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(spec))
    except Exception as exc:  # SQLAlchemy's, the driver's and OSError: all mean "cannot open it"
        raise SweepError(
            f"--storage: the study's storage {masked(spec)!r} cannot be opened: "
            f"{redact(str(exc).splitlines()[0], spec) if str(exc) else type(exc).__name__}.",
            "give a journal file path, or a database URL Optuna supports (sqlite:///FILE.db, "
            "postgresql://USER:PASSWORD@HOST/DB, mysql+pymysql://...) whose server is up and whose driver is "
            "installed.") from None


def trial_callbacks(run: Any, logged: dict[str, str], chief: bool) -> list:
    """The callback a sweep's trial reports through (``TFGPU_SWEEP_TRIAL`` set), else ``[]``.

    After each epoch it reports the sweep's metric to the study (``optuna.trial.Trial.report``, step = the
    epoch) and, when the pruner says so (``should_prune``), records ``pruned_at_epoch`` on the trial and
    stops training (``model.stop_training``: the run ends ``completed``, with fewer epochs).

    Raises:
        ConfigError: the sweep's metric is not one the run logs.
    """
    spec = os.environ.get(TRIAL_ENV)
    if not spec or not chief:
        return []
    import keras  # noqa: PLC0415

    link = json.loads(spec)
    metric = link["metric"]
    if metric not in logged and not metric.startswith("test_"):
        raise ConfigError(
            f"sweep.metric: the run does not log {metric!r} (received {metric!r}); it logs "
            f"{', '.join(sorted(logged))}.", "set sweep.metric to one of those.")
    optuna = import_optuna()
    storage = open_storage(link["storage"])
    # (the pruner is not kept in the storage: each process that asks it must be given it)
    study = optuna.load_study(study_name=link["study"], storage=storage, pruner=pruner(link.get("pruner", "median")))
    trial = optuna.trial.Trial(study, link["trial_id"])

    class Report(keras.callbacks.Callback):
        """Report ``metric`` to the study after each epoch; stop the trial when the pruner says so."""

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            row = run.epochs.rows[-1] if run.epochs.rows else (logs or {})
            value = row.get(metric, (logs or {}).get(metric))
            if value is None or not math.isfinite(float(value)):
                return
            import warnings  # noqa: PLC0415

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a resumed trial reports its epoch again: Optuna keeps the first
                trial.report(float(value), epoch)
            if trial.should_prune():
                storage.set_trial_user_attr(link["trial_id"], "pruned_at_epoch", epoch)
                say(f"sweep: trial {link['number']} pruned after epoch {epoch + 1} ({metric} {float(value):.4f}); "
                    "stopping")
                self.model.stop_training = True

    return [Report()]
