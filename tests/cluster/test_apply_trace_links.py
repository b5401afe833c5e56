"""An apply that several changes to one node share runs in the trace of the change that
started it, and its CLIENT span links the traces of the changes that joined it (before, they
were lost). The allocator and a simulated node agent run in-process; spans are read from an
in-memory exporter added to the process's tracer provider (the one the allocator set up)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

from qshare.contracts import subjects
from qshare_allocator.app import Allocator

from .conftest import StartAgent, eventually


@pytest.fixture
def exported(allocator: Allocator) -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "the allocator sets up the SDK's provider"
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # keeps nothing more for the rest of the session


def _links(span: ReadableSpan) -> set[int]:
    return {link.context.span_id for link in span.links}


def _applies_for(
    spans: tuple[ReadableSpan, ...], node: str, change: SpanContext
) -> list[ReadableSpan]:
    """The apply CLIENT spans to `node` in the trace of `change` or linking it."""
    subject = subjects.node_command(node, "apply")
    return [
        s for s in spans
        if s.name == subject and s.kind == trace.SpanKind.CLIENT
        and ((s.parent is not None and s.parent.span_id == change.span_id)
             or change.span_id in _links(s))
    ]  # fmt: skip


async def test_an_apply_two_changes_share_links_the_trace_of_the_one_that_joined(
    allocator: Allocator, start_agent: StartAgent, exported: InMemorySpanExporter
) -> None:
    node = (await start_agent(cards=1)).name
    tracer = trace.get_tracer(__name__)
    with tracer.start_as_current_span("first change") as first:
        allocator.dispatcher.wanted(node)  # an apply starts; it reads nothing before we await
    with tracer.start_as_current_span("second change") as second:
        allocator.dispatcher.wanted(node)  # joins that apply, whose read has not happened
    started = first.get_span_context()

    async def sent() -> bool:
        return bool(_applies_for(exported.get_finished_spans(), node, started))

    await eventually(sent)
    apply = _applies_for(exported.get_finished_spans(), node, started)[0]
    assert second.get_span_context().span_id in _links(apply), apply.to_json()
