"""What the engines' fork server imports before it forks them (:mod:`scalerl.rollout.server`):
the generator, the model builder and the tasks, with torch and transformers under them.

Imported with the cyclic collector paused and then frozen (:func:`scalerl.collector.uncollected_imports`):
the server's imports run without a dozen full collections over their objects, and each engine forked
from it inherits them frozen, so that its own collections walk only what it makes. The server ends
without the interpreter's finalisation (:func:`scalerl.collector.end_at_exit`): it holds nothing of
its own to finalise (its listener is closed as its loop ends; the engines it forked end on their
own, by ``os._exit``, and never run its exit handlers), and it would otherwise keep the run's output
pipe open for seconds after the run has ended."""

from scalerl.collector import end_at_exit, uncollected_imports

with uncollected_imports():
    import scalerl.generator
    import scalerl.generator.hf
    import scalerl.model.build
    import scalerl.task
    import scalerl.task.score  # noqa: F401
end_at_exit()
