"""task=code and its sandbox (each attack is really run), and task=multi (mixing, uids, per-domain
validation and fits)."""

from __future__ import annotations

import errno
import json
import math
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf
from parts import scoring_options

from scalerl.config import compose, typed
from scalerl.generator.sample import Sample
from scalerl.rollout.prompts import MixedSampler, make_sampler
from scalerl.task import CodeTask, MultiTask, Prompt, make_task
from scalerl.task.base import score_counted
from scalerl.task.code import _humaneval_problems, extract_program
from scalerl.task.sandbox import BOUNDARIES, KINDS, STRONG, Limits, available, boundary, run_program
from scalerl.task.score import score_groups

FAST = Limits(timeout_s=1.5, cpu_s=2, memory_mb=256, max_output_bytes=16_384)


# ---------------------------------------------------------------------- the sandbox
CALLS = [("f", (2,)), ("f", (-1,))]


def test_the_sandbox_brings_back_each_result_as_plain_data():
    out = run_program("def f(x):\n    print(x)\n    return 2 * x + 1\n", CALLS, FAST)
    assert (out.kind, out.results, out.output) == (None, [("ok", 5), ("ok", -1)], "2\n-1\n")
    mixed = "def f(x):\n    if x < 0:\n        raise KeyError(x)\n    return [x, 2.5, 'a', (None, True), {1: b'z'}]\n"
    out = run_program(mixed, CALLS, FAST)
    assert out.results == [("ok", [2, 2.5, "a", (None, True), {1: b"z"}]), ("raise", "KeyError")]
    # results that are not plain data come back as their type's name, never as the object
    cheat = "class A(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A(5)\n"
    assert run_program(cheat, CALLS, FAST).results == [("bad", "A"), ("bad", "A")]
    assert run_program("g = 1\n", CALLS, FAST).results == [("raise", "NameError")] * 2


@pytest.fixture
def run_file(tmp_path):
    """A file of "the run" the program must not touch."""
    f = tmp_path / "checkpoint.pt"
    f.write_text("weights")
    return f


