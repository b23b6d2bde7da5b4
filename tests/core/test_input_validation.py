"""Inputs of the wrong type or on no real device: each is a ValueError naming its argument (or,
for a caps file, the field and the file), never a crash, a NaN or a silently wrong reading."""

import json

import attrs
import pytest
import torch

import hal
from hal import synth
from hal.caps import Caps
from hal.probe.profiles import load_hal_caps

pytestmark = pytest.mark.cpu

EP = hal.MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64, num_local_experts=4)
MASKED = hal.MoESpec(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128,
                     weight_format="w4afp8", layout="masked")
REQUANT = hal.RequantSpec(num_experts=3, hidden_size=256)


def caps_file(tmp_path, change):
    data = json.loads(Caps().to_json())
    change(data)
    path = tmp_path / "caps.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("change, field", [
    (lambda d: d["cpu"]["amx"].update(permitted="no"), "cpu.amx.permitted"),
    (lambda d: d["cpu"]["amx"].update(cpuid=1), "cpu.amx.cpuid"),
    (lambda d: d["cpu"].update(logical_cpus="64"), "cpu.logical_cpus"),
    (lambda d: d["cpu"].update(logical_cpus=True), "cpu.logical_cpus"),
    (lambda d: d["cpu"].update(mem_bandwidth_gbps="fast"), "cpu.mem_bandwidth_gbps"),
    (lambda d: d["cpu"]["sources"].update(avx2={"nested": "x"}), "cpu.sources"),
    (lambda d: d.update(gpus=[{"index": 0, "warp_size": 32.5}]), "gpus[0].warp_size"),
    (lambda d: d.update(gpus={"index": 0}), "gpus"),
    (lambda d: d.update(gpus=[{"index": 0, "torch_archs": [90]}]), "gpus[0].torch_archs[0]"),
    (lambda d: d["cpu"].update(caches=[{"level": "1"}]), "cpu.caches[0].level"),
])
def test_a_caps_field_of_the_wrong_type_names_the_field_and_the_file(tmp_path, change, field):
    path = caps_file(tmp_path, change)
    with pytest.raises(ValueError) as err:
        load_hal_caps(str(path))
    message = str(err.value)
    assert f"{field}: expected" in message and str(path) in message and "HAL_CAPS" in message


def test_a_caps_file_nested_too_deeply_is_a_value_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=f"profile file {path}: nested too deeply"):
        load_hal_caps(str(path))


def test_the_recorded_profiles_still_load():
    for name in hal.profiles():
        assert hal.probe(profile=name).profile == name


def test_expert_map_on_the_meta_device_is_named():
    kernel = hal.select_moe_kernel(EP, "cpu", caps=Caps(), prefer="reference")
    weights = attrs.evolve(synth.random_weights(EP), expert_map=synth.random_expert_map(EP))
    kernel.prepare_weights(weights)
    meta_map = torch.empty((EP.num_experts,), dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="weights.expert_map is on meta: expected cpu"):
        kernel.prepare_weights(attrs.evolve(weights, expert_map=meta_map))


def masked_kernel():
    return hal.select_moe_kernel(MASKED, "cpu", caps=Caps(), prefer="reference")


def test_masked_plan_takes_an_int32_masked_m_and_int_counts():
    kernel = masked_kernel()
    counts = torch.tensor([1, 0, 3, 2], dtype=torch.int32)
    assert kernel.plan(counts, expected_rows=2, max_m=4).describe()
    for bad, arg in [(dict(masked_m=counts.float()), "masked_m"),
                     (dict(masked_m=counts[:2]), "masked_m"),
                     (dict(masked_m=counts.to("meta")), "masked_m"),
                     (dict(masked_m=-counts), "masked_m"),
                     (dict(masked_m=counts, max_m=2), "masked_m"),
                     (dict(masked_m=counts, expected_rows=True), "expected_rows"),
                     (dict(masked_m=counts, expected_rows=1.5), "expected_rows"),
                     (dict(masked_m=counts, max_m=False), "max_m")]:
        with pytest.raises(ValueError, match=arg):
            kernel.plan(**bad)


def test_requant_plan_takes_int_counts():
    kernel = hal.select_requant_kernel(REQUANT, "cpu", caps=Caps(), prefer="reference")
    assert kernel.plan(4, expected_rows=2).describe()
    for args, kwargs, arg in [((True,), {}, "max_m"), ((-1,), {}, "max_m"), ((4.0,), {}, "max_m"),
                              ((4,), dict(expected_rows=True), "expected_rows")]:
        with pytest.raises(ValueError, match=arg):
            kernel.plan(*args, **kwargs)


def test_a_bool_expected_rows_in_a_call_is_named():
    kernel = masked_kernel()
    prepared = kernel.prepare_weights(synth.random_weights(MASKED))
    x, xs, mm = synth.random_masked_inputs(4, 128, 3, [1, 0, 3, 2], seed=1)
    with pytest.raises(ValueError, match="expected_rows=True"):
        kernel(x, xs, mm, prepared, expected_rows=True)


@pytest.mark.parametrize("scale", [1e-45, 1e-40, 1.0e-38])
def test_a_subnormal_output_scale_is_named_not_turned_into_nan(scale):
    kernel = hal.select_requant_kernel(REQUANT, "cpu", caps=Caps(), prefer="reference")
    x, xs, mm = synth.random_masked_inputs(3, 256, 2, [2, 0, 1], seed=2)
    with pytest.raises(ValueError, match="output_scale=.*expected a finite normal value"):
        kernel(x, xs, mm, torch.tensor([scale]))
    tiny = torch.finfo(torch.float32).tiny
    out = kernel(x, xs, mm, torch.tensor([tiny]))
    assert not torch.isnan(out[0, :2].float()).any()
