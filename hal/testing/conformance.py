"""The conformance suite: the call, plan and accuracy contracts of docs/contract.md, run over every backend
registered under the "hal.backends" entry points, every op it declares and every device of this
machine, for each spec of hal.testing.cases that the backend's check() accepts there.

    pytest --pyargs hal.testing.conformance        # a backend's own repository
    from hal.testing.conformance import *          # inside a test module of a repository's suite

A new backend is tested as soon as its entry point is installed. Cases the product is known to
fail are xfail(strict=True) with the exact behaviour (hal.testing.known_failures). Values that
Triton's CPU interpreter cannot produce (bf16 tl.dot, fp32 -> e4m3 just below a power of two) are
skipped with that reason when the backend says it runs in the interpreter."""

from __future__ import annotations

import attrs
import pytest
import torch

from hal.spec import MoEWeights
from hal.testing import harness
from hal.testing.accuracy import rel_err
from hal.testing.cases import Unavailable, cases_for, isolated_spec
from hal.testing.known_failures import known_failure
from hal.testing.poison import assert_masked_rows, is_poison, poison

BF16_DOT = "Triton's interpreter returns garbage from bf16 tl.dot: values are checked on a GPU"
FP8_CARRY = ("Triton's interpreter rounds fp32 -> e4m3 half-up and drops the carry into the "
             "exponent (125.8 -> 64): rounding across a power of two is checked on a GPU")


def conformance(op: str, where=None):
    """Run the test once per case of `op` (whose spec satisfies `where`)."""

    def mark(fn):
        fn.conformance_op, fn.conformance_where = op, where
        return fn

    return mark


def pytest_generate_tests(metafunc):
    fn = metafunc.function
    op = getattr(fn, "conformance_op", None)
    if op is None:
        return
    params = []
    for case in cases_for(op, fn.conformance_where):
        if isinstance(case, Unavailable):
            skip = pytest.mark.skip(reason=f"{case.backend} on {case.device}: {case.reason}")
            params.append(pytest.param(case, id=case.id, marks=skip))
            continue
        reason = known_failure(fn.__name__, case)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(case, id=case.id, marks=marks))
    if not params:
        params = [pytest.param(None, id=op, marks=pytest.mark.skip(
            reason=f"no backend on this machine runs a conformance spec of op {op!r} here"))]
    metafunc.parametrize("case", params)


def skip_values_if_interpreted(case) -> None:
    if case.interpreted and case.op == "moe" and case.spec.act_dtype == "bfloat16":
        pytest.skip(f"{case.backend}: {BF16_DOT}")


def _is_ep(spec) -> bool:
    return spec.is_ep


def _two_or_more_routes(spec) -> bool:
    return spec.top_k >= 2


def _call_into_view(case, b, x, tw, ti, check=True):
    """Run the token call into an out= view inside a poisoned buffer; check out= is returned and
    nothing outside it was written."""
    buffer, out = harness.poisoned_view(x.shape, x.dtype, x.device)
    result = b.kernel(x, tw, ti, b.prepared, out=out, check=check)
    harness.assert_returns_out(result, out)
    harness.assert_margins_intact(buffer, out)
    return out


def _check_tokens(case, x, tw, ti, check=True, what=""):
    b = harness.built(case)
    inputs = [t.clone() for t in (x, tw, ti)]
    out = _call_into_view(case, b, x, tw, ti, check)
    for before, after in zip(inputs, (x, tw, ti), strict=True):
        assert torch.equal(before, after), "the call modified one of its inputs"
    skip_values_if_interpreted(case)
    harness.assert_accurate(out, harness.token_oracle(case.spec, x, tw, ti, b.weights), what)
    return out


def _local_global_ids(weights, spec) -> list:
    if weights.expert_map is None:
        return list(range(spec.num_experts))
    return torch.nonzero(weights.expert_map >= 0).flatten().tolist()


