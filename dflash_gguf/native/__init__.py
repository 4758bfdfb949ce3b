"""Native layer: the only place that touches ctypes. Import submodules lazily."""
