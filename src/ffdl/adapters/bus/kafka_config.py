"""How a ``kafka://`` bus talks to its brokers: the settings of the Kafka adapter, apart from aiokafka."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator


class KafkaConfig(BaseModel):
    """How a ``kafka://`` bus talks to its brokers: ``FFDL_KAFKA__ACKS=all``, ``FFDL_KAFKA__SASL_USERNAME``...

    The defaults suit one local broker with no security, such as the test broker tansu; docs/kafka.md
    gives the settings for an Apache Kafka cluster (replication, TLS, SASL, idempotence).
    """

    client_id: str = Field(default="ffdl", min_length=1, description="names ffdl in broker logs and quotas")
    acks: Literal["all", "1", "0"] = Field(default="all", description="all: every in-sync replica has it")
    enable_idempotence: bool = Field(default=False, description="needs acks=all and broker support")
    linger_ms: int = Field(default=0, ge=0, description="how long the producer waits to fill a batch")
    request_timeout_s: float = Field(default=40.0, gt=0, description="how long a request waits for a broker")
    replication_factor: int = Field(default=1, ge=1, description="replicas of the topics ffdl creates")
    min_insync_replicas: int | None = Field(default=None, ge=1, description="of the topics ffdl creates")
    session_timeout_s: float = Field(default=10.0, gt=0, description="a silent member loses its partitions")
    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="at most a third of the session")
    fetch_max_wait_ms: int = Field(default=50, ge=0, description="how long a broker holds an empty fetch")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = Field(default=None, description="the CA that signed the brokers' certificates")
    ssl_certfile: Path | None = Field(default=None, description="client certificate, for mutual TLS")
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConfig:
        if self.enable_idempotence and self.acks != "all":
            raise ValueError("enable_idempotence needs acks=all")
        uses_sasl = self.security_protocol.startswith("SASL")
        if uses_sasl and (self.sasl_username is None or self.sasl_password is None):
            raise ValueError(f"{self.security_protocol} needs sasl_username and sasl_password")
        return self
