"""Side-by-side benchmarks: plain decoding, our DFlash driver, upstream C++ DFlash and n-gram modes."""
