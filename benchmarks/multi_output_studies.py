"""Issue 52, studies 5(a) and 5(b): several outputs jointly under FGPR vs one FGPR fit per output.

    export FEDGP_DATA=/work/shared/datasets   # the folder holding sarcos/ and cmapss/
    .venv/bin/python benchmarks/multi_output_studies.py sarcos --seeds 0 --rows 40 --rounds 40
    .venv/bin/python benchmarks/multi_output_studies.py sarcos --seeds 0 --rows 40 --rounds 40 --joint lmc
    .venv/bin/python benchmarks/multi_output_studies.py cmapss --seeds 0 1 2

(the commands behind ``results/multi_output.md``, which gives each run's seeds, time and output file).

**(a) SARCOS**, the Table 3 partitions (``fedgp.experiments.table3``): the reduced protocol (only
``sarcos_inv_test.mat`` exists here), 25 devices at random (``iid``), each device's rows split
90/10 into training and test, inputs standardised by the pooled training rows and each torque by
the device's own training mean and sd (``standardize_y="device"``). ``--rows`` keeps that many of
each device's training rows (drawn at random; all ~160 by default) to fit a shared 2-core machine.
Per split seed, on the same rows:

- ``icm``: FGPR on all 7 torques in the Hadamard form, ``MultiOutputSpec(Matérn-3/2 ARD, outputs=7,
  rank=--rank, output_noise=True)``: one input kernel, B = W Wᵀ + diag(v), a noise per torque;
- ``lmc``: the same with two Matérn-3/2 ARD input kernels, each with its own B_q (``--joint icm lmc``);
- ``rank0``: the ICM with ``rank=0`` (B diagonal): the torques independent but sharing the input
  kernel (``--joint rank0``), to tell the shared lengthscales' cost from the coupling's;
- ``independent``: 7 FGPR fits of Table 3's one-output spec (``ScaleKernel(Matérn-3/2 ARD)``);
- ``central``: one exact GPyTorch multitask GP (``MultitaskKernel`` of the same Matérn and rank,
  ``MultitaskGaussianLikelihood`` with a noise per torque) on the pooled training rows, in original
  units standardised per torque, hyper-parameters by Adam on ``--central-subset`` pooled inputs,
  conditioned on every pooled training input, predictions mapped back to each device's scale.

FGPR runs the Table 3 settings (``FGPR.authors(local_steps=5, batch_size=64, lr=0.1)``; Table 3 runs
100 rounds, ``--rounds`` sets them);
the joint fits draw minibatches of 7 × 64 long rows, so a step sees as many rows per torque as an
independent fit's step does. Every device is scored on its own test rows, per torque.

**(b) C-MAPSS** FD001, training engines as owners, ``x = cycle / 100``, the sensors ``--sensors``
(informative ones: s2 T24, s3 T30, s4 T50, s7 P30, s11 Ps30), every ``--stride``-th cycle of the
first ``--engines`` engines. Engine k lacks sensor ``k mod S`` on the second half of its life (it
is tested there: "missing"); of every other entry 10 % are held out at random ("held-out"). Each
sensor is standardised by the federation's mean and sd of its observed training entries. Joint
(ICM, ``rank=--rank``, RBF, noise per sensor) vs one FGPR fit per sensor (``ScaleKernel(RBF)``),
``FGPR.authors()`` (E = 5, M = 32 per sensor, lr 0.05), 100 rounds.

Each run writes ``results/multi_output_<study>.csv`` (one row per seed, method, device/engine,
output and test kind: RMSE, mean NLL, 95 % coverage, rows; C-MAPSS output o is the o-th of
``--sensors``) and prints the per-output summary; ``report CSV...`` merges runs' CSVs (``--out``)
and prints the tables, comparing each joint model with the independent fits on the seeds it ran.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path

import gpytorch
import numpy as np
import pandas as pd
import torch

from fedgp.data.client import ClientData, Federation
from fedgp.data.outputs import outputs_client
from fedgp.experiments.common import fit_study
from fedgp.models.multioutput import MultiOutputSpec
from fedgp.models.posterior import Prediction
from fedgp.rng import generator
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_spec

RESULTS = Path(__file__).resolve().parents[1] / "results"
SARCOS_OUTPUTS = 7
Z95 = 1.959963984540054


def row_metrics(mean: torch.Tensor, var: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """RMSE, mean Gaussian NLL and 95 % coverage of the predictive N(mean, var) against ``y``."""
    nll = 0.5 * (torch.log(2 * math.pi * var) + (y - mean) ** 2 / var)
    inside = (y - mean).abs() <= Z95 * var.sqrt()
    return {
        "rmse": float(((y - mean) ** 2).mean().sqrt()),
        "nll": float(nll.mean()),
        "coverage95": float(inside.double().mean()),
        "rows": int(y.numel()),
    }


def _split_by_output(pred: Prediction, X_rows: torch.Tensor, y: torch.Tensor, outputs: int, **keys) -> list:
    """One metrics record per output present in the long-form test rows ``X_rows``."""
    task = X_rows[:, -1].long()
    out = []
    for t in range(outputs):
        mine = task == t
        if bool(mine.any()):
            metrics = row_metrics(pred.mean[mine], pred.variance_y[mine], y[mine])
            out.append({**keys, "output": t + 1, **metrics})
    return out


# -- (a) SARCOS ----------------------------------------------------------------------------------
def sarcos_federations(data, seed: int, rows: int | None, num_devices: int = 25) -> tuple[Federation, list]:
    """``(joint, per_output)``: the Table 3 devices (``iid``, reduced protocol) of every torque, the
    same rows for all 7; ``rows`` keeps at most that many training rows per device (at random). The
    joint federation holds each device's 7 torques in long form (output index in X's last column)."""
    feds = [
        data.federation(t, "iid", num_devices, 0.1, seed, standardize_y="device")
        for t in range(1, SARCOS_OUTPUTS + 1)
    ]
    joint, singles = [], [[] for _ in feds]
    for k in range(num_devices):
        devices = [fed[k] for fed in feds]
        keep = np.arange(devices[0].n)
        if rows is not None and rows < len(keep):
            keep = np.sort(generator(seed, "multi-output-rows", k).choice(len(keep), rows, replace=False))
        idx = torch.from_numpy(keep)
        for t, c in enumerate(devices):
            meta = {**c.metadata, "train_rows": c.metadata["train_rows"][keep]}
            singles[t].append(
                ClientData(c.X[idx], c.y[idx], id=k, X_test=c.X_test, y_test=c.y_test, metadata=meta)
            )
        Y = torch.stack([c.y[idx] for c in devices], 1)
        Y_test = torch.stack([c.y_test for c in devices], 1)
        scales = {
            "y_mean": [c.metadata["y_mean"] for c in devices],
            "y_std": [c.metadata["y_std"] for c in devices],
        }
        joint.append(
            outputs_client(
                devices[0].X[idx], Y, id=k, X_test=devices[0].X_test, Y_test=Y_test, metadata=scales
            )
        )
    return Federation(joint), [Federation(s) for s in singles]


def joint_metrics(result, fed: Federation, outputs: int, **keys) -> list:
    """Each owner's personalised posterior at its own test rows, scored per output."""
    out = []
    for k, c in enumerate(fed):
        pred = result.posterior(c.X_test, client=k)
        out += _split_by_output(pred, c.X_test, c.y_test, outputs, device=c.id, **keys)
    return out


