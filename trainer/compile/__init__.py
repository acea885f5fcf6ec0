"""torch.compile, applied once per process (``registry``), the compile gate that makes the
compile race impossible (``gate``) and ``python -m trainer warmup`` (``warmup``).

Importing the package imports none of its modules (and no torch).
"""
