"""Capture fleets: a recorder's committed rows shipped to NATS JetStream, and collectors
that bring every recorder's rows into one sink."""