def single_metrics(result, fed: Federation, output: int, **keys) -> list:
    """Each device's personalised posterior of one output at its own test rows."""
    out = []
    for k, c in enumerate(fed):
        if c.X_test is None:
            continue
        pred = result.posterior(c.X_test, client=k)
        metrics = row_metrics(pred.mean, pred.variance_y, c.y_test)
        out.append({**keys, "device": c.id, "output": output, **metrics})
    return out


class CentralMultitask(gpytorch.models.ExactGP):
    """GPyTorch's exact multitask GP (every output at every input, Kronecker form): a constant mean per
    output, ``MultitaskKernel(kernel, rank)`` = k(x, x') ⊗ (W Wᵀ + diag(v)), the model the joint FGPR
    fit federates (:meth:`state_values` reads its values under a :class:`MultiOutputSpec`'s names)."""

    def __init__(self, X, Y, likelihood, kernel, rank: int):
        super().__init__(X, Y, likelihood)
        T = Y.shape[-1]
        self.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=T)
        self.covar_module = gpytorch.kernels.MultitaskKernel(kernel, num_tasks=T, rank=rank)

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))

    def state_values(self) -> dict[str, torch.Tensor]:
        """This model's values under the names of ``MultiOutputSpec(kernel, outputs=T, rank,
        output_noise=True)``'s state."""
        values = {
            "mean_module.constant": torch.stack([m.constant.detach() for m in self.mean_module.base_means]),
            "task_covar_module.covar_factor": self.covar_module.task_covar_module.covar_factor.detach(),
            "task_covar_module.var": self.covar_module.task_covar_module.var.detach(),
            "likelihood.noise_covar.noise": self.likelihood.task_noises.detach(),
        }
        for name, _, constraint in self.covar_module.data_covar_module.named_parameters_and_constraints():
            raw = dict(self.covar_module.data_covar_module.named_parameters())[name].detach()
            values["covar_module." + name.replace("raw_", "")] = (
                constraint.transform(raw) if constraint else raw
            )
        return values


