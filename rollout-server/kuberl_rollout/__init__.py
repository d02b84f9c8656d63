"""The rollout server: a vLLM engine, the multi-turn agent loop and token-in/token-out trajectories."""
