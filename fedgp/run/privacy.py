"""``ClientDP``: client-level differential privacy as a wrapper of the strategy, with its accountant.

``fit(spec, fed, ClientDP(FGPR(), epsilon=2, delta=1e-5, clip=0.5), rounds=R)`` — the strategy
wrapped, as Flower's ``DifferentialPrivacyServerSideFixedClipping(strategy, ...)`` wraps one — trains
:class:`~fedgp.strategies.private.DPFGPR` (clipped updates, summed; Gaussian noise on the sum;
Poisson sampling at ``rate``) with the noise multiplier calibrated so that the R rounds cost at
most ε at the given δ: the guarantee is about any one *client* (all of an owner's rows at once),
against anyone who sees the released hyper-parameters — the history, the result, the server's
state — assuming the server adds the noise honestly (central DP).

What it wraps is judged by what the strategy declares
(:meth:`~fedgp.strategies.Strategy.reply_fields`), not by its name (:func:`refusal`): DP-FedAvg bounds
one client's *update* of FGPR's round, so the strategy must be an FGPR that keeps FGPR's round — every
individual field of its training reply is FGPR's trained state or loss, which DPFGPR replaces by
the clipped update (summed, then noised); its plan, aggregation and client update are FGPR's own,
which DPFGPR replaces; and its aggregator the mean. That every field is summed is not enough: a
sum the server sees is released as it is, and nothing bounds one client's share of it.

The accounting is Google's ``dp-accounting`` (the library Flower's DP wraps), never fedgp's own
arithmetic: a round is ``PoissonSampledDpEvent(rate, GaussianDpEvent(noise))`` (a
``GaussianDpEvent`` when everyone takes part), R rounds their self-composition, under the Rényi
DP accountant, add-or-remove-one-client neighbours. Every row of ``result.history`` has
``epsilon``, the budget spent after that round. Given both ``noise`` and ``epsilon``, the run
stops, with a :class:`~fedgp.errors.PrivacyBudgetWarning`, after the last round the budget affords
(its state is the result), so no row's ε is above the budget; a budget that affords no round is
refused before the first, naming the noise multipliers that fit (:meth:`ClientDP.check_budget`).
On an engine that releases no sum of fewer than two nodes (secure aggregation on Flower), a round
whose sample or surviving nodes fall short is skipped, not the end of the run, and still accounted;
with sampling such a run is accounted without amplification (:meth:`ClientDP.accounted_rate` gives
the argument; ``history.attrs["privacy"]["accounted_rate"]``).

What else would leave a client is closed or refused: the transforms send nothing (``"auto"``
becomes each client's own standardisation and the inputs as they are; ``Normalize(bounds=...)``
with known bounds is allowed; transforms that need the federation's statistics are refused), no
loss or size is replied, and per-client test metrics are not computed unless you ask
(``Evaluate`` is then outside the guarantee, as are predictions, which condition on a client's
own data on its own machine).
"""

from __future__ import annotations

import logging
import math
import numbers
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import lru_cache

import torch

from fedgp.errors import InputError, InputTypeError, PrivacyBudgetWarning, import_extra
from fedgp.messages import ServerContext
from fedgp.models.spec import GPSpec
from fedgp.run.callbacks import Callback
from fedgp.strategies.base import Strategy
from fedgp.strategies.fgpr import FGPR
from fedgp.strategies.private import DPFGPR
from fedgp.transforms import Normalize, Standardize, Transforms

__all__ = ["ClientDP", "PrivacyAccounting", "epsilon_spent", "calibrate_noise", "refusal"]

#: FGPR's methods that DPFGPR does not call but replaces by its own: a strategy that overrides one
#: would lose what it does there.
REPLACED = ("configure", "aggregate", "local_update")

#: What ClientDP covers, said in every refusal.
COVERS = (
    "ClientDP covers FGPR's round: DPFGPR replaces each participant's trained state and loss by its "
    "clipped update, a summed field, and noises the sum"
)


