"""RL algorithms as pure functions on tensors: advantages from rewards, and the policy loss."""
