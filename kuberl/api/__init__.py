"""The contracts every tier shares: the RLJob API, trajectories, the environment protocol."""

from kuberl.api.rljob import RLJob
from kuberl.api.spec import API_VERSION, KIND, RLJobSpec
from kuberl.api.status import Phase, Reason, RLJobStatus
from kuberl.api.trajectory import Trajectory

__all__ = ["API_VERSION", "KIND", "Phase", "RLJob", "RLJobSpec", "RLJobStatus", "Reason", "Trajectory"]
