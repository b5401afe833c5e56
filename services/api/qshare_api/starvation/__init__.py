"""`GET /v1/starvation`: low-priority claims the preemptor found starved."""
