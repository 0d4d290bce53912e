"""A Flower mod that makes a node slow on purpose: to try a server that does not wait for it.

With ``train-delay`` (seconds, a number >= 0) in a SuperNode's ``node_config``, the node waits that
long before it trains on each train message: a straggler on demand, for trying
``Asynchronous(..., speeds="measured")`` against a synchronous run on real nodes (the deployment
test slows one of its three). Every other message, and a node without the key, passes untouched.
A value that is not a number >= 0 fails the message with the reason, as any node error does.
"""

from __future__ import annotations

import math
import time

from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable

from fedgp.errors import InputError

__all__ = ["delay_mod", "KEY"]

#: The node-config key: seconds to wait before each train task.
KEY = "train-delay"


def delay_mod(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower client mod: wait ``train-delay`` seconds (node config) before a train message."""
    value = context.node_config.get(KEY)
    if value is not None and message.metadata.message_type == "train":
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
            raise InputError(f"node config {KEY!r} must be a number of seconds >= 0, got {value!r}")
        time.sleep(seconds)
    return call_next(message, context)
