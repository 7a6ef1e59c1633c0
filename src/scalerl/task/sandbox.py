"""Run an untrusted program in a separate, limited process and bring back only its results, as plain data.

Generated code may loop forever, fork without end, allocate or print without bound, write over
the run's files, open sockets, crash, or try to fool the grader; none of that may stop the run,
touch its files or change a verdict. Each call of :func:`run_program` starts a fresh
``python -I -S`` (isolated: no environment variables, no user site, no site-packages) in a new
session, in a throwaway directory, runs the program, then calls its function on each test input it
is given and reports each result as plain data (:mod:`scalerl.task.plain`: builtin types only,
type and value). **The verdict is not made there**: the expected values, the tests and the
comparison stay in this process (:mod:`scalerl.task.grader`), so no frame, builtin, module, object,
exit code or printed text of the program can change it; a forged report has to hold the right
values, which is solving the problem. Every failure scores 0 and has a *kind* (:data:`KINDS`),
which the loop counts as ``data/verifier_<kind>``.

**The boundary** (:func:`resolve`, from ``task.sandbox``, logged once by the task): the program runs
behind one of :data:`STRONG` unless the run names a weak one. ``bwrap`` (bubblewrap, Debian package
``bubblewrap``, installed by ``.ci/install_system.sh``) and ``userns`` (built from what the kernel
offers where bubblewrap is absent: util-linux's ``unshare``, ``mount``, ``pivot_root`` and ``setpriv``,
the same view) both give new user, mount, network, PID, IPC and UTS namespaces; a new root holding
only ``/usr``, the interpreter's own folder and a ``/dev`` of ``null``, ``zero`` and ``urandom``, all
read-only, with every folder of installed packages (:func:`_hidden_roots`: the venv's, the base
interpreter's, the user's and the system's ``site-packages``/``dist-packages``) an empty read-only
folder; a ``/proc`` of its own PID namespace (the training process is not there to read, write or
signal); no capabilities at all (nothing can be remounted, unhidden, traced or made); its own
folder the one writable place; no network; it dies with its parent. Where neither works,
``task.sandbox=strong`` (the default) is refused at config time, one line saying what to install.
The weak ones, only by name: ``unshare`` (``unshare --net --pid``: an empty network namespace and a
PID namespace of its own) and ``none`` (the limits below and the audit hook only); there a program
that disarms the audit hook can read what the user can, and the training process's memory. The
audit hook (:pep:`578`) is a second layer in every case; it runs in the program's interpreter, so
on its own it stops accidents and crude attacks, not a determined adversary (a ``gc`` walk finds
and disarms it; native code would bypass it).

What each limit rests on:

* **time**: a wall-clock deadline in this process (the whole process group is killed with SIGKILL;
  under bwrap the PID namespace dies with it), and ``RLIMIT_CPU`` in the child. Kind ``timeout``.
  The deadline counts from the moment the harness starts the program (a byte on the report pipe,
  written before the program's first line runs, so the program cannot forge it): the sandbox's own
  start (namespaces, the interpreter) takes 0.03-0.2 s on a quiet machine and seconds on a loaded
  one, and a correct program must not be scored 0 for the machine's load. The start itself has
  :data:`START_S`.
* **memory**: ``RLIMIT_AS`` (address space); Python raises ``MemoryError``. Kind ``memory``.
* **output**: at most ``max_output_bytes`` of stdout+stderr (and ``max_report_bytes`` of results)
  are read, then the group is killed; ``RLIMIT_FSIZE`` caps any file it writes at the same size.
  Kind ``output``.
* **processes** (fork bombs): the audit hook ends the program at its first attempt to fork, exec,
  spawn or signal a process; ``RLIMIT_NPROC`` = 0 also stops new processes and threads for users
  other than root; under bwrap and userns every process it made dies with its PID namespace. Kind ``process``.
* **network**: every boundary's but none's empty network namespace (holds for native code too), and the
  audit hook at the first socket or name lookup. Kind ``network``.
* **files**: the working directory, ``HOME`` and ``TMPDIR`` are a new temporary directory, removed
  afterwards; under bwrap and userns it is a tmpfs of its own that holds at most
  :attr:`Limits.folder_bytes` (a write past it fails with ``ENOSPC``, so a program cannot fill the
  machine's disk with many files each under ``RLIMIT_FSIZE``), and nothing else of the machine's files is there to see but the system and
  the interpreter, read-only. The audit hook ends the program when it writes, removes, renames,
  links or changes a file outside that directory, or renames or hard-links one from outside into it
  (kind ``file_write``), opens a device other than ``/dev/null``, ``/dev/zero`` and ``/dev/urandom``
  (one it made in its folder: kind ``forbidden``), or opens or lists anything
  outside it and the standard library (kind ``file_read``; every folder of installed packages is
  outside, wherever the package is installed: they hold the HumanEval answers). It checks the path as a plain ``str`` (a subclass's own methods could fool
  it), with its own copies of ``os.path``, ``os`` and the builtins (which the program may patch),
  and it refuses to open a directory (kind ``forbidden``): a directory's descriptor, passed as
  ``dir_fd``, would resolve a path somewhere else than the hook sees it.
* code that does not compile is kind ``syntax``; a program that raises at its top level is kind
  ``crash``; one that ends its process before it reports every result (``os._exit``, a signal to
  itself) is kind ``no_report``; one whose report is malformed or hostile (forged on the report's
  descriptor, which the program can reach: a float out of range, a collection flooded with one hash)
  is kind ``bad_report``, decoded in bounded work (:func:`_decode_report`). ``ctypes`` cannot be imported (kind
  ``forbidden``), nor can the modules that reach files or processes without an audit event
  (``tkinter``: Tcl's ``exec`` and ``open``; ``sqlite3``: ``ATTACH``; ``readline``; shared memory)
  or make an interpreter without the hook (``_xxsubinterpreters``; making one is refused however it
  is asked for), nor ``_posixsubprocess``, ``multiprocessing`` or ``concurrent`` (kind ``process``),
  under any name (``x._ctypes`` loads ``_ctypes``); ``resource.setrlimit`` cannot be called (kind
  ``forbidden``).
* the grader adds ``result_type`` (a result that is not plain data: an object with its own
  ``__eq__``, a subclass of ``int``, a generator ...) and ``crash`` (the function raised where the
  tests did not expect it).

The limits are set by the child itself, in the harness that runs before the program, rather
than in a ``preexec_fn``: the training process has threads (torch's, the pipeline's), and a
``preexec_fn`` after ``fork`` in a threaded process can deadlock (the ``subprocess`` docs warn of
it). Nothing of the program runs before they are in place.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from scalerl.task import plain

# failure kinds, each counted as data/verifier_<kind>; a plain wrong answer has none
KINDS = (
    "timeout",
    "memory",
    "output",
    "process",
    "network",
    "file_write",
    "file_read",
    "forbidden",
    "syntax",
    "crash",
    "no_report",
    "bad_report",
    "result_type",
)
BOUNDARIES = ("bwrap", "userns", "unshare", "none")  # strongest first
STRONG = ("bwrap", "userns")  # a mount namespace with a read-only system, its own /proc, no capabilities
WEAK = (
    "unshare",
    "none",
)  # only where a run names them (task.sandbox): the program can reach the user's files
SETTINGS = ("strong", *BOUNDARIES)  # task.sandbox

# exit codes of the harness (what the parent reads them as)
_CRASH = 4
_EXIT_KINDS = {
    5: "memory",
    6: "process",
    7: "network",
    8: "file_write",
    9: "file_read",
    10: "forbidden",
    11: "output",
    12: "syntax",
}
_CODES = {"crash": _CRASH, **{kind: code for code, kind in _EXIT_KINDS.items()}}

# The child's whole program: read the job from stdin, set the limits, install the audit hook, run
# the code, then call its functions and write their results (plain data) to the report pipe. Only
# this code runs before the limits are in place. It decides nothing: the parent grades.
_HARNESS = r"""
import builtins, errno, importlib.util, json, os, resource, stat, sys
from json.encoder import encode_basestring_ascii as quote  # C: PyUnicode_Check, not isinstance

