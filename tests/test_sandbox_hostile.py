"""The hostile programs (corerl.testing.sandbox_conformance) against the core's two sandboxes:
``namespaces`` (skipped, in one line, where the kernel refuses user namespaces) and ``audit``."""

from __future__ import annotations

from corerl.testing.sandbox_conformance import SandboxConformance


class TestNamespaces(SandboxConformance):
    sandbox_id = "namespaces"
    timeout_s = 1.0  # the three programs that run forever cost this each


class TestAudit(SandboxConformance):
    sandbox_id = "audit"
    timeout_s = 1.0
