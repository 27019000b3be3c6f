"""The Agent's ``on_preview`` hook (the relay's only change to the agent loop): previews,
and only previews, reach the callback, in stream order with the agent events."""

from __future__ import annotations

from toollatch import Agent, PreviewUpdated, model_client
from toollatch.relay import default_previews
from toollatch.runtime import example_tools
from toollatch.scripted import ScriptedServer

CALLS = ("call_demo_weather_oslo", "call_demo_weather_zurich", "call_demo_write_notes")


async def _run(tmp_path, seen: list, **kwargs) -> None:
    """Play the demo; the events and the hook's previews go to ``seen`` as they happen."""
    async with ScriptedServer() as scripted:
        url = scripted.base_url("openai_chat")
        async with model_client("openai_chat", model="scripted", base_url=url) as client:
            agent = Agent(client, example_tools(tmp_path), **kwargs)
            async for event in agent.run("hi"):
                assert not isinstance(event, PreviewUpdated)  # never an agent event
                data = event.to_json()
                seen.append((data["type"], data.get("id") or data.get("text")))


async def test_previews_reach_the_hook_in_stream_order(tmp_path):
    seen: list = []

    def hook(preview: PreviewUpdated) -> None:
        seen.append(("preview", preview.call_id))

    await _run(tmp_path, seen, previews=default_previews(), on_preview=hook)
    for call_id in CALLS:
        previews = [i for i, item in enumerate(seen) if item == ("preview", call_id)]
        opened = seen.index(("call_opened", call_id))
        committed = seen.index(("call_committed", call_id))
        assert previews
        assert opened < previews[0]
        assert previews[-1] < committed
    # the second round's text streamed before its call: the previews do not jump ahead of it
    text = seen.index(("text", "I'll wri"))
    assert text < seen.index(("preview", "call_demo_write_notes"))


async def test_without_a_hook_the_events_are_the_same(tmp_path):
    plain: list = []
    await _run(tmp_path / "a", plain)
    previews_only: list = []
    await _run(tmp_path / "b", previews_only, previews=default_previews())
    assert sorted(plain) == sorted(previews_only)
    assert all(kind != "preview" for kind, _ in plain)
