"""A Flower mod that keeps every message a node receives and sends, as Flower serialises them.

With ``capture-dir`` in a SuperNode's ``node_config``, each incoming message and each reply is
written there (``<node>-<type>-<uuid>-in.bin`` / ``-out.bin``: the message's Flower objects,
deflated, one after the other): an audit of exactly what reached and left the node. Without it
the mod does nothing.
"""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

__all__ = ["capture_mod", "message_bytes"]


def message_bytes(message: Message) -> bytes:
    """A message's Flower objects, deflated, concatenated (what Flower transports for it)."""
    return b"".join(obj.deflate() for obj in get_all_nested_objects(message).values())


def capture_mod(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower client mod: with ``capture-dir`` in the node's config, write every message the node receives
    and every reply it sends there; otherwise pass the message on untouched."""
    folder = context.node_config.get("capture-dir")
    if not folder:
        return call_next(message, context)
    folder = Path(str(folder))
    folder.mkdir(parents=True, exist_ok=True)
    n = f"{context.node_id}-{message.metadata.message_type}-{uuid4().hex}"  # apps may run in fresh processes
    (folder / f"{n}-in.bin").write_bytes(message_bytes(message))
    reply = call_next(message, context)
    (folder / f"{n}-out.bin").write_bytes(message_bytes(reply))
    return reply
