import math

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("botorch")

from fedgp.experiments import botorch_loop as B  # noqa: E402


def test_fourier_draws_have_the_rbf_covariance():
    rng = np.random.default_rng(0)
    X = torch.tensor([[0.2, 0.3], [0.25, 0.3], [0.4, 0.5], [0.9, 0.1]], dtype=torch.float64)
    values = torch.stack([B.FourierDraw.sample(rng, features=500)(X) for _ in range(4000)])
    d2 = torch.cdist(X, X) ** 2
    expected = B.OUTPUTSCALE * torch.exp(-d2 / (2 * B.LENGTHSCALE**2))
    assert (torch.cov(values.T) - expected).abs().max() < 0.08  # 4,000 draws: sd of an entry ≈ 0.02


def test_maximum_is_the_functions_maximum():
    f = B.FourierDraw.sample(np.random.default_rng(3))
    grid = torch.rand(5000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert f.maximum() >= float(f(grid).max()) - 1e-12


def test_loop_machinery_one_seed_two_iterations():
    rows = B.run_seed(0, iterations=2, rounds=3, engine="sequential")
    frame = B.summary(pd.DataFrame(rows))
    assert list(frame["method"]) == list(B.METHODS)

    df = pd.DataFrame(rows)
    assert len(df) == 3 * 3 and (df["regret"] >= -1e-12).all()
    start = df[df["iteration"] == 0]
    assert start["regret"].nunique() == 1  # every method starts from the same points
    for _, group in df.groupby("method"):
        assert group["evaluations"].tolist() == [B.START, B.START + 1, B.START + 2]
        assert (group["regret"].diff().dropna() <= 1e-12).all()  # best-so-far never gets worse
    assert math.isfinite(df["learned.covar_module.outputscale"].iloc[0])
