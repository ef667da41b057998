"""Ahead-of-time compilation of a generated persistent-style Triton kernel for H200 and MI300X,
on a machine with no GPU (kogc/codegen/aot.py).

Each test uses a fresh TRITON_CACHE_DIR so the compile really runs (no cache hit). The tests do
not depend on TRITON_INTERPRET: compile_kernel compiles in a child process when it is on, and
one test forces that path.
"""
from __future__ import annotations

import os
import sys
import time

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from kogc.codegen.aot import compile_kernel, disassembly_summary  # noqa: E402

# A persistent-style kernel: spin on an acquire load of a counter, stream a block of fp16
# weights, matvec via tl.sum, store, barrier, publish with a release atomic. Scalar atomics
# only (tensor-valued atomics with sem= are broken on AMD in Triton 3.6), no volatile loads.
KERNEL_SRC = '''
import triton
import triton.language as tl


@triton.jit
def persistent_matvec(w_ptr, x_ptr, y_ptr, cnt_ptr, target, n_items,
                      K: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    item = pid
    while item < n_items:
        # wait until the producer has published `target` times
        while tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu") < target:
            pass
        rows = item.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
        cols = tl.arange(0, K).to(tl.int64)
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :])
        x = tl.load(x_ptr + cols)
        y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        tl.store(y_ptr + rows, y.to(tl.float16))
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + 1, 1, sem="release", scope="gpu")
        item += nprog
'''

SIGNATURE = {"w_ptr": "*fp16", "x_ptr": "*fp16", "y_ptr": "*fp16", "cnt_ptr": "*i32",
             "target": "i32", "n_items": "i32", "K": "constexpr", "BLOCK_N": "constexpr"}
CONSTEXPRS = {"K": 256, "BLOCK_N": 16}

TIMINGS: dict[str, float] = {}


@pytest.fixture
def kernel_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))
    p = tmp_path / "gen_kernel.py"
    p.write_text(KERNEL_SRC)
    return p


def _compile(kernel_file, target, out_dir):
    t0 = time.perf_counter()
    arts = compile_kernel(str(kernel_file), "persistent_matvec", SIGNATURE, CONSTEXPRS, target, str(out_dir),
                          num_warps=4)
    TIMINGS[target] = time.perf_counter() - t0
    print(f"\n[aot] compile for {target}: {TIMINGS[target]:.2f} s")
    return arts


def test_compile_h200(kernel_file, tmp_path):
    arts = _compile(kernel_file, "h200", tmp_path / "out")
    for kind in ("ttir", "ttgir", "llir", "ptx", "cubin"):
        assert kind in arts and os.path.getsize(arts[kind]) > 0, kind
        assert arts[kind].endswith(f"persistent_matvec.{kind}")
    with open(arts["cubin"], "rb") as f:
        assert f.read(4) == b"\x7fELF"
    ptx = open(arts["ptx"]).read()
    assert ".target sm_90" in ptx
    # acquire load of the counter (atomic_add(ptr, 0, sem=acquire) becomes an acquire load)
    assert "ld.global.gpu.acquire" in ptx or "ld.global.acquire.gpu" in ptx
    # release publish
    assert "atom.global.gpu.release" in ptx or "red.global.gpu.release" in ptx or "red.release.gpu" in ptx

    s = disassembly_summary(arts)
    print("[aot] h200 summary:", s)
    assert s["backend"] == "cuda"
    assert s["has_acquire_load"] and s["has_release_atomic"]
    assert s["ld_global_acquire"] >= 1 and s["atom_release"] >= 1
    assert s["ld_global_128"] >= 1          # the fp16 weight block is loaded 128 bits at a time
    assert s["bar_sync"] >= 1                # tl.debug_barrier()
    if "registers" in s:                     # bundled cuobjdump / ptxas present
        assert 0 < s["registers"] <= 255
    if "spill_store_bytes" in s:
        assert s["spill_store_bytes"] == 0


def test_compile_mi300x(kernel_file, tmp_path):
    arts = _compile(kernel_file, "mi300x", tmp_path / "out")
    for kind in ("ttir", "ttgir", "llir", "amdgcn", "hsaco"):
        assert kind in arts and os.path.getsize(arts[kind]) > 0, kind
    with open(arts["hsaco"], "rb") as f:
        assert f.read(4) == b"\x7fELF"
    s = disassembly_summary(arts)
    print("[aot] mi300x summary:", s)
    assert s["backend"] == "hip"
    assert s["global_load_dwordx4"] + s["buffer_load_dwordx4"] >= 1
    assert s["s_waitcnt"] >= 1
    assert s["buffer_inv"] >= 1              # agent-scope acquire invalidates caches
    assert s["buffer_wbl2"] >= 1             # agent-scope release writes back L2
    assert s["atomics"] >= 1


def test_compile_error_names_target(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))
    bad = tmp_path / "bad_kernel.py"
    bad.write_text(KERNEL_SRC.replace("tl.sum(", "tl.no_such_function("))
    with pytest.raises(RuntimeError) as ei:
        compile_kernel(str(bad), "persistent_matvec", SIGNATURE, CONSTEXPRS, "h200", str(tmp_path / "out"))
    msg = str(ei.value)
    assert "'h200'" in msg and "no_such_function" in msg
    # inside a called jit function: Triton's error names the call; the message also names what failed in it
    nested = KERNEL_SRC.replace("y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)",
                                "y = _row_sums(w, x)")
    nested += ("\n\n@triton.jit\ndef _row_sums(w, x):\n"
               "    return tl.no_such_function(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)\n")
    bad.write_text(nested)
    with pytest.raises(RuntimeError) as ei:
        compile_kernel(str(bad), "persistent_matvec", SIGNATURE, CONSTEXPRS, "h200", str(tmp_path / "out2"))
    assert "_row_sums(w, x)" in str(ei.value) and "innermost:" in str(ei.value) and "no_such_function" in str(ei.value)


def test_bad_arguments(kernel_file, tmp_path):
    with pytest.raises(ValueError, match="unknown target"):
        compile_kernel(str(kernel_file), "persistent_matvec", SIGNATURE, CONSTEXPRS, "a100", str(tmp_path))
    with pytest.raises(ValueError, match="no value"):
        compile_kernel(str(kernel_file), "persistent_matvec", SIGNATURE, {"K": 256}, "h200", str(tmp_path))
    sig = dict(SIGNATURE)
    del sig["n_items"]
    with pytest.raises(ValueError, match="missing"):
        compile_kernel(str(kernel_file), "persistent_matvec", sig, CONSTEXPRS, "h200", str(tmp_path))


def test_compile_under_interpret_mode(kernel_file, tmp_path, monkeypatch):
    """With TRITON_INTERPRET=1, compile_kernel compiles in a child process with it unset."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    arts = compile_kernel(str(kernel_file), "persistent_matvec", SIGNATURE, CONSTEXPRS, "h200",
                          str(tmp_path / "out"))
    assert os.path.getsize(arts["cubin"]) > 0
    assert disassembly_summary(arts)["has_acquire_load"]

