"""The options of every config group: one module per group, each registering one dataclass per option.

Module ``<group>.py`` declares the options of ``conf/<group>/``, except where the options configure a
component declared with them (``async_mode``: :mod:`scalerl.loop.modes`);
:data:`scalerl.config.options.PROVIDERS` imports them all. Shared checks live in :mod:`scalerl.config.checks`.
"""
