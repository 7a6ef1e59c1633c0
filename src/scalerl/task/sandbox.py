"""Run an untrusted program and its unit tests in a separate, limited process.

Generated code may loop forever, fork without end, allocate or print without bound, write over
the run's files, open sockets or simply crash; none of that may stop the run or touch its files.
Each call of :func:`run_program` starts a fresh ``python -I -S`` (isolated: no environment
variables, no user site, no site-packages) in a new session, in a throwaway directory, and reads
its output itself. Every failure scores 0 and has a *kind* (:data:`KINDS`), which the loop counts
as ``data/verifier_<kind>``.

What each limit rests on (and its honest limits):

* **time**: a wall-clock deadline in this process (the whole process group is killed with SIGKILL),
  and ``RLIMIT_CPU`` in the child. Kind ``timeout``.
* **memory**: ``RLIMIT_AS`` (address space); Python raises ``MemoryError``. Kind ``memory``.
* **output**: at most ``max_output_bytes`` of stdout+stderr are read, then the group is killed;
  ``RLIMIT_FSIZE`` caps any file it writes at the same size (the write fails with ``EFBIG``).
  Kind ``output``.
* **processes** (fork bombs): an audit hook (:pep:`578`) ends the program at its first attempt to
  fork, exec, spawn or signal a process; ``RLIMIT_NPROC`` = 0 also stops new processes and threads
  for users other than root (root is exempt from it). Kind ``process``.
* **network**: the audit hook ends the program at its first socket or name lookup (always active);
  when the system allows it, the program also runs in a new, empty network namespace
  (``unshare --net``, see :func:`network_isolation`), which holds even for native code. Kind
  ``network``.
* **files**: the working directory, ``HOME`` and ``TMPDIR`` are a new temporary directory, removed
  afterwards. The audit hook ends the program when it opens a file for writing, or removes,
  renames, links or changes one, outside that directory (kind ``file_write``), or opens or lists
  anything outside it and the standard library (kind ``file_read``). ``os.stat`` raises no audit
  event: file metadata stays visible.
* code that does not compile is kind ``syntax``; a program (or its tests) that raises anything but
  a failed ``assert`` is kind ``crash``.
* ``ctypes`` (which could bypass the hook) cannot be imported (kind ``forbidden``), nor can
  ``_posixsubprocess``, ``multiprocessing`` or ``concurrent`` (kind ``process``), and
  ``resource.setrlimit`` cannot be called (kind ``forbidden``).

The limits are set by the child itself, in the harness that runs before the program, rather
than in a ``preexec_fn``: the training process has threads (torch's, the pipeline's), and a
``preexec_fn`` after ``fork`` in a threaded process can deadlock (the ``subprocess`` docs warn of
it). Nothing of the program runs before they are in place.

An audit hook is a guard against accidents and crude attacks, not a security boundary against a
determined adversary with native code: it runs in the same interpreter as the program. The
time, memory and output limits and the namespace do not depend on it; the process limit does for
root (``RLIMIT_NPROC`` does not bind root), and so do the file limits. Pass or fail is
read from a random token the harness prints after the tests pass (with exit code 0), so a
program that calls ``os._exit(0)`` does not pass; a program that digs the token out of the
harness's frames could, and tests that compare with ``==`` can be fooled by an object whose
``__eq__`` always holds (the templated code task's tests check ``type(...) is int`` first). The
tests run with the builtins as they were before the program ran (a program that replaces
``builtins.type`` does not change what the tests call), but modules the program patched stay
patched.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

# failure kinds, each counted as data/verifier_<kind>; a plain wrong answer (a test's assert fails) has none
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
)

# exit codes of the harness (what the parent reads them as); 0 + the token = passed
_FAILED, _CRASH = 3, 4
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
_CODES = {"failed": _FAILED, "crash": _CRASH, **{kind: code for code, kind in _EXIT_KINDS.items()}}

# The child's whole program: read the job from stdin, set the limits, install the audit hook, run
# the code and then the tests in one namespace. Only this code runs before the limits are in place.
_HARNESS = r"""
import errno, json, os, resource, sys

