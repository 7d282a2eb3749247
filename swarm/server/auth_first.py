"""Auth before the body: a route class that runs a route's credential checks before its body is read.

FastAPI reads and parses a JSON body before it runs a route's dependencies, so
on a plain `APIRoute` a malformed body from a stranger gets 400 `invalid_json`
(the schema talks before the credential is looked at) and an unauthenticated
client can make the server parse megabytes of JSON. `AuthFirstRoute` runs the
route's own body-free dependencies (the auth dependencies of `auth.py`, or any
other such as the Anthropic route's `x-api-key` reader) once *before* the body
is touched; a failure raises the domain error it always raised (401, 403, 409,
503), rendered by the app's handlers (or a subclass's, e.g. `AnthropicRoute`).
When they pass, the normal handler runs, dependencies included: the checks run
twice, which costs an HMAC and a dict lookup, and keeps every route's
dependency the single statement of who may call it.

    router = APIRouter(prefix=..., route_class=AuthFirstRoute)
    class AnthropicRoute(AuthFirstRoute): ...   # a route class of its own: subclass this one

A route without dependencies (e.g. `/health`) is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import solve_dependencies
from fastapi.routing import APIRoute


def _reads_body(dep: Dependant) -> bool:
    return bool(dep.body_params) or any(_reads_body(d) for d in dep.dependencies)


def credential_checks(dependant: Dependant) -> Dependant | None:
    """The route's dependencies that need no body (its auth), as one dependant; None if it has none."""
    deps = [d for d in dependant.dependencies if not _reads_body(d)]
    return Dependant(dependencies=deps, path=dependant.path) if deps else None


class AuthFirstRoute(APIRoute):
    """An `APIRoute` whose credential checks run before its body is read (see the module doc)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        checks = credential_checks(self.dependant)
        if checks is None:
            return handler
        overrides = self.dependency_overrides_provider

        async def route(request: Request) -> Response:
            async with AsyncExitStack() as stack:
                # raises the dependency's own error (Unauthorized, Forbidden, StaleLease, Unavailable);
                # header or path validation errors are left to the full handler, which reports them
                await solve_dependencies(
                    request=request,
                    dependant=checks,
                    dependency_overrides_provider=overrides,
                    async_exit_stack=stack,
                    embed_body_fields=False,
                )
            return await handler(request)

        return route
