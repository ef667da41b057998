"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""


class KogcError(Exception):
    """Base class: bad input to the compiler (model file, preset, checkpoint, target, option)."""


class ModelFileError(KogcError):
    pass
