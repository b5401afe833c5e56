"""Which compute timeslice a change of a card's asked sharing gives the card: the level asked,
or, when an asked level is withdrawn, the agent's own (nvidia-smi's default where the agent
sets none, as the driver's own level before it is not known)."""

from __future__ import annotations

from qshare.contracts.sharing import SharingSettings, Timeslice


def timeslice_to_give(
    own: Timeslice, before: SharingSettings | None, asked: SharingSettings | None
) -> Timeslice | None:
    """The level to set on the card going from `before` to `asked` (each None: the agent's
    settings), or None when the card keeps the one it has."""
    had = None if before is None else before.timeslice
    wanted = None if asked is None else asked.timeslice
    if wanted is not None:
        return None if wanted == had else wanted
    if had is None:
        return None
    return "default" if own == "driver" else own
