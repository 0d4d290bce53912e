"""What the server and the nodes agree on: the GP model and the strategies."""

import gpytorch

import fedgp


def spec(dims: int) -> fedgp.GPSpec:
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=dims))
    return fedgp.GPSpec(kernel=kernel)


def strategy(name: str):
    if name == "fgpr":
        return fedgp.strategies.FGPR.authors(local_steps=3, batch_size=8, lr=0.05)
    if name == "ifca":
        return fedgp.strategies.IFCA(num_clusters=2, local_steps=2, batch_size=8, lr=0.05)
    raise ValueError(f"strategy must be 'fgpr' or 'ifca', got {name!r}")
