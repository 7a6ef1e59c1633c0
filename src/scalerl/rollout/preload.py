"""What the engines' fork server imports before it forks them (:mod:`scalerl.rollout.server`), where
it is started as a new interpreter: :data:`~scalerl.rollout.server.PRELOADED`, the generator, the
model builder and the tasks, with torch and transformers under them.

Imported with the cyclic collector paused and then frozen (:func:`scalerl.collector.uncollected_imports`):
the server's imports run without a dozen full collections over their objects, and each engine forked
from it inherits them frozen, so that its own collections walk only what it makes. The server ends
without the interpreter's finalisation (:func:`scalerl.collector.end_at_exit`): it holds nothing of
its own to finalise (its listener is closed as its loop ends; the engines it forked end on their
own, by ``os._exit``, and never run its exit handlers), and it would otherwise keep the run's output
pipe open for seconds after the run has ended."""

from scalerl.collector import end_at_exit, uncollected_imports
from scalerl.rollout.server import import_preloaded

with uncollected_imports():
    import_preloaded()  # scalerl.rollout.server.PRELOADED
end_at_exit()
