"""Kubernetes credentials that cannot be loaded give one line saying from where and why
(homing.scaler.kube_credentials), whatever the client raised for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from homing.scaler.kube_credentials import CredentialsError, load_configuration

PREFIX = "cannot load Kubernetes credentials:"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (
            "a: b: c\n",
            "is not a valid kubeconfig (ScannerError: mapping values are not allowed here in "
            '"{path}", line 1, column 5)',
        ),
        (
            "",
            "is not a valid kubeconfig (TypeError: 'NoneType' object does not support item "
            "assignment)",
        ),
        (
            "- 1\n- 2\n",
            "is not a valid kubeconfig (TypeError: list indices must be integers or slices, "
            "not str)",
        ),
    ],
    ids=["not yaml", "empty", "a list"],
)
async def test_a_file_that_is_not_a_kubeconfig_is_one_line_naming_it(
    tmp_path: Path, content: str, why: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    with pytest.raises(CredentialsError) as caught:
        await load_configuration(str(path))
    assert str(caught.value) == f"{PREFIX} {path} {why.format(path=path)}"


async def test_a_missing_file_is_named_not_blamed_on_its_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(CredentialsError) as caught:
        await load_configuration(str(missing))
    assert str(caught.value) == f"{PREFIX} no kubeconfig at {missing}"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    with pytest.raises(CredentialsError) as caught:
        await load_configuration(None)
    assert str(caught.value) == (
        f"{PREFIX} no kubeconfig at {tmp_path / 'a'}, {tmp_path / 'b'} and not in a cluster"
    )
    assert capsys.readouterr() == ("", "")  # nothing printed beside the error


async def test_a_directory_is_refused_with_the_systems_reason(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError) as caught:
        await load_configuration(str(tmp_path))
    assert str(caught.value) == (
        f"cannot load Kubernetes credentials from {tmp_path}: [Errno 21] Is a directory: "
        f"'{tmp_path}'"
    )


async def test_a_kubeconfig_without_a_current_context_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(CredentialsError) as caught:
        await load_configuration(str(path))
    assert str(caught.value).startswith(f"cannot load Kubernetes credentials from {path}: ")
