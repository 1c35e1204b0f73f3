"""The demo `kernel-hub demo` runs on the embedded registry: load, validate and time the kernels, then kernelize a
small MoE block."""
