"""The batched engine's Cholesky follows GPyTorch's jitter schedule row by row (issue 13, defect b).

GPyTorch's ``psd_safe_cholesky`` adds jitter only to the matrices that failed, in increments
1e-8, 1e-7, 1e-6 (float64), so each matrix gets the smallest jitter that works. The batched engine
once re-factorised every row that had failed at the first try with each larger jitter, so a matrix
GPyTorch fixes with 1e-8 got 1e-6 whenever another row needed it, and its error named clients that
had not failed.
"""

import pytest
import torch
from linear_operator.utils.cholesky import psd_safe_cholesky

from fedgp.engines.tensor_gp import cholesky
from fedgp.errors import FactorizationError
from fedgp.models.objective import CHOLESKY_JITTER, CHOLESKY_MAX_TRIES


def matrices(smallest_eigenvalues, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for lam in smallest_eigenvalues:
        Q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
        eig = torch.tensor([2.0, 1.0, 0.5, 0.3, 0.2, lam], dtype=torch.float64)
        K = Q @ torch.diag(eig) @ Q.T
        out.append(0.5 * (K + K.T))
    return torch.stack(out)


# positive definite; fixed by 1e-8; by 1e-7; by 1e-6 (the last try)
FIXABLE = [0.1, -5e-9, -5e-8, -5e-7]


def test_every_row_gets_gpytorchs_jitter_and_only_failing_rows_get_any():
    K = matrices(FIXABLE)
    ours = cholesky(K, ["a", "b", "c", "d"])
    for i in range(len(K)):
        ref = psd_safe_cholesky(K[i], jitter=CHOLESKY_JITTER, max_tries=CHOLESKY_MAX_TRIES)
        assert torch.equal(ours[i], ref), f"row {i}"
    # row 1 is fixed with 1e-8 exactly: (L Lᵀ)_ii − K_ii is that jitter, not the 1e-6 row 3 needs
    added = torch.diagonal(ours[1] @ ours[1].T) - torch.diagonal(K[1])
    assert torch.allclose(added, torch.full((6,), 1e-8, dtype=torch.float64), atol=1e-12)
    assert torch.equal(ours[0], torch.linalg.cholesky(K[0]))


def test_the_error_names_only_the_clients_that_failed():
    K = matrices([*FIXABLE, -5e-5, 0.2, -1e-3])
    ids = ["a", "b", "c", "d", "bad-1", "f", "bad-2"]
    with pytest.raises(FactorizationError, match="client 'bad-1' \\(and others: \\['bad-2'\\]\\)") as info:
        cholesky(K, ids)
    assert info.value.clients == ("bad-1", "bad-2")
