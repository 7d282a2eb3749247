"""The `vllm` engine: a supervised vLLM OpenAI server generates, Roost's torch trainer trains.

`engine.VllmEngine` (the Engine), `server` (the vLLM process), `weights` (the
served safetensors file: atomic writes, validation, last good), and
`worker/roost_vllm_ext.py` (methods added to vLLM's worker). Importing this
package loads nothing heavy; `swarm.server.app.make_engine` imports the engine.
"""
