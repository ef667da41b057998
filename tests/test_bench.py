"""`kogc bench` on CPU: the interpreter path produces the table and the JSON (speed is not checked)."""
import json
import os
import subprocess
import sys

from conftest import MODEL_FILE, ROOT


def test_bench_interpreter_writes_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "kogc.cli", "bench", MODEL_FILE, "--config", "tiny", "--context", "8",
                        "--steps", "2", "--reps", "2", "--interpret", "--json", str(out)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "kogc (interpreter, CPU)" in r.stdout and "eager (CPU)" in r.stdout and "floor:" in r.stdout
    res = json.loads(out.read_text())
    names = [row["name"] for row in res["rows"]]
    assert names == ["kogc (interpreter, CPU)", "eager (CPU)"]
    assert all(row["ms_median"] > 0 and len(row["ms_reps"]) == 2 for row in res["rows"])
    assert res["floor"]["bytes_per_token"] > 0 and res["config"]["context"] == 8


def test_bench_without_gpu_says_so():
    import torch
    if torch.cuda.is_available():
        return
    r = subprocess.run([sys.executable, "-m", "kogc.cli", "bench", MODEL_FILE, "--config", "tiny"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "no GPU" in r.stderr