def _main():
    # the harness's own builtins and path functions (locals, not globals of __main__, which the program
    # can import): a program that patches builtins, os, os.path or stat (builtins.isinstance = ...,
    # os.fspath = ...) changes what it calls itself, not what the harness does
    pristine = dict(builtins.__dict__)
    isinstance, any, str, bytes = (pristine[name] for name in ("isinstance", "any", "str", "bytes"))
    paths = {"__builtins__": pristine, "__name__": "paths"}
    exec(importlib.util.find_spec("posixpath").loader.get_code("posixpath"), paths)
    for name, module in (("os", os), ("stat", stat)):
        paths[name] = type(sys)(name)
        paths[name].__dict__.update(module.__dict__)
    job = json.loads(sys.stdin.read())
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    report_fd = job["report_fd"]
    home = os.path.realpath(job["dir"])
    # the standard library: where this interpreter imports from (its sys.path: -S adds no site)
    roots = tuple(os.path.realpath(r) for r in [*job["read_roots"], *sys.path] if r)
    hidden = tuple(os.path.realpath(r) for r in job["hidden_roots"])
    codes = job["codes"]
    W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    DIRECTORY = getattr(os, "O_DIRECTORY", 0)
    write, exit_now = os.write, os._exit
    realpath, fspath, stat_of = paths["realpath"], os.fspath, os.stat
    S_ISDIR, S_ISCHR, S_ISBLK = stat.S_ISDIR, stat.S_ISCHR, stat.S_ISBLK
    DEVICES = ("/dev/null", "/dev/urandom", "/dev/zero")
    fs_codec = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())

    def bye(code):
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:
                pass
        exit_now(code)

    out = lambda kind: bye(codes[kind])

    def plain_path(path):
        # an exact str: a subclass's own methods (startswith, partition ...) would fool realpath
        path = fspath(path)
        return str.__str__(path) if isinstance(path, str) else bytes.decode(path, *fs_codec)

    def inside(path, places):
        if isinstance(path, int):
            return True  # an already open descriptor
        p = realpath(plain_path(path))
        return p in DEVICES or any(
            p == r or p.startswith(r + "/") for r in places)

    def mode_of(path):
        try:
            return stat_of(plain_path(path)).st_mode
        except (OSError, ValueError):
            return 0

    def readable(path):
        return inside(path, (home,)) or (inside(path, roots) and not inside(path, hidden))

    spawn = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
             "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill"}
    changes = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
               "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "shutil.rmtree", "os.mkfifo",
               "os.mknod"}
    copies = {"os.symlink", "shutil.copyfile", "shutil.copytree"}
    moves = {"os.rename", "os.link", "shutil.move"}  # a hard link writes to its source; a rename removes it
    spawners = {"_posixsubprocess", "multiprocessing", "concurrent"}  # fork without an audit event
    # native code, or files and processes reached without an audit event (Tcl's exec and open,
    # SQLite's ATTACH, readline's history files, shared memory, an interpreter without this hook)
    natives = {"ctypes", "_ctypes", "_tkinter", "_sqlite3", "readline", "_posixshmem",
               "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels"}

    def hook(event, args):
        if event in spawn:
            out("process")
        elif event.startswith("socket."):
            out("network")
        elif event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & W)
            if path is None:
                return
            st_mode = 0 if isinstance(path, int) else mode_of(path)
            if S_ISDIR(st_mode) or isinstance(flags, int) and flags & DIRECTORY:
                out("forbidden")  # a directory's descriptor, as dir_fd, resolves paths this hook never sees
            if (S_ISCHR(st_mode) or S_ISBLK(st_mode)) and realpath(plain_path(path)) not in DEVICES:
                out("forbidden")  # a device node it made in its folder (os.mknod has no audit event): the disk
            if writing and not inside(path, (home,)):
                out("file_write")
            if not writing and not readable(path):
                out("file_read")
        elif event in changes:
            if not inside(args[0], (home,)):
                out("file_write")
        elif event in copies:
            if not (readable(args[0]) and inside(args[1], (home,))):
                out("file_write")
        elif event in moves:
            if not (inside(args[0], (home,)) and inside(args[1], (home,))):
                out("file_write")
        elif event in ("os.listdir", "os.scandir"):
            if args and args[0] is not None and not readable(args[0]):
                out("file_read")
        elif event in ("resource.setrlimit", "resource.prlimit", "ctypes.dlopen", "sys.remote_exec",
                       "cpython.PyInterpreterState_New"):
            out("forbidden")
        elif event == "import" and spawners.intersection(args[0].split(".")):
            out("process")
        elif event == "import" and natives.intersection(args[0].split(".")):  # "x._tkinter" loads it too
            out("forbidden")

    for name, value in (("RLIMIT_CPU", job["cpu_s"]), ("RLIMIT_AS", job["memory_bytes"]),
                        ("RLIMIT_FSIZE", job["file_bytes"]), ("RLIMIT_NPROC", 0), ("RLIMIT_CORE", 0)):
        limit = getattr(resource, name, None)
        if limit is not None:
            hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, then SIGKILL
            try:
                resource.setrlimit(limit, (value, hard))
            except (ValueError, OSError):
                pass

    def crashed(e):
        if isinstance(e, OSError) and e.errno == errno.EFBIG:  # EFBIG: over RLIMIT_FSIZE (SIGXFSZ is ignored)
            out("output")
        import traceback
        traceback.print_exc(limit=3)
        bye(codes["crash"])

    sys.addaudithook(hook)
    kind_of, text = type, str
    codec = {"__builtins__": pristine, "__name__": "plain"}
    exec(job["codec"], codec)
    encode, decode, to_json = codec["encode"], codec["decode"], codec["to_json"]
    calls = [(name, decode(args)) for name, args in job["calls"]]  # each args: a tuple
    ns = {"__name__": "__main__"}
    write(report_fd, b"+")  # the program starts now: its time limit counts from here
    try:
        program = compile(job["code"], "<program>", "exec")
    except (SyntaxError, ValueError):  # not Python (ValueError: a null byte)
        bye(codes["syntax"])
    try:
        exec(program, ns)
    except MemoryError:
        bye(codes["memory"])
    except BaseException as e:
        crashed(e)
    results = []
    for name, args in calls:
        fn = ns.get(name)
        if fn is None:
            results.append(["raise", "NameError"])
            continue
        try:
            value = fn(*args)
        except MemoryError:
            bye(codes["memory"])
        except BaseException as e:
            label = kind_of(e).__name__
            results.append(["raise", label if kind_of(label) is text else "?"])
            continue
        try:
            results.append(["ok", encode(value)])
        except MemoryError:
            bye(codes["memory"])
        except BaseException:
            label = kind_of(value).__name__
            results.append(["bad", label if kind_of(label) is text else "?"])
    try:
        data = to_json(results, quote).encode()
    except MemoryError:
        bye(codes["memory"])
    except BaseException as e:
        crashed(e)
    try:
        sys.__stdout__.flush()
    except BaseException:
        pass
    while data:
        data = data[write(report_fd, data):]
    exit_now(0)

