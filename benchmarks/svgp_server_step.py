"""Federated SVGP over many rounds: what the server's step on the inducing locations does (issue 31).

    .venv/bin/python benchmarks/svgp_server_step.py              # 10 owners × 4,000 rows, M = 256 (≈ 15 min)
    .venv/bin/python benchmarks/svgp_server_step.py --rounds 40 --clients 4 --rows 1000   # a quick look

Study a (``benchmarks/large_federation.py``) found a federated SVGP of M = 256 *worse* after 160
rounds than after 40. This runs the cause down on the same data (one random-Fourier-feature GP draw
on [0, 1]⁵, noise 0.01; ``large_federation.owners``), smaller: K owners of n rows, a
:class:`fedgp.VariationalGPSpec` of M inducing points, FGPR (defaults otherwise) for R rounds, the
owners' mean test RMSE every R/8 rounds. Variants of the server step:

* ``FedAdam on everything (before)``: FGPR's default server optimiser, FedAdam (lr 0.1), stepping on
  the inducing locations Z as on the hyper-parameters (what fedgp did before ``server_averaged``);
* ``FedAdam, Z averaged (default)``: FedAdam on the hyper-parameters, Z the owners' plain average;
* ``FedAvg``: ``FGPR(server_optimizer=None)``, everything averaged;
* ``FedAdam, Z fixed``: ``learn_inducing_locations=False`` (Z stays at its Sobol start).

Writes results/benchmarks/svgp_server_step.csv (variant, round, test_rmse).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from large_federation import D, kernel, owners  # noqa: E402

import fedgp  # noqa: E402
from fedgp.data import ClientData, Federation  # noqa: E402
from fedgp.run import Evaluate  # noqa: E402

VARIANTS = ["FedAdam on everything (before)", "FedAdam, Z averaged (default)", "FedAvg", "FedAdam, Z fixed"]


class EveryParameterStepped(fedgp.VariationalGPSpec):
    """The spec as it was: no parameter exempt from the server optimiser's step."""

    server_averaged = frozenset()


def run(variant: str, clients, inducing: int, rounds: int) -> pd.DataFrame:
    spec_type = EveryParameterStepped if variant.endswith("(before)") else fedgp.VariationalGPSpec
    spec = spec_type(inducing, kernel(), input_dim=D, learn_inducing_locations=not variant.endswith("fixed"))
    strategy = fedgp.strategies.FGPR(**({"server_optimizer": None} if variant == "FedAvg" else {}))
    result = fedgp.fit(
        spec, Federation(clients), strategy, rounds=rounds, seed=0, engine="sequential",
        callbacks=[Evaluate(every=max(1, rounds // 8))],
    )  # fmt: skip
    history = result.history.dropna(subset=["test_rmse_mean"])
    return pd.DataFrame(
        {"variant": variant, "round": history["round"], "test_rmse": history["test_rmse_mean"]}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--inducing", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=160)
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "svgp_server_step.csv"))
    args = parser.parse_args()
    torch.manual_seed(0)
    clients = [
        ClientData(X, y, id=f"owner{k}", X_test=Xt, y_test=yt)
        for k, (X, y, Xt, yt) in enumerate(owners(args.clients, args.rows))
    ]
    frames = []
    for variant in args.variants:
        start = time.perf_counter()
        frames.append(run(variant, clients, args.inducing, args.rounds))
        print(f"{variant}: {time.perf_counter() - start:.0f} s", flush=True)
    frame = pd.concat(frames, ignore_index=True)
    frame.insert(0, "inducing", args.inducing)
    frame.to_csv(args.out, index=False, float_format="%.4g")
    print(frame.pivot(index="round", columns="variant", values="test_rmse").to_string(float_format="%.3f"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
