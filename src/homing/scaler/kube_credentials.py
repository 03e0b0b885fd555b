"""Kubernetes API credentials for the scaler's kubernetes actuator and Lease elector: the
in-cluster service account when no kubeconfig is named and KUBERNETES_SERVICE_HOST is set,
else a kubeconfig file (None: the client's default, ~/.kube/config or $KUBECONFIG)."""

from __future__ import annotations

import os

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config


class CredentialsError(Exception):
    """The credentials could not be loaded; the message says from where and why, in one
    line."""


async def load_configuration(kubeconfig: str | None) -> k8s.Configuration:
    """A client `Configuration` from the in-cluster account or `kubeconfig`. CredentialsError
    for any failure: no such file (checked first: the client prints "Config not found" and
    then blames a missing current-context), an unreadable one, one that is not YAML or not a
    kubeconfig (the client raises YAML, type and key errors for those, not only
    ConfigException)."""
    configuration = k8s.Configuration()
    in_cluster = kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    where = (
        "the in-cluster service account" if in_cluster else (kubeconfig or "the default kubeconfig")
    )
    if not in_cluster:
        paths = [kubeconfig] if kubeconfig is not None else _default_paths()
        if not _any_exists(paths):
            raise CredentialsError(
                f"cannot load Kubernetes credentials: no kubeconfig at {', '.join(paths)}"
                + ("" if kubeconfig is not None else " and not in a cluster")
            )
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            await k8s_config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
    except (k8s_config.ConfigException, OSError) as error:
        raise CredentialsError(
            f"cannot load Kubernetes credentials from {where}: {_line(error)}"
        ) from error
    except Exception as error:  # a file that is not a kubeconfig: YAML, type or key errors
        raise CredentialsError(
            f"cannot load Kubernetes credentials: {where} is not a valid kubeconfig "
            f"({type(error).__name__}: {_line(error)})"
        ) from error
    return configuration


def _any_exists(paths: list[str]) -> bool:
    """Whether any of `paths` exists (a stat each: what the client's own read costs)."""
    return any(os.path.exists(path) for path in paths)


def _default_paths() -> list[str]:
    """Where the client looks without a named file: $KUBECONFIG's paths, else
    ~/.kube/config."""
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return [os.path.expanduser(p) for p in listed or ["~/.kube/config"]]


def _line(error: BaseException) -> str:
    """The error's message on one line (YAML errors span several)."""
    text = " ".join(str(error).split())
    return text or type(error).__name__
