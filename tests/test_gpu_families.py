"""GPU tests of the decoder families beyond Llama's form (LayerNorm, learned positions, ALiBi, heads that are no
power of two), and an ordinary decoder over two ranks: random fp16 weights of each family's config, checked as
`kogc check --model-dir` checks a model (experiments/gpu_tests.sh 3)."""
import pytest
from test_gpu import check_random_transformers_model

V = dict(vocab_size=32000)
FAMILIES = {   # (model class, config class, the config: 4 layers each)
    # LayerNorm (random weights and biases), the fused QKV per head, RoPE on a quarter of each head, attention and
    # a GELU MLP in parallel, every layer biased; a width of 1024, 8 heads of 128
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(hidden_size=1024, intermediate_size=4096,
                 num_hidden_layers=4, num_attention_heads=8, rotary_pct=0.25, max_position_embeddings=4096)),
    # one LayerNorm for both parallel sublayers, RoPE on half of each head, gelu_new written out, a biased LM head
    "phi": ("PhiForCausalLM", "PhiConfig", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
            num_attention_heads=16, partial_rotary_factor=0.5, max_position_embeddings=4096)),
    # Phi-2's heads of 80: attention over 80 dims in 128 lanes, RoPE on 32
    "phi2_heads_of_80": ("PhiForCausalLM", "PhiConfig", dict(hidden_size=1280, intermediate_size=5120,
                         num_hidden_layers=4, num_attention_heads=16, partial_rotary_factor=0.4,
                         max_position_embeddings=2048)),
    # a learned position embedding added in the embedding task, Conv1D layers, gelu_new written out, no RoPE
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=1024, n_layer=4, n_head=16, n_positions=1024, bos_token_id=0,
             eos_token_id=0)),
    # position p at row p + 2 of its table, a ReLU MLP
    "opt": ("OPTForCausalLM", "OPTConfig", dict(hidden_size=1024, ffn_dim=4096, num_hidden_layers=4,
            num_attention_heads=16, word_embed_proj_dim=1024, max_position_embeddings=2048, pad_token_id=1)),
    # the new architecture: the fused QKV grouped per KV head, taken apart by slice and select; two norms
    "falcon": ("FalconForCausalLM", "FalconConfig", dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
               num_kv_heads=2, new_decoder_architecture=True, max_position_embeddings=2048)),
    # its LayerNorm written out, without a bias (zeros in the kernel), parallel sublayers, scaled logits
    "cohere": ("CohereForCausalLM", "CohereConfig", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
               num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048, pad_token_id=0,
               bos_token_id=1, eos_token_id=2)),
    # ALiBi rounded to fp16 as the model rounds it, the embedding's LayerNorm in the embedding task
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(hidden_size=1024, n_layer=4, n_head=16)),
    # ALiBi in fp32, LayerNorms without a bias
    "mpt": ("MptForCausalLM", "MptConfig", dict(d_model=1024, n_layers=4, n_heads=8, max_seq_len=2048,
            expansion_ratio=4, no_bias=True)),
    # LayerNorm1P (its weight + 1), a squared-ReLU MLP, RoPE on half of each head
    "nemotron": ("NemotronForCausalLM", "NemotronConfig", dict(hidden_size=1024, intermediate_size=4096,
                 num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                 pad_token_id=0)),
    # q and k normed per head after rotate-half RoPE
    "hunyuan_dense": ("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", dict(hidden_size=1024,
                      intermediate_size=4096, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=128, max_position_embeddings=4096, pad_token_id=0)),
    # RMSNorms without a weight (the embedding's too), q and k normed after RoPE, squared ReLU, soft-capped logits
    "nanochat": ("NanoChatForCausalLM", "NanoChatConfig", dict(hidden_size=1024, intermediate_size=4096,
                 num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=4096,
                 pad_token_id=0)),
    # xIELU (Apertus's activation: its constants in the up projection's task arguments), q and k normed per head,
    # Llama 3's RoPE scaling
    "apertus": ("ApertusForCausalLM", "ApertusConfig", dict(hidden_size=1024, intermediate_size=4096,
                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, pad_token_id=0)),
    # each sublayer's output normed and scaled by a residual multiplier (folded into the norm's scale)
    "hyperclovax": ("HyperCLOVAXForCausalLM", "HyperCLOVAXConfig", dict(hidden_size=1024, intermediate_size=4096,
                    num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                    residual_multiplier=0.5, pad_token_id=0)),
}


# families whose transformers code captures from 5.24 on (5.17's OPT and BLOOM build their masks from the cache's
# length, its Falcon indexes its fused QKV, its MPT slices ALiBi by a tensor)
NEEDS_5_24 = {"opt", "falcon", "bloom", "mpt"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_on_the_gpu(tmp_path, name):
    transformers = pytest.importorskip("transformers")
    if name in NEEDS_5_24 and tuple(int(v) for v in transformers.__version__.split(".")[:2]) < (5, 24):
        pytest.skip(f"{name} needs transformers >= 5.24 (found {transformers.__version__}): carry it "
                    f"(experiments/carried_wheels.sh)")
    import torch
    if name == "mpt" and tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13):
        pytest.skip(f"mpt's ALiBi slice at the cache's length captures with torch >= 2.13 (found {torch.__version__})")
    cls, config, cfg = FAMILIES[name]
    check_random_transformers_model(tmp_path, cls, config, 1.0, **V, **cfg)


@pytest.mark.gpu
def test_ordinary_decoder_over_two_ranks_on_the_gpu(tmp_path):
    # a Llama of 4 layers of 1024 (8 heads of 128 over 4 KV heads) cut into 2 lanes, both ranks on this GPU:
    # against eager, the one-GPU kernel, repeated launches (kogc check --gpus 2)
    import torch
    transformers = pytest.importorskip("transformers")
    from kogc.check import run_check
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)
    transformers.LlamaForCausalLM(config).half().save_pretrained(tmp_path)
    res = run_check(str(tmp_path), None, steps=64, generate=64, prompt=[2, 3, 4, 5], overrides={"max_len": 512},
                    quiet=True, gpus=2, one_gpu=True)
    assert res["passed"], res["failures"]
