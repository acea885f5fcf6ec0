"""One training step and what it is made of: building the models and a batch's features
(``step``), the DFlash objective (``objective``) and DFlash2's selector objective
(``objective2``), a drafter started from a DFlash directory (``init_from``), checkpoints
(``checkpoints``, with ``diskfull``: a checkpoint that does not fit). The layouts, the
evaluation and the loop all build on it.

Importing the package imports none of its modules (and no torch).
"""
