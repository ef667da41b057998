"""A transformers Gemma3ForCausalLM of Gemma-3-1B's config (26 layers, five local layers with a window of 512 to
each global one, RoPE bases 10,000 and 1,000,000, tied embeddings of 262,144 tokens) with random fp16 weights
and random norm scales, built on the GPU and saved as a model directory, for `kogc check` / `kogc bench` on a
machine that cannot receive 2 GB of weights (the local layers attend their last 512 positions of a cache of all):

    python experiments/make_transformers_gemma3.py /tmp/gemma3-1b
    kogc check --model-dir /tmp/gemma3-1b --max-len 2048 --steps 256 --generate 128
    kogc bench --model-dir /tmp/gemma3-1b --max-len 2048 --context 1024 --steps 50 --reps 5
"""
import sys
import time

import torch
import transformers

t0 = time.time()
config = transformers.Gemma3TextConfig(
    vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512, max_position_embeddings=32768,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)],
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                     "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
    tie_word_embeddings=True)
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = transformers.Gemma3ForCausalLM(config).to(torch.float16).eval().requires_grad_(False)
    for name, p in model.named_parameters():
        if "norm" in name:      # (zeros at init: the scales 1 + w would all be 1)
            p.normal_(0, 0.3)
model.save_pretrained(sys.argv[1])
print(f"saved {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters to {sys.argv[1]} "
      f"in {time.time() - t0:.1f}s")
