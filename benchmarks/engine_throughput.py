"""Engine throughput: a plain per-client GPyTorch loop vs fedgp's sequential and batched engines.

    .venv/bin/python benchmarks/engine_throughput.py --target        # the whole table (≈ 25 min quiet)
    .venv/bin/python benchmarks/engine_throughput.py --quick         # a few minutes, to try it
    .venv/bin/python benchmarks/engine_throughput.py --clients 100 1000 --repeats 3
    .venv/bin/python benchmarks/engine_throughput.py --clients 1000 10000 --engines loop batched_stepwise \
        batched --target --target-runs batched:2 batched:1 --baseline 38703e1   # issue 34's table

FGPR with M = 32, d = 5, E = 5 local Adam steps, ScaleKernel(RBF-ARD), float64, 100 points per
client. Every measurement runs in a fresh subprocess (so peak RSS is its own) and is repeated;
the table reports medians. Engines:

* ``loop``: what a GPyTorch user would otherwise write, following the GPyTorch regression
  tutorial: one ``ExactGP`` per client, ``set_train_data`` per minibatch step, a fresh
  ``torch.optim.Adam`` per client and round, FedAvg of the state dicts;
* ``sequential``: fedgp's reference engine;
* ``batched``: the batched engine as installed by ``make``: a whole local round per chunk in one
  compiled call (``fedgp.engines.fused``, numba); ``batched_stepwise`` the same engine with
  ``fused=False``: one compiled minibatch step at a time (``fedgp.engines.compiled``) with the
  minibatch draws, transforms and Adam in torch (the batched engine before the fused round);
  ``batched_tensor`` with ``compiled=False`` (the tensor path: fused Gram, batched LAPACK
  Cholesky); ``batched_f32`` float32 minibatches (the step-by-step path: the fused round is float64).

Throughput rows time a fit after an untimed one-round fit of the same engine on 64 clients (so
imports, numba's cache load and first-call costs are excluded for every engine alike); the
``--target`` rows (K = 10,000, R = 100: 5 million client-steps) time the whole ``fit`` in a fresh
process, start-up included (after an untimed 64-client fit in another process fills numba's
cache); with ``--baseline REV`` each target fit also runs on fedgp at git revision REV, right after
this checkout's. ``loop`` and ``sequential`` run on at most ``--loop-clients`` clients (their
throughput per client does not depend on K).

Writes results/benchmarks/engine_throughput.csv (K, engine, threads, client_steps_per_s,
ratio_vs_loop, peak_rss_mb, wall_s) and .txt (this printout), with the thread counts, the 1 → 2
thread scaling, and the achieved GFLOP/s of the batched paths against batched-matmul and GEMM
rooflines measured on the same machine. The machine's load average is printed at the start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's fedgp (also in the worker processes)
M, D, E, N_PER_CLIENT = 32, 5, 5, 100


def make_federation(K: int, seed: int = 0):
    import fedgp

    theta = {
        "covar_module.outputscale": 1.0,
        "likelihood.noise_covar.noise": 0.1,
        "covar_module.base_kernel.lengthscale": [[0.6] * D],
    }
    return fedgp.synthetic.gp_federation(
        num_clients=K, n=N_PER_CLIENT, d=D, theta=theta, seed=seed
    ).federation


def batched_fit(fed, rounds: int, **options):
    """The benchmarks' FGPR fit (M, E above, lr 0.05) on the batched engine, evaluation off, seed 0;
    ``options`` are more of ``fedgp.fit``'s (e.g. ``stop=None``)."""
    import fedgp

    strategy = fedgp.strategies.FGPR.authors(local_steps=E, batch_size=M, lr=0.05)
    spec = fedgp.synthetic.gp_spec(D, "rbf")
    return fedgp.fit(spec, fed, strategy, engine="batched", rounds=rounds, seed=0,
                     callbacks=[fedgp.run.Evaluate(every=0)], **options)  # fmt: skip


