"""PipelineRL (paper Sec. 3.1): a generator process that streams groups to the trainer and picks up
new weights *in flight*, between decode steps, keeping its stale KV cache.

Weights travel through a :mod:`scalerl.loop.transport` (``async_mode.transport``): gloo or NCCL
process groups of their own, or shared memory on one machine.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import time
import traceback

import torch

from scalerl.loop.transport import (
    CollectiveReceiver,
    CollectiveTransport,
    SharedMemoryTransport,
    TransportSpec,
    choose_backend,
)

log = logging.getLogger(__name__)


# imported once, by the fork server, before the generator process is forked from it
_PRELOAD = [
    "scalerl.generator",
    "scalerl.generator.hf",
    "scalerl.model.build",
    "scalerl.task",
    "scalerl.task.score",
]


def process_context():
    """The multiprocessing context of the generator process.

    ``forkserver`` where the platform has it: a fork server started early (:func:`prestart`)
    imports torch, transformers and scalerl (about 5 s on one core) while the trainer builds its
    model and evaluates step 0, and the generator process is then forked from it, its imports done.
    The server is a fresh single-threaded process (no OpenMP pool, no CUDA context), which is what
    makes forking from it safe. Elsewhere (Windows): ``spawn``, which imports everything anew.
    """
    import torch.multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def prestart() -> None:
    """Start the fork server now, so its imports overlap with the caller's setup (a no-op if it is
    running already or the platform has no fork server)."""
    ctx = process_context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


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


def generator_device(trainer_device: torch.device) -> torch.device:
    """Where the generator process decodes: the CPU next to a CPU trainer; on CUDA a GPU of its own
    when there is a second one (PipelineRL's split), else the trainer's GPU, shared."""
    if trainer_device.type != "cuda":
        return torch.device("cpu")
    index = torch.cuda.current_device() if trainer_device.index is None else trainer_device.index
    count = torch.cuda.device_count()
    return torch.device("cuda", (index + 1) % count if count > 1 else index)


def generator_worker(
    cfg_yaml: str,
    transport: SharedMemoryTransport | TransportSpec,
    work_q,
    result_q,
    status,
    threads: int,
    owner: int,
    device: str = "cpu",
) -> None:
    """The generator process: take work (prompts), generate with in-flight weight updates, score,
    send the groups back. ``status`` is a shared array: [busy seconds, generated tokens]; ``owner``
    is the trainer's process id (the generator stops when it is gone); ``device``: where to decode
    (:func:`generator_device`)."""
    from omegaconf import OmegaConf

    # Ctrl-C reaches the whole process group: the trainer's process stops the run and this process
    # with it (and this process stops by itself when the trainer's is gone)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(max(1, threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, threads)))
    try:
        cfg = OmegaConf.create(cfg_yaml)
        worker = _Worker.build(cfg, transport, torch.device(device), owner)
        if worker is None:  # the trainer's process ended before it sent the first weights
            return
        result_q.put(("ready", None, None))
        worker.serve(work_q, result_q, status)
    except Exception:
        result_q.put(("error", None, traceback.format_exc()))


class _Worker:
    """The generator process's parts: its own policy (weights written in place by the transport),
    a generator over it, the task that scores the groups; :meth:`serve` is its loop."""

    def __init__(self, cfg, task, model, gen, transport, in_place, owner: int):
        self.cfg, self.task, self.model, self.gen = cfg, task, model, gen
        self.transport, self.in_place, self.owner = transport, in_place, owner

    @classmethod
    def build(cls, cfg, transport, device: torch.device, owner: int) -> _Worker | None:
        """Build the policy, join the trainer's transport, wait for the first weights (None if the
        trainer's process is gone first), and build the generator at that version."""
        from scalerl.generator import make_generator
        from scalerl.model.build import build_policy
        from scalerl.model.weights import PolicyWeights
        from scalerl.task import build_task

        task = build_task(cfg)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        model, tokenizer, precision = build_policy(cfg, task, device, trained=False)
        model.eval()
        if isinstance(transport, TransportSpec):  # join the trainer's process group
            transport = CollectiveReceiver(transport, device)
        version = None
        while version is None:  # the first weights (sent as soon as the trainer has them)
            version = transport.poll(model, -1)
            if version is None:
                if not _alive(owner):
                    return None
                time.sleep(0.01)
        gen = make_generator(cfg, model, tokenizer, precision, device, seed=cfg.seed * 7919 + 17)
        in_place = PolicyWeights(model)  # the transport writes the new weights into `model` in place
        gen.load_weights(in_place, version)
        return cls(cfg, task, model, gen, transport, in_place, owner)

    def weight_update(self) -> int | None:
        """Take the newest weights the trainer sent, if any; returns their version."""
        v = self.transport.poll(self.model, self.gen.version)
        if v is not None:
            self.gen.load_weights(self.in_place, v)
        return v

    def next_item(self, work_q):
        """The next piece of work; None to stop, also once the run's process is gone (killed with
        SIGKILL, say: no work will ever come, and nothing else would end this process)."""
        waited = 0.0
        while True:
            try:
                return work_q.get(timeout=0.05)
            except queue.Empty:
                self.weight_update()  # take new weights while idle: the trainer waits for them
                waited += 0.05
                if waited >= 1.0:
                    waited = 0.0
                    if not _alive(self.owner):
                        return None

    def next_batch(self, work_q) -> tuple[list, bool]:
        """The work waiting, decoded in one batch up to a training batch of prompts (a decode step
        costs nearly the same for 32 rows as for 128); returns (its items, whether to stop after it)."""
        item = self.next_item(work_q)
        if item is None:
            return [], True
        max_prompts = max(1, int(self.cfg.trainer.batch_size) // int(self.cfg.trainer.generations_per_prompt))
        items = [item]
        while sum(len(it[1]) for it in items) < max_prompts:
            try:
                nxt = work_q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                return items, True
            items.append(nxt)
        return items, False

    def generate_and_score(self, items) -> tuple[list, list]:
        """Generate the groups of all ``items`` together, then score each item's groups; returns
        (all groups, [(work id, its groups, its verifier errors)])."""
        from scalerl.task.score import score_groups

        prompts = [p for it in items for p in it[1]]
        group_ids = [g for it in items for g in it[2]]
        groups = self.gen.generate(
            prompts,
            self.cfg.trainer.generations_per_prompt,
            version=self.gen.version,
            group_ids=group_ids,
            weight_update=self.weight_update,
        )
        done = []
        lo = 0
        for work_id, part, _ in items:
            hi = lo + len(part)
            done.append((work_id, groups[lo:hi], score_groups(self.task, part, groups[lo:hi], self.cfg)))
            lo = hi
        return groups, done

    def serve(self, work_q, result_q, status) -> None:
        """Until told to stop (or the trainer is gone): the next batch of work -> generate and score
        -> the busy time and tokens into ``status`` -> each item's groups back, per work item."""
        stop = False
        while not stop:
            items, stop = self.next_batch(work_q)
            if not items:
                break
            self.weight_update()
            t0 = time.perf_counter()
            groups, done = self.generate_and_score(items)
            status[0] += time.perf_counter() - t0
            status[1] += sum(len(s.completion_ids) for g in groups for s in g)
            for work_id, part_groups, errors in done:
                result_q.put(("groups", work_id, (part_groups, errors)))


class PipelineGenerator:
    """Trainer-side handle on the generator process."""

    def __init__(
        self,
        cfg,
        trainer_state: dict[str, torch.Tensor],
        version: int,
        threads: int,
        device: torch.device | str = "cpu",
        transport: str = "auto",
        trainer_device: torch.device | str = "cpu",
    ):
        from omegaconf import OmegaConf

        ctx = process_context()
        self.backend = choose_backend(transport, torch.device(trainer_device), torch.device(device))
        if self.backend == "shm":
            self.transport = SharedMemoryTransport(trainer_state, ctx, version)
            handle = self.transport
        else:
            self.transport = CollectiveTransport(
                trainer_state,
                version,
                backend=self.backend,
                device=trainer_device,
                alive=lambda: self.proc.is_alive(),
            )
            handle = self.transport.spec
        self.work_q = ctx.Queue()
        self.result_q = ctx.Queue()
        self.status = ctx.Array("d", [0.0, 0.0], lock=False)
        self.proc = ctx.Process(
            target=generator_worker,
            args=(
                OmegaConf.to_yaml(cfg, resolve=True),
                handle,
                self.work_q,
                self.result_q,
                self.status,
                threads,
                os.getpid(),
                str(device),
            ),
            daemon=True,
        )
        self.proc.start()
        self.ready = False

    def wait_ready(self) -> None:
        """Block until the generator process has built its model (it starts in the background, so
        the trainer can evaluate step 0 meanwhile)."""
        if self.ready:
            return
        kind, _, payload = self._get(timeout=600)
        if kind != "ready":
            raise RuntimeError(f"generator process failed to start:\n{payload}")
        self.ready = True

    def _get(self, timeout: float):
        deadline = time.time() + timeout
        while True:
            try:
                return self.result_q.get(timeout=1.0)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(f"generator process died (exit code {self.proc.exitcode})") from None
                if time.time() > deadline:
                    raise TimeoutError("no answer from the generator process") from None

    def submit(self, work_id: int, prompts, group_ids: list[int]) -> None:
        self.work_q.put((work_id, prompts, group_ids))

    def receive(self, timeout: float = 600):
        """(work_id, groups, verifier counts) of the next finished piece of work."""
        kind, work_id, payload = self._get(timeout)
        if kind == "error":
            raise RuntimeError(f"generator process failed:\n{payload}")
        groups, errors = payload
        return work_id, groups, errors

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.transport.publish(state, version)

    @property
    def busy_seconds(self) -> float:
        return float(self.status[0])

    def close(self) -> None:
        """Stop the generator process. Its last results are drained meanwhile: a process exits only
        once what it put on a queue has been read (it would otherwise hang here until the timeout)."""
        try:
            self.work_q.put(None)
            deadline = time.time() + 10
            while self.proc.is_alive() and time.time() < deadline:
                try:
                    self.result_q.get(timeout=0.1)
                except queue.Empty:
                    pass
            self.proc.join(timeout=1)
        finally:
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(timeout=5)
            self.transport.close()
