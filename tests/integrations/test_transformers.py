"""moe-hal as transformers' "moe_hal" experts implementation, on tiny random models built in code.

Each model runs once with transformers' eager experts and once with moe_hal; explain() must show
cpu_brgemm on every MoE layer (so the kernel ran, not the fallback), logits must agree within the
contract's 1e-2 and greedy generation must give the same tokens. Expert weights are re-drawn at a
scale where the MoE dominates the residual stream (transformers' 0.02 init would hide a wrong MoE)."""

from __future__ import annotations

import copy
import logging
import math

import pytest

transformers = pytest.importorskip(
    "transformers", minversion="5.0",
    reason="the transformers integration needs transformers 5 (pip install 'moe-hal[transformers]')")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    DeepseekV3Config,
    GptOssConfig,
    MixtralConfig,
    Qwen3MoeConfig,
)
from transformers.integrations.finegrained_fp8 import (  # noqa: E402
    ALL_FP8_EXPERTS_FUNCTIONS,
    FP8Experts,
)
from transformers.integrations.moe import use_experts_implementation  # noqa: E402

import hal.integrations.transformers as hal_tf  # noqa: E402
from backends.reference.dequant import fp8_block  # noqa: E402
from hal.integrations.transformers.layer import eager_forward, layer_state  # noqa: E402
from hal.spec import FP8_BLOCK  # noqa: E402
from hal.testing import ACCURACY, rel_err  # noqa: E402

pytestmark = pytest.mark.cpu

VOCAB = 128
NEW_TOKENS = 16
TIE_MARGIN = 0.05
# MoE routing is discontinuous: a rounding difference in one layer's output can flip a later
# layer's route near a tie, and then logits differ by far more than 1e-2 for reasons that are no
# kernel's fault. Unit embeddings with MoE outputs a fraction of them keep routes stable, and keep
# the rounding of eager's own bf16 intermediates (about 0.5% of the MoE output) well inside 1e-2.
GATE_UP_STD = 2.0
DOWN_STD = 0.15
# Per-layer checks feed hidden states of this scale, so gate/up values reach past GPT-OSS's clamp (7).
LAYER_INPUT_STD = 4.0
# Hidden and expert sizes are multiples of 32, the panel width cpu_brgemm packs.
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
              eos_token_id=None, tie_word_embeddings=False)


def qwen3_moe(**over):
    return Qwen3MoeConfig(**{**COMMON, "head_dim": 16, "intermediate_size": 96, "moe_intermediate_size": 32,
                             "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, **over})


def gpt_oss(**over):
    return GptOssConfig(**{**COMMON, "head_dim": 16, "intermediate_size": 64, "num_local_experts": 8,
                           "num_experts_per_tok": 2, "sliding_window": 8,
                           "layer_types": ["sliding_attention", "full_attention"], **over})


def mixtral(**over):
    return MixtralConfig(**{**COMMON, "intermediate_size": 96, "num_local_experts": 8,
                            "num_experts_per_tok": 2, **over})


def deepseek_v3(**over):
    return DeepseekV3Config(**{**COMMON, "intermediate_size": 96, "moe_intermediate_size": 32,
                               "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
                               "n_group": 2, "topk_group": 1, "first_k_dense_replace": 0,
                               "kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 16,
                               "qk_nope_head_dim": 16, "v_head_dim": 16, "num_key_value_heads": 4, **over})


@pytest.fixture(scope="module", autouse=True)
def registered():
    hal_tf.register()


def _redraw(model, generator):
    """Unit-scale token embeddings; expert weights with gate/up outputs of standard deviation
    GATE_UP_STD on unit inputs and MoE outputs a fraction (set by DOWN_STD) of the residual, so the MoE
    changes every logit while a rounding difference in it cannot flip a later route; router weights
    with clear top-k margins. In place."""
    for _, module in hal_tf.experts_modules(model):
        for name, p in module.named_parameters(recurse=False):
            if p.dtype not in (torch.bfloat16, torch.float32):
                continue
            if p.dim() == 3:
                fan_in = p.shape[1] if module.is_transposed else p.shape[2]
                scale = (DOWN_STD if name.startswith("down_proj") else GATE_UP_STD) / math.sqrt(fan_in)
            else:
                scale = 0.5 * DOWN_STD
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    embed = model.get_input_embeddings().weight
    with torch.no_grad():
        embed.copy_(torch.randn(embed.shape, generator=generator))
    for module in model.modules():
        if type(module).__name__.endswith("Router"):
            w = module.weight
            with torch.no_grad():
                w.copy_(torch.randn(w.shape, generator=generator) * 3.0 / math.sqrt(w.shape[1]))


def build(config, dtype=torch.bfloat16):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, experts_implementation="eager").eval()
    _redraw(model, torch.Generator().manual_seed(1))
    return model


def prompt(batch=2, length=7):
    return torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(2))