def fit_central_multitask(X, Y, kernel, rank: int, iters: int, lr: float = 0.1) -> CentralMultitask:
    """Fit :class:`CentralMultitask` to ``(X, Y)`` (n, T) by Adam on the exact marginal likelihood,
    from GPyTorch's defaults but with W drawn from a generator of its own and v at softplus(0), as
    :class:`MultiOutputSpec` starts (so the fit does not depend on torch's global generator)."""
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(
        num_tasks=Y.shape[1], rank=0, has_global_noise=False
    ).double()
    model = CentralMultitask(X, Y, likelihood, kernel, rank).double()
    with torch.no_grad():  # GPyTorch draws W and v from torch's global generator; start as the spec does
        g = torch.Generator().manual_seed(0)
        W = model.covar_module.task_covar_module.covar_factor
        W.copy_(torch.randn(W.shape, generator=g, dtype=W.dtype) / max(rank, 1) ** 0.5)
        model.covar_module.task_covar_module.raw_var.zero_()
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    for _ in range(iters):
        optimizer.zero_grad()
        loss = -mll(model(X), Y)
        loss.backward()
        optimizer.step()
    model.eval()
    return model


def central_predict(model: CentralMultitask, X_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The noisy predictive mean and variance at ``X_new``, (m, T) each."""
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        pred = model.likelihood(model(X_new))
        return pred.mean, pred.variance


def central_sarcos(fed: Federation, rank: int, subset: int, iters: int, **keys) -> list:
    """The centralised multitask reference: pooled in original units (device scales undone),
    standardised per torque, fitted on ``subset`` pooled inputs, conditioned on all of them, and
    scored on each device's scale."""
    T = SARCOS_OUTPUTS
    X, Y = [], []
    for c in fed:
        mean, std = (torch.tensor(c.metadata[key], dtype=torch.float64) for key in ("y_mean", "y_std"))
        X.append(c.X[c.X[:, -1] == 0, :-1])
        Y.append(c.y.reshape(-1, T) * std + mean)  # long form is input by input, all 7 present
    X, Y = torch.cat(X), torch.cat(Y)
    mu, sd = Y.mean(0), Y.std(0)
    Z = (Y - mu) / sd
    rows = np.sort(
        generator(keys.get("seed", 0), "multi-output-central").choice(
            len(X), min(subset, len(X)), replace=False
        )
    )
    idx = torch.from_numpy(rows)
    kernel = gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=X.shape[1])
    model = fit_central_multitask(X[idx], Z[idx], kernel, rank, iters)
    model.set_train_data(X, Z, strict=False)
    out = []
    for c in fed:
        Xt = c.X_test[c.X_test[:, -1] == 0, :-1]
        mean, var = central_predict(model, Xt)
        m_dev, s_dev = (torch.tensor(c.metadata[key], dtype=torch.float64) for key in ("y_mean", "y_std"))
        mean = (mean * sd + mu - m_dev) / s_dev
        var = var * (sd / s_dev) ** 2
        Yt = c.y_test.reshape(-1, T)
        for t in range(T):
            out.append(
                {**keys, "device": c.id, "output": t + 1, **row_metrics(mean[:, t], var[:, t], Yt[:, t])}
            )
    return out


