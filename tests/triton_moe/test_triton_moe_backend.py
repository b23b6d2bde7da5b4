"""triton_moe's support questions and launch-config rule on recorded capability profiles: pure
functions of (spec, caps), so they run anywhere, GPU or not."""

from __future__ import annotations

import math

import attrs
import pytest
from hal.backends.triton_moe import backend, configs

import hal
from hal import presets
from hal.backend import Target
from hal.caps import GpuCaps
from hal.registry import decide, discover

pytestmark = pytest.mark.profiles

GPU_PROFILES = ("h100", "h200", "b200", "rtx5090", "mi300x", "rx7900xtx")
FORMATS = ("bf16", "fp8_block128", "mxfp4", "int4_g128")


def target(profile: str) -> Target:
    return Target("cuda:0", hal.probe(profile=profile))


def spec(fmt="bf16", **kw):
    fields = dict(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768, weight_format=fmt)
    fields.update(kw)
    return hal.MoESpec(**fields)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nvidia_serves_every_format(fmt):
    verdict = backend.check(spec(fmt), target("h200"))
    assert verdict.ok, verdict.reasons


def test_selection_on_h200():
    """bf16, fp8, mxfp4 and int4 without an expert map go to triton_moe; int4 on an EP rank stays on
    marlin, ranked above it, as on GPUs without wgmma."""
    found = discover()
    for fmt in FORMATS:
        assert decide(spec(fmt), target("h200"), found).winner == "triton_moe"
    for int4, profile in ((spec("int4_g128", num_local_experts=16), "h200"), (spec("int4_g128"), "b200"),
                          (spec("int4_g128"), "rtx5090")):
        decision = decide(int4, target(profile), found)
        assert decision.winner == "marlin", (profile, int4)
        assert any(c.name == "triton_moe" and c.verdict.ok for c in decision.candidates)


def test_amd_gets_int4_and_fp8_on_cdna3_only():
    assert backend.check(spec("int4_g128"), target("mi300x")).ok
    assert backend.check(spec("fp8_block128"), target("mi300x")).ok
    rdna3 = backend.check(spec("fp8_block128"), target("rx7900xtx"))
    assert not rdna3.ok and any("fp8" in r for r in rdna3.reasons)
    assert backend.check(spec("mxfp4"), target("rx7900xtx")).ok


def test_cpu_only_under_the_interpreter(monkeypatch):
    cpu = Target("cpu", hal.Caps())
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    verdict = backend.check(spec(), cpu)
    assert not verdict.ok and "TRITON_INTERPRET" in verdict.reasons[0]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    verdict = backend.check(spec(), cpu)
    assert verdict.ok and verdict.explicit_only  # run when named, never chosen on CPU by default


def test_every_reason_is_collected(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    masked = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128,
                         weight_format="w4afp8", layout="masked")
    verdict = backend.check(masked, Target("cpu", hal.Caps()))
    assert len(verdict.reasons) == 3, verdict.reasons  # layout, format, no GPU


def _stage_bytes(config, gemm, tiles, fmt):
    bits = {"bf16": 16, "fp8_block128": 8, "mxfp4": 4, "int4_g128": 4}[fmt]
    a_bits = 8 * config.act_terms if config.fp8_act else 16
    return config.block_m * gemm.block_k * a_bits / 8 + tiles * gemm.block_n * gemm.block_k * bits / 8


@pytest.mark.parametrize("profile", GPU_PROFILES)
@pytest.mark.parametrize("model", sorted(presets.PRESETS))
def test_config_rule_is_valid_everywhere(profile, model):
    gpu = hal.probe(profile=profile).gpus[0]
    preset = presets.get(model)
    for fmt in preset.formats:
        if fmt == "w4afp8":
            continue
        s = preset.spec(fmt)
        for tokens in (0, 1, 8, 64, 512, 4096, 65536):
            c = configs.choose(s, gpu, tokens)
            assert c.block_m in (16, 32, 64, 128)
            if c.fp8_act:  # by the rule: w8a8x2, fp8 weights on GPUs with wgmma up to 64-row blocks
                assert fmt == "fp8_block128" and gpu.features.wgmma and c.act_terms == 2
                assert c.block_m <= configs.W8A8X2_MAX_BLOCK_M
            for gemm, tiles in ((c.gemm1, 2 if s.gated else 1), (c.gemm2, 1)):
                # bf16 GEMM 2 at 128-row blocks on wgmma GPUs: 256 wide (configs.WIDE_PREFILL_GEMM2_BLOCK_N)
                wide = (gemm is c.gemm2 and fmt == "bf16" and c.block_m == 128 and gpu.features.wgmma
                        and gemm.block_n == configs.WIDE_PREFILL_GEMM2_BLOCK_N)
                assert (gemm.block_n in (32, 64, 128) or wide) and gemm.num_warps in (4, 8)
                assert gemm.block_k >= (64 if fmt == "mxfp4" else 32)
                if fmt in ("fp8_block128", "int4_g128"):
                    assert 128 % gemm.block_k == 0  # one block / group scale per K step
                if fmt == "mxfp4":
                    assert gemm.block_k % 64 == 0  # whole e8m0 groups in each half tile
                assert gemm.num_stages == 2 if gpu.vendor == "amd" else 2 <= gemm.num_stages <= 4
                assert _stage_bytes(c, gemm, tiles, fmt) * gemm.num_stages <= gpu.smem_per_block_optin
            assert len(c.reasons) >= 2


