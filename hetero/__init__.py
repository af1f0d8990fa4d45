"""hetero: heterogeneity-aware data-parallel training for PyTorch.

The subpackages live in top-level folders of the repository and install under
this one namespace: ``hetero.trainer``, ``hetero.coordinator``, ``hetero.client`` (the
user commands of ``hetero-coord``), ``hetero.agent``, ``hetero.tui``, ``hetero.bench``
and the generated gRPC modules ``hetero.v1``.
This folder holds a relative link to each (``core -> ../core``,
``v1 -> ../proto/hetero/v1``), so the checkout is the installed tree: setuptools,
ruff, mypy, import-linter and ``PYTHONPATH=$PWD`` all see one ordinary package.
"""

from hetero.core.errors import HeteroError

__all__ = ["HeteroError", "__version__"]
__version__ = "0.1.0"
