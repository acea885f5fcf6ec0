"""Judging a drafter: acceptance length on held-out data (``accept``), real speculative
decoding (``spec_eval``, ``python -m trainer eval``) and the servable export directory
(``export_dir``, ``python -m trainer export``).

Importing the package imports none of its modules (and no torch).
"""