@pytest.mark.parametrize("profile", ("h100", "h200", "b200", "rtx5090"))
@pytest.mark.parametrize("model", sorted(presets.PRESETS))
def test_w8a8_rule_is_valid_everywhere(profile, model):
    """fp8_act=True: one scale per K step (BLOCK_K 128), tiles that fit shared memory, h from GEMM
    1's epilogue exactly where its N tiles are whole 128-column groups, swap-AB at decode with N
    tiles of at least 64 (wgmma's M); the w8a16 GEMV where the rule takes it."""
    gpu = hal.probe(profile=profile).gpus[0]
    preset = presets.get(model)
    if "fp8_block128" not in preset.formats:
        return
    s = preset.spec("fp8_block128")
    for tokens in (1, 8, 64, 512, 4096, 65536):
        c = configs.choose(s, gpu, tokens, fp8_act=True)
        if c.gemv1 is not None:
            default = configs.choose(s, gpu, tokens)
            assert not c.fp8_act and (c.gemv1, c.gemv2) == (default.gemv1, default.gemv2)
            continue
        assert c.fp8_act and c.block_m <= configs.W8A8_MAX_BLOCK_M
        decode = c.block_m <= 32
        assert c.h_fp8 == (c.gemm1.block_n == 128)
        for gemm, tiles in ((c.gemm1, 2 if s.gated else 1), (c.gemm2, 1)):
            assert gemm.block_k == 128 and gemm.swap_ab == decode
            assert 2 <= gemm.num_stages <= 4
            assert gemm.block_n >= (configs.W8A8_DECODE_MIN_BLOCK_N if decode else 32)
            assert _stage_bytes(c, gemm, tiles, "fp8_block128") * gemm.num_stages <= gpu.smem_per_block_optin


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_fp8_default_is_w8a8x2_up_to_64_row_blocks_on_wgmma_gpus(profile):
    """fp8 weights without fp8_act: two e4m3 terms per activation where blocks of 16 to 64 rows
    group routes by expert (qwen3-30b-a3b from 8 to 512 tokens, deepseek-v3's EP rank likewise;
    64-row blocks with the swap-AB prefill tiles), w8a16 for a block per route (qwen3-30b-a3b at 1
    token), on the GEMV (deepseek-v3's EP rank at 1 token), at 128-row blocks (4096 tokens) and on
    GPUs without wgmma; fp8_act=False keeps w8a16."""
    gpu = hal.probe(profile=profile).gpus[0]
    qwen = presets.get("qwen3-30b-a3b").spec("fp8_block128")
    ep_rank = presets.get("deepseek-v3").spec("fp8_block128", num_local_experts=32)
    x2 = {(s.num_local_experts or s.num_experts, t): configs.choose(s, gpu, t).act_terms == 2
          for s in (qwen, ep_rank) for t in (1, 8, 64, 512, 4096)}
    expected = gpu.features.wgmma
    assert x2 == {(128, 1): False, (128, 8): expected, (128, 64): expected, (128, 512): expected,
                  (128, 4096): False, (32, 1): False, (32, 8): expected, (32, 64): expected,
                  (32, 512): expected, (32, 4096): False}
    if expected:
        prefill = configs.choose(qwen, gpu, 512)
        assert prefill.block_m == 64 and prefill.h_fp8
        assert attrs.asdict(prefill.gemm1) == dict(configs.W8A8X2_PREFILL_GEMM1, group_m=1, split_k=1)
        assert attrs.asdict(prefill.gemm2) == dict(configs.W8A8X2_PREFILL_GEMM2, group_m=1, split_k=1)
    if gpu.vendor == "nvidia":
        assert configs.choose(ep_rank, gpu, 1).gemv1 is not None
    forced = configs.choose(qwen, gpu, 64, fp8_act=False)
    assert not forced.fp8_act and forced.act_terms == 1


