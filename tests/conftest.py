import os

import pytest
import torch

# Without a GPU, the Triton round (fedgp.engines.triton_round) runs on CPU tensors in Triton's
# interpreter, a switch read when triton is first imported (tests/engines/test_triton_round.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests run in float64 throughout and should not depend on the host's thread count.
torch.set_num_threads(int(os.environ.get("FEDGP_TEST_THREADS", "1")))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """torch's global generator at a fixed seed before each test and its fixtures (a module
    fixture too): torch seeds it differently in every process, and modules that draw their initial
    values from it (GPyTorch's ``LinearMean``) would otherwise depend on the process and on which
    tests ran before in it (``make test`` spreads the files over processes)."""
    torch.manual_seed(0)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(12345)


# Property-based tests: derandomised under CI (the same examples every run), no deadline (a shared
# 2-core machine makes per-example timings meaningless).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

# ``make test-random`` (FEDGP_HYPOTHESIS=random): fresh examples, 1,000 per test unless the test sets
# its own count, so the derandomised CI run is not the only search.
_hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
_hypothesis_settings.register_profile("dev", deadline=None)
_hypothesis_settings.register_profile("random", deadline=None, max_examples=1000, print_blob=True)
_hypothesis_settings.load_profile(
    os.environ.get("FEDGP_HYPOTHESIS")
    or ("ci" if os.environ.get("CI", "").strip().lower() == "true" else "dev")
)


@pytest.fixture
def sent_records(monkeypatch):
    """Every record an in-process engine turns into bytes (``loopback=True``: each message and
    reply), in order: what would cross the wire."""
    import fedgp.engines.base as engine_base

    sent: list[bytes] = []
    original = engine_base.record_to_bytes

    def capture(record):
        data = original(record)
        sent.append(data)
        return data

    monkeypatch.setattr(engine_base, "record_to_bytes", capture)
    return sent
