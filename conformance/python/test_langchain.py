"""The official LangChain middleware (langchain-runcycles, pinned in requirements.txt) against the
server: an agent whose model calls and tool calls are gated, charged and denied through it.

The model is a scripted chat model (no network): it asks for one tool call, then answers. Every
SDK request the middleware makes is captured and schema-checked (conftest), and the ledger is
read back through the admin API.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_runcycles import CyclesFanOutGate, CyclesModelGate, CyclesToolGate
from runcycles import Action, Amount, Subject, Unit

from conftest import Tenant, ledger

MODEL_ESTIMATE = 1_000
TOOL_ESTIMATE = 500
TOOL_ACTUAL = 200


class ScriptedModel(GenericFakeChatModel):
    """Answers from a fixed script; binding tools changes nothing (the script already calls them)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def script(call_id: str) -> Iterator[AIMessage]:
    return iter(
        [
            AIMessage(
                content="",
                tool_calls=[{"name": "lookup", "args": {"query": "fx"}, "id": call_id, "type": "tool_call"}],
            ),
            AIMessage(content="done: 1.08"),
        ]
    )


def agent_for(
    tenant: Tenant,
    client: Any,
    tool_calls: list[str],
    *,
    tool_estimate: int = TOOL_ESTIMATE,
    turns_decided: bool = True,
) -> Any:
    """The agent, with the three gates in their documented order: fan-out, model, tool. The
    fan-out gate asks `decide` at every model turn when `turns_decided` (at its default
    estimate, 10 000), else only counts turns."""
    @tool
    def lookup(query: str) -> str:
        """Looks a rate up."""
        tool_calls.append(query)
        return "1.08"

    usd = Unit.USD_MICROCENTS
    subject = Subject(tenant=tenant.id, agent="research")
    return create_agent(
        model=ScriptedModel(messages=script(f"call-{uuid.uuid4().hex[:8]}")),
        tools=[lookup],
        middleware=[
            CyclesFanOutGate(
                max_turns=5,
                client=client if turns_decided else None,
                subject=subject if turns_decided else None,
                action=Action(kind="llm.turn", name="research") if turns_decided else None,
            ),
            CyclesModelGate(
                client,
                subject=subject,
                action=Action(kind="llm.completion", name="scripted"),
                mode="reserve",
                estimate=Amount(unit=usd, amount=MODEL_ESTIMATE),
            ),
            CyclesToolGate(
                client,
                subject=subject,
                action={"lookup": Action(kind="tool.search", name="lookup")},
                mode="decide+reserve",
                estimate=Amount(unit=usd, amount=tool_estimate),
                cost_fn=lambda request, result: Amount(unit=usd, amount=TOOL_ACTUAL),
            ),
        ],
    )


def ask() -> dict[str, Any]:
    return {"messages": [HumanMessage(content="What is the EUR/USD rate?")]}


def statuses(tenant: Tenant, method: str, pattern: str) -> list[int]:
    return [x.status for x in tenant.traffic.find(method, pattern)]


def assert_charged_a_whole_run(tenant: Tenant, result: dict[str, Any], tool_calls: list[str]) -> None:
    assert result["messages"][-1].content == "done: 1.08"
    assert tool_calls == ["fx"]
    # Two model calls reserved and committed at their estimate, one tool call at its actual cost.
    assert statuses(tenant, "POST", "/v1/reservations") == [200, 200, 200]
    assert statuses(tenant, "POST", "/v1/reservations/[^/]+/commit") == [200, 200, 200]
    # A decide per model turn (fan-out) and one for the tool call.
    assert statuses(tenant, "POST", "/v1/decide") == [200, 200, 200]
    reserves = [x.request for x in tenant.traffic.find("POST", "/v1/reservations")]
    assert [r["estimate"]["amount"] for r in reserves] == [MODEL_ESTIMATE, TOOL_ESTIMATE, MODEL_ESTIMATE]
    assert all(r["subject"] == {"tenant": tenant.id, "agent": "research"} for r in reserves)
    amounts = tenant.amounts()
    assert amounts["spent"] == 2 * MODEL_ESTIMATE + TOOL_ACTUAL, amounts
    assert amounts["reserved"] == 0, amounts


