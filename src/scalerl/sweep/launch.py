"""Launching the runs of a sweep with submitit and waiting for them.

* ``launcher=local``: :class:`submitit.LocalExecutor` (explicitly: with ``srun`` on PATH,
  ``AutoExecutor`` would pick SLURM), at most ``max_parallel`` runs at once (0 = a core per task),
  each with its share of the cores (``trainer.threads``) unless the sweep sets it.
* ``launcher=slurm``: :class:`submitit.SlurmExecutor`, one job array (``array_parallelism``),
  ``max_requeue`` requeues on time limits (preemptions requeue without counting).

A run that fails, is cancelled or hits its time limit for good is reported with its log; the
others go on. Outcomes are written to ``<sweep dir>/status.json`` as they come in.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import submitit

from scalerl.config.errors import override_key
from scalerl.storage import write_text_atomic
from scalerl.sweep.job import TrainJob
from scalerl.sweep.plan import Plan, PlannedRun, launch_order, run_settings
from scalerl.sweep.spec import display_path

# SLURM states that end a job without a result (submitit: UncompletedJobError after a wait)
_BAD_STATES = ("CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED")
# SLURM states of a job that is still going (a relaunch waits for it instead of submitting twice)
_ACTIVE_STATES = (
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "REQUEUE_",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
)


class _LocalOrphan:
    """A local job of an earlier launch of this sweep whose driver was killed but whose process
    still runs: a relaunch waits for it (and takes its result) instead of starting the run twice."""

    def __init__(self, folder: Path, job_id: str):
        from submitit.local.local import LocalJob

        self.job_id = job_id
        self._job = LocalJob(folder=folder, job_id=job_id)
        self.paths = self._job.paths

    @staticmethod
    def _cmdline(pid: str) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    @classmethod
    def attach(cls, folder: Path, job_id: str):
        return cls(folder, job_id) if b"submitit" in cls._cmdline(job_id) else None

    def done(self, force_check: bool = False) -> bool:
        return b"submitit" not in self._cmdline(self.job_id)

    @property
    def state(self) -> str:
        return "FINISHED" if self.done() else "RUNNING"

    def result(self):
        return self._job.result()

    def results(self):
        """One result per task, as a submitted job's (what :meth:`Launcher._collect` reads)."""
        return self._job.results()

    def cancel(self, check: bool = False) -> None:
        import signal

        try:
            os.kill(int(self.job_id), signal.SIGINT)
        except (OSError, ValueError):
            pass


@dataclass
class Outcome:
    name: str
    status: str  # finished | failed | cancelled | timeout | interrupted | skipped
    job_id: str = ""
    log: str = ""  # submitit's stderr file of the job (the traceback is there)
    stdout: str = ""
    error: str = ""  # one line
    seconds: float = 0.0
    summary: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("summary")
        return d


def summary_of(out_dir: str | Path) -> dict | None:
    p = Path(out_dir) / "summary.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def is_finished(run: PlannedRun) -> bool:
    s = summary_of(run.out_dir)
    # a run whose metrics or artifacts did not all reach the tracking store runs again: that writes them
    unsent = s and (s.get("metrics_unflushed") or s.get("artifacts_unsent"))
    return bool(s) and int(s.get("steps", 0)) >= run.total_steps and not unsent


def num_tasks(launcher: dict) -> int:
    """Tasks (processes, ranks) of one run's job (``launcher``: the composed launcher group)."""
    return int(launcher["nodes"]) * int(launcher["tasks_per_node"])


