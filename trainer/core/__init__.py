"""One training step and what it is made of: building the models and a batch's features
(``step``), the DFlash objective (``objective``) and DFlash2's selector objective
(``objective_dflash2``), a drafter started from a DFlash directory (``init_from``), checkpoints
(``checkpoints``, with ``diskfull``: a checkpoint that does not fit), and the process's
state that the entry point builds once and passes down (``runtime``). The layouts, the
evaluation and the loop all build on it.

Importing the package imports none of its modules (and no torch).
"""
