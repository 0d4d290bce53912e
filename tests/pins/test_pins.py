"""Refactors do not move the reproduced numbers (issue 13, item 10).

``reference.json`` was written by ``python -m tests.pins.generate`` at the commit it names, before
the round protocol became messages. Every later commit must reproduce it to 1e-10 (relative, with
an absolute floor of 1e-12 for values near zero).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.datasets.real import require_real_data
from tests.pins import cases

REFERENCE = json.loads((Path(__file__).resolve().parent / "reference.json").read_text())
FD001 = ("cmapss/train_FD001.txt", "cmapss/test_FD001.txt", "cmapss/RUL_FD001.txt")


def assert_pinned(name: str, got: dict[str, list[float]]) -> None:
    want = REFERENCE[name]
    assert sorted(got) == sorted(want), f"{name}: pinned entries differ"
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12, err_msg=f"{name}: {key}")


def test_readme_example_is_pinned():
    assert_pinned("readme_example", cases.readme_example())


@pytest.mark.slow
def test_table2_fgpr_repeat0_is_pinned():
    root = require_real_data(*FD001)
    assert_pinned("table2_fgpr_repeat0", cases.table2_fgpr_repeat0(root))


@pytest.mark.slow
def test_mixed_regression_c1_seed0_two_phase_is_pinned():
    assert_pinned("mixed_regression_c1_seed0", cases.mixed_regression_c1())


def test_every_strategy_family_is_pinned_on_both_engines():
    assert_pinned("strategy_zoo", cases.strategy_zoo())
