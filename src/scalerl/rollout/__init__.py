"""The rollout side of a run: the async modes that produce each optimiser step's groups
(:mod:`~scalerl.rollout.modes`), the prompts they draw (:mod:`~scalerl.rollout.prompts`), where
PipelineRL's engines run (:mod:`~scalerl.rollout.placement`), the engines' own processes
(:mod:`~scalerl.rollout.engine`, also the entry of a generator task) and the trainer's side of them
(:mod:`~scalerl.rollout.pool`)."""
