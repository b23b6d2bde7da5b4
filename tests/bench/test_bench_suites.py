"""`hal bench` as product code: named suites that parse as the single commands do, inputs sized
to the memory the machine has, and weights that cannot fit refused before allocating."""

import pytest
import torch

from hal.bench import machine, requant, suites
from hal.cli.main import parser

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("name", sorted(suites.SUITES))
def test_every_suite_entry_is_a_valid_hal_bench_command(name):
    suite = suites.SUITES[name]
    assert suite.entries
    for _, argv in suite.entries:
        args = parser().parse_args(["bench", *argv, "--device", suite.device])
        assert args.mode in ("moe", "requant")


def test_unknown_suite_names_the_known_ones():
    with pytest.raises(ValueError, match="smoke"):
        suites.get("nope")


def test_a_point_over_the_budget_is_skipped_and_sets_fill_the_budget():
    one_set = requant.set_bytes(256, 4, 8)
    assert requant.point_inputs("cpu", 256, 4, 8, 1, torch.float8_e4m3fn, budget=one_set - 1) is None
    point = requant.point_inputs("cpu", 256, 4, 8, 1, torch.float8_e4m3fn, budget=3 * one_set)
    assert len(point.sets) == 3
    assert all(x.shape == (4, 8, 256) for x, _, _ in point.sets)


def test_input_budget_is_a_share_of_free_memory():
    free = machine.free_bytes("cpu")
    assert free is None or free > 0
    budget = machine.input_budget("cpu", 1 << 60)
    assert free is None or budget == int(free * machine.INPUT_SHARE)
    assert machine.input_budget("cpu", 1024) == 1024


def test_moe_weights_that_cannot_fit_are_refused_before_allocating(monkeypatch):
    from hal.bench import moe
    from hal.presets import PRESETS

    monkeypatch.setattr(machine, "free_bytes", lambda device: 1 << 30)
    with pytest.raises(ValueError, match="--local-experts"):
        moe.check_fits(PRESETS["deepseek-v3"].spec("fp8_block128"), "cpu", 2)


def test_a_suite_writes_json_and_markdown_per_run(tmp_path, monkeypatch):
    """The smoke suite end to end, through the CLI; the ceilings (timed elsewhere) are fixed so
    the run takes seconds."""
    import json

    from hal.bench import ceilings
    from hal.cli.main import main

    monkeypatch.setattr(ceilings, "measure", lambda device: ceilings.Ceilings(device, 10.0, 1.0))
    assert main(["bench", "suite", "smoke", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "smoke"
    result = json.loads((folder / "tiny_bf16.json").read_text())
    assert result["command"].startswith("hal bench moe --experts 8")
    assert {r["tokens"] for r in result["rows"]} == {1, 16}
    assert all(r["timing"]["median_s"] > 0 for r in result["rows"])
    table = (folder / "tiny_bf16.md").read_text()
    assert table.count("| uniform |") == len(result["rows"])
    assert "## tiny_bf16" in (folder / "README.md").read_text()
