"""dfo: the orchestrator for DFlash drafter training on Proxmox LXC GPU hosts.

The local side never imports torch. The library logs to ``logging.getLogger("dfo")``;
only the CLI installs handlers.
"""

__version__ = "0.1.0"
