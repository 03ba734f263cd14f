"""What a trial's numbers do not depend on but its speed and memory do: the compute dtype the
machine supports (precision), the glibc allocator setting for CPU trials (host_memory), and the
memory one device needs for a trial, estimated on the meta device (memory; the sweeper's
`--show` and ray.fit_device_gib read it).

May import: (none)
"""
