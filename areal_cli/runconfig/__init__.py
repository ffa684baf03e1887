"""The run's config made whole: composed from ``conf/`` and checked against the schema and the
components (``compose.py``: engine names, tracker backends, the code sandbox), and every ``auto``
resolved (``autos.py``, the engine's from its spec).

``config/`` below it is the schema and its rules and imports nothing above itself; a run's own
processes read the config.yaml the launcher wrote with ``config.read.read_yaml``, unchecked.
"""
