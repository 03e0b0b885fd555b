"""Sizing (`homing plan`): the seed's chain as a pure function of stated assumptions
(`chain`), per-replica figures from the simulated worker's timing model (`measure`), the
seed's follow-ups as presets (`presets`), and how the chain is shown (`report`, `main`)."""
