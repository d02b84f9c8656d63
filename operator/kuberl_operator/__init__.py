"""The kopf operator: pure builders of every child object from an RLJob, thin handlers,
the job state machine and circuit breakers."""
