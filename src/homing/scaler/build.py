"""Building a model's actuator from the config, and bringing up its first members.

Rule of this file: construction only; what each actuator does is in its own module.
`local` starts the model's own workers: its command template (`scaler.command`), else
real SGLang ones (`engines.launch = "sglang"`), else simulated ones (the model's `sim`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from homing.clock import Clock
from homing.config import HomingConfig, ModelSettings, ScalerSettings
from homing.scaler.actuators.base import Actuator, ActuatorError, MemberState
from homing.scaler.actuators.exec import ExecActuator
from homing.scaler.actuators.local import CommandTemplate, LocalActuator


def build_actuator(
    config: HomingConfig,
    model: ModelSettings,
    settings: ScalerSettings,
    *,
    clock: Clock,
    log_dir: Path | None = None,
) -> Actuator:
    """The actuator `settings` name for `model`. ValueError for what cannot be built."""
    if settings.actuator == "exec":
        assert settings.exec is not None  # ScalerSettings refuses exec without it
        return ExecActuator(
            settings.exec.command,
            clock=clock,
            poll_s=settings.exec.poll_s,
            timeout_s=settings.exec.timeout_s,
            startup_timeout_s=settings.startup_timeout_s,
        )
    if settings.actuator == "kubernetes":
        from homing.scaler.actuators.kubernetes import KubernetesActuator

        k = settings.kubernetes
        assert k is not None  # ScalerSettings refuses kubernetes without it
        if k.kubeconfig is not None and not Path(k.kubeconfig).is_file():
            raise ActuatorError(f"scaler.kubernetes.kubeconfig {k.kubeconfig!r} is not a file")
        return KubernetesActuator(
            namespace=k.namespace,
            name=k.name,
            kind=k.kind,
            selector=k.selector,
            port_name=k.port_name,
            clock=clock,
            kubeconfig=k.kubeconfig,
            startup_timeout_s=settings.startup_timeout_s,
        )
    if settings.command is not None:
        return LocalActuator.for_command(
            CommandTemplate(list(settings.command)),
            model=model.name or config.sim.model,
            clock=clock,
            log_dir=log_dir,
            startup_timeout_s=settings.startup_timeout_s,
        )
    if config.engines.launch == "sglang":
        from homing.scaler.actuators.local import SglangSpawner

        return LocalActuator(
            SglangSpawner(config.sglang, page_size=config.router.block_size),
            clock=clock,
            startup_timeout_s=settings.startup_timeout_s,
        )
    assert model.sim is not None  # served_models gives a model without workers its sim
    return LocalActuator.for_sim(
        model.sim, clock=clock, startup_timeout_s=settings.startup_timeout_s
    )


async def start_members(
    actuator: Actuator, count: int, timeout_s: float, *, clock: Clock
) -> list[str]:
    """Have `count` replicas: ask `actuator` for those it does not run yet and wait (on
    `clock`) until that many members are ready; the URLs of its ready members (with `count`
    0: those it already has). RuntimeError when a
    start fails, TimeoutError after `timeout_s`."""
    await actuator.open()  # one that watches (kubernetes) syncs first
    changed = asyncio.Event()
    unsubscribe = actuator.subscribe(changed.set)
    failed_before = actuator.failed_starts
    try:
        # Members it runs already (a restart of homing over a Deployment or a script's
        # jobs) count: only the shortfall is asked for.
        running = sum(1 for m in actuator.members() if m.state is not MemberState.STOPPING)
        if count > running:
            await actuator.start(count - running)
        async with clock.timeout(timeout_s):
            while True:
                ready = [
                    m.url
                    for m in actuator.members()
                    if m.state is MemberState.READY and m.url is not None
                ]
                if len(ready) >= count:
                    return ready
                if actuator.failed_starts > failed_before:
                    raise RuntimeError(
                        f"a {actuator.kind} replica failed to start (see scaler_start_failed)"
                    )
                changed.clear()
                await changed.wait()
    finally:
        unsubscribe()
