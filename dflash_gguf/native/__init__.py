"""Native layer: the only place that touches ctypes. Import submodules lazily."""

BACKENDS = ("cpu", "cuda", "vulkan", "metal")    # the ggml backends a native build can target
