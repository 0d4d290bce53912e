"""The two paths everyone walks stay short (issue 50): the figures of ``benchmarks/trace_paths.py``.

The counts are deterministic (calls, not time): a change that sends a round through more fedgp
files, or back and forth between them more often, fails here and says by how much. Raise a bound
only with the reason in the commit; the benchmark's ``--detail`` lists the files and the moves by
concern.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def traces():
    spec = importlib.util.spec_from_file_location("trace_paths", ROOT / "benchmarks" / "trace_paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.trace()


def test_a_round_of_a_three_client_fit_crosses_each_layer_once(traces):
    round_ = traces["round"]
    assert len(round_.files) <= 18, sorted(round_.files)
    assert round_.moves <= 150, round_.concerns
    # a strategy without personal hyper-parameters never touches the clients' memory
    assert not {"strategies/personal.py", "strategies/memory.py"} & set(round_.files)


def test_a_predict_for_a_training_client_is_six_steps(traces):
    predict = traces["predict"]
    assert len(predict.files) <= 8, sorted(predict.files)
    assert predict.moves <= 24, predict.concerns
