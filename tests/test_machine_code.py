"""What the monokernel compiles to for sm_90 (ahead of time, no GPU needed): loads as wide as the
data allows, no registers lost to a masked row, the publish and acquire there. (The CLI's build for
both targets: tests/test_aot.py.)"""
import pytest
import torch
from conftest import tiny

SHAPES = {   # name -> (model overrides, tile config, the kinds of code variant compiled): each compiled once
    # for the tests below, with only those variants (the whole kernel is ~25 s on 2 cores); the builds
    # compared hold the same kinds, so that their load counts compare
    "base": (dict(hidden_size=512, intermediate_size=4096), {}, ("embed", "residual", "final_norm", "silu_mul")),
    "masked": (dict(hidden_size=512, intermediate_size=3584), {}, ("embed", "residual", "final_norm", "silu_mul")),
    "parts": (dict(hidden_size=512, intermediate_size=4608), {}, ("embed", "residual", "final_norm", "silu_mul")),
    "attn64": (dict(hidden_size=512, intermediate_size=4096), {}, ("attention",)),
    "attn16": (dict(hidden_size=512, intermediate_size=4096), dict(attn_block=16), ("attention",)),
}
# 16-bit global loads of the kernel: the few scalar sites (token ids, counters, flags) whatever the
# sizes (10 at hidden 512 and at 1024, measured); a vector body losing its alignment hint adds its share
# of the hidden size in 16-bit loads per thread
SCALAR_16BIT_LOADS = 10


def _variants_of(schedule, kinds):
    """The code variants of these kinds (a matvec's kind: its prologue, e.g. W2's silu_mul)."""
    return tuple(i for i, v in enumerate(schedule.variants)
                 if v[0] in kinds or (v[0] == "matvec" and v[3] in kinds))


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    from kogc.codegen.aot import compile_kernel, disassembly_summary
    from kogc.codegen.render import KERNEL_NAME, render, signature
    from kogc.frontend import to_ir
    from kogc.scheduler import TileConfig, build_schedule
    from kogc.targets import H200
    out, tmp = {}, tmp_path_factory.mktemp("sm90")
    for name, (model, cfg, kinds) in SHAPES.items():
        m = tiny(num_lanes=2, num_attention_heads=4, num_key_value_heads=2, dtype=torch.float16, **model)
        s = build_schedule(to_ir(m), H200, tile_config=TileConfig(**cfg))
        (tmp / f"{name}.py").write_text(render(s, only_variant=_variants_of(s, kinds)))
        sig, consts = signature(s)
        arts = compile_kernel(str(tmp / f"{name}.py"), KERNEL_NAME, sig, consts, "h200", str(tmp / name),
                              num_warps=H200.num_warps)
        out[name] = (s, disassembly_summary(arts))
    return out


@pytest.mark.parametrize("name, parts", [
    # 3584 / 2 lanes = 1792 (as Llama-3-8B's 14336 over 8 lanes): W2's input in one part of 2048 masked lanes
    ("masked", ((1792, 2048), (0, 0))),
    # 4608 / 2 = 2304 (as Gemma-2-2B's width): 2048 + 256, no lane masked
    ("parts", ((2048, 2048), (256, 256)))])
def test_column_parts_load_as_wide_and_cost_no_registers(summaries, name, parts):
    from kogc.scheduler.tasks import column_parts
    s, built = summaries[name]
    _, base = summaries["base"]
    w2 = [v for v in s.variants if v[0] == "matvec" and v[3] == "silu_mul"]
    assert w2 and all(column_parts(v[2]) == parts for v in w2)
    # no load narrowed to the scalar sites' 16 bits (a 256-wide part's input is 2 elements a thread: 32 bits)
    assert built["ld_global_bits"].get(16, 0) == base["ld_global_bits"].get(16, 0)
    assert base["ld_global_bits"][128] > 0 and built["ld_global_bits"][128] > 0
    assert built["spill_store_bytes"] <= base["spill_store_bytes"]


def test_attention_loads_are_wide(summaries):
    # K/V rows load 16 bytes at a time: with 16-bit loads (a lost alignment hint) the count of scalar
    # loads would grow with the attention block
    b64, b16 = summaries["attn64"][1]["ld_global_bits"], summaries["attn16"][1]["ld_global_bits"]
    assert b64.get(16, 0) == b16.get(16, 0)
    assert b64[128] > b16[128]


def test_vector_bodies_load_wide(summaries):
    # embed, residual, final norm: whole vectors (VALIGN hints); without them each thread loaded its
    # share 16 bits at a time
    bits = summaries["base"][1]["ld_global_bits"]
    assert bits.get(16, 0) <= SCALAR_16BIT_LOADS and bits[128] > 0


def test_publish_and_acquire_in_the_ptx(summaries):
    _, s = summaries["base"]
    assert s["has_acquire_load"] and s["has_release_atomic"] and s["bar_sync"] > 0


def test_attention_asks_l2_for_its_cache_rows_before_the_wait(summaries):
    # every build asks L2 for the next step's first tiles at a step's end; attention also for its split's
    # first block of earlier cache rows (K and V), before its wait
    base, attn = summaries["base"][1]["prefetch_l2"], summaries["attn64"][1]["prefetch_l2"]
    assert base >= 1 and attn > base
