"""The engine contract (tests/engines/contract.py) for the in-process engines."""

from tests.engines.contract import EngineContract


class TestSequentialEngineContract(EngineContract):
    engine_name = "sequential"


class TestBatchedEngineContract(EngineContract):
    engine_name = "batched"
    engine_options = {"chunk_size": 3}  # several chunks, so failures are isolated within and across them