# ---------------------------------------------------------------- token layout ("moe")


@conformance("moe")
def test_moe_output_contract(case):
    """out=None: a new [M, H] tensor in the activation dtype on the kernel's device."""
    b = harness.built(case)
    spec = case.spec
    x, tw, ti = harness.token_inputs(spec, 33, case.device, seed=11)
    out = b.kernel(x, tw, ti, b.prepared)
    assert isinstance(out, torch.Tensor)
    assert tuple(out.shape) == (33, spec.hidden_size)
    assert out.dtype == getattr(torch, spec.act_dtype)
    assert out.device == torch.device(case.device)
    assert out.data_ptr() != x.data_ptr(), "the output aliases x"
    skip_values_if_interpreted(case)
    harness.assert_accurate(out, harness.token_oracle(spec, x, tw, ti, b.weights))


@conformance("moe")
def test_moe_out_honoured(case):
    """out= a view at an odd offset inside a poisoned buffer: the same tensor is returned, every
    element of it written, nothing around it, and the inputs left as they were."""
    x, tw, ti = harness.token_inputs(case.spec, 7, case.device, seed=12)
    _check_tokens(case, x, tw, ti)


@conformance("moe")
def test_moe_no_tokens(case):
    b = harness.built(case)
    x, tw, ti = harness.token_inputs(case.spec, 0, case.device, seed=13)
    out = b.kernel(x, tw, ti, b.prepared)
    assert tuple(out.shape) == (0, case.spec.hidden_size) and out.dtype == x.dtype
    _call_into_view(case, b, x, tw, ti)


@conformance("moe")
def test_moe_one_token(case):
    x, tw, ti = harness.token_inputs(case.spec, 1, case.device, seed=14)
    _check_tokens(case, x, tw, ti)


@conformance("moe")
def test_moe_all_tokens_on_one_expert(case):
    """Every token's first route on one (local) expert, the others uniform."""
    b = harness.built(case)
    hot = _local_global_ids(b.weights, case.spec)[-1]
    x, tw, ti = harness.token_inputs(case.spec, 19, case.device, seed=15, mode="one_expert",
                                     hot_expert=hot)
    _check_tokens(case, x, tw, ti)


