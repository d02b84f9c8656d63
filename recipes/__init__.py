"""Recipes: what a team brings to KubeRL for one kind of task, outside the API and the tiers.

A recipe makes the inputs an RLJob names (a model folder, a demonstrations file) and reads what a run leaves
behind; it sits above the tiers, beside the composition roots, and nothing below imports it.
"""
