"""scripts/probe_fused_mlp.py on the CPU: every mode's results against torch under the interpreter,
and the fused task's reduction compiled for sm_90 (vector fp32 atomics, no spills at the 168 cap)."""
import os
import subprocess
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
sys.path.insert(0, SCRIPTS)
import probe_fused_mlp  # noqa: E402


def test_every_mode_matches_torch_under_the_interpreter():
    rows = probe_fused_mlp.main(["--layers", "1", "--lanes", "2", "--dim", "64", "--ffn", "32", "--programs", "2",
                                 "--reps", "1"])
    assert [r["mode"] for r in rows] == list(probe_fused_mlp.MODES)
    assert all(r["check"] < 1e-3 for r in rows), [(r["mode"], r["check"]) for r in rows]
    # the same weight bytes per (layer, lane) either way: W1, W3 and W2 once each
    by = {r["mode"]: r["bytes"] for r in rows}
    assert by["separate"] == by["fused"] == by["fused_store"] == by["w13"] + by["w2"]


def test_fused_task_compiles_to_vector_atomics_without_spills(tmp_path):
    code = """
import sys, glob, re
from kogc.codegen.aot import compile_kernel, disassembly_summary
sig = {"W": "*fp16", "H": "*fp16", "G": "*fp16", "Z": "*fp16", "OUT": "*fp16", "SUM": "*fp32", "n13": "i32",
       "n2": "i32", "nf": "i32"}
consts = {"P": 396, "D": 2048, "F": 1024, "R13": 8, "R2": 16, "RF": 4, "ATOMIC": True}
arts = compile_kernel(sys.argv[1], "mlp_tasks", sig, consts, "h200", sys.argv[2], num_warps=4, options={"maxnreg": 168})
m = disassembly_summary(arts)
ptx = open(glob.glob(sys.argv[2] + "/**/*.ptx", recursive=True)[0]).read()
print(m.get("spill_store_bytes"), len(re.findall(r"atom\\.global\\.gpu\\.relaxed\\.add\\.v4\\.f32", ptx)))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code, os.path.join(SCRIPTS, "probe_fused_mlp.py"), str(tmp_path)],
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    spills, atomics = int(out[0]), int(out[1])
    assert spills == 0 and atomics == 2048 // 128 // 4     # 16 values per thread, 4 per vector atomic
