"""Multi-fidelity test functions and the federation FGPR builds from them (Yue & Kontar §5, App. §11).

Each :class:`MultiFidelityFunction` knows its input domain, its fidelity levels (ordered from the
lowest to the highest) and the paper's sample sizes. Levels are vectorised numpy functions of the
*physical* inputs, shape ``(n, d) -> (n,)``, in float64.

:func:`multifidelity_federation` turns one into FGPR's multi-fidelity setting: one client per
fidelity level (the high-fidelity client first, so ``p_1`` is the HF weight as in the paper's
Fig. 9), inputs min-max scaled to the unit cube with the *known* domain bounds (shared constants,
no data leave a client), outputs standardised per client, and 1,000 uniform HF test points
standardised with the HF *training* mean and std (the authors' code).

Formula choices (digest §2.2 and §6 items 13–15): PARK uses ``x2 + x3²`` (emukit's ``park_high``
has ``x2 + x3``, a bug); Branin's medium level takes the square root (the paper, Perdikaris et al.
2017 and emukit; the authors' R code drops it) and its low level subtracts ``3 x2`` of the
*untransformed* input; Borehole uses the paper's LF constant ``5π`` and range ``x5 ∈ [63.1, 115]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fedgp.data.client import ClientData, Federation
from fedgp.errors import InputError

__all__ = [
    "MultiFidelityFunction",
    "MultiFidelityProblem",
    "MF_FUNCTIONS",
    "TABLE1_FUNCTIONS",
    "get_function",
    "multifidelity_federation",
    "forrester",
    "nonlinear_example",
    "currin",
    "park",
    "branin",
    "hartmann3",
    "borehole",
]

LEVEL_NAMES = {2: ("low", "high"), 3: ("low", "medium", "high")}


def level_names(count: int) -> tuple[str, ...]:
    """Names of ``count`` fidelity levels, lowest first: low/high, low/medium/high, then
    low, level1, ..., level{count-2}, high (the client ids of a multi-fidelity federation)."""
    if count in LEVEL_NAMES:
        return LEVEL_NAMES[count]
    return ("low", *(f"level{i}" for i in range(1, count - 1)), "high")


def _check_x(X, d: int, name: str) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1 and d == 1:
        X = X[:, None]
    if X.ndim != 2 or X.shape[1] != d:
        raise InputError(f"{name}: X must have shape (n, {d}), got {X.shape}")
    if not np.isfinite(X).all():
        raise InputError(f"{name}: X contains NaN or inf")
    return X


# -- the functions, in physical units -----------------------------------------------------------


def _forrester_high(X: np.ndarray) -> np.ndarray:
    x = X[:, 0]
    return (6 * x - 2) ** 2 * np.sin(12 * x - 4)


def _forrester_low(X: np.ndarray) -> np.ndarray:
    return 0.5 * _forrester_high(X) + 10 * (X[:, 0] - 0.5) + 5


def _nonlinear_low(X: np.ndarray) -> np.ndarray:
    return np.cos(15 * X[:, 0])


def _nonlinear_high(X: np.ndarray) -> np.ndarray:
    x = X[:, 0]
    return x * np.exp(_nonlinear_low((2 * x - 0.2)[:, None])) - 1


def _currin_high(X: np.ndarray) -> np.ndarray:
    x1, x2 = X[:, 0], X[:, 1]
    # 1 - exp(-1 / (2 x2)) -> 1 as x2 -> 0+ (exp(-inf) = 0); guard the division.
    safe = np.where(x2 > 0, x2, 1.0)
    factor = np.where(x2 > 0, 1 - np.exp(-1 / (2 * safe)), 1.0)
    return factor * (2300 * x1**3 + 1900 * x1**2 + 2092 * x1 + 60) / (100 * x1**3 + 500 * x1**2 + 4 * x1 + 20)


def _currin_low(X: np.ndarray) -> np.ndarray:
    x1, x2 = X[:, 0], X[:, 1]
    up, down = x2 + 0.05, np.maximum(0.0, x2 - 0.05)

    def h(a, b):
        return _currin_high(np.stack([a, b], axis=1))

    return 0.25 * (h(x1 + 0.05, up) + h(x1 + 0.05, down)) + 0.25 * (h(x1 - 0.05, up) + h(x1 - 0.05, down))


def _park_high(X: np.ndarray) -> np.ndarray:
    x1, x2, x3, x4 = X.T
    # (x1/2)[sqrt(1 + (x2 + x3²) x4 / x1²) - 1] = (sqrt(x1² + (x2 + x3²) x4) - x1) / 2 for x1 > 0;
    # the right-hand side is the same number, and stays finite at the domain edge x1 = 0.
    return 0.5 * (np.sqrt(x1**2 + (x2 + x3**2) * x4) - x1) + (x1 + 3 * x4) * np.exp(1 + np.sin(x3))


def _park_low(X: np.ndarray) -> np.ndarray:
    x1, x2, x3, _ = X.T
    return (1 + np.sin(x1) / 10) * _park_high(X) - 2 * x1 + x2**2 + x3**2 + 0.5


def _branin_high(X: np.ndarray) -> np.ndarray:
    x1, x2 = X[:, 0], X[:, 1]
    b, c, t = 5.1 / (4 * np.pi**2), 5 / np.pi, 1 / (8 * np.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * np.cos(x1) + 10


def _branin_medium(X: np.ndarray) -> np.ndarray:
    x1, x2 = X[:, 0], X[:, 1]
    return 10 * np.sqrt(_branin_high(X - 2)) + 2 * (x1 - 0.5) - 3 * (3 * x2 - 1) - 1


def _branin_low(X: np.ndarray) -> np.ndarray:
    return _branin_medium(1.2 * (X + 2)) - 3 * X[:, 1] + 1


_HARTMANN_A = np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]])
_HARTMANN_P = np.array(
    [[0.3689, 0.1170, 0.2673], [0.4699, 0.4387, 0.7470], [0.1091, 0.8732, 0.5547], [0.0381, 0.5743, 0.8828]]
)
_HARTMANN_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_HARTMANN_DELTA = np.array([0.01, -0.01, -0.1, 0.1])


def _hartmann(t: int) -> Callable[[np.ndarray], np.ndarray]:
    """Level t in {1, 2, 3} (3 = HF): α_t = α + (3 − t) δ; the standard leading minus sign."""
    alpha = _HARTMANN_ALPHA + (3 - t) * _HARTMANN_DELTA

    def f(X: np.ndarray) -> np.ndarray:
        inner = ((X[:, None, :] - _HARTMANN_P[None]) ** 2 * _HARTMANN_A[None]).sum(-1)  # (n, 4)
        return -(np.exp(-inner) @ alpha)

    return f


def _borehole(numerator: float, one: float) -> Callable[[np.ndarray], np.ndarray]:
    def f(X: np.ndarray) -> np.ndarray:
        rw, r, tu, hu, tl, hl, length, kw = X.T
        log_ratio = np.log(r / rw)
        return (
            numerator
            * tu
            * (hu - hl)
            / (log_ratio * (one + 2 * length * tu / (log_ratio * rw**2 * kw) + tu / tl))
        )

    return f


# -- the container -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultiFidelityFunction:
    """A test function with several fidelity levels over a box domain.

    Args:
        name: short name (``"currin"``).
        bounds: ``(d, 2)`` lower/upper bound of each input, physical units.
        levels: one vectorised function per level, lowest fidelity first.
        paper_sizes: training-set size per level, lowest first (Table 1's LF/MF/HF read backwards).
        reference: where the formula comes from.
    """

    name: str
    bounds: np.ndarray
    levels: tuple[Callable[[np.ndarray], np.ndarray], ...]
    paper_sizes: tuple[int, ...]
    reference: str = ""
    level_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        bounds = np.asarray(self.bounds, dtype=np.float64)
        if bounds.ndim != 2 or bounds.shape[1] != 2 or not (bounds[:, 0] < bounds[:, 1]).all():
            raise InputError(f"{self.name}: bounds must be (d, 2) with lower < upper, got {bounds}")
        if len(self.levels) < 2:
            raise InputError(f"{self.name}: 2 or more fidelity levels needed, got {len(self.levels)}")
        if len(self.paper_sizes) != len(self.levels):
            raise InputError(f"{self.name}: paper_sizes needs one size per level")
        object.__setattr__(self, "bounds", bounds)
        object.__setattr__(self, "level_names", level_names(len(self.levels)))

    @property
    def d(self) -> int:
        """The input dimension."""
        return self.bounds.shape[0]

    @property
    def num_levels(self) -> int:
        """The number of fidelity levels."""
        return len(self.levels)

    def level_index(self, level: int | str) -> int:
        """``"high"``/``"medium"``/``"low"`` or an index (0 = lowest, -1 = highest)."""
        if isinstance(level, str):
            if level not in self.level_names:
                raise InputError(f"{self.name}: level must be one of {self.level_names}, got {level!r}")
            return self.level_names.index(level)
        if not -self.num_levels <= int(level) < self.num_levels:
            raise InputError(f"{self.name}: level index {level} out of range for {self.num_levels} levels")
        return int(level) % self.num_levels

    def __call__(self, X, level: int | str = "high") -> np.ndarray:
        """Evaluate a level at physical inputs ``X`` of shape ``(n, d)``."""
        return self.levels[self.level_index(level)](_check_x(X, self.d, self.name))

    def to_unit(self, X) -> np.ndarray:
        """Inputs in the function's box mapped to the unit cube."""
        lo, hi = self.bounds.T
        return (_check_x(X, self.d, self.name) - lo) / (hi - lo)

    def from_unit(self, U) -> np.ndarray:
        """Inputs in the unit cube mapped to the function's box."""
        lo, hi = self.bounds.T
        return lo + _check_x(U, self.d, self.name) * (hi - lo)

    def sample(self, n: int, rng: np.random.Generator | int) -> np.ndarray:
        """``n`` points uniform on the domain (physical units)."""
        return self.from_unit(np.random.default_rng(rng).uniform(size=(n, self.d)))

    def __repr__(self) -> str:
        return f"MultiFidelityFunction({self.name!r}, d={self.d}, levels={self.level_names})"


#: Forrester's 1-D pair (FGPR §5 Example 1): the high fidelity linear in the low one.
forrester = MultiFidelityFunction(
    "forrester",
    [[0.0, 1.0]],
    (_forrester_low, _forrester_high),
    (100, 20),
    "Forrester, Sóbester & Keane (2007); FGPR §5 Example 1 (linear)",
)
#: FGPR §5 Example 2: a 1-D pair related nonlinearly (after Cutajar et al. 2019).
nonlinear_example = MultiFidelityFunction(
    "nonlinear",
    [[0.0, 2.0]],
    (_nonlinear_low, _nonlinear_high),
    (100, 20),
    "FGPR §5 Example 2 (after Cutajar et al. 2019): y_l = cos 15x, y_h = x exp(y_l(2x - 0.2)) - 1",
)
#: CURRIN, 2-D, two levels (Table 1).
currin = MultiFidelityFunction(
    "currin",
    [[0.0, 1.0], [0.0, 1.0]],
    (_currin_low, _currin_high),
    (200, 40),
    "Currin et al. (1991); Xiong et al. (2013); FGPR App. Example 3",
)
#: PARK, 4-D, two levels (Table 1).
park = MultiFidelityFunction(
    "park",
    [[0.0, 1.0]] * 4,
    (_park_low, _park_high),
    (300, 50),
    "Park (1991); Cox et al. (2001); Xiong et al. (2013); FGPR App. Example 4 (x2 + x3²)",
)
#: BRANIN, 2-D, three levels (Table 1).
branin = MultiFidelityFunction(
    "branin",
    [[-5.0, 10.0], [0.0, 15.0]],
    (_branin_low, _branin_medium, _branin_high),
    (200, 40, 20),
    "Perdikaris et al. (2017); FGPR App. Example 5",
)
#: Hartmann-3D, three levels (Table 1).
hartmann3 = MultiFidelityFunction(
    "hartmann3",
    [[0.0, 1.0]] * 3,
    (_hartmann(1), _hartmann(2), _hartmann(3)),
    (200, 100, 50),
    "Hartmann-3D with α_t = α + (3 - t)δ (emukit; FGPR App. Example 6)",
)
#: Borehole, 8-D, two levels (Table 1).
borehole = MultiFidelityFunction(
    "borehole",
    [
        [0.05, 0.15],
        [100.0, 50000.0],
        [63070.0, 115600.0],
        [990.0, 1110.0],
        [63.1, 115.0],
        [700.0, 820.0],
        [1120.0, 1680.0],
        [9855.0, 12045.0],
    ],
    (_borehole(5 * np.pi, 1.5), _borehole(2 * np.pi, 1.0)),
    (200, 50),
    "Harper & Gupta (1983); Xiong et al. (2013); FGPR App. Example 7 (LF constant 5π, x5 ≤ 115)",
)

#: Every function by name; the five of Table 1 in the paper's row order.
MF_FUNCTIONS: dict[str, MultiFidelityFunction] = {
    f.name: f for f in (forrester, nonlinear_example, currin, park, branin, hartmann3, borehole)
}
#: The functions of the paper's Table 1, in its row order.
TABLE1_FUNCTIONS: tuple[str, ...] = ("currin", "park", "branin", "hartmann3", "borehole")


def get_function(function: str | MultiFidelityFunction) -> MultiFidelityFunction:
    """A multi-fidelity test function by its name in :data:`MF_FUNCTIONS` (a function passes through); an
    unknown name is a ``ValueError`` listing the known ones."""
    if isinstance(function, MultiFidelityFunction):
        return function
    try:
        return MF_FUNCTIONS[function]
    except KeyError:
        raise InputError(f"function must be one of {sorted(MF_FUNCTIONS)}, got {function!r}") from None


# -- the federation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultiFidelityProblem:
    """One multi-fidelity experiment: the federation and the centralised view of the same data.

    ``federation``: one client per level, **highest fidelity first** (ids ``"high"``, ``"medium"``,
    ``"low"``); the HF client carries the test set. ``levels``: the same standardised training data
    as ``(X, y)`` tensors, **lowest fidelity first** (what centralised baselines such as AR1 take).
    ``X_test``/``y_test``: unit-cube test inputs, HF values standardised with the HF training
    statistics. ``y_mean``/``y_std``: per level, lowest first (to undo the standardisation).
    """

    function: MultiFidelityFunction
    federation: Federation
    levels: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    X_test: torch.Tensor
    y_test: torch.Tensor
    y_mean: tuple[float, ...]
    y_std: tuple[float, ...]

    @property
    def hf(self) -> ClientData:
        """The high-fidelity client (the federation's first)."""
        return self.federation[0]


def multifidelity_federation(
    function: str | MultiFidelityFunction,
    sizes: Mapping[str, int] | Sequence[int] | None = None,
    n_test: int = 1000,
    seed: int = 0,
    vertices: bool = False,
) -> MultiFidelityProblem:
    """Draw a multi-fidelity experiment: uniform designs per level, one client per level.

    Args:
        function: a :class:`MultiFidelityFunction` or its name (``"currin"``).
        sizes: training points per level, as ``{"high": 40, "low": 200}`` or a sequence lowest
            first; default the paper's (``function.paper_sizes``).
        n_test: uniform HF test points (the paper: 1,000).
        seed: each level and the test set draw from their own stream of this seed.
        vertices: also give every level the 2^d corners of the domain, as the authors' R code does
            (``geozoo::cube.solid.random`` returns them with the random points; digest §1.4). Off by
            default (digest §6.12); the test set never gets them.

    Designs are independent per level (not nested).
    """
    fn = get_function(function)
    if sizes is None:
        counts = list(fn.paper_sizes)
    elif isinstance(sizes, Mapping):
        unknown = set(sizes) - set(fn.level_names)
        if unknown:
            raise InputError(f"sizes: unknown level(s) {sorted(unknown)}; {fn.name} has {fn.level_names}")
        counts = [int(sizes.get(name, default)) for name, default in zip(fn.level_names, fn.paper_sizes)]
    else:
        counts = [int(s) for s in sizes]
        if len(counts) != fn.num_levels:
            raise InputError(f"sizes: {fn.name} has {fn.num_levels} levels, got {len(counts)} sizes")
    for name, n in zip(fn.level_names, counts):
        if n < 2:
            raise InputError(f"sizes: level {name!r} needs at least 2 points, got {n}")
    if n_test < 1:
        raise InputError(f"n_test must be >= 1, got {n_test}")

    streams = np.random.SeedSequence(int(seed)).spawn(fn.num_levels + 1)
    corners = np.array(list(itertools.product([0.0, 1.0], repeat=fn.d)))
    levels, means, stds = [], [], []
    for index, n in enumerate(counts):
        U = np.random.default_rng(streams[index]).uniform(size=(n, fn.d))
        if vertices:
            U = np.vstack([U, corners])
        y = fn(fn.from_unit(U), index)
        mean, std = float(y.mean()), float(y.std())
        if not std > 0:
            raise InputError(f"sizes: level {fn.level_names[index]!r} drew constant outputs")
        levels.append((torch.from_numpy(U), torch.from_numpy((y - mean) / std)))
        means.append(mean)
        stds.append(std)
    U_test = np.random.default_rng(streams[-1]).uniform(size=(n_test, fn.d))
    y_test = torch.from_numpy((fn(fn.from_unit(U_test), -1) - means[-1]) / stds[-1])
    X_test = torch.from_numpy(U_test)

    clients = []
    for index in reversed(range(fn.num_levels)):
        X, y = levels[index]
        is_hf = index == fn.num_levels - 1
        clients.append(
            ClientData(
                X,
                y,
                id=fn.level_names[index],
                X_test=X_test if is_hf else None,
                y_test=y_test if is_hf else None,
                metadata={
                    "fidelity": fn.level_names[index],
                    "level": index,
                    "y_mean": means[index],
                    "y_std": stds[index],
                },
            )
        )
    return MultiFidelityProblem(
        fn, Federation(clients), tuple(levels), X_test, y_test, tuple(means), tuple(stds)
    )
