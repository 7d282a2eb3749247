"""A Tinker-compatible training API on a policy server: the routes the unchanged `tinker` SDK
calls (`/api/v1/...`), beside the OpenAI proxy, on the same port and tokens (docs/tinker.md).

    errors      the one refusal type (status, stable code)
    schema      the JSON bodies (pydantic)
    validate    what a body must be: every 400 before anything is queued
    wire        the protobuf bodies the SDK sends and reads, without the protobuf library
    futures     request ids, results, one ordered lane of work per model
    compute     forward / forward_backward / optim_step / prompt logprobs on a LoRA policy (torch)
    checkpoints tinker:// paths, atomic saves, loads, the list
    service     sessions (leases), models, sampler snapshots
    routes      the FastAPI routes and `install(app, service)`

A layer above the engines and below the server (tests/test_architecture.py): the server's app
mounts the routes and hands the service what it needs of the server as `PolicyHooks`.
"""
