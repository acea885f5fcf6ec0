"""The laptop's pure decisions: launch, deploy and cache planning, probes (a constant script
and the pure parser of its output), fingerprints and drift, snapshots, uv's errors, what a
finished run went through. Nothing here touches the network, starts a process or imports
torch; the engine runs these plans through a transport. ``scripts/*.sh`` are package data,
read by one helper.
"""
