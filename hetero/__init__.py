"""hetero: heterogeneity-aware data-parallel training for PyTorch.

The subpackages live in top-level folders of the repository and install under
this one namespace: ``hetero.trainer``, ``hetero.coordinator``, ``hetero.agent``,
``hetero.tui``, ``hetero.bench`` and the generated gRPC modules ``hetero.v1``.
"""

from hetero.core.errors import HeteroError

__all__ = ["HeteroError", "__version__"]
__version__ = "0.1.0"