@conformance("moe")
def test_moe_empty_experts(case):
    """Half the experts (at least top_k) get every route, the rest none."""
    spec = case.spec
    M, E, k = 11, spec.num_experts, spec.top_k
    live = max(k, E // 2)
    chosen = [i * E // live for i in range(live)]  # spread over the range, distinct
    counts = [0] * E
    for r in range(M * k):
        counts[chosen[r % live]] += 1
    x, tw, ti = harness.token_inputs(spec, M, case.device, seed=16, mode="counts", counts=counts)
    assert int((torch.bincount(ti.flatten().long().cpu(), minlength=E) == 0).sum()) == E - live
    _check_tokens(case, x, tw, ti)


def _with_dropped_routes(case):
    spec = case.spec
    x, tw, ti = harness.token_inputs(spec, 9, case.device, seed=17)
    ti[0, :] = -1  # a token with every route dropped
    ti[3, spec.top_k - 1] = -1
    ti[6, 0] = -1
    return x, tw, ti


def _dropped_routes(case, check):
    x, tw, ti = _with_dropped_routes(case)
    out = _check_tokens(case, x, tw, ti, check=check)
    assert torch.equal(out[0], torch.zeros_like(out[0])), "a token whose routes are all -1 is not zero"


@conformance("moe")
def test_moe_dropped_routes_checked(case):
    """-1 in topk_ids is a dropped route: it adds nothing, and check=True accepts it."""
    _dropped_routes(case, check=True)


@conformance("moe")
def test_moe_dropped_routes_unchecked(case):
    _dropped_routes(case, check=False)


@conformance("moe", where=_is_ep)
def test_moe_non_local_routes(case):
    """Under EP, routes to experts of other ranks add nothing: a token routed only to them gets
    zeros, the others the sum over their local routes."""
    b = harness.built(case)
    spec = case.spec
    remote = torch.nonzero(b.weights.expert_map < 0).flatten()
    x, tw, ti = harness.token_inputs(spec, 8, case.device, seed=18)
    ti[2] = remote[: spec.top_k].to(ti.dtype)  # only remote routes
    spare = [r for r in remote.tolist() if r not in ti[5].tolist()]
    ti[5, 0] = spare[0]  # one remote route beside local ones
    out = _check_tokens(case, x, tw, ti)
    assert torch.equal(out[2], torch.zeros_like(out[2])), "a token with no local route is not zero"


@conformance("moe", where=_two_or_more_routes)
def test_moe_duplicate_ids(case):
    """The same expert twice in a row: docs/contract.md's sum over j counts it twice, with each weight."""
    x, tw, ti = harness.token_inputs(case.spec, 6, case.device, seed=19)
    ti[:, 1] = ti[:, 0]
    _check_tokens(case, x, tw, ti)


@conformance("moe")
def test_moe_checked_out_of_range_ids(case):
    """check=True: an id >= num_experts or < -1 is a ValueError naming topk_ids."""
    b = harness.built(case)
    x, tw, ti = harness.token_inputs(case.spec, 4, case.device, seed=20)
    for bad in (case.spec.num_experts, -2):
        ids = ti.clone()
        ids[2, 0] = bad
        with pytest.raises(ValueError, match="topk_ids"):
            b.kernel(x, tw, ids, b.prepared)


@conformance("moe", where=isolated_spec)
def test_moe_unchecked_out_of_range_ids(case):
    """check=False: an id outside [-1, E) is undefined in value, but the call neither crashes nor
    writes outside out= (run in a child Python, so a crash fails this case only)."""
    from hal.testing.isolated import unchecked_out_of_range_error

    error = unchecked_out_of_range_error(case)
    assert not error, error


@conformance("moe")
def test_moe_plan(case):
    """plan() answers for the call's routes without running it, the same way twice, in words."""
    b = harness.built(case)
    x, tw, ti = harness.token_inputs(case.spec, 23, case.device, seed=21, mode="concentrated")
    before = ti.clone()
    first, again = b.kernel.plan(ti), b.kernel.plan(ti)
    assert torch.equal(ti, before), "plan() modified topk_ids"
    assert_same_plan(first, again)
    assert describe(b.kernel.plan(ti[:0])).strip(), "a plan for no tokens says so in words"


def describe(plan) -> str:
    text = plan.describe() if hasattr(plan, "describe") else str(plan)
    assert isinstance(text, str) and text.strip(), "a plan says what it will do, in words"
    return text


def assert_same_plan(first, again) -> None:
    assert describe(first) == describe(again), "plan() is not deterministic"
    if type(first).__eq__ is not object.__eq__:
        assert first == again, "plan() is not deterministic"


def garble(weights) -> None:
    """Overwrite every tensor of `weights` in place, as an engine reusing its staging buffers does:
    random bytes everywhere but expert_map, which gets another valid map (rolled by one) so a kernel
    still reading it computes other values without indexing out of bounds."""
    g = torch.Generator().manual_seed(99)
    for field in attrs.fields(MoEWeights):
        t = getattr(weights, field.name)
        if t is None:
            continue
        if field.name == "expert_map":
            t.copy_(t.roll(1))
            continue
        raw = t.view(-1).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8).to(raw.device))


def assert_same_bits(before, after) -> None:
    assert torch.equal(before.view(torch.uint8), after.view(torch.uint8)), \
        "the output changed when the caller overwrote the weights it had prepared"


