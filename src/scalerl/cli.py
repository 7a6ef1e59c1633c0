"""`python train.py [group=option ...] [key=value ...]`: one training run."""

from __future__ import annotations

import errno
import sys
from typing import NoReturn

import hydra
from omegaconf import DictConfig

from scalerl.collector import run_as_program, uncollected_imports
from scalerl.config import conf_dir, register_configs, validate

register_configs()


def preflight(cfg: DictConfig) -> None:
    """What the config points at, before anything is built or written: out_dir, tracking store, model
    folder (:func:`scalerl.config.preflight`), the layout of its ranks (:func:`check_layout`), then
    the task's data (:func:`scalerl.task.checks.check_task`)."""
    from scalerl.config import typed
    from scalerl.config.preflight import preflight as check_environment
    from scalerl.task.checks import check_task

    check_environment(cfg)
    check_layout(cfg)
    config = typed(cfg)
    check_task(config.task, model=config.model, length_control=config.length_control, eval=config.eval)


def check_layout(cfg: DictConfig, env=None):
    """The run's layout for the launch this process belongs to (torchrun's or a job's variables, else
    one process) is one that can work: every rank's devices, threads, ports and batch share
    (:func:`scalerl.layout.plan`; a :class:`~scalerl.layout.LayoutError` in one line
    otherwise). Returns the layout and this process's rank plan."""
    from scalerl import layout

    return layout.current(layout.LayoutOptions.of(cfg), env, raw=True)


@hydra.main(config_path=conf_dir(), config_name="config", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    from scalerl.messages import UserError

    try:  # before transformers is imported or anything built: a bad config is refused in seconds
        _keep_run_length(cfg, _named_keys())
        validate(cfg)
        preflight(cfg)  # what the config points at: out_dir, tracking store, model folder, data file
    except UserError as e:  # a ConfigError, a task's DataFileError
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if (held := _out_dir_busy(cfg)) is not None:  # in seconds too; the run's own lock decides
        print(f"error: {held}", file=sys.stderr)
        sys.exit(1)

    # pipeline_rl's local engines fork from a server (scalerl.rollout.server) that this process
    # forks from itself once its imports include the server's: the server imports nothing anew. Not
    # for a multi-task job's tasks (placement.generator_tasks): a generator task serves as an engine
    # and forks none, a trainer task starts the server as its run's setup places the engines.
    from scalerl.rollout import server

    engines_here = server.local_engines(cfg.async_mode, cfg.placement)
    with uncollected_imports():  # torch, transformers: millions of objects the collector need not walk
        from scalerl.lock import LockBusy
        from scalerl.loop import RunError, train
        from scalerl.loop.run import Stopped
        from scalerl.loop.signals import Interrupted, exit_code, quiet_finalizers
        from scalerl.rollout.engine import engine_role
        from scalerl.storage import CheckpointError

        if engines_here:
            server.import_preloaded()
    if engines_here:  # before anything starts a thread
        server.fork_here()

    try:  # a generator task of a multi-task job serves as its engine; every other process trains
        engine_role(cfg) or train(cfg)
    except (UserError, CheckpointError) as e:  # found while building the run: a data file, a checkpoint
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except Stopped as e:  # SIGINT/SIGTERM: stopped at a step boundary with a checkpoint
        _ignore_signals()
        print(f"[scalerl] {e}", file=sys.stderr, flush=True)
        sys.exit(exit_code(e.signum))
    except Interrupted as e:  # a second signal: stopped at once
        _ignore_signals()
        quiet_finalizers()
        print(f"[scalerl] {e.detail or 'interrupted'}", file=sys.stderr, flush=True)
        sys.exit(exit_code(e.signum))
    except (RunError, LockBusy) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        if e.errno not in DISK_ERRORS:
            raise
        # a write outside the checkpoint (run_info.json, summary.json, a figure) on a full or
        # read-only disk; the checkpoint's own is a RunError
        print(
            f"error: could not write {e.filename or f'in {cfg.out_dir}'}: {e.strerror}; run the same "
            "command again once it can be written (the run resumes from its last checkpoint)",
            file=sys.stderr,
        )
        sys.exit(1)


def _named_keys() -> set[str]:
    """The keys this command line sets (``trainer.total_steps=50`` -> ``trainer.total_steps``)."""
    from hydra.core.hydra_config import HydraConfig

    from scalerl.config.errors import override_key

    return {override_key(o) for o in HydraConfig.get().overrides.task}


def _keep_run_length(cfg: DictConfig, named: set[str]) -> None:
    """A run resumed in its out_dir goes on to the length it last ran with unless the command line
    names ``trainer.total_steps``: ``python train.py out_dir=runs/a`` resumes a 50-step run to step
    50, not to the default's 300. Either way a length that differs from the run's is said (on
    stdout: a notice, not an error)."""
    from scalerl.config.schema import run_length

    before, now = run_length(cfg.get("out_dir") or ""), cfg.trainer.get("total_steps")
    if before is None or not isinstance(now, int) or before == now:
        return  # a new run, or a value validate refuses in its own words
    if "trainer.total_steps" in named:
        print(f"[scalerl] {cfg.out_dir}: trainer.total_steps={now} (it ran with {before} before)")
        return
    cfg.trainer.total_steps = before
    print(
        f"[scalerl] {cfg.out_dir}: resumed to its own length, trainer.total_steps={before} (name "
        "trainer.total_steps to change it)"
    )


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}  # a full disk, a quota, a read-only one


