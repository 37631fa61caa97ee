"""Megatron conversions made by these tests go to a temporary folder, not the user's cache."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _conversions_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORERL_MEGATRON_CHECKPOINT_DIR", str(tmp_path_factory.mktemp("megatron-conversions")))
        yield
