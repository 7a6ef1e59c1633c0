"""PipelineRL's generator engines (paper Sec. 3.1): processes of their own that stream groups to the
trainer and take new weights *in flight*, between decode steps, keeping their stale KV cache.

* :class:`EnginePool` (the trainer's rank 0): hosts the run's store, starts the local engines
  (one process each, forked from a fork server with its imports done, each seeing only its own GPUs),
  hands out work, collects groups, broadcasts every weight update to all engines' workers
  (:mod:`scalerl.transport`), and generates for evaluation through the engines (it is a
  :class:`~scalerl.generator.Generator`).
* :func:`serve_engine`: an engine's process. The same function serves a local engine and one that
  runs as a task of a multi-task SLURM/torchrun job (:func:`serve_task`), reaching the trainer
  through the store at the launcher's host and port.

Everything between them goes through the store (a ``torch.distributed.TCPStore``): per-engine work
queues, one result queue, each engine's busy time and heartbeat, and the weight-update group's
rendezvous, so a local engine and one on another node run the same code.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from scalerl.generator.base import Generator
from scalerl.messages import RunError, first_line
from scalerl.transport import (
    SharedMemoryTransport,
    TransportSpec,
    announced,
    connect,
)

if TYPE_CHECKING:
    from scalerl.config.groups.generator import GeneratorOption
    from scalerl.config.schema import Config

log = logging.getLogger(__name__)

# what a launcher puts in a process's environment for its own process group: an engine must not
# take it for its own (vLLM would join the trainer's world)
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)
HEARTBEAT_S = 1.0
# the longest a generating engine goes without reading the store for a new weight announcement: two
# store round trips at every decode step of a small model (a few ms a step) are a share of its CPU
# worth saving; a trainer's step takes far longer, so new weights are taken at most this much later
ANNOUNCE_POLL_S = 0.02
REMOTE_TIMEOUT_S = 300.0  # an engine on another task silent for this long is taken as gone
# the other trainer ranks wait for the weight-update group this much longer than rank 0 waits for
# the engines to join it (so rank 0's clear error comes first, and ends the job)
JOIN_BARRIER_MARGIN_S = 120.0


def _alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would terminate it on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class EngineSpec:
    """What an engine process needs (picklable)."""

    # the run's typed config (scalerl.config.typed), pickled to the engine process: its setup
    # (_Engine.build) hands each of the engine's parts its own options
    config: Config
    index: int  # engine number
    rank: int  # its first rank in the weight-update group
    store: TransportSpec  # where the store is (and the weight-update group's backend and size)
    threads: int
    # the GPUs it may see as the job's CUDA_VISIBLE_DEVICES names them (not as a trainer that narrowed
    # its own sees them: scalerl.layout.physical_gpus); () on a CPU
    gpus: tuple[int | str, ...] = ()
    owner: int | None = None  # the trainer's pid, for an engine on the trainer's machine
    shm: SharedMemoryTransport | None = field(default=None, compare=False)


def _isolate(spec: EngineSpec) -> torch.device:
    """Before CUDA starts: this process sees only its own GPUs and none of the launcher's rank
    variables; returns the device it generates on. ``spec.gpus`` are ids as the job's own
    ``CUDA_VISIBLE_DEVICES`` names them (the trainer that starts it may see fewer: its own)."""
    for k in (*_LAUNCHER_VARS, "SCALERL_NODE_GPUS", "SCALERL_JOB_TASKS"):  # the trainer's layout
        os.environ.pop(k, None)
    if spec.gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
        return torch.device("cuda", 0)
    return torch.device("cpu")


def serve_engine(spec: EngineSpec) -> None:
    """An engine's process: build the engine, join the weight-update group, take work until told
    to stop (or the trainer is gone). Errors go back to the trainer as text."""
    device = _isolate(spec)
    if spec.owner is not None:
        # Ctrl-C reaches the whole process group: the trainer stops the run and this process with it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(max(1, spec.threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, spec.threads)))
    store = connect(spec.store)
    try:
        engine = _Engine.build(spec.config, spec, store, device)
        if engine is None:  # the trainer's process ended before it sent the first weights
            return
        _push(store, "results", ("ready", spec.index, None, None))
        engine.serve()
        _leave(engine.gen)
    except Exception:
        try:
            _push(store, "results", ("error", spec.index, None, traceback.format_exc()))
        except Exception:  # noqa: BLE001 - the trainer's store is gone too
            pass


def _leave(gen) -> None:
    """The engine stops: its side of the weight-update group goes (connections, communicator)."""
    leave = getattr(gen, "leave_weight_group", None)
    rx = getattr(gen, "_rx", None)  # the HF generator's receiver
    if leave is not None:
        leave()
    elif rx is not None:
        rx.close()


def engine_role(cfg) -> dict | None:
    """The entry of a process's role, before anything starts CUDA: one of a multi-task job's generator
    tasks (the last ``placement.generator_tasks`` ranks) serves as its engine until the run ends
    and returns ``{"role": "generator", "engine": n}``; any other process gets None, with its
    trainer layout applied (:func:`scalerl.rollout.placement.engine_task`), and goes on to train.
    ``train.py`` and a sweep's job call it with the composed config (or its typed
    :class:`~scalerl.config.schema.Config`) before :func:`scalerl.loop.train`."""
    from scalerl import layout
    from scalerl.config import Config, typed
    from scalerl.rollout.placement import engine_task, store_address

    config = cfg if isinstance(cfg, Config) else typed(cfg)
    engine = engine_task(layout.LayoutOptions.of(config))
    if engine is None:
        return None
    serve_task(config, engine, *store_address(config.placement))
    return {"role": "generator", "engine": engine}


def serve_task(config: Config, index: int, host: str, port: int) -> None:
    """An engine as a task of a multi-task job (``placement.generator_tasks``): reach the trainer's
    store at ``host:port`` and serve as engine ``index`` of the run ``config`` (typed) describes."""
    from scalerl import layout

    # this task's GPUs and cores from the run's layout: its own tensor_parallel_size GPUs of those its
    # node's trainer ranks leave (as CUDA_VISIBLE_DEVICES names them), the cores the task holds
    plan, me = layout.current(layout.LayoutOptions.of(config), raw=True)
    gpus = tuple(int(g) if g.isdigit() else g for g in layout.physical_gpus(me.visible)) if me.visible else ()
    threads, first_rank = me.threads, plan.engines[int(index)].group_ranks[0]
    timeout = float(config.placement.timeout_s)
    try:
        store = connect(TransportSpec("gloo", host, int(port), 1, timeout_s=timeout))
        store.wait(["engines/spec"])
    except RuntimeError as e:  # torch's DistNetworkError or a store timeout: no trainer there yet
        raise RunError(
            f"generator task (engine {index}): no trainer's store answered at {host}:{port} within "
            f"{timeout:g} s (placement.timeout_s; {first_line(e)}): its log says why; raise "
            "placement.timeout_s where the trainer takes longer to start"
        ) from None
    info = json.loads(store.get("engines/spec").decode())
    weights = TransportSpec(info["backend"], host, int(port), int(info["world"]), float(info["timeout_s"]))
    print(
        f"[scalerl] generator task: engine {index}, weights over {weights.backend} from {host}:{port}",
        flush=True,
    )
    serve_engine(EngineSpec(config, int(index), first_rank, weights, threads, gpus))


def _push(store, key: str, obj) -> None:
    store.queue_push(key, pickle.dumps(obj))


def _pop(store, key: str):
    """The next item of queue ``key``, or None when it is empty."""
    import torch.distributed as dist

    try:
        return pickle.loads(store.queue_pop(key, block=False))
    except dist.QueueEmptyError:
        return None


def engine_concurrency(generator: GeneratorOption, batch_size: int) -> int:
    """The sequences a continuous engine keeps running: ``generator.max_running``, else what the
    generator's class runs by default (:meth:`~scalerl.generator.base.Generator.default_running`:
    vLLM's ``max_num_seqs``, its scheduler runs no more; else one training batch of ``batch_size``
    samples: the HF engine's decode step costs about the same for 32 rows as for 128 on a CPU)."""
    from scalerl.generator.registry import generator_class

    n = int(generator.max_running)
    if n > 0:
        return n
    return generator_class(generator.name).default_running(generator, int(batch_size))


