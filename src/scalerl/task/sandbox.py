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

**The boundary** (:func:`boundary`, chosen once per process and logged once by the task): where
bubblewrap works (``bwrap``, Debian package ``bubblewrap``, installed by ``.ci/install_system.sh``),
the child runs in new user, mount, network, PID, IPC and UTS namespaces with a read-only view of
``/usr`` and the interpreter's own folder (its ``site-packages`` hidden), an empty ``/tmp`` with only
its own folder writable, its own ``/proc`` and no network at all; it dies with its parent. Else
``unshare --net --pid`` (a new, empty network namespace and a PID namespace of its own, so that it
cannot signal the training process) where the system allows it; else none (``none``: the limits
below and the audit hook only). The audit hook (:pep:`578`) is a second layer in every
case; it runs in the program's interpreter, so on its own it stops accidents and crude attacks, not
a determined adversary with native code (which ``ctypes`` would give; it cannot be imported).

What each limit rests on:

* **time**: a wall-clock deadline in this process (the whole process group is killed with SIGKILL;
  under bwrap the PID namespace dies with it), and ``RLIMIT_CPU`` in the child. Kind ``timeout``.
* **memory**: ``RLIMIT_AS`` (address space); Python raises ``MemoryError``. Kind ``memory``.
* **output**: at most ``max_output_bytes`` of stdout+stderr (and ``max_report_bytes`` of results)
  are read, then the group is killed; ``RLIMIT_FSIZE`` caps any file it writes at the same size.
  Kind ``output``.
* **processes** (fork bombs): the audit hook ends the program at its first attempt to fork, exec,
  spawn or signal a process; ``RLIMIT_NPROC`` = 0 also stops new processes and threads for users
  other than root; under bwrap every process it made dies with its PID namespace. Kind ``process``.
* **network**: bwrap's or unshare's empty network namespace (holds for native code too), and the
  audit hook at the first socket or name lookup. Kind ``network``.
* **files**: the working directory, ``HOME`` and ``TMPDIR`` are a new temporary directory, removed
  afterwards; under bwrap nothing else of the machine's files is there to see but the system and
  the interpreter, read-only. The audit hook ends the program when it writes, removes, renames,
  links or changes a file outside that directory, or renames or hard-links one from outside into it
  (kind ``file_write``), opens a device other than ``/dev/null``, ``/dev/zero`` and ``/dev/urandom``
  (one it made in its folder: kind ``forbidden``), or opens or lists anything
  outside it and the standard library (kind ``file_read``; ``site-packages`` is outside: it holds
  the HumanEval answers). It checks the path as a plain ``str`` (a subclass's own methods could fool
  it), with its own copies of ``os.path``, ``os`` and the builtins (which the program may patch),
  and it refuses to open a directory (kind ``forbidden``): a directory's descriptor, passed as
  ``dir_fd``, would resolve a path somewhere else than the hook sees it.
* code that does not compile is kind ``syntax``; a program that raises at its top level is kind
  ``crash``; one that ends its process before it reports every result (``os._exit``, a signal to
  itself) or reports a malformed one is kind ``no_report``. ``ctypes`` cannot be imported (kind
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
    "result_type",
)
BOUNDARIES = ("bwrap", "unshare", "none")  # strongest first

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


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0  # wall clock, whole run (the program and every call)
    cpu_s: int = 5  # CPU seconds
    memory_mb: int = 512  # address space
    max_output_bytes: int = 64 * 1024  # stdout + stderr read back; also the largest file it may write
    max_report_bytes: int = 2**20  # the results, as plain data


@dataclass(frozen=True)
class Outcome:
    kind: str | None  # one of KINDS, or None: the program ran and reported a result for every call
    results: list | None  # per call: ("ok", value) | ("raise", exception name) | ("bad", type name)
    output: str  # what it printed (at most max_output_bytes), for debugging


class BadCalls(ValueError):
    """Calls that are not (function name, tuple of plain-data arguments)."""


@functools.lru_cache(maxsize=1)
def boundary() -> str:
    """The strongest OS boundary that works here (:data:`BOUNDARIES`), tried once per process."""
    for name in BOUNDARIES[:-1]:
        if _works(name):
            return name
    return "none"


@functools.lru_cache(maxsize=1)
def available() -> tuple[str, ...]:
    """Every boundary that works here, strongest first (``none`` always does)."""
    return tuple(name for name in BOUNDARIES if name == "none" or _works(name))