def max_parallel(launcher: dict) -> int:
    """Local runs at once: ``max_parallel``, else the cores divided by a run's tasks (a run's
    processes wait on each other part of the time: on 2 cores two pipeline_rl runs at once, one
    thread a process, finish sooner than one at a time)."""
    n = int(launcher["max_parallel"])
    return n if n > 0 else max(1, (os.cpu_count() or 1) // num_tasks(launcher))


def local_threads(launcher: dict, overrides: list[str]) -> list[str]:
    """The override giving a local run its share of the cores, ``trainer.threads=<cores / (runs at
    once x tasks)>`` (at least 1), unless the run sets trainer.threads itself: with ``0`` (all
    cores) every run at once would start a thread per core for each of its processes."""
    if any(override_key(o) == "trainer.threads" for o in overrides):
        return []
    share = (os.cpu_count() or 1) // (max_parallel(launcher) * num_tasks(launcher))
    return [f"trainer.threads={max(1, share)}"]


def core_slots(launcher: dict) -> list[tuple[int, ...]]:
    """The cores each local run at once is held to (``launcher.pin_cores``): this process's CPUs in
    order, split evenly over :func:`max_parallel` runs (the remainder unused). ``[]`` where runs are
    not held: pinning off, no ``sched_setaffinity`` (not Linux), one run at once (nothing to keep
    apart) or fewer CPUs than runs. Held apart, a run's processes keep their caches and two runs do
    not migrate over each other's cores."""
    if not launcher.get("pin_cores") or not hasattr(os, "sched_setaffinity"):
        return []
    cpus = sorted(os.sched_getaffinity(0))
    n = max_parallel(launcher)
    per = len(cpus) // n
    if n < 2 or per < 1:
        return []
    return [tuple(cpus[i * per : (i + 1) * per]) for i in range(n)]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first (Linux: each process's parent read from
    ``/proc/<pid>/stat``; a run's engines sit below a forkserver, in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [int(pid)]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def hold_to(pid: int, cpus) -> int:
    """Hold every thread of ``pid``'s process tree to ``cpus``; returns the threads moved (a
    process that ended meanwhile is passed over)."""
    moved = 0
    for p in process_tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), set(cpus))
                moved += 1
            except (OSError, ValueError):
                pass
    return moved


def make_executor(plan: Plan):
    lc = plan.launcher
    folder = plan.sweep_dir / "logs"
    if lc["name"] == "local":
        ex = submitit.LocalExecutor(folder=folder, max_num_timeout=int(lc["max_requeue"]))
        ex.update_parameters(timeout_min=int(lc["timeout_min"]), tasks_per_node=int(lc["tasks_per_node"]))
        return ex
    if lc["name"] == "slurm":
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=int(lc["max_requeue"]))
        params = {
            "job_name": f"scalerl-{plan.spec.name}",
            "time": int(lc["timeout_min"]),
            "nodes": int(lc["nodes"]),
            "ntasks_per_node": int(lc["tasks_per_node"]),
            "cpus_per_task": int(lc["cpus_per_task"]),
            "mem": f"{int(lc['mem_gb'])}GB",
            "array_parallelism": int(lc["array_parallelism"]),
        }
        if lc["partition"]:  # null: the cluster's default partition
            params["partition"] = lc["partition"]
        # GPUs are requested per node, never with --gpus-per-task: that binds each task to its own
        # GPUs (SLURM >= 21.08 implies --gpu-bind=per_task), so task k would see its GPU as cuda:0
        # while DeepSpeed and the loop select cuda:LOCAL_RANK. Per node, every task sees the node's
        # GPUs, as under torchrun.
        gpus = int(lc["gpus_per_node"]) or int(lc["tasks_per_node"]) * int(lc["gpus_per_task"])
        if gpus > 0:
            params["gpus_per_node"] = gpus
        if lc["additional_parameters"]:
            params["additional_parameters"] = dict(lc["additional_parameters"])
        ex.update_parameters(**params)
        return ex
    raise ValueError(f"unknown launcher {lc['name']!r}")


def _error_line(exc: BaseException) -> str:
    """The last line of the job's traceback (submitit wraps it in a long message)."""
    text = str(exc)
    if "----------------------" in text:
        parts = text.split("----------------------")
        if len(parts) >= 3:
            text = parts[1]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:500] if lines else type(exc).__name__


