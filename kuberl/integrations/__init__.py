"""Adapters for agent frameworks and environment libraries: each makes one of them an external agent
(`spec.environment.agent`, `kuberl.api.agents`) without changing it. Their packages are optional extras."""
