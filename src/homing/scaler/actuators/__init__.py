"""Actuators of the autoscaler: what starts and stops a model's replicas.

`base` holds the contract (`Actuator`, `Member`, `MemberState`, `ActuatorError`); `local`
runs replicas as child processes of this one (simulated workers or a command template);
`exec` drives a user's script (Slurm and the like).
"""

from homing.scaler.actuators.base import Actuator, ActuatorError, Member, MemberState

__all__ = ["Actuator", "ActuatorError", "Member", "MemberState"]
