"""The qshare REST API for platform teams: claims, nodes, GPUs, classes and tokens."""
