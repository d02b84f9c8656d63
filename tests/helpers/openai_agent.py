"""External agents for the tests (`spec.environment.agent: helpers.openai_agent:solve`, tests/ on PYTHONPATH):
an ordinary OpenAI-client loop, as a user would write one; a task whose metadata says `crash` makes it raise."""

from __future__ import annotations

import openai

TURNS = 3


async def solve(task, base_url, env):
    """Ask the model, run the tests, show it their output; after TURNS turns, submit."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=env.api_key, max_retries=0)
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": env.observation}]
    for turn in range(TURNS):
        answer = await client.chat.completions.create(model="policy", messages=messages, max_tokens=12, seed=turn)
        if task.metadata.get("testAgent") == "crash":
            raise RuntimeError("the agent gave up")
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        result = await env.run_tests()
        messages.append({"role": "tool", "content": result.observation[-200:]})
    await env.submit()
    await client.close()


def not_async(task, base_url, env):
    """Not an entry point: entry points are async."""
