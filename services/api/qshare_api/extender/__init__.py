"""The Kubernetes scheduler extender (HTTP JSON filter, prioritize, bind) for clusters without
DRA: it places pods through the allocator, the one source of truth for capacity."""
