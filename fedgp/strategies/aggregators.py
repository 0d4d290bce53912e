"""The aggregators moved to :mod:`fedgp.aggregators`; this name stays for existing imports."""

from fedgp.aggregators import *  # noqa: F403
from fedgp.aggregators import __all__  # noqa: F401
