"""A task cut off at its timeout while it runs; the engine's own one-time work not counted."""

import contextvars
import threading
import time

import gpytorch
import pytest
import torch

from fedgp.engines.deadline import Abandoned, not_counted, run_within
from fedgp.models import exact_settings

SETTING = contextvars.ContextVar("setting", default="unset")


def test_the_reply_errors_context_and_grad_mode_come_through():
    SETTING.set("caller's")
    with torch.no_grad():
        assert run_within(lambda: (SETTING.get(), torch.is_grad_enabled()), 5) == ("caller's", False)
    with pytest.raises(KeyError, match="inside"):
        run_within(lambda: {}["inside"], 5)


def test_a_task_past_its_timeout_is_abandoned_while_it_runs():
    release = threading.Event()
    with pytest.raises(Abandoned, match="no reply within 0.2 s"):
        run_within(lambda: release.wait(600), 0.2)
    assert not release.is_set()  # it was cut off, not waited for
    release.set()


def test_time_inside_not_counted_does_not_count():
    """A task that spends 0.6 s not counted and 0.1 s counted replies under a 0.4 s timeout; one that
    spends the same 0.6 s counted does not."""

    def engine_work(counted: bool):
        if counted:
            time.sleep(0.6)
        else:
            with not_counted():
                time.sleep(0.6)
        time.sleep(0.1)
        return "reply"

    assert run_within(lambda: engine_work(counted=False), 0.4) == "reply"
    with pytest.raises(Abandoned):
        run_within(lambda: engine_work(counted=True), 0.4)
    with not_counted():  # outside a task: nothing to pause
        pass


def test_exact_settings_hold_while_any_thread_is_inside():
    """A block left by one thread (an abandoned task finishing late) does not restore GPyTorch's
    defaults under another thread's block; the last one out does."""
    default = gpytorch.settings.max_cholesky_size.value()
    entered, leave = threading.Event(), threading.Event()

    def other():
        with exact_settings():
            entered.set()
            leave.wait(60)

    thread = threading.Thread(target=other)
    thread.start()
    entered.wait(60)
    with exact_settings():
        leave.set()
        thread.join(60)
        assert gpytorch.settings.max_cholesky_size.value() == 10**9
    assert gpytorch.settings.max_cholesky_size.value() == default
