"""Faithful re-implementations of other systems' turn schedulers, driven by the same ledger as ours (pure).

Sources, defaults and every choice made where a source was silent: ``docs/peers.md``.
"""

__all__: list[str] = []
