"""Point the clients' own suites at a broker given by BROKER=host:port instead of a docker container."""
import os
from dataclasses import dataclass, field

import pytest
from yarl import URL


@dataclass
class Info:
    host: str
    ports: dict = field(default_factory=dict)
    id: str = "local"


@pytest.fixture(scope="session")
def rabbitmq_container():
    host, port = os.environ["BROKER"].split(":")
    return Info(host, {"5672/tcp": int(port), "5671/tcp": int(os.environ.get("BROKER_TLS", "1"))})


@pytest.fixture(scope="session")
def amqp_direct_url(rabbitmq_container):
    return URL.build(scheme="amqp", user="guest", password="guest", path="//",
                     host=rabbitmq_container.host, port=rabbitmq_container.ports["5672/tcp"])
