"""Claims: creating, placing, retrying and releasing tenants' requests for vGPUs."""