_main()
"""


START_S = 60.0
"""The most the sandbox may take to start a program (before its own time limit begins)."""
STARTED = b"+"
"""The harness's first byte on the report pipe: the program starts."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0  # wall clock, the program and every call (from their start, not the sandbox's)
    cpu_s: int = 5  # CPU seconds
    memory_mb: int = 512  # address space
    max_output_bytes: int = 64 * 1024  # stdout + stderr read back; also the largest file it may write
    max_report_bytes: int = 2**20  # the results, as plain data

    @property
    def folder_bytes(self) -> int:
        """What the program's folder holds in all, behind bwrap and userns (a tmpfs of this size):
        ``FOLDER_FILES`` of its largest files. Its files were limited one by one only, and its
        folder was the machine's: many small files filled the machine's disk."""
        return FOLDER_FILES * int(self.max_output_bytes)


FOLDER_FILES = 16


@dataclass(frozen=True)
class Outcome:
    kind: str | None  # one of KINDS, or None: the program ran and reported a result for every call
    results: list | None  # per call: ("ok", value) | ("raise", exception name) | ("bad", type name)
    output: str  # what it printed (at most max_output_bytes), for debugging


class BadCalls(ValueError):
    """Calls that are not (function name, tuple of plain-data arguments)."""


class Unavailable(ValueError):
    """The boundary a ``task.sandbox`` setting asks for does not work here: one line, whose
    :attr:`allowed` says what to install or set."""

    def __init__(self, setting: str, allowed: str):
        self.setting, self.allowed = setting, allowed
        super().__init__(f"task.sandbox={setting}: must be {allowed}")


