"""The ``cluster`` section: where the run's Ray cluster is and how its roles are sized.

    cluster:
      address: auto        # auto (RAY_ADDRESS, else the cluster started on this machine by
                           # `ray start --head`), env (RAY_ADDRESS, required), host:port, ray://host:port
      nodes: 2             # nodes the learner ranks span: learner.world_size / nodes per node
      cpus_per_learner: 1  # CPUs reserved beside each learner rank's GPU
      cpus_per_engine: 1   # CPUs reserved per rollout engine (each of workers_per_gpu on a GPU)
      wait_s: 600          # longest wait for the cluster to have the run's resources free

No Ray import here (``learner.config`` imports this module).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

ADDRESS = re.compile(r"^(auto|env|ray://[A-Za-z0-9_.\-\[\]:]+:\d{1,5}|[A-Za-z0-9_.\-\[\]:]+:\d{1,5})$")


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    address: str = Field("auto", max_length=300,
                         description="auto: RAY_ADDRESS or the cluster `ray start --head` started on this machine; "
                                     "env: RAY_ADDRESS (must be set); host:port (the head's GCS); ray://host:port "
                                     "(Ray client)")
    nodes: int = Field(1, ge=1, le=1024, description="nodes the learner ranks span, learner.world_size / nodes on "
                                                     "each (the placement section says what each node runs)")
    cpus_per_learner: float = Field(1.0, ge=0.0, le=256.0, description="CPUs reserved beside each learner rank")
    cpus_per_engine: float = Field(1.0, ge=0.0, le=256.0, description="CPUs reserved per rollout engine")
    wait_s: float = Field(600.0, gt=0.0, le=86_400.0,
                          description="longest wait for the cluster to have the run's GPUs (CPUs) free")

    @field_validator("address")
    @classmethod
    def _address_form(cls, value: str) -> str:
        if not ADDRESS.match(value):
            raise ValueError(f"cluster.address: auto, env, host:port or ray://host:port, got {value!r}")
        return value
