"""The tenants file fails closed: only an API started open on purpose, with no tenant, lets anyone in;
a missing, empty or unreadable file never does; the file is replaced atomically and durably."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ffdl.adapters.tenants import Principal, TenantError, TenantRegistry
from ffdl.cli.main import app
from ffdl.core.tenancy import DEFAULT_MAX_PRIORITY


def test_without_tenants_the_api_is_open_only_when_started_open(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    closed, opened = TenantRegistry(path), TenantRegistry(path, allow_open=True)
    assert not closed.open and "no tenant in" in (closed.unservable() or "")
    assert opened.open and opened.unservable() is None
    path.write_text("{}")
    assert not closed.open and closed.unservable() is not None
    assert opened.open


def test_once_a_tenant_exists_every_caller_needs_its_token(tmp_path: Path) -> None:
    registry = TenantRegistry(tmp_path / "tenants.json", allow_open=True)
    token = registry.add("acme", admin=True)
    assert not registry.open and registry.unservable() is None
    assert registry.authenticate(token) == Principal("acme", admin=True)
    assert registry.authenticate("ffdl_wrong") is None


@pytest.mark.parametrize("content", ["{not json", "[]", '{"acme": "no record"}', '{"acme": {"admin": true}}'])
def test_an_unreadable_tenants_file_never_opens_the_api_even_when_started_open(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "tenants.json"
    registry = TenantRegistry(path, allow_open=True)
    token = registry.add("acme")
    path.write_text(content)
    assert not registry.open
    assert registry.authenticate(token) is None
    assert "never runs open" in (registry.unservable() or "")
    with pytest.raises(TenantError, match="fix it"):
        registry.add("globex")


def test_a_tenants_file_the_platform_may_not_read_never_opens_the_api(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.mkdir()  # reading it fails (IsADirectoryError), like a file the platform may not read
    registry = TenantRegistry(path, allow_open=True)
    assert not registry.open
    assert registry.unservable() is not None


def test_the_file_is_replaced_whole_private_and_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tenants.json"
    registry = TenantRegistry(path)
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        synced.append(os.fstat(descriptor).st_ino)
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    registry.add("acme")
    registry.add("globex", admin=True)
    assert set(json.loads(path.read_text())) == {"acme", "globex"}
    assert path.stat().st_mode & 0o777 == 0o600
    assert [entry.name for entry in tmp_path.iterdir()] == ["tenants.json"]  # no temporary file left
    # each write: the new file (the inode that then became tenants.json), then its directory
    assert synced[-2:] == [path.stat().st_ino, tmp_path.stat().st_ino]
    assert len(synced) == 4


def test_a_tenants_priority_ceiling_is_its_records_or_the_default_and_an_admin_has_none(
    tmp_path: Path,
) -> None:
    registry = TenantRegistry(tmp_path / "tenants.json")
    registry.add("acme")
    registry.add("globex", max_priority=500)
    registry.add("sre", admin=True)
    assert registry.max_priority("acme") == DEFAULT_MAX_PRIORITY
    assert registry.max_priority("globex") == 500
    assert registry.max_priority("sre") is None
    assert registry.max_priority("stranger") == DEFAULT_MAX_PRIORITY, "a tenant not in the file"
    registry.set_max_priority("acme", -5)
    assert TenantRegistry(tmp_path / "tenants.json").max_priority("acme") == -5
    with pytest.raises(TenantError, match="from -1000 to 1000"):
        registry.set_max_priority("acme", 1001)
    with pytest.raises(TenantError, match="no tenant 'nobody'"):
        registry.set_max_priority("nobody", 1)
    (tmp_path / "tenants.json").write_text("{not json")
    assert registry.max_priority("globex") == DEFAULT_MAX_PRIORITY, "an unreadable file lifts no ceiling"


def test_an_admin_sets_a_ceiling_with_the_cli_and_an_out_of_range_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tenants.json"
    monkeypatch.setenv("FFDL_TENANTS_FILE", str(path))
    runner = CliRunner()
    added = runner.invoke(app, ["tenants", "add", "acme", "--max-priority", "50", "--json"])
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["max_priority"] == 50
    assert TenantRegistry(path).max_priority("acme") == 50
    assert runner.invoke(app, ["tenants", "set", "acme", "--max-priority", "700"]).exit_code == 0
    assert TenantRegistry(path).max_priority("acme") == 700
    assert runner.invoke(app, ["tenants", "set", "acme", "--max-priority", "1001"]).exit_code != 0
    unknown = runner.invoke(app, ["tenants", "set", "globex", "--max-priority", "1"])
    assert unknown.exit_code != 0 and "no tenant 'globex'" in unknown.output
    assert TenantRegistry(path).max_priority("acme") == 700
