"""The contract every aggregation rule keeps, as a pytest class to subclass (in the spirit of
GPyTorch's ``BaseKernelTestCase`` and scikit-learn's ``estimator_checks``).

A rule — fedgp's own or yours — subclasses :class:`AggregatorContract`, names itself, gives an
independent computation of what it should return, and states its breakdown bound::

    import numpy as np
    from fedgp.testing import AggregatorContract

    class TestMyMedian(AggregatorContract):
        aggregator = MyMedian()

        def closed_form(self, values, weights):
            return torch.from_numpy(np.median(values.numpy(), axis=0))

        def tolerated(self, n):
            return (n - 1) // 2

``closed_form`` must not call the rule's own code (numpy or scipy, or the definition written out);
``rtol`` / ``atol`` say how close the rule must come (iterative rules state their own).
``tolerated(n)`` is how many of ``n`` participants may send anything; ``within_bound`` is the
guarantee that then holds (default: every coordinate within the range of the honest values).

It checks: agreement with the closed form on random inputs (several seeds and sizes), through
``combine`` and through the rule applied to hyper-parameter states; permutation invariance (a
randomised rule sets ``permutation_invariant = False`` and says why in ``not_invariant_because``);
the breakdown bound (``tolerated(n)`` participants replaced by 10⁶); the agreed value when everyone
agrees; fixed (untrained) parameters never changed; the config round-trip. Needs pytest.
"""

from __future__ import annotations

import json

import gpytorch
import numpy as np
import pytest
import torch

from fedgp.aggregators import StateAggregator
from fedgp.messages import from_config
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState

__all__ = ["AggregatorContract", "CORRUPTED"]

#: What a corrupted participant sends in every coordinate of the breakdown check.
CORRUPTED = 1e6


