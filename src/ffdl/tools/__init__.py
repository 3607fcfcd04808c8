"""Operator tools over the log: export, import, replay, verify, traces and the scheduling simulator."""
