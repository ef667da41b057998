"""A transformers model of a real config (the LayerNorm families, those with learned positions or ALiBi, Apertus) with
random fp16 weights, random norm weights and biases, built on the GPU and saved as a model directory, for
`kogc check` / `kogc bench` on a machine that cannot receive their weights:

    python experiments/make_transformers_model.py pythia-1.4b /tmp/pythia
    kogc check --model-dir /tmp/pythia --max-len 2048 --steps 256 --generate 128
    kogc bench --model-dir /tmp/pythia --max-len 2048 --context 1024 --steps 50 --reps 5

Pythia-1.4B: 24 layers of 2048, 16 heads of 128, RoPE on a quarter of each head, attention and MLP in parallel,
GELU MLP of 8192, 50,304 tokens. StableLM-2-1.6B: 24 layers of 2048, 32 heads of 64, RoPE on a quarter, Q/K/V
biased, gated SiLU MLP of 5632, 100,352 tokens. Phi-1.5: 24 layers of 2048, 32 heads of 64, RoPE on half,
one norm for both parallel sublayers, gelu_new MLP of 8192, a biased LM head of 51,200 tokens. Starcoder2-3B:
30 layers of 3072, 24 heads of 128 over 2 KV heads, a window of 4096, GELU (tanh) MLP of 12288, 49,152 tokens.
GPT-2 XL: 48 layers of 1600 (in 2048 lanes), 25 heads of 64, learned positions, 50,257 tokens. OPT-1.3B: 24
layers of 2048, 32 heads of 64, learned positions, ReLU MLP of 8192, 50,272 tokens. SantaCoder (GPT-BigCode):
24 layers of 2048, 16 heads of 128 over one KV head, learned positions, 49,280 tokens. GPT-J-6B: 28 layers of
4096, 16 heads of 256, interleaved RoPE on 64 dims, parallel sublayers, a biased LM head of 50,400 tokens.
Phi-2: 32 layers of 2560, 32 heads of 80 (in 128 lanes), RoPE on 32 dims of each, a gelu_new MLP of 10240, a
biased LM head of 51,200 tokens. BLOOM-1B7: 24 layers of 2048, 16 heads of 128, ALiBi, the embedding normed,
250,880 tokens. MPT-7B: 32 layers of 4096, 32 heads of 128, ALiBi, LayerNorms without a bias, 50,432 tokens.
Apertus-8B: 32 layers of 4096, 32 heads of 128 over 8 KV heads, q and k normed per head, Llama 3's RoPE scaling, an
xIELU MLP of 21504 (its constants at their initial values), 131,072 tokens.
"""
import sys
import time

import torch
import transformers

CONFIGS = {
    "pythia-1.4b": ("GPTNeoXForCausalLM", lambda: transformers.GPTNeoXConfig(
        vocab_size=50304, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=16,
        rotary_pct=0.25, max_position_embeddings=2048, use_parallel_residual=True, tie_word_embeddings=False)),
    "stablelm-2-1.6b": ("StableLmForCausalLM", lambda: transformers.StableLmConfig(
        vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, partial_rotary_factor=0.25, use_qkv_bias=True, max_position_embeddings=4096)),
    "phi-1.5": ("PhiForCausalLM", lambda: transformers.PhiConfig(
        vocab_size=51200, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
        partial_rotary_factor=0.5, max_position_embeddings=2048)),
    "starcoder2-3b": ("Starcoder2ForCausalLM", lambda: transformers.Starcoder2Config(
        vocab_size=49152, hidden_size=3072, intermediate_size=12288, num_hidden_layers=30, num_attention_heads=24,
        num_key_value_heads=2, sliding_window=4096, max_position_embeddings=16384)),
    "phi-2": ("PhiForCausalLM", lambda: transformers.PhiConfig(
        vocab_size=51200, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32,
        partial_rotary_factor=0.4, max_position_embeddings=2048)),
    "bloom-1b7": ("BloomForCausalLM", lambda: transformers.BloomConfig(
        vocab_size=250880, hidden_size=2048, n_layer=24, n_head=16)),
    "mpt-7b": ("MptForCausalLM", lambda: transformers.MptConfig(
        vocab_size=50432, d_model=4096, n_layers=32, n_heads=32, max_seq_len=2048, expansion_ratio=4, no_bias=True)),
    "gpt2-xl": ("GPT2LMHeadModel", lambda: transformers.GPT2Config(
        vocab_size=50257, n_embd=1600, n_layer=48, n_head=25, n_positions=1024)),
    "opt-1.3b": ("OPTForCausalLM", lambda: transformers.OPTConfig(
        vocab_size=50272, hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32,
        word_embed_proj_dim=2048, max_position_embeddings=2048, pad_token_id=1)),
    "santacoder": ("GPTBigCodeForCausalLM", lambda: transformers.GPTBigCodeConfig(
        vocab_size=49280, n_embd=2048, n_layer=24, n_head=16, n_positions=2048, multi_query=True)),
    "gpt-j-6b": ("GPTJForCausalLM", lambda: transformers.GPTJConfig(
        vocab_size=50400, n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, n_positions=2048,
        tie_word_embeddings=False)),
    "apertus-8b": ("ApertusForCausalLM", lambda: transformers.ApertusConfig(
        vocab_size=131072, hidden_size=4096, intermediate_size=21504, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=65536, pad_token_id=3)),
}

if len(sys.argv) != 3 or sys.argv[1] not in CONFIGS:
    sys.exit(f"usage: make_transformers_model.py {'|'.join(CONFIGS)} DIR")
t0 = time.time()
torch.manual_seed(0)
cls, config = CONFIGS[sys.argv[1]]
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = getattr(transformers, cls)(config()).to(torch.float16).eval()
    model.requires_grad_(False)
    for name, p in model.named_parameters():
        if ("norm" in name or ".ln_" in name) and name.endswith("weight"):
            p.normal_(1.0, 0.3)
        elif name.endswith("bias"):      # (zeros at init)
            p.normal_(0.0, 0.1)
model.save_pretrained(sys.argv[2])
print(f"saved {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters to {sys.argv[2]} "
      f"in {time.time() - t0:.1f}s")