def test_an_agent_run_is_gated_and_charged_per_model_and_tool_call(tenant: Tenant) -> None:
    tool_calls: list[str] = []
    result = agent_for(tenant, tenant.client, tool_calls).invoke(ask())
    assert_charged_a_whole_run(tenant, result, tool_calls)


def test_the_async_agent_is_gated_and_charged_the_same(tenant: Tenant) -> None:
    async def run() -> tuple[dict[str, Any], list[str]]:
        tool_calls: list[str] = []
        client = tenant.async_client()
        try:
            return await agent_for(tenant, client, tool_calls).ainvoke(ask()), tool_calls
        finally:
            await client.aclose()

    result, tool_calls = asyncio.run(run())
    assert_charged_a_whole_run(tenant, result, tool_calls)


def test_a_model_call_over_budget_ends_the_run_and_charges_nothing(make_tenant: Callable[..., Tenant]) -> None:
    tenant = make_tenant(allocated=MODEL_ESTIMATE - 1)
    tool_calls: list[str] = []
    result = agent_for(tenant, tenant.client, tool_calls, turns_decided=False).invoke(ask())
    last = result["messages"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    # The gate words the refusal (the 409 BUDGET_EXCEEDED) with the server's message.
    assert last.content.startswith("Model call denied by Cycles policy: "), last.content
    assert f"requested {MODEL_ESTIMATE} USD_MICROCENTS, remaining {MODEL_ESTIMATE - 1}" in last.content
    assert tool_calls == []
    refused = tenant.traffic.find("POST", "/v1/reservations")
    assert [(x.status, x.body["error"]) for x in refused] == [(409, "BUDGET_EXCEEDED")]
    assert statuses(tenant, "POST", "/v1/reservations/[^/]+/commit") == []
    assert tenant.amounts() == ledger(MODEL_ESTIMATE - 1)


def test_a_tool_call_over_budget_is_refused_to_the_model_which_goes_on(
    make_tenant: Callable[..., Tenant],
) -> None:
    # Enough for both model calls, not for the tool's estimate after the first of them.
    tenant = make_tenant(allocated=2 * MODEL_ESTIMATE + 100)
    tool_calls: list[str] = []
    agent = agent_for(tenant, tenant.client, tool_calls, tool_estimate=5_000, turns_decided=False)
    result = agent.invoke(ask())
    refusals = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert len(refusals) == 1 and "denied" in refusals[0].content, refusals
    assert tool_calls == [], "a denied tool never runs"
    assert result["messages"][-1].content == "done: 1.08"
    decisions = [x.body["decision"] for x in tenant.traffic.find("POST", "/v1/decide", 200)]
    assert decisions == ["DENY"], decisions
    assert statuses(tenant, "POST", "/v1/reservations") == [200, 200], "the two model calls only"
    amounts = tenant.amounts()
    assert amounts["spent"] == 2 * MODEL_ESTIMATE and amounts["reserved"] == 0, amounts


def test_a_turn_the_budget_cannot_cover_halts_the_agent_before_any_spend(
    make_tenant: Callable[..., Tenant],
) -> None:
    # Enough for a model call, not for the fan-out gate's per-turn estimate (10 000).
    tenant = make_tenant(allocated=5_000)
    tool_calls: list[str] = []
    result = agent_for(tenant, tenant.client, tool_calls).invoke(ask())
    last = result["messages"][-1]
    assert last.content == "Agent halted by Cycles policy: BUDGET_EXCEEDED", last.content
    decisions = [x.body for x in tenant.traffic.find("POST", "/v1/decide", 200)]
    assert [(d["decision"], d.get("reason_code")) for d in decisions] == [("DENY", "BUDGET_EXCEEDED")]
    assert statuses(tenant, "POST", "/v1/reservations") == []
    assert tool_calls == []
    assert tenant.amounts()["spent"] == 0
