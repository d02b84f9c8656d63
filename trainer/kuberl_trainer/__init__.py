"""The learner: FSDP2 training under torchrun, RL losses and credit assignment, asynchronous checkpoints."""
