"""The sandbox server: isolated code-execution sessions, task suites and rewards."""
