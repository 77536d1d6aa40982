"""The study protocols as objects: one file each (:mod:`.abx`, :mod:`.preference`,
:mod:`.threshold`), each with its plan, decision (and its rule text), result rows and catch
kinds; :class:`.base.Protocol` says what a protocol provides. The rest of :mod:`evalkit.study`
asks the protocol object instead of comparing protocol names, so a new protocol is one file
here and one entry in :data:`REGISTRY`.
"""

from __future__ import annotations

from .abx import ABX
from .base import Protocol
from .preference import Preference
from .threshold import Threshold

#: every protocol by name, in the order the CLI lists them
REGISTRY: dict[str, Protocol] = {p.name: p for p in (Preference(), ABX(), Threshold())}


def get(name: str) -> Protocol:
    """The protocol called ``name`` (KeyError for an unknown name: callers check
    :data:`REGISTRY` first where a user gave the name)."""
    return REGISTRY[name]


__all__ = ["REGISTRY", "Protocol", "get", "ABX", "Preference", "Threshold"]