def _out_dir_busy(cfg: DictConfig) -> str | None:
    """Why the run cannot start now because another process runs in its out_dir (rank 0 only: the
    other ranks of a job share their out_dir with it), or None."""
    import os

    from scalerl.lock import busy, out_dir_lock

    if int(os.environ.get("RANK", "0")) != 0 or not cfg.get("out_dir"):
        return None
    return busy(*out_dir_lock(str(cfg.out_dir)))


def _ignore_signals() -> None:
    """The run has stopped: one more Ctrl-C while the process exits would only add a traceback."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _check_overrides(args: list[str]) -> list[str]:
    """Compose and validate the overrides before Hydra does, so that an unknown group, option or key,
    a malformed override or a wrongly typed or out-of-range value is one line (exit 2) instead of
    Hydra's multi-line report, and is refused before Hydra makes a folder of its own (a
    ``hydra.run.dir`` or ``hydra.output_subdir`` the command line sets). ``--cfg`` checks what it
    prints; a multirun (``-m``) is checked job by job (:func:`_multirun_jobs`) before Hydra makes its
    sweep folder, and its jobs get an ``out_dir`` each; other Hydra flags (--info, --hydra-help, ...)
    go to Hydra as they are. Returns the command line Hydra is to run."""
    flags = [a for a in args if a.startswith("-")]
    multirun, other = set(flags) & MULTIRUN_FLAGS, sorted(set(flags) & OTHER_MODES)
    if multirun and other:
        print(
            f"error: {min(multirun)} cannot be combined with {other[0]}: Hydra runs one of a run, a "
            "multirun, --cfg and --info",
            file=sys.stderr,
        )
        sys.exit(2)
    if flags and set(flags) <= PRINT_FLAGS:  # --cfg job: the recipe it prints is checked too
        _check_overrides(_without_flag_values(args))
        return args
    if flags and not set(flags) <= MULTIRUN_FLAGS:
        return args
    from scalerl.config.errors import override_key

    keys = [override_key(a) for a in args if not a.startswith("-")]
    if flags and any(k.startswith(("hydra/sweeper", "hydra.sweeper")) for k in keys):
        return args  # another sweeper expands the jobs its own way: Hydra checks them
    overrides = [a for a in args if not a.startswith("-") and not override_key(a).startswith("hydra")]
    # `${hydra:...}` resolves only inside Hydra's run: such a command line is validated there
    check = not any("${hydra:" in a for a in overrides)
    if not flags:
        _composed_or_exit(overrides, check=check)
        return args
    cfgs = [_composed_or_exit(job, check=check) for job in _multirun_jobs(overrides)]
    if "out_dir" not in keys:  # the default's ${now:...} is one time for every job of the sweep
        return [*args, JOB_OUT_DIR]
    dirs = [str(c.out_dir) for c in cfgs] if check else []
    if shared := next((d for d in dirs if dirs.count(d) > 1), None):
        print(
            f"error: bad value out_dir={shared}: the {dirs.count(shared)} jobs of this multirun would "
            "share it (each resuming the one before); give each its own, e.g. "
            f"out_dir={shared.rstrip('/')}/${{hydra:job.num}}",
            file=sys.stderr,
        )
        sys.exit(2)
    return args


def _without_flag_values(args: list[str]) -> list[str]:
    """``args`` without Hydra's flags and the values they take (``--cfg job``, ``-p trainer``)."""
    words, kept = iter(args), []
    for w in words:
        if w in FLAGS_WITH_VALUES:
            next(words, None)
        elif not w.startswith("-"):
            kept.append(w)
    return kept


