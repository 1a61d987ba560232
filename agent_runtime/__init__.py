"""Respawn's engine: durable agent sessions in plain Python.

Nothing in this package imports Django. It talks to storage through
`agent_runtime.store.SessionStore` and is configured by the dataclasses it is handed.
"""
