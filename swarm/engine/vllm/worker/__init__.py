"""Code that runs inside vLLM's worker process; this directory alone is put on its PYTHONPATH."""
