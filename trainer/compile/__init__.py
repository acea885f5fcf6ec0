"""torch.compile, applied once per process (``registry``) with the same cache settings in
every compiling thread (``settings``), dynamo's precompile cache (``precompile``), the
compile gate that makes the compile race impossible (``gate``) and ``python -m trainer
warmup`` (``warmup``).

Importing the package imports none of its modules (and no torch).
"""
