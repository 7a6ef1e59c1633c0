"""vLLM generation on a CUDA GPU (optional extra ``pip install scalerl[vllm]``). Untested in CI.

Same ``generate`` interface and :class:`~scalerl.generator.Sample` output as
:class:`~scalerl.generator.HFGenerator`, with these differences (honest limits):

* vLLM's synchronous ``LLM.generate`` cannot swap weights between two decode steps, so
  ``weight_update`` is polled before each generation phase (not per token), and every token of a
  phase carries the version current when the phase started. ``on_step`` is called once per phase.
* :meth:`VLLMGenerator.load_weights` reloads the engine's weights through vLLM's
  ``reload_weights`` worker call (untested here: vLLM is not installed in CI).
* Interruptions run in two phases: (1) think until ``</think>``, eos or the drawn budget;
  (2) for sequences that did not end, re-submit prompt + thinking (+ the forced phrase when the
  budget was hit) and sample at most ``answer_budget`` answer tokens. Phase 2 re-prefills the
  prefix (vLLM's prefix cache makes this cheap).
* Behaviour log-probs are vLLM's log-prob of the sampled token (``SamplingParams(logprobs=0)``,
  temperature applied where the installed vLLM supports ``logprobs_mode="processed_logprobs"``).
  vLLM computes its LM head in the model dtype: with ``precision.head=fp32`` and a bf16 body the
  trainer's log-probs and these differ by bf16 rounding (PipelineRL patches vLLM's head for this;
  scalerl does not).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import torch

from scalerl.generator.base import Generator
from scalerl.generator.sample import Sample
from scalerl.model.precision import Precision
from scalerl.model.weights import PolicyWeights

_MISSING = "generator=vllm needs `pip install scalerl[vllm]` and a CUDA GPU"


class VLLMGenerator(Generator):
    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        precision: Precision,
        length_control: Any,
        *,
        temperature: float = 1.0,
        device: torch.device | str = "cuda",
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
    ):
        try:
            import vllm
        except ImportError as e:
            raise RuntimeError(_MISSING) from e
        if not torch.cuda.is_available():
            raise RuntimeError(_MISSING)
        self.vllm = vllm
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.lc = length_control
        self.mode = str(length_control.name)
        self.max_new_tokens = int(length_control.max_new_tokens)
        self.eos_id = tokenizer.eos_token_id
        ids = tokenizer("</think>", add_special_tokens=False)["input_ids"]
        self.think_end_id = ids[0] if len(ids) == 1 else None
        self.phrase_ids: list[int] = []
        if self.mode == "interruption":
            self.phrase_ids = list(
                tokenizer(str(length_control.phrase), add_special_tokens=False)["input_ids"]
            )
        self.rng = torch.Generator().manual_seed(seed)
        self.version = 0

        # vLLM loads from disk: save the current policy (weights + tokenizer) to a temporary dir.
        self._dir = tempfile.TemporaryDirectory(prefix="scalerl-vllm-")
        model.save_pretrained(self._dir.name)
        tokenizer.save_pretrained(self._dir.name)
        dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision.body]
        kwargs: dict[str, Any] = dict(
            model=self._dir.name,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=True,
        )
        try:
            self.llm = vllm.LLM(**kwargs, logprobs_mode="processed_logprobs")
        except TypeError:  # vLLM < 0.10.2: log-probs are those of the processed (tempered) logits anyway
            self.llm = vllm.LLM(**kwargs)

    # ------------------------------------------------------------------ Generator interface
    def load_weights(self, weights: PolicyWeights, version: int) -> None:
        """Reload the engine's weights from ``weights`` (CPU copies, gathered under ZeRO-3; names
        without the emulated-precision parametrization) in place, then record ``version``."""
        tensors = {
            k.replace("parametrizations.", "").replace(".original", ""): v
            for k, v in weights.tensors().items()
        }
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(tensors.items()), "is_checkpoint_format": True},
        )
        self.version = int(version)

    # ------------------------------------------------------------------ generation
    def _think_tokens(self, ids: list[int]) -> int:
        """Sampled tokens before ``</think>`` (all but a final eos when there is none)."""
        if self.think_end_id in ids:
            return ids.index(self.think_end_id)
        return len(ids) - (1 if ids and ids[-1] == self.eos_id else 0)

    def _params(self, max_tokens: int, stop: list[int]):
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.rng))
        if max_tokens <= 0:
            return None
        return self.vllm.SamplingParams(
            temperature=self.temperature,
            max_tokens=int(max_tokens),
            logprobs=0,
            stop_token_ids=stop,
            skip_special_tokens=False,
            seed=seed,
        )

    def _run(self, prefixes: list[list[int]], params: list) -> list[tuple[list[int], list[float], bool]]:
        """One generation per prefix; a ``None`` in ``params`` means no request (empty output)."""
        live = [i for i, sp in enumerate(params) if sp is not None]
        res: list[tuple[list[int], list[float], bool]] = [([], [], True) for _ in prefixes]
        if not live:
            return res
        reqs = [{"prompt_token_ids": prefixes[i]} for i in live]
        outs = self.llm.generate(reqs, [params[i] for i in live], use_tqdm=False)
        for i, o in zip(live, outs):
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) if d and t in d else 0.0 for t, d in zip(ids, c.logprobs or [])]
            lps += [0.0] * (len(ids) - len(lps))
            res[i] = (ids, lps, c.finish_reason == "length")
        return res

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Any],
        n: int,
        *,
        version: int,
        group_ids: list[int] | None = None,
        weight_update: Callable[[], int | None] | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> list[list[Sample]]:
        group_ids = list(range(len(prompts))) if group_ids is None else group_ids
        prompt_ids = [list(self.tokenizer(p.text)["input_ids"]) for p in prompts]
        rows = [(i, prompt_ids[i]) for i in range(len(prompts)) for _ in range(n)]
        eos = [] if self.eos_id is None else [self.eos_id]

        def poll(v: int) -> int:
            nv = weight_update() if weight_update is not None else None
            if nv is None:
                return v
            self.version = int(nv)
            return self.version

        # phase 1: thinking (interruption) or the whole completion
        version = poll(version)
        if self.mode == "interruption":
            lo, hi = int(self.lc.think_budget_min), int(self.lc.think_budget_max)
            budgets = torch.randint(lo, hi + 1, (len(rows),), generator=self.rng).tolist()
            stop = eos + ([self.think_end_id] if self.think_end_id is not None else [])
            params = [self._params(min(b, self.max_new_tokens), stop) for b in budgets]
        else:
            params = [self._params(self.max_new_tokens, eos) for _ in rows]
        first = self._run([p for _, p in rows], params)
        if on_step is not None:
            on_step()

        seqs = []  # per row: ids, logprobs, versions, mask, interrupted, think_tokens
        for ids, lps, _ in first:
            seqs.append([ids, lps, [version] * len(ids), [1] * len(ids), False, self._think_tokens(ids)])
        if self.mode == "interruption":
            version = poll(version)
            todo, prefixes, params2 = [], [], []
            for r, (ids, _, _) in enumerate(first):
                if ids and ids[-1] in eos:
                    continue
                left = self.max_new_tokens - len(ids)
                if not (ids and ids[-1] == self.think_end_id):  # budget hit: force the phrase in
                    if left <= 0:
                        continue
                    s = seqs[r]
                    k = len(self.phrase_ids)
                    s[0], s[1] = s[0] + self.phrase_ids, s[1] + [0.0] * k
                    s[2], s[3], s[4] = s[2] + [-1] * k, s[3] + [0] * k, True
                budget = min(int(self.lc.answer_budget), left)
                if budget <= 0:
                    continue
                todo.append(r)
                prefixes.append(rows[r][1] + seqs[r][0])
                params2.append(self._params(budget, eos))
            for r, (ids, lps, _) in zip(todo, self._run(prefixes, params2) if todo else []):
                s = seqs[r]
                s[0], s[1], s[2], s[3] = (
                    s[0] + ids,
                    s[1] + lps,
                    s[2] + [version] * len(ids),
                    s[3] + [1] * len(ids),
                )
            if on_step is not None and todo:
                on_step()

        groups: list[list[Sample]] = [[] for _ in prompts]
        for r, (ids, lps, vers, mask, interrupted, think) in enumerate(seqs):
            p = rows[r][0]
            finished = bool(ids) and ids[-1] in eos
            groups[p].append(
                Sample(
                    prompt_uid=prompts[p].uid,
                    group_id=group_ids[p],
                    prompt_ids=list(prompt_ids[p]),
                    completion_ids=ids,
                    logprobs=lps,
                    versions=vers,
                    loss_mask=mask,
                    text=self.tokenizer.decode(ids[:-1] if finished else ids, skip_special_tokens=False),
                    truncated=not finished,
                    interrupted=interrupted,
                    think_tokens=think,
                )
            )
        return groups
