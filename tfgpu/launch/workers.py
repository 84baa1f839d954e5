"""Worker processes: prepare each child's command and environment (pure), then start and supervise them.

Two kinds of children, for the two commands that start them:

- ``tfgpu run RECIPE --workers N``: N ``python -m tfgpu run RECIPE ...``
  processes, each with its own ``TF_CONFIG`` (127.0.0.1, free ports) and
  ``TFGPU_RUN_DIR`` (the run directory the chief writes);
- ``tfgpu launch [RECIPE] [--workers N] -- script.py ARGS``: N (default 1)
  ``python -m tfgpu.launch.bootstrap script.py ARGS`` processes: the settings
  TensorFlow reads from the environment travel in it (:func:`launch_settings`
  says which), the rest is applied by :mod:`tfgpu.launch.bootstrap` (``tfgpu.setup()``
  from ``TFGPU_CONFIG``) before the script runs as ``__main__``.

:func:`prepare_run` and :func:`prepare_launch` start nothing: they return
:class:`Child` descriptions (tested as data). :class:`Supervisor` starts them,
copies each one's output to its log (the chief's also to this terminal),
forwards Ctrl-C, SIGTERM and the requeue signal (caught by a
:class:`Forwarding` for the supervisor's whole life, restarts included), and
when one fails stops the others and says which failed and why; the exit code
follows :func:`tfgpu.errors.worker_exit_code`, the one rule for both
commands. Every child dies with the supervisor, even when it is SIGKILLed
(:func:`die_with_parent`). It is one object with ``start``/``wait``/``stop``
so that restarts can be added around it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TextIO

from ..cluster.spec import local_cluster, tf_config
from ..errors import ConfigError, EXIT_CODES, WorkerError, worker_exit_code
from ..model.transfer import check_workers

#: In each child's environment: the supervisor's pid (set by :meth:`Supervisor.start`, read by :func:`die_with_parent`).
PARENT_ENV = "TFGPU_SUPERVISOR_PID"
#: For tests only: the command that starts each ``tfgpu run --workers N`` worker in place of ``sys.executable``
#: (split like a shell line), e.g. a wrapper that injects a fault (tests/scripts/worker_fault.py).
WORKER_PYTHON_ENV = "TFGPU_WORKER_PYTHON"


def multi_worker_overrides(cfg: Any, workers: int) -> list[str]:
    """The overrides that turn a recipe into ``workers`` local workers' recipe, or why it cannot be.

    ``auto``, ``mirrored`` and ``multi_worker_mirrored`` become
    ``multi_worker_mirrored`` (MirroredStrategy across machines).

    Raises:
        ConfigError: a single-device strategy, ``train.unfreeze`` (:func:`tfgpu.model.transfer.check_workers`), or an
            explicit ``distribute.cluster``.
    """
    strategy = cfg.distribute.strategy
    if strategy in ("one_device", "default"):
        raise ConfigError(
            f"--workers {workers} with distribute.strategy: {strategy} (received {strategy}): that strategy trains "
            "one replica in one process, so the other workers would have nothing to do.",
            "set distribute.strategy to mirrored, multi_worker_mirrored or auto, or drop --workers.")
    check_workers(cfg, workers)  # train.unfreeze
    if cfg.distribute.cluster is not None:
        raise ConfigError(
            f"--workers {workers} with distribute.cluster set (received {len(cfg.distribute.cluster.workers)} "
            "workers): --workers starts its own local workers on 127.0.0.1, the cluster names others.",
            "remove distribute.cluster to train on local workers, or start each listed worker yourself.")
    return ["distribute.strategy=multi_worker_mirrored"]


def load_for_workers(recipe: Optional[str], overrides: Sequence[str], workers: int) -> tuple[Any, list[str]]:
    """The config (and overrides) for ``workers`` local workers: :func:`multi_worker_overrides` added when N > 1."""
    from ..config import load_config  # noqa: PLC0415

    cfg = load_config(recipe, overrides=overrides)
    if workers <= 1:
        return cfg, list(overrides)
    overrides = [*overrides, *multi_worker_overrides(cfg, workers)]
    return load_config(recipe, overrides=overrides), overrides


@dataclass(frozen=True)
class Child:
    """One process to start.

    Attributes:
        index: the worker's index (0 is the chief).
        argv: the command, e.g. ``(sys.executable, "-m", "tfgpu", "run", ...)``.
        env: its whole environment.
        log: the file its output goes to (``None``: this terminal).
        stdin: whether it reads this process's stdin (the chief only).
    """

    index: int
    argv: tuple[str, ...]
    env: dict[str, str]
    log: Optional[Path] = None
    stdin: bool = False


def as_worker_zero(machine: Any, ports: Sequence[int]) -> Any:
    """``machine`` (a :class:`~tfgpu.devices.probe.Probe`) as worker 0 of local workers at ``ports`` sees it (its
    ``TF_CONFIG``), for planning before they start; unchanged for fewer than two ports."""
    if len(ports) < 2:
        return machine
    import dataclasses  # noqa: PLC0415

    return dataclasses.replace(machine, env={**machine.env, "TF_CONFIG": tf_config(local_cluster(list(ports), 0))})


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (bound, read, released)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True)
class Setting:
    """How one setting reaches a launched script: ``how`` is ``"environment"`` or ``"bootstrap"``."""

    key: str
    how: str
    what: str


def launch_env(plan: Any) -> dict[str, str]:
    """The environment variables a launched script gets from the plan (before its TensorFlow starts).

    The plan's own (``TF_CPP_MIN_LOG_LEVEL``, ``TF_ENABLE_ONEDNN_OPTS``,
    ``KERAS_BACKEND``, ``CUDA_DEVICE_ORDER``, ``CUDA_VISIBLE_DEVICES``,
    ``TF_GPU_ALLOCATOR``), plus those TensorFlow reads in place of a call:
    ``TF_FORCE_GPU_ALLOW_GROWTH`` (memory growth on every GPU) and
    ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``.
    """
    env = dict(plan.env)
    for call in plan.tf_calls:
        if call.api == "tf.config.experimental.set_memory_growth":
            env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        elif call.api == "tf.config.threading.set_intra_op_parallelism_threads":
            env["TF_NUM_INTRAOP_THREADS"] = str(call.value)
        elif call.api == "tf.config.threading.set_inter_op_parallelism_threads":
            env["TF_NUM_INTEROP_THREADS"] = str(call.value)
    return env


def launch_settings(plan: Any, workers: int = 1) -> list[Setting]:
    """Which setting travels by environment and which by the bootstrap (``tfgpu plan --launch``)."""
    env = launch_env(plan)
    rows = [Setting(k, "environment", f"{k}={v}") for k, v in env.items()]
    if workers > 1 or plan.cluster is not None:
        rows.append(Setting("TF_CONFIG", "environment", f"TF_CONFIG: {workers} local workers on 127.0.0.1 "
                                                         "(free ports), one task each" if workers > 1
                            else "TF_CONFIG as given (or the cluster the plan shows)"))
    rows.append(Setting("TFGPU_CONFIG", "environment", "TFGPU_CONFIG=<the resolved config, a temporary YAML file>"))
    by_env = {"tf.config.experimental.set_memory_growth": "TF_FORCE_GPU_ALLOW_GROWTH",
              "tf.config.threading.set_intra_op_parallelism_threads": "TF_NUM_INTRAOP_THREADS",
              "tf.config.threading.set_inter_op_parallelism_threads": "TF_NUM_INTEROP_THREADS"}
    for call in plan.tf_calls:
        also = f" (also {by_env[call.api]})" if call.api in by_env else ""
        rows.append(Setting(call.setting, "bootstrap", f"{call}{also}"))
    if workers > 1 or (plan.cluster is not None and plan.num_workers > 1):
        rows.append(Setting("keras fixes", "bootstrap",
                            "tfgpu.devices.keras_fixes.install(): model.fit under MultiWorkerMirroredStrategy"))
    return rows


def describe_settings(rows: Sequence[Setting]) -> str:
    """The settings as the lines ``tfgpu plan --launch`` prints."""
    lines = ["tfgpu launch: how each setting reaches the script",
             "By environment (read by Keras, TensorFlow or JAX, and CUDA when they start):"]
    lines += [f"  {r.what}    # {r.key}" if r.key not in r.what else f"  {r.what}" for r in rows
              if r.how == "environment"]
    lines.append("By the bootstrap (tfgpu.setup() in the script's process, before the script runs as __main__):")
    lines += [f"  {r.what}    # {r.key}" for r in rows if r.how == "bootstrap"]
    return "\n".join(lines)


def _with(base: dict[str, str], extra: dict[str, str], drop: Sequence[str] = ()) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in drop}
    env.update(extra)
    return env


def prepare_run(recipe: Optional[str], overrides: Sequence[str], workers: int, ports: Sequence[int],
                run_dir: Path, base_env: dict[str, str]) -> list[Child]:
    """The children of ``tfgpu run RECIPE --workers N`` (starts nothing).

    Each runs ``python -m tfgpu run RECIPE --set ... --set
    distribute.strategy=multi_worker_mirrored`` with ``TF_CONFIG`` (worker i of
    ``workers`` on 127.0.0.1 at ``ports``) and ``TFGPU_RUN_DIR=run_dir``; its
    output goes to ``run_dir/workers/worker-<i>.log``. ``TFGPU_WORKER_PYTHON``
    in ``base_env`` replaces ``sys.executable`` (for tests: a wrapper).
    """
    import shlex  # noqa: PLC0415

    python = shlex.split(base_env[WORKER_PYTHON_ENV]) if base_env.get(WORKER_PYTHON_ENV) else [sys.executable]
    argv = [*python, "-m", "tfgpu", "run", *([recipe] if recipe else []),
            *(a for o in overrides for a in ("--set", o)), "--set", "distribute.strategy=multi_worker_mirrored"]
    children = []
    for i in range(workers):
        env = _with(base_env, {"TF_CONFIG": tf_config(local_cluster(list(ports), i)),
                               "TFGPU_RUN_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"}, drop=SLURM_DROP)
        children.append(Child(i, tuple(argv), env, run_dir / "workers" / f"worker-{i}.log", stdin=i == 0))
    return children


#: Slurm's task variables are removed from local workers' environments (they would name another cluster).
SLURM_DROP = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS")


def prepare_launch(plan: Any, script: Sequence[str], workers: int, ports: Sequence[int], config_file: Path,
                   base_env: dict[str, str], log_dir: Optional[Path]) -> list[Child]:
    """The children of ``tfgpu launch`` (starts nothing).

    Args:
        plan: the plan for one worker (its environment travels: :func:`launch_env`).
        script: ``("train.py", "--lr", "0.1")`` or ``("-m", "package.module", ...)``.
        workers: processes to start (each gets ``TF_CONFIG`` when more than one).
        ports: one free port on 127.0.0.1 per worker.
        config_file: the resolved config, passed as ``TFGPU_CONFIG``.
        base_env: the environment to start from (``os.environ``).
        log_dir: where each worker's output goes (``worker-<i>.log``); ``None``
            with one worker: this terminal, and the script reads this stdin.
    """
    added = {**launch_env(plan), "TFGPU_CONFIG": str(config_file)}
    argv = (sys.executable, "-m", "tfgpu.launch.bootstrap", *script)
    children = []
    for i in range(workers):
        env = dict(added)
        if workers > 1:
            env["TF_CONFIG"] = tf_config(local_cluster(list(ports), i))
            env["PYTHONUNBUFFERED"] = "1"
        children.append(Child(i, argv, _with(base_env, env, drop=SLURM_DROP if workers > 1 else ()),
                              log_dir / f"worker-{i}.log" if log_dir else None, stdin=i == 0))
    return children


@dataclass
class Outcome:
    """How a group of workers ended.

    Attributes:
        exit_code: 0, or the code to exit with: :func:`~tfgpu.errors.worker_exit_code` of the failed worker's.
        codes: each worker's exit code (negative: killed by that signal).
        failed: the index of the first worker that failed, else ``None``.
        seconds: from start to the last exit.
        interrupted: Ctrl-C, SIGTERM or the requeue signal reached the supervisor.
    """

    exit_code: int
    codes: list[Optional[int]]
    failed: Optional[int] = None
    seconds: float = 0.0
    interrupted: bool = False


def _describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}" + (f" ({EXIT_CODES[code]})" if code in EXIT_CODES else "")


#: The first line of an error tfgpu reports (:meth:`tfgpu.errors.TfgpuError.report`: ``tfgpu: <kind>: ...``), not
#: of its notes and warnings (``tfgpu: note: ... start-up error(s) ...``).
_REPORT = re.compile(r"tfgpu: [^:]*(error|failed|interrupted|preempted|full|initialised)(: |\.$)")


def last_error(log: Optional[Path], lines: int = 12) -> str:
    """Why a worker failed, from its log: its ``tfgpu: <kind>: ...`` error paragraph, else its last lines."""
    if log is None or not log.exists():
        return ""
    text = log.read_text(encoding="utf-8", errors="replace").splitlines()
    for i in range(len(text) - 1, -1, -1):
        if _REPORT.match(text[i]):
            return "\n".join(text[i:i + 3]).strip()
    tail = [t for t in text if t.strip()][-lines:]
    return "\n".join(tail)


#: ``prctl(2)``'s option for the signal a process gets when its parent dies (``PR_SET_PDEATHSIG``, linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child of a :class:`Supervisor`: have Linux SIGKILL this process when the supervisor dies, however it dies.

    The supervisor names itself in ``TFGPU_SUPERVISOR_PID``. This asks the
    kernel for ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (through :mod:`ctypes`),
    then checks that the parent is still that process: if it died before the
    request took effect, this process kills itself. Children call it first
    thing (``python -m tfgpu``, :mod:`tfgpu.launch.bootstrap`); ``subprocess``'s
    ``preexec_fn`` could ask before ``exec``, but it is not safe in a process
    with threads (the supervisor's output copiers run while it starts the next
    child). The variable is removed from ``os.environ``, so that processes this
    one starts do not read it. Without it, or off Linux, nothing is done.

    SIGKILL, not SIGTERM: a worker whose supervisor is gone has no one to
    report to, and at SIGTERM it could go on (a script may ignore it; a
    ``tfgpu run`` worker first agrees on a step with its peers, which may be
    gone); the last committed checkpoint survives a kill (docs/checkpoints.md).
    The signal follows the death of the *thread* that started the child (the
    supervisor's main thread); the child's own children are not covered.
    """
    parent = os.environ.pop(PARENT_ENV, None)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes  # noqa: PLC0415

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return  # not granted (e.g. a seccomp filter): the supervisor still stops its children when it can
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGKILL)  # the supervisor died before the request: as if it had come in time


