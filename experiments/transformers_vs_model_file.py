"""CPU check: does a transformers Llama of Llama-3.2-1B's config (its llama3 RoPE scaling included; random fp16
weights) compile to the kernel examples/llama.py's llama-3.2-1b preset compiles to? Prints, for both, the tasks,
events, variants and hashes of the kernel source and the task table, then what differs. About 90 s and 6 GB of
memory on 2 cores (the model is built for real: the RoPE tables are computed from real tensors).

    python experiments/transformers_vs_model_file.py
"""
import collections
import hashlib

import torch
import transformers

from kogc.codegen.render import render
from kogc.frontend import to_ir
from kogc.frontend.hf import decode_step
from kogc.frontend.model_file import build_model
from kogc.scheduler import build_schedule
from kogc.targets import H200

config = transformers.LlamaConfig(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
    tie_word_embeddings=True, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
torch.manual_seed(0)
hf = transformers.LlamaForCausalLM(config).to(torch.float16).eval()
built = {}
for name, step in (("transformers", decode_step(hf, max_len=2048)),
                   ("examples/llama.py",
                    build_model("examples/llama.py", preset="llama-3.2-1b", seed=0, max_len=2048))):
    s = build_schedule(to_ir(step), H200)
    src = [line for line in render(s).splitlines() if not line.startswith("# Generated")]
    table, _ = s.table()
    built[name] = (src, table, s.variants, collections.Counter((t.variant, t.layer) for t in s.tasks))
    print(f"{name}: {len(s.tasks)} tasks, {len(s.events)} events, {len(s.variants)} variants, kernel source "
          f"{hashlib.sha1(chr(10).join(src).encode()).hexdigest()[:12]} (but its first line), task table "
          f"{hashlib.sha1(table.tobytes()).hexdigest()[:12]}")
(sa, ta, va, ca), (sb, tb, vb, cb) = built.values()
print("the same kernel source:", sa == sb, "| the same variants:", va == vb, "| the same tasks per layer:", ca == cb)
if ta.shape == tb.shape:
    moved = ta[..., 0] != tb[..., 0]
    pairs = collections.Counter((va[x], va[y]) for x, y in zip(ta[..., 0][moved], tb[..., 0][moved]))
    print(f"queue slots holding another variant: {int(moved.sum())}")
    for (x, y), n in pairs.most_common():
        print(f"  {n:6d}  {x}  <->  {y}")
    print(f"other table entries that differ (buffer offsets): {int(((ta != tb) & ~moved[..., None]).sum())}")