@functools.lru_cache(maxsize=1)
def boundary() -> str:
    """The strongest OS boundary that works here (:data:`BOUNDARIES`), tried once per process."""
    return available()[0]


@functools.lru_cache(maxsize=1)
def available() -> tuple[str, ...]:
    """Every boundary that works here, strongest first (``none`` always does)."""
    return tuple(name for name in BOUNDARIES if name == "none" or _works(name) is None)


def resolve(setting: str = "strong") -> str:
    """The boundary a ``task.sandbox`` setting (:data:`SETTINGS`) runs programs behind: ``strong`` is
    the strongest of :data:`STRONG` that works here; a boundary's own name is that boundary (the weak
    ones, :data:`WEAK`, only so: by name). :class:`Unavailable` where it does not work here."""
    if setting not in SETTINGS:
        raise ValueError(f"task.sandbox={setting!r}: must be one of {', '.join(SETTINGS)}")
    if setting == "strong":
        for name in STRONG:
            if name in available():
                return name
        why = "; ".join(f"{name}: {_works(name)}" for name in STRONG)
        raise Unavailable(
            setting,
            f"a strong boundary that works here, and none does ({why}): install bubblewrap (apt-get "
            "install bubblewrap) or allow unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1 kernel.apparmor_restrict_unprivileged_userns=0), or name "
            "a weak one, task.sandbox=unshare or task.sandbox=none (its programs can then read the user's "
            "files and reach the training process)",
        )
    if setting not in available():
        raise Unavailable(
            setting,
            f"a boundary that works here ({setting} {_works(setting)}; working: {', '.join(available())})",
        )
    return setting


