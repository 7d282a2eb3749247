"""Swarm: train LLM agents with RL while any agent code, anywhere, talks to an OpenAI endpoint."""

__version__ = "0.1.0"
