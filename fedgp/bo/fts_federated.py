"""``FederatedFTS``: FTS whose hyper-parameters the federation learns, as federated BO learns its own.

FTS (:class:`~fedgp.bo.FTS`) is given its RBF hyper-parameters, as in the paper's experiments. A
user without a related task to fit them on has only the owners' own points, which is all that
federated BO has too. ``FederatedFTS`` learns them the way :class:`~fedgp.bo.FederatedBO` does — a
fedgp strategy over the owners' rows, ``initial_rounds`` rounds at the start and ``rounds`` more,
warm-started, after every iteration — and then runs FTS on them: the shared Fourier features are
drawn again from the same stream at the new lengthscales (the same base frequencies, rescaled), the
weight posteriors use the learned noise, and the learned constant mean is the prior mean. So FTS and
federated BO compare on the same information (issue 53, item 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gpytorch

from fedgp.bo.federated import FederatedBO
from fedgp.bo.fts import FTS
from fedgp.errors import InputError
from fedgp.models.spec import GPSpec
from fedgp.run.privacy import ClientDP
from fedgp.strategies.base import Strategy

__all__ = ["FederatedFTS"]

#: FederatedBO's options that FederatedFTS passes on (the rest are FTS's).
FIT_OPTIONS = ("initial_rounds", "engine")


def _rbf_of(spec: GPSpec) -> None:
    """Refuse a spec whose kernel is not RBF (or a ScaleKernel of one): FTS's features are RBF's."""
    kernel = spec.kernel
    base = kernel.base_kernel if isinstance(kernel, gpytorch.kernels.ScaleKernel) else kernel
    if not isinstance(base, gpytorch.kernels.RBFKernel):
        raise InputError(
            f"FederatedFTS: the spec's kernel must be an RBFKernel (or a ScaleKernel of one), whose "
            f"random Fourier features FTS samples; got {type(kernel).__name__}"
        )


class FederatedFTS(FTS):
    """FTS on hyper-parameters learned by ``strategy`` over the owners (module docstring); ``spec``'s
    kernel an RBF (ARD or not), optionally scaled; ``options``: FederatedBO's ``initial_rounds`` and
    ``engine``, FTS's ``features``, ``target_features``, ``candidates``. After :meth:`start`,
    ``fit.result`` is the latest fit (the hyper-parameters in the objectives' units: no transforms)."""

    name = "fts-federated"

    def __init__(self, spec: GPSpec, strategy: Strategy | None = None, rounds: int = 5, **options: Any):
        if isinstance(strategy, ClientDP):
            raise InputError(
                "FederatedFTS: ClientDP would cover the hyper-parameters' rounds but not the weight draws "
                "every agent shares after each iteration; use DPFTSDE for private FTS"
            )
        fit = {k: options.pop(k) for k in FIT_OPTIONS if k in options}
        super().__init__(1.0, 1.0, 1.0, **options)  # replaced by the first fit's values
        self.fit = FederatedBO(spec, strategy, rounds, **fit)
        _rbf_of(self.fit.spec)

    def _learn(self) -> None:
        """FTS's hyper-parameters from the latest fit's global state (in the objectives' units: the
        fit has no transforms)."""
        values = {name: value.detach() for name, value in self.fit.result.state.items()}

        def one(suffix: str, default: float | None):
            found = [v for n, v in values.items() if n.endswith(suffix)]
            return found[0] if found else default

        lengthscale = one("lengthscale", None).flatten()
        self.lengthscale = lengthscale.tolist() if len(lengthscale) > 1 else float(lengthscale)
        self.outputscale = float(one("outputscale", 1.0))
        self.noise = float(one("noise", None))
        self.mean = float(one("constant", 0.0))

    def start(self, loop) -> dict[str, Any]:
        extra = self.fit.start(loop)
        self._learn()
        super().start(loop)
        return extra

    def update(self, loop, iteration: int) -> dict[str, Any]:
        extra = self.fit.update(loop, iteration)
        self._learn()
        self._draw_features(loop)  # at the new hyper-parameters: the same base frequencies, rescaled
        self._share(loop, iteration)
        return extra

    def checkpoint(self, folder: Path, key: bytes | str | None = None) -> None:
        """The last federated fit (as :meth:`FederatedBO.checkpoint`)."""
        self.fit.checkpoint(folder, key)

    def resume(self, loop, iteration: int, folder: Path, key: bytes | str | None = None) -> None:
        """The last fit back, then the features and draws as ``update(iteration)`` left them."""
        self.fit.resume(loop, iteration, folder, key)
        self._learn()
        self._draw_features(loop)
        self._share(loop, iteration)

    def close(self) -> None:
        self.fit.close()
