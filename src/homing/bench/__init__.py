"""homing bench: replay public serving traces against a gateway and report TTFT, TPOT, goodput."""