class Forwarding:
    """Ctrl-C, SIGTERM and the requeue signal, caught for a supervisor's whole life and passed on to its children.

    Entered before the first child starts and left after the last one exits
    (across a group's restarts): in between, none of these signals kills the
    supervisor (its children would train on unsupervised). Each arrival is
    recorded in :attr:`received` and passed to the children of :attr:`target`
    (:meth:`Supervisor.deliver`), which stop on their own: a ``tfgpu run``
    worker saves a checkpoint and exits 75 at SIGTERM or the requeue signal,
    130 at Ctrl-C. Handlers can be set only in the main thread; elsewhere
    nothing is caught.

    Args:
        requeue_signal: ``train.checkpoint.requeue_signal`` (``"SIGUSR1"``: what
            Slurm's ``--signal`` sends before the time limit), or ``None``.
    """

    def __init__(self, requeue_signal: Optional[str] = None) -> None:
        extra = [signal.Signals[requeue_signal]] if requeue_signal else []
        self.signals = [signal.SIGINT, signal.SIGTERM, *extra]
        #: The signals that arrived, in order.
        self.received: list[int] = []
        #: The supervisor whose children get them.
        self.target: Optional[Supervisor] = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if self.target is not None:
            self.target.deliver()

    def __enter__(self) -> "Forwarding":
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


