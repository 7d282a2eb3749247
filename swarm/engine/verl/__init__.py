"""The `verl` engine: verl 0.9.1's V1 PPO trainer with the swarm server as its rollout source.

Optional (`pip install 'roost[verl]'`, GPU clusters). Modules, one concept each:

    settings   VerlSettings: cluster layout and verl-only knobs (pure; nested in ServerConfig)
    config     ServerConfig -> verl's Hydra config, checked by verl's own validation
    records    TrainSample -> verl's V1 TransferQueue records and padded DataProto
    slots      the slot dataset verl draws one uid per Roost group from
    adapter    verl's AgentLoopManager replacement and the Ray broker between verl and the server
    engine     VerlEngine: the `Engine` the swarm server drives; starts Ray and verl's trainer

Importing this package imports none of them (verl, Ray and torch load only when used).
"""