# A multirun's jobs run in Hydra's sweep folder (conf/config.yaml: outputs/<date>/<time>), one
# subfolder each (the job's number), next to Hydra's multirun.yaml.
JOB_OUT_DIR = "out_dir=${hydra:sweep.dir}/${hydra:sweep.subdir}"
MULTIRUN_FLAGS = {"-m", "--multirun"}
OTHER_MODES = {"--run", "-r", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}  # Hydra's
FLAGS_WITH_VALUES = {"--cfg", "-c", "--package", "-p", "--info", "-i"}
PRINT_FLAGS = {"--cfg", "-c", "--package", "-p", "--resolve"}


def _multirun_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs' override lists of ``python train.py -m <overrides>`` as Hydra's basic sweeper
    expands them (``loss=cispo,dapo``, ``range(...)``, ``glob(...)``), or a malformed sweep's one line
    and exit 2."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from scalerl.config import hydra_initialized
    from scalerl.config.errors import explain

    try:
        with hydra_initialized():
            parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
            return BasicSweeper.split_arguments(parser.parse_overrides(overrides), None)[0]
    except Exception as e:  # a malformed override or sweep
        print(f"error: {explain(e, overrides)}", file=sys.stderr)
        sys.exit(2)


def _composed_or_exit(overrides: list[str], *, with_hydra: bool = False, check: bool = False) -> DictConfig:
    """``overrides`` composed (and validated with ``check``), or their one-line error and exit 2."""
    from scalerl.config import compose
    from scalerl.config.errors import explain

    try:
        return compose(overrides, check=check, with_hydra=with_hydra)
    except Exception as e:  # Hydra/OmegaConf composition errors
        print(f"error: {explain(e, overrides)}", file=sys.stderr)
        sys.exit(2)


def _print_layout(args: list[str]) -> None:
    """After ``--cfg job`` (or ``--cfg all``) has printed the recipe: the run's layout
    (:mod:`scalerl.layout`) as YAML comments, every rank's node, role, devices, threads and
    batch share, the engines and the ports; for the launch this process belongs to (torchrun's
    variables), else the one the ``launcher`` group asks for (``launcher=slurm launcher.nodes=2
    launcher.tasks_per_node=8 launcher.gpus_per_node=8``; ``launcher.tasks_per_node=6`` for torchrun's
    ``--nproc_per_node 6`` on this machine's GPUs). A layout that cannot work: its one line, exit 2."""
    flag = next((i for i, a in enumerate(args) if a in ("--cfg", "-c")), None)
    if flag is None or flag + 1 >= len(args) or args[flag + 1] not in ("job", "all"):
        return
    if any(a in ("--package", "-p") for a in args):
        return
    import os

    from scalerl import layout
    from scalerl.config.errors import override_key
    from scalerl.messages import UserError

    overrides = [a for a in _without_flag_values(args) if not override_key(a).startswith("hydra")]
    if any("${hydra:" in a for a in overrides):
        return  # resolves only inside Hydra's run
    cfg = _composed_or_exit(overrides)
    launched = "WORLD_SIZE" in os.environ or "MASTER_PORT" in os.environ
    try:
        options = layout.LayoutOptions.of(cfg)
        launch = (
            layout.launch_from_env(options, raw=True)
            if launched
            else layout.launch_from_launcher(cfg.launcher, cfg.trainer)
        )
        planned = layout.plan(options, launch)
        print("\n".join(planned.lines()), flush=True)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    _print_estimate(cfg, planned)


