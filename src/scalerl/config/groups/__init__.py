"""The options of every config group: one module per group, each registering one dataclass per option.

Module ``<group>.py`` declares the options of ``conf/<group>/``;
:data:`scalerl.config.options.PROVIDERS` imports them all. Shared checks live in :mod:`scalerl.config.checks`.
"""
