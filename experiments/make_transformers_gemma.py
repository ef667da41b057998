"""A transformers Gemma 3 or Gemma 2 model of Gemma-3-1B's or Gemma-2-2B's config with random fp16 weights and
random norm scales, built on the GPU and saved as a model directory, for `kogc check` / `kogc bench` on a machine
that cannot receive their weights (2 GB, 5 GB):

    python experiments/make_transformers_gemma.py gemma-3-1b /tmp/gemma3-1b
    kogc check --model-dir /tmp/gemma3-1b --max-len 2048 --steps 256 --generate 128
    kogc bench --model-dir /tmp/gemma3-1b --max-len 2048 --context 1024 --steps 50 --reps 5

Gemma-3-1B: 26 layers, five local layers with a window of 512 to each global one, RoPE bases 10,000 and
1,000,000, tied embeddings of 262,144 tokens. Gemma-2-2B: 26 layers alternating a window of 4096 and global
attention, scores soft-capped at 50 and logits at 30, tied embeddings of 256,000 tokens.
"""
import sys
import time

import torch
import transformers

CONFIGS = {
    "gemma-3-1b": lambda: transformers.Gemma3TextConfig(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        max_position_embeddings=32768,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        tie_word_embeddings=True),
    "gemma-2-2b": lambda: transformers.Gemma2Config(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=8192,
        tie_word_embeddings=True),
}
CLASSES = {"gemma-3-1b": "Gemma3ForCausalLM", "gemma-2-2b": "Gemma2ForCausalLM"}

if len(sys.argv) != 3 or sys.argv[1] not in CONFIGS:
    sys.exit(f"usage: make_transformers_gemma.py {'|'.join(CONFIGS)} DIR")
t0 = time.time()
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = getattr(transformers, CLASSES[sys.argv[1]])(CONFIGS[sys.argv[1]]()).to(torch.float16).eval()
    model.requires_grad_(False)
    for name, p in model.named_parameters():
        if "norm" in name:      # (zeros at init: the scales 1 + w would all be 1)
            p.normal_(0, 0.3)
model.save_pretrained(sys.argv[2])
print(f"saved {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters to {sys.argv[2]} "
      f"in {time.time() - t0:.1f}s")
