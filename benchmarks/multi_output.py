"""Several outputs jointly vs independently, on owners that each lack an output on half their inputs.

    .venv/bin/python benchmarks/multi_output.py              # seeds 0-4, 40 FGPR rounds each
    .venv/bin/python benchmarks/multi_output.py --seeds 10

The problem is tests/models/test_multioutput.py's: 4 owners, 2 outputs of correlation about -0.95;
owner k holds output k % 2 everywhere and the other only where x <= 0.5, and is tested on the other
where x > 0.5. Per split seed, FGPR (default settings, sequential engine, default transforms: each
output standardised by its federated mean and sd) fits

- ``icm``: ``MultiOutputSpec(outputs=2, rank=1)``;
- ``lmc``: ``MultiOutputSpec([RBFKernel(), RBFKernel()], outputs=2)``;
- ``rank0``: ``MultiOutputSpec(outputs=2, rank=0)`` (independent outputs sharing the input kernel);
- ``separate``: one ``GPSpec()`` FGPR fit per output, each standardised by its federated mean and sd;

and prints the mean test NLL per owner on the lacking output, and the learned correlation.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import gpytorch

import fedgp
from fedgp.data.client import ClientData, Federation
from fedgp.models.multioutput import MultiOutputSpec
from fedgp.transforms import Standardize, Transforms

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
from test_multioutput import _correlated_owners  # noqa: E402 - the problem the tests fix

ROUNDS = 40


def _joint(spec: MultiOutputSpec, fed: Federation) -> tuple[float, float]:
    result = fedgp.fit(spec, fed, rounds=ROUNDS, engine="sequential", seed=0)
    nll = sum(result.posterior(c.X_test, client=c.id).nll(c.y_test) for c in fed) / len(fed)
    correlation = float(spec.for_inputs(fed.n_features).task_correlation(result.state)[0, 1])
    return nll, correlation


def _separate(fed: Federation) -> float:
    nll = []
    for t in range(2):
        clients = [ClientData(c.X[c.X[:, -1] == t, :-1], c.y[c.X[:, -1] == t], id=c.id) for c in fed]
        standard = Transforms(outcome=Standardize())
        result = fedgp.fit(
            fedgp.GPSpec(), Federation(clients), rounds=ROUNDS, engine="sequential", transforms=standard
        )
        for c in fed:
            asked = c.X_test[:, -1] == t
            if bool(asked.any()):
                nll.append(result.posterior(c.X_test[asked, :-1], client=c.id).nll(c.y_test[asked]))
    return sum(nll) / len(nll)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    seeds = parser.parse_args().seeds
    warnings.simplefilter("ignore")
    print("seed  icm_nll  icm_corr  lmc_nll  lmc_corr  rank0_nll  separate_nll")
    for seed in range(seeds):
        fed = _correlated_owners(seed)
        icm = _joint(MultiOutputSpec(outputs=2), fed)
        lmc = _joint(
            MultiOutputSpec([gpytorch.kernels.RBFKernel(), gpytorch.kernels.RBFKernel()], outputs=2), fed
        )
        rank0, _ = _joint(MultiOutputSpec(outputs=2, rank=0), fed)
        separate = _separate(fed)
        joint = f"{icm[0]:7.3f}  {icm[1]:8.3f}  {lmc[0]:7.3f}  {lmc[1]:8.3f}"
        print(f"{seed:4d}  {joint}  {rank0:9.3f}  {separate:12.3f}")


if __name__ == "__main__":
    main()
