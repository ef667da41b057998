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

Each value the interpreter makes also builds its Triton type from scratch: a tensor's shape as a tuple of
constexprs with its tuple type, a block type's shape and name, and a new table of numpy dtypes per lookup, about a
third of an interpreted step. `_install_fast_types` keeps those parts per shape (each tensor still gets its own
tuple object; the constexprs and tuple types it shares are never mutated) and the dtype table once: the same
attributes, about 25% less time a step.

And a loop bound loaded from memory (`tl.range(0, n)`, a matvec run's length) works: the interpreter holds
scalars as one-element arrays and takes them as indices with int(), which numpy 2.4 refuses for arrays that
are not 0-dimensional; they are read with .item() instead.

Integer adds, subtracts and multiplies were also each computed a second time in int64 with their range compared
(the overflow sanitizer, on by default in the interpreter's options), only for the comparison to be dropped: the
assertion it feeds is emitted only with `debug`, which the interpreter's options leave off. With `debug` off the
sanitizer is turned off too (`_install_no_discarded_checks`): the same program, about a quarter less time a step."""
from __future__ import annotations

import threading

_launch = threading.local()      # .patched: ids of helper modules' globals patched in this launch
ORIGINAL: tuple = ()             # Triton's (launch, helper call), once replaced
ORIGINAL_PHILOX = None           # Triton's interpreted philox_impl, once replaced
ORIGINAL_TYPES: tuple = ()       # Triton's (tensor.__init__, block_type.__init__, _get_np_dtype), once replaced


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
    _install_fast_types(interp)
    _install_no_discarded_checks(interp)
    return True


def _install_no_discarded_checks(interp) -> None:
    """The interpreter's overflow sanitizer off where its assertions are dropped (`debug` off)."""
    import dataclasses
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False) \
            and getattr(options, "debug", True) is False:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _install_fast_types(interp) -> None:
    """tl.tensor's and tl.block_type's constructors and the interpreter's dtype lookup, with their parts
    kept per shape: the attributes Triton's own would set."""
    import builtins
    import math

    import numpy as np
    core = interp.tl.core
    global ORIGINAL_TYPES
    tl = interp.tl
    float8 = ("float8e5", "float8e5b16", "float8e4nv", "float8e4b8", "float8e4b15")
    if ORIGINAL_TYPES or not (all(hasattr(core, n) for n in ("tuple", "constexpr", "validate_block_shape",
                                                            "_unwrap_shape"))
                              and hasattr(interp, "_get_np_dtype") and all(hasattr(tl, n) for n in float8)):
        return          # (another Triton: left as it is)
    tl_tuple, constexpr, validate, unwrap_shape = core.tuple, core.constexpr, core.validate_block_shape, \
        core._unwrap_shape
    tensor_parts: dict = {}     # dims -> (numel, [constexpr dims], their tuple type)
    block_parts: dict = {}      # dims -> (dims, their tuple type, numel, the shape as the name shows it)

    def dims_of(shape):
        values = shape.values if isinstance(shape, tl_tuple) else shape
        return builtins.tuple(v.value if isinstance(v, constexpr) else v for v in values)

    def tensor_init(self, handle, type):
        self.handle = handle
        dims = dims_of(type.shape) if type.is_block() else ()
        parts = tensor_parts.get(dims)
        if parts is None:
            values = [constexpr(d) for d in dims]
            parts = tensor_parts[dims] = (constexpr(math.prod(dims)), values, tl_tuple(values).type)
        self.numel = parts[0]
        self.type = type
        self.dtype = type.scalar
        self.shape = tl_tuple(parts[1], parts[2])

    def block_init(self, element_ty, shape):
        self.element_ty = element_ty
        assert isinstance(shape, (list, tl_tuple))
        dims = dims_of(shape)
        parts = block_parts.get(dims)
        if parts is None:
            values = unwrap_shape(shape)
            t = tl_tuple(values)
            if not values:
                raise TypeError('0d block_type is forbidden')
            parts = block_parts[dims] = (values, t.type, validate(t), str(t))
        self.shape = tl_tuple(parts[0], parts[1])
        self.numel = parts[2]
        self.name = f'<{parts[3]}, {element_ty}>'

    pointer = np.dtype(np.uint64)
    numpy_of = {tl.int1: np.dtype(bool), tl.float16: np.dtype(np.float16), tl.float32: np.dtype(np.float32),
                tl.float64: np.dtype(np.float64), tl.int8: np.dtype(np.int8), tl.uint8: np.dtype(np.uint8),
                tl.int16: np.dtype(np.int16), tl.uint16: np.dtype(np.uint16), tl.int32: np.dtype(np.int32),
                tl.uint32: np.dtype(np.uint32), tl.int64: np.dtype(np.int64), tl.uint64: np.dtype(np.uint64),
                tl.bfloat16: np.dtype(np.uint16)}           # (bfloat16 and the fp8 types stored as integers)
    numpy_of.update({getattr(tl, n): np.dtype(np.uint8) for n in float8})

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        return pointer if isinstance(tt_dtype, tl.pointer_type) else numpy_of[tt_dtype]

    ORIGINAL_TYPES = (core.tensor.__init__, core.block_type.__init__, interp._get_np_dtype)
    core.tensor.__init__, core.block_type.__init__, interp._get_np_dtype = tensor_init, block_init, get_np_dtype


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
        c0, c1, c2, c3, k0, k1 = np.broadcast_arrays(
            *(x.handle.data.astype(np.uint64) for x in (c0, c1, c2, c3, k0, k1)))
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
