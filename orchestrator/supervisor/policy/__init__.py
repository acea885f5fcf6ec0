"""The supervisor's own pure policy: the watchdog, the host's load, OOM kills, the compile
cache's check, a group's root cause, the standby's rules, state.json rebuilt from events.
No I/O: the supervisor's other modules act on what these decide.
"""