class _Engine:
    """An engine process's parts: the generator (its own model, or a vLLM engine whose workers hold
    the weights), the task and how its groups are scored; :meth:`serve` is its loop. Each part gets
    its own settings: ``group_size`` (samples per prompt), ``batch_prompts`` (the most prompts a
    wave decodes together: one training batch's), ``continuous`` (``generator.continuous``),
    ``concurrency`` (the sequences a continuous engine keeps running: :func:`engine_concurrency`),
    ``score`` ((prompts, groups) -> verifier counts, rewards set on the samples)."""

    def __init__(
        self,
        spec: EngineSpec,
        store,
        task,
        gen: Generator,
        poll_shm,
        *,
        group_size: int,
        batch_prompts: int,
        continuous: bool,
        concurrency: int,
        score: Callable[[list, list], Counter[str]],
    ):
        self.spec, self.store, self.task, self.gen = spec, store, task, gen
        self.poll_shm = poll_shm  # shared-memory weights: () -> new version or None
        self.group_size, self.batch_prompts = int(group_size), int(batch_prompts)
        self.continuous, self.limit, self.score = bool(continuous), int(concurrency), score
        self.busy = 0.0
        self.tokens = 0
        self._beat = 0.0
        self._polled = 0.0
        self._announced = False  # a version was read from the store: its key exists from then on
        self._parts: dict[int, list] = {}  # continuous: work id -> its prompts, while generated
        self.steps = 0  # decode steps taken (training work)
        # tests and benchmarks: a list to receive ("start" | "end", work id, step) of every piece
        # of training work (the step its sequences were added at, the step its groups were sent)
        self.trace: list | None = None

    @classmethod
    def over(cls, config: Config, spec: EngineSpec, store, task, gen: Generator, poll_shm) -> _Engine:
        """The engine of the run ``config`` (typed) describes, over the built ``task`` and ``gen``:
        each part's settings read from the config here."""
        from scalerl.task.score import score_groups

        tr, g = config.trainer, config.generator
        G = int(tr.generations_per_prompt)

        def score(prompts, groups) -> Counter[str]:
            return score_groups(
                task,
                prompts,
                groups,
                reward=config.reward,
                length_control=config.length_control,
                verifier_timeout_s=config.task.verifier_timeout_s,
            )

        return cls(
            spec,
            store,
            task,
            gen,
            poll_shm,
            group_size=G,
            batch_prompts=max(1, int(tr.batch_size) // G),
            continuous=bool(g.continuous),
            concurrency=engine_concurrency(g, int(tr.batch_size)),
            score=score,
        )

    @classmethod
    def build(cls, config: Config, spec: EngineSpec, store, device: torch.device) -> _Engine | None:
        """The engine process's setup: its task, its own copy of the policy and its generator from
        the run's typed ``config``; joins the weight-update group (or shared-memory weights) and
        waits for the first weights. None when the trainer's process ended before sending them."""
        from scalerl.generator import make_generator
        from scalerl.generator.registry import generator_class
        from scalerl.model.build import build_policy
        from scalerl.task import build_task

        task = build_task(config.task)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        kind = generator_class(config.generator.name)
        # an engine process generates all the time: a sleep mode would only cost (vLLM's: its own
        # allocator, and CUDA graphs offloaded at every sleep)
        options = kind.engine_options(config.generator)
        # a generator that does not sample from the module it is built from (vLLM: it loads its
        # weights from a folder the policy is saved to) gets it built on the CPU, where that copy
        # never takes GPU memory beside the engine's (whose memory profile would not see it)
        model_device = device if kind.samples_from_trainer_module else torch.device("cpu")
        model, tokenizer, precision = build_policy(
            config.model,
            task,
            model_device,
            precision=config.precision,
            task_option=config.task,
            seed=config.seed,
            trained=False,
        )
        model.eval()
        seed = config.seed * 7919 + 17 + 104729 * spec.index
        gen = make_generator(
            options,
            config.length_control,
            model,
            tokenizer,
            precision,
            device,
            seed=seed,
            placement=config.placement,
        )
        gen.sleeps = False  # an engine of its own generates all the time: no sleep mode
        poll_shm = None
        if spec.shm is not None:
            from scalerl.model.weights import PolicyWeights

            in_place = PolicyWeights(model)

            def poll_shm():
                v = spec.shm.poll(model, gen.version)
                if v is not None:
                    gen.load_weights(in_place, v)
                return v

        else:
            gen.join_weight_group(spec.store, spec.rank, store)
            if hasattr(gen, "drop_model"):  # the weights live in the engine's workers from now on
                gen.drop_model()
                del model
        engine = cls.over(config, spec, store, task, gen, poll_shm)
        gen.version = -1
        while engine.weight_update() is None:  # the first weights (sent once the trainer has them)
            if not engine.trainer_alive():
                return None
            time.sleep(0.01)
        return engine

    def trainer_alive(self) -> bool:
        return self.spec.owner is None or _alive(self.spec.owner)

    def weight_update(self, force: bool = False) -> int | None:
        """Take the newest weights the trainer announced, if newer than the engine's; their version.
        The announcement is read at most every ANNOUNCE_POLL_S, unless ``force``: before training
        work starts that names a version this engine does not hold yet, or names none (an engine
        that holds it skips the read: one store round trip a piece). The trainer announces a
        version before it submits the work of that step, so a forced read makes the work's first
        tokens come from weights at least as new as the step that gave it, which its lag bound
        counts on (a piece started on the version before, polled a
        moment earlier, is one version staler than the trainer allows for: dropped unused)."""
        now = time.monotonic()
        if now - self._beat > HEARTBEAT_S:  # tell the trainer this engine still runs
            self._beat = now
            self.store.set(f"engines/beat/{self.spec.index}", str(time.time()))
        if self.poll_shm is not None:
            return self.poll_shm()
        if not force and now - self._polled < ANNOUNCE_POLL_S:
            return None
        self._polled = now
        v = announced(self.store, seen=self._announced)
        self._announced = self._announced or v is not None
        if v is None or v == self.gen.version:
            return None
        self.gen.receive_weights(v)
        return v

    def _holds(self, need) -> bool:
        """Whether this engine's weights are at least the version a piece of training work needs
        (``need``: the item's fields after its group ids, ``[version]``, or empty or ``[None]``
        where it names none): then the announcement need not be read before it starts."""
        version = need[0] if need else None
        return version is not None and self.gen.version is not None and self.gen.version >= int(version)

    def next_item(self):
        """The next piece of work; None to stop, also once the trainer is gone."""
        waited = 0.0
        while True:
            item = _pop(self.store, f"engines/work/{self.spec.index}")
            if item is not None:
                return item if item != "stop" else None
            self.weight_update()  # take new weights while idle: the trainer waits for them
            time.sleep(0.005)
            waited += 0.005
            if waited >= 1.0:
                waited = 0.0
                if not self.trainer_alive():
                    return None

    def next_batch(self) -> tuple[list, bool]:
        """The training work waiting, decoded in one batch up to a training batch of prompts (a
        decode step costs nearly the same for 32 rows as for 128), or one evaluation item; returns
        (its items, whether to stop after it)."""
        item = self.next_item()
        if item is None:
            return [], True
        if item[0] in ("eval", "fingerprint"):
            return [item], False
        max_prompts = self.batch_prompts
        items = [item]
        while sum(len(it[2]) for it in items) < max_prompts:
            nxt = _pop(self.store, f"engines/work/{self.spec.index}")
            if nxt is None:
                break
            if nxt == "stop":
                return items, True
            if nxt[0] != "train":  # after this batch
                _push(self.store, f"engines/work/{self.spec.index}", nxt)
                break
            items.append(nxt)
        return items, False

    def evaluate(self, item) -> None:
        """Evaluation samples of exactly the trainer's version, from their own seeded stream."""
        _, work_id, prompts, n, seed, version = item
        self._reach(version)
        rng = self.gen.rng_state()
        self.gen.manual_seed(int(seed))
        t0 = time.perf_counter()
        groups = self.gen.generate(prompts, n, version=version)
        self.busy += time.perf_counter() - t0
        self.gen.set_rng_state(rng)
        _push(self.store, "results", ("eval", self.spec.index, work_id, groups))

    def _reach(self, version: int) -> None:
        while self.gen.version != version:
            if self.weight_update() is None:
                time.sleep(0.002)

    def fingerprint(self, item) -> None:
        """The digest of every weight the engine samples with, at the trainer's ``version``."""
        _, work_id, version = item
        self._reach(version)
        _push(self.store, "results", ("fingerprint", self.spec.index, work_id, self.gen.fingerprint()))

    def train_items(self, items) -> None:
        """Generate the groups of all ``items`` together (weights updated in flight), score each
        item's groups, send them back one item at a time."""
        prompts = [p for it in items for p in it[2]]
        group_ids = [g for it in items for g in it[3]]
        if self.trace is not None:
            self.trace.extend(("start", it[1], self.steps) for it in items)
        t0 = time.perf_counter()
        groups = self.gen.generate(
            prompts,
            self.group_size,
            version=self.gen.version,
            group_ids=group_ids,
            weight_update=self.weight_update,
            on_step=self._stepped,
        )
        lo = 0
        done = []
        for _, work_id, part, *_ in items:
            hi = lo + len(part)
            done.append((work_id, groups[lo:hi], self.score(part, groups[lo:hi])))
            lo = hi
        self.busy += time.perf_counter() - t0
        self.tokens += sum(len(s.completion_ids) for g in groups for s in g)
        self.store.set(f"engines/status/{self.spec.index}", json.dumps([self.busy, self.tokens]))
        for work_id, part_groups, errors in done:
            if self.trace is not None:
                self.trace.append(("end", work_id, self.steps))
            _push(self.store, "results", ("groups", self.spec.index, work_id, (part_groups, errors)))

    def _stepped(self) -> None:
        self.steps += 1

    def serve(self) -> None:
        """Take work until told to stop: continuously (``generator.continuous``, where the generator
        can), else in waves."""
        wanted = self.continuous
        if wanted and self.gen.continuous:
            self.serve_continuous()
            return
        if wanted:
            log.warning(
                "generator.continuous=true: this generator (%s) cannot take sequences while others "
                "run (generator.static_cache=true?); engine %d generates in waves",
                type(self.gen).__name__,
                self.spec.index,
            )
        self.serve_waves()

    def serve_waves(self) -> None:
        """Each wave generates the training work queued when it starts (:meth:`next_batch`) and
        takes more only once every sequence of it finished (the behaviour before issue 56)."""
        stop = False
        while not stop:
            items, stop = self.next_batch()
            if not items:
                break
            self.weight_update(force=items[0][0] == "train" and not all(self._holds(it[4:]) for it in items))
            if items[0][0] == "eval":
                self.evaluate(items[0])
            elif items[0][0] == "fingerprint":
                self.fingerprint(items[0])
            else:
                self.train_items(items)

    # ------------------------------------------------------------------ continuous
    def concurrency(self) -> int:
        return self.limit

    def serve_continuous(self) -> None:
        """Keep up to :meth:`concurrency` sequences running: between decode steps take training
        work from the queue while there is room (a piece of work is started whole: see
        :meth:`_admit`), and send each piece's scored groups back as soon as all its sequences
        finished. New weights are taken in flight before every step, as in a wave
        (:meth:`weight_update`). A "stop" ends the loop at once (the trainer is closing: nothing
        reads the work still running).

        Evaluation and fingerprints answer from exactly the version asked for: on an HF engine at
        once, beside the running sequences (the evaluation has its own KV cache and random stream;
        the running rows wait, and their next tokens carry whatever version the engine then holds);
        on a vLLM engine the running work is finished first (drained: another generate() on the
        engine would step its requests), then the evaluation runs alone."""
        G = self.group_size
        limit = self.concurrency()
        session = self.gen.session(weight_update=self.weight_update, rows=limit)
        held = None  # work taken from the queue, waiting for room
        polled = alive_at = 0.0
        while True:
            now = time.monotonic()
            # the queue is read at most every ANNOUNCE_POLL_S while sequences run (a store round
            # trip per step is a share of a small model's step); at once when idle
            if held is not None or not session.running or now - polled >= ANNOUNCE_POLL_S:
                polled = now
                stop, held = self._admit(session, held, G, limit)
                if stop:
                    return
            if not session.running:
                item = self.next_item()  # waits, taking new weights meanwhile
                if item is None:
                    return
                held = item
                continue
            if now - alive_at >= 1.0:
                alive_at = now
                if not self.trainer_alive():
                    return
            t0 = time.perf_counter()
            finished = session.step()
            self.busy += time.perf_counter() - t0
            self.steps += 1
            for work_id, groups in finished:
                self._send(work_id, groups)

    def _admit(self, session, held, G: int, limit: int):
        """Start queued training work while there is room (any work when nothing runs); answer
        evaluation and fingerprint requests met on the way. Returns (whether to stop, the work
        taken that did not fit)."""
        key = f"engines/work/{self.spec.index}"
        polled = False  # the announced version, read once before the first piece started here
        while True:
            item, held = (held, None) if held is not None else (_pop(self.store, key), None)
            if item is None:
                return False, None
            if item == "stop":
                return True, None
            if item[0] in ("eval", "fingerprint"):
                session.pause()  # the generator is used otherwise now
                if item[0] == "eval" and session.exclusive:
                    t0 = time.perf_counter()
                    finished = session.drain()
                    self.busy += time.perf_counter() - t0
                    for work_id, groups in finished:
                        self._send(work_id, groups)
                self.weight_update()
                (self.evaluate if item[0] == "eval" else self.fingerprint)(item)
                continue
            _, work_id, prompts, group_ids, *need = item
            if not polled and not self._holds(need):
                self.weight_update(force=True)
                polled = True
            # a piece of work starts whole: where it fits (HF: its rows get slots at once), or, on
            # an engine that queues what it cannot run yet (vLLM), while any room is left (a piece
            # larger than the room, e.g. generator.chunk_prompts x generations_per_prompt above
            # max_num_seqs, would otherwise wait for the engine to empty: waves again)
            fits = session.running < limit if session.queues else session.running + len(prompts) * G <= limit
            if session.running and not fits:
                return False, item
            self._parts[work_id] = prompts
            session.add(prompts, G, group_ids=group_ids, tag=work_id)
            if self.trace is not None:
                self.trace.append(("start", work_id, self.steps))

    def _send(self, work_id: int, groups) -> None:
        """One piece of work's groups, scored, to the trainer."""
        prompts = self._parts.pop(work_id)
        t0 = time.perf_counter()
        errors = self.score(prompts, groups)
        self.busy += time.perf_counter() - t0
        self.tokens += sum(len(s.completion_ids) for g in groups for s in g)
        self.store.set(f"engines/status/{self.spec.index}", json.dumps([self.busy, self.tokens]))
        if self.trace is not None:
            self.trace.append(("end", work_id, self.steps))
        _push(self.store, "results", ("groups", self.spec.index, work_id, (groups, errors)))
