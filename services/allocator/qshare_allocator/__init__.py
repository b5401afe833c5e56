"""The qshare allocator: inventory of nodes and cards, placement of claims, in Postgres."""
