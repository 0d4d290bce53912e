"""Message sizes computed without writing them are the written sizes, byte for byte.

The in-process engines count a round's traffic with :func:`~fedgp.messages.task_size` and
:func:`~fedgp.messages.split_size` (from names, dtypes, shapes and settings) instead of serialising
every message. Each count here is checked against ``len(task_to_bytes(...))`` /
``len(record_to_bytes(...))``: for every task and reply of every strategy in the zoo, every task
kind (``predict`` with ``full_cov`` too), odd settings and names, empty and 0-row records,
malformed replies, and random records; a fit's ``bytes_down``/``bytes_up`` are the same with
``loopback=True`` (real bytes) as without (computed), failures and malformed replies included; and
without loopback nothing is serialised at all.
"""

import string

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import assume, given

import fedgp
from fedgp.engines.batched import BatchedEngine
from fedgp.engines.sequential import SequentialEngine
from fedgp.errors import FileFormatError, InputTypeError
from fedgp.messages import (
    KINDS,
    Field,
    Record,
    Task,
    record_size,
    record_to_bytes,
    reply_size,
    reply_structure,
    split_size,
    task_size,
    task_to_bytes,
)
from fedgp.messages import records as message_records
from fedgp.messages.container import HEADER, pack, packed_size
from fedgp.run import Faults
from fedgp.strategies import FGPR, IFCA
from fedgp.synthetic import gp_federation
from fedgp.testing.engine import Saboteur
from fedgp.testing.zoo import strategy_zoo
from tests.messages.test_records import settings_values

ZOO = strategy_zoo()


def written(record: Record) -> int:
    return len(record_to_bytes(record))


def split_written(record: Record, count: int) -> int:
    return sum(written(record.rows(slice(i, i + 1))) for i in range(count))


def check_task(task: Task, clients: int) -> None:
    assert task_size(task) == len(task_to_bytes(task)), task
    if clients:
        assert task_size(task, rows=1) == len(task_to_bytes(task.rows(slice(0, 1)))), task


def check_reply(reply: Record, clients: int, fields) -> None:
    assert record_size(reply) == written(reply), reply
    assert split_size(reply, clients) == split_written(reply, clients), reply
    if reply_structure(reply, fields, clients) is None:  # as declared: the declaration gives the size
        assert reply_size(fields, clients) == written(reply), (reply, fields)
        assert reply_size(fields) * clients == split_size(reply, clients), (reply, fields)