def run(model, ids):
    with torch.no_grad():
        logits = model(ids).logits.float()
        tokens = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return logits, tokens


def assert_same_greedy_tokens(tokens, eager_tokens, eager_model):
    """Greedy tokens equal eager's. Both runs are within the contract's 1e-2 of each other, not bit
    equal, so where eager's own top two logits lie within TIE_MARGIN (logit standard deviations)
    either choice is right: a sequence may part there, and only there."""
    for row in range(tokens.shape[0]):
        differ = (tokens[row] != eager_tokens[row]).nonzero()
        if not len(differ):
            continue
        step = int(differ[0])
        with torch.no_grad():
            logits = eager_model(eager_tokens[row: row + 1, :step]).logits[0, -1].float()
        top = logits.topk(2).values
        gap = float(top[0] - top[1]) / float(logits.std())
        assert gap <= TIE_MARGIN, (f"row {row} parts from eager at position {step}, where eager's top-2 "
                                   f"gap is {gap:.3g} standard deviations (a tie is <= {TIE_MARGIN})")


def assert_served_by_hal(model, backend="cpu_brgemm"):
    report = hal_tf.explain(model)
    assert report, "no experts module found"
    for layer in report.values():
        assert layer.implementation == hal_tf.NAME, str(layer)
        assert layer.backend == backend, str(layer)


def assert_layers_match(model, reference, M=9):
    """Each experts module against the eager forward of its counterpart in `reference`, on fresh
    random hidden states and routes."""
    g = torch.Generator().manual_seed(3)
    for (name, module), (_, ref) in zip(hal_tf.experts_modules(model), hal_tf.experts_modules(reference),
                                       strict=True):
        E, k = ref.num_experts, model.config.num_experts_per_tok
        H = module.down_proj.shape[2] if module.is_transposed else module.down_proj.shape[1]
        x = (torch.randn(M, H, generator=g) * LAYER_INPUT_STD).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)])
        weights = torch.softmax(torch.randn(M, k, generator=g), dim=-1)
        with torch.no_grad():
            got = module(x, ids, weights)
            want = eager_forward(ref)(ref, x, ids, weights)
        assert not torch.isnan(got).any(), name
        err = rel_err(got, want)
        assert err <= ACCURACY, f"{name}: rel err {err:.4g}"


# (activation, gate/up order, transposed, bias) the adapter must read off each experts class.
LAYOUTS = {
    "qwen3_moe": (qwen3_moe, ("silu", "concatenated", False, False)),
    "gpt_oss": (gpt_oss, ("swiglu_oai", "interleaved", True, True)),
    "mixtral": (mixtral, ("silu", "concatenated", False, False)),
    "deepseek_v3": (deepseek_v3, ("silu", "concatenated", False, False)),
}


@pytest.mark.parametrize("family", list(LAYOUTS))
def test_bf16_model_matches_eager(family):
    make, layout = LAYOUTS[family]
    model = build(make())
    ids = prompt()
    eager_logits, eager_tokens = run(model, ids)
    reference = copy.deepcopy(model)
    model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(model)
    assert_served_by_hal(model)
    for _, module in hal_tf.experts_modules(model):
        state = layer_state(module)
        spec = state.layout.spec
        found = (spec.activation, state.layout.activation.order, state.layout.transposed, spec.has_bias)
        assert found == layout
    assert_layers_match(model, reference)
    logits, tokens = run(model, ids)
    err = rel_err(logits, eager_logits)
    assert err <= ACCURACY, f"logits rel err {err:.4g}"
    assert_same_greedy_tokens(tokens, eager_tokens, reference)


