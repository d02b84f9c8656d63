"""`kuberl run`: one RLJob on one machine, with the entrypoints the operator runs in pods."""
