"""An engine written outside fedgp passes the shipped engine contract (fedgp.testing.EngineContract).

``PostalEngine`` uses only fedgp's public pieces: it subclasses :class:`fedgp.engines.Engine` (not
the in-process base), rebuilds the clients' strategy from its JSON config, posts every message to
each client as bytes (:func:`fedgp.messages.task_to_bytes`), runs the client there with
:func:`fedgp.engines.tasks.handle` on :class:`fedgp.engines.SequentialOps`, and posts the reply
back as bytes, checked against the declared fields before it counts; it releases no sum of fewer
replies than the task's ``min_contributors`` (:func:`fedgp.messages.withhold_small_sums`).
"""

from __future__ import annotations

import json

import torch

from fedgp.engines import Engine, SequentialOps, faulted_ops
from fedgp.engines.tasks import handle, reply_fields
from fedgp.errors import EngineError
from fedgp.messages import (
    Outcome,
    Record,
    Roster,
    Task,
    check_reply,
    from_config,
    record_from_bytes,
    record_to_bytes,
    task_from_bytes,
    task_to_bytes,
    withhold_small_sums,
)
from fedgp.testing import EngineContract
from fedgp.transforms import DataTransform


class PostalEngine(Engine):
    """One client at a time, every message and reply through bytes."""

    name = "postal"

    def __init__(self, spec, clients, seed=0, loopback=True):
        self.spec, self.clients, self.seed = spec, list(clients), seed
        self.model = spec.build()  # one GPyTorch model, reloaded for each client
        self.strategy = None
        self.transform = DataTransform()  # the run's, from its ``transform`` task

    def start(self, strategy, seed):
        self.seed = seed
        self.strategy = from_config(json.loads(json.dumps(strategy.client_view().to_config())))
        everyone = torch.arange(len(self.clients))
        out = self.run(Task("hello"), everyone, reply_fields("hello", self.spec, 1))
        if out.failures:
            raise EngineError(f"clients failed to register: {out.failures}")
        ids = [c.id for c in self.clients]
        return Roster(ids, out.individual["n"], out.individual["n_test"], out.individual["d"])

    def _client(self, position: int, message: bytes) -> bytes:
        """What happens at the client: read the message, answer from its own data, reply in bytes."""
        task = task_from_bytes(message)
        if task.kind == "transform":  # sent once per run: every later task is in these units
            self.transform = DataTransform.from_parts(task.shared.tensors, task.shared.settings)
        data, offset, scale = self.transform.apply(self.clients[position])
        ops = faulted_ops(SequentialOps(self.spec, self.model, data, position, task.round, self.seed), task)
        units = (torch.tensor([offset], dtype=torch.float64), torch.tensor([scale], dtype=torch.float64))
        return record_to_bytes(Record(handle(self.strategy, ops, task, units, self.transform)))

    def run(self, task, clients, fields):
        if self.strategy is None:
            raise EngineError("start(strategy, seed) must come first")
        out = Outcome.empty(fields)
        summed = {k for k, f in fields.items() if f.summed}
        replied, rows, sums = [], {k: [] for k in fields if k not in summed}, {}
        for slot, position in enumerate(torch.as_tensor(clients).tolist()):
            message = task_to_bytes(task.rows(slice(slot, slot + 1)))
            out.bytes_down += len(message)
            try:
                answer = self._client(position, message)
            except Exception as err:  # noqa: BLE001 - a client's exception is that client's failure
                first = str(err).splitlines()[0] if str(err) else ""
                out.failures[position] = f"{type(err).__name__}: {first}"
                continue
            out.bytes_up += len(answer)
            reply = record_from_bytes(answer)
            reason = check_reply(reply, fields, 1)[0]
            if reason is not None:
                out.failures[position] = f"invalid reply: {reason}"
                continue
            replied.append(position)
            for name, value in reply.tensors.items():
                if name in summed:
                    sums[name] = value[0] if name not in sums else sums[name] + value[0]
                else:
                    rows[name].append(value)
        if replied:
            out.clients = torch.tensor(replied, dtype=torch.long)  # ascending, as the clients came
            out.individual = {k: torch.cat(v) for k, v in rows.items()}
            out.sums = sums
        return withhold_small_sums(out, fields, task.min_contributors)


class TestPostalEngineContract(EngineContract):
    def make_engine(self, spec, federation, **overrides):
        return PostalEngine(spec, list(federation), **overrides)