def test_from_config_selects_moe_hal():
    model = AutoModelForCausalLM.from_config(qwen3_moe(), dtype=torch.bfloat16,
                                             experts_implementation=hal_tf.NAME).eval()
    assert model.config._experts_implementation == hal_tf.NAME
    with torch.no_grad():
        model(prompt(1, 3))
    assert_served_by_hal(model)


def test_from_pretrained_selects_moe_hal(tmp_path):
    """The loading path users take: a checkpoint on disk, experts_implementation at load time."""
    build(qwen3_moe()).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16,
                                                 experts_implementation=hal_tf.NAME).eval()
    assert model.config._experts_implementation == hal_tf.NAME
    with torch.no_grad():
        model(prompt(1, 3))
    assert_served_by_hal(model)


def _quantize_block128(w: torch.Tensor):
    """[E, rows, cols] -> float8_e4m3fn values and one fp32 scale per 128x128 block (w ~ q * s)."""
    E, rows, cols = w.shape
    R, C = math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)
    padded = torch.zeros(E, R * FP8_BLOCK, C * FP8_BLOCK)
    padded[:, :rows, :cols] = w.float()
    blocks = padded.view(E, R, FP8_BLOCK, C, FP8_BLOCK)
    scale = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-12) / 448.0
    q = (blocks / scale[:, :, None, :, None]).view(E, R * FP8_BLOCK, C * FP8_BLOCK)[:, :rows, :cols]
    return q.clamp(-448, 448).to(torch.float8_e4m3fn), scale


def _to_fp8_experts(model):
    """Replace every experts module with FP8Experts the way transformers' replace_with_fp8_linear
    does, holding the block-quantized weights; the bf16 model gets the dequantized ones, so both
    compute the same function."""
    fp8_model = copy.deepcopy(model)
    fp8_class = use_experts_implementation(experts_class=FP8Experts,
                                           experts_interface=ALL_FP8_EXPERTS_FUNCTIONS,
                                           has_bias=False, has_gate=True)
    for (name, module), (_, bf16) in zip(hal_tf.experts_modules(fp8_model), hal_tf.experts_modules(model),
                                         strict=True):
        fp8 = fp8_class(config=module.config, block_size=(FP8_BLOCK, FP8_BLOCK), activation_scheme="dynamic")
        with torch.no_grad():
            for proj in ("gate_up_proj", "down_proj"):
                q, s = _quantize_block128(getattr(bf16, proj))
                getattr(fp8, proj).copy_(q)
                getattr(fp8, f"{proj}_scale_inv").copy_(s)
                getattr(bf16, proj).copy_(fp8_block(q, s, torch.float32).to(torch.bfloat16))
        fp8_model.set_submodule(name, fp8)
    return fp8_model


@pytest.mark.parametrize("make", [deepseek_v3, qwen3_moe], ids=["deepseek_v3", "qwen3_moe"])
def test_fp8_block128_model_matches_dequantized_eager(make):
    """FP8Experts (fp8_block128) through moe_hal against the same model with the dequantized
    weights in bf16 through eager. transformers' own FP8 eager path needs a GPU kernel, so the
    dequantized bf16 model is the reference here. Two scale blocks along the gate/up rows need
    moe_intermediate_size >= 128."""
    model = build(make(hidden_size=128, moe_intermediate_size=128))
    fp8_model = _to_fp8_experts(model)
    ids = prompt()
    eager_logits, eager_tokens = run(model, ids)
    fp8_model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(fp8_model)
    assert_served_by_hal(fp8_model)
    assert all(layer.detail.count("fp8_block128") for layer in hal_tf.explain(fp8_model).values())
    assert_layers_match(fp8_model, model)
    logits, tokens = run(fp8_model, ids)
    err = rel_err(logits, eager_logits)
    assert err <= ACCURACY, f"logits rel err {err:.4g}"
    assert_same_greedy_tokens(tokens, eager_tokens, model)


