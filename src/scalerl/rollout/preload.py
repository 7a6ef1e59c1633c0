"""What the engines' fork server imports before it forks them (:func:`scalerl.rollout.engine.process_context`):
the generator, the model builder and the tasks, with torch and transformers under them. Imported
with the cyclic collector paused and then frozen (:func:`scalerl.collector.uncollected_imports`):
the server's imports run without a dozen full collections over their objects, and the engines
forked from it inherit those objects frozen, so that their own collections walk only what they
make (and touch none of the shared pages, which stay shared)."""

from scalerl.collector import uncollected_imports

with uncollected_imports():
    import scalerl.generator
    import scalerl.generator.hf
    import scalerl.model.build
    import scalerl.task
    import scalerl.task.score  # noqa: F401