@conformance("moe")
def test_moe_prepared_owns_its_weights(case):
    """After prepare_weights, the caller overwrites every tensor it passed (weights, scales, biases,
    expert_map): the output stays bit for bit what it was."""
    skip_values_if_interpreted(case)
    kernel = harness.built(case).kernel
    weights = harness.weights_for(case.spec, case.device, seed=7)
    prepared = kernel.prepare_weights(weights)
    x, tw, ti = harness.token_inputs(case.spec, 9, case.device, seed=22)
    before = kernel(x, tw, ti, prepared)
    garble(weights)
    assert_same_bits(before, kernel(x, tw, ti, prepared))


@conformance("moe")
def test_moe_under_torch_compile(case):
    """torch.compile(fullgraph=False) of a function that calls the kernel traces it (every compiled
    op has a fake kernel; Triton launch code runs between graphs), runs, and gives the eager output
    bit for bit."""
    skip_values_if_interpreted(case)
    b = harness.built(case)
    x, tw, ti = harness.token_inputs(case.spec, 13, case.device, seed=24)
    eager = b.kernel(x, tw, ti, b.prepared)
    torch._dynamo.reset()  # a fresh trace per case: the cache of recompiles is bounded
    compiled = torch.compile(lambda x, tw, ti: b.kernel(x, tw, ti, b.prepared), backend="aot_eager")
    assert_same_bits(eager, compiled(x, tw, ti))


# Gradients in the activation dtype pass through both GEMMs twice (relu2 squares on the way): a
# looser bound than the forward's, which still tells a gradient from a missing or wrong one.
GRAD_ACCURACY = 5e-2


def _grad_inputs(case):
    x, tw, ti = harness.token_inputs(case.spec, 5, case.device, seed=25)
    return x.requires_grad_(), tw.requires_grad_(), ti


@conformance("moe")
def test_moe_autograd(case):
    """With grad mode on, an input that requires grad either gets its gradient (a kernel that
    records autograd: the reference backend's) or is refused with a ValueError naming it and the
    reference backend; never silently cut off. An out= that requires grad is refused everywhere."""
    b = harness.built(case)
    x, tw, ti = _grad_inputs(case)
    if b.kernel.differentiable:
        out = b.kernel(x, tw, ti, b.prepared)
        x64, tw64 = x.detach().double().requires_grad_(), tw.detach().double().requires_grad_()
        ref = harness.token_oracle(case.spec, x64, tw64, ti, b.weights)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(26)).to(out.device)
        out.backward(grad.to(out.dtype))
        ref.backward(grad.double())
        for name, got, want in (("x", x.grad, x64.grad), ("topk_weights", tw.grad, tw64.grad)):
            err = rel_err(got, want)
            assert err <= GRAD_ACCURACY, f"{name}.grad: ||grad - ref|| / ||ref|| = {err:.3e}"
    else:
        for name, args in (("x", (x, tw.detach())), ("topk_weights", (x.detach(), tw))):
            with pytest.raises(ValueError, match=rf"{name} requires grad.*inference-only.*'reference'"):
                b.kernel(*args, ti, b.prepared)
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device, requires_grad=True)
    with pytest.raises(ValueError, match="out requires grad"):
        b.kernel(x.detach(), tw.detach(), ti, b.prepared, out=out)


# ---------------------------------------------------------------- masked layout ("moe_masked")

MASKED_MAX_M = 16


def _masked_inputs(case, seed, counts=None):
    from hal import synth

    E = case.spec.local_experts
    counts = counts if counts is not None else [(0, MASKED_MAX_M, 5, 11, 3)[e % 5] for e in range(E)]
    return synth.random_masked_inputs(E, case.spec.hidden_size, MASKED_MAX_M, counts, seed=seed,
                                      device=case.device, fp8_dtype=harness.fp8_dtype(case))