@pytest.mark.parametrize("case", ["float32", "gelu"])
def test_unsupported_layer_falls_back_to_eager_with_one_log_line(case, caplog):
    """float32 activations (no backend takes them) and an activation moe-hal lacks (gelu): every
    layer runs eager, says why once, and the output equals eager's bit for bit."""
    if case == "float32":
        model, why = build(qwen3_moe(), dtype=torch.float32), "torch.float32"
    else:
        model, why = build(qwen3_moe(hidden_act="gelu")), "matches none of the activations"
    ids = prompt()
    eager_logits, eager_tokens = run(model, ids)
    model.set_experts_implementation(hal_tf.NAME)
    with caplog.at_level(logging.WARNING, logger="hal.integrations.transformers"):
        hal_tf.prepare(model)
        logits, tokens = run(model, ids)
    assert torch.equal(logits, eager_logits)
    assert torch.equal(tokens, eager_tokens)
    lines = [r.getMessage() for r in caplog.records if r.name == "hal.integrations.transformers"]
    layers = [name for name, _ in hal_tf.experts_modules(model)]
    for name in layers:
        mine = [line for line in lines if f" {name} " in line]
        assert len(mine) == 1, mine  # one line per layer over a forward and 16 decode steps
        assert "falls back to its eager forward" in mine[0] and why in mine[0]
    for layer in hal_tf.explain(model).values():
        assert layer.backend == "eager" and why in layer.detail


def test_weights_changed_in_place_are_prepared_again():
    model = build(mixtral())
    model.set_experts_implementation(hal_tf.NAME)
    hal_tf.prepare(model)
    reference = copy.deepcopy(model)
    reference.set_experts_implementation("eager")
    with torch.no_grad():
        for m in (model, reference):
            for _, module in hal_tf.experts_modules(m):
                module.down_proj.mul_(-0.5)
    assert_layers_match(model, reference)


def test_expert_parallel_sentinels_add_nothing():
    """transformers' expert parallelism marks off-rank routes with id == the local expert count; the
    adapter turns them into -1 routes, which must equal eager's skipping of them."""
    model = build(qwen3_moe())
    model.set_experts_implementation(hal_tf.NAME)
    _, module = hal_tf.experts_modules(model)[0]
    module._is_expert_parallel = True
    g = torch.Generator().manual_seed(4)
    M, E, k = 11, module.num_experts, model.config.num_experts_per_tok
    x = (torch.randn(M, module.hidden_dim, generator=g) * LAYER_INPUT_STD).to(torch.bfloat16)
    ids = torch.randint(0, E, (M, k), generator=g)
    ids[::2, 0] = E
    ids[3] = E  # a token with no local route at all
    weights = torch.rand(M, k, generator=g)
    with torch.no_grad():
        got = module(x, ids, weights)
        want = eager_forward(module)(module, x, ids, weights)
    assert layer_state(module).backend == "cpu_brgemm"
    assert rel_err(got, want) <= ACCURACY
    assert torch.count_nonzero(got[3]) == 0


def test_reference_only_layer_runs_eager(monkeypatch, caplog):
    """Where only the reference oracle accepts a layer, the eager forward runs instead and says why."""
    monkeypatch.setenv("HAL_DISABLE_BACKENDS", "cpu_brgemm")
    model = build(mixtral())
    model.set_experts_implementation(hal_tf.NAME)
    with caplog.at_level(logging.WARNING, logger="hal.integrations.transformers"):
        report = hal_tf.prepare(model)
        with torch.no_grad():
            model(prompt(1, 3))
    for layer in report.values():
        assert layer.backend == "eager" and "only the reference backend" in layer.detail
    assert sum("only the reference backend" in r.getMessage() for r in caplog.records) == len(report)
