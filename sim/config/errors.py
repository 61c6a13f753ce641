"""The error every input check raises: below every module that checks input, so each can raise it."""


class ScenarioError(ValueError):
    """A scenario that cannot run: the message names the field and the reason."""


class ServesimStop(BaseException):
    """Raised by servesim itself through a user's code to stop it (a study's CPU-time budget). The wrappers that
    turn whatever a user's code raises into one clear error let it pass, as they let Ctrl-C pass: it is not the
    user's error, and whoever raised it words its own."""


# what the wrappers around user code re-raise as they are instead of reporting them as the user's exception
PASS_THROUGH = (KeyboardInterrupt, ServesimStop)