def run_sarcos(args) -> pd.DataFrame:
    from fedgp.datasets import load_sarcos

    data = load_sarcos(protocol="reduced")
    matern = lambda: gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=21)  # noqa: E731
    single = gp_spec(21, "matern32", ard=True)
    records = []
    for seed in args.seeds:
        joint, per_output = sarcos_federations(data, seed, args.rows, args.devices)
        keys = dict(study="sarcos", seed=seed, kind="test")
        specs = {
            "icm": lambda: MultiOutputSpec(matern(), outputs=7, rank=args.rank, output_noise=True),
            "lmc": lambda: MultiOutputSpec(
                [matern(), matern()], outputs=7, rank=args.rank, output_noise=True
            ),
            "rank0": lambda: MultiOutputSpec(matern(), outputs=7, rank=0, output_noise=True),
        }
        specs = {name: specs[name]() for name in args.joint if name != "none"}
        for name, spec in specs.items():
            start = time.perf_counter()
            strategy = FGPR.authors(local_steps=5, batch_size=64 * 7, lr=0.1)
            result = fit_study(spec, joint, strategy, args.rounds, seed, engine="sequential")
            records += joint_metrics(result, joint, 7, method=name, **keys)
            correlation = spec.for_inputs(joint.n_features).task_correlation(result.state)
            print(f"seed {seed} {name}: learned correlation of the torques\n{correlation.numpy().round(2)}")
            print(f"seed {seed} {name}: {time.perf_counter() - start:.0f} s", flush=True)
            _save(records, args.out)
        start = time.perf_counter()
        for t, fed in enumerate(per_output):
            strategy = FGPR.authors(local_steps=5, batch_size=64, lr=0.1)
            result = fit_study(single, fed, strategy, args.rounds, seed)
            records += single_metrics(result, fed, t + 1, method="independent", **keys)
        print(f"seed {seed} independent: {time.perf_counter() - start:.0f} s", flush=True)
        _save(records, args.out)
        start = time.perf_counter()
        records += central_sarcos(
            joint, args.rank, args.central_subset, args.central_iters, method="central", **keys
        )
        print(f"seed {seed} central: {time.perf_counter() - start:.0f} s", flush=True)
    return pd.DataFrame.from_records(records)


def _save(records: list, out: Path) -> None:
    """The records so far, so that a run cut off by its time limit keeps what it finished."""
    pd.DataFrame.from_records(records).to_csv(out, index=False)


