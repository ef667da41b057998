"""GPU tests (skipped without one) beside tests/test_check.py's: what only a GPU run shows."""
import pytest


@pytest.mark.gpu
def test_filtered_launches_run_the_filter_on_the_gpu():
    # greedy and plain-temperature launches run a kernel without the top-k / top-p code, filtered
    # launches the kernel with it: top-k=1 at a high temperature must give the greedy tokens
    import torch
    from conftest import tiny

    import kogc
    model = tiny(seed=5, num_lanes=2, dtype=torch.float16)
    ck = kogc.compile(model)
    greedy = ck.generate([3, 4], 8)
    assert ck.generate([3, 4], 8, temperature=50.0, seed=1, top_k=1) == greedy
    for kw in (dict(temperature=1.0, seed=1), dict(temperature=2.0, seed=2, top_p=0.5),
               dict(temperature=2.0, seed=3, top_k=3)):
        assert ck.generate([3, 4], 8, **kw) == ck.generate([3, 4], 8, **kw), kw     # same seed, same tokens


@pytest.mark.gpu
def test_a_warmed_up_kernel_compiles_nothing_at_its_launches():
    # kogc run and the ranks compile a variant before its first launch (whose time, and a peer rank's waits, would
    # otherwise span the compile): greedy and filtered launches after warm_up find both variants compiled
    import torch
    from conftest import tiny

    import kogc
    ck = kogc.compile(tiny(seed=6, num_lanes=2, dtype=torch.float16))
    ck.warm_up()
    ck.warm_up(filtered=True)
    compiled = ck.kernel.device_caches[torch.cuda.current_device()][0]
    n = len(compiled)
    ck.generate([3, 4], 4)
    ck.generate([3, 4], 4, temperature=1.0, top_k=3, top_p=0.9, seed=1, on_token=lambda t: None)
    assert n >= 2 and len(compiled) == n


