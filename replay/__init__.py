"""Reads the record back as live HTTP: matching, timing, resume and faults."""