def network_isolation() -> str:
    """The network part of :func:`boundary`: ``"namespace+audit-hook"`` (every boundary but none: an
    empty network namespace, which holds for native code too) or ``"audit-hook"`` (in-process only)."""
    return "audit-hook" if boundary() == "none" else "namespace+audit-hook"


def describe(name: str) -> str:
    """One line saying what the boundary ``name`` is, for the run's log."""
    return {
        "bwrap": "bubblewrap: new user/mount/network/PID/IPC/UTS namespaces, read-only system, "
        "every site-packages hidden, no capabilities, only its own folder (a sized tmpfs) writable",
        "userns": "user namespaces (unshare, mount, setpriv): new user/mount/network/PID/IPC/UTS "
        "namespaces, read-only system, every site-packages hidden, no capabilities, only its own "
        "folder (a sized tmpfs) writable",
        "unshare": "WEAK, chosen by task.sandbox=unshare: unshare --net --pid, an empty network "
        "namespace and its own PID namespace only; the program can read the user's files and the "
        "training process's memory",
        "none": "WEAK, chosen by task.sandbox=none: rlimits only; the program can read the user's "
        "files and the training process's memory",
    }[name] + "; audit hook as a second layer; grading out of process"


@functools.cache
def _works(name: str) -> str | None:
    """None where the boundary ``name`` runs a program here, else why not (one short phrase)."""
    tmp = tempfile.mkdtemp(prefix="scalerl-sandbox-probe-")
    try:
        cmd = _command(name, tmp)
        if cmd is None:
            return "not on this system" if sys.platform.startswith("linux") else "Linux only"
        r = subprocess.run([*cmd, "-c", "print('ok')"], capture_output=True, timeout=20, cwd=tmp)
        if r.returncode == 0 and r.stdout.strip() == b"ok":
            return None
        said = (r.stderr or r.stdout).decode("utf-8", "replace").strip().splitlines()
        return f"fails here (exit {r.returncode}: {said[-1][:160] if said else 'no message'})"
    except (OSError, subprocess.SubprocessError) as e:
        return f"fails here ({type(e).__name__}: {e})"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# the system's folders a program may see (read-only) behind bwrap and userns
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _system_binds() -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """What a strong boundary shows of the machine: ([(link, target)], [folders bound read-only],
    [installed-package folders among them, hidden by an empty read-only tmpfs]); the interpreter
    run is the real one behind a venv's link (:func:`_python`)."""
    links, bound = [], []
    for d in _SYSTEM:
        if os.path.islink(d):
            links.append((d, os.readlink(d)))
        elif os.path.isdir(d):
            bound.append(d)
    for d in sorted({os.path.realpath(sys.base_prefix), os.path.dirname(_python())}):
        if not any(_under(d, b) for b in bound):
            bound.append(d)
    hidden = [d for d in _hidden_roots() if os.path.isdir(d) and any(_under(d, b) for b in bound)]
    return links, bound, hidden


def _python() -> str:
    return os.path.realpath(sys.executable)  # a venv's python is a link to its base interpreter