class Checking:
    """An in-process engine that checks the computed size of every task it is given and of every
    reply its clients return against the written size; ``kinds`` counts the tasks by kind."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kinds: dict[str, int] = {}
        self.replies = 0
        self._fields = None

    def run(self, task, clients, fields):
        check_task(task, len(clients))
        self.kinds[task.kind] = self.kinds.get(task.kind, 0) + 1
        self._fields = fields
        return super().run(task, clients, fields)

    def _reply(self, task, clients):
        reply, memory = super()._reply(task, clients)  # and what the clients staged to keep
        check_reply(reply, len(clients), self._fields)
        self.replies += 1
        return reply, memory


class CheckingSequential(Checking, SequentialEngine):
    pass


class CheckingBatched(Checking, BatchedEngine):
    pass


def fit_and_ask(engine_type, name):
    """A zoo run on a checking engine, then every question a result asks its clients."""
    data, spec, strategy, rounds = ZOO[name]
    engine = engine_type(spec, list(data.federation))
    result = fedgp.fit(spec, data.federation, strategy, rounds=rounds, engine=engine, seed=11)
    X = torch.rand(3, data.federation[0].X.shape[1], dtype=torch.float64)
    result.ask("predict", 0, X)  # through the engine (posterior predicts here, in process)
    result.ask("predict", 1, X, full_cov=True)
    result.client_state(2)
    if data.federation.has_test:
        result.evaluate()
    return engine


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_message_of_every_strategy_has_its_computed_size(name):
    """Every task (shared part and one participant's message) and every batched reply (split into
    one record per client, and as the declaration says) of a zoo run and its questions."""
    engine = fit_and_ask(CheckingBatched, name)
    assert {"hello", "train", "predict", "personal"} <= set(engine.kinds), engine.kinds
    assert engine.replies > 0


def test_every_task_kind_is_checked_on_both_engines():
    """hello, summarise, train, evaluate, predict (with full_cov) and personal, one client a chunk
    (sequential) and all in one (batched)."""
    for engine_type in (CheckingSequential, CheckingBatched):
        engine = fit_and_ask(engine_type, "fgpr_partial_sgd")
        assert set(engine.kinds) == set(KINDS), engine.kinds


# -- odd records ----------------------------------------------------------------------------------------


ODD_SETTINGS = {
    "text": 'héllo \u2028 wörld \U0001f600 "quoted" back\\slash \n\t\x00 \x7f',
    "empty": "",
    "big": 2**70,
    "negative": -(2**63),
    "tiny": 5e-324,
    "huge": 1.7976931348623157e308,
    "third": 1 / 3,
    "true": True,
    "false": False,
    "zero": 0.0,
    "minus_zero": -0.0,
    "ключ": "значение",
}


@pytest.mark.parametrize(
    "record",
    [
        Record(),
        Record({}, ODD_SETTINGS),
        Record({"x": torch.zeros(0, 3, dtype=torch.float64), "n": torch.zeros(0, dtype=torch.long)}),
        Record({"scalar": torch.tensor(1.5, dtype=torch.float64), "flag": torch.tensor(True)}),
        Record({"wide": torch.zeros(1, 200_000, dtype=torch.float64)}),  # offsets of seven digits
        Record(
            {
                "naïve/ключ": torch.zeros(2, 2, dtype=torch.float64),
                'a"b\\c': torch.zeros(2, dtype=torch.long),
                "\x00\x1f\x7f\u2028": torch.zeros(2, 1, dtype=torch.bool),
                "\U0001f600": torch.zeros(2, 0, 4, dtype=torch.float64),
            },
            ODD_SETTINGS,
        ),
    ],
    ids=["empty", "settings", "zero_rows", "no_row_dimension", "wide", "odd_names"],
)
def test_odd_records(record):
    assert record_size(record) == written(record)
    rows = {len(v) for v in record.tensors.values() if v.dim()}
    if len(rows) <= 1 and all(v.dim() for v in record.tensors.values()):
        n = rows.pop() if rows else 2
        assert split_size(record, n) == split_written(record, n)
        task = Task(
            "predict",
            7,
            Record({"s": torch.ones(4, dtype=torch.float64)}, ODD_SETTINGS),
            record,
            ODD_SETTINGS,
        )
        check_task(task, n)


def test_a_malformed_reply_is_counted_row_by_row():
    """Tensors of unequal lengths (a malformed batch reply) give the later clients' records fewer
    fields; a client's record is what ``rows`` gives it, counted as it would be written."""
    reply = Record(
        {
            "state/a": torch.zeros(5, 2, dtype=torch.float64),
            "loss": torch.zeros(2, dtype=torch.float64),
            "cluster": torch.zeros(7, dtype=torch.long),
            "none": torch.zeros(0, 3, dtype=torch.float64),
        }
    )
    for count in range(9):
        assert split_size(reply, count) == split_written(reply, count), count
    # A tensor without a row dimension cannot be split: it is counted whole in each record.
    scalar = Record({"loss": torch.tensor(0.5, dtype=torch.float64), "n": torch.zeros(3, dtype=torch.long)})
    whole = Record({"loss": scalar.tensors["loss"], "n": torch.zeros(1, dtype=torch.long)})
    assert split_size(scalar, 3) == 3 * written(whole)


def test_a_declared_reply_has_the_declared_size():
    fields = {
        "state/w": Field((3, 1)),
        "loss": Field(),
        "cluster": Field((), torch.long, bounds=(0, 1)),
        "mask": Field((4,), torch.bool),
        "moments": Field((2, 2), summed=True),
    }
    for rows in (0, 1, 5):
        reply = Record(
            {k: torch.zeros((rows, *f.shape), dtype=f.dtype) for k, f in fields.items()}, {"é": 1.5}
        )
        assert reply_size(fields, rows, {"é": 1.5}) == written(reply)
    assert reply_size({}) == written(Record())


def test_container_sizes_refuse_what_pack_refuses_and_name_unknown_dtypes():
    with pytest.raises(FileFormatError, match="reserved"):
        packed_size("record", 2, {}, {HEADER: (torch.float64, (1,))})
    with pytest.raises(InputTypeError, match="float16"):
        packed_size("record", 2, {}, {"x": (torch.float16, (1,))})


# -- random records -------------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=10)  # any code point but a lone surrogate: controls, quotes, emoji
record_dtypes = st.sampled_from([torch.float64, torch.int64, torch.bool])
dims = st.lists(st.integers(0, 4), max_size=3).map(tuple)


def zeros(dtype, shape) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


@st.composite
def records(draw, rows=None):
    """A record of random names, dtypes and shapes (with ``rows``, each with that leading dimension)."""
    tensors = draw(st.dictionaries(names, st.tuples(record_dtypes, dims), max_size=5))
    settings = draw(st.dictionaries(names, settings_values, max_size=4))
    return Record(
        {k: zeros(dtype, shape if rows is None else (rows, *shape)) for k, (dtype, shape) in tensors.items()},
        settings,
    )


