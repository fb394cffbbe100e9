"""The one base of buildctl's records: frozen pydantic v2 models that refuse unknown fields (a
misspelt key in a stored record, a profile or a target is an error, never silently dropped).
Every model in the package derives from :class:`Record`, except the settings (pydantic-settings'
own base, configured the same way); tests/test_architecture.py checks it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
