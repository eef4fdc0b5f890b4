"""Scheduling: request slots and tables, cache manager, prefill admission, decode set, loop."""
