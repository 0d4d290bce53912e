"""Prediction, ``client_state`` and evaluation agree on every client's cluster (issue 13, defect a).

All three ask the client the same question through ``configure_personal``/``personal_state``: a
client with a fixed label (given, or set by one-shot clustering) uses its cluster; any other client
chooses the candidate with the lowest local NLL. Before, ``predict`` ignored fixed labels.
"""

import pytest
import torch

import fedgp
from fedgp.data import ClientData
from fedgp.models import minibatch_nll
from fedgp.strategies import IFCA, LocalTraining
from fedgp.strategies import clustered as C
from fedgp.synthetic import gp_federation

TRAIN = LocalTraining(steps=2, batch_size=8)
LABELS = (1, 0, 1, 1, 0, 0, 1)
ASSIGNERS = {
    "hard": IFCA(num_clusters=2, restarts=2, local_steps=2, batch_size=8),
    "soft": C.ClusteredGP(
        2, C.RandomInit(), C.SoftAssigner(), C.LocalTrainingSolver(TRAIN), C.ClusterAverage()
    ),
    "fixed_given": C.ClusteredGP(2, C.RandomInit(), C.FixedAssigner(LABELS), C.LocalTrainingSolver(TRAIN)),
    "one_shot": C.ClusteredGP(
        2, C.OneShotInit(local="train", training=TRAIN), C.FixedAssigner(), C.LocalTrainingSolver(TRAIN)
    ),
}


@pytest.fixture(scope="module")
def gp():
    return gp_federation(num_clients=7, n=[12, 20, 9, 30, 16, 25, 14], d=2, n_test=6, seed=4)


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize("name", sorted(ASSIGNERS))
def test_predict_client_state_and_evaluate_agree(gp, name, engine):
    strategy = ASSIGNERS[name]
    result = fedgp.fit(gp.spec, gp.federation, strategy, engine=engine, rounds=3, seed=2)
    table = result.evaluate().set_index("client")
    for i, client in enumerate(gp.federation):
        cluster = int(table.loc[client.id, "cluster"])
        if name == "fixed_given":
            assert cluster == LABELS[i]
        if name == "one_shot":
            assert cluster == int(result.server_state.labels[i])
        expected = result.state.index(cluster)
        for key in (i, client.id, client):  # a position, an id, the member itself
            state = result.client_state(key)
            assert all(torch.equal(state[k], expected[k]) for k in expected), (name, i, key)
            rmse = result.posterior(client.X_test, key).rmse(client.y_test)
            assert rmse == pytest.approx(table.loc[client.id, "rmse"], rel=1e-10)


def test_a_client_the_server_never_saw_chooses_by_likelihood(gp):
    """No label exists for a new client, even under fixed labels: it takes the likelier cluster."""
    # transforms=None: the likelihoods below are of the raw data
    result = fedgp.fit(gp.spec, gp.federation, ASSIGNERS["fixed_given"], rounds=2, transforms=None)
    member = gp.federation[3]
    stranger = ClientData(member.X, member.y, id="stranger")
    model = gp.spec.build()
    nll = []
    for j in range(2):
        gp.spec.load(model, result.state.index(j))
        with torch.no_grad():
            nll.append(float(minibatch_nll(model, stranger.X, stranger.y)))
    best = result.state.index(int(torch.tensor(nll).argmin()))
    chosen = result.client_state(stranger)
    assert all(torch.equal(chosen[k], best[k]) for k in best)