def _main():
    job = json.loads(sys.stdin.read())
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    token = job.pop("token")
    home = os.path.realpath(job["dir"])
    # the standard library: where this interpreter imports from (its sys.path: -S adds no site)
    roots = tuple(os.path.realpath(r) for r in [*job["read_roots"], *sys.path] if r)
    codes = job["codes"]
    W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def bye(code):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)

    out = lambda kind: bye(codes[kind])

    def inside(path, places):
        if isinstance(path, int):
            return True  # an already open descriptor
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        p = os.path.realpath(os.fspath(path))
        return p in ("/dev/null", "/dev/urandom", "/dev/zero") or any(
            p == r or p.startswith(r + os.sep) for r in places)

    spawn = {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
             "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill"}
    changes = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
               "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "shutil.rmtree", "os.mkfifo",
               "os.mknod"}
    pairs = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copytree", "shutil.move"}
    spawners = ("_posixsubprocess", "multiprocessing", "concurrent")  # fork without an audit event
    allowed_reads = (home, *roots)

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
            if writing and not inside(path, (home,)):
                out("file_write")
            if not writing and not inside(path, allowed_reads):
                out("file_read")
        elif event in changes:
            if not inside(args[0], (home,)):
                out("file_write")
        elif event in pairs:
            if not (inside(args[0], allowed_reads) and inside(args[1], (home,))):
                out("file_write")
        elif event in ("os.listdir", "os.scandir"):
            if args and args[0] is not None and not inside(args[0], allowed_reads):
                out("file_read")
        elif event in ("resource.setrlimit", "resource.prlimit", "ctypes.dlopen", "sys.remote_exec"):
            out("forbidden")
        elif event == "import" and args[0].split(".")[0] in spawners:
            out("process")
        elif event == "import" and args[0].split(".")[0] in ("ctypes", "_ctypes"):
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
    import builtins
    pristine = dict(builtins.__dict__)  # the tests see these, whatever the program patches
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
    try:
        exec(compile(job["tests"], "<tests>", "exec"), {**ns, "__builtins__": pristine})
    except AssertionError:
        bye(codes["failed"])
    except MemoryError:
        bye(codes["memory"])
    except BaseException as e:
        crashed(e)
    sys.stdout.flush()
    os.write(1, ("\n" + token + "\n").encode())
    os._exit(0)

_main()
"""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0  # wall clock, whole run (code and tests)
    cpu_s: int = 5  # CPU seconds
    memory_mb: int = 512  # address space
    max_output_bytes: int = 64 * 1024  # stdout + stderr read back; also the largest file it may write


@dataclass(frozen=True)
class Outcome:
    passed: bool
    kind: str | None  # one of KINDS, or None (passed, or a test's assert failed)
    output: str  # what it printed (at most max_output_bytes), for debugging


@functools.lru_cache(maxsize=1)
def network_isolation() -> str:
    """How programs are kept off the network here: ``"namespace+audit-hook"`` when a new network
    namespace can be made (``unshare --net``, as root or with unprivileged user namespaces),
    otherwise ``"audit-hook"`` (in-process only; native code could still reach the network)."""
    return "namespace+audit-hook" if _unshare_prefix() else "audit-hook"


@functools.lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...]:
    exe = shutil.which("unshare")
    if exe is None or not sys.platform.startswith("linux"):
        return ()
    tries = [(exe, "--net")] if os.geteuid() == 0 else [(exe, "--net", "--map-root-user")]
    for prefix in tries:
        try:
            r = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return prefix
    return ()


@functools.lru_cache(maxsize=1)
def _read_roots() -> tuple[str, ...]:
    """The standard library's folders: a program may import from them (and read them)."""
    paths = sysconfig.get_paths()
    return tuple(sorted({paths[k] for k in ("stdlib", "platstdlib") if k in paths}))


def run_program(code: str, tests: str, limits: Limits = Limits()) -> Outcome:
    """Run ``code`` then ``tests`` (Python source, asserts) in a fresh sandboxed process; passed iff
    every test ran without raising. Never raises for anything the program does."""
    token = secrets.token_hex(16)
    job = {
        "code": code,
        "tests": tests,
        "token": token,
        "cpu_s": max(1, int(limits.cpu_s)),
        "memory_bytes": int(limits.memory_mb) * 2**20,
        "file_bytes": int(limits.max_output_bytes),
        "read_roots": list(_read_roots()),
        "codes": _CODES,
    }
    tmp = tempfile.mkdtemp(prefix="scalerl-sandbox-")
    job["dir"] = tmp
    env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"}
    cmd = [*_unshare_prefix(), sys.executable, "-I", "-S", "-c", _HARNESS]
    proc = None
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=tmp,
            env=env,
            start_new_session=True,  # its own process group: killed as a whole
            close_fds=True,
        )
        deadline = time.monotonic() + float(limits.timeout_s)
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        data, over, timed_out = _read_capped(proc, deadline, int(limits.max_output_bytes))
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
        shutil.rmtree(tmp, ignore_errors=True)
    text = data.decode("utf-8", "replace")
    if timed_out:
        return Outcome(False, "timeout", text)
    if over:
        return Outcome(False, "output", text)
    if rc == 0 and text.rstrip("\n").endswith(token):
        return Outcome(True, None, text[: text.rfind(token)].rstrip("\n"))
    if rc == _FAILED:
        return Outcome(False, None, text)
    if rc in _EXIT_KINDS:
        return Outcome(False, _EXIT_KINDS[rc], text)
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # the CPU limit (soft, then hard)
        return Outcome(False, "timeout", text)
    if rc == -signal.SIGXFSZ:
        return Outcome(False, "output", text)
    return Outcome(False, "crash", text)


def _read_capped(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bool, bool]:
    """(output, over the cap, past the deadline): read until EOF, the cap or the deadline."""
    chunks, size = [], 0
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(chunks), False, True
            if not sel.select(left):
                continue
            block = os.read(fd, 65536)
            if not block:
                return b"".join(chunks), False, False
            chunks.append(block)
            size += len(block)
            if size > cap:
                return b"".join(chunks)[:cap], True, False


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
