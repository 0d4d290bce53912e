"""The papers' real data sets and where their files live: NASA C-MAPSS (one client per engine),
SARCOS (devices by an IID or contiguous split), and the registry every file is verified against
(``registry.json``: folder, URL, size, checksum; the data root from ``root=``, ``FEDGP_DATA`` or
the default).

Loaders hand back :mod:`fedgp.data`'s clients and federations; nothing here imports a model.
"""

from fedgp.datasets.cmapss import CMAPSS, load_cmapss
from fedgp.datasets.registry import data_root
from fedgp.datasets.sarcos import SARCOS, load_sarcos

__all__ = ["load_cmapss", "CMAPSS", "load_sarcos", "SARCOS", "data_root"]
