"""Tests of fedleak.auditing: the estimators, the audit's coverage, the bounds."""
