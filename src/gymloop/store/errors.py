"""What the store refuses, typed, so the API maps each to its status code without reading messages."""
from __future__ import annotations


class StoreError(ValueError):
    """A request the store refuses (a value out of range); nothing changed. The API answers 400."""


class NotFound(StoreError):
    """It names something the store does not have (a trace, a model version). The API answers 404."""


class Conflict(StoreError):
    """It contradicts the store's state (roll back to a version never promoted). The API answers 409."""