class AggregatorContract:
    """Subclass and set ``aggregator``; implement :meth:`closed_form` and :meth:`tolerated`;
    override :meth:`within_bound` when the rule's guarantee is not the honest values' range.

    ``sizes``: the participant counts tried; ``dim``: the width of the updates; ``seeds``: the
    random inputs per size; ``rtol`` / ``atol``: the agreement with the closed form.
    """

    aggregator: StateAggregator
    sizes: tuple[int, ...] = (5, 8, 13)
    dim: int = 3
    seeds: tuple[int, ...] = (0, 1, 2)
    rtol: float = 1e-9
    atol: float = 1e-12
    permutation_invariant: bool = True
    not_invariant_because: str = ""

    # -- what a subclass states ---------------------------------------------------------------------
    def closed_form(self, values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """What ``aggregator.combine(values, weights)`` must return for ``values`` ``(P, D)`` and
        ``weights`` ``(P,)`` (summing to one), computed independently of the rule's code."""
        raise NotImplementedError(f"{type(self).__name__} must give the rule's closed form")

    def tolerated(self, n: int) -> int:
        """How many of ``n`` participants may be arbitrary while :meth:`within_bound` holds."""
        raise NotImplementedError(
            f"{type(self).__name__} must state how many participants the rule tolerates"
        )

    def within_bound(
        self, result: torch.Tensor, honest: torch.Tensor, corrupted: torch.Tensor, previous: torch.Tensor
    ) -> bool:
        """The rule's guarantee for ``result`` = the rule on ``corrupted`` (all ``n`` rows, the
        arbitrary ones included), ``honest`` the untouched rows, ``previous`` the centre of the
        updates (zero). Default: every coordinate within the range of the honest values."""
        slack = 1e-12 * (1.0 + float(honest.abs().max()))
        low, high = honest.min(0).values - slack, honest.max(0).values + slack
        return bool(((result >= low) & (result <= high)).all())

    def agreed_value(self, rng: np.random.Generator) -> torch.Tensor:
        """The value every participant sends in the agreement check (default standard normal)."""
        return torch.from_numpy(rng.standard_normal(self.dim))

    # -- inputs -------------------------------------------------------------------------------------
    def inputs(self, seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random values ``(n, dim)`` and positive weights summing to one."""
        rng = np.random.default_rng([seed, n])
        values = torch.from_numpy(rng.standard_normal((n, self.dim)))
        weights = torch.from_numpy(rng.dirichlet(np.ones(n)))
        return values, weights

    def cases(self) -> list[tuple[int, int]]:
        """Every ``(seed, n)`` the checks run on."""
        return [(seed, n) for n in self.sizes for seed in self.seeds]

    # -- the contract -------------------------------------------------------------------------------
    def test_agrees_with_its_closed_form(self) -> None:
        """On random inputs of every size, the rule equals the subclass's independent closed form."""
        for seed, n in self.cases():
            values, weights = self.inputs(seed, n)
            got = self.aggregator.combine(values.clone(), weights.clone())
            expected = torch.as_tensor(self.closed_form(values.clone(), weights.clone()), dtype=torch.float64)
            torch.testing.assert_close(
                got,
                expected,
                rtol=self.rtol,
                atol=self.atol,
                msg=lambda m, s=seed, n=n: f"seed {s}, n {n}: {m}",
            )

    def test_permutation_invariant(self) -> None:
        """Reordering the participants (and their weights) does not change the result."""
        if not self.permutation_invariant:
            pytest.skip(self.not_invariant_because or "the rule is not permutation invariant")
        for seed, n in self.cases():
            values, weights = self.inputs(seed, n)
            order = torch.from_numpy(np.random.default_rng([seed, n, 1]).permutation(n))
            a = self.aggregator.combine(values, weights)
            b = self.aggregator.combine(values[order], weights[order])
            torch.testing.assert_close(
                b, a, rtol=1e-12, atol=1e-14, msg=lambda m, s=seed, n=n: f"seed {s}, n {n}: {m}"
            )

    def test_breakdown_bound(self) -> None:
        """``tolerated(n)`` participants (at random positions) send 10⁶ in every coordinate: the
        result keeps the stated guarantee."""
        for seed, n in self.cases():
            values, weights = self.inputs(seed, n)
            count = self.tolerated(n)
            assert 0 <= count <= n, f"tolerated({n}) = {count}"
            bad = torch.from_numpy(np.random.default_rng([seed, n, 2]).permutation(n)[:count])
            corrupted = values.clone()
            corrupted[bad] = CORRUPTED
            honest = values[torch.from_numpy(np.setdiff1d(np.arange(n), bad.numpy()))]
            previous = torch.zeros(self.dim, dtype=torch.float64)
            result = self.aggregator.combine(corrupted, weights)
            assert bool(torch.isfinite(result).all())
            assert self.within_bound(result, honest, corrupted, previous), (
                f"seed {seed}: {count} of {n} participants at {CORRUPTED:g} broke the bound: {result}"
            )

    def test_everyone_agreeing_gives_the_agreed_value(self) -> None:
        """When every participant sends the same value, that value comes back."""
        for seed, n in self.cases():
            agreed = self.agreed_value(np.random.default_rng([seed, n, 3]))
            _, weights = self.inputs(seed, n)
            got = self.aggregator.combine(agreed.expand(n, self.dim).clone(), weights)
            torch.testing.assert_close(got, agreed, rtol=1e-12, atol=1e-12)

    def test_config_round_trips(self) -> None:
        """The rule rebuilds equal from its JSON config (what a client or a saved result holds)."""
        text = json.dumps(self.aggregator.to_config(), allow_nan=False)
        rebuilt = from_config(json.loads(text))
        assert type(rebuilt) is type(self.aggregator) and rebuilt == self.aggregator
        assert type(self.aggregator).from_config(self.aggregator.to_config()) == self.aggregator

    # -- on hyper-parameter states --------------------------------------------------------------------
    #: A model with a fixed (untrained) noise: aggregation must copy it from the previous state.
    FIXED = "likelihood.noise_covar.noise"

    def spec(self) -> GPSpec:
        """A GP spec with one fixed hyper-parameter, for the checks on HyperStates."""
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
        return GPSpec(kernel=kernel, fixed=[self.FIXED])

    def states(self, spec: GPSpec, seed: int, n: int) -> tuple[HyperState, HyperState]:
        """A previous state and ``n`` participants' states around it (every parameter moved, the
        fixed one too: the participants disagree about it, the rule must not listen)."""
        gen = torch.Generator().manual_seed(seed)
        previous = spec.from_raw(
            spec.to_raw(spec.initial_state()).map(
                lambda v, e: v + 0.2 * torch.randn(v.shape, generator=gen, dtype=v.dtype)
            )
        )
        raw = (
            spec.to_raw(previous)
            .expand(n)
            .map(lambda v, e: v + 0.3 * torch.randn(v.shape, generator=gen, dtype=v.dtype))
        )
        return previous, spec.from_raw(raw)

    def test_on_states_agrees_and_keeps_fixed_parameters(self) -> None:
        """The rule on HyperStates: the trained parameters as the closed form gives them (per
        parameter for coordinate-wise rules, on the flattened updates from the previous state for
        the others, in the rule's space), the fixed one exactly the previous state's."""
        spec = self.spec()
        rule = self.aggregator
        trained = [p for p in spec.params if p.trainable]
        assert self.FIXED not in {p.name for p in trained}
        for seed, n in self.cases():
            previous, states = self.states(spec, seed, n)
            _, weights = self.inputs(seed, n)
            got = rule(spec, states, weights, previous)
            assert torch.equal(got[self.FIXED], previous[self.FIXED]), "a fixed parameter was changed"
            raw = rule.space == "raw"
            values = spec.to_raw(states) if raw else states
            centre = spec.to_raw(previous) if raw else previous
            if rule.coordinatewise:
                expected = {
                    p.name: torch.as_tensor(
                        self.closed_form(values[p.name].reshape(n, -1), weights), dtype=torch.float64
                    ).reshape(p.shape)
                    for p in trained
                }
            else:
                updates = torch.cat([(values[p.name] - centre[p.name]).reshape(n, -1) for p in trained], 1)
                step = torch.as_tensor(self.closed_form(updates, weights), dtype=torch.float64)
                sizes = [int(torch.Size(p.shape).numel()) for p in trained]
                expected = {
                    p.name: centre[p.name] + part.reshape(p.shape)
                    for p, part in zip(trained, step.split(sizes))
                }
            for p in trained:
                want = p.transform(expected[p.name]) if raw else expected[p.name]
                torch.testing.assert_close(got[p.name], want, rtol=self.rtol, atol=self.atol)
