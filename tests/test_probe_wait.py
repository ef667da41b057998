"""scripts/probe_wait.py on the CPU: every wait mode computes W @ x under the interpreter, and the
modes that use inline PTX compile for sm_90 to the loads and the fence they are about."""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import probe_wait  # noqa: E402


def test_every_mode_computes_the_matvec_under_the_interpreter():
    rows = probe_wait.main(["--programs", "2", "--tasks", "3", "--reps", "1", "--k", "64", "--rows", "4"])
    assert [r["mode"] for r in rows] == list(probe_wait.MODES)
    assert all(r["correct"] and not r["stuck"] for r in rows)


def test_wait_modes_compile_to_their_instructions():
    # in a subprocess: the tests run with TRITON_INTERPRET=1, under which nothing compiles ahead of time
    import subprocess
    code = """
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import probe_wait
sig = {"W": "*fp16", "X": "*fp16", "TABLE": "*i32", "CNT": "*i32", "OUT": "*fp32", "PUB": "*i32", "ERR": "*i32",
       "ntasks": "i32", "limit": "i32", "MODE": "constexpr", "R": "constexpr", "K": "constexpr", "ROWW": "constexpr",
       "NEVS": "constexpr", "NT": "constexpr", "ASM": "constexpr"}
k = triton.compile(ASTSource(probe_wait.ready_waits, sig, {"MODE": sys.argv[1], "R": 16, "K": 1024, "ROWW": 32,
                                                            "NEVS": 64, "NT": 128, "ASM": True}),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
sys.stdout.write(k.asm["ptx"])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(probe_wait.__file__), env.get("PYTHONPATH", "")])
    ptx = {m: subprocess.run([sys.executable, "-c", code, m], env=env, capture_output=True, text=True,
                             check=True).stdout for m in ("none", "each", "early", "ahead")}
    assert not re.search(r"\.acquire|fence", ptx["none"])
    assert "ld.global.acquire.gpu.b32" in ptx["each"]
    assert "ld.global.relaxed.gpu.b32" in ptx["early"] and "fence.acq_rel.gpu" in ptx["early"]
    assert "ld.global.acquire.gpu.b32" in ptx["ahead"] and "fence" not in ptx["ahead"]
    assert all("ld.global.cg" in p for p in ptx.values())      # the operand bypasses L1 in every mode