def run_loop(fed, rounds: int) -> None:
    """The baseline a GPyTorch user writes by hand (GPyTorch's Simple_GP_Regression tutorial, per client)."""
    import gpytorch
    import torch

    class ExactGPModel(gpytorch.models.ExactGP):
        def __init__(self, train_x, train_y, likelihood):
            super().__init__(train_x, train_y, likelihood)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=D))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    models = [ExactGPModel(c.X, c.y, gpytorch.likelihoods.GaussianLikelihood()).double() for c in fed]
    global_state = {k: v.clone() for k, v in models[0].state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    for _ in range(rounds):
        states = []
        for client, model in zip(fed, models):
            model.load_state_dict(global_state)
            model.train()
            optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
            mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
            for _ in range(E):
                idx = torch.randperm(client.n, generator=gen)[:M]
                model.set_train_data(client.X[idx], client.y[idx], strict=False)
                optimizer.zero_grad()
                loss = -mll(model(client.X[idx]), client.y[idx])
                loss.backward()
                optimizer.step()
            states.append(model.state_dict())
        weights = fed.weights
        global_state = {k: sum(w * s[k] for w, s in zip(weights, states)) for k in global_state}


def worker(config: dict) -> dict:
    import torch

    torch.set_num_threads(config["threads"])
    import fedgp

    fed = make_federation(config["K"])
    if config["engine"] in ("loop", "sequential") and config.get("loop_clients"):
        fed = fed[: config["loop_clients"]]
    K = len(fed)

    def run(federation, rounds):
        if config["engine"] == "loop":
            return run_loop(federation, rounds)
        engine = config["engine"]
        if engine.startswith("batched"):
            engine = fedgp.engines.Batched(
                minibatch_dtype=torch.float32 if engine == "batched_f32" else None,
                compiled=engine != "batched_tensor",
                fused=None if engine == "batched" else False,
            )
        fedgp.fit(
            fedgp.synthetic.gp_spec(D, "rbf"),
            federation,
            fedgp.strategies.FGPR.authors(local_steps=E, batch_size=M, lr=0.05),
            rounds=rounds,
            engine=engine,
            seed=0,
            callbacks=[fedgp.run.Evaluate(every=0)],
        )

    if config.get("warmup", True):
        run(fed[:64], 1)
    start = time.perf_counter()
    run(fed, config["rounds"])
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {
        "K_run": K,
        "wall_s": wall,
        "client_steps_per_s": K * E * config["rounds"] / wall,
        "peak_rss_mb": rss,
    }


def measure(config: dict, repeats: int, root: Path = ROOT) -> dict:
    """Medians of ``repeats`` fresh worker processes; ``root``: the checkout whose fedgp they run."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [
                sys.executable,
                str(root / "benchmarks" / "engine_throughput.py"),
                "--worker",
                json.dumps(config),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": str(config["threads"])},
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {
        "client_steps_per_s": statistics.median(r["client_steps_per_s"] for r in runs),
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "K_run": runs[0]["K_run"],
    }


def _worktree(rev: str) -> Path:
    """A detached git worktree of this repository at ``rev``, in a temporary folder (kept for the
    process; ``git worktree prune`` forgets it once the folder is gone)."""
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="fedgp-baseline-")) / "fedgp"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True)
    return where


def flops_per_client_step(m: int = M, d: int = D) -> float:
    """Floating-point operations one client-step needs, forward and backward, counted from the
    compiled step (fedgp/engines/compiled.py; an exp or sqrt counts as one operation). The same
    count is used for every engine, so GFLOP/s compares useful work, not work done:

    * Gram matrix: m(m-1)/2 pairs, each 3d for the squared distance and 5 for k, k' and s·k;
    * Cholesky m³/3, triangular inverse m³/3, K⁻¹ = L⁻ᵀL⁻¹ m³/3, α = K⁻¹r 2m²;
    * gradients: per pair 9 for W, ∂/∂s and the pair's factor, and 4d for ∂/∂z.
    """
    pairs = m * (m - 1) / 2
    return pairs * (3 * d + 5) + m**3 + 2 * m * m + pairs * (9 + 4 * d)


def matmul_roofline(threads: int) -> dict:
    """Measured GFLOP/s of float64 batched (B, 32, 32) @ (B, 32, 32) and of one 2048² matmul."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    for name, a, b in (
        (
            "bmm_32",
            torch.randn(4096, M, M, dtype=torch.float64),
            torch.randn(4096, M, M, dtype=torch.float64),
        ),
        (
            "gemm_2048",
            torch.randn(2048, 2048, dtype=torch.float64),
            torch.randn(2048, 2048, dtype=torch.float64),
        ),
    ):
        flops = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
        torch.matmul(a, b)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - t)
        out[name] = flops / statistics.median(times) / 1e9
    return out


