"""SWE-bench-format instances on real repositories: rows, the mirror, environments, pytest reports."""
