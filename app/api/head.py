"""HEAD is answered wherever GET is, with GET's status and headers and no body (RFC 9110 §9.3.2).

FastAPI's routes declare GET only, so `HEAD /health` (what many uptime checks and load balancers
send) got a 405. The request is routed as a GET and the body dropped on the way out; where GET
is not allowed either, the 405 stands.
"""

from __future__ import annotations

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send


class HeadAsGetMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return  # a streamed GET's later chunks: only the last message ends the response
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)