def _print_estimate(cfg: DictConfig, planned) -> None:
    """The run's estimated wall time on this machine (:mod:`scalerl.estimate`: its work from
    the config, this machine's speed from a probe of about a second), as YAML comments after the
    layout. An estimate that fails says so in its line: printing the recipe never fails for it."""
    from scalerl import estimate

    try:
        lines = estimate.estimate(cfg, planned).lines()
    except Exception as e:  # a config the probe cannot build: the run's own checks say what is wrong
        lines = [
            f"estimated wall time: not estimated ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ]
    from scalerl.config.schema import fit_too_short

    if short := fit_too_short(int(cfg.trainer.total_steps), int(cfg.eval.every), int(cfg.scaling.min_step)):
        lines.append(f"scaling fit: not scored at this length: {short}")
    print("\n".join("# " + ln for ln in lines), flush=True)


HELP_FLAGS = ("--help", "-h")


def _help(args: list[str]) -> bool:
    """``python train.py [overrides] --help``, printed as Hydra prints it (the template of
    ``conf/hydra/help/`` filled with the composed config) but without what Hydra computes for
    placeholders this template does not use: a listing of every option of every config group,
    Hydra's own included, which took 6 of the 9.5 s. False (Hydra prints it) for any other flag, or
    a template that uses Hydra's other placeholders; a bad override is one line, exit 2."""
    flags = [a for a in args if a.startswith("-")]
    if not flags or any(f not in HELP_FLAGS for f in flags):
        return False
    import string

    from omegaconf import OmegaConf, flag_override

    cfg = _composed_or_exit([a for a in args if a not in HELP_FLAGS], with_hydra=True)
    try:  # a template with ${hydra:...} (set by Hydra's run only) or $FLAGS_HELP, $APP_CONFIG_GROUPS,
        # ...: Hydra's own help
        template = string.Template(cfg.hydra.help.template)
        with flag_override(cfg, ["struct", "readonly"], [False, False]):
            del cfg["hydra"]
        text = template.substitute(CONFIG=OmegaConf.to_yaml(cfg))
    except Exception:
        return False
    print(text)
    return True


# the flags with which train.py prints and runs nothing (Hydra's)
PRINT_ONLY = frozenset(("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--resolve"))


def main() -> NoReturn:
    """Exit codes: 0 done, 1 the run failed (or its metrics did not all reach the tracking store:
    running it again writes them), 2 bad input, 130 / 143 stopped by SIGINT / SIGTERM (with a
    checkpoint to resume from, when it had one). The process ends without the interpreter's
    finalisation once the run is written and closed (:func:`scalerl.collector.run_as_program`); an
    error nobody caught ends it the ordinary way, with its traceback."""
    run_as_program(_program)


def _program() -> None:
    try:
        if _help(sys.argv[1:]):
            return
        sys.argv[1:] = _check_overrides(sys.argv[1:])
        _main()
        _print_layout(sys.argv[1:])
    except BrokenPipeError:  # ``--cfg job | head``: the reader has what it wanted
        if not PRINT_ONLY.intersection(sys.argv[1:]):
            raise  # a run: it did not finish, and says so
        from scalerl.messages import reader_gone

        reader_gone()
    except KeyboardInterrupt:  # Ctrl-C before the run's own handling starts
        _ignore_signals()
        print("[scalerl] interrupted", file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
