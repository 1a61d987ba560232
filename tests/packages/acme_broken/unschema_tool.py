import threading

from agent_runtime import Agent, ToolContext, tool


@tool
def hold(ctx: ToolContext, lock: threading.Lock) -> dict:  # no JSON schema for a lock
    return {}


agents = [Agent(name="unschema", model="scripted:acme", tools=[hold])]
