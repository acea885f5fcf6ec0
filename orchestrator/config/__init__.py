"""Everything dfo reads from local files: the hosts.yaml inventory (``inventory``), the
environment profiles (``profiles``, package data) and the run configs (``runconfig``,
with the default configs shipped as package data in ``defaults/``)."""
