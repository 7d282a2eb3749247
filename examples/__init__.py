"""Copy-able agent workflows (`swarm client --workflow examples.arith_openai:workflow`)."""
