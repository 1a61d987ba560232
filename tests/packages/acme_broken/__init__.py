"""Mistakes a team makes when it points Respawn at its agents; each module holds one.
The system check must name the path and the problem for every one of them."""
