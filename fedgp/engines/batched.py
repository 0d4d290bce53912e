"""The batched engine: every client's local steps as one tensor program.

A Python loop over clients, each with its own GPyTorch ``ExactGP``, spends its time in per-call
overhead: a 32-point exact GP step is a few microseconds of arithmetic and a millisecond of
bookkeeping. Here the participating clients' minibatches are stacked into ``(B, M, M)`` tensors:
the spec's own GPyTorch mean and kernel modules are evaluated with a batch of parameter sets
(``torch.func.functional_call`` on their ``forward``), and the marginal likelihood is a batched
Cholesky written out below — GPyTorch's batch mode needs one model per parameter batch shape and
routes through ``linear_operator`` objects whose overhead is what we are removing.

For RBF and Matérn kernels on the CPU, when numba is installed, a whole local round of a chunk is
one compiled call instead (:mod:`fedgp.engines.fused`: minibatch draws, parameter transforms and
the optimiser too), and where that does not apply (priors, float32 minibatches, ...) each minibatch
step is one compiled function (:mod:`fedgp.engines.compiled`: Gram matrix, Cholesky, inverse, NLL
and gradients vectorised across clients). On a GPU with triton the fused round is one Triton
program per client instead (:mod:`fedgp.engines.triton_round`). The tensor path below remains for
other kernels, for matrices that need jitter, for GPUs without the fused round, and as the
reference the compiled paths are tested against.

It computes exactly what the sequential engine computes (same minibatches, same optimiser,
float64): tests hold the two engines to 1e-8. Unequal client sizes are handled by padding with an
identity block (exact: it adds nothing to the log-determinant or the quadratic form) and unequal
step counts by masking the optimiser step. Clients are processed in chunks, so memory is bounded
whatever the number of clients; full-data evaluations are further grouped by size under a memory
budget. GPyTorch priors enter the loss as in the sequential engine (``BatchedGP.nll``) and
``active_dims`` are applied as GPyTorch's ``Kernel.__call__`` does; a multi-output spec has a
tensor path of its own (:mod:`fedgp.engines.hadamard_gp`). At construction the engine checks
itself against GPyTorch on a random case; a spec it cannot reproduce (another likelihood, e.g.
``FixedNoiseGaussianLikelihood``, or a kernel whose ``forward`` does not broadcast over parameter
batches) is evaluated client by client with GPyTorch instead
(:class:`~fedgp.engines.per_client.PerClientOps`), with a one-time warning: the sequential engine's
numbers, without the speed-up.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence

import torch

from fedgp.data.client import ClientData
from fedgp.engines import cpus, rounds
from fedgp.engines import fused as fused_round
from fedgp.engines.base import InProcessEngine
from fedgp.engines.hadamard_gp import batched_gp, case_inputs, task_columns
from fedgp.engines.per_client import PerClientOps, predict_alone
from fedgp.engines.sequential import SequentialOps
from fedgp.engines.tensor_gp import NOISE, BatchedGP, cholesky
from fedgp.errors import FedGPWarning, InputError, UnsupportedSpec
from fedgp.models import large
from fedgp.models.posterior import Prediction
from fedgp.models.spec import GPSpec
from fedgp.models.state import HyperState
from fedgp.rng import draw_minibatches
from fedgp.strategies.base import TrainResult
from fedgp.strategies.local import LocalTraining

__all__ = ["BatchedEngine", "BatchedOps", "batched_path_reason", "check_against_gpytorch"]

_WARNED: set[str] = set()
CPU_CHUNK_SIZE, GPU_CHUNK_SIZE = 512, 16_384  # default clients per batched program (BatchedEngine)


class BatchedEngine(InProcessEngine):
    """Runs chunks of clients as batched tensor programs.

    Args:
        chunk_size: clients per batched program (bounds memory; cost is linear in clients). The
            default on the CPU keeps one ``(chunk, 32, 32)`` float64 tensor at 4 MiB, in cache: 512
            was the fastest of 256–1,024 for M = 32 in both precisions, by up to 20 % over 1,024.
            On a GPU the default is 16,384: a chunk of 512 leaves it waiting on kernel launches
            (4.5× slower at K = 10,000 on an H200; results/benchmarks/gpu_batched.csv).
        memory_mb: budget for one full-data evaluation group (kernel matrices of whole clients).
        check: compare with GPyTorch on a random case at construction (recommended).
        minibatch_dtype: precision of the local minibatch steps only (e.g. ``torch.float32``, about
            1.6× faster here); states, optimiser and full-data evaluations stay in the spec's dtype.
            Results then differ from the sequential engine by float32 rounding.
        compiled: the compiled minibatch step of :mod:`fedgp.engines.compiled` (RBF/Matérn
            kernels, needs numba): ``None`` uses it where it applies, ``False`` never, ``True`` insists.
            It computes the same numbers as the tensor path (to rounding), 2–3× faster.
        fused: a whole local round per chunk in one compiled call (:mod:`fedgp.engines.fused`:
            minibatch draws, transforms and optimiser compiled too; on a GPU one Triton program per
            client, :mod:`fedgp.engines.triton_round`): ``None`` where it applies (and ``compiled``
            is not ``False`` on the CPU), ``False`` never (the step-by-step path), ``True`` insists
            (a ``ValueError`` says why a spec cannot; a round it cannot run falls back, e.g.
            minibatches over 64 points).
        device: where the tensor path runs (e.g. ``"cuda"``): the clients' data are copied there
            once at construction (``ClientData`` stays float64 on the CPU), states are moved there per
            chunk and replies come back to the CPU. The compiled step is CPU-only; on a GPU the fused
            round is Triton's (with ``pip install triton``) and the step-by-step path is the tensor
            path; the per-client fallback runs on the CPU.
        loopback, timeout: as for every in-process engine (:class:`~fedgp.engines.base.InProcessEngine`):
            a chunk that exceeds the timeout is halved and re-run, so only a client that alone
            exceeds it fails.
    """

    name = "batched"

    def __init__(
        self,
        spec: GPSpec,
        clients: Sequence[ClientData],
        seed: int = 0,
        chunk_size: int | None = None,
        memory_mb: float = 256.0,
        check: bool = True,
        minibatch_dtype: torch.dtype | None = None,
        compiled: bool | None = None,
        device: str | torch.device | None = None,
        fused: bool | None = None,
        **options,
    ):
        spec = spec.for_data(clients)  # GPSpec()'s named modules, at the data's width
        self.device = torch.device("cpu" if device is None else device)
        if chunk_size is None:
            chunk_size = GPU_CHUNK_SIZE if self.device.type == "cuda" else CPU_CHUNK_SIZE
        if chunk_size < 1:
            raise InputError("chunk_size must be >= 1")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise InputError(
                f"device={str(device)!r}, but this PyTorch sees no CUDA GPU (torch.cuda.is_available() "
                "is False); install a CUDA build of PyTorch on a GPU machine, or leave device unset"
            )
        self.chunk_size, self.memory_mb = chunk_size, memory_mb
        self.model = None  # a GPyTorch model for the per-client fallback, built when first needed
        self.minibatch_dtype = minibatch_dtype or spec.dtype
        if self.minibatch_dtype not in (torch.float32, torch.float64):
            raise InputError(f"minibatch_dtype must be torch.float32 or torch.float64, got {minibatch_dtype}")
        # Built as its rounds run (thread_setting): OpenMP's threads, spinning after a parallel copy,
        # cost a fit on a busy machine 10 % (benchmarks/threads_under_load.py)
        tiles = self.device.type == "cpu" and compiled is not False and fused_round.compiled.available()
        with cpus.torch_on_one_thread() if tiles else contextlib.nullcontext():
            super().__init__(spec, clients, seed, **options)
            self.gp = _batched_gp(spec, compiled, check, clients[0].n_features if clients else 1, self.device)
            # the fused round's layout and module (numba's on the CPU, Triton's on a GPU), or None
            self.fused, self.round_module = rounds.choose(
                self.spec, self.device, self.gp, self.minibatch_dtype, fused
            )
            self.sizes = torch.tensor([c.n for c in clients], dtype=torch.long)
            self.offsets = torch.cumsum(self.sizes, 0) - self.sizes
            self.data_changed()

    def data_changed(self) -> None:
        """Stack every client's training rows end to end in the run's units, in the spec's precision on
        ``device`` (and in the minibatch precision): once per transform, N·(d+1) numbers."""
        dtype = self.spec.dtype
        X = torch.cat([c.X for c in self.raw_clients])
        y = torch.cat([c.y for c in self.raw_clients])
        if not self.transform.is_identity:  # the clients' own rows, stacked, in the run's units
            maps = (self.sizes, self.outcome_offset, self.outcome_scale)
            X, y = self.transform.stacked(self.raw_clients, X, y, *maps)
        self.X = X.to(self.device, dtype)
        self.y = y.to(self.device, dtype)
        # a copy in the minibatch precision (gathered every step) where it differs
        self.X_mb, self.y_mb = self.X.to(self.minibatch_dtype), self.y.to(self.minibatch_dtype)

    def transformed(self, transform) -> tuple:
        """Each client's data made when first read: the rounds read the rows stacked above."""
        return transform.lazy_all(self.raw_clients)

    def thread_setting(self) -> contextlib.AbstractContextManager:
        """With the compiled step, torch on one thread and the tiles on the threads
        (:func:`fedgp.engines.cpus.torch_on_one_thread`): torch's slowed a fit on a busy machine."""
        compiled = self.gp is not None and self.gp.compiled
        return cpus.torch_on_one_thread() if compiled else contextlib.nullcontext()

    def abandoned(self) -> None:
        """A cut-off task may still use the GPyTorch model and modules: later tasks get new ones."""
        self.model, self.gp = None, self.gp and batched_gp(self.spec, self.gp.compiled).to(self.device)

    def ops(self, clients: torch.Tensor, rnd: int) -> BatchedOps | PerClientOps:
        if self.gp is None:
            if self.model is None:  # one GPyTorch model, reused by every client in turn
                self.model = self.spec.build()
            chosen = [self.clients[i] for i in clients.tolist()]
            return PerClientOps(self.spec, self.model, chosen, self.keys[clients], rnd, self.seed)
        return BatchedOps(self, clients, rnd)

    # -- data access ------------------------------------------------------------------------------
    def padded(
        self, rows: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Whole training sets of clients ``rows``: X ``(R, N, d)``, y ``(R, N)``, mask ``(R, N)``."""
        lengths = self.sizes[rows] if lengths is None else lengths
        n = int(lengths.max())
        pos = torch.arange(n)
        mask = pos.unsqueeze(0) < lengths.unsqueeze(1)
        flat = torch.where(mask, self.offsets[rows].unsqueeze(1) + pos, self.offsets[rows].unsqueeze(1))
        return self.X[flat], self.y[flat], (None if bool(mask.all()) else mask.to(self.device))

    def size_groups(
        self, rows: torch.Tensor, extra_rows: int = 1, test: bool = False
    ) -> Iterator[torch.Tensor]:
        """Positions into ``rows``, grouped by client size so each group fits the memory budget."""
        sizes = self.sizes[rows]
        if test:
            sizes = sizes + torch.tensor([self.clients[i].X_test.shape[0] for i in rows.tolist()])
        order = torch.argsort(sizes, stable=True)
        budget = self.memory_mb * 2**20 / 8 / 12  # ~12 n×n float64 temporaries per row
        group: list[int] = []
        for pos in order.tolist():
            n = int(sizes[pos])
            if group and (len(group) + 1) * extra_rows * n * n > budget:
                yield torch.tensor(group)
                group = []
            group.append(pos)
        if group:
            yield torch.tensor(group)


class BatchedOps:
    """:class:`~fedgp.strategies.base.ClientOps` for a chunk of clients."""

    def __init__(self, engine: BatchedEngine, rows: torch.Tensor, rnd: int):
        self.engine, self.round, self.seed = engine, rnd, engine.seed
        self.rows = rows  # positions of the clients' data in this engine
        self.indices = engine.keys[rows]  # their keys: what their random streams are keyed by
        self.sizes = engine.sizes[rows]
        self.spec, self.gp = engine.spec, engine.gp

    @property
    def clients(self) -> list[ClientData]:
        """The chunk's clients' own data (made in the run's units when a task first reads them)."""
        return [self.engine.clients[i] for i in self.rows.tolist()]

    # -- helpers --------------------------------------------------------------------------------
    def _rows(self, states: HyperState):
        batch = states.batch_shape
        if len(batch) < 1 or batch[0] != len(self.rows):
            raise InputError(f"states must have batch ({len(self.rows)}, ...), got {tuple(batch)}")
        extra = batch[1:]
        device = self.engine.device
        flat = states.map(lambda v, e: v.reshape(-1, *v.shape[len(batch) :]).to(device))
        per_client = int(torch.Size(extra).numel())
        return flat, extra, per_client

    def _ids(self, rows: torch.Tensor) -> list:
        return [self.engine.ids[i] for i in rows.tolist()]

    def _full_data_nll(self, raw: dict, client_pos: torch.Tensor, per_client: int, grad: bool, out: dict):
        """NLL (and raw gradients) on whole local datasets of the clients at ``client_pos``, one row
        per (client, extra state), written into ``out["loss"]`` / ``out["grads"]`` (all rows)."""
        for group in self.engine.size_groups(self.rows[client_pos], per_client):
            row_idx = (client_pos[group].unsqueeze(1) * per_client + torch.arange(per_client)).reshape(-1)
            row_idx = row_idx.to(self.engine.device)
            clients = self.rows[client_pos[group]].repeat_interleave(per_client)
            X, y, mask = self.engine.padded(clients)
            sub = {
                k: v[row_idx].detach().requires_grad_(grad and self.spec.param(k).trainable)
                for k, v in raw.items()
            }
            with torch.set_grad_enabled(grad):
                value = self.gp.nll(sub, X, y, mask, self._ids(clients))
            if grad:
                leaves = [k for k in sub if sub[k].requires_grad]
                for k, g in zip(leaves, torch.autograd.grad(value.sum(), [sub[k] for k in leaves])):
                    out["grads"][k][row_idx] = g
            out["loss"][row_idx] = value.detach()

    # -- ClientOps --------------------------------------------------------------------------------
    def nll(self, states: HyperState) -> torch.Tensor:
        """Per-point exact NLL of each client's full data under each state, all clients at once (see
        :class:`~fedgp.strategies.ClientOps`)."""
        flat, extra, per_client = self._rows(states)
        raw = dict(self.spec.to_raw(flat))
        out = {
            "loss": torch.empty(len(self.rows) * per_client, dtype=self.spec.dtype, device=self.engine.device)
        }
        self._full_data_nll(raw, torch.arange(len(self.rows)), per_client, False, out)
        return out["loss"].reshape(len(self.rows), *extra).to("cpu", torch.float64)

    def gradient(self, states: HyperState, batch_size: int | None = None) -> tuple[torch.Tensor, HyperState]:
        """Per-point NLL and its gradient with respect to the raw trainable parameters, all clients at
        once (see :class:`~fedgp.strategies.ClientOps`)."""
        flat, extra, per_client = self._rows(states)
        raw = dict(self.spec.to_raw(flat))
        B = len(self.rows)
        out = {
            "loss": torch.empty(B * per_client, dtype=self.spec.dtype, device=self.engine.device),
            "grads": {k: torch.zeros_like(v) for k, v in raw.items()},
        }
        # A client with at most batch_size points uses all of them (as the sequential engine).
        full = torch.ones(B, dtype=torch.bool) if batch_size is None else self.sizes <= batch_size
        if bool(full.any()):
            self._full_data_nll(raw, full.nonzero().flatten(), per_client, True, out)
        if not bool(full.all()):
            pos = (~full).nonzero().flatten()
            idx = draw_minibatches(
                self.engine.seed,
                self.round,
                self.indices[pos],
                self.sizes[pos],
                1,
                batch_size,
                stream="gradient",
            )[:, 0]
            rows = (
                (pos.unsqueeze(1) * per_client + torch.arange(per_client)).reshape(-1).to(self.engine.device)
            )
            clients = self.rows[pos].repeat_interleave(per_client)
            flat_idx = self.engine.offsets[clients].unsqueeze(1) + idx.repeat_interleave(per_client, 0)
            sub = {k: v[rows].detach().requires_grad_(self.spec.param(k).trainable) for k, v in raw.items()}
            value = self.gp.nll(
                sub, self.engine.X[flat_idx], self.engine.y[flat_idx], None, self._ids(clients)
            )
            leaves = [k for k in sub if sub[k].requires_grad]
            for k, g in zip(leaves, torch.autograd.grad(value.sum(), [sub[k] for k in leaves])):
                out["grads"][k][rows] = g
            out["loss"][rows] = value.detach()
        shaped = HyperState(out["grads"], flat.event_shapes).map(
            lambda v, e: v.reshape(B, *extra, *v.shape[1:]).cpu()
        )
        return out["loss"].reshape(B, *extra).to("cpu", torch.float64), shaped

    def _minibatch_indices(self, local: LocalTraining, steps: torch.Tensor, batch: torch.Tensor):
        """``(B, S, M)`` minibatch indices, drawn per group of equal M_k so every client gets exactly
        the draws the sequential engine gives it; shorter minibatches are padded with -1 to M."""
        S, M = int(steps.max()), int(batch.max())
        idx = torch.full((len(self.rows), S, M), -1, dtype=torch.long)
        for m in batch.unique().tolist():
            pos = (batch == m).nonzero().flatten()
            X_pad = self.engine.padded(self.rows[pos])[0] if local.minibatch == "nearest" else None
            idx[pos, :, :m] = draw_minibatches(
                self.engine.seed, self.round, self.indices[pos], self.sizes[pos], S, m, local.minibatch, X_pad
            )
        return idx

    def train(self, states: HyperState, local: LocalTraining) -> TrainResult:
        """Run the local optimiser from each state, every client's minibatch steps as one batched program
        (see :class:`~fedgp.strategies.ClientOps`)."""
        flat, extra, per_client = self._rows(states)
        steps = local.num_steps(self.sizes)
        batch = local.batch_sizes(self.sizes)
        layout = self.engine.fused
        if (
            layout is not None
            and fused_round.unsupported(local, batch, self.engine.X.shape[1], layout) is None
        ):
            result = self._train_fused(layout, flat, extra, per_client, steps, batch, local)
            if result is not None:
                return result
        return self._train_stepwise(flat, extra, per_client, steps, batch, local)

    def _train_fused(self, layout, flat, extra, per_client, steps, batch, local) -> TrainResult | None:
        """The whole round in one compiled call (:mod:`fedgp.engines.fused`); ``None`` when a
        Cholesky failed on the way (the step-by-step path then retries with jitter or names it)."""
        B = len(self.rows)
        raw = self.spec.to_raw(flat)
        rows = B * per_client
        theta = torch.cat([raw[k].reshape(rows, -1) for k in layout.names], 1)
        given = self._minibatch_indices(local, steps, batch) if local.minibatch == "nearest" else None
        theta, loss, info = rounds.local_round(
            self.engine.round_module,
            layout,
            self.engine.X,
            self.engine.y,
            self.engine.offsets[self.rows],
            self.sizes,
            fused_round.minibatch_keys(self.engine.seed, self.round, self.indices),
            steps,
            batch,
            given,
            torch.arange(B).repeat_interleave(per_client),
            theta,
            local,
            self.round,
        )
        if info.any():
            return None
        pieces = theta.split(list(layout.widths), 1)
        trained = {k: piece.reshape(rows, *flat[k].shape[1:]) for k, piece in zip(layout.names, pieces)}
        new = self.spec.from_raw(HyperState(trained, self.spec.event_shapes))
        new = new.map(lambda v, e: v.reshape(B, *extra, *v.shape[1:]).cpu())
        return TrainResult(new, loss.reshape(B, *extra).cpu(), steps)

    def _train_stepwise(self, flat, extra, per_client, steps, batch, local) -> TrainResult:
        """One batched (compiled or tensor) minibatch step at a time, optimiser in torch."""
        B = len(self.rows)
        S = int(steps.max())
        idx = self._minibatch_indices(local, steps, batch)
        device = self.engine.device
        mask = (idx >= 0).repeat_interleave(per_client, 0).to(device)  # (rows, S, M)
        flat_idx = self.engine.offsets[self.rows].view(B, 1, 1) + idx.clamp_min(0)
        flat_idx = flat_idx.repeat_interleave(per_client, 0)
        row_steps = steps.repeat_interleave(per_client).to(device)
        ids = self._ids(self.rows.repeat_interleave(per_client))

        raw_all = dict(self.spec.to_raw(flat))
        # The trainable raw parameters side by side in one (rows, P) tensor: one gradient and one
        # optimiser update per step instead of one per parameter (both are elementwise).
        trainable = [p.name for p in self.spec.params if p.trainable]
        shapes = [raw_all[k].shape[1:] for k in trainable]
        widths = [shape.numel() for shape in shapes]
        start = torch.cat([raw_all[k].reshape(len(row_steps), -1) for k in trainable], 1)
        theta, opt_state = start, local.optimizer.init({"theta": start})
        total = torch.zeros(len(row_steps), dtype=self.spec.dtype, device=device)
        mb_dtype = self.engine.minibatch_dtype
        for s in range(S):
            active = s < row_steps
            leaf = theta.detach().requires_grad_()
            params = dict(raw_all)
            for k, piece, shape in zip(trainable, leaf.split(widths, 1), shapes):
                params[k] = piece.reshape(-1, *shape)
            m_s = mask[:, s]
            value = self.gp.nll(
                {k: v.to(mb_dtype) for k, v in params.items()},
                self.engine.X_mb[flat_idx[:, s]],
                self.engine.y_mb[flat_idx[:, s]],
                None if bool(m_s.all()) else m_s,
                ids,
            )
            (grad,) = torch.autograd.grad(value.sum(), [leaf])
            if local.prox_mu:
                grad = grad + local.prox_mu * (theta - start)
            t = self.round * row_steps + s
            theta = local.optimizer.step({"theta": theta}, {"theta": grad}, opt_state, t, active)["theta"]
            total += torch.where(active, value.detach().to(total.dtype), torch.zeros((), dtype=total.dtype))
        raw = {
            k: piece.reshape(-1, *shape) for k, piece, shape in zip(trainable, theta.split(widths, 1), shapes)
        }
        raw_all.update(raw)
        new = self.spec.from_raw(HyperState(raw_all, self.spec.event_shapes))
        new = new.map(lambda v, e: v.reshape(B, *extra, *v.shape[1:]).cpu())
        loss = (total / row_steps.to(total.dtype)).reshape(B, *extra).to("cpu", torch.float64)
        return TrainResult(new, loss, steps)

    def predict(
        self, states: HyperState, X_new: torch.Tensor | None = None, full_cov: bool = False
    ) -> list[Prediction]:
        """Personalised posteriors of the chunk's clients (``(B,)`` states) at their test inputs or ``X_new``,
        together; a large client alone, in one n×n matrix (:mod:`fedgp.models.large`)."""
        flat, extra, per_client = self._rows(states)
        if extra:
            raise InputError(f"predict needs one state per client, got extra batch {tuple(extra)}")
        raw = dict(self.spec.to_raw(flat))
        out: list[Prediction | None] = [None] * len(self.rows)
        for group in self.engine.size_groups(self.rows, 1, test=X_new is None):
            clients = self.rows[group]
            held = [self.engine.clients[i] for i in clients.tolist()]
            missing = [c.id for c in held if X_new is None and c.X_test is None]
            if missing:
                raise InputError(f"client {missing[0]!r} has no test split and no inputs were given")
            if int(self.engine.sizes[clients].max()) > large.LARGE_CLIENT_ROWS:  # one n×n matrix at a time
                for pos, prediction in predict_alone(self.spec, flat, group.tolist(), held, X_new, full_cov):
                    out[pos] = prediction
                continue
            X, y, mask = self.engine.padded(clients)
            if X_new is None:
                tests = [c.X_test.to(X.dtype) for c in held]
                lengths = torch.tensor([len(t) for t in tests])
                Xs = torch.nn.utils.rnn.pad_sequence(tests, batch_first=True).to(X.device)
            else:
                self.gp.check_rows(X_new, "predict: X_new")
                Xs = torch.as_tensor(X_new, dtype=X.dtype, device=X.device).expand(len(clients), *X_new.shape)
                lengths = torch.full((len(clients),), X_new.shape[0])
            sub = {k: v[group.to(X.device)] for k, v in raw.items()}
            with torch.no_grad():
                mean, var_f, noise, cov = self._posterior(sub, X, y, mask, Xs, self._ids(clients), full_cov)
            mean, var_f, noise, cov = (None if t is None else t.cpu() for t in (mean, var_f, noise, cov))
            for j, pos in enumerate(group.tolist()):
                n = int(lengths[j])
                joint = None if cov is None else cov[j, :n, :n].clone()
                out[pos] = Prediction(
                    mean[j, :n].clone(), var_f[j, :n].clone(), var_f[j, :n] + noise[j, :n], joint
                )
        return out  # type: ignore[return-value]

    def _posterior(self, raw, X, y, mask, Xs, ids, full_cov=False):
        K = self.gp.train_covariance(raw, X, mask)
        L = cholesky(K, ids)
        r = y - self.gp.mean(raw, X)
        # stationary kernels: shift both sides by the row's first point, as _stationary_inputs does
        shift = X[..., :1, :] if self.gp.fast is not None else X.new_zeros(())
        Ks = self.gp.kernel(raw, X - shift, Xs - shift)  # (B, N, T)
        if mask is not None:
            r = torch.where(mask, r, torch.zeros((), dtype=r.dtype))
            Ks = torch.where(mask.unsqueeze(-1), Ks, torch.zeros((), dtype=Ks.dtype))
        alpha = torch.cholesky_solve(r.unsqueeze(-1), L).squeeze(-1)
        mean = self.gp.mean(raw, Xs) + (Ks * alpha.unsqueeze(-1)).sum(-2)
        V = torch.linalg.solve_triangular(L, Ks, upper=False)
        prior = self.gp.kernel(raw, Xs - shift, Xs - shift, diag=True)
        var_f = (prior - (V * V).sum(-2)).clamp_min(0.0)
        cov = self.gp.kernel(raw, Xs, Xs) - V.transpose(-1, -2) @ V if full_cov else None
        return mean, var_f, self.gp.row_noise(raw, Xs), cov


def batched_path_reason(spec: GPSpec, d: int, compiled: bool | None = None) -> str | None:
    """Why the tensor path cannot reproduce GPyTorch for ``spec`` on ``d``-feature data, or ``None``
    when it can (checked on a small random case: :func:`check_against_gpytorch`)."""
    if spec.variational:
        return "a sparse variational GP (VariationalGPSpec) runs client by client with GPyTorch"
    try:
        batched_gp(spec, compiled)
        check_against_gpytorch(spec, compiled=compiled, d=d)
    except UnsupportedSpec as err:
        return str(err)
    return None


def _batched_gp(spec: GPSpec, compiled: bool | None, check: bool, d: int, device) -> BatchedGP | None:
    """The tensor path for ``spec``, or ``None`` (with a one-time warning) when it cannot reproduce
    GPyTorch: the engine then evaluates each client with GPyTorch, as the sequential engine does."""
    reason = batched_path_reason(spec, d, compiled) if check or spec.variational else None
    if reason is None:
        try:
            return batched_gp(spec, compiled).to(device)
        except UnsupportedSpec as err:
            reason = str(err)
    if compiled:
        raise InputError(f"compiled=True: the batched engine cannot evaluate this spec: {reason}")
    message = (
        f"the batched engine evaluates this spec client by client with GPyTorch ({reason}); "
        "results are the sequential engine's, without the batched speed-up"
    )
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, FedGPWarning, stacklevel=4)
    return None


def check_against_gpytorch(
    spec: GPSpec, seed: int = 0, compiled: bool | None = None, d: int | None = None
) -> None:
    """Raise :class:`UnsupportedSpec` unless the batched path reproduces GPyTorch's NLL and
    gradients on a random case with ``d`` input features for this spec (guards against kernels
    whose ``forward`` does not broadcast over parameter batches, priors it cannot read ...)."""
    g = torch.Generator().manual_seed(seed)
    d = _input_dim(spec) + task_columns(spec) if d is None else d
    clients = [
        ClientData(case_inputs(spec, n, d, g), torch.randn(n, generator=g, dtype=torch.float64), id=i)
        for i, n in enumerate((7, 5))
    ]
    raw = spec.to_raw(spec.initial_state())
    perturbed = [
        _well_conditioned(
            spec,
            spec.from_raw(raw.map(lambda v, e: v + 0.1 * torch.randn(v.shape, generator=g, dtype=v.dtype))),
        )
        for _ in clients
    ]
    try:
        engine = BatchedEngine(spec, clients, 0, check=False, compiled=compiled)
        ops = BatchedOps(engine, torch.arange(2), 0)
        ours_loss, ours_grad = ops.gradient(HyperState.stack(perturbed))
    except Exception as err:  # any failure here means "not supported"
        raise UnsupportedSpec(f"{type(err).__name__}: {err}") from err
    model = spec.build()
    # (loss rtol, atol, gradient rtol, atol): float32 rounding differs between the two paths.
    tol = (1e-9, 1e-12, 1e-7, 1e-10) if spec.dtype == torch.float64 else (1e-4, 1e-5, 1e-3, 1e-4)
    for i, (client, state) in enumerate(zip(clients, perturbed)):
        ref_loss, ref_grad = SequentialOps(spec, model, client, i, 0, 0).gradient(state.expand(1))
        differ = [] if torch.allclose(ours_loss[i], ref_loss[0], rtol=tol[0], atol=tol[1]) else ["the NLL"]
        differ += [
            f"∂/∂{k}"
            for k in ref_grad
            if not torch.allclose(ours_grad[k][i], ref_grad[k][0], rtol=tol[2], atol=tol[3])
        ]
        if differ:
            raise UnsupportedSpec(
                f"its tensor path does not reproduce GPyTorch for this spec: {', '.join(differ)} differ on "
                "a well-conditioned test case (a kernel whose forward does not broadcast over parameter "
                "batches?)"
            )


def _well_conditioned(spec: GPSpec, state: HyperState) -> HyperState:
    """``state`` with its noise raised to 0.1 where the constraint allows (else as near as it allows).

    The self-check compares two float64 computations of the same NLL; with a tiny noise (a
    legitimate ``GreaterThan(1e-12)`` likelihood) the check case's covariance is so ill-conditioned
    that rounding alone separates them. The noise does not enter the kernel's forward, which is
    what the check is for, so the check uses a noise that keeps the case well-conditioned."""
    info = next((p for p in spec.params if p.raw_name == NOISE), None)
    if info is None:  # a fixed (known) noise: nothing to raise
        return state
    target = torch.full_like(state[info.name], 0.1)
    constraint = info.constraint
    if constraint is not None:
        lower, upper = float(constraint.lower_bound.max()), float(constraint.upper_bound.min())
        target = target.clamp(min=lower * 2 if lower > 0 else lower)
        if math.isfinite(upper):
            target = target.clamp(max=lower + 0.5 * (upper - lower))
    values = dict(state)
    values[info.name] = torch.maximum(state[info.name], target)
    return HyperState(values, state.event_shapes)


def _input_dim(spec: GPSpec) -> int:
    dims = [getattr(m, "ard_num_dims", None) for m in spec.kernel.modules()]
    dims += [
        getattr(m, "weights", torch.empty(1, 1)).shape[-2]
        for m in spec.mean.modules()
        if hasattr(m, "weights")
    ]
    dims = [int(x) for x in dims if x]
    return max(dims) if dims else 1
