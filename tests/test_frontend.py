"""The frontend's errors (a model written for kogc, traced by torch.fx; any other, captured by torch.export),
and the CLI's."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import MODEL_FILE, lf, tiny

from kogc.cli import main
from kogc.frontend import FrontendError, to_ir


class Unsupported(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, token, pos):
        x = torch.cos(self.emb(token))      # the unsupported op is on this line
        return x, torch.argmax(x)


class DataDependent(torch.nn.Module):
    def forward(self, token, pos):
        if token > 3:                        # control flow on a traced value
            return token
        return pos


def test_unsupported_op_names_op_and_line():
    with pytest.raises(FrontendError) as e:
        to_ir(Unsupported())
    msg = str(e.value)
    line = Unsupported.forward.__code__.co_firstlineno + 1
    assert "aten.cos" in msg and f"test_frontend.py:{line}" in msg and len(msg.splitlines()) == 1


def test_unsupported_op_line_number_is_exact():
    class Cos(torch.nn.Module):
        def forward(self, token, pos):
            return torch.cos(token)
    with pytest.raises(FrontendError) as e:
        to_ir(Cos())
    line = Cos.forward.__code__.co_firstlineno + 1
    assert "cos" in str(e.value) and f"test_frontend.py:{line}" in str(e.value)


def test_data_dependent_control_flow_is_a_clear_error():
    with pytest.raises(FrontendError, match="control flow") as e:
        to_ir(DataDependent())
    line = DataDependent.forward.__code__.co_firstlineno + 1
    assert f"test_frontend.py:{line}" in str(e.value)


def test_meta_model_traces_without_memory():
    model = lf.kogc_model("tiny", device="meta", seed=None)
    graph = to_ir(model)
    assert graph.count()["attention"] == model.config.num_hidden_layers


# ---------------------------------------------------------------- CLI

def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_ir(capsys):
    code, out, err = run_cli(capsys, "compile", MODEL_FILE, "--target", "h200", "--config", "tiny", "--emit", "ir")
    assert code == 0 and "attention(" in out and "lane_sum_others(" in out


def test_cli_ir_json(capsys):
    code, out, err = run_cli(capsys, "compile", MODEL_FILE, "--target", "mi300x", "--config", "tiny",
                             "--emit", "ir-json")
    assert code == 0 and json.loads(out)["meta"]["target"] == "mi300x"


@pytest.mark.parametrize("argv,needle", [
    (["--target", "a100", "--config", "tiny", "--emit", "ir"], "unknown target"),
    (["--target", "h200", "--config", "huge", "--emit", "ir"], "unknown preset"),
    (["--target", "h200", "--config", "tiny", "--lanes", "3", "--emit", "ir"], "divisible"),
    (["--target", "h200", "--config", "tiny", "--lanes", "0", "--emit", "ir"], "--lanes: must be >= 1"),
    (["--target", "h200", "--config", "tiny", "--max-len", "0", "--emit", "ir"], "--max-len: must be >= 1"),
    (["--target", "h200", "--config", "tiny", "--out", MODEL_FILE], "a file is there, not a folder"),
    (["--target", "h200", "--checkpoint", os.path.dirname(os.path.abspath(__file__)), "--emit", "ir"],
     "no config.json there"),
    (["--emit", "ir"], "give --config PRESET (its presets: tiny, laneformer-2b"),
])
def test_cli_bad_input_exit_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, "compile", MODEL_FILE, *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_version(capsys):
    import triton

    import kogc
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"kogc {kogc.__version__} (torch ") and f"triton {triton.__version__}" in out


def test_cli_compiles_for_the_gpu_at_hands_kind_without_target(capsys):
    code, out, err = run_cli(capsys, "compile", MODEL_FILE, "--config", "tiny", "--emit", "schedule")
    assert code == 0 and out.startswith("target h200 (sm_90)")


def test_cli_file_without_model(capsys, tmp_path):
    f = tmp_path / "empty.py"
    f.write_text("x = 1\n")
    code, out, err = run_cli(capsys, "compile", str(f), "--target", "h200", "--config", "tiny", "--emit", "ir")
    assert code == 2 and "no model" in err


def test_cli_untraceable_model(capsys, tmp_path):
    f = tmp_path / "branchy.py"
    f.write_text(textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def forward(self, token, pos):
                if token > 0:
                    return pos
                return token
        def kogc_model(preset=None, checkpoint=None, device="cpu", dtype=None, seed=0):
            return M()
    """))
    code, out, err = run_cli(capsys, "compile", str(f), "--target", "h200", "--config", "x", "--emit", "ir")
    assert code == 2 and "control flow" in err and "branchy.py:5" in err


def test_cli_checkpoint_that_does_not_fit(capsys, tmp_path):
    model = tiny(num_lanes=2)
    lf.save_checkpoint(model, str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 256
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out, err = run_cli(capsys, "compile", MODEL_FILE, "--target", "h200", "--checkpoint", str(tmp_path),
                             "--emit", "ir")
    assert code == 2 and "feed_forward" in err and "shape" in err and len(err.strip().splitlines()) == 1


def test_cli_checkpoint_that_fits(capsys, tmp_path):
    lf.save_checkpoint(tiny(num_lanes=4), str(tmp_path))
    code, out, err = run_cli(capsys, "compile", MODEL_FILE, "--target", "h200", "--checkpoint", str(tmp_path),
                             "--emit", "ir")
    assert code == 0 and "num_lanes=4" in out


def test_console_script_has_no_traceback():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-m", "kogc.cli", "compile", "nope.py", "--target", "h200", "--emit", "ir"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_laneformer_max_len_sets_its_cache_and_keeps_the_presets_placement():
    """--max-len N on the Laneformer example: a KV cache of N positions (max_position_embeddings); the preset's
    placement profiles still apply (no task changes); a checkpoint's own config fields cannot be overridden."""
    import laneformer as lf
    model = lf.kogc_model("laneformer-2b", device="meta", seed=None, max_len=2048)
    assert model.model.layers[0].attention.k_cache.shape[2] == 2048 and hasattr(model, "kogc_placement")
    assert not hasattr(lf.kogc_model("laneformer-2b", device="meta", seed=None, num_lanes=4), "kogc_placement")
    with pytest.raises(ValueError, match="cannot be overridden"):
        lf.kogc_model(checkpoint="/nonexistent-dir", num_lanes=4)


def test_position_probes_make_on_the_cpu_what_a_gpu_models_graph_makes_there():
    # a model on a GPU: the cache's positions its graph makes there (arange(..., device=)) are made on the CPU, beside
    # the probes' own positions (the meta device stands in for CUDA: the same mismatch without it)
    import torch.fx as fx

    from kogc.frontend.probe import PosGraph
    g = fx.Graph()
    pos = g.placeholder("pos")
    at = g.call_function(torch.ops.aten.arange.start, (0, 1), {"device": torch.device("meta"), "dtype": torch.int64})
    out = g.call_function(torch.ops.aten.add.Tensor, (at, g.call_function(torch.ops.aten.reshape.default, (pos, [1]))))
    assert PosGraph({}, pos).value(out, 3).tolist() == [3]
