"""Claims the docs make about the code, read back from the code: the README's device column and
measurement notes, and what the transformers adapter gets on a GPU."""

import pathlib
import re

import pytest
from hal.backends.triton_moe import support

import hal
from hal import presets
from hal.backend import Target
from hal.registry import decide, discover

pytestmark = pytest.mark.cpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def backend_row(name: str) -> str:
    (row,) = [line for line in README.splitlines() if line.startswith(f"| `{name}` |")]
    return row


def test_triton_moe_row_states_the_archs_the_check_takes():
    row = backend_row("triton_moe")
    fp8 = "sm_{}{}".format(*support.MIN_NVIDIA_FP8_CAPABILITY)
    assert "sm_{}{}".format(*support.MIN_NVIDIA_CAPABILITY) in row and f"fp8_block128 from {fp8}" in row
    for prefix in support.AMD_ARCH_PREFIXES:
        assert prefix in row, f"{prefix}: the check takes it, the README does not say so"
    fp8_note = row.split("fp8_block128 on ")[1]
    assert all(prefix in fp8_note for prefix in support.AMD_FP8_ARCH_PREFIXES)


def test_marlin_row_names_every_gpu_its_page_measured_on():
    page = (ROOT / "docs" / "backends" / "marlin.md").read_text()
    measured = set(re.findall(r"^## Measured \((\w+)", page, flags=re.M))
    assert measured >= {"H100", "H200"}
    note = backend_row("marlin").split("measured on ")[1].split(";")[0]
    for gpu in measured:
        assert gpu in note, f"docs/backends/marlin.md has measurements on the {gpu}; the README omits it"


@pytest.mark.parametrize("profile", [p for p in hal.profiles() if hal.probe(profile=p).gpus])
def test_engine_integration_names_the_gpu_backend_the_adapter_gets(profile):
    """The adapter selects like hal.select_moe_kernel and runs the eager forward where only the
    reference accepts: the page names whichever backend that is."""
    page = (ROOT / "docs" / "engine-integration.md").read_text()
    gpu_paragraph = page.split("On a GPU the adapter selects as")[1].split("\n\n")[0]
    caps = hal.probe(profile=profile)
    for fmt in ("bf16", "fp8_block128"):
        d = decide(presets.get("qwen3-30b-a3b").spec(fmt), Target("cuda:0", caps), discover())
        named = "eager forward" if d.winner == "reference" else d.winner
        assert named in gpu_paragraph, (profile, fmt, d.winner)
