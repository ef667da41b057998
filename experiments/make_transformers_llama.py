"""A transformers LlamaForCausalLM of Llama-3.2-1B's config (llama3 RoPE scaling, tied embeddings) with random
fp16 weights, built on the GPU and saved as a model directory, for `kogc check` / `kogc bench --model-dir DIR`
on a machine that cannot receive 2.5 GB of weights:

    python experiments/make_transformers_llama.py /tmp/llama1b
    kogc check --model-dir /tmp/llama1b --max-len 2048 --steps 256 --generate 256
    kogc bench --model-dir /tmp/llama1b --max-len 2048 --context 1024 --steps 50 --reps 3
"""
import sys
import time

import torch
import transformers

t0 = time.time()
config = transformers.LlamaConfig(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
    tie_word_embeddings=True, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    torch_dtype="float16")
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = transformers.LlamaForCausalLM(config).to(torch.float16).eval()
model.save_pretrained(sys.argv[1])
print(f"saved {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters to {sys.argv[1]} "
      f"in {time.time() - t0:.1f}s")
