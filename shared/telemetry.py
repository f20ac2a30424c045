"""OpenTelemetry for every service: one trace per session, W3C traceparent between services.

Configured by the standard variables only: tracing is on when `OTEL_EXPORTER_OTLP_ENDPOINT`
(or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and `OTEL_SDK_DISABLED` is not true; spans go
out over OTLP/HTTP in batches; `OTEL_SERVICE_NAME` names the service (default: the firsthop
service); sampling follows `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (the SDK reads
them). When it is off, every call here is a cheap no-op.

No per-packet spans anywhere: packets are counted in metrics.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("firsthop.telemetry")

_PROPAGATOR = TraceContextTextMapPropagator()
_provider: Any = None


def tracing_enabled() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def setup_tracing(service: str) -> bool:
    """Install the SDK tracer provider with an OTLP/HTTP batch exporter, if configured."""
    global _provider
    if _provider is not None or not tracing_enabled():
        return _provider is not None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or f"firsthop-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info("tracing to %s as %s", os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"), name)
    return True


def shutdown_tracing() -> None:
    """Flush and stop the exporter (bounded); call once at process exit."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def tracer(name: str) -> Tracer:
    return trace.get_tracer(name)


def context_from_traceparent(traceparent: str | None) -> otel_context.Context | None:
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def traceparent_of(span: Span | None = None) -> str | None:
    """The W3C traceparent of `span` (default: the current span), or None if not recording."""
    carrier: dict[str, str] = {}
    ctx = trace.set_span_in_context(span) if span is not None else None
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier.get("traceparent")
