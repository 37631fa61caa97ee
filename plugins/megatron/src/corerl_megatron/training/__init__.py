"""The ``megatron`` training backend: the driver side, the rank worker, the model, its shards, optimizer and memory model."""
