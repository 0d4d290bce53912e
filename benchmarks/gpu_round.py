"""The Triton round alone on a GPU: client-steps per second up to a million clients (issue 34 item 4).

    python benchmarks/gpu_round.py                                  # K = 10^4, 10^5, 10^6 on "cuda"
    python benchmarks/gpu_round.py --device cpu --clients 6 --repeats 1 --check-rows 6 \
        --out /tmp/dry.csv                                          # dry run: Triton's interpreter
    python benchmarks/gpu_round.py --registers                      # no GPU needed: sm_90 build stats

One local round of FGPR's local training (E = 5 Adam steps, minibatches of M = 32 of 64 points per
client, d = 5, scaled RBF-ARD, float64) for K clients, as one launch of
:func:`fedgp.engines.triton_round.local_round` — the federation's data (K·64 points) held in device
memory, every client's state a row (``--num-warps``: the launch's warps per program, one row
each). Timed after a warm-up launch (Triton compiles then), median of
``--repeats``, synchronised; client-steps per second = K·E / seconds. The first ``--check-rows``
rows are replayed by the CPU's fused round (numba) and the largest relative difference of the
trained states reported. Rows are appended to ``results/benchmarks/gpu_batched.csv`` (path
"triton round (kernel alone)", chunk_size = K: one launch) with the device named.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import gpytorch
import pandas as pd
import torch

OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "gpu_batched.csv"
E, M, N, D = 5, 32, 64, 5


def append(out: Path, row: dict) -> None:
    """One row appended to ``out``, its columns aligned with the file's (new columns added)."""
    frame = pd.DataFrame([row])
    if out.exists():
        frame = pd.concat([pd.read_csv(out), frame], ignore_index=True)
    frame.to_csv(out, index=False)
    shown = (f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
    print(", ".join(shown), flush=True)


def round_arguments(K: int, device: str, seed: int = 0):
    """The arguments of one round for K clients of N points (data made on the device)."""
    from fedgp import GPSpec
    from fedgp.engines import fused
    from fedgp.strategies.local import Adam, LocalTraining

    spec = GPSpec(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=D)))
    layout = fused.layout(spec)
    g = torch.Generator(device=device).manual_seed(seed)
    X = torch.rand(K * N, D, generator=g, dtype=torch.float64, device=device)
    noise = torch.randn(K * N, generator=g, dtype=torch.float64, device=device)
    y = torch.sin(6 * X[:, 0]) + X[:, 1:].sum(1) + 0.1 * noise
    sizes = torch.full((K,), N)
    raw = spec.to_raw(spec.initial_state())
    theta = torch.cat([raw[k].reshape(1, -1) for k in layout.names], 1).repeat(K, 1)
    keys = fused.minibatch_keys(seed, 0, torch.arange(K))
    local = LocalTraining(steps=E, batch_size=M, optimizer=Adam(lr=0.05))
    steps, batch = torch.full((K,), E), torch.full((K,), M)
    rows = torch.arange(K)
    return layout, X, y, rows * N, sizes, keys, steps, batch, None, rows, theta, local, 0


def registers() -> None:
    """Registers and stack per thread of the round compiled for sm_90 (H100/H200), for M = 32 and 64,
    RBF and Matérn-5/2, 4/8/16 warps: Triton's compiler, ptxas and cuobjdump run without a GPU."""
    import pathlib
    import subprocess
    import tempfile

    import triton

    from fedgp.engines import triton_round

    tool = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    print(f"triton {triton.__version__}: M, kernel, warps, registers and stack per thread")
    for m, nu, warps in ((m, nu, w) for m in (32, 64) for nu in (0, 2) for w in (4, 8, 16)):
        built = triton_round.compile_for(90, m, D, 8, nu, num_warps=warps)
        path = pathlib.Path(tempfile.mkdtemp()) / "round.cubin"
        path.write_bytes(built.asm["cubin"])
        usage = subprocess.run(
            [str(tool), "-res-usage", str(path)], capture_output=True, text=True, check=True
        )
        fields = dict(f.split(":") for f in usage.stdout.strip().splitlines()[-1].split() if ":" in f)
        kernel = "rbf" if nu == 0 else "matern52"
        print(f"M={m} {kernel} warps={warps}: registers {fields['REG']}, stack {fields['STACK']} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check-rows", type=int, default=2_000)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-warps", type=int, nargs="+", default=[0], help="0: the kernel's default")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--registers", action="store_true", help="only the sm_90 build's registers")
    args = parser.parse_args()
    if args.registers:
        return registers()
    cuda = args.device.startswith("cuda")
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    from fedgp.engines import fused, triton_round

    if "triton" not in sys.modules or not triton_round.available():
        raise SystemExit("triton is not installed: pip install 'fedgp-gpytorch[gpu]'")
    name = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for K, warps in ((K, w) for K in args.clients for w in args.num_warps):
        arguments = round_arguments(K, args.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        warps = warps or triton_round.launch_options(M)["num_warps"]
        triton_round.local_round(*arguments, num_warps=warps)  # warm-up: compiles
        sync()
        times = []
        for _ in range(args.repeats):
            began = time.perf_counter()
            theta, loss, info = triton_round.local_round(*arguments, num_warps=warps)
            sync()
            times.append(time.perf_counter() - began)
        seconds = statistics.median(times)
        rows = min(K, args.check_rows)
        layout, X, y, offsets, sizes, keys, steps, batch, given, row_client, theta0, local, rnd = arguments
        expected, _, _ = fused.local_round(
            layout, X[: rows * N].cpu(), y[: rows * N].cpu(), offsets[:rows], sizes[:rows], keys[:rows],
            steps[:rows], batch[:rows], given, row_client[:rows], theta0[:rows], local, rnd,
        )  # fmt: skip
        diff = float(((theta[:rows].cpu() - expected).abs() / expected.abs().clamp_min(1.0)).max())
        append(
            args.out,
            dict(run=1, dtype="float64", clients=K, rounds=1, device=args.device, device_name=name)
            | dict(chunk_size=K, seconds=seconds, client_steps_per_s=K * E / seconds)
            | dict(peak_gpu_mib=torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0)
            | dict(max_rel_diff_vs_cpu=diff, measured=datetime.date.today().isoformat())
            | dict(path="triton round (kernel alone)", num_warps=warps)
            | dict(failed_rows=int((info.cpu() != 0).sum())),
        )


if __name__ == "__main__":
    main()
