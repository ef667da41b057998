"""Delayed tensor parallelism under Triton's interpreter, part 2: eight ranks (one lane each) against
eager and the IR reference, and generation (a second file: the suite spreads files over workers)."""
import kogc
from conftest import tiny
from test_ranks import ONE_SPLIT, check_steps


def test_eight_ranks_equal_eager_and_ir_reference():
    """One lane per rank; with the two cases of test_ranks: G 2, 4, 8; d 1, 2; the first layers'
    immediate sum on and off; shared and per-lane norm scales."""
    check_steps(8, dict(broadcast_delay=1, use_early_comm=True, replicated_rmsn_scale=False, num_hidden_layers=2))


def test_ranked_generation_gives_the_one_gpu_tokens():
    """Temperature sampling, plain and with top-k and top-p, over 2 ranks gives the one-GPU kernel's
    tokens (the noise is keyed by seed, step and token id, whichever rank holds that id; the filters see
    the whole logits every rank gathers; greedy tokens: the step tests)."""
    model = tiny(seed=3, vocab_size=250, num_hidden_layers=2)       # 125 ids per rank
    single, ranked = kogc.compile(model, tile_config=ONE_SPLIT), kogc.compile(model, gpus=2, tile_config=ONE_SPLIT)
    prompt = [5]
    for n, kw in ((1, dict(temperature=1.5, seed=1234)), (1, dict(temperature=1.0, seed=7, top_k=5, top_p=0.8))):
        single.reset()
        ranked.reset()
        assert ranked.generate(prompt, n, **kw) == single.generate(prompt, n, **kw)


def test_every_rank_reads_the_models_caches():
    # the multi-GPU bench fills the model's caches found from the first rank's IR, then copies them into every
    # rank: each rank's IR reads the same buffers, its own lanes of them
    import torch
    from kogc.bench.ranks import _kernels
    from kogc.runtime.kernel import fill_kv_from, kv_cache_buffers
    model = tiny(seed=4, num_hidden_layers=2)
    ranked = kogc.compile(model, gpus=2, tile_config=ONE_SPLIT)
    caches = kv_cache_buffers(_kernels(ranked)[0].ir, model)
    assert sorted(caches) == sorted(n for n, _ in model.named_buffers() if n.endswith(("k_cache", "v_cache")))
    for buf in caches.values():
        buf.narrow(-2, 0, 3).copy_(torch.randn(buf.narrow(-2, 0, 3).shape))
    for k in _kernels(ranked):
        assert kv_cache_buffers(k.ir, model).keys() == caches.keys()
        fill_kv_from(k, model)
        assert k.buffers.KV.abs().sum() > 0
