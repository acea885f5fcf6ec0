"""The models: the DFlash drafter (``drafter``, ``attention``, ``rope``), the frozen target
(``target``, ``family``) and a tiny taught target for demos and tests (``tinylm``).

Importing the package imports none of its modules (and no torch).
"""
