"""What a run reports and injects: the event stream, heartbeats and the startup record
(``metrics``), TensorBoard event files (``tbevents``) and fault injection (``faults``).

Importing the package imports none of its modules (and no torch).
"""
