"""The engine contract (fedgp.testing.EngineContract) for the in-process engines."""

from fedgp.engines import Batched, Sequential
from fedgp.testing import EngineContract


class TestSequentialEngineContract(EngineContract):
    engine = Sequential()


class TestBatchedEngineContract(EngineContract):
    engine = Batched(chunk_size=3)  # several chunks, so failures are isolated within and across them