# -- (b) C-MAPSS ---------------------------------------------------------------------------------
def cmapss_owners(data, sensors, engines: int, stride: int, seed: int) -> tuple[Federation, list]:
    """``(joint, per_sensor)``: engine k lacks sensor ``k mod S`` on its second half (tested there, test
    kind 0 "missing") and has 10 % of its other entries held out (kind 1 "held-out"). Sensors are
    standardised by the mean and sd of their observed training entries over all engines. Test rows
    carry their kind in ``metadata["test_kind"]``."""
    S = len(sensors)
    frame = data.frame("train")
    units = data.units("train")[:engines]
    tables = []
    for k, unit in enumerate(units):
        rows = frame[frame["unit"] == unit].iloc[::stride]
        X = rows["cycle"].to_numpy(dtype=np.float64)[:, None] / 100.0
        Y = rows[list(sensors)].to_numpy(dtype=np.float64)
        kind = np.full(Y.shape, -1)  # -1: training entry
        kind[len(Y) // 2 :, k % S] = 0
        held = generator(seed, "cmapss-held-out", k).random(Y.shape) < 0.1
        kind[held & (kind == -1)] = 1
        tables.append((unit, X, Y, kind))
    train = np.concatenate([np.where(kind == -1, Y, np.nan) for _, _, Y, kind in tables])
    mu, sd = np.nanmean(train, 0), np.nanstd(train, 0)
    joint, singles = [], [[] for _ in sensors]
    for unit, X, Y, kind in tables:
        Z = (Y - mu) / sd
        Ztrain, Ztest = np.where(kind == -1, Z, np.nan), np.where(kind >= 0, Z, np.nan)
        test_kind = kind[kind >= 0]  # long form is input by input, as np's row-major mask
        joint.append(
            outputs_client(X, Ztrain, id=unit, X_test=X, Y_test=Ztest, metadata={"test_kind": test_kind})
        )
        for s in range(S):
            seen, asked = kind[:, s] == -1, kind[:, s] >= 0
            singles[s].append(
                ClientData(
                    X[seen],
                    Z[seen, s],
                    id=unit,
                    X_test=X[asked] if asked.any() else None,
                    y_test=Z[asked, s] if asked.any() else None,
                    metadata={"test_kind": kind[asked, s]},
                )
            )
    return Federation(joint), [Federation(s) for s in singles]


def run_cmapss(args) -> pd.DataFrame:
    from fedgp.datasets import load_cmapss

    data = load_cmapss("FD001")
    S = len(args.sensors)
    records = []
    for seed in args.seeds:
        joint, per_sensor = cmapss_owners(data, args.sensors, args.engines, args.stride, seed)
        base = dict(study="cmapss", seed=seed)
        if "icm" in args.joint:  # "--joint none": only the independent fits (to complete a cut-off run)
            start = time.perf_counter()
            spec = MultiOutputSpec("rbf", outputs=S, rank=args.rank, output_noise=True)
            strategy = FGPR.authors(batch_size=32 * S)
            result = fit_study(spec, joint, strategy, args.rounds, seed, engine="sequential")
            for k, c in enumerate(joint):
                pred = result.posterior(c.X_test, client=k)  # a position: the ids are unit numbers
                kind = torch.as_tensor(c.metadata["test_kind"])
                for value, label in ((0, "missing"), (1, "held-out")):
                    mine = kind == value
                    sub = Prediction(pred.mean[mine], pred.variance_f[mine], pred.variance_y[mine])
                    records += _split_by_output(
                        sub, c.X_test[mine], c.y_test[mine], S, method="icm", kind=label, device=c.id, **base
                    )
            print(f"seed {seed} icm: {time.perf_counter() - start:.0f} s", flush=True)
        _save(records, args.out)
        start = time.perf_counter()
        single = gp_spec(1, "rbf")
        for s, fed in enumerate(per_sensor):
            result = fit_study(single, fed, FGPR.authors(), args.rounds, seed)
            for k, c in enumerate(fed):
                if c.X_test is None:
                    continue
                pred = result.posterior(c.X_test, client=k)
                kind = torch.as_tensor(c.metadata["test_kind"])
                for value, label in ((0, "missing"), (1, "held-out")):
                    mine = kind == value
                    if bool(mine.any()):
                        metrics = row_metrics(pred.mean[mine], pred.variance_y[mine], c.y_test[mine])
                        records.append(
                            {
                                **base,
                                "method": "independent",
                                "kind": label,
                                "device": c.id,
                                "output": s + 1,
                                **metrics,
                            }
                        )
        print(f"seed {seed} independent: {time.perf_counter() - start:.0f} s", flush=True)
        _save(records, args.out)
    return pd.DataFrame.from_records(records)  # output o is the sensor args.sensors[o - 1]


# -- summary -------------------------------------------------------------------------------------
def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per study, test kind, output and method: the devices' mean RMSE, NLL and coverage, averaged
    over seeds (the devices' means first, as Table 3 does), the NLL's sd over seeds and their number."""
    keys = ["study", "kind", "output", "method"]
    per_seed = frame.groupby([*keys, "seed"])[["rmse", "nll", "coverage95"]].mean().reset_index()
    out = per_seed.groupby(keys)[["rmse", "nll", "coverage95"]].mean()
    out["nll_sd_over_seeds"] = per_seed.groupby(keys)["nll"].std(ddof=0)
    out["seeds"] = per_seed.groupby(keys)["seed"].nunique()
    return out.reset_index()


def joint_vs_independent(table: pd.DataFrame, joint: str) -> pd.DataFrame:
    """Per study, kind and output: the joint method's NLL minus the independent fits' (≤ 0: the joint
    model at least as good) and its RMSE over theirs."""
    wide = table.pivot_table(index=["study", "kind", "output"], columns="method", values=["nll", "rmse"])
    out = pd.DataFrame(
        {
            "nll_joint_minus_independent": wide[("nll", joint)] - wide[("nll", "independent")],
            "rmse_joint_over_independent": wide[("rmse", joint)] / wide[("rmse", "independent")],
        }
    )
    out["joint_at_least_as_good"] = out["nll_joint_minus_independent"] <= 0
    return out.reset_index().assign(joint=joint)


def report(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, str]:
    """``(merged, markdown)``: the runs' records merged (a method's rows that two runs both measured,
    e.g. the independent fits of an LMC-only run, kept once), and the per-output tables in markdown."""
    merged = pd.concat(frames, ignore_index=True)
    merged = merged.drop_duplicates(["study", "kind", "seed", "method", "device", "output"], keep="first")
    table = summary(merged)
    parts = [table.to_markdown(index=False, floatfmt=".3f")]
    methods = set(table["method"])
    joints = sorted(methods - {"independent", "central"}) if "independent" in methods else []
    for joint in joints:
        # on the seeds the joint method ran, so both sides average the same splits
        seeds = set(merged.loc[merged["method"] == joint, "seed"])
        compared = joint_vs_independent(summary(merged[merged["seed"].isin(seeds)]), joint)
        better = compared.groupby("kind")["joint_at_least_as_good"].agg(["sum", "count"])
        counts = ", ".join(f"{kind}: {int(r['sum'])} of {int(r['count'])}" for kind, r in better.iterrows())
        parts.append(
            f"**{joint}** (seeds {sorted(int(s) for s in seeds)}) at least as good as the independent "
            f"fits in mean test NLL on {counts} outputs"
        )
        parts.append(compared.to_markdown(index=False, floatfmt=".3f"))
    return merged, "\n\n".join(parts) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=("sarcos", "cmapss", "report"))
    parser.add_argument("csv", nargs="*", type=Path, help="report: the runs' CSVs to merge")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--devices", type=int, default=25, help="SARCOS: devices (Table 3: 25)")
    parser.add_argument("--rows", type=int, default=None, help="SARCOS: training rows kept per device")
    parser.add_argument(
        "--joint",
        nargs="+",
        choices=("icm", "lmc", "rank0", "none"),
        default=["icm"],
        help="joint models (C-MAPSS: icm or none)",
    )
    parser.add_argument("--central-subset", type=int, default=600)
    parser.add_argument("--central-iters", type=int, default=100)
    parser.add_argument("--sensors", nargs="+", default=["s2", "s3", "s4", "s7", "s11"])
    parser.add_argument("--engines", type=int, default=20)
    parser.add_argument("--stride", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads")
    parser.add_argument(
        "--out", type=Path, default=None, help="the CSV (default results/multi_output_<study>.csv)"
    )
    args = parser.parse_args(argv)
    pd.set_option("display.width", 200)
    if args.study == "report":
        merged, text = report([pd.read_csv(path) for path in args.csv])
        if args.out is not None:
            merged.to_csv(args.out, index=False)
        print(text)
        return
    args.out = args.out or RESULTS / f"multi_output_{args.study}.csv"
    warnings.simplefilter("ignore")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)  # two threads on a loaded 2-core machine: 10x slower steps
    try:
        frame = run_sarcos(args) if args.study == "sarcos" else run_cmapss(args)
    finally:
        torch.set_num_threads(threads)
    frame.to_csv(args.out, index=False)
    print(report([frame])[1])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
