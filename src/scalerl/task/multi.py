"""``task=multi``: several tasks (domains) in one run, as the paper's math + code run (Fig. 11).

Every domain is a task of its own (``addition``, ``code``, ``jsonl`` ...), built from its settings
under ``task.domains.<domain>``. Its prompts keep their text, answer and difficulty and get the
domain's name and a uid unique across domains (``uid * number of domains + domain index``; each
task's train and validation uids are disjoint, so these are too). Each training batch takes
``task.ratio`` of its prompts from each domain (:class:`scalerl.rollout.prompts.MixedSampler`); the
validation prompts alternate between domains, so ``eval.num_prompts`` takes an equal share of
each, and are reported per domain (``val/pass_rate/<domain>``) and for the mix.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping

from scalerl.task.base import Prompt


class MultiTask:
    name = "multi"

    def __init__(self, *, domains: Mapping[str, Mapping], ratio: Mapping[str, float]):
        from scalerl.config.validate import ConfigError
        from scalerl.task import make_task

        self.tasks = {}
        for d, fields in domains.items():
            try:
                self.tasks[str(d)] = make_task(dict(fields))
            except ConfigError as e:  # a domain's own setting (task.sandbox): named where it is set
                key = e.key.removeprefix("task.")
                raise ConfigError(f"task.domains.{d}.{key}", e.value, e.allowed) from None
        self.domains = list(self.tasks)
        self.mix = {d: float(ratio[d]) for d in self.domains}
        kinds: list[str] = []
        for t in self.tasks.values():
            kinds += [k for k in getattr(t, "verifier_kinds", ()) if k not in kinds]
        self.verifier_kinds = tuple(kinds)
        n = len(self.domains)

        def tag(i: int, d: str, p: Prompt) -> Prompt:
            return dataclasses.replace(p, uid=p.uid * n + i, domain=d)

        self._train = [
            tag(i, d, p) for i, d in enumerate(self.domains) for p in self.tasks[d].train_prompts()
        ]
        per_domain = [[tag(i, d, p) for p in self.tasks[d].val_prompts()] for i, d in enumerate(self.domains)]
        self._val = [p for row in _alternate(per_domain) for p in row]

    def train_prompts(self) -> list[Prompt]:
        return list(self._train)

    def val_prompts(self) -> list[Prompt]:
        return list(self._val)

    def score(self, prompt: Prompt, completion: str) -> float:
        return self.tasks[prompt.domain].score(prompt, completion)

    def sandboxed(self, prompt: Prompt) -> bool:
        """Whether the prompt's domain verifies in a sandboxed process (see ``CodeTask.sandboxed``)."""
        own = getattr(self.tasks[prompt.domain], "sandboxed", None)
        return bool(own and own(prompt))

    def warmstart_examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """Each domain's own warm-start examples, in the training mix's shares."""
        picks = rng.choices(self.domains, weights=[self.mix[d] for d in self.domains], k=n)
        out = []
        for d in self.domains:
            k = picks.count(d)
            if k:
                out += self.tasks[d].warmstart_examples(k, rng)
        rng.shuffle(out)
        return out


def _alternate(lists: list[list]) -> list[list]:
    """Rows of one item from each list in turn (shorter lists drop out)."""
    rows, i = [], 0
    while any(i < len(x) for x in lists):
        rows.append([x[i] for x in lists if i < len(x)])
        i += 1
    return rows
