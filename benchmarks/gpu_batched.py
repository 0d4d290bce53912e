"""The batched engine on a GPU against the CPU engine, float64 and float32 (issues 18, 34).

    python benchmarks/gpu_batched.py                               # K = 10,000 and 100,000, R = 10
    python benchmarks/gpu_batched.py --fused off                   # the tensor path only (issue 18)
    python benchmarks/gpu_batched.py --clients 200 --rounds 2 --repeats 1 --chunk-sizes 64 \
        --device cpu --out /tmp/dry.csv                            # a dry run without a GPU

FGPR (M = 32, d = 5, E = 5 Adam steps, RBF-ARD, 64 points per client), evaluation and transforms
off, as in the README's Performance table. For each precision and number of clients K:
``fit(..., engine=fedgp.engines.Batched(device=DEVICE, chunk_size=C, fused=...))`` for each
``--chunk-sizes`` C (clients per batched program: a GPU wants far more than the CPU's 512), and, for
K up to ``--cpu-max-clients``, the CPU batched engine (the compiled step where numba is installed)
as the baseline. Each is timed
as the median of ``--repeats`` fits after an untimed warm-up; rows give client-steps per second,
the GPU's peak memory, the largest relative difference of the final state from the CPU's, and the
path the rounds took: "triton round" (the whole local round as one Triton program,
:mod:`fedgp.engines.triton_round`; float64 with triton installed, ``--fused auto``), "tensor" (the
step-by-step tensor path), "cpu". Rows are appended to the CSV as they are measured (columns
aligned with the file's; ``--fresh`` starts it anew), so a run cut short keeps what it finished.
``benchmarks/gpu_round.py`` times the Triton round alone up to 10^6 clients.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
from gpu_round import append  # benchmarks/ is the script's directory, first on sys.path

import fedgp
from fedgp.strategies import FGPR
from fedgp.synthetic import gp_federation

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "gpu_batched.csv"
E = 5  # local Adam steps per round


def timed_fit(spec, federation, rounds: int, where: str, chunk_size: int, repeats: int, fused=None):
    """The median wall time of ``repeats`` fits after a warm-up, and the warm-up's result."""

    def fit():
        result = fedgp.fit(
            spec,
            federation,
            FGPR.authors(local_steps=E, batch_size=32),
            engine=fedgp.engines.Batched(chunk_size=chunk_size, device=where, fused=fused),
            rounds=rounds,
            transforms=None,  # the engine alone, as the CPU benchmarks measure it
            callbacks=[fedgp.run.Evaluate(every=0)],
        )
        if where.startswith("cuda"):
            torch.cuda.synchronize()
        return result

    result = fit()  # warm-up: kernels compiled, data copied
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fit()
        times.append(time.perf_counter() - began)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[512, 4096, 16384])
    parser.add_argument("--cpu-max-clients", type=int, default=10_000)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--fused", choices=["auto", "off"], default="auto")
    parser.add_argument("--fresh", action="store_true", help="replace the CSV instead of appending")
    args = parser.parse_args()
    fused = None if args.fused == "auto" else False
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        args.out.unlink(missing_ok=True)
    R = args.rounds

    def record(row: dict, result) -> None:
        path = "cpu" if row["device"] == "cpu" else "tensor"
        if getattr(result.engine, "round_module", None) == "fedgp.engines.triton_round":
            path = "triton round"
        append(args.out, row | dict(measured=datetime.date.today().isoformat(), path=path))

    for K in args.clients:
        began = time.perf_counter()
        draws = gp_federation(num_clients=K, n=64, d=5, seed=0)
        print(f"K = {K}: data drawn in {time.perf_counter() - began:.1f} s", flush=True)
        for dtype in (torch.float64, torch.float32):
            spec = fedgp.GPSpec(kernel=draws.spec.kernel, dtype=dtype)
            base = dict(dtype=str(dtype).removeprefix("torch."), clients=K, rounds=R)
            cpu_state = None
            if K <= args.cpu_max_clients:
                seconds, result = timed_fit(spec, draws.federation, R, "cpu", 512, args.repeats)
                cpu_state = result.state
                record(
                    base
                    | dict(device="cpu", device_name="cpu", chunk_size=512, seconds=seconds)
                    | dict(client_steps_per_s=K * R * E / seconds, peak_gpu_mib=0.0, max_rel_diff_vs_cpu=0.0),
                    result,
                )
            for chunk in args.chunk_sizes:
                if args.device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                seconds, result = timed_fit(
                    spec, draws.federation, R, args.device, chunk, args.repeats, fused
                )
                peak = torch.cuda.max_memory_allocated() / 2**20 if args.device.startswith("cuda") else 0.0
                diff = float("nan") if cpu_state is None else result.state.max_relative_difference(cpu_state)
                record(
                    base
                    | dict(device=args.device, device_name=name, chunk_size=chunk, seconds=seconds)
                    | dict(
                        client_steps_per_s=K * R * E / seconds, peak_gpu_mib=peak, max_rel_diff_vs_cpu=diff
                    ),
                    result,
                )
    print(pd.read_csv(args.out).to_string(index=False))


if __name__ == "__main__":
    main()
