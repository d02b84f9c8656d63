"""The composition roots: the `kuberl` command line and the one-machine runner, the only code that imports
every tier (the tiers import only `kuberl`, the contract and shared libraries, never one another)."""