@dataclass
class Pace:
    """How far a sweep's launched runs are, and for local runs how long the rest still take at the
    pace of those that finished: a run lasts as long as its variant's finished seeds took on average,
    or, before one has, all finished runs' mean; a run still going needs that less its time so far;
    all are scheduled ``at_once`` at a time in launch order (:func:`scalerl.estimate.schedule`). No
    time is said before a run has finished, nor for SLURM (``timed`` false: its queue decides)."""

    variant: dict[str, str]  # run name -> its variant
    at_once: int
    total: int  # runs launched
    timed: bool = True
    ended: int = 0
    took: dict[str, float] = field(default_factory=dict)  # run that finished -> its seconds

    def record(self, out: Outcome) -> None:
        """``out`` ended; a finished run's time sets the pace (a failed one's would not)."""
        self.ended += 1
        if out.status == "finished":
            self.took[out.name] = out.seconds

    def duration(self, name: str) -> float:
        """``name``'s expected seconds at the finished runs' pace (some must have finished)."""
        same = [s for n, s in self.took.items() if self.variant.get(n) == self.variant.get(name)]
        times = same or list(self.took.values())
        return sum(times) / len(times)

    def left_s(self, running: dict[str, float], pending: list[str]) -> float | None:
        """Seconds until the last of ``running`` (name -> seconds so far) and ``pending`` (in launch
        order) ends, or None before a run has finished."""
        from scalerl.estimate import schedule

        if not self.took:
            return None
        going = [max(0.0, self.duration(n) - t) for n, t in running.items()]
        return schedule([*going, *(self.duration(n) for n in pending)], self.at_once)

    def line(self, running: dict[str, float], pending: list[str]) -> str:
        """``k of n done; about T left at the pace of the m finished`` (``the rest due now`` where
        the runs still going are past their expected time and none waits)."""
        from scalerl.estimate import seconds_text

        done = f"{self.ended} of {self.total} done"
        left = self.left_s(running, pending) if self.timed and (running or pending) else None
        if left is None:
            return done
        when = f"about {seconds_text(left)} left" if left >= 1.0 else "the rest due now"
        return f"{done}; {when} at the pace of the {len(self.took)} finished"


def _state(job) -> str:
    try:
        return str(job.state or "UNKNOWN").upper()
    except Exception:  # pragma: no cover - accounting hiccup
        return "UNKNOWN"


def requeued(job) -> bool:
    """A SLURM job whose result file holds an error while SLURM has it queued or running again: a
    preempted job being requeued. Its ``scontrol requeue`` can be killed by the SIGTERM the requeue
    itself sends, leaving an error result until the requeued attempt starts and removes it
    (``job._drop_stale_result``); the job is not over."""
    from submitit.core.utils import pickle_load

    try:
        outcome, _ = pickle_load(job.paths.result_pickle)
    except Exception:  # no result file (yet), or one being written
        return False
    return outcome != "success" and _state(job).startswith(_ACTIVE_STATES)


