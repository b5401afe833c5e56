"""The qshare node agent: one per GPU node; discovers cards, owns the node's driver segment,
converges it to the allocator's desired vGPUs and publishes the driver's events on NATS."""