def network_isolation() -> str:
    """The network part of :func:`boundary`: ``"namespace+audit-hook"`` (bwrap or unshare: an empty
    network namespace, which holds for native code too) or ``"audit-hook"`` (in-process only)."""
    return "audit-hook" if boundary() == "none" else "namespace+audit-hook"


def describe(name: str) -> str:
    """One line saying what the boundary ``name`` is, for the run's log."""
    return {
        "bwrap": "bubblewrap: new user/mount/network/PID/IPC/UTS namespaces, read-only system, "
        "only its own folder writable",
        "unshare": "unshare --net --pid: an empty network namespace and its own PID namespace only "
        "(bubblewrap unavailable here)",
        "none": "none: rlimits only (neither bubblewrap nor unshare works here)",
    }[name] + "; audit hook as a second layer; grading out of process"


def _works(name: str) -> bool:
    tmp = tempfile.mkdtemp(prefix="scalerl-sandbox-probe-")
    try:
        cmd = _command(name, tmp)
        if cmd is None:
            return False
        r = subprocess.run([*cmd, "-c", "print('ok')"], capture_output=True, timeout=20, cwd=tmp)
        return r.returncode == 0 and r.stdout.strip() == b"ok"
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _command(name: str, tmp: str) -> list[str] | None:
    """The command line that starts ``python -I -S`` behind the boundary ``name`` (None: not here)."""
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
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    python = os.path.realpath(sys.executable)  # a venv's python is a link to its base interpreter
    cmd = [exe, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
    bound: list[str] = []
    for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            cmd += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
            bound.append(d)
    for d in {os.path.realpath(sys.base_prefix), os.path.dirname(python)}:
        if not any(_under(d, b) for b in bound):
            cmd += ["--ro-bind", d, d]
            bound.append(d)
    for d in _hidden_roots():  # site-packages: an empty folder in its place
        if os.path.isdir(d) and any(_under(d, b) for b in bound):
            cmd += ["--tmpfs", d]
    real_tmp = os.path.realpath(tmp)
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", real_tmp, real_tmp]
    cmd += ["--chdir", real_tmp, python, "-I", "-S"]
    return cmd


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.lru_cache(maxsize=1)
def _read_roots() -> tuple[str, ...]:
    """The standard library's folders: a program may import from them (and read them)."""
    paths = sysconfig.get_paths()
    return tuple(sorted({paths[k] for k in ("stdlib", "platstdlib") if k in paths}))


@functools.lru_cache(maxsize=1)
def _hidden_roots() -> tuple[str, ...]:
    """Installed packages (inside the standard library's folder): not for the program to read."""
    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.realpath(paths[k]) for k in ("purelib", "platlib") if k in paths}))


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
    sandboxed process behind ``boundary_name`` (default: :func:`boundary`). Returns the results as
    plain data, or the kind of failure. Never raises for anything the program does."""
    encoded = calls if calls and isinstance(calls[0], list) else encode_calls(calls)
    name = boundary() if boundary_name is None else boundary_name
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
    cmd = _command(name, tmp)
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
        deadline = time.monotonic() + float(limits.timeout_s)
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        caps = {proc.stdout.fileno(): int(limits.max_output_bytes), read_fd: int(limits.max_report_bytes)}
        data, over, timed_out = _read_capped(caps, deadline)
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
    if rc > 128 and name == "bwrap":  # bwrap exits 128 + the signal that ended its child
        rc = -(rc - 128)
    if rc in _EXIT_KINDS:
        return Outcome(_EXIT_KINDS[rc], None, text)
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit (soft, then hard)
        return Outcome("timeout", None, text)
    if rc == -signal.SIGXFSZ:
        return Outcome("output", None, text)
    if rc != 0:
        return Outcome("crash", None, text)
    results = _decode_report(data[1], len(encoded))
    if results is None:
        return Outcome("no_report", None, text)
    return Outcome(None, results, text)


def _decode_report(blob: bytes, n: int) -> list | None:
    """The child's report: exactly ``n`` results, each well formed; None for anything else."""
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
    except (ValueError, RecursionError, MemoryError, UnicodeDecodeError):
        return None


def _read_capped(caps: dict[int, int], deadline: float) -> tuple[list[bytes], bool, bool]:
    """([output of each fd, in ``caps``' order], over a cap, past the deadline): read every fd until
    EOF, a cap or the deadline."""
    fds = list(caps)
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    sizes = dict.fromkeys(fds, 0)
    open_fds = set(fds)

    def result(over: bool, late: bool):
        return [b"".join(chunks[fd])[: caps[fd]] for fd in fds], over, late

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
