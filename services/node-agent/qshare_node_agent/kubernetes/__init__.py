"""The node agent's Kubernetes face: the DRA kubelet plugin, the device plugin, CDI specs and
the prepared-claim checkpoint, all driving vGPUs through one `VgpuBackend`."""
