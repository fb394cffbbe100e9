"""buildctl.core.settings: defaults that hold from any working directory (#50 item 6)."""

from __future__ import annotations

import pytest

from buildctl.core.errors import NotFoundError
from buildctl.core.settings import load_settings

from ..support.helpers import REPO


def test_profiles_are_found_from_any_directory_and_a_missing_directory_is_named(tmp_path, monkeypatch, cli):
    monkeypatch.delenv("BUILDCTL_PROFILE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # outside the checkout: build_profiles/ is not here
    assert load_settings().profile_dir.resolve() == (REPO / "build_profiles").resolve()
    (tmp_path / "build_profiles").mkdir()  # a directory of one's own wins
    assert load_settings().profile_dir.resolve() == (tmp_path / "build_profiles").resolve()
    from buildctl.steps.profiles import load_profiles

    with pytest.raises(NotFoundError, match="profile directory /nonexistent does not exist"):
        load_profiles(load_settings(profile_dir="/nonexistent"))
    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", "/nonexistent")
    code, _, err = cli("node", "labels")
    assert code == 3 and "/nonexistent" in err and "BUILDCTL_PROFILE_DIR" in err
