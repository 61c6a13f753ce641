"""The error every input check raises: below every module that checks input, so each can raise it."""


class ScenarioError(ValueError):
    """A scenario that cannot run: the message names the field and the reason."""
