import os

import pytest
import torch

# Tests run in float64 throughout and should not depend on the host's thread count.
torch.set_num_threads(int(os.environ.get("FEDGP_TEST_THREADS", "1")))


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(12345)
