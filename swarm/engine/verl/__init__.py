"""The `verl` engine: verl 0.9.1's V1 PPO trainer with the swarm server as its rollout source.

Optional (`pip install 'roost[verl]'`, GPU clusters). Modules, one concept each:

    config     ServerConfig -> verl's Hydra config, checked by verl's own validation
    records    TrainSample -> verl's V1 TransferQueue records and padded DataProto
    slots      the slot dataset verl draws one uid per Roost group from
    adapter    verl's AgentLoopManager replacement and the Ray broker between verl and the server
    engine     VerlEngine: the `Engine` the swarm server drives; starts Ray and verl's trainer

Its settings, `VerlSettings`, are part of the config vocabulary (swarm/config/verl.py).
Importing this package imports none of the modules (verl, Ray and torch load only when used).
"""
