"""scripts/probe_hop.py on the CPU: the ping-pong arithmetic under the interpreter (one program), and
the machine code of the LL protocol (one 8-byte volatile store per word, no fence, no counter)."""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import probe_hop  # noqa: E402


def test_ping_pong_arithmetic_under_the_interpreter():
    rows = probe_hop.main(["--programs", "1", "--hops", "5", "--sizes", "64", "--reps", "1", "--pollers", "0,1"])
    assert [(r["protocol"], r["pollers"]) for r in rows] == [("counter", 0), ("ll", 0), ("counter", 1), ("ll", 1)]
    assert all(r["correct"] and r["stuck_at_turn"] == 0 for r in rows)
    # with a streamer beside them (here it runs after the players, finds DONE set and stops at once)
    rows = probe_hop.main(["--programs", "1", "--hops", "4", "--sizes", "64", "--reps", "1", "--pollers", "0",
                           "--streamers", "1"])
    assert [r["streamers"] for r in rows] == [1, 1] and all(r["correct"] for r in rows)


def test_ll_protocol_compiles_to_8_byte_volatile_stores_without_fences():
    # in a subprocess: the tests run with TRITON_INTERPRET=1, under which nothing compiles ahead of time
    import subprocess
    code = """
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import probe_hop
sig = {"BUF": "*i64", "ERR": "*i32", "SRC": "*fp16", "SINK": "*fp32", "DONE": "*i32", "hops": "i32", "limit": "i32",
       "Q": "i32", "streamers": "i32", "P": "constexpr", "N": "constexpr", "ASM": "constexpr", "NSRC": "constexpr",
       "NP": "constexpr"}
n, np_ = int(sys.argv[1]), int(sys.argv[2])
k = triton.compile(ASTSource(probe_hop.hop_ll, sig, {"P": 2, "N": n, "ASM": True, "NSRC": 1 << 29, "NP": np_}),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
sys.stdout.write(k.asm["ptx"])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(probe_hop.__file__), env.get("PYTHONPATH", "")])
    # 1024 words: 8 per thread; 64 words padded to 128 (one per thread, none replicated across warps)
    for n, np_, per_thread in [(1024, 1024, 8), (64, 128, 1)]:
        ptx = subprocess.run([sys.executable, "-c", code, str(n), str(np_)], env=env, capture_output=True, text=True,
                             check=True).stdout
        assert len(re.findall(r"st\.volatile\.global\.b64", ptx)) == per_thread, n
        assert "ld.volatile.global" in ptx
        assert not re.search(r"membar|fence|\.release|\.acquire", ptx)
