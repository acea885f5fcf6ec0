"""Transports: local, ssh, proxmox. See base.Transport."""

from .base import Result, Transport

__all__ = ["Result", "Transport"]
