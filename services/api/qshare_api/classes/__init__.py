"""Classes over REST: how vGPUs are produced (`qshare` slices, `whole` cards)."""