def _check_masked_values(case, out, x, x_scale, masked_m):
    b = harness.built(case)
    for e, m in enumerate(masked_m.tolist()):
        assert bool(is_poison(out[e, m:]).all()), f"expert {e}: a row >= masked_m[e] = {m} was written"
        assert not bool(is_poison(out[e, :m]).any()), f"expert {e}: a live row was left unwritten"
    if case.interpreted:  # the activations' FP8 requant runs in the interpreter
        pytest.skip(f"{case.backend}: values: {FP8_CARRY}")
    ref = harness.masked_oracle(case.spec, x, x_scale, masked_m, b.weights)
    live = torch.cat([out[e, :m] for e, m in enumerate(masked_m.tolist())])
    want = torch.cat([ref[e, :m] for e, m in enumerate(masked_m.tolist())])
    if live.numel():
        harness.assert_accurate(live, want, "live rows: ")


@conformance("moe_masked")
def test_masked_contract(case):
    """out= a view inside a poisoned buffer: returned as given, rows at or beyond masked_m[e] never
    written, live rows within ACCURACY of the float64 oracle, nothing written around it."""
    b = harness.built(case)
    x, x_scale, masked_m = _masked_inputs(case, seed=31)
    buffer, out = harness.poisoned_view(x.shape, torch.bfloat16, x.device)
    result = b.kernel(x, x_scale, masked_m, b.prepared, expected_rows=3, out=out)
    harness.assert_returns_out(result, out)
    harness.assert_margins_intact(buffer, out)
    _check_masked_values(case, out, x, x_scale, masked_m)


@conformance("moe_masked")
def test_masked_default_out(case):
    b = harness.built(case)
    x, x_scale, masked_m = _masked_inputs(case, seed=32)
    out = b.kernel(x, x_scale, masked_m, b.prepared)
    assert tuple(out.shape) == tuple(x.shape) and out.dtype == torch.bfloat16
    assert out.device == torch.device(case.device)
    if case.interpreted:
        pytest.skip(f"{case.backend}: values: {FP8_CARRY}")
    live = torch.cat([out[e, :m] for e, m in enumerate(masked_m.tolist())])
    ref = harness.masked_oracle(case.spec, x, x_scale, masked_m, b.weights)
    want = torch.cat([ref[e, :m] for e, m in enumerate(masked_m.tolist())])
    harness.assert_accurate(live, want)


@conformance("moe_masked")
def test_masked_no_live_rows(case):
    """masked_m all zero: nothing is read or written."""
    b = harness.built(case)
    x, x_scale, masked_m = _masked_inputs(case, seed=33, counts=[0] * case.spec.local_experts)
    out = poison(torch.empty(x.shape, dtype=torch.bfloat16, device=x.device))
    b.kernel(x, x_scale, masked_m, b.prepared, out=out)
    assert bool(is_poison(out).all()), "a row of an expert with masked_m == 0 was written"


@conformance("moe_masked")
def test_masked_plan(case):
    b = harness.built(case)
    _, _, masked_m = _masked_inputs(case, seed=34)
    first = b.kernel.plan(masked_m, expected_rows=3, max_m=MASKED_MAX_M)
    again = b.kernel.plan(masked_m, expected_rows=3, max_m=MASKED_MAX_M)
    assert_same_plan(first, again)


@conformance("moe_masked")
def test_masked_prepared_owns_its_weights(case):
    """As test_moe_prepared_owns_its_weights, for the masked layout (input scales included)."""
    kernel = harness.built(case).kernel
    weights = harness.weights_for(case.spec, case.device, seed=7)
    prepared = kernel.prepare_weights(weights)
    x, x_scale, masked_m = _masked_inputs(case, seed=35)
    before = kernel(x, x_scale, masked_m, prepared, out=poison(torch.empty(x.shape, dtype=torch.bfloat16,
                                                                           device=x.device)))
    garble(weights)
    after = kernel(x, x_scale, masked_m, prepared, out=poison(torch.empty_like(before)))
    assert_same_bits(before, after)


