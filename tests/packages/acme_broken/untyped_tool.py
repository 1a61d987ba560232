from agent_runtime import Agent, tool


@tool
def lookup(ctx, query):  # no type hint on `query`: the model cannot be told what to send
    return {"query": query}


agents = [Agent(name="untyped", model="scripted:acme", tools=[lookup])]
