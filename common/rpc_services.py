"""Register a servicer so that a request which is not a valid message is refused with INVALID_ARGUMENT.

Why: the generated `add_*Servicer_to_server` functions give gRPC `Message.FromString` as the request
deserializer, and gRPC answers a deserializer that raises with INTERNAL ("Exception deserializing request!",
threaded server) or UNKNOWN ("Unexpected DecodeError", grpc.aio): it reads as a bug in the server and names neither the method
nor the message. `add_service` builds the same method handlers from the service's descriptor instead, with a
deserializer that turns bytes protobuf cannot decode into a marker, and a behaviour that refuses the marker
before the servicer sees it:

    INVALID_ARGUMENT  GetJob: the request is not a valid league.v1.GetJobRequest message
    INVALID_ARGUMENT  PushTrajectories: message 2 of the stream is not a valid league.v1.TrajectoryChunk message

Only that call ends; the server keeps serving. The handlers keep their streaming shape and each behaviour its
kind (plain function, coroutine function, async generator function), so gRPC (threaded or grpc.aio) runs them
as before and server interceptors see them as before: the bearer-token check still refuses first, and the RPC
metrics count the refusal as INVALID_ARGUMENT. In a request stream the check sits in the request iterator: an
asyncio servicer that reads with `context.read()` instead would get the marker.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

log = logging.getLogger(__name__)


class _Malformed:
    """What the deserializer returns for bytes that are not a valid message; refused before any servicer."""

    __slots__ = ()


_MALFORMED = _Malformed()

_HANDLER_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_service(server: grpc.Server | grpc.aio.Server, servicer: object, service: ServiceDescriptor) -> None:
    """Register the methods of `service` on `server`, served by `servicer`'s methods of the same names (as the
    generated `add_<Service>Servicer_to_server` does), refusing requests that are not valid messages."""
    handlers = {method.name: _method_handler(method, getattr(servicer, method.name)) for method in service.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _method_handler(method: MethodDescriptor, behavior: Callable[..., Any]) -> grpc.RpcMethodHandler:
    request_type = message_factory.GetMessageClass(method.input_type)
    response_type = message_factory.GetMessageClass(method.output_type)
    refusal = _Refusal(method.name, method.input_type.full_name)
    make = _HANDLER_FACTORIES[(method.client_streaming, method.server_streaming)]
    return make(
        _guarded(behavior, refusal, method.client_streaming),
        request_deserializer=_lenient_parser(request_type),
        response_serializer=response_type.SerializeToString,
    )


def _lenient_parser(request_type: type[Message]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return request_type.FromString(data)
        except DecodeError:
            return _MALFORMED

    return parse


@dataclass(frozen=True)
class _Refusal:
    method: str
    message_type: str

    def details(self, position: int | None = None) -> str:
        """Why the call is refused (logged at debug level); `position`: the message's place in a request
        stream, from 1."""
        what = "the request" if position is None else f"message {position} of the stream"
        details = f"{self.method}: {what} is not a valid {self.message_type} message"
        log.debug("refused with INVALID_ARGUMENT: %s", details)
        return details


def _guarded(behavior: Callable[..., Any], refusal: _Refusal, request_streaming: bool) -> Callable[..., Any]:
    """`behavior`, of the same kind, that gets its request checked first (a request stream: each message as it
    is read)."""
    if inspect.isasyncgenfunction(behavior):

        async def guarded_async_generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if request_streaming:
                request = _checked_stream_async(request, context, refusal)
            elif request is _MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal.details())
            async for response in behavior(request, context):
                yield response

        return guarded_async_generator

    if inspect.iscoroutinefunction(behavior):

        async def guarded_coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if request_streaming:
                request = _checked_stream_async(request, context, refusal)
            elif request is _MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal.details())
            return await behavior(request, context)

        return guarded_coroutine

    def guarded(request: Any, context: grpc.ServicerContext) -> Any:
        if request_streaming:
            request = _checked_stream(request, context, refusal)
        elif request is _MALFORMED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal.details())  # raises
        return behavior(request, context)

    return guarded


def _checked_stream(requests: Iterator[Any], context: grpc.ServicerContext, refusal: _Refusal) -> Iterator[Any]:
    for position, request in enumerate(requests, 1):
        if request is _MALFORMED:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal.details(position))  # raises
        yield request


async def _checked_stream_async(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, refusal: _Refusal
) -> AsyncIterator[Any]:
    position = 0
    async for request in requests:
        position += 1
        if request is _MALFORMED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal.details(position))  # raises
        yield request
