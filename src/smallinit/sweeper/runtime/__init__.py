"""The sweep's processes: the Ray cluster it runs on (cluster) and every private Ray name it uses
(ray_internals), what each trial asks Ray for (resources), the reaper that stops a local Ray when
its driver ends, the one-driver-per-folder lock, and how the driver stops on a signal (stop).

May import: (none)
"""
