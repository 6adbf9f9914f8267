"""Exceptions raised by `jaxserve.sampling`."""


class InvalidSamplingParamsError(ValueError):
    """A sampling parameter has the wrong type, is out of range, or is not a known parameter.

    The message names the parameter, the value received and what is accepted, so it can be shown to the
    user of the HTTP or offline API as is.
    """


class AlreadyFinishedError(RuntimeError):
    """A token was appended to a request whose `StopChecker` has already finished it."""
