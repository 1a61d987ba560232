from agent_runtime import Agent


def plain_function(ctx, x: int) -> dict:
    return {"x": x}


number = 42
mixed = [Agent(name="fine", model="scripted:acme"), "not an agent"]


def returns_text():
    return "agents"


def raises():
    raise RuntimeError("the agent factory could not reach its config")


def bad_name():
    return Agent(name="has spaces", model="scripted:acme")


def undecorated_tool():
    return Agent(name="undecorated", model="scripted:acme", tools=[plain_function])


def unknown_provider():
    return Agent(name="vendorless", model="nowhere:big-model")
