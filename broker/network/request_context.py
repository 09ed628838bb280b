"""`RequestContext`: who sent the request being handled, and on which listener.

Set by the dispatcher for the handler's task (a context variable, as `CLIENT_HOST` was):
the authorizer, quotas and the group coordinator read it; handlers need not pass it on.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from tierbroker.broker.config.listeners import SecurityProtocol
from tierbroker.broker.security.principal import ANONYMOUS, KafkaPrincipal


@dataclass(frozen=True, slots=True)
class RequestContext:
    principal: KafkaPrincipal
    client_address: str  # the client's IP, as the authorizer matches hosts
    listener_name: str
    security_protocol: SecurityProtocol
    client_id: str = ""

    @property
    def client_host(self) -> str:
        """As Kafka shows it in group descriptions: "/127.0.0.1"."""
        return "/" + self.client_address


# Outside a request (internal writes, tests of handlers): the broker itself, in the clear.
INTERNAL = RequestContext(ANONYMOUS, "", "PLAINTEXT", SecurityProtocol.PLAINTEXT)
_CURRENT: ContextVar[RequestContext] = ContextVar("request_context", default=INTERNAL)


def current_request() -> RequestContext:
    return _CURRENT.get()


def set_current_request(context: RequestContext) -> None:
    _CURRENT.set(context)
