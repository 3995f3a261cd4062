"""The OpenAI Agents SDK (its default model: the Responses API) with one function_tool, against
`run serve` (tests/serve_helpers.py): the agent calls the tool with schema-valid arguments (held
by the grammar under tool_choice "required"), the SDK runs it, and its output ends the run."""

from __future__ import annotations

from typing import Literal

import agents  # openai-agents, pinned in pyproject's dev extras

pytest_plugins = ["tests.serve_helpers"]


def test_an_agent_calls_its_function_tool_and_finishes(servers):
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no traces sent anywhere
    called = []

    @agents.function_tool
    def weather(city: Literal["Oslo", "Paris"]) -> str:  # an enum: a random model's free string never ends
        """The forecast for a city."""
        called.append(city)
        return "sunny"

    client = AsyncOpenAI(base_url=servers[0].url + "/v1", api_key="unused", max_retries=0, timeout=60)
    agent = agents.Agent(
        name="forecaster",
        instructions="Answer with the weather tool.",
        tools=[weather],
        model=agents.OpenAIResponsesModel(model="slow-llama", openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=48),
        # a random model never ends a free answer (the 48-token cut is response.incomplete, which
        # the SDK rightly refuses as a final answer): the tool's output is the agent's answer
        tool_use_behavior="stop_on_first_tool",
    )
    result = agents.Runner.run_sync(agent, "Weather in Oslo?", max_turns=3)
    assert len(called) == 1 and called[0] in ("Oslo", "Paris")
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
    assert result.final_output == "sunny"
