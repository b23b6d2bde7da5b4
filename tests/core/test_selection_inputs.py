"""Selection's inputs that name nothing real: a device this machine or the caps lack, backends
the environment names that are not registered."""

import attrs
import pytest
import torch

import hal
from hal import ops
from hal.registry import Discovered, select_moe_kernel
from hal.verdict import Verdict

pytestmark = pytest.mark.cpu

SPEC = hal.MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64)


class Fake:
    ops = ("moe", "moe_masked", "requant")

    def __init__(self, name):
        self.name = name

    def check(self, spec, target):
        return Verdict.accept()

    def rank(self, spec, target):
        return 50

    def build(self, spec, target):
        return type("K", (), {"backend": self.name, "decision": None})()


FOUND = [Discovered("alpha", backend=Fake("alpha")), Discovered("beta", backend=Fake("beta"))]


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for var in ("HAL_BACKENDS", "HAL_DISABLE_BACKENDS", "HAL_CAPS", "HAL_STRICT",
                *(op.override_variable for op in ops.OPS)):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:3"], ids=["first-gpu", "fourth-gpu"])  # not the cuda marker
def test_cuda_without_a_gpu_names_device_and_the_torch_build(device):
    with pytest.raises(ValueError, match=r"device='cuda:\d'") as err:
        select_moe_kernel(SPEC, device, backends=FOUND)
    assert f"torch {torch.__version__}" in str(err.value)


def test_a_gpu_the_caps_do_not_list_is_named():
    with pytest.raises(ValueError, match=r"device='cuda:1': the capabilities \(h200\) list no GPU at "
                                         "index 1"):
        select_moe_kernel(SPEC, "cuda:1", caps=hal.probe(profile="h200"), backends=FOUND)
    with pytest.raises(ValueError, match=r"device='cuda:0'.*\(zen4\).*GPUs listed: none"):
        select_moe_kernel(SPEC, "cuda", caps=hal.probe(profile="zen4"), backends=FOUND)
    assert select_moe_kernel(SPEC, "cuda:0", caps=hal.probe(profile="h200"), backends=FOUND).backend


@pytest.mark.parametrize("variable", ["HAL_BACKENDS", "HAL_DISABLE_BACKENDS", "HAL_MOE_BACKEND",
                                      "HAL_MOE_MASKED_BACKEND", "HAL_REQUANT_BACKEND"])
def test_unknown_backend_names_in_the_environment_list_the_known_ones(monkeypatch, variable):
    monkeypatch.setenv(variable, "alpha,gamma")
    with pytest.raises(ValueError, match=f"{variable} names 'gamma', not a registered backend: "
                                         "known backends are alpha, beta"):
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=FOUND)


def test_an_unknown_prefer_lists_the_known_backends():
    with pytest.raises(hal.NoKernelError, match="known backends are alpha, beta"):
        select_moe_kernel(SPEC, "cpu", caps=hal.caps.Caps(), backends=FOUND, prefer="gamma")


def test_a_recorded_gpu_profile_selects_without_this_machine_having_the_gpu():
    caps = hal.probe(profile="h100")
    assert caps.gpus and attrs.evolve(caps).profile == "h100"
    kernel = select_moe_kernel(SPEC, "cuda", caps=caps)
    assert kernel.device == torch.device("cuda:0")