ATTACKS = {
    "infinite loop": ("while True:\n    pass\n", "timeout"),
    "sleep forever": ("import time\ntime.sleep(3600)\n", "timeout"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()\n", "process"),
    "subprocess": ("import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])\n", "process"),
    "os.system": ("import os\nos.system('echo hi')\n", "process"),
    "huge allocation": ("x = bytearray(8 * 2**30)\n", "memory"),
    "growing list": ("x = []\nwhile True:\n    x.append(bytearray(2**20))\n", "memory"),
    "endless printing": ("while True:\n    print('spam' * 100)\n", "output"),
    "huge file in its folder": ("with open('big', 'w') as f:\n    f.write('x' * 2**24)\n", "output"),
    "write the run's file": ("open({run!r}, 'w').write('pwned')\n", "file_write"),
    "append to the run's file": (
        "import os\nfd = os.open({run!r}, os.O_WRONLY | os.O_APPEND)\n",
        "file_write",
    ),
    "delete the run's file": ("import os\nos.remove({run!r})\n", "file_write"),
    "rename the run's file": ("import os\nos.rename({run!r}, 'mine')\n", "file_write"),
    "read the run's file": ("print(open({run!r}).read())\n", "file_read"),
    "list the run's folder": ("import os\nprint(os.listdir({folder!r}))\n", "file_read"),
    "connect": ("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n", "network"),
    "dns": ("import socket\nsocket.getaddrinfo('example.com', 80)\n", "network"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).fork()\n", "forbidden"),
    "raise its limits": ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n", "forbidden"),
    "exception": ("raise ValueError('boom')\n", "crash"),
    "syntax error": ("def f(:\n", "syntax"),
    "null byte": ("x = 1\0\n", "syntax"),
    "recursion": ("def f(x):\n    return f(x + 1)\nf(0)\n", "crash"),
    "exit 0 before the tests": ("import os\nos._exit(0)\n", "no_report"),
    "sys.exit(0)": ("import sys\nsys.exit(0)\n", "crash"),
}


@pytest.fixture
def listener():
    """A live local server, counting the connections it gets."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.05)
    got = {"n": 0, "stop": False}

    def serve():
        while not got["stop"]:
            try:
                conn, _ = srv.accept()
                got["n"] += 1
                conn.close()
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], got
    got["stop"] = True
    t.join()
    srv.close()


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_every_attack_scores_zero_with_its_kind_and_harms_nothing(attack, run_file, listener):
    port, connections = listener
    code, kind = ATTACKS[attack]
    code = code.format(run=str(run_file), folder=str(run_file.parent), port=port)
    t0 = time.time()
    out = run_program(code, [("f", (1,))], FAST)
    assert (out.kind, out.results) == (kind, None), out.output[-500:]
    assert time.time() - t0 < FAST.timeout_s + 3  # killed, not waited for
    assert run_file.read_text() == "weights"
    assert sorted(p.name for p in run_file.parent.iterdir()) == ["checkpoint.pt"]
    assert connections["n"] == 0


def _holding(name: str) -> list[int]:
    """Processes (seen from here, whatever their PID namespace) holding a file called ``name`` open."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith("/" + name) for fd in fds):
                pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.parametrize("where", available())
def test_a_timed_out_program_is_killed(where):
    name = f"marker-{os.getpid()}-{time.monotonic_ns()}"
    code = f"f = open({name!r}, 'w')\nwhile True:\n    pass\n"
    result = {}
    t = threading.Thread(target=lambda: result.update(out=run_program(code, [], FAST, boundary_name=where)))
    t.start()
    # watched until it is seen or the run ends (the program runs its 1.5 s once the sandbox started
    # it, which on a loaded machine takes more than a second)
    seen = []
    while not seen and t.is_alive():
        seen = _holding(name)
        time.sleep(0.02)
    assert seen  # it ran (and held its file open) ...
    t.join()
    assert result["out"].kind == "timeout"
    time.sleep(0.2)
    assert _holding(name) == []  # ... and is gone


@pytest.mark.parametrize("where", available())
def test_the_time_limit_counts_from_the_program_s_start_not_the_sandbox_s(where):
    """A correct program is not scored 0 for the sandbox's own start (namespaces, the interpreter,
    reading its arguments: here made most of the run by a large argument, so the start takes
    about 0.1-0.2 s, seconds on a loaded machine): a limit a third of the whole run's wall time
    still lets a program that takes microseconds report; a program that sleeps past it is still
    stopped at about its limit. (With a small argument the start is about 20 ms on a fast machine,
    and a third of it is within one lost time slice of a busy one.)"""
    quick, big = "def f(x):\n    return len(x)\n", list(range(100_000))
    t0 = time.monotonic()
    assert run_program(quick, [("f", (big,))], FAST, boundary_name=where).results == [("ok", len(big))]
    whole = time.monotonic() - t0  # mostly the sandbox's start
    tight = Limits(timeout_s=whole / 3, cpu_s=2, memory_mb=256)
    out = run_program(quick, [("f", (big,))], tight, boundary_name=where)
    assert (out.kind, out.results) == (None, [("ok", len(big))])
    t0 = time.monotonic()
    slow = run_program("import time\ntime.sleep(30)\n", [], FAST, boundary_name=where)
    assert slow.kind == "timeout" and time.monotonic() - t0 < FAST.timeout_s + 5


def test_the_program_sees_a_throwaway_folder_and_no_environment(monkeypatch):
    monkeypatch.setenv("SCALERL_TEST_SECRET", "hunter2")
    code = (
        "import os, json\n"
        "open('mine.txt', 'w').write('ok')\n"
        "print(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ), 'mine': open('mine.txt').read()}))\n"
    )
    out = run_program(code, [], FAST)
    assert out.kind is None, out.output
    seen = json.loads(out.output.strip().splitlines()[-1])
    assert seen["mine"] == "ok"
    assert seen["env"]["HOME"] == seen["cwd"] == seen["env"]["TMPDIR"]
    assert "hunter2" not in json.dumps(seen["env"])
    assert not os.path.exists(seen["cwd"])  # removed afterwards


def test_the_config_s_sandbox_settings_are_the_sandbox_s():
    from scalerl.config.groups.task import SANDBOX_SETTINGS
    from scalerl.task.sandbox import SETTINGS

    assert SANDBOX_SETTINGS == SETTINGS


def test_the_boundary_is_the_strongest_that_works_here():
    assert boundary() in BOUNDARIES
    if shutil.which("bwrap"):  # .ci/install_system.sh installs it; it works where user namespaces do
        probe = subprocess.run(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True)
        assert (boundary() == "bwrap") == (probe.returncode == 0)


# ---------------------------------------------------------------------- task=code
@pytest.fixture(scope="module")
def code_task():
    return CodeTask(num_val=32)


def _solution(prompt: Prompt) -> str:
    """The template's function, recovered from the prompt's three examples (f(0), f(1), f(2))."""
    ys = [int(part.split("=")[1]) for part in prompt.text.rstrip(";").split(";")]
    a, b = ys[1] - ys[0], ys[0]
    return f"def f(x): return x*{a}+{b}"


def test_templated_problems_are_scored_by_their_unit_tests(code_task):
    p = code_task.val_prompts()[0]
    right = _solution(p)
    assert code_task.score(p, right) == 1.0
    assert code_task.score(p, "reasoning</think>" + right) == 1.0
    assert code_task.score(p, "```python\n" + right.replace(": ", ":\n    ") + "\n```\nthat's it") == 1.0
    assert code_task.score(p, "def f(x): return x") == 0.0
    # the shown examples alone, and an object that equals anything, do not pass
    table = (
        "{"
        + ",".join(f"{i}:{part.split('=')[1]}" for i, part in enumerate(p.text.rstrip(";").split(";")))
        + "}"
    )
    assert code_task.score(p, f"def f(x): return {table}.get(x, 0)") == 0.0
    cheat = "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n"
    assert score_counted(code_task, p, cheat, 10.0) == (0.0, None, "result_type")
    patched = "import builtins\nbuiltins.type = lambda o: int\n" + cheat  # the results cross as plain data
    assert score_counted(code_task, p, patched, 10.0) == (0.0, None, "result_type")
    as_float = right.replace("return", "return float(") + ")"
    assert score_counted(code_task, p, as_float, 10.0) == (0.0, None, None)  # 7.0 is not 7
    assert code_task.score(p, "") == 0.0


def test_the_warm_start_shows_the_solution_with_some_slips(code_task):
    examples = code_task.warmstart_examples(400, random.Random(0))
    val = {p.text for p in code_task.val_prompts()}
    assert not any(text in val for text, _ in examples)
    # warmstart_slip_prob=0.25: most right, some wrong (checked here without running them) ...
    right = sum(_same(text, sol) for text, sol in examples)
    assert 250 <= right <= 350, right
    # ... and the sandbox agrees
    for text, sol in examples[:8]:
        assert code_task.score(Prompt(0, text, _answer_of(code_task, text)), sol) == _same(text, sol)


def _same(text: str, solution: str) -> bool:
    """Whether ``solution`` computes the function the prompt's examples show, on other inputs too."""
    ys = [int(part.split("=")[1]) for part in text.rstrip(";").split(";")]
    f = eval(solution.replace("def f(x): return ", "lambda x: "))
    return all(f(x) == ys[0] + (ys[1] - ys[0]) * x for x in (0, 1, 2, 3, 7, -4, 25))


def _answer_of(task: CodeTask, text: str) -> str:
    return next(p.answer for p in task.train_prompts() if p.text == text)


def test_extracting_the_program():
    assert extract_program("x</think>```python\ndef f():\n    pass\n```") == "def f():\n    pass"
    assert extract_program("```python\na = 1\n```</think>```\nb = 2\n```") == "b = 2"
    assert extract_program("    return 1\n") == "    return 1"  # a body continuation keeps its indent
    assert extract_program("```python\ndef f(): return 1") == "def f(): return 1"  # unclosed block


@pytest.mark.needs_extra("real")
def test_humaneval_canonical_solutions_pass_and_stubs_fail():
    task = CodeTask(source="humaneval", num_val=8)
    by_prompt = {task._humaneval_prompt(0, r).text: r for r in _humaneval_problems()}
    assert len(task.train_prompts()) + len(task.val_prompts()) == 164
    for p in task.val_prompts():
        r = by_prompt[p.text]
        full = "```python\n" + r["prompt"] + r["canonical_solution"] + "```"
        assert task.score(p, full) == 1.0, r["task_id"]
        assert task.score(p, r["canonical_solution"]) == 1.0, r["task_id"]  # the body only
        stub = f"```python\ndef {r['entry_point']}(*args):\n    return None\n```"
        assert score_counted(task, p, stub, 10.0)[0] == 0.0, r["task_id"]  # fails (or its tests raise: crash)


@pytest.mark.slow
def test_every_humaneval_reference_passes_when_its_tests_are_replayed_out_of_process():
    """All 164 problems: each check, recorded with the reference and replayed here against the
    results the sandbox brought back, passes the reference and fails a stub."""
    cfg = compose(["task=code", "task.source=humaneval"])
    task = CodeTask(source="humaneval", num_val=8, timeout_s=4.0)
    rows = _humaneval_problems()
    prompts = [task._humaneval_prompt(0, r) for r in rows]
    stub = "```python\ndef {}(*args):\n    return None\n```"
    groups = [
        [
            _sample("```python\n" + r["prompt"] + r["canonical_solution"] + "```"),
            _sample(stub.format(r["entry_point"])),
        ]
        for r in rows
    ]
    counts = score_groups(task, prompts, groups, **scoring_options(typed(cfg)))
    assert [r["task_id"] for r, g in zip(rows, groups) if g[0].correct != 1.0] == []
    assert [r["task_id"] for r, g in zip(rows, groups) if g[1].correct != 0.0] == []
    assert counts["errors"] == 0 and counts["timeout"] == 0


def _sample(text: str) -> Sample:
    return Sample(0, 0, [1], [2, 3], [0.0, 0.0], [0, 0], [1, 1], text, False, False, 0)


def test_failed_programs_are_counted_by_kind_and_verifier_errors_apart(code_task):
    cfg = compose(["task=code"])
    p = code_task.val_prompts()[0]
    texts = [
        _solution(p),
        "while True: pass",
        "import os\nos.fork()",
        "import socket\nsocket.socket()",
        "oops(",
    ]
    fast = CodeTask(num_val=32, timeout_s=5.0)  # 1 s was classed a timeout on a loaded machine
    groups = [[_sample(t) for t in texts]]
    counts = score_groups(fast, [p], groups, **scoring_options(typed(cfg)))
    assert [s.correct for s in groups[0]] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert counts == Counter({"timeout": 1, "process": 1, "network": 1, "syntax": 1, "errors": 0})
    assert set(counts) - {"errors"} <= set(KINDS)
    # a verifier that itself breaks is an error, not a kind
    assert score_counted(code_task, Prompt(0, "x", "not json"), "def f(x): return 1", 5.0)[1:] == (
        "error: JSONDecodeError",
        None,
    )


def test_sandboxed_programs_are_verified_concurrently_in_order():
    cfg = compose(["task=code"])
    task = CodeTask(num_val=32, timeout_s=2.0)
    p = task.val_prompts()[0]
    slow_right = "import time\ntime.sleep(0.6)\n" + _solution(p)
    texts = [slow_right, "import time\ntime.sleep(0.6)\ndef f(x): return 0"] * 3
    groups = [[_sample(t) for t in texts]]
    t0 = time.perf_counter()
    counts = score_groups(task, [p], groups, **scoring_options(typed(cfg)))
    elapsed = time.perf_counter() - t0
    assert [s.correct for s in groups[0]] == [1.0, 0.0] * 3 and counts["errors"] == 0
    rounds = -(-len(texts) // min(len(texts), os.cpu_count() or 1))
    assert elapsed < 0.6 * len(texts) and elapsed < rounds * 0.6 + 1.5, elapsed


# ---------------------------------------------------------------------- task=multi
@pytest.fixture(scope="module")
def multi():
    cfg = compose(
        ["task=multi", "task.domains.math.num_train=2000", "task.ratio.math=0.75", "task.ratio.code=0.25"]
    )
    return make_task(OmegaConf.to_container(cfg.task, resolve=True))


def test_multi_task_uids_are_unique_and_prompts_keep_their_domain(multi):
    train, val = multi.train_prompts(), multi.val_prompts()
    uids = [p.uid for p in [*train, *val]]
    assert len(uids) == len(set(uids))
    assert Counter(p.domain for p in train) == {"math": 2000, "code": 1790 - 128}
    # validation alternates, so the first eval.num_prompts hold both domains equally
    assert [p.domain for p in val[:6]] == ["math", "code"] * 3
    math_val = multi.tasks["math"].val_prompts()[0]
    assert multi.score(val[0], math_val.answer) == 1.0 and val[0].text == math_val.text
    assert multi.score(val[1], _solution(val[1])) == 1.0


def test_every_batch_mixes_the_domains_by_the_ratio(multi):
    sampler = make_sampler(multi, multi.train_prompts(), seed=3)
    assert isinstance(sampler, MixedSampler)
    for _ in range(20):
        assert Counter(p.domain for p in sampler.next(16)) == {"math": 12, "code": 4}
    # resumable: a sampler restored from a state dict continues identically
    state = sampler.state_dict()
    again = make_sampler(multi, multi.train_prompts(), seed=3)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert [p.uid for p in sampler.next(50)] == [p.uid for p in again.next(50)]
    # seeded: another seed draws another order
    other = make_sampler(multi, multi.train_prompts(), seed=4)
    assert [p.uid for p in other.next(50)] != [
        p.uid for p in make_sampler(multi, multi.train_prompts(), 3).next(50)
    ]


def test_multi_warm_start_mixes_both_domains(multi):
    examples = multi.warmstart_examples(400, random.Random(0))
    code = sum(text.startswith("f(0)=") for text, _ in examples)
    assert 60 <= code <= 140  # ratio code=0.25 of 400


def test_multi_task_builds_from_a_run_config():
    cfg = compose(
        [
            "task=multi",
            "~task.domains.math",
            "~task.domains.code",
            "+task.domains.a={name: addition, num_train: 300}",
            "+task.domains.b={name: code}",
            "~task.ratio.math",
            "~task.ratio.code",
            "+task.ratio.a=0.5",
            "+task.ratio.b=0.5",
        ]
    )
    task = make_task(OmegaConf.to_container(cfg.task, resolve=True))
    assert isinstance(task, MultiTask) and task.domains == ["a", "b"]
    assert task.tasks["b"].limits.timeout_s == 4.0  # the option's defaults filled in
    assert task.tasks["a"].ws_hard_frac == 0.1  # (the option's default; AdditionTask's own is 0)


# a multi-task run of the embedded model: both domains' metrics and fits are logged
MULTI_TINY = [
    "task=multi",
    "filter.dynamic_sampling=false",  # as conftest's TINY
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "model.warmstart_steps=300",
    "model.warmstart_batch_size=32",
    "task.domains.math.min_digits=1",
    "task.domains.math.max_digits=2",
    "task.domains.math.warmstart_max_digits=2",
    "task.domains.math.warmstart_hard_frac=0",
    "task.domains.math.num_val=16",
    "task.domains.math.num_train=256",
    "task.domains.code.num_val=16",
    "trainer.batch_size=32",
    "trainer.generations_per_prompt=4",
    "trainer.total_steps=4",
    "eval.every=1",
    "eval.num_prompts=16",
    "eval.samples_per_prompt=2",
    "checkpoint_every=2",
    "generator.chunk_prompts=4",
    "trainer.threads=1",
    "progress=log",
    "async_mode=sync",
    "scaling.refit_every=1",
]


@pytest.mark.slow
def test_a_multi_task_run_logs_and_fits_each_domain(tmp_path, mlflow_uri):
    from scalerl.loop.run import train

    overrides = [
        *MULTI_TINY,
        f"out_dir={tmp_path / 'run'}",
        f"tracking.uri={mlflow_uri}",
        "tracking.experiment=multi",
        "scaling.min_step=1",  # a 4-step run: the default cut (step 10) would leave no point
    ]
    summary = train(compose(overrides))
    assert summary["steps"] == 4 and len(summary["evals"]) == 5
    client = MlflowClient(mlflow_uri)
    metrics = client.get_run(summary["run_id"]).data.metrics
    for d in ("math", "code"):
        history = client.get_metric_history(summary["run_id"], f"val/pass_rate/{d}")
        assert len(history) == 5 and all(0 <= m.value <= 1 for m in history)
        assert metrics[f"fit/{d}/n_points"] >= 4
        # each domain is fitted on its own pass rates: the fit's start is that domain's first evaluation
        # (fit metrics are logged to 3 decimals: a pass rate of 0.0625 is logged as 0.062)
        first = sorted(history, key=lambda m: m.step)[0].value
        assert metrics[f"fit/{d}/R0"] == pytest.approx(first, abs=5e-4 + 1e-9)
        assert f"fit/{d}/A" in metrics
        # the fall rule judged on each fitted domain's own curve, with its share of an evaluation's
        # samples (a domain whose fit failed, e.g. code's at a pass rate of 0 throughout, is not judged)
        fitted = metrics[f"fit/{d}/ok"] == 1.0
        assert math.isfinite(metrics.get(f"fit/{d}/fall_se", math.nan)) == fitted
        assert (tmp_path / "run" / f"scaling_curve_{d}.png").is_file()
    # the mix is the mean of the domains (equal validation shares)
    assert metrics["val/pass_rate"] == pytest.approx(
        (metrics["val/pass_rate/math"] + metrics["val/pass_rate/code"]) / 2
    )
    assert {f"data/verifier_{k}" for k in KINDS} <= set(metrics)
    assert all(metrics[f"data/verifier_{k}"] >= 0 for k in KINDS)


@pytest.mark.slow
def test_failed_programs_in_a_run_reach_its_metrics_and_never_stop_it(tmp_path, mlflow_uri):
    from scalerl.loop.run import build, train

    overrides = [
        *MULTI_TINY,
        "trainer.total_steps=2",
        "eval.every=2",
        f"out_dir={tmp_path / 'run'}",
        f"tracking.uri={mlflow_uri}",
        "tracking.experiment=multi-attacks",
    ]
    cfg = compose(overrides)
    OmegaConf.resolve(cfg)
    run = build(cfg)
    code = run.task.tasks["code"]
    real_score, calls = code.score, Counter()
    attacks = ["import os\nos.fork()\n", "import socket\nsocket.socket()\n", "raise SystemExit(0)\n"]

    lock = threading.Lock()

    def attacked(prompt, completion):  # every program the run scores is one of these attacks
        with lock:  # (programs are verified from several threads)
            calls["n"] += 1
            attack = attacks[calls["n"] % 3]
        return real_score(prompt, attack)

    code.score = attacked
    summary = train(cfg, components=run)
    assert summary["steps"] == 2
    metrics = MlflowClient(mlflow_uri).get_run(summary["run_id"]).data.metrics
    n = calls["n"]
    assert n > 0
    assert metrics["data/verifier_process"] == len(range(3, n + 1, 3))
    assert metrics["data/verifier_network"] == len(range(1, n + 1, 3))
    assert metrics["data/verifier_crash"] == len(range(2, n + 1, 3))
    assert metrics["data/verifier_errors"] == 0 and metrics["val/pass_rate/code"] == 0


@pytest.mark.parametrize("where", [b for b in available() if b in STRONG])
def test_a_program_cannot_fill_the_machine_s_disk_with_many_small_files(where, tmp_path, monkeypatch):
    """Each file was limited (RLIMIT_FSIZE), its folder was a folder of the machine's: a program
    wrote 1.4 GiB of 64 KiB files in 1.5 s. Behind bwrap and userns the folder is a tmpfs that holds
    Limits.folder_bytes in all; past it a write fails (ENOSPC), and the machine's folder stays empty."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = (
        "import os\n"
        "def f(size):\n"
        "    n = 0\n"
        "    try:\n"
        "        for i in range(10_000):\n"
        "            with open(f'f{i}', 'w') as fh:\n"
        "                fh.write('x' * size)\n"
        "            n += size\n"
        "    except OSError as e:\n"
        "        return [n, e.errno, sorted(os.listdir(os.environ.get('HOME', '.')))[:1]]\n"
        "    return [n, 0, []]\n"
    )
    seen: list[list[str]] = []
    stop = threading.Event()

    def watch():  # what the machine's own folder of the program holds while it runs
        while not stop.is_set():
            seen.extend(os.listdir(d) for d in tmp_path.glob("scalerl-sandbox-*"))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out = run_program(code, [("f", (FAST.max_output_bytes - 1,))], FAST, boundary_name=where)
    finally:
        stop.set()
        watcher.join()
    assert out.kind is None
    [(tag, (written, err, first))] = out.results
    assert (tag, err, first) == ("ok", errno.ENOSPC, ["f0"])
    assert FAST.folder_bytes - FAST.max_output_bytes <= written <= FAST.folder_bytes
    assert all(not names or names == [".root"] for names in seen)  # none of its files reached it
