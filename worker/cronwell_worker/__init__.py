"""cronwell worker runtime: claims occurrences of a pool and runs their targets under
leases, heartbeats and fencing tokens."""