def test_w8a8_asked_for_keeps_the_gemv_for_few_routes():
    """deepseek-v3's EP rank at 1 token: the w8a16 GEMV (measured faster than w8a8 there); from 8
    tokens w8a8 with the input quantized in the grouping launch (4 launches)."""
    from hal.backends.triton_moe.kernel import TritonMoEKernel

    ep_rank = presets.get("deepseek-v3").spec("fp8_block128", num_local_experts=32)
    kernel = TritonMoEKernel(ep_rank, target("h200"), fp8_act=True)
    one = kernel.plan(1)
    assert one.config.gemv1 is not None and not one.config.fp8_act and one.launches == 2
    eight = kernel.plan(8)
    assert eight.config.fp8_act and eight.launches == 4 and "quantize x" in eight.describe()


@pytest.mark.parametrize("profile", ("h100", "h200", "b200", "rtx5090", "mi300x"))
def test_bf16_prefill_tiles_on_wgmma_gpus(profile):
    """bf16 at 128-row blocks: GEMM 2 on 256-wide tiles and 4 stages, GEMM 1 on 4 stages where few
    blocks share an expert, where wgmma runs them (sm_90); the 128-wide tiles elsewhere; 64-row
    blocks and other formats keep them everywhere."""
    gpu = hal.probe(profile=profile).gpus[0]
    mixtral = presets.get("mixtral-8x7b")
    prefill = configs.choose(mixtral.spec("bf16"), gpu, 4096)
    if gpu.features.wgmma:
        assert prefill.block_m == 128
        assert (prefill.gemm2.block_n, prefill.gemm2.num_stages) == (configs.WIDE_PREFILL_GEMM2_BLOCK_N, 4)
        # GEMM 1's fourth stage where a busy expert's rows span few blocks (2 of 128 rows at 512
        # tokens), not where L2 serves most of its weight tiles (9 at 4096).
        assert configs.choose(mixtral.spec("bf16"), gpu, 512).gemm1.num_stages == 4
        assert prefill.gemm1.num_stages == 3
        assert any("256-wide" in reason for reason in prefill.reasons)
    else:
        assert prefill.gemm2.block_n <= 128
    assert configs.choose(mixtral.spec("bf16"), gpu, 64).gemm2.block_n <= 128
    assert configs.choose(presets.get("qwen3-30b-a3b").spec("fp8_block128"), gpu, 4096).gemm2.block_n <= 128


def test_prefill_groups_only_where_the_blocks_in_flight_miss_an_expert():
    """mixtral-8x7b's GEMM 1 at 4096 tokens has 112 N tiles of 128 for a busy expert's 9 blocks of
    128 rows: about one block in flight, so groups; gpt-oss-120b's GEMMs (23 and 12 N tiles, 2
    blocks) hold a busy expert's blocks in flight without them. grouped_n decides where given."""
    h100 = hal.probe(profile="h100").gpus[0]
    mixtral_spec = presets.get("mixtral-8x7b").spec("bf16")
    mixtral = configs.choose(mixtral_spec, h100, 4096)
    assert mixtral.gemm1.group_m > 1
    assert any("groups of" in reason for reason in mixtral.reasons)
    gpt_oss = presets.get("gpt-oss-120b").spec("bf16")
    rule = configs.choose(gpt_oss, h100, 4096)
    assert rule.gemm1.group_m == rule.gemm2.group_m == 1
    assert any("walks its N tiles in turn" in reason for reason in rule.reasons)
    asked = configs.choose(gpt_oss, h100, 4096, grouped_n=True)
    assert asked.gemm1.group_m > 1 and asked.gemm2.group_m > 1
    assert configs.choose(mixtral_spec, h100, 4096, grouped_n=False).gemm1.group_m == 1
    assert configs.needs_grouping(14336, 128, 9, 132) and not configs.needs_grouping(2880, 256, 2, 132)


def test_per_route_blocks_walk_the_n_tiles_together():
    """gpt-oss-120b at 8 tokens: 32 routes over 128 experts, a block per route; the routes walk the
    N tiles in one group, so those sharing an expert read its tiles while in L2. grouped_n=False
    keeps each route's N tiles in turn; blocks grouped by expert (qwen3-30b-a3b, 64 routes) are not
    grouped at decode."""
    h100 = hal.probe(profile="h100").gpus[0]
    gpt_oss = presets.get("gpt-oss-120b").spec("bf16")
    rule = configs.choose(gpt_oss, h100, 8, gemv=False)
    assert rule.per_route
    assert rule.gemm1.group_m == rule.gemm2.group_m == configs.PER_ROUTE_GROUP_M
    assert any("share an expert" in reason for reason in rule.reasons)
    plain = configs.choose(gpt_oss, h100, 8, gemv=False, grouped_n=False)
    assert plain.per_route and plain.gemm1.group_m == plain.gemm2.group_m == 1
    grouped = configs.choose(presets.get("qwen3-30b-a3b").spec("bf16"), h100, 8, gemv=False)
    assert not grouped.per_route and grouped.gemm1.group_m == grouped.gemm2.group_m == 1


