"""The chat vocabulary shared by the server and the model package: parsing tool calls out of text.

Kept below both, so `swarm.model.evaluate` scores tool calls the way the server
parses them without importing the server.
"""
