"""Generated kernels: one cache folder with a bounded size, an in-process LRU, nothing in sys.modules,
and a kernel that keeps working after its file is evicted (Triton's interpreter on CPU)."""
import os
import sys
import uuid

import pytest
import torch

from kogc.codegen import loader

SOURCE = '''import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x * {factor}


@triton.jit
def kogc_tiny(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < N
    tl.store(Y + offs, _twice(tl.load(X + offs, mask=m)), mask=m)
'''

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter path")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KOGC_CACHE_DIR", str(tmp_path / "kernels"))
    return tmp_path / "kernels"


def source(factor=2):
    return SOURCE.format(factor=factor) + f"# {uuid.uuid4().hex}\n"     # a source no earlier test loaded


def files(folder):
    return sorted(p for p in os.listdir(folder) if p.endswith(".py"))


def run(kernel, factor_input=(1.0, 2.0, 3.0)):
    x = torch.tensor(factor_input)
    y = torch.zeros_like(x)
    with loader.interpreter(True):
        kernel[(1,)](x, y, x.numel(), BLOCK=4)
    return y.tolist()


def test_the_same_source_loads_once_into_one_file(cache):
    src = source()
    k1, p1 = loader.load_kernel(src, True, name="kogc_tiny")
    k2, p2 = loader.load_kernel(src, True, name="kogc_tiny")
    assert k1 is k2 and p1 == p2 and os.path.dirname(p1) == str(cache) and files(cache) == [os.path.basename(p1)]
    assert open(p1).read() == src and run(k1) == [2.0, 4.0, 6.0]


def test_the_folder_never_exceeds_its_bound(cache, monkeypatch):
    monkeypatch.setenv("KOGC_CACHE_MAX_FILES", "4")
    paths = []
    for i in range(4 + 5):
        _, p = loader.load_kernel(source(i), True, name="kogc_tiny")
        paths.append(p)
        assert len(files(cache)) <= 4
    assert files(cache) == sorted(os.path.basename(p) for p in paths[-4:])     # the least recently used went
    # reuse touches a file: loading the oldest survivor again keeps it past the next eviction
    loader.load_kernel(open(paths[-4]).read(), True, name="kogc_tiny")
    loader.load_kernel(source(99), True, name="kogc_tiny")
    assert os.path.basename(paths[-4]) in files(cache) and os.path.basename(paths[-3]) not in files(cache)
    # and by bytes: a bound below two files keeps only the newest
    monkeypatch.setenv("KOGC_CACHE_MAX_BYTES", str(len(SOURCE) + 200))
    _, p = loader.load_kernel(source(7), True, name="kogc_tiny")
    assert files(cache) == [os.path.basename(p)]


def test_nothing_goes_into_sys_modules(cache):
    loader.load_kernel(source(), True, name="kogc_tiny")                      # triton's own lazy imports first
    before = set(sys.modules)
    loader.load_kernel(source(3), True, name="kogc_tiny")
    assert set(sys.modules) == before


def test_an_evicted_file_does_not_break_a_loaded_kernel(cache):
    # the interpreter reads a function's source when it is first called: a helper first called after
    # its file is gone still runs; loading the source again writes the file again
    src = source(5)
    kernel, path = loader.load_kernel(src, True, name="kogc_tiny")
    os.remove(path)
    assert run(kernel) == [5.0, 10.0, 15.0]
    # ... rewritten for the interpreter (Triton silently runs a function it cannot read unrewritten)
    helper = kernel.fn.__globals__["_twice"]
    assert all(type(f).rewritten_fn.get(f.fn, f.fn) is not f.fn for f in (kernel, helper))
    loader.clear_loaded()
    again, path2 = loader.load_kernel(src, True, name="kogc_tiny")
    assert again is not kernel and path2 == path and os.path.exists(path) and run(again) == [5.0, 10.0, 15.0]