@given(records())
def test_any_record_has_its_computed_size(record):
    assert record_size(record) == written(record)


@given(st.integers(0, 4).flatmap(lambda n: st.tuples(st.just(n), records(rows=n))))
def test_any_batch_of_replies_has_its_computed_size(case):
    rows, record = case
    assert split_size(record, rows) == split_written(record, rows)


@given(
    st.dictionaries(names, st.tuples(record_dtypes, st.integers(0, 6), dims), max_size=4),
    st.integers(0, 7),
)
def test_any_malformed_batch_has_its_computed_size(layout, count):
    """Leading dimensions that disagree with each other and with the number of clients."""
    record = Record({k: zeros(dtype, (n, *shape)) for k, (dtype, n, shape) in layout.items()})
    assert split_size(record, count) == split_written(record, count)


@given(
    st.sampled_from(KINDS),
    st.integers(-(2**40), 2**40),
    st.integers(0, 4).flatmap(lambda n: st.tuples(st.just(n), records(rows=n), records())),
    st.dictionaries(names, settings_values, max_size=3),
)
def test_any_task_has_its_computed_size(kind, rnd, parts, options):
    rows, personal, shared = parts
    assume(not set(shared.tensors) & set(personal.tensors))
    check_task(Task(kind, rnd, shared, personal, options), rows)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),  # NaN and inf too
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
any_dtype = st.sampled_from([torch.float64, torch.float32, torch.int64, torch.int32, torch.uint8, torch.bool])


@given(
    st.text(max_size=8),
    st.integers(0, 10**6),
    st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=6), json_values, max_size=4),
    st.dictionaries(names, st.tuples(any_dtype, dims), max_size=6),
)
def test_any_payload_has_its_computed_size(format, version, header, layout):
    """The container's own sizes, for every dtype it lays out (float32 and int32 too, which records
    do not carry) and any JSON header (nested lists and objects, NaN, unicode)."""
    assume(HEADER not in layout)
    tensors = {k: zeros(dtype, shape) for k, (dtype, shape) in layout.items()}
    shapes = {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}
    assert packed_size(format, version, header, shapes) == len(pack(format, version, header, tensors))


def test_padding_is_counted_at_every_offset():
    """The JSON table is padded to a multiple of 8 bytes: names of every length modulo 8."""
    for length in range(1, 17):
        record = Record({"x" * length: torch.zeros(1, dtype=torch.float64)})
        assert record_size(record) == written(record)


# -- the engines' traffic -------------------------------------------------------------------------------

GP = gp_federation(num_clients=7, n=[12, 20, 9, 30, 16, 25, 14], d=2, n_test=6, seed=4)
TRAFFIC = {
    "fgpr_partial": (FGPR(local_steps=1, batch_size=8, clients_per_round=4), None),
    "ifca": (IFCA(num_clusters=2, restarts=2, local_steps=1, batch_size=8), None),
    "nan_replies_and_failures": (
        Saboteur(local_steps=1, batch_size=8, victim=2, how="nan"),
        Faults(simulate=0.3),
    ),
    "misshapen_replies": (Saboteur(local_steps=1, batch_size=8, victim=4, how="shape"), None),
}


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize("name", sorted(TRAFFIC))
def test_history_bytes_are_the_same_computed_and_written(engine, name):
    """A fit's bytes down and up per round are the same with loopback (every message and reply
    written and read back) as without (computed), invalid and misshapen replies and failed clients
    included."""
    strategy, faults = TRAFFIC[name]
    direct, wired = (
        fedgp.fit(
            GP.spec,
            GP.federation,
            strategy,
            rounds=3,
            engine=fedgp.engines.ENGINES[engine](loopback=loopback),
            faults=faults,
            seed=2,
        )
        for loopback in (False, True)
    )
    for column in ("bytes_down", "bytes_up"):
        assert direct.history[column].tolist() == wired.history[column].tolist(), column
        assert (direct.history[column] > 0).all()
    if isinstance(strategy, Saboteur):
        assert len(direct.failures), "the saboteur's replies should have failed"
        assert direct.failures["reason"].str.contains("invalid reply").any()


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_nothing_is_serialised_in_process(engine, monkeypatch):
    """Without loopback a fit and the questions after it write no message; with it they do."""
    calls = []
    real = message_records.pack

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(message_records, "pack", counting)
    for loopback in (False, True):
        calls.clear()
        result = fedgp.fit(
            GP.spec,
            GP.federation,
            FGPR(local_steps=1, batch_size=8),
            rounds=2,
            engine=fedgp.engines.ENGINES[engine](loopback=loopback),
        )
        result.predict(GP.federation[0].X[:3], client=0)
        result.evaluate()
        assert bool(calls) == loopback, (loopback, len(calls))
