"""torch.compile, applied once per process (``registry``) with the same cache settings in
every compiling thread (``settings``), dynamo's precompile cache (``precompile``), the
compile gate that makes the compile race impossible (``gate``) and the regional compile of
a frozen target's decoder layers, applied from outside the model (``target``).

Importing the package imports none of its modules (and no torch).
"""
