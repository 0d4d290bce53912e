"""A user's trial of every door on data the repository does not otherwise use (issue 49).

The US quarterly macro series of statsmodels (``macrodata``, 1959-2009, the ``bench`` extra) split
among five owners, one per era (the 1960s ... the 2000s, 1959 with the 1960s): each era's
economists predict inflation (``infl``) from unemployment, the 3-month T-bill rate and the quarter
(an integer feature, so the Flower app's ``hide-discrete`` has something to hide). The last four
quarters of every era are held back as "new rows" to predict.

The same table goes through every door with that door's defaults, as the docs describe them:

1. Python: ``Federation.from_partition`` on a DataFrame, ``fedgp.fit(fedgp.GPSpec(), ...,
   stop="auto")`` (the one default ``fedgp.fit`` does not share: it runs every round unless told);
2. scikit-learn: ``FederatedGPRegressor().fit(X_df, y, groups=era)``;
3. the CLI: ``fedgp fit`` / ``fedgp predict`` (NEW.csv with its columns in another order);
4. the saved file: ``fedgp.load`` of the CLI's ``model.fedgp``;
5. Flower: ``fedgp flower new`` and ``flwr run APP local`` (Flower's simulation runtime, the
   Deployment guide's section 7), then ``fedgp flower status``: with the app's defaults, and with
   ``hide-discrete=false`` (the one default the app does not share with Python).

It prints, per door, the rounds run, why the run stopped, the recorded feature names, and the
largest difference of its predictions at the new rows from Python's (each era conditioned on its
own training rows), and what each door said (warnings). Run from the repository root:

    .venv/bin/python benchmarks/doors_trial.py [--keep DIR] [--long 3000]

About 3 minutes on the 2-core VM (Flower's simulation starts Ray and a local SuperLink).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import fedgp

FEATURES = ["unemp", "tbilrate", "quarter"]
BIN = Path(sys.executable).parent


def macro_table() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training rows, new rows) of the five eras."""
    from statsmodels.datasets import macrodata

    data = macrodata.load_pandas().data
    decade = (data["year"].clip(lower=1960) // 10 * 10).astype(int)
    frame = data[["unemp", "tbilrate", "infl"]].assign(era=decade.astype(str) + "s")
    frame = frame.assign(quarter=data["quarter"].astype(int))[["era", *FEATURES, "infl"]]
    frame = frame.iloc[1:]  # the first quarter's inflation is a placeholder 0.0
    last = frame.groupby("era").tail(4).index
    return frame.drop(index=last).reset_index(drop=True), frame.loc[last].reset_index(drop=True)


def quietly(call, *args, **kwargs):
    """``call(...)`` and the warnings it gave, one line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call(*args, **kwargs)
    said = [
        f"{w.category.__name__}: {str(w.message)[:110]}"
        for w in caught
        if issubclass(w.category, UserWarning)
    ]
    return out, said


def sh(*argv, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(
            f"{' '.join(map(str, argv))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return done


def predictions(result: fedgp.FitResult, train: pd.DataFrame, new: pd.DataFrame) -> np.ndarray:
    """Each new row from its era's posterior (the era's training rows), the columns given reordered."""
    out = np.empty(len(new))
    shuffled = new[FEATURES[::-1]]  # another column order: matched by name where names were recorded
    for era, rows in new.groupby("era").groups.items():
        mine = train[train["era"] == era]
        client = fedgp.data.ClientData(mine[FEATURES], mine["infl"], id=era)
        out[np.asarray(rows)] = result.predict(shuffled.loc[rows], client)[0].numpy()
    return out


def stop_local_superlink(home: Path) -> None:
    """Kill, by PID, the processes ``flwr run ... local`` left running under this ``FLWR_HOME`` (its
    local SuperLink and their children), and no other."""
    import psutil

    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get("FLWR_HOME") == str(home):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


def flower_door(folder: Path, csv: Path, name: str, extra: str = "") -> Path:
    """The Deployment guide's section 7: the app in Flower's simulation runtime via ``flwr run``."""
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "FLWR_HOME": str(folder / "flwr-home"), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "PATH": path}  # fmt: skip
    (folder / "flwr-home").mkdir(exist_ok=True)
    (folder / "flwr-home" / "config.toml").write_text(
        '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'
    )
    if not (folder / "app").exists():
        sh(BIN / "fedgp", "flower", "new", folder / "app", env=env)
    out = folder / name
    columns = "group='era' target='infl' features='unemp,tbilrate,quarter'"
    config = f'simulation-data="{csv}" {columns} out-dir="{out}" {extra}'.strip()
    sh(BIN / "flwr", "run", folder / "app", "local", "--federation-config",
       "num-supernodes=3 init-args-num-cpus=2", "--run-config", config, env=env)  # fmt: skip
    try:
        for _ in range(600):  # flwr run returns once the run is submitted; the folder tells the rest
            status = sh(BIN / "fedgp", "flower", "status", out, env=env, check=False)
            if not status.stdout.startswith("running") and status.returncode != 2:
                break
            time.sleep(1)
    finally:
        stop_local_superlink(folder / "flwr-home")
    print(f"fedgp flower status: {status.stdout.strip() or status.stderr.strip()}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, default=None, help="keep the files in this folder")
    parser.add_argument(
        "--long",
        type=int,
        default=0,
        help="also fit in Python for this many rounds with and without hide_discrete: the difference "
        "the Flower app's default makes once training has gone on, and the quarter's lengthscale",
    )
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="fedgp-doors-"))
    folder.mkdir(parents=True, exist_ok=True)
    train, new = macro_table()
    csv = folder / "eras.csv"
    train.to_csv(csv, index=False)
    new[["era", "quarter", "tbilrate", "unemp"]].to_csv(folder / "new.csv", index=False)  # another order
    print(f"{len(train)} training rows of {train['era'].nunique()} eras, {len(new)} new rows; in {folder}")
    rows = []

    ids, parts = fedgp.data.NaturalIdPartitioner()(train["era"])
    fed = fedgp.data.Federation.from_partition(train[FEATURES], train["infl"], parts, ids=ids)
    python, said = quietly(fedgp.fit, fedgp.GPSpec(), fed, stop="auto", callbacks=[fedgp.run.Progress(False)])
    reference = predictions(python, train, new)
    rows.append(("python", python, said, reference))
    _, said = quietly(python.evaluate)
    rows.append(("python evaluate() without a test split", None, said, None))

    from fedgp.sklearn import FederatedGPRegressor

    est, said = quietly(FederatedGPRegressor().fit, train[FEATURES], train["infl"], groups=train["era"])
    rows.append(("scikit-learn", est.result_, said, predictions(est.result_, train, new)))
    _, said = quietly(est.predict, new[FEATURES[::-1]], groups=new["era"].str.upper())
    rows.append(("scikit-learn, eras misspelt at predict", None, said, None))

    fit = sh(
        BIN / "fedgp", "fit", csv, "--target", "infl", "--group", "era", "--out", folder / "cli", "--quiet"
    )
    pred = sh(BIN / "fedgp", "predict", folder / "cli", folder / "new.csv", "--data", csv,
              "--out", folder / "cli-predictions", "--quiet")  # fmt: skip
    cli_mean = pd.read_csv(folder / "cli-predictions" / "predictions.csv")["mean"].to_numpy()
    loaded, said = quietly(fedgp.load, folder / "cli" / "model.fedgp")
    said += [line for line in (fit.stderr + pred.stderr).splitlines() if line.strip()]
    rows.append(("CLI (fedgp predict's predictions.csv)", loaded, said, cli_mean))
    rows.append(("saved file (fedgp.load of the CLI's model)", loaded, [], predictions(loaded, train, new)))

    for name, extra, door in (
        ("flower-model", "", "Flower app (flwr run ... local), its defaults"),
        ("flower-plain", "hide-discrete=false", "Flower app with hide-discrete=false (Python's setting)"),
    ):
        out = flower_door(folder, csv, name, extra)
        if (out / "model.fedgp").exists():
            deployed = fedgp.load(out / "model.fedgp")
            rows.append((door, deployed, [], predictions(deployed, train, new)))

    print()
    for door, result, said, mean in rows:
        print(f"== {door}")
        if result is not None:
            attrs = result.history.attrs
            inputs = result.transforms.get("inputs", "")[:60]
            print(f"   rounds {len(result.history)}, stopped {attrs.get('stopped')}, feature names "
                  f"{result.feature_names}, transforms inputs: {inputs}")  # fmt: skip
            print(f"   stop reason: {str(attrs.get('stop_reason', ''))[:150]}")
        if mean is not None:
            print(
                f"   max |prediction - Python's| at the {len(new)} new rows: "
                f"{np.abs(mean - reference).max():.3g}"
            )
        for line in said:
            print(f"   said: {line}")
    if args.long:
        long_runs(train, new, fed, args.long)
    if args.keep is None:
        shutil.rmtree(folder, ignore_errors=True)


def long_runs(train: pd.DataFrame, new: pd.DataFrame, fed, rounds: int) -> None:
    """Python with and without ``hide_discrete`` for ``rounds`` rounds (``stop="auto"``)."""
    from fedgp.transforms import Transforms

    means, name = {}, "covar_module.base_kernel.lengthscale[2]"
    for hide in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quiet = [fedgp.run.Progress(False)]
            result = fedgp.fit(fedgp.GPSpec(), fed, rounds=rounds, stop="auto",
                               transforms=Transforms(hide_discrete=hide), callbacks=quiet)  # fmt: skip
        means[hide] = predictions(result, train, new)
        trace = result.history[name].iloc[[99, len(result.history) // 3 - 1, -1]].round(2).tolist()
        print(f"== Python, {rounds} rounds, hide_discrete={hide}: {len(result.history)} rounds run, stopped "
              f"{result.history.attrs['stopped']}; the quarter's lengthscale (model units) at rounds 100, "
              f"{len(result.history) // 3}, {len(result.history)}: {trace}")  # fmt: skip
    gap = np.abs(means[True] - means[False]).max()
    print(f"   max |difference| hide_discrete makes at the new rows: {gap:.3g}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
