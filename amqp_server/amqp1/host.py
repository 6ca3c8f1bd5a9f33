"""What a session, its links and the ``/management`` node ask of their AMQP 1.0 connection
(``amqp1.connection.Amqp10Connection``), as a Protocol: they import no connection, as a channel imports none
(``channel.ChannelHost``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Coroutine, Protocol, TypeVar

from ..framing.file_out import Part
from ..ports import ExclusiveOwner
from ..queues.queue import Queue

if TYPE_CHECKING:
    from ..access_control import Principal, User
    from ..broker import Broker
    from ..config import Config
    from ..frontend.front_end import Registry
    from ..broker.vhost import VHost
    from .frames import Amqp10Error

Answer = TypeVar("Answer")  # what a request awaited off the frame loop gives back


class SessionHost(ExclusiveOwner[Queue], Protocol):
    broker: Broker
    config: Config
    clients: Registry
    protocol: str
    vhost: VHost | None
    user: User | None
    principal: Principal | None
    out: list[Part]
    large_out: bool
    file_out: bool
    flush_scheduled: bool
    deliver_budget: int
    peer_frame_max: int
    write_paused: bool
    publishing: bool
    credit_held: bool

    def send(self, channel: int, body: bytes) -> None: ...

    def schedule_flush(self) -> None: ...

    def started_publishing(self) -> None: ...

    def growing(self) -> None: ...

    def await_request(self, work: Coroutine[Any, Any, Answer], answer: Callable[[Answer], None]) -> None:
        """A /management request that may await the cluster: the frames after it wait until ``answer`` has its
        response."""

    def ended(self, channel: int) -> None:
        """The session on ``channel`` ended."""

    def close_with(self, error: Amqp10Error) -> None: ...
