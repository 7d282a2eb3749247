"""The `vllm` engine: a supervised vLLM OpenAI server generates, Roost's torch trainer trains.

`engine.VllmEngine` (the Engine: composes the parts below), `stream` (the SSE client of
`/v1/completions`), `publisher` (weight syncs: drain, reload, versions, rollback),
`adapters` (the LoRA sync: each step's adapter loaded as a new named version, the old one
unloaded), `supervisor` (a child server process: start, health, watchdog, restart), `gate` (the
admission gate they share), `server` (how to run vLLM: interpreter, command,
environment), `weights` (the served safetensors file: atomic writes, validation, last
good), and `worker/roost_vllm_ext.py` (methods added to vLLM's worker). Importing this
package loads nothing heavy; `swarm.server.app.make_engine` imports the engine.
"""
