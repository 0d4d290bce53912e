"""The ClientApp: a SuperNode's data owners are the ``*.npz`` files in ``node_config["data-path"]``
(written by ``fedgp.flower.save_npz_clients``); they are read on the node and never sent. With
``capture-dir`` in the node config, every message in and out is also kept there (an audit)."""

from fedgp.flower import capture_mod, client_app, npz_loader

from .task import spec

app = client_app(npz_loader(lambda: spec(1)), mods=[capture_mod])