def test_decode_tiles_shrink_to_fill_the_sms():
    gpu = hal.probe(profile="h200").gpus[0]
    c = configs.choose(spec(), gpu, 1)
    programs = 8 * math.ceil(768 / c.gemm1.block_n)
    assert c.block_m == 16 and (programs >= 2 * gpu.sm_count or c.gemm1.block_n == 32)


def test_decode_path_rule():
    """Few routes: the GEMV where a per-route GEMM 1 would leave the H200 short of programs (fp8 EP
    rank, mxfp4 at 1 token on its checkpoint layout), per-route blocks without EP (repacked mxfp4
    at every size), grouped routes under EP."""
    gpu = hal.probe(profile="h200").gpus[0]
    deepseek = presets.get("deepseek-v3").spec("fp8_block128", num_local_experts=32)
    assert configs.choose(deepseek, gpu, 1).gemv1 is not None
    at_8 = configs.choose(deepseek, gpu, 8)
    assert at_8.gemv1 is None and not at_8.per_route
    gpt_oss = presets.get("gpt-oss-120b").spec("mxfp4")
    assert configs.choose(gpt_oss, gpu, 1, mxfp4_path="dot_scaled").gemv1 is not None
    assert configs.choose(gpt_oss, gpu, 1).gemv1 is None and configs.choose(gpt_oss, gpu, 1).per_route
    assert configs.choose(gpt_oss, gpu, 8).per_route
    for fmt in ("bf16", "fp8_block128"):
        c = configs.choose(spec(fmt), gpu, 1)
        assert c.gemv1 is None and c.per_route
        assert c.act_terms == 1 and not c.gemm1.swap_ab and not c.gemm2.swap_ab  # on request only


def test_w8a16_prefill_swaps_gemm1_where_wgmma_keeps_it_in_flight():
    """128-row w8a16 blocks on sm_90: GEMM 1 swap-AB with one 128-wide scale block per K step,
    GEMM 2 in the usual order; 64-row blocks, Blackwell and AMD keep the usual order, and an
    explicit swap_ab still decides both GEMMs."""
    fp8 = spec("fp8_block128")
    h200 = hal.probe(profile="h200").gpus[0]
    c = configs.choose(fp8, h200, 4096)
    assert c.block_m == 128 and c.gemm1.swap_ab and not c.gemm2.swap_ab
    assert c.gemm1.block_k == 128 and c.gemm1.group_m <= configs.W8A16_SWAP_GROUP_M
    assert any("GEMM1 swap-AB" in r for r in c.reasons)
    assert not configs.choose(fp8, h200, 512, fp8_act=False).gemm1.swap_ab  # 64-row blocks
    assert not configs.choose(fp8, h200, 4096, swap_ab=False).gemm1.swap_ab
    assert configs.choose(fp8, h200, 4096, swap_ab=True).gemm2.swap_ab
    assert not configs.choose(fp8, h200, 4096, fp8_act=True).gemm1.swap_ab  # w8a8 prefill
    assert not configs.choose(spec("bf16"), h200, 4096).gemm1.swap_ab
    for profile in ("b200", "mi300x"):
        assert not configs.choose(fp8, hal.probe(profile=profile).gpus[0], 4096).gemm1.swap_ab


def test_fp8_act_on_request_needs_fp8_tensor_cores():
    a100 = GpuCaps(vendor="nvidia", arch="sm_80", sm_count=108, smem_per_block_optin=166912)
    assert not configs.choose(spec("fp8_block128"), a100, 4096, fp8_act=True).fp8_act
    h200 = hal.probe(profile="h200").gpus[0]
    assert configs.choose(spec("fp8_block128"), h200, 4096, fp8_act=True).fp8_act


def test_plan_describes_the_call():
    from hal.backends.triton_moe.kernel import TritonMoEKernel

    kernel = TritonMoEKernel(spec("fp8_block128"), target("h200"))
    text = kernel.plan(4096).describe()
    assert "BLOCK_M 128" in text and "5 launches" in text and "w8a16" in text
    per_route = kernel.plan(1).describe()
    assert "3 launches" in per_route and "block per route" in per_route
    gemv = TritonMoEKernel(spec("fp8_block128"), target("h200"), gemv=True).plan(1).describe()
    assert "2 launches" in gemv and "GEMV" in gemv
    assert "3 launches" in TritonMoEKernel(spec(), target("h200")).plan(1).describe()  # bf16
    assert "4 launches" in TritonMoEKernel(spec(), target("h200")).plan(64).describe()
