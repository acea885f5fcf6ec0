"""The models: the DFlash drafter (``drafter``, ``attention``, ``rope``), DFlash2
(``dflash2``), the frozen target (``target``, ``family``, ``fp8``, ``hf_load``) and a DFlash
drafter directory as z-lab publishes it (``dflash_dir``). Architecture only: nothing here
compiles (trainer.compile wraps from outside).

Importing the package imports none of its modules (and no torch).
"""