class Launcher:
    """Submits the runs of a plan and collects their outcomes."""

    def __init__(self, plan: Plan, parent_run_id: str, *, say=None, poll_s: float = 1.0):
        self.plan = plan
        self.parent_run_id = parent_run_id
        self.say = say or (lambda msg: print(f"[sweep] {msg}", file=sys.stderr, flush=True))
        self.poll_s = poll_s
        self.status_path = plan.sweep_dir / "status.json"
        self.outcomes: dict[str, Outcome] = {}
        self._status: dict = self._load_status()

    # ------------------------------------------------------------------ status file
    def _load_status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def _record(self, job: str, **fields) -> None:
        entry = self._status.setdefault(job, {})
        entry.update(fields, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
        write_text_atomic(self.status_path, json.dumps(self._status, indent=1))

    def not_run(self, run: PlannedRun) -> None:
        """``run`` is planned but not launched: its component cannot act where it would run."""
        self._record(run.name, status="not run", error=run.skip, job_id="", log="")
        self.say(f"{run.name}: not run: {run.skip}")

    def already_finished(self, run: PlannedRun) -> None:
        """``run`` finished before this launch (its summary says so), possibly while the driver that
        launched it was gone: it is not launched, and its status no longer says ``running``."""
        if (self._status.get(run.name) or {}).get("status") != "finished":
            self._record(run.name, status="finished", error="")
        self.say(
            f"{run.name}: already finished ({run.total_steps} steps in {display_path(run.out_dir)}); skipped"
        )

    def _finish(self, out: Outcome, progress: str = "") -> None:
        """``out`` ended: recorded and said, with ``progress`` (:meth:`Pace.line`) after it."""
        self.outcomes[out.name] = out
        self._record(out.name, **out.to_dict())
        after = f" ({progress})" if progress else ""
        if out.status == "finished":
            s = out.summary or {}
            pr = ""
            if s.get("pass_rate_start") is not None and s.get("pass_rate_final") is not None:
                pr = f", pass rate {s['pass_rate_start']:.3f} -> {s['pass_rate_final']:.3f}"
            self.say(f"{out.name}: finished in {out.seconds:.0f} s{pr}{after}")
        else:
            self.say(f"{out.name}: {out.status.upper()}: {out.error}; log: {out.log}{after}")
            self._close_mlflow_run(
                self.plan.run(out.name), "KILLED" if out.status == "cancelled" else "FAILED"
            )

    def _close_mlflow_run(self, run: PlannedRun, status: str) -> None:
        """A job killed from outside (scancel, time limit, OOM) leaves its MLflow run RUNNING: close it.
        A re-run of the sweep resumes the same MLflow run (and marks it RUNNING again)."""
        try:
            info = json.loads((Path(run.out_dir) / "run_info.json").read_text())
        except (OSError, ValueError):
            return  # the job failed before it reached MLflow
        try:
            from scalerl.sweep.state import client_for
            from scalerl.tracking.tracker import keyed_run

            client = client_for(self.plan.tracking_uri)
            run_id = info.get("run_id")
            if run_id is None:  # killed between creating its MLflow run and writing the run's id
                found = keyed_run(client, info["experiment_id"], info["run_key"])
                if found is None:
                    return
                run_id = found.info.run_id
            if client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, status=status)
        except Exception as e:  # the report still marks the run
            self.say(f"{run.name}: could not mark its MLflow run {status} ({type(e).__name__})")

    # ------------------------------------------------------------------ submission
    def _args(self, run: PlannedRun) -> tuple:
        settings = run_settings(self.plan.spec.name, run, self.plan.tracking_uri, self.parent_run_id)
        seed = run.seed if self.plan.spec.seeds is not None else None
        overrides = list(run.overrides)
        if self.plan.launcher["name"] == "local":
            overrides += local_threads(self.plan.launcher, overrides)
        return (overrides, settings, seed)

    def _reattach(self, run: PlannedRun):
        """The job of ``run`` from an earlier launch if it is still running, else None."""
        entry = self._status.get(run.name) or {}
        if entry.get("status") != "running" or not entry.get("job_id"):
            return None
        folder = self.plan.sweep_dir / "logs"
        try:
            if entry.get("launcher") == "slurm":
                tasks = tuple(range(num_tasks(self.plan.launcher)))
                job = submitit.SlurmJob(folder=folder, job_id=str(entry["job_id"]), tasks=tasks)
                state = str(job.watcher.get_state(str(entry["job_id"]), mode="force")).upper()
                return job if state.startswith(_ACTIVE_STATES) else None
            return _LocalOrphan.attach(folder, str(entry["job_id"]))
        except Exception:  # no accounting, no such job: start the run again (it resumes)
            return None

    def _submitted(self, run: PlannedRun, job, started: float, cores: tuple[int, ...] | None = None) -> None:
        self._record(
            run.name,
            launcher=self.plan.launcher["name"],
            status="running",
            job_id=str(job.job_id),
            log=str(job.paths.stderr),
            stdout=str(job.paths.stdout),
            error="",
            cores=list(cores) if cores else None,
            started=started,  # the run's clock (a relaunch that finds the job still running counts from it)
        )
        on = f"; cores {','.join(map(str, cores))}" if cores else ""
        self.say(f"{run.name}: submitted (job {job.job_id}; log {job.paths.stderr}{on})")

    def run(self, runs: list[PlannedRun]) -> dict[str, Outcome]:
        """Launch ``runs`` and wait for all of them; returns name -> outcome."""
        if not runs:
            return {}
        executor = make_executor(self.plan)
        fn = TrainJob()
        local = self.plan.launcher["name"] == "local"
        pending = launch_order(runs, self.plan.work_options) if local else list(runs)
        running: dict[str, tuple[PlannedRun, object, float]] = {}
        limit = max_parallel(self.plan.launcher) if local else len(runs)
        pace = Pace({r.name: r.variant for r in runs}, limit, len(runs), timed=local)
        slots = core_slots(self.plan.launcher) if local else []
        held: dict[str, int] = {}  # run name -> its slot of cores (local runs held apart)
        for r in list(pending):
            job = self._reattach(r)
            if job is not None:
                pending.remove(r)
                entry = self._status.get(r.name) or {}
                # its time counts from its submission (a status written before it says: from now)
                running[r.name] = (r, job, float(entry.get("started") or time.time()))
                cores = tuple(entry.get("cores") or ())
                if cores in slots and slots.index(cores) not in held.values():
                    held[r.name] = slots.index(cores)
                self.say(f"{r.name}: still running from an earlier launch (job {job.job_id}); waiting for it")
        try:
            if not local and pending:
                with executor.batch():
                    jobs = [(r, executor.submit(fn, *self._args(r))) for r in pending]
                pending = []
                t0 = time.time()
                for r, job in jobs:
                    running[r.name] = (r, job, t0)
                    self._submitted(r, job, t0)
            last_force = time.time()
            while pending or running:
                while local and pending and len(running) < limit:
                    r = pending.pop(0)
                    slot = next((i for i in range(len(slots)) if i not in held.values()), None)
                    cores = slots[slot] if slot is not None else None
                    job = executor.submit(fn, *self._args(r), cores)
                    started = time.time()
                    running[r.name] = (r, job, started)
                    if slot is not None:
                        held[r.name] = slot
                    self._submitted(r, job, started, cores)
                force = not local and time.time() - last_force > 10
                if force:
                    last_force = time.time()
                for name in list(running):
                    r, job, t0 = running[name]
                    try:
                        done = job.done(force_check=force) and (local or not requeued(job))
                    except Exception:  # accounting hiccup: try again at the next poll
                        done = False
                    if done:
                        del running[name]
                        held.pop(name, None)
                        out = self._collect(r, job, t0)
                        pace.record(out)
                        now = time.time()
                        going = {n: now - t for n, (_, _, t) in running.items()}
                        self._finish(out, pace.line(going, [p.name for p in pending]))
                if held and not pending and len(held) < len(slots):
                    self._spread(running, held)
                if pending or running:
                    time.sleep(self.poll_s)
        except KeyboardInterrupt:
            # local jobs stop with the sweep (they resume when it is run again); SLURM jobs keep
            # running on the cluster and stay "running" here, so a re-run waits for them
            if local:
                for name, (_, job, _) in running.items():
                    try:
                        job.cancel(check=False)
                    except Exception:
                        pass
                    self._record(name, status="interrupted", error="the sweep was interrupted")
                    self._close_mlflow_run(self.plan.run(name), "KILLED")
            raise
        return self.outcomes

    def _spread(self, running: dict, held: dict[str, int]) -> None:
        """No run waits for a share of the cores: the runs still held to theirs get all of this
        process's CPUs (a run alone on one core of two would leave the other idle)."""
        cpus = sorted(os.sched_getaffinity(0))
        for name in list(held):
            _, job, _ = running[name]
            hold_to(int(job.job_id), cpus)
            del held[name]
            self._record(name, cores=None)
            self.say(f"{name}: given cores {','.join(map(str, cpus))} (no run waits for a share)")

    def _collect(self, run: PlannedRun, job, t0: float) -> Outcome:
        out = Outcome(
            name=run.name,
            status="finished",
            job_id=str(job.job_id),
            log=str(job.paths.stderr),
            stdout=str(job.paths.stdout),
            seconds=time.time() - t0,
        )
        state = _state(job)
        if not job.paths.result_pickle.exists() and state.startswith(_BAD_STATES):
            # SLURM ended the job without a result (scancel, time limit, OOM): no need to wait
            out.status = (
                "timeout"
                if state.startswith(("TIMEOUT", "DEADLINE"))
                else ("cancelled" if state.startswith("CANCELLED") else "failed")
            )
            out.error = f"job {job.job_id} ended with state {state}"
            return out
        if not job.paths.result_pickle.exists() and state == "INTERRUPTED":
            out.status, out.error = "cancelled", f"job {job.job_id} was killed by a signal"
            return out
        try:
            # one result per task: rank 0's is the run's (the others raise here if they failed)
            out.summary = job.results()[0] or {}
        except submitit.core.utils.FailedJobError as e:  # the training raised (a subclass of the next)
            out.status, out.error = "failed", _error_line(e)
        except submitit.core.utils.UncompletedJobError as e:
            state = _state(job)
            out.status = (
                "cancelled"
                if state.startswith("CANCELLED")
                else ("timeout" if state.startswith("TIMEOUT") else "failed")
            )
            out.error = f"job {job.job_id} did not complete (state {state}): {_error_line(e)}"
        except Exception as e:  # FailedJobError: the training raised
            out.status, out.error = "failed", _error_line(e)
        return out