def test_the_in_process_lru_is_bounded(cache, monkeypatch):
    monkeypatch.setattr(loader, "MAX_LOADED", 2)
    srcs = [source(i) for i in range(3)]
    first = loader.load_kernel(srcs[0], True, name="kogc_tiny")[0]
    for s in srcs[1:]:
        loader.load_kernel(s, True, name="kogc_tiny")
    assert len(loader._loaded) <= 2
    assert loader.load_kernel(srcs[0], True, name="kogc_tiny")[0] is not first     # loaded again
    assert run(first) == [0.0, 0.0, 0.0]                                             # factor 0: still runs


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter path")
def test_helpers_patched_once_per_launch_run_the_same_program():
    # kogc.codegen.interpret_once: Triton's interpreter re-patched triton.language on every helper call;
    # once per launch, with the types' parts kept per shape and the overflow sanitizer off, must give bit-equal
    # logits and tokens (and the sampling path's too)
    import dataclasses
    import os
    import sys

    from triton.language import random as rnd
    from triton.runtime import interpreter as interp

    import kogc
    from kogc.codegen import interpret_once
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import micro_laneformer as micro
    assert interpret_once.install()
    model = micro.kogc_model("micro", seed=3)

    def run():
        ck = kogc.compile(model)
        return ck.step(7, 0), ck.generate([1, 2], 2, temperature=1.0, top_k=5, seed=4)
    fast = run()
    core = interp.tl.core
    patched = (interp.GridExecutor.__call__, interp.InterpretedFunction.__call__, rnd.philox_impl,
               core.tensor.__init__, core.block_type.__init__, interp._get_np_dtype)
    interp.GridExecutor.__call__, interp.InterpretedFunction.__call__ = interpret_once.ORIGINAL
    rnd.philox_impl = interpret_once.ORIGINAL_PHILOX
    core.tensor.__init__, core.block_type.__init__, interp._get_np_dtype = interpret_once.ORIGINAL_TYPES
    builder = interp.interpreter_builder
    options = builder.options
    assert not options.sanitize_overflow
    builder.options = dataclasses.replace(options, sanitize_overflow=True)
    try:
        slow = run()
    finally:
        (interp.GridExecutor.__call__, interp.InterpretedFunction.__call__, rnd.philox_impl,
         core.tensor.__init__, core.block_type.__init__, interp._get_np_dtype) = patched
        builder.options = options
    (a, ta), ga = fast
    (b, tb), gb = slow
    assert torch.equal(a, b) and ta == tb and ga == gb


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter path")
def test_fast_types_set_what_tritons_constructors_set():
    # the interpreter's tensors and block types built with their parts kept per shape: the same attributes
    # as Triton's own constructors give, a fresh shape tuple each, and the same refusals
    import numpy as np
    from triton.runtime import interpreter as interp

    from kogc.codegen import interpret_once
    assert interpret_once.install() and interpret_once.ORIGINAL_TYPES
    core, tl = interp.tl.core, interp.tl
    tensor_init, block_init, np_dtype = interpret_once.ORIGINAL_TYPES

    def built(init, cls, *args):
        obj = cls.__new__(cls)
        init(obj, *args)
        return obj

    def seen(t):
        return ([type(v) for v in t.shape.values], [v.value for v in t.shape.values], t.shape.type, t.numel.value,
                t.type, t.dtype, str(t.type))
    for elem in (tl.float32, tl.float16, tl.pointer_type(tl.float16), tl.int1):
        for shape in ([16], [4, 64], core.tuple([core.constexpr(2), 8, 32])):
            ours, theirs = tl.block_type(elem, shape), built(block_init, tl.block_type, elem, shape)
            assert (ours == theirs and str(ours) == str(theirs) and ours.numel == theirs.numel
                    and ours.shape == theirs.shape and ours.shape.type == theirs.shape.type)
            handle = interp.TensorHandle(np.zeros(ours.numel, dtype=np_dtype(ours)), ours.scalar)
            a, b = tl.tensor(handle, ours), built(tensor_init, tl.tensor, handle, ours)
            assert seen(a) == seen(b) and interp._get_np_dtype(ours) == np_dtype(ours)
            assert a.shape is not tl.tensor(handle, ours).shape
        assert interp._get_np_dtype(elem) == np_dtype(elem)
    scalar = tl.tensor(interp.TensorHandle(np.zeros(1, np.float32), tl.float32), tl.float32)
    assert seen(scalar) == seen(built(tensor_init, tl.tensor, scalar.handle, tl.float32))
    for bad in ([], [3, 4]):
        with pytest.raises(Exception) as ours:
            tl.block_type(tl.float32, bad)
        with pytest.raises(Exception) as theirs:
            built(block_init, tl.block_type, tl.float32, bad)
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter path")
def test_the_sanitizer_turned_off_is_one_whose_assertions_were_dropped():
    # the interpreter's overflow sanitizer, on as Triton sets it, lets an int32 overflow through (its assertion
    # needs `debug`), so turning it off drops nothing; with `debug` on it is left alone
    import dataclasses
    import types

    import numpy as np
    import triton
    import triton.language as tl
    from triton.runtime import interpreter as interp

    from kogc.codegen import interpret_once
    assert interpret_once.install()

    @triton.jit
    def add(x_ptr, out_ptr):
        tl.store(out_ptr, tl.load(x_ptr) + tl.load(x_ptr))
    builder = interp.interpreter_builder
    options = builder.options
    builder.options = dataclasses.replace(options, sanitize_overflow=True)
    try:
        x, out = torch.tensor([2**30 + 1], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        add[(1,)](x, out)
    finally:
        builder.options = options
    assert out.item() == np.int32(2**31 + 2 - 2**32)
    debug = types.SimpleNamespace(interpreter_builder=types.SimpleNamespace(
        options=dataclasses.replace(options, sanitize_overflow=True, debug=True)))
    interpret_once._install_no_discarded_checks(debug)
    assert debug.interpreter_builder.options.sanitize_overflow


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter path")
def test_philox_as_numpy_is_tritons_philox():
    # kogc.codegen.interpret_once runs Triton's 32-bit Philox rounds as numpy arithmetic under the
    # interpreter: every output word equal to Triton's own rounds, for scalar and block offsets
    import triton
    import triton.language as tl
    from triton.language import random as rnd

    from kogc.codegen import interpret_once
    assert interpret_once.install() and interpret_once.ORIGINAL_PHILOX is not None

    @triton.jit
    def draw(OUT, seed, off0, N: tl.constexpr):
        a, b, c, d = tl.randint4x(seed, off0 + tl.arange(0, N))
        i = tl.arange(0, N)
        tl.store(OUT + i, a)
        tl.store(OUT + N + i, b)
        tl.store(OUT + 2 * N + i, c)
        tl.store(OUT + 3 * N + i, d)
        tl.store(OUT + 4 * N, tl.rand(seed, off0).to(tl.uint32, bitcast=True))

    def run(off0, seed):
        out = torch.zeros(4 * 64 + 1, dtype=torch.int32)
        draw[(1,)](out, seed, off0, N=64)
        return out
    gen = torch.Generator().manual_seed(0)
    cases = [(0, 0), (2**31 - 64, 2**40 + 12345)] + [
        (int(torch.randint(0, 2**30, (), generator=gen)), int(torch.randint(0, 2**62, (), generator=gen)))
        for _ in range(3)]
    fast = [run(o, s) for o, s in cases]
    rnd.philox_impl, patched = interpret_once.ORIGINAL_PHILOX, rnd.philox_impl
    try:
        slow = [run(o, s) for o, s in cases]
    finally:
        rnd.philox_impl = patched
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert len({tuple(a.tolist()) for a in fast}) == len(cases)       # (different draws: not all zeros)
