"""The operator's kopf handlers: the only importer of kopf.

Importing this package registers the handlers with kopf's default registry
(:mod:`rolloutpool.handlers.lifecycle`); ``rolloutpool operator`` then runs kopf.
"""

from rolloutpool.handlers import lifecycle

__all__ = ["lifecycle"]
