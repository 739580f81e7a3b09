"""The responses kept for `previous_response_id`: the last N per tenant, in memory.

A stored response keeps its body (for GET /v1/responses/{id}) and the conversation it ends,
as chat messages without the instructions (a follow-up sends its own). A follow-up renders
that conversation plus its new input: the same tokens the slots and the prompt cache already
hold, so its prefix comes from them. Lookups are per tenant, so one tenant can neither use
nor learn of another's ids. Used on the event loop only.
"""

from __future__ import annotations

import collections
import secrets
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidRequest, NotFound
from ...state import Server

MAX_TENANTS = 1024  # tenants with stored responses; the least recently used goes first
EVICTED_MEMORY = 4  # remember this many times --responses-store evicted ids per tenant


@dataclass(slots=True)
class StoredResponse:
    body: dict[str, Any]
    messages: list[dict]  # the conversation it ends (chat form, no instructions)


class _Tenant:
    def __init__(self) -> None:
        self.items: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        self.evicted: collections.OrderedDict[str, None] = collections.OrderedDict()


class ResponseStore:
    def __init__(self, per_tenant: int, max_tenants: int = MAX_TENANTS) -> None:
        self.per_tenant = per_tenant
        self.max_tenants = max_tenants
        self._tenants: collections.OrderedDict[str, _Tenant] = collections.OrderedDict()

    def put(self, tenant: str, resp_id: str, stored: StoredResponse) -> None:
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant()
            while len(self._tenants) > self.max_tenants:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(tenant)
        t.items[resp_id] = stored
        while len(t.items) > self.per_tenant:
            old, _ = t.items.popitem(last=False)
            t.evicted[old] = None
            while len(t.evicted) > EVICTED_MEMORY * self.per_tenant:
                t.evicted.popitem(last=False)

    def get(self, tenant: str, resp_id: str, param: str = "previous_response_id") -> StoredResponse:
        """The stored response; a 400 saying whether it was evicted or never stored here."""
        t = self._tenants.get(tenant)
        stored = t.items.get(resp_id) if t is not None else None
        if stored is not None:
            t.items.move_to_end(resp_id)
            self._tenants.move_to_end(tenant)
            return stored
        if t is not None and resp_id in t.evicted:
            message = (f"the response '{resp_id}' was evicted: the server keeps the last {self.per_tenant} responses "
                       "per tenant (--responses-store); send the whole conversation as 'input' instead")
        else:
            message = f"no stored response '{resp_id}' (it was created with store: false, by another tenant, or before a restart)"
        if param == "previous_response_id":
            raise InvalidRequest(message, param=param, code="previous_response_not_found")
        raise NotFound(message, code="response_not_found")

    def delete(self, tenant: str, resp_id: str) -> None:
        self.get(tenant, resp_id, param="response_id")
        del self._tenants[tenant].items[resp_id]


@dataclass(slots=True)
class ResponsesState:
    """What the Responses API keeps for the server's lifetime (in `Server.apis`)."""

    store: ResponseStore  # the stored responses (--responses-store per tenant)
    turn_secret: bytes  # signs the turns in reasoning items (--responses-secret, else one per process)


def attach_store(server: Server) -> None:
    """Give the server its store of responses and the secret that signs the turns."""
    secret = server.config.responses_secret
    server.apis.put(ResponsesState(ResponseStore(server.config.responses_store), secret.encode() if secret else secrets.token_bytes(32)))


def responses_of(server: Server) -> ResponsesState:
    return server.apis.get(ResponsesState)


def store_of(server: Server) -> ResponseStore:
    return responses_of(server).store