@conformance("moe_masked")
def test_masked_under_torch_compile(case):
    """As test_moe_under_torch_compile, for the masked layout."""
    b = harness.built(case)
    x, x_scale, masked_m = _masked_inputs(case, seed=37)

    def call(x, x_scale, masked_m):
        out = torch.zeros(x.shape, dtype=torch.bfloat16, device=x.device)
        return b.kernel(x, x_scale, masked_m, b.prepared, out=out)

    eager = call(x, x_scale, masked_m)
    torch._dynamo.reset()
    assert_same_bits(eager, torch.compile(call, backend="aot_eager")(x, x_scale, masked_m))


@conformance("moe_masked")
def test_masked_autograd(case):
    """Every masked kernel is inference-only: with grad mode on, an x_scale or out= that requires
    grad is a ValueError naming it; under torch.no_grad() the same x_scale is accepted."""
    b = harness.built(case)
    x, x_scale, masked_m = _masked_inputs(case, seed=36)
    with pytest.raises(ValueError, match=r"x_scale requires grad.*inference-only"):
        b.kernel(x, x_scale.clone().requires_grad_(), masked_m, b.prepared)
    out = torch.zeros(x.shape, dtype=torch.bfloat16, device=x.device, requires_grad=True)
    with pytest.raises(ValueError, match="out requires grad"):
        b.kernel(x, x_scale, masked_m, b.prepared, out=out)
    with torch.no_grad():
        b.kernel(x, x_scale.clone().requires_grad_(), masked_m, b.prepared)


# ---------------------------------------------------------------- requant

REQUANT_MAX_M = 5
OUTPUT_SCALE = 9.0 / 448  # synth's activations reach |x * s| ~ 9, so some values saturate


def _requant_inputs(case, seed, counts=None):
    from hal import synth

    b = harness.built(case)
    E = case.spec.num_experts
    counts = counts if counts is not None else [(3, 0, REQUANT_MAX_M, 1, 2)[e % 5] for e in range(E)]
    x, x_scale, masked_m = synth.random_masked_inputs(E, case.spec.hidden_size, REQUANT_MAX_M, counts,
                                                      seed=seed, device=case.device,
                                                      fp8_dtype=b.kernel.fp8_dtype)
    return x, x_scale, masked_m, torch.tensor([OUTPUT_SCALE], device=case.device)


def _requant_reference(x, x_scale, masked_m, output_scale, dtype):
    from hal.backends.reference import ops

    return ops.requant_fp8(x, x_scale, masked_m, output_scale, poison(torch.empty(x.shape, dtype=dtype,
                                                                                  device=x.device)))


def _carries_into_next_binade(x, x_scale, masked_m, output_scale, ref):
    """Elements whose exact fp32 value lies below a power of two that it rounds up to."""
    from hal.backends.reference import ops

    carry = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    inv = 1.0 / output_scale.float().reshape(())
    limit = ops.fp8_max(ref.dtype)
    for e, m in enumerate(masked_m.tolist()):
        v = (x[e, :m].float() * ops.group_scales(x_scale[e], m, x.shape[-1]) * inv).clamp(-limit, limit)
        r = ref[e, :m].float().abs()
        power_of_two = torch.frexp(r).mantissa == 0.5
        carry[e, :m] = power_of_two & (v.abs() < r)
    return carry


@conformance("requant")
def test_requant_bit_exact(case):
    """out= a view inside a poisoned buffer: live rows equal the torch reference byte for byte,
    rows at or beyond masked_m[e] untouched. In Triton's interpreter the elements that round up
    across a power of two are left to test_requant_carry_into_next_binade."""
    b = harness.built(case)
    x, x_scale, masked_m, s_out = _requant_inputs(case, seed=41)
    buffer, out = harness.poisoned_view(x.shape, b.kernel.fp8_dtype, x.device)
    result = b.kernel(x, x_scale, masked_m, s_out, out=out, expected_rows=2)
    harness.assert_returns_out(result, out)
    harness.assert_margins_intact(buffer, out)
    ref = _requant_reference(x, x_scale, masked_m, s_out, b.kernel.fp8_dtype)
    if case.interpreted:
        carry = _carries_into_next_binade(x, x_scale, masked_m, s_out, ref)
        out, ref = out.clone(), ref.clone()
        out.view(torch.uint8)[carry] = 0
        ref.view(torch.uint8)[carry] = 0
    assert_masked_rows(out, ref, masked_m)


