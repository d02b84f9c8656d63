"""KubeRL: a Kubernetes operator and runtime for agentic reinforcement learning of LLMs.

This package holds what every tier shares: the RLJob API (`kuberl.api`), its CRD generator,
manifest validation and the `kuberl` command line.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kuberl")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
