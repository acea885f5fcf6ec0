"""Training data: records, chat masking, the tokenized store, datasets and the batch stream.

``python -m trainer.data {synth,tokenize,regenerate}`` (``cli``). Importing the package
imports none of its modules; import the module that owns what you need.
"""
