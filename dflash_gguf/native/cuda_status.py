"""What ggml's CUDA backend says when it cannot start, in words a user can act on.

A CUDA build loads without a GPU (it needs only the runtime libraries it was linked with): ggml then logs why
it offers no CUDA device, in the CUDA runtime's own words, and every layer runs on the CPU. Those words name
the symptom, not the remedy; `explain` turns the log lines into one line that says what it means and what to do.
"""

from __future__ import annotations

# (words of the CUDA runtime's error string, what it means and what to do)
_CAUSES = (
    ("driver version is insufficient",
     "the NVIDIA driver is missing or older than the CUDA runtime this build uses (CUDA 13 needs driver 580 or "
     "newer)"),
    ("no CUDA-capable device is detected", "the NVIDIA driver sees no GPU"),
    ("system has unsupported display driver", "the NVIDIA driver does not match the CUDA runtime"),
    ("forward compatibility was attempted on non supported HW", "the CUDA runtime does not support this GPU"),
)
_REMEDY = ("update the NVIDIA driver (https://www.nvidia.com/drivers), or run with `--backend cpu`; "
           "`dflash-gguf doctor --backend cuda` shows what the build sees")


def explain(log_lines: list[str]) -> str | None:
    """One line for the first CUDA start-up failure in llama.cpp's log lines, or None when there is none."""
    for line in log_lines:
        if "failed to initialize CUDA" not in line:
            continue
        raw = line.strip().split("failed to initialize CUDA:", 1)[-1].strip()
        meaning = next((m for words, m in _CAUSES if words.lower() in line.lower()), "CUDA could not start")
        return (f"CUDA build, no CUDA device: {meaning} (CUDA said: {raw}); running on the CPU. "
                f"To use the GPU, {_REMEDY}")
    return None