class _Tee:
    """Print and keep the lines (the .txt beside the CSV)."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per batched measurement")
    parser.add_argument(
        "--loop-clients",
        type=int,
        default=1000,
        help="run loop/sequential on at most this many clients (throughput is per client)",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["loop", "sequential", "batched_tensor", "batched_stepwise", "batched", "batched_f32"],
        help="the throughput rows to run (default: all)",
    )
    parser.add_argument("--target", action="store_true", help="also run K = 10,000, R = 100 (batched)")
    parser.add_argument("--target-repeats", type=int, default=3)
    parser.add_argument(
        "--target-runs",
        nargs="+",
        default=["batched:2", "batched:1", "batched_stepwise:2"],
        help="engine:threads of the target runs",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="K = 100 and 1,000, one repeat, loop/sequential on 100 clients, target K = 2,000 R = 10",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also run the target fits on fedgp at git revision REV (a worktree in a temporary folder), "
        "side by side: rows named engine@REV",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "engine_throughput.csv"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.quick:
        args.clients, args.repeats, args.loop_clients, args.rounds = [100, 1000], 1, 100, 2
        args.target, args.target_repeats = True, 1

    import pandas as pd

    say = _Tee()
    say(f"start: {time.strftime('%Y-%m-%d %H:%M:%S')}, {_load()}")
    say(f"command: {' '.join(sys.argv)}")
    rows = []
    for K in args.clients:
        slow_rounds = 1
        plan = [(e, 1, slow_rounds) for e in ("loop", "sequential") if e in args.engines]
        batched = ("batched_tensor", "batched_stepwise", "batched") + (() if args.quick else ("batched_f32",))
        for engine in (e for e in batched if e in args.engines):
            plan += [(engine, 1, args.rounds), (engine, 2, args.rounds)]
        for engine, threads, rounds in plan:
            config = {"K": K, "engine": engine, "threads": threads, "rounds": rounds}
            if engine in ("loop", "sequential") and args.loop_clients:
                config["loop_clients"] = min(K, args.loop_clients)
            result = measure(config, args.repeats)
            rows.append({"K": K, "engine": engine, "threads": threads, **result})
            say(
                f"K={K:>6} {engine:>16} threads={threads}: "
                f"{result['client_steps_per_s']:>10.0f} client-steps/s "
                f"(ran {result['K_run']} clients, median wall {result['wall_s']:.2f} s, peak RSS "
                f"{result['peak_rss_mb']:.0f} MB)"
            )
    if args.target:
        K_target, R_target = (2000, 10) if args.quick else (10000, 100)
        roots = {"": ROOT}
        if args.baseline:
            roots[f"@{args.baseline}"] = _worktree(args.baseline)
        for engine, threads in (run.split(":") for run in args.target_runs):
            for label, root in roots.items():
                threads = int(threads)
                config = {"K": K_target, "engine": engine, "threads": threads, "rounds": R_target}
                measure({**config, "K": 64, "rounds": 1}, 1, root)  # numba's cache filled, untimed
                result = measure({**config, "warmup": False}, args.target_repeats, root)
                name = f"{engine}_R{R_target}{label}"
                rows.append({"K": K_target, "engine": name, "threads": threads, **result})
                gflops = result["client_steps_per_s"] * flops_per_client_step() / 1e9
                say(
                    f"target K={K_target} R={R_target} {engine}{label}, {threads} thread(s): median wall "
                    f"{result['wall_s']:.1f} s of {args.target_repeats} (whole fit in a fresh process), "
                    f"{gflops:.1f} GFLOP/s, peak RSS {result['peak_rss_mb']:.0f} MB"
                )
    table = pd.DataFrame(rows)
    loop = table[table.engine == "loop"].set_index("K")["client_steps_per_s"]
    table["ratio_vs_loop"] = table["client_steps_per_s"] / table["K"].map(loop)
    if len(loop):  # target rows (a K without a loop row of its own): against the loop's median
        table["ratio_vs_loop"] = table["ratio_vs_loop"].fillna(table["client_steps_per_s"] / loop.median())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    columns = ["K", "engine", "threads", "client_steps_per_s", "ratio_vs_loop", "peak_rss_mb", "wall_s"]
    table[columns].to_csv(out, index=False, float_format="%.4g")
    say(
        f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        "torch threads as listed"
    )
    say(table[columns + ["K_run"]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    batched = table[table.engine.isin(["batched", "batched_stepwise", "batched_tensor"])]
    say("\n1 -> 2 threads (client-steps/s ratio):")
    for (K, engine), group in batched.groupby(["K", "engine"]):
        per = group.set_index("threads")["client_steps_per_s"]
        if 1 in per and 2 in per:
            say(f"  K={K:>6} {engine:>16}: {per[2] / per[1]:.2f}x")
    best = batched.groupby(["engine", "threads"])["client_steps_per_s"].max()
    roof = {t: matmul_roofline(t) for t in (1, 2)}
    flops = flops_per_client_step()
    for (engine, t), steps in best.items():
        say(
            f"{engine}, {t} thread(s): {steps * flops / 1e9:.2f} GFLOP/s achieved "
            f"({flops / 1e3:.0f} kFLOP per client-step) vs measured roofline "
            f"bmm(32x32) {roof[t]['bmm_32']:.1f} GFLOP/s, gemm(2048) {roof[t]['gemm_2048']:.1f} GFLOP/s"
        )
    say(f"end: {time.strftime('%Y-%m-%d %H:%M:%S')}, {_load()}")
    say(f"wrote {out} and {out.with_suffix('.txt')}")
    out.with_suffix(".txt").write_text("\n".join(say.lines) + "\n")


if __name__ == "__main__":
    main()