def _names(names: list[str], most: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def probe_context(spec: GPSpec, num_clients: int = 2) -> ServerContext:
    """A server context of ``num_clients`` equal clients for ``spec``: enough to ask a strategy
    what its replies declare before any client has registered."""
    k = max(int(num_clients), 1)
    sizes = torch.ones(k, dtype=torch.long)
    return ServerContext(spec, sizes, sizes.to(torch.float64) / k, list(range(k)), 0)


def refusal(strategy: Strategy, ctx: ServerContext) -> str | None:
    """Why ClientDP cannot make ``strategy`` private (``"ClientDP does not apply to <class>: ..."``),
    or ``None``. Derived from what the strategy declares, in this order:

    1. its training reply (:meth:`~fedgp.strategies.Strategy.reply_fields`) has an *individual*
       field other than FGPR's trained state and loss: the server would see it as each client sent
       it, outside the noise on the sum;
    2. it is not an :class:`~fedgp.strategies.FGPR`: DPFGPR runs FGPR's local training from the
       broadcast state and clips the change it makes; summed fields alone bound no client's share
       of their sum, which is what the noise is calibrated to;
    3. it overrides FGPR's ``configure``, ``aggregate`` or ``local_update``, which DPFGPR replaces by
       its own (its plan: Poisson sampling, the same fixed weight for everyone): what it does there
       would be silently dropped;
    4. its ``aggregator`` is given: a robust rule looks at each client's reply;
    5. every trainable hyper-parameter is ``personal``: there is no shared update.

    Other ``personal`` hyper-parameters are covered: they stay with their owners, and DPFGPR clips and
    noises the shared ones' update only (:mod:`fedgp.strategies.private`). DPFGPR's own checks
    follow (the mean in raw space, no ``clients_per_round``)."""
    name = type(strategy).__name__
    declared = strategy.reply_fields(ctx)
    fgpr = FGPR().reply_fields(ctx)  # what DPFGPR replaces by the clipped update
    individual = [n for n, f in declared.items() if not f.summed and fgpr.get(n) != f]
    summed = [n for n, f in declared.items() if f.summed]
    replaced = [m for m in REPLACED if getattr(type(strategy), m) is not getattr(FGPR, m)]
    if individual:
        noun = "field" if len(individual) == 1 else "fields"
        why = (
            f"its training reply declares the individual {noun} {_names(individual)}, which the noise "
            f"on the sum does not cover ({COVERS})"
        )
    elif not isinstance(strategy, FGPR):
        why = f"it is not an FGPR, whose local training DPFGPR runs and clips ({COVERS})"
        if summed:
            why += f"; its summed fields {_names(summed)} bound no client's share of their sum"
    elif replaced:
        why = (
            f"it overrides FGPR's {' and '.join(replaced)}, which DPFGPR replaces by its own (Poisson "
            "sampling at rate q, the same fixed weight 1/(qK) for every participant, the clipped update, "
            "the noised mean): what it changes there would be silently dropped"
        )
    elif strategy.aggregator is not None:
        name = f"{name}(aggregator={strategy.aggregator!r})"
        why = (
            "a robust rule looks at each client's reply (a median, Krum), which the noise on the sum does "
            "not cover; the clipping already bounds any one client's influence"
        )
    elif strategy.personal and not set(ctx.spec.trainable_names) - strategy.personal_names(ctx.spec):
        name = f"{name}(personal={strategy.personal!r})"
        why = (
            "every trainable hyper-parameter is personal, so there is no shared update to clip and noise: "
            "each owner trains alone (fit it without ClientDP, or leave some hyper-parameter shared)"
        )
    else:
        return None
    return f"ClientDP does not apply to {name}: {why}"


@contextmanager
def _absl_contained(quiet: bool = True):
    """Around every call into dp-accounting, which logs through absl.

    ``quiet``: below ERROR, absl's records are dropped (a calibration trying small noise multipliers
    logs every RDP order it excludes; the orders it keeps give the answer, so the log is noise to a
    user). And whatever the level, absl's logging functions call ``logging.basicConfig()`` when the
    root logger has no handler, before they look at the record's level: one call into
    dp-accounting would leave a stderr handler on the root logger of the whole process, and every
    record of a logger that has a handler of its own and propagates to the root (Flower's: each
    ``flwr log`` line) would then print twice. The handlers the call added to the root logger are
    removed again."""
    logger = logging.getLogger("absl")
    level = logger.level
    before = list(logging.root.handlers)
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
        for handler in [h for h in logging.root.handlers if h not in before]:
            logging.root.removeHandler(handler)
            handler.close()


def _dp_accounting(module: str = "dp_accounting"):
    """``module`` of dp-accounting, or fedgp's one-line error naming the ``privacy`` extra."""
    return import_extra(module, "ClientDP")


def _accountant():
    return _dp_accounting("dp_accounting.rdp").RdpAccountant()


def _event(noise: float, rate: float, rounds: int = 1):
    dp_accounting = _dp_accounting()
    one = dp_accounting.GaussianDpEvent(noise)
    if rate < 1.0:
        one = dp_accounting.PoissonSampledDpEvent(rate, one)
    return one if rounds == 1 else dp_accounting.SelfComposedDpEvent(one, rounds)


@lru_cache(maxsize=64)
def _one_round(noise: float, rate: float):
    """The RDP accountant after one round: its orders and RDP curve (a round with q < 1 takes the
    library about 70 ms, so a run's rounds reuse it)."""
    accountant = _accountant()
    with _absl_contained():
        accountant.compose(_event(noise, rate))
    return accountant


def epsilon_spent(noise: float, rate: float, rounds: int, delta: float) -> float:
    """ε at ``delta`` after ``rounds`` rounds of the sampled Gaussian mechanism (noise multiplier
    ``noise``, Poisson rate ``rate``), by dp-accounting's RDP accountant; ``inf`` without noise.

    RDP composes by addition, so ``rounds`` rounds are the one-round curve times ``rounds``, and
    ε is the library's own ``compute_epsilon`` of it: what its accountant's ``get_epsilon``
    returns after composing the rounds (a test checks the two agree)."""
    if rounds == 0:
        return 0.0
    if noise == 0:
        return math.inf
    compute_epsilon = _dp_accounting("dp_accounting.rdp.rdp_privacy_accountant").compute_epsilon
    one = _one_round(float(noise), float(rate))
    with _absl_contained(quiet=False):
        return float(compute_epsilon(one._orders, rounds * one._rdp, delta)[0])  # noqa: SLF001


def calibrate_noise(epsilon: float, delta: float, rate: float, rounds: int) -> float:
    """The smallest noise multiplier whose ``rounds`` rounds at ``rate`` cost at most ``epsilon``
    at ``delta`` (dp-accounting's ``calibrate_dp_mechanism``, to 1e-4, rounded up)."""
    dp_accounting = _dp_accounting()
    with _absl_contained():
        noise = dp_accounting.calibrate_dp_mechanism(
            _accountant, lambda z: _event(z, rate, rounds), epsilon, delta, tol=1e-4
        )
    return float(noise) + 1e-4  # the bracket's upper side: never above the target


@dataclass(frozen=True)
class ClientDP:
    """``strategy`` with client-level differential privacy: pass it to ``fit`` as the strategy,
    ``fit(spec, fed, ClientDP(FGPR(), epsilon=2.0), rounds=R)`` (module docstring).

    Args:
        strategy: the strategy made private: an :class:`~fedgp.strategies.FGPR` (``None``: FGPR's
            defaults). Others are refused, saying why (:func:`refusal`).
        epsilon: the budget ε for the whole run. With ``noise=None``, the noise multiplier is
            calibrated so that all ``rounds`` cost ε; with ``noise``, the run stops when the next
            round would pass it, and is refused before it starts when the first would.
        delta: δ; must be below 1/K (K clients), or releasing one client's data outright would be
            within the guarantee.
        clip: C, the L2 bound on a client's update per round (GPyTorch's raw parameters of the
            standardised model; an FGPR step's update is of order ``lr`` times a per-point gradient),
            over the shared hyper-parameters: personal ones stay with their owners, unreleased, so
            C is the sensitivity the accountant assumes either way.
        noise: z, the noise multiplier (std of the noise on the sum: z C); ``None`` to calibrate.
        rate: q, each client's probability of joining a round (Poisson sampling); 1 = everyone.
            Sampling amplifies privacy: at q < 1 a round costs much less than at q = 1.
        reproducible: draw the noise from the run's seed (tests, benchmarks); voids the guarantee.
        noise_at: ``"server"`` (central DP: the server adds the noise, trusted with the un-noised
            sum) or ``"clients"`` (distributed DP: each participant adds its share; with
            :class:`fedgp.flower.SecureAggregation` the server never sees an un-noised sum).
        noise_shares: with ``"clients"``, the fewest contributions whose shares make the full noise
            (each adds 1/``noise_shares`` of its variance); a round with fewer is topped up by the
            server (history column ``noise_topup``). Around the smallest number of participants a
            round should have, e.g. ``rate * K / 2``.
    """

    strategy: Strategy | None = None
    epsilon: float | None = None
    delta: float = 1e-5
    clip: float = 0.5
    noise: float | None = None
    rate: float = 1.0
    reproducible: bool = False
    noise_at: str = "server"
    noise_shares: int | None = None

    def __post_init__(self) -> None:
        if self.strategy is None:
            object.__setattr__(self, "strategy", FGPR())
        if not isinstance(self.strategy, Strategy):
            raise InputTypeError(
                "ClientDP's first argument is the strategy it makes private, e.g. "
                f"ClientDP(FGPR(), epsilon=2.0); got {self.strategy!r} ({type(self.strategy).__name__})"
            )
        for name in ("epsilon", "noise"):
            value = getattr(self, name)
            if value is not None and (not _real(value) or value < 0 or (name == "epsilon" and value == 0)):
                raise InputError(f"ClientDP({name}=...) must be a finite number > 0, got {value!r}")
        if self.epsilon is None and self.noise is None:
            raise InputError("ClientDP needs epsilon (the noise is calibrated to it), noise, or both")
        if not _real(self.delta) or not 0 < self.delta < 1:
            raise InputError(f"ClientDP(delta=...) must be in (0, 1), got {self.delta!r}")
        if not _real(self.clip) or self.clip <= 0:
            raise InputError(f"ClientDP(clip=...) must be a finite number > 0, got {self.clip!r}")
        if not _real(self.rate) or not 0 < self.rate <= 1:
            raise InputError(f"ClientDP(rate=...) must be a probability in (0, 1], got {self.rate!r}")
        if self.noise_at not in ("server", "clients"):
            raise InputError(f"ClientDP(noise_at=...) must be 'server' or 'clients', got {self.noise_at!r}")
        if self.noise_at == "clients" and self.noise_shares is None:
            raise InputError(
                "ClientDP(noise_at='clients') needs noise_shares: the fewest contributions whose noise "
                "shares make the full noise (e.g. rate * K / 2)"
            )
        if self.noise_at == "server" and self.noise_shares is not None:
            raise InputError("ClientDP(noise_shares=...) applies only with noise_at='clients'")
        _dp_accounting()  # the accountant's library, checked where the option is made: before any round

    def accounted_rate(self, min_nodes_per_sum: int = 1) -> float:
        """The sampling rate the accountant may use: ``rate``, or 1 (no amplification by sampling)
        when clients are sampled and the engine releases no sum of fewer than
        ``min_nodes_per_sum`` > 1 nodes (secure aggregation on Flower).

        On such an engine a round whose sample holds fewer nodes is **skipped**: the server state
        stays as it was, the history row says ``skipped`` and the failures why, and the round is
        accounted (its sampling happened). Whether a round is skipped depends only on which clients
        were sampled and which nodes answered, never on a client's data, and a skipped round releases
        nothing computed from data; a round that runs releases one noised sum in which any client's
        clipped update appears at most once. Between two federations of the same owners (the roster
        is public: registration is outside the guarantee) that differ in one owner's data, every
        round is therefore within the bound of the Gaussian mechanism of noise multiplier z, which
        is what is accounted. Amplification by sampling cannot be claimed: it needs who was sampled
        to stay hidden, and that a round ran tells that enough nodes were sampled, a given owner's
        node more likely among them than ``rate`` (on 3 nodes at rate 0.5 a round that runs holds a
        given node with probability 0.75). At rate 1 nothing changes (every round is the Gaussian
        mechanism already).

        Topping such a round up instead was refused: adding nodes that were not sampled changes who
        takes part in it (the sampling the accountant assumes), and adding nodes that contribute
        zeros lets the server, which knows the sample, read the one sampled node's own sum, which
        secure aggregation exists to prevent."""
        return self.rate if min_nodes_per_sum <= 1 else 1.0

    def build(
        self, spec: GPSpec, rounds: int, accounted_rate: float | None = None, num_clients: int = 2
    ) -> DPFGPR:
        """The strategy a run trains: :class:`~fedgp.strategies.private.DPFGPR` around ``strategy``,
        the noise calibrated for ``rounds`` (at ``accounted_rate``, by default ``rate``) unless
        given. A strategy the analysis does not cover is refused, saying why (:func:`refusal`, asked
        of ``spec`` on ``num_clients`` clients)."""
        why = refusal(self.strategy, probe_context(spec, num_clients))
        if why is not None:
            raise InputError(why)
        account = self.rate if accounted_rate is None else accounted_rate
        noise = (
            self.noise
            if self.noise is not None
            else calibrate_noise(self.epsilon, self.delta, account, rounds)
        )
        if self.epsilon is not None and self.noise is not None:
            self.check_budget(noise, account, rounds)
        shares = 1 if self.noise_shares is None else self.noise_shares
        return DPFGPR(self.strategy, self.clip, noise, self.rate, self.reproducible, self.noise_at, shares)

    def check_budget(self, noise: float, rate: float, rounds: int) -> None:
        """Refuse, before any client trains, a budget that cannot afford one round at ``noise``
        (accounted at ``rate``): the error names the largest number of rounds that fits (0) and the
        smallest noise multipliers that fit one round and all ``rounds``, by dp-accounting
        (:func:`calibrate_noise`, rounded up to three significant digits)."""
        one = epsilon_spent(float(noise), float(rate), 1, float(self.delta))
        if one <= self.epsilon:
            return
        fits_one = _round_up(calibrate_noise(self.epsilon, self.delta, rate, 1))
        fits_all = _round_up(calibrate_noise(self.epsilon, self.delta, rate, rounds)) if rounds > 1 else None
        every = "" if fits_all is None else f" (all {rounds} rounds: noise={fits_all:g})"
        raise InputError(
            f"ClientDP: the budget ε = {self.epsilon:g} (δ = {self.delta:g}) affords 0 of the {rounds} "
            f"rounds at noise {noise:g}: one round at rate {rate:g} already spends ε = {one:.4g}. The "
            f"smallest noise multiplier that fits one round is noise={fits_one:g}{every}; or leave noise "
            "out to calibrate it to the rounds, raise epsilon, or lower rate"
        )

    def transforms(self, given: Transforms) -> Transforms:
        """The run's transforms: ``"auto"`` parts become ones that send nothing; parts that need
        the federation's statistics are refused."""
        outcome, inputs = given.outcome, given.inputs
        if outcome == "auto":
            outcome = Standardize(local=True)
        elif isinstance(outcome, Standardize) and not outcome.local:
            raise InputError(
                "ClientDP: Standardize() sends each client's count and sums, outside the guarantee; "
                "use Standardize(local=True) (each client's own) or outcome=None"
            )
        if inputs == "auto":
            inputs = None
        elif isinstance(inputs, Normalize) and inputs.bounds is None:
            raise InputError(
                "ClientDP: Normalize() sends each client's input box, outside the guarantee; give "
                "known bounds, Normalize(bounds=...), or inputs=None"
            )
        return Transforms(outcome, inputs)

    def settings(self) -> str:
        """The privacy settings as text, without the strategy (the run's fingerprint has that)."""
        shown = (f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "strategy")
        return f"{type(self).__name__}({', '.join(shown)})"

    def check_federation(self, num_clients: int) -> None:
        """δ must be below 1/K."""
        if self.delta >= 1.0 / num_clients:
            raise InputError(
                f"ClientDP(delta={self.delta:g}) must be below 1/K = {1.0 / num_clients:g} for these "
                f"{num_clients} clients (at δ ≥ 1/K, releasing one client's data outright is within the "
                "guarantee)"
            )


def _round_up(value: float, digits: int = 3) -> float:
    """``value`` rounded up to ``digits`` significant digits (a noise multiplier to print: the
    printed one must still fit)."""
    if value <= 0 or not math.isfinite(value):
        return value
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return round(math.ceil(value / step - 1e-9) * step, 12)


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


class PrivacyAccounting(Callback):
    """ε spent after every round in the history (``epsilon``), the run's privacy in
    ``history.attrs["privacy"]``; with a budget and a given noise, stops the run after the last
    round the budget affords."""

    order = -40  # before the stopping rule: a spent budget ends the run whatever the rule says

    def __init__(self, privacy: ClientDP, accounted_rate: float | None = None):
        self.privacy = privacy
        #: The sampling rate each round is accounted at (``None``: the strategy's ``rate``; 1 when
        #: the engine may skip rounds, :meth:`ClientDP.accounted_rate`).
        self.accounted_rate = accounted_rate

    def _rate(self, run) -> float:
        return float(run.strategy.rate if self.accounted_rate is None else self.accounted_rate)

    def _spent(self, run, rounds: int) -> float:
        return epsilon_spent(
            float(run.strategy.noise), self._rate(run), int(rounds), float(self.privacy.delta)
        )

    def on_start(self, run) -> None:
        self.privacy.check_federation(len(run.roster.ids))
        if run.completed == 0 and self.privacy.epsilon is not None:
            # The run refused such a budget when it was made (ClientDP.build); here as well for a
            # strategy given some other way: never a first round the budget does not afford.
            self.privacy.check_budget(float(run.strategy.noise), self._rate(run), run.rounds)
        self._stop_if_spent(run)  # a run resumed from a checkpoint of one the budget stopped

    def on_round(self, run, row) -> None:
        row["epsilon"] = self._spent(run, run.completed)
        self._stop_if_spent(run)

    def _stop_if_spent(self, run) -> None:
        """Stop the run when its next round would spend more than the budget: no row's ε is ever
        above it."""
        budget = self.privacy.epsilon
        if budget is not None and run.completed < run.rounds and self._spent(run, run.completed + 1) > budget:
            run.stop(f"privacy budget: round {run.completed + 1} would spend ε > {budget:g}")
            warnings.warn(
                f"ClientDP: the budget ε = {budget:g} (δ = {self.privacy.delta:g}) affords "
                f"{run.completed} of the {run.rounds} rounds at noise {run.strategy.noise:g}; the run "
                "ends with the state of the last one. Raise noise or epsilon, or lower rate, for more",
                PrivacyBudgetWarning,
                stacklevel=2,
            )

    def on_end(self, run) -> None:
        s = run.strategy
        run.privacy_summary = {
            "epsilon": self._spent(run, run.completed), "delta": self.privacy.delta, "noise": s.noise,
            "clip": s.clip, "rate": s.rate, "rounds": run.completed, "accountant": "dp-accounting RDP",
            "noise_at": s.noise_at, "accounted_rate": self._rate(run),
        }  # fmt: skip

    def fingerprint(self, run) -> dict[str, str]:
        out = {"privacy": self.privacy.settings()}
        if self._rate(run) != float(run.strategy.rate):  # absent at the default, as in older checkpoints
            out["privacy.accounted_rate"] = repr(self._rate(run))
        return out
