"""The audit (`keyfill verify`): that a compaction lost, duplicated and reordered nothing.
Modules: `checks` (the report, the plan, the manifest's and index's checks, `verify` in this
process), `file` (one segment file on its own), `records` (the record checks as Arrow
tasks), `spark` (the audit on a Spark session)."""

from compactor.verify.checks import CHECKS, MAX_REPORTED, VerifyReport, audit, plan_audit, verify

__all__ = ["CHECKS", "MAX_REPORTED", "VerifyReport", "audit", "plan_audit", "verify"]
