"""Triton 3.6's interpreter patches every builtin of triton.language again on each call of a
@triton.jit helper (inspect.getmembers over the language modules): about 2,600 such calls in one
step of the tiny Laneformer spent half of the step's time there. Within one launch the patched state
cannot change between two calls (the patches a helper call makes are never undone before the launch
ends), so patching once per launch and per module of helpers runs the same program: bit-equal
logits and tokens, about twice as fast. `install` leaves Triton alone if its interpreter is not
shaped as expected (another Triton version)."""
from __future__ import annotations

import threading

_launch = threading.local()      # .patched: ids of helper modules' globals patched in this launch
ORIGINAL: tuple = ()             # Triton's (launch, helper call), once replaced


def install() -> bool:
    """Wrap the interpreter's launch and helper call once per process; False if it cannot."""
    try:
        from triton.runtime import interpreter as interp
        launch, call = interp.GridExecutor.__call__, interp.InterpretedFunction.__call__
        patch_lang, error = interp._patch_lang, interp.InterpreterError
        interp.InterpretedFunction.rewrite       # noqa: B018 (the method the helper call uses)
    except AttributeError:
        return False
    if getattr(call, "kogc_once_per_launch", False):
        return True

    def launch_once(self, *args, **kwargs):
        outer = getattr(_launch, "patched", None)
        _launch.patched = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _launch.patched = outer

    def call_once(self, *args, **kwargs):
        patched = getattr(_launch, "patched", None)
        key = id(self.fn.__globals__)
        if patched is None or key not in patched:
            patch_lang(self.fn)
            if patched is not None:
                patched.add(key)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(repr(e)) from e

    call_once.kogc_once_per_launch = True
    global ORIGINAL
    ORIGINAL = (launch, call)
    interp.GridExecutor.__call__ = launch_once
    interp.InterpretedFunction.__call__ = call_once
    return True
