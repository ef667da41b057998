"""Triton 3.6's interpreter patches every builtin of triton.language again on each call of a
@triton.jit helper (inspect.getmembers over the language modules): about 2,600 such calls in one
step of the tiny Laneformer spent half of the step's time there. Within one launch the patched state
cannot change between two calls (the patches a helper call makes are never undone before the launch
ends), so patching once per launch and per module of helpers runs the same program: bit-equal
logits and tokens, about twice as fast. `install` leaves Triton alone if its interpreter is not
shaped as expected (another Triton version).

It also runs Triton's Philox rounds (`tl.randint4x`, `tl.rand`: the sampling's Gumbel noise) as numpy
array arithmetic instead of op by op through the interpreter's type checks, where they took about 40% of
a sampled step: the same 32-bit integer arithmetic, bit-equal (tests/test_loader.py).

And a loop bound loaded from memory (`tl.range(0, n)`, a matvec run's length) works: the interpreter holds
scalars as one-element arrays and takes them as indices with int(), which numpy 2.4 refuses for arrays that
are not 0-dimensional; they are read with .item() instead."""
from __future__ import annotations

import threading

_launch = threading.local()      # .patched: ids of helper modules' globals patched in this launch
ORIGINAL: tuple = ()             # Triton's (launch, helper call), once replaced
ORIGINAL_PHILOX = None           # Triton's interpreted philox_impl, once replaced


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

    def patch_lang_indexable(fn):
        scope = patch_lang(fn)
        scope.set_attr(interp.tl.core.tensor, "__index__", lambda t: int(t.handle.data.item()))
        return scope
    interp._patch_lang = patch_lang_indexable     # (the launch's own patching looks it up by name)

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
            patch_lang_indexable(self.fn)
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
    _install_philox(interp)
    return True


def _install_philox(interp) -> None:
    """triton.language.random.philox_impl (looked up by name when `philox` runs) as numpy arithmetic."""
    import numpy as np
    import triton.language as tl
    from triton.language import random as rnd
    global ORIGINAL_PHILOX
    if ORIGINAL_PHILOX is not None or not isinstance(rnd.philox_impl, interp.InterpretedFunction):
        return
    ORIGINAL_PHILOX = rnd.philox_impl
    # Triton's 32-bit Philox constants (philox_impl's, for uint32 counters)
    key_a, key_b, round_a, round_b = 0x9E3779B9, 0xBB67AE85, 0xD2511F53, 0xCD9E8D57
    mask = np.uint64(0xFFFFFFFF)

    def philox_impl(c0, c1, c2, c3, k0, k1, n_rounds=rnd.N_ROUNDS_DEFAULT):
        if c0.dtype != tl.uint32:       # (64-bit counters: Triton's own rounds)
            return ORIGINAL_PHILOX(c0, c1, c2, c3, k0, k1, n_rounds)
        ty0 = c0.type
        c0, c1, c2, c3, k0, k1 = np.broadcast_arrays(*(x.handle.data.astype(np.uint64) for x in (c0, c1, c2, c3, k0, k1)))
        shape = c0.shape
        for _ in range(int(getattr(n_rounds, "value", n_rounds))):
            _c0, _c2 = c0, c2
            c0 = ((np.uint64(round_b) * _c2) >> np.uint64(32)) ^ c1 ^ k0
            c2 = ((np.uint64(round_a) * _c0) >> np.uint64(32)) ^ c3 ^ k1
            c1 = (np.uint64(round_b) * _c2) & mask
            c3 = (np.uint64(round_a) * _c0) & mask
            k0 = (k0 + np.uint64(key_a)) & mask
            k1 = (k1 + np.uint64(key_b)) & mask
        # (a scalar's data may be one element: its type stays the scalar's)
        ty = ty0 if not ty0.is_block() or tuple(ty0.shape) == shape else tl.block_type(tl.uint32, list(shape))
        return tuple(tl.tensor(interp.TensorHandle(np.ascontiguousarray(c.astype(np.uint32)), tl.uint32), ty)
                     for c in (c0, c1, c2, c3))

    rnd.philox_impl = philox_impl