@conformance("requant")
def test_requant_carry_into_next_binade(case):
    """Values just below a power of two round up into the next binade, bit for bit."""
    if case.interpreted:
        pytest.skip(f"{case.backend}: {FP8_CARRY}")
    b = harness.built(case)
    x, x_scale, masked_m, s_out = _requant_inputs(case, seed=42)
    # x_scale such that x * s / s_out lands a hair below 2^n: e4m3 rounds those up to 2^n.
    x_scale = torch.full_like(x_scale, OUTPUT_SCALE * 0.99).contiguous()
    out = poison(torch.empty(x.shape, dtype=b.kernel.fp8_dtype, device=x.device))
    b.kernel(x, x_scale, masked_m, s_out, out=out)
    ref = _requant_reference(x, x_scale, masked_m, s_out, b.kernel.fp8_dtype)
    assert bool(_carries_into_next_binade(x, x_scale, masked_m, s_out, ref).any())
    assert_masked_rows(out, ref, masked_m)


@conformance("requant")
def test_requant_default_out(case):
    b = harness.built(case)
    full = [REQUANT_MAX_M] * case.spec.num_experts
    x, x_scale, masked_m, s_out = _requant_inputs(case, seed=43, counts=full)
    out = b.kernel(x, x_scale, masked_m, s_out)
    assert tuple(out.shape) == tuple(x.shape) and out.dtype == b.kernel.fp8_dtype
    assert out.device == torch.device(case.device)


@conformance("requant")
def test_requant_plan(case):
    b = harness.built(case)
    assert_same_plan(b.kernel.plan(REQUANT_MAX_M, expected_rows=2),
                     b.kernel.plan(REQUANT_MAX_M, expected_rows=2))


@conformance("requant")
def test_requant_under_torch_compile(case):
    """As test_moe_under_torch_compile, for requant."""
    b = harness.built(case)
    x, x_scale, masked_m, s_out = _requant_inputs(case, seed=45)

    def call(x, x_scale, masked_m, s_out):
        out = torch.zeros(x.shape, dtype=b.kernel.fp8_dtype, device=x.device)
        return b.kernel(x, x_scale, masked_m, s_out, out=out)

    eager = call(x, x_scale, masked_m, s_out)
    torch._dynamo.reset()
    assert_same_bits(eager, torch.compile(call, backend="aot_eager")(x, x_scale, masked_m, s_out))


@conformance("requant")
def test_requant_autograd(case):
    """Requant is inference-only: with grad mode on, an x_scale, output_scale or out= that requires
    grad is a ValueError naming it."""
    b = harness.built(case)
    x, x_scale, masked_m, s_out = _requant_inputs(case, seed=44)
    for name in ("x_scale", "output_scale"):
        args = {"x_scale": x_scale, "output_scale": s_out}
        args[name] = args[name].clone().requires_grad_()
        with pytest.raises(ValueError, match=f"{name} requires grad.*inference-only"):
            b.kernel(x, args["x_scale"], masked_m, args["output_scale"])
    out = torch.zeros(x.shape, device=x.device, requires_grad=True)
    with pytest.raises(ValueError, match="out requires grad"):
        b.kernel(x, x_scale, masked_m, s_out, out=out)


# What `from hal.testing.conformance import *` brings into a repository's test module: the hook that
# parametrizes, and every test.
__all__ = ["pytest_generate_tests", *sorted(name for name in dict(globals()) if name.startswith("test_"))]
