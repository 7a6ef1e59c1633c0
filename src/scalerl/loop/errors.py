"""The loop's user-facing error."""


class RunError(RuntimeError):
    """A run that cannot continue; the message is for the user."""
