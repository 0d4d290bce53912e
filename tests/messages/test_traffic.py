"""The "What leaves a client" table of docs/protocol.md is what clients send: every row is run and checked.

A recording engine wraps ``sequential`` and keeps, for every exchange, the declared reply fields
and the replies that reached the server (individual rows and sums). Each table row names a
strategy, a round, fields, a symbolic shape and a kind; the recorded rounds of that strategy must
consist of exactly those fields, with those shapes and kinds.
"""

import re
from collections import defaultdict
from pathlib import Path

import gpytorch
import torch

import fedgp
from fedgp import GPSpec
from fedgp.engines.sequential import SequentialEngine
from fedgp.models import ZeroKernel
from fedgp.run import ClientDP
from fedgp.strategies import (
    FGPR,
    IFCA,
    Asynchronous,
    FederatedClustering,
    LocalTraining,
    MomentDescentInit,
    MomentumClustering,
)
from fedgp.strategies import clustered as C
from fedgp.synthetic import gaussian_mixed_regression, gp_federation

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


class RecordingEngine(SequentialEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = []

    def run(self, task, clients, fields):
        out = super().run(task, clients, fields)
        stage = task.shared.settings.get("stage")
        phase = task.shared.settings.get("phase")
        if task.kind == "train" and phase == "init":
            kind = f"init: {stage}" if stage else "init"
        elif task.kind == "summarise":
            kind = f"summarise: {stage}"
        else:
            kind = task.kind
        received = {k: tuple(v.shape[1:]) for k, v in out.individual.items()}
        received.update({k: tuple(v.shape) for k, v in out.sums.items()})
        self.log.append((kind, dict(fields), received))
        return out


def readme_rows():
    text = PROTOCOL.read_text().split("## What leaves a client", 1)[1]
    rows = defaultdict(list)
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("strategy", "---"):
            if rows and not line.startswith("|"):
                break
            continue
        strategy, rnd, names, shape, kind = cells
        tokens = [t.strip() for t in shape.strip("()").split(",") if t.strip()]
        for name in re.findall(r"`([^`]+)`", names):
            rows[strategy].append((rnd, name, tokens, kind))
    return rows


def symbolic(name, spec):
    for p in spec.params:
        if name.endswith("/" + p.name):
            return name[: -len(p.name)] + "<θ>", tuple(p.shape)
    return name, ()


def check(strategy_row, engine, spec, symbols, rows):
    expected = defaultdict(dict)
    for rnd, name, tokens, kind in rows[strategy_row] + rows["every strategy"]:
        expected[rnd][name] = (tokens, kind)
    seen = set()
    for rnd, fields, received in engine.log:
        if rnd not in expected:
            continue
        seen.add(rnd)
        got = {}
        for name, field in fields.items():
            short, event = symbolic(name, spec)
            assert received.get(name) == field.shape, f"{strategy_row}: {name} declared {field.shape}"
            got.setdefault(short, []).append((field.shape, event, "summed" if field.summed else "individual"))
        assert set(got) == set(expected[rnd]), f"{strategy_row} / {rnd}: {sorted(got)} vs docs/protocol.md"
        for short, entries in got.items():
            tokens, kind = expected[rnd][short]
            for shape, event, actual_kind in entries:
                assert actual_kind == kind, f"{strategy_row} / {rnd} / {short}: {actual_kind}"
                dims = list(shape)
                if tokens and tokens[-1] == "θ":
                    assert tuple(dims[len(dims) - len(event) :]) == event
                    dims, want = dims[: len(dims) - len(event)], tokens[:-1]
                else:
                    want = tokens
                assert len(dims) == len(want), f"{strategy_row} / {rnd} / {short}: {shape} vs {tokens}"
                for token, n in zip(want, dims):
                    if token in symbols:
                        assert symbols[token] == n, f"{strategy_row} / {rnd} / {short}: {token} = {n}"
    own = {rnd for rnd, *_ in rows[strategy_row]}
    assert own <= seen, f"{strategy_row}: rounds {sorted(own - seen)} never happened"


def run(data, spec, strategy, rounds):
    engine = RecordingEngine(spec, data.federation)
    result = fedgp.fit(spec, data.federation, strategy, engine=engine, rounds=rounds)
    # After training: a prediction at server-chosen points and a client's own state (every strategy's rows).
    result.predict(torch.rand(3, data.federation[0].X.shape[1], dtype=torch.float64), client=0)
    result.client_state(1)
    return engine


def linear(d=4):
    noise = "likelihood.noise_covar.noise"
    return GPSpec(
        kernel=ZeroKernel(),
        mean=gpytorch.means.LinearMean(d, bias=False),
        initial_values={noise: 0.04, "mean_module.weights": torch.zeros(d, 1)},
        fixed=[noise],
    )


def test_readme_traffic_table_is_what_clients_send():
    rows = readme_rows()
    gp = gp_federation(num_clients=6, n=[20, 25, 30, 18, 22, 27], d=2, n_test=5, seed=3)
    mr = gaussian_mixed_regression(k=3, d=4, sizes=[30] * 6 + [6, 8, 9, 5, 7, 6], noise=0.2, n_test=4, seed=5)
    train = LocalTraining(steps=2, batch_size=8)
    R, k = 2, 3
    gp_cases = {
        "FGPR": FGPR(batch_size=8),
        "FGPR, asynchronous (`Asynchronous(FGPR())`)": Asynchronous(
            FGPR(batch_size=8), buffer=3, speeds=(1.0, 2.0, 0.5, 1.0, 3.0, 0.2)
        ),
        "clustered, hard assignment (IFCA model averaging)": IFCA(num_clusters=k, restarts=R, batch_size=8),
        "clustered, soft assignment": C.ClusteredGP(
            k, C.RandomInit(), C.SoftAssigner(), C.LocalTrainingSolver(train), restarts=R
        ),
        "clustered, gradient averaging (IFCA option I)": IFCA(
            num_clusters=k, restarts=R, aggregation="gradient"
        ),
        "clustered, fixed labels": C.ClusteredGP(
            k, C.RandomInit(), C.FixedAssigner((0, 1, 2, 0, 1, 2)), C.LocalTrainingSolver(train), restarts=R
        ),
        "one-shot initialisation, local training": C.ClusteredGP(
            k, C.OneShotInit(local="train", training=train), C.FixedAssigner(), C.LocalTrainingSolver(train)
        ),
    }
    engine = RecordingEngine(gp.spec, gp.federation)
    fedgp.fit(gp.spec, gp.federation, ClientDP(FGPR(batch_size=8), noise=1.0, delta=1e-3), engine=engine,
              rounds=2)  # fmt: skip
    check("FGPR with ClientDP", engine, gp.spec, {}, rows)
    gp_cases["Federated-Clustering"] = FederatedClustering(lr=0.05, group_size=4)
    gp_cases["Momentum- and Myopic-Clustering"] = MomentumClustering(lr=0.05, num_clusters=2)
    covered = {"every strategy", "FGPR with ClientDP"}
    for row, strategy in gp_cases.items():
        engine = run(gp, gp.spec, strategy, 2)
        check(row, engine, gp.spec, {"R": 1 if "one-shot" in row else R, "k": k, "s": 4, "d": 2}, rows)
        covered.add(row)
    spec = linear()
    p, H = 4, 5
    one_shot = run(mr, spec, C.one_shot(k), 2)
    check("one-shot initialisation, least squares", one_shot, spec, {"p": p, "R": 1}, rows)
    covered.add("one-shot initialisation, least squares")
    phase1 = MomentDescentInit(num_anchors=H, iterations=2, anchor_pool="all", subspace_rank=2, delta=50.0)
    orth = MomentDescentInit(
        num_anchors=H, iterations=1, anchor_pool="all", subspace="orth_iter", orth_iters=2
    )
    symbols = {"p": p, "H": H, "p(p+1)/2": p * (p + 1) // 2, "r": 2}
    for init in (phase1, orth):
        strategy = C.two_phase(k, phase1=init)
        engine = run(mr, spec, strategy, strategy.init_rounds + 1)
        for row in rows:
            if row.startswith("two-phase Phase 1"):
                rounds = {r for r, *_ in rows[row]}
                if any(kind == r for kind, _, _ in engine.log for r in rounds):
                    check(row, engine, spec, symbols if init is phase1 else {**symbols, "r": k}, rows)
                    covered.add(row)
    assert covered == set(rows), f"docs/protocol.md rows never run: {sorted(set(rows) - covered)}"
