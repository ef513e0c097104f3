"""The operator's own settings, read once from the environment the Helm chart sets.

Owns: defaults the CompactorGroups leave out (image, Redis Secret) and cluster facts (the
Prometheus address KEDA queries). Must not import: kopf, redis, kube.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from kompaktor import __version__


class OperatorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    compactor_image: str = Field(f"ghcr.io/kompaktor/kompaktor-compactor:{__version__}")
    image_pull_policy: str = "IfNotPresent"
    redis_secret: str = Field("kompaktor-redis", description="Secret with the Redis URL, in the group's namespace")
    redis_secret_key: str = "url"
    storage_uri: str | None = None
    storage_secret: str | None = None
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    #: How often the scaler and status timers run, seconds.
    scale_interval: float = 5.0
    status_interval: float = 15.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        names = {
            "compactor_image": "KOMPAKTOR_COMPACTOR_IMAGE",
            "image_pull_policy": "KOMPAKTOR_IMAGE_PULL_POLICY",
            "redis_secret": "KOMPAKTOR_REDIS_SECRET",
            "redis_secret_key": "KOMPAKTOR_REDIS_SECRET_KEY",
            "storage_uri": "KOMPAKTOR_STORAGE",
            "storage_secret": "KOMPAKTOR_STORAGE_SECRET",
            "prometheus_url": "KOMPAKTOR_PROMETHEUS_URL",
            "scale_interval": "KOMPAKTOR_SCALE_INTERVAL",
            "status_interval": "KOMPAKTOR_STATUS_INTERVAL",
        }
        return cls.model_validate({field: env[var] for field, var in names.items() if env.get(var)})