def _command(name: str, tmp: str, folder_bytes: int = Limits().folder_bytes) -> list[str] | None:
    """The command line that starts ``python -I -S`` behind the boundary ``name`` (None: not here),
    its folder ``tmp`` a new tmpfs of ``folder_bytes`` behind bwrap and userns."""
    if name == "none":
        return [sys.executable, "-I", "-S"]
    if not sys.platform.startswith("linux"):
        return None
    if name == "unshare":
        exe = shutil.which("unshare")
        if exe is None:
            return None
        # its own PID namespace too: without one it could signal the training process (os.kill is
        # audited, os.pidfd_open and signal.pidfd_send_signal are not)
        prefix = [exe, "--net", "--pid", "--kill-child"]
        prefix += [] if os.geteuid() == 0 else ["--map-root-user"]
        return [*prefix, sys.executable, "-I", "-S"]
    if name == "userns":
        return _userns_command(tmp, folder_bytes)
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    links, bound, hidden = _system_binds()
    cmd = [exe, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
    for link, target in links:
        cmd += ["--symlink", target, link]
    for d in bound:
        cmd += ["--ro-bind", d, d]
    for d in hidden:  # installed packages: an empty, read-only folder in their place
        cmd += ["--tmpfs", d, "--remount-ro", d]
    real_tmp = os.path.realpath(tmp)
    cmd += ["--proc", "/proc", "--tmpfs", "/dev"]
    for n in ("null", "zero", "urandom"):
        cmd += ["--dev-bind", f"/dev/{n}", f"/dev/{n}"]
    cmd += ["--remount-ro", "/dev", "--tmpfs", "/tmp", "--size", str(folder_bytes), "--tmpfs", real_tmp]
    cmd += ["--remount-ro", "/tmp"]
    cmd += ["--remount-ro", "/", "--chdir", real_tmp, _python(), "-I", "-S"]
    return cmd


# Run as PID 1 of the new namespaces by `unshare`, as root of a user namespace of its own (mapped to
# the user who runs training, with every capability in these namespaces only): builds a new root on a
# tmpfs (the system folders bound read-only, installed packages hidden, a /proc of the new PID
# namespace, /dev with null, zero and urandom only, the program's folder the one writable place),
# makes it the root (pivot_root; the machine's root is unmounted, not only hidden), makes it
# read-only, then starts the program with no capabilities at all (bounding set, inheritable and
# ambient cleared, no_new_privs) as its child: the program cannot mount, unmount, ptrace or change
# anything of this, and sees no process but its own. Its exit status is the program's (128 + the
# signal that ended it, as bwrap's).
_USERNS_SETUP = r"""
set -eu
R="$JOB/.root"
mkdir "$R"
mount -t tmpfs -o mode=0755 scalerl-root "$R"
for link in $LINKS; do ln -s "${link#*=}" "$R${link%%=*}"; done
for d in $BOUND; do mkdir -p "$R$d"; mount --bind -o ro "$d" "$R$d"; done
for d in $HIDDEN; do mount -t tmpfs -o ro,mode=0555 scalerl-hidden "$R$d"; done
mkdir "$R/proc" "$R/dev" "$R/.old"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t tmpfs -o mode=0755 scalerl-dev "$R/dev"
for n in null zero urandom; do touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; done
mount -o remount,ro "$R/dev"
mkdir -p "$R$JOB"
mount -t tmpfs -o "size=$FOLDER,mode=0755" scalerl-job "$R$JOB"
cd "$R"
pivot_root . .old
umount -l /.old
rmdir /.old
mount -o remount,ro /
cd "$JOB"
unset JOB LINKS BOUND HIDDEN FOLDER R
set +e
setpriv --no-new-privs --bounding-set=-all --inh-caps=-all --ambient-caps=-all -- "$@"
exit $?
"""


def _which(tool: str) -> str | None:
    """``tool`` on the PATH, else in the system's sbin folders: util-linux installs ``pivot_root`` in
    /usr/sbin, which a user's PATH other than root's does not hold (Debian's default), and userns was
    then taken for missing where it works."""
    return shutil.which(tool) or shutil.which(tool, path=os.pathsep.join(("/usr/sbin", "/sbin")))


def _userns_command(tmp: str, folder_bytes: int) -> list[str] | None:
    tools = {t: _which(t) for t in ("unshare", "setpriv", "mount", "umount", "pivot_root", "sh")}
    if None in tools.values():
        return None
    links, bound, hidden = _system_binds()
    if any(" " in p or "=" in p for p in [*bound, *hidden, *(x for pair in links for x in pair)]):
        return None  # the setup splits these lists on spaces
    env = [
        f"JOB={os.path.realpath(tmp)}",
        f"FOLDER={int(folder_bytes)}",
        "LINKS=" + " ".join(f"{link}={target}" for link, target in links),
        "BOUND=" + " ".join(bound),
        "HIDDEN=" + " ".join(hidden),
        "PATH=/usr/bin:/bin:/usr/sbin:/sbin",
    ]
    unshare = [tools["unshare"], "--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--uts"]
    unshare += ["--fork", "--kill-child", "--propagation", "private"]
    return [*unshare, "env", *env, tools["sh"], "-c", _USERNS_SETUP, "sh", _python(), "-I", "-S"]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.lru_cache(maxsize=1)
def _read_roots() -> tuple[str, ...]:
    """The standard library's folders: a program may import from them (and read them)."""
    paths = sysconfig.get_paths()
    return tuple(sorted({paths[k] for k in ("stdlib", "platstdlib") if k in paths}))


@functools.lru_cache(maxsize=1)
def _hidden_roots() -> tuple[str, ...]:
    """Every folder of installed packages (site-packages, dist-packages) of this interpreter, of the
    base interpreter behind a venv, of the user and of the system's Pythons: not for the program to
    read (they hold the HumanEval answers, and native modules such as ``_cffi_backend`` that reach
    files with no audit event). The same wherever the package is installed."""
    import glob
    import site

    found = set()
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for paths in (sysconfig.get_paths(), sysconfig.get_paths(vars=base)):
        found.update(paths[k] for k in ("purelib", "platlib") if k in paths)
    found.update(getattr(site, "getsitepackages", list)())
    found.add(site.getusersitepackages())
    for prefix in {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, "/usr", "/usr/local"}:
        found.update(glob.glob(os.path.join(prefix, "lib*", "python3*", "*-packages")))
    return tuple(sorted({os.path.realpath(p) for p in found if p}))


@functools.lru_cache(maxsize=1)
def _codec_source() -> str:
    return Path(plain.__file__).read_text()


def encode_calls(calls) -> list:
    """``calls`` (function name, argument tuple) as the job's plain data; :class:`BadCalls` if not plain."""
    out = []
    for name, args in calls:
        if not isinstance(name, str) or not isinstance(args, tuple):
            raise BadCalls(f"call {name!r}{args!r}: must be (function name, tuple of arguments)")
        try:
            out.append([name, plain.encode(args)])
        except plain.NotPlain as e:
            raise BadCalls(f"call {name}{args!r}: an argument is not plain data ({e})") from None
    return out


def run_program(code: str, calls, limits: Limits = Limits(), *, boundary_name: str | None = None) -> Outcome:
    """Run ``code``, then call ``name(*args)`` for each of ``calls`` (pairs of a function name and a
    tuple of plain-data arguments, or the list :func:`encode_calls` made of them), in a fresh
    sandboxed process behind ``boundary_name`` (default: the strongest of :data:`STRONG`,
    :class:`Unavailable` where none works). Returns the results as plain data, or the kind of
    failure. Never raises for anything the program does."""
    encoded = calls if calls and isinstance(calls[0], list) else encode_calls(calls)
    name = resolve("strong") if boundary_name is None else boundary_name
    if name not in BOUNDARIES:
        raise ValueError(f"boundary_name={name!r}: must be one of {', '.join(BOUNDARIES)}")
    read_fd, write_fd = os.pipe()
    job = {
        "code": code,
        "calls": encoded,
        "codec": _codec_source(),
        "report_fd": write_fd,
        "cpu_s": max(1, int(limits.cpu_s)),
        "memory_bytes": int(limits.memory_mb) * 2**20,
        "file_bytes": int(limits.max_output_bytes),
        "read_roots": list(_read_roots()),
        "hidden_roots": list(_hidden_roots()),
        "codes": _CODES,
    }
    tmp = tempfile.mkdtemp(prefix="scalerl-sandbox-")
    job["dir"] = tmp
    env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"}
    cmd = _command(name, tmp, limits.folder_bytes)
    if cmd is None:
        raise ValueError(f"boundary_name={name!r}: not available on this system")
    proc = None
    try:
        try:
            proc = subprocess.Popen(
                [*cmd, "-c", _HARNESS],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=tmp,
                env=env,
                start_new_session=True,  # its own process group: killed as a whole
                close_fds=True,
                pass_fds=(write_fd,),
            )
        finally:
            os.close(write_fd)  # the child holds the only writer: EOF when it is gone
        deadline = time.monotonic() + START_S + float(limits.timeout_s)
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        caps = {proc.stdout.fileno(): int(limits.max_output_bytes), read_fd: int(limits.max_report_bytes)}
        data, over, timed_out, deadline = _read_capped(
            caps, deadline, started=(read_fd, float(limits.timeout_s))
        )
        if not (over or timed_out):
            timed_out = not _exited(proc, deadline)
        _kill_group(proc.pid)
        rc = proc.wait()
    finally:
        if proc is not None and proc.returncode is None:
            _kill_group(proc.pid)
            proc.wait()
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        os.close(read_fd)
        shutil.rmtree(tmp, ignore_errors=True)
    text = data[0].decode("utf-8", "replace")
    if timed_out:
        return Outcome("timeout", None, text)
    if over:
        return Outcome("output", None, text)
    if rc > 128 and name in STRONG:  # bwrap and userns's setup exit 128 + the signal that ended the program
        rc = -(rc - 128)
    if rc in _EXIT_KINDS:
        return Outcome(_EXIT_KINDS[rc], None, text)
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit (soft, then hard)
        return Outcome("timeout", None, text)
    if rc == -signal.SIGXFSZ:
        return Outcome("output", None, text)
    if rc != 0:
        return Outcome("crash", None, text)
    report = data[1][len(STARTED) :] if data[1].startswith(STARTED) else b""
    if not report:
        return Outcome("no_report", None, text)
    results = _decode_report(report, len(encoded))
    if results is None:
        return Outcome("bad_report", None, text)
    return Outcome(None, results, text)


def _decode_report(blob: bytes, n: int) -> list | None:
    """The child's report: exactly ``n`` results, each well formed; None for anything else. Bounded
    by construction, whatever the program wrote there (it can forge this pipe): at most
    ``max_report_bytes`` long (:func:`_read_capped`), JSON and plain data nested at most about a
    hundred deep, no float out of range, no collection flooded with one hash (:func:`plain.decode`),
    so neither an exception nor quadratic work reaches the verifier's thread."""
    try:
        raw = json.loads(blob.decode("utf-8"))
        if type(raw) is not list or len(raw) != n:
            return None
        out = []
        for r in raw:
            if type(r) is not list or len(r) != 2 or r[0] not in ("ok", "raise", "bad"):
                return None
            if r[0] == "ok":
                out.append(("ok", plain.decode(r[1])))
            elif type(r[1]) is str:
                out.append((r[0], r[1][:200]))
            else:
                return None
        return out
    except (ValueError, RecursionError, MemoryError, UnicodeDecodeError, TypeError, OverflowError):
        return None


def _read_capped(
    caps: dict[int, int], deadline: float, started: tuple[int, float] | None = None
) -> tuple[list[bytes], bool, bool, float]:
    """([output of each fd, in ``caps``' order], over a cap, past the deadline, the deadline at the
    end): read every fd until EOF, a cap or the deadline. ``started``: (fd, seconds): when the
    first byte arrives on that fd, the deadline becomes that many seconds from then."""
    fds = list(caps)
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    sizes = dict.fromkeys(fds, 0)
    open_fds = set(fds)

    def result(over: bool, late: bool):
        return [b"".join(chunks[fd])[: caps[fd]] for fd in fds], over, late, deadline

    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return result(False, True)
            for key, _ in sel.select(left):
                fd = key.fd
                block = os.read(fd, 65536)
                if not block:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                if started is not None and fd == started[0] and not sizes[fd]:
                    deadline = time.monotonic() + started[1]
                chunks[fd].append(block)
                sizes[fd] += len(block)
                if sizes[fd] > caps[fd]:
                    return result(True, False)
    return result(False, False)


def _exited(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until the program exits or the deadline passes; True if it exited. Where ``os.waitid``
    exists (Linux) it waits without reaping, so its process group cannot be reused before it is
    killed; elsewhere (macOS before Python 3.13) it reaps."""
    if not hasattr(os, "waitid"):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    while True:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
