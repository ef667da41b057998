"""kogc: compile a PyTorch decoder into one persistent GPU kernel for batch-1 decoding."""
__version__ = "0.1.0"


def compile(module, target: str | None = None, **kwargs):
    """See kogc.api.compile."""
    from .api import compile as _compile
    return _compile(module, target=target, **kwargs)
