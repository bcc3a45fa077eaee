"""The operator's kopf handlers: the only importer of kopf.

Importing :mod:`rolloutpool.handlers.lifecycle` registers the handlers with kopf's default
registry; ``rolloutpool operator`` then runs kopf. The pass itself (:mod:`rolloutpool.handlers.passes`)
needs neither kopf nor the kubernetes client: it runs over a :class:`~rolloutpool.kube.port.KubePort`.
"""

__all__: list[str] = []