@dataclass
class Supervisor:
    """Start children, copy their output, stop them all when one fails.

    Args:
        children: from :func:`prepare_run` or :func:`prepare_launch`.
        echo: where the chief's output is copied (default ``sys.stdout``).
        grace: seconds between SIGTERM and SIGKILL when stopping workers.
        stop_wait: seconds the children may take to stop after a forwarded
            Ctrl-C, SIGTERM or requeue signal (they save a checkpoint first)
            before they are stopped.
        signals: the :class:`Forwarding` that catches the signals (entered by
            the caller, for a group's whole life); ``None``: one of its own,
            from :meth:`start` until :meth:`wait` returns (Ctrl-C and SIGTERM).
        finished: says whether the children's work is done (``tfgpu run
            --workers``: the chief wrote ``"status": "completed"``); a child
            that fails then does not stop the others, which get
            ``finish_wait`` seconds to exit on their own.
        finish_wait: see ``finished``.
    """

    children: list[Child]
    echo: Optional[TextIO] = None
    grace: float = 5.0
    stop_wait: float = 120.0
    signals: Optional[Forwarding] = None
    finished: Optional[Callable[[], bool]] = None
    finish_wait: float = 30.0
    processes: list[subprocess.Popen] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _interrupted: bool = False
    _started: float = 0.0
    _own_signals: bool = False
    _sent: set[tuple[int, int]] = field(default_factory=set)

    def start(self) -> None:
        """Start every child (a piped one in its own session, so a signal reaches it only through :meth:`deliver`
        or :meth:`stop`); each gets ``TFGPU_SUPERVISOR_PID`` and dies with this process (:func:`die_with_parent`).

        Call it from the main thread (the thread whose exit kills the children). The signals are caught before
        the first child starts; one that arrives while they start reaches each of them.
        """
        if self.signals is None:
            self.signals, self._own_signals = Forwarding().__enter__(), True
        self.signals.target = self
        self._started = time.perf_counter()
        for child in self.children:
            if child.log is not None:
                child.log.parent.mkdir(parents=True, exist_ok=True)
            piped = child.log is not None
            process = subprocess.Popen(
                list(child.argv), env={**child.env, PARENT_ENV: str(os.getpid())},
                stdin=None if child.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE if piped else None, stderr=subprocess.STDOUT if piped else None,
                start_new_session=piped)
            self.processes.append(process)
            if piped:
                thread = threading.Thread(target=self._copy, args=(process, child), daemon=True)
                thread.start()
                self._threads.append(thread)
        self.deliver()  # a signal that came while they started (or before: a group's restart) reaches them all

    def deliver(self) -> None:
        """Pass every signal :attr:`signals` received to each running child that has not had it (once per arrival;
        a child on this terminal got the terminal's Ctrl-C itself)."""
        for arrival, signum in enumerate(list(self.signals.received if self.signals else [])):
            self._interrupted = True
            for child, p in zip(self.children, list(self.processes)):
                if (p.pid, arrival) in self._sent or p.poll() is not None:
                    continue
                self._sent.add((p.pid, arrival))
                if not (signum == signal.SIGINT and child.log is None):
                    self._signal(p, signum)

    def _copy(self, process: subprocess.Popen, child: Child) -> None:
        echo = (self.echo or sys.stdout) if child.index == 0 else None
        with open(child.log, "ab") as log:
            for line in iter(process.stdout.readline, b""):
                log.write(line)
                log.flush()
                if echo is not None:
                    echo.write(line.decode("utf-8", errors="replace"))
                    echo.flush()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to every running child (and its process group), then SIGKILL after ``grace`` seconds."""
        for p in self.processes:
            if p.poll() is None:
                self._signal(p, sig)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.processes):
            time.sleep(0.05)
        for p in self.processes:
            if p.poll() is None:
                self._signal(p, signal.SIGKILL)
                p.wait()

    def _signal(self, process: subprocess.Popen, sig: int) -> None:
        try:
            if self.children[self.processes.index(process)].log is not None:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
        except ProcessLookupError:
            pass

    def wait(self, poll: float = 0.1) -> Outcome:
        """Wait until all exit 0, or one fails (the others are then stopped); the caught signals are forwarded.

        The outcome's ``exit_code`` is :func:`tfgpu.errors.worker_exit_code` of the failed worker's code.
        """
        failed = None
        signalled = settled = None
        try:
            while True:
                codes = [p.poll() for p in self.processes]
                # When several ended since the last look, a killed one is the likelier cause: the others
                # usually fail because it is gone (a collective op loses its peer).
                bad = sorted((i for i, c in enumerate(codes) if c not in (None, 0)), key=lambda i: codes[i] >= 0)
                if self._interrupted:
                    # Every child got the signal: let each finish what it does on it (save a checkpoint and
                    # exit 75, or stop at Ctrl-C); stop the ones still running after stop_wait seconds.
                    signalled = signalled or time.monotonic()
                    if all(c is not None for c in codes) or time.monotonic() - signalled > self.stop_wait:
                        failed = bad[0] if bad else None
                        self.stop()
                        break
                elif bad and self.finished is not None and self.finished():
                    # The work is done (a worker crashed in its teardown): the others end on their own, or are
                    # stopped after finish_wait seconds.
                    settled = settled or time.monotonic()
                    if all(c is not None for c in codes) or time.monotonic() - settled > self.finish_wait:
                        failed = bad[0]
                        self.stop()
                        break
                elif bad:
                    failed = bad[0]
                    self.stop()
                    break
                elif all(c == 0 for c in codes):
                    break
                time.sleep(poll)
        finally:
            if self._own_signals:
                self.signals.__exit__()
            for thread in self._threads:
                thread.join(timeout=5)
        codes = [p.returncode for p in self.processes]
        exit_code = 0 if failed is None else worker_exit_code(codes[failed])
        return Outcome(exit_code, codes, failed, time.perf_counter() - self._started, self._interrupted)

    def failure(self, outcome: Outcome, what: str) -> WorkerError:
        """The error for a failed ``outcome``: which worker, how it ended, why (from its log), where its log is."""
        i = outcome.failed
        child = self.children[i]
        why = last_error(child.log)
        others = [j for j in range(len(self.children)) if j != i]
        stopped = (f"; worker(s) {', '.join(map(str, others))} were stopped" if others else "")
        log = f" Its log: {child.log}." if child.log else ""
        return WorkerError(
            f"{what}: {self.ended(i)} after {outcome.seconds:.1f} s{stopped}.{log}" + (f"\n{why}" if why else ""),
            "read the worker's log for the cause; fix it and run again.",
            exit_code=outcome.exit_code)

    def ended(self, i: int) -> str:
        """How child ``i`` ended, e.g. ``"worker 1 of 2 (pid 4242) was killed by SIGSEGV"``."""
        return (f"worker {i} of {len(self.children)} (pid {self.processes[i].pid}) "
                f"{_describe_code(self.processes[i].returncode)}")


def launch(recipe: Optional[str], overrides: Sequence[str], workers: int, script: Sequence[str],
           log_dir: Optional[str] = None) -> int:
    """``tfgpu launch``: run an unmodified script (or ``-m module``) with the config applied; returns its exit code.

    One worker: the script runs in one child on this terminal (stdin, output
    and Ctrl-C are its own) and its exit code is returned. Several: each is a
    worker of MultiWorkerMirroredStrategy on 127.0.0.1 (``TF_CONFIG`` set; the
    script builds the strategy), with its output in ``LOG_DIR/worker-<i>.log``
    (the chief's also here); when one fails the others are stopped. Ctrl-C,
    SIGTERM and ``train.checkpoint.requeue_signal`` are forwarded to the
    script(s) (:class:`Forwarding`), and they die with this process.

    Returns:
        One worker: the script's exit code (a signal N gives 128 + N, as a
        shell says); several: 0 when all exit 0.

    Raises:
        ConfigError, DeviceError: the config, before anything starts.
        WorkerError: one of several workers failed; its exit code is
            :func:`~tfgpu.errors.worker_exit_code` of the worker's (as
            ``tfgpu run --workers N``): a code of the script's own is passed
            on, a worker killed by a signal or ended by an uncaught exception
            gives 10 (the message names the signal or the code).
    """
    import tempfile  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    from ..devices.plan import make_plan  # noqa: PLC0415
    from ..devices.probe import probe  # noqa: PLC0415

    if not script:
        raise ConfigError("tfgpu launch: no script was given (received nothing after the options).",
                          "name it after --, e.g. tfgpu launch recipe.yaml -- train.py --epochs 3.")
    cfg, _ = load_for_workers(recipe, overrides, workers)
    ports = free_ports(workers) if workers > 1 else []
    plan = make_plan(cfg, as_worker_zero(probe(), ports))  # a device error shows here, before anything starts
    logs = None
    if workers > 1:
        logs = Path(log_dir or Path("tfgpu-logs") / time.strftime("launch-%Y%m%d-%H%M%S"))
    with tempfile.TemporaryDirectory(prefix="tfgpu-launch-") as tmp, \
            Forwarding(cfg.train.checkpoint.requeue_signal) as signals:
        config_file = Path(tmp) / "config.yaml"
        config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True), sort_keys=False))
        children = prepare_launch(plan, list(script), workers, ports, config_file, dict(os.environ), logs)
        if logs is not None:
            print(f"tfgpu: {workers} workers on 127.0.0.1; logs in {logs}", file=sys.stderr, flush=True)
        supervisor = Supervisor(children, signals=signals)
        supervisor.start()
        outcome = supervisor.wait()
    if outcome.failed is None:
        return 0
    if workers == 1:
        code = outcome.codes[0]
        return 128 - code if code < 0 else code
    if outcome.interrupted and len(set(outcome.codes)) == 1:  # each did what the forwarded signal asks: no failure
        names = ", ".join(dict.fromkeys(signal.Signals(s).name for s in signals.received))
        print(f"tfgpu launch: {names} reached the {workers} workers; each {_describe_code(outcome.codes[0])}.",
              file=sys.stderr, flush=True)
        return outcome.exit_code
    raise supervisor.failure(outcome, "tfgpu launch")
