"""Python modules that run on a target, not on the machine that runs ``dfo``.

Each is a plain, stdlib-only module with a ``main(argv)`` and prints one JSON reply (or
one marked line) that a parser in ``orchestrator.plan`` reads. They are real modules so
that they are linted and unit-tested like the rest; how they reach the target depends on
which Python runs them:

``env_probe``    ``<env>/bin/python -c SOURCE``: runs while an env is being verified, before
                 the dfo wheel in it is trusted, so its source travels as the script text.
``cache_tool``   ``python -c SOURCE OP ARGS``: ``dfo warm-cache --status`` falls back to the
                 system ``python3`` when no env is deployed, so its source travels too.
``source_hash``  ``<env>/bin/python -m orchestrator.remote.source_hash PKG...``: runs in a
                 deployed env, whose dfo wheel holds this module.

Modules run with ``-c`` must stay self-contained (no imports from dfo).
"""
