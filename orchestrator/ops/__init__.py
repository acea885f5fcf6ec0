"""Pure logic: plans, command rendering, probes and their parsers, diffing,
log classification and the fallback policy. Nothing here touches the network,
starts a process or imports torch."""