@pytest.mark.gpu
def test_a_model_already_on_the_gpu_compiles():
    # kogc.compile of a transformers model moved to the GPU first (its RoPE tables probed on the CPU): the kernel's
    # logits after a prompt are transformers' own
    import torch
    transformers = pytest.importorskip("transformers")

    import kogc
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(config).half().cuda().eval()
    ck = kogc.compile(model, max_len=64)
    from conftest import rel_err
    for pos, tok in enumerate([3, 4, 5]):
        logits, _ = ck.step(tok, pos)
    with torch.no_grad():
        want = model(torch.tensor([[3, 4, 5]], device="cuda")).logits[0, -1]
    assert rel_err(logits.float(), want.float()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny", "smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b"])
def test_single_file_llama_on_the_gpu(preset):
    # an ordinary decoder (torch.export frontend; SmolLM2's shapes: width 576, 9 query / 3 KV heads;
    # Qwen2.5-0.5B's: width 896, 14 query / 2 KV heads, Q/K/V with biases; Qwen3-0.6B's: heads of 128 over a
    # width of 1024, q and k normed per head)
    # against its own eager (tiny in fp32, smollm2-135m in fp16), 64 steps and a 64-token generation in
    # one launch (tie-aware)
    import os

    from conftest import EXAMPLES

    from kogc.check import run_check
    res = run_check(os.path.join(EXAMPLES, "llama.py"), preset, steps=64, generate=64, prompt=[1, 2, 3, 4],
                    overrides={"max_len": 512}, quiet=True)
    assert res["passed"], res["failures"]


@pytest.mark.gpu
def test_bf16_model_on_the_gpu():
    # SmolLM2-135M's shapes in bf16 (as most checkpoints are stored): the bf16 kernel (attention's tl.dot of
    # bf16 tiles) against eager in bf16, 64 steps and a 64-token one-launch generation (tie-aware in bf16), and
    # no farther than eager from the fp32 model
    import os

    import torch
    from conftest import EXAMPLES

    from kogc.check import run_check
    res = run_check(os.path.join(EXAMPLES, "llama.py"), "smollm2-135m", steps=64, generate=64, prompt=[1, 2, 3, 4],
                    overrides={"max_len": 512, "dtype": torch.bfloat16}, quiet=True, fp32_ref=True)
    assert res["passed"] and res["dtype"] == "bfloat16", (res["failures"], res["max_rel_err"])


@pytest.mark.gpu
@pytest.mark.parametrize("model_file,preset", [("laneformer.py", "laneformer-0.5b"), ("llama.py", "tiny")])
def test_fp8_weights_on_the_gpu(model_file, preset):
    # the FP8 kernel against eager running the same quantized weights (fp16 0.5b, fp32 tiny Llama with
    # its non-power-of-two-free shapes), 64 steps and a 64-token one-launch generation (tie-aware)
    import os

    from conftest import EXAMPLES

    from kogc.check import run_check
    res = run_check(os.path.join(EXAMPLES, model_file), preset, steps=64, generate=64, prompt=[1, 2, 3, 4],
                    overrides={"max_len": 512} if model_file == "llama.py" else None, quiet=True, weights="fp8")
    assert res["passed"], res["failures"]
    assert res["fp8_vs_model_weights"]["steps"] == 64


def check_random_transformers_model(tmp_path, cls_name, config_name, norm_mean, **config):
    """A transformers model of the config with random fp16 weights and norm scales (normal, mean norm_mean, sd
    0.3; transformers starts them all equal), from its directory as `kogc check --model-dir` reads it: 64 steps
    in a cache of 512 and a 64-token one-launch generation against eager (tie-aware)."""
    import torch
    transformers = pytest.importorskip("transformers")

    from kogc.check import run_check
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**config)).eval().requires_grad_(False)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.normal_(norm_mean, 0.3)
    model.half().save_pretrained(tmp_path)
    res = run_check(str(tmp_path), None, steps=64, generate=64, prompt=[2, 3, 4, 5], overrides={"max_len": 512},
                    quiet=True)
    assert res["passed"], res["failures"]


@pytest.mark.gpu
def test_olmo2_on_the_gpu(tmp_path):
    # OLMo2 (4 layers, a width of 1024, 8 heads of 128): q and k normed over the whole projection, each
    # sublayer's output normed
    check_random_transformers_model(tmp_path, "Olmo2ForCausalLM", "Olmo2Config", 1.0, vocab_size=32000,
                                    hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=8,
                                    num_key_value_heads=8, max_position_embeddings=4096)


@pytest.mark.gpu
def test_gemma2_on_the_gpu(tmp_path):
    # Gemma 2 (4 layers, a width of 512, heads of 128): soft caps, scores at 50 and logits at 30; the local
    # layers' window of 32 positions (the 64 steps pass it)
    check_random_transformers_model(tmp_path, "Gemma2ForCausalLM", "Gemma2Config", 0.0, vocab_size=32000,
                                    hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=128, sliding_window=32, query_pre_attn_scalar=128,
                                    max_position_embeddings=8192)


@pytest.mark.gpu
def test_gemma3_on_the_gpu(tmp_path):
    # Gemma 3 with Gemma-3-1B's widths and vocabulary (hidden 1152, heads of 256, one KV head, 262,144 tokens;
    # 4 layers, the third global: two RoPE tables): GELU-gated MLP, (1 + w) norms, each sublayer's output normed
    # before the residual add, the local layers' sliding window (shortened from 512 to 32 positions: the 64
    # steps pass it)
    check_random_transformers_model(tmp_path, "Gemma3ForCausalLM", "Gemma3TextConfig", 0.0, vocab_size=262144,
                                    hidden_size=1152, intermediate_size=6912, num_hidden_layers=4, num_attention_heads=4,
                                    num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=32,
                                    max_position_embeddings=32768,
                                    layer_types=["sliding_attention"] * 2 + ["full_attention", "sliding_attention"])
