"""Running as a systemd service: readiness and status notifications (`notify`), the watchdog
and loop-stall reports (`watchdog`), sockets handed over by socket activation
(`activation`), and reloading the configuration in place (`reload`, `runner`).
"""
