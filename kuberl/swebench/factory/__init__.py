"""A task factory: SWE-bench-format instances made from real Python packages and procedural bugs.

`make_instances` turns pinned PyPI packages into mirror repositories and instances whose bugs the packages'
own tests catch (`kuberl tasks make`); `DEFAULT_PACKAGES` is a list checked to work here.
"""

from kuberl.swebench.factory.make import MakeReport, PackageReport, make_instances
from kuberl.swebench.factory.packages import DEFAULT_PACKAGES, FactoryError, Requirement, parse_requirement

__all__ = [
    "DEFAULT_PACKAGES",
    "FactoryError",
    "MakeReport",
    "PackageReport",
    "Requirement",
    "make_instances",
    "parse_requirement",
]
